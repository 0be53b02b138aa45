// The tuner: key anchoring, the benchmark schedule, in-memory and persistent decisions.
#include "input/json_input.hpp"

#include <backplane/log.hpp>
#include <backplane/tune.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>
#include <unistd.h>

namespace backplane::tune {
namespace {

using Nanos = std::chrono::nanoseconds;
using Json = nlohmann::json;

void logTune(log::Level level, const std::string &message) {
    log::write(log::Subsystem::Tune, level, message);
}

std::string formatTime(Nanos t) {
    char text[32];
    const double ns = static_cast<double>(t.count());
    if (ns >= 1e6)
        std::snprintf(text, sizeof text, "%.3f ms", ns / 1e6);
    else
        std::snprintf(text, sizeof text, "%.1f us", ns / 1e3);
    return text;
}

/// Round up to the smallest power of `base` >= v (base 2 or 4); v itself near the top of the range.
uint64_t roundUpPower(uint64_t v, unsigned shift) {
    uint64_t p = 1;
    while (p < v) {
        if (p > (UINT64_MAX >> shift)) return v;
        p <<= shift;
    }
    return p;
}

/// Candidates in ranking order, then every other candidate in declared order.
std::vector<size_t> orderOf(const SetInfo &set, const TuneRecord &record) {
    std::vector<size_t> order;
    std::vector<bool> used(set.names.size(), false);
    for (const auto &name : record.ranking)
        for (size_t i = 0; i < set.names.size(); ++i)
            if (set.names[i] == name && !used[i]) {
                order.push_back(i);
                used[i] = true;
            }
    for (size_t i = 0; i < set.names.size(); ++i)
        if (!used[i]) order.push_back(i);
    return order;
}

bool stderrIsTerminal() { return ::isatty(STDERR_FILENO) == 1; }

/// The first name in `record`'s ranking or results that is not a candidate of `set`, or "".
std::string unknownCandidate(const SetInfo &set, const TuneRecord &record) {
    const auto known = [&](const std::string &name) {
        return std::find(set.names.begin(), set.names.end(), name) != set.names.end();
    };
    for (const std::string &name : record.ranking)
        if (!known(name)) return name;
    for (const CandidateResult &result : record.results)
        if (!known(result.name)) return result.name;
    return {};
}

} // namespace

// -- keys ----------------------------------------------------------------------------------------

uint64_t anchor(uint64_t value, TuneLevel level, const AxisAnchor &axis) {
    const uint64_t v = std::clamp(value, axis.min, std::max(axis.min, axis.max));
    if (axis.exact) return v;
    uint64_t bucket = v;
    switch (level) {
    case TuneLevel::Full:
        return v;
    case TuneLevel::Minimal:
        bucket = roundUpPower(v, 2);
        break;
    case TuneLevel::Off:
    case TuneLevel::Balanced:
        bucket = roundUpPower(v, 1);
        break;
    case TuneLevel::Extensive: {
        const uint64_t p = roundUpPower(v, 1);
        // Halfway bucket between p/2 and p: 1.5 * p/2.
        const uint64_t half = p >= 4 ? p / 4 * 3 : p;
        bucket = (half >= v) ? half : p;
        break;
    }
    }
    return std::min(bucket, std::max(axis.min, axis.max));
}

KeyBuilder &KeyBuilder::axis(std::string_view name, uint64_t value, const AxisAnchor &anchoring) {
    if (!text_.empty()) text_ += ',';
    text_.append(name).append("=").append(std::to_string(anchor(value, level_, anchoring)));
    return *this;
}

KeyBuilder &KeyBuilder::exact(std::string_view name, std::string_view value) {
    if (!text_.empty()) text_ += ',';
    text_.append(name).append("=").append(value);
    return *this;
}

// -- timing and policy ---------------------------------------------------------------------------

Nanos SystemTimer::time(const std::function<void()> &run) {
    if (sync_) sync_();
    const auto start = std::chrono::steady_clock::now();
    run();
    if (sync_) sync_();
    return std::chrono::duration_cast<Nanos>(std::chrono::steady_clock::now() - start);
}

BenchPolicy BenchPolicy::forLevel(TuneLevel level) {
    BenchPolicy p;
    switch (level) {
    case TuneLevel::Off:
    case TuneLevel::Balanced:
        break;
    case TuneLevel::Minimal:
        p.minSamples = 3;
        p.maxSamples = 5;
        p.defaultOnly = true;
        break;
    case TuneLevel::Extensive:
        p.warmups = 2;
        p.minSamples = 5;
        p.maxSamples = 20;
        p.patience = 3;
        break;
    case TuneLevel::Full:
        p.warmups = 3;
        p.minSamples = 10;
        p.maxSamples = 30;
        p.eliminationFactor = 0;
        p.patience = 0;
        break;
    }
    return p;
}

std::string candidateChecksum(const SetInfo &info) {
    uint64_t h = fnv1a64(info.name);
    for (size_t i = 0; i < info.names.size(); ++i) {
        h = fnv1a64(info.names[i], h);
        h = fnv1a64(std::string_view("\0", 1), h);
        h = fnv1a64(std::to_string(info.options[i].version) + ";", h);
    }
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(h));
    return text;
}

// -- records -------------------------------------------------------------------------------------

std::string Tuner::storeKey(const std::string &set, const std::string &key,
                            const std::string &device, const std::string &checksum) {
    return "tune\nset=" + set + "\nkey=" + key + "\ndevice=" + device + "\nchecksum=" + checksum;
}

std::string Tuner::toJson(const TuneRecord &record) {
    Json results = Json::array();
    for (const auto &r : record.results) {
        Json item = {{"name", r.name}, {"ok", r.ok}};
        if (r.ok) {
            item["samples"] = r.samples;
            item["min_ns"] = r.min.count();
            item["median_ns"] = r.median.count();
            item["score_ns"] = r.score.count();
            if (r.eliminated) item["eliminated"] = true;
        } else {
            item["error"] = r.error;
        }
        results.push_back(std::move(item));
    }
    const Json j = {{"set", record.set},         {"key", record.key},
                    {"device", record.device},   {"checksum", record.checksum},
                    {"level", record.level},     {"winner", record.winner},
                    {"ranking", record.ranking}, {"results", results}};
    // Candidate names are the caller's strings: invalid UTF-8 is replaced, never thrown about.
    return detail::dumpJson(j, 2);
}

TuneRecord Tuner::fromJson(std::string_view json, std::string_view what) {
    const std::string origin(what);
    // Syntax, numbers out of range, invalid UTF-8, size and depth: one Error naming the pointer.
    const Json j = detail::parseJson(json, origin, detail::kRecordJsonLimits, ErrorCode::Config);
    const auto invalid = [&](const std::string &pointer, const std::string &problem) {
        return Error(ErrorCode::Config,
                     origin + ": " + pointer + ": " + problem + " (not a tuning record)");
    };
    const auto object = [&](const Json &value, const std::string &pointer) -> const Json & {
        if (!value.is_object())
            throw invalid(pointer.empty() ? "/" : pointer, "expected an object");
        return value;
    };
    const auto text = [&](const Json &parent, const std::string &pointer, const char *name,
                          bool required) -> std::string {
        const auto it = parent.find(name);
        if (it == parent.end()) {
            if (required) throw invalid(pointer + "/" + name, "missing");
            return {};
        }
        if (!it->is_string()) throw invalid(pointer + "/" + name, "expected a string");
        return it->get<std::string>();
    };
    // Counts and times: integers only (a float such as 1e300 has no integer value to convert to).
    const auto integer = [&](const Json &parent, const std::string &pointer, const char *name,
                             int64_t max) -> int64_t {
        const auto it = parent.find(name);
        if (it == parent.end()) return 0;
        const bool fits = it->is_number_unsigned()  ? it->get<uint64_t>() <= uint64_t(max)
                          : it->is_number_integer() ? it->get<int64_t>() >= 0
                                                    : false;
        if (!fits)
            throw invalid(pointer + "/" + name,
                          "expected an integer from 0 to " + std::to_string(max));
        return it->get<int64_t>();
    };
    const auto flag = [&](const Json &parent, const std::string &pointer, const char *name,
                          bool required) -> bool {
        const auto it = parent.find(name);
        if (it == parent.end()) {
            if (required) throw invalid(pointer + "/" + name, "missing");
            return false;
        }
        if (!it->is_boolean()) throw invalid(pointer + "/" + name, "expected true or false");
        return it->get<bool>();
    };

    object(j, "");
    TuneRecord r;
    r.set = text(j, "", "set", true);
    r.key = text(j, "", "key", true);
    r.device = text(j, "", "device", true);
    r.checksum = text(j, "", "checksum", true);
    r.level = text(j, "", "level", false);
    r.winner = text(j, "", "winner", true);
    const auto ranking = j.find("ranking");
    if (ranking == j.end() || !ranking->is_array())
        throw invalid("/ranking", "expected an array of candidate names");
    for (size_t i = 0; i < ranking->size(); ++i) {
        const Json &name = (*ranking)[i];
        if (!name.is_string())
            throw invalid("/ranking/" + std::to_string(i), "expected a candidate name");
        r.ranking.push_back(name.get<std::string>());
    }
    if (r.ranking.empty() || r.ranking.front() != r.winner)
        throw invalid("/ranking", "must start with the winner '" + r.winner + "'");
    if (const auto results = j.find("results"); results != j.end()) {
        if (!results->is_array()) throw invalid("/results", "expected an array");
        for (size_t i = 0; i < results->size(); ++i) {
            const std::string pointer = "/results/" + std::to_string(i);
            const Json &item = object((*results)[i], pointer);
            CandidateResult c;
            c.name = text(item, pointer, "name", true);
            c.ok = flag(item, pointer, "ok", true);
            c.error = text(item, pointer, "error", false);
            c.eliminated = flag(item, pointer, "eliminated", false);
            c.samples = static_cast<uint32_t>(integer(item, pointer, "samples", UINT32_MAX));
            c.min = Nanos(integer(item, pointer, "min_ns", INT64_MAX));
            c.median = Nanos(integer(item, pointer, "median_ns", INT64_MAX));
            c.score = Nanos(integer(item, pointer, "score_ns", INT64_MAX));
            r.results.push_back(std::move(c));
        }
    }
    return r;
}

// -- the tuner -----------------------------------------------------------------------------------

Tuner::Tuner(Options options) : options_(std::move(options)) {
    if (!options_.timer) options_.timer = std::make_shared<SystemTimer>();
    policy_ = options_.policy ? *options_.policy : BenchPolicy::forLevel(options_.level);
    policy_.maxSamples = std::max(policy_.maxSamples, 1u);
    policy_.minSamples = std::clamp(policy_.minSamples, 1u, policy_.maxSamples);
    if (!options_.progress) options_.progress = stderrIsTerminal();
}

Tuner::Tuner(const Config &config, std::string device)
    : Tuner([&] {
          Options o;
          o.level = config.tuneLevel;
          o.device = std::move(device);
          if (!cacheDirectory(config).empty()) o.store = &CacheStore::forConfig(config);
          return o;
      }()) {}

TuneCounters Tuner::counters() const {
    std::lock_guard lock(mutex_);
    return counters_;
}

void Tuner::resetCounters() {
    std::lock_guard lock(mutex_);
    counters_ = {};
}

std::optional<TuneRecord> Tuner::lookup(const SetInfo &set, const std::string &key) const {
    const std::string id = storeKey(set.name, key, options_.device, set.checksum);
    {
        std::lock_guard lock(mutex_);
        if (auto it = entries_.find(id);
            it != entries_.end() && !it->second.pending && !it->second.stale)
            return it->second.record;
    }
    if (!options_.store) return std::nullopt;
    const auto payload = options_.store->load(CacheKind::Tune, id);
    if (!payload) return std::nullopt;
    const std::string file = options_.store->entryPath(CacheKind::Tune, id).string();
    TuneRecord record;
    try {
        record = fromJson(
            std::string_view(reinterpret_cast<const char *>(payload->data()), payload->size()),
            file);
    } catch (const Error &e) {
        logTune(log::Level::Warn, std::string(e.what()) + "; ignored");
        return std::nullopt;
    }
    // The checksum covers the candidate names, so only a hand-edited record (or one of an older
    // version that hashed alike) can name another; running its order would skip the real winner.
    if (const std::string unknown = unknownCandidate(set, record); !unknown.empty()) {
        logTune(log::Level::Warn, "tuning record " + file + " names candidate '" + unknown +
                                      "', which tunable set '" + set.name +
                                      "' does not have; ignored, re-tuning");
        return std::nullopt;
    }
    return record;
}

Tuner::Plan Tuner::plan(const SetInfo &set, const std::string &key, BenchHooks &hooks) {
    const std::string id = storeKey(set.name, key, options_.device, set.checksum);
    std::unique_lock lock(mutex_);
    for (;;) {
        auto it = entries_.find(id);
        if (it != entries_.end() && it->second.pending) {
            if (set.fallback) {
                ++counters_.fallbackRuns;
                Plan p;
                p.order.push_back(*set.fallback);
                for (size_t i = 0; i < set.names.size(); ++i)
                    if (i != *set.fallback) p.order.push_back(i);
                return p;
            }
            done_.wait(lock);
            continue;
        }
        if (it != entries_.end() && !it->second.stale) {
            ++counters_.memoryHits;
            return {orderOf(set, it->second.record), true};
        }
        const bool stale = it != entries_.end();
        if (!stale && options_.store) {
            lock.unlock();
            std::optional<TuneRecord> stored = lookup(set, key);
            lock.lock();
            if (stored && (stored->set != set.name || stored->key != key ||
                           stored->device != options_.device ||
                           stored->checksum != set.checksum)) {
                logTune(log::Level::Warn, "tuning record for '" + set.name + "' [" + key +
                                              "] does not match its key; re-tuning");
                stored.reset();
            }
            if (stored) {
                if (entries_.find(id) != entries_.end()) continue; // another thread was faster
                Entry &entry = entries_[id];
                entry.record = std::move(*stored);
                ++counters_.persistentHits;
                return {orderOf(set, entry.record), true};
            }
        }
        if (options_.level == TuneLevel::Off) {
            Plan p;
            for (size_t i = 0; i < set.names.size(); ++i) p.order.push_back(i);
            return p;
        }
        entries_[id] = Entry{true, false, {}};
        break;
    }
    lock.unlock();

    TuneRecord record;
    try {
        record = benchmark(set, key, hooks);
    } catch (...) {
        lock.lock();
        entries_.erase(id);
        done_.notify_all();
        throw;
    }
    lock.lock();
    entries_[id] = Entry{false, false, record};
    done_.notify_all();
    lock.unlock();
    if (options_.store) options_.store->store(CacheKind::Tune, id, toJson(record));
    return {orderOf(set, record), true};
}

void Tuner::markStale(const SetInfo &set, const std::string &key) {
    const std::string id = storeKey(set.name, key, options_.device, set.checksum);
    std::string winner;
    {
        std::lock_guard lock(mutex_);
        auto it = entries_.find(id);
        if (it != entries_.end() && !it->second.pending) {
            it->second.stale = true;
            winner = it->second.record.winner;
        }
        ++counters_.staleWinners;
    }
    if (options_.store) options_.store->remove(CacheKind::Tune, id);
    logTune(log::Level::Warn, "tuned winner '" + winner + "' of '" + set.name + "' [" + key +
                                  "] failed; running the next candidate, re-tuning next time");
}

void Tuner::throwAllFailed(const SetInfo &set, const std::string &key,
                           const std::vector<std::pair<size_t, std::string>> &errors,
                           const std::vector<ErrorCode> &codes) const {
    std::string message = "tunable set '" + set.name + "' [" + key + "]: no candidate could run:";
    for (const auto &[index, error] : errors) message += "\n  " + set.names[index] + ": " + error;
    ErrorCode code = codes.empty() ? ErrorCode::Internal : codes.front();
    for (const ErrorCode c : codes)
        if (c != code) code = ErrorCode::Internal;
    throw Error(code, message);
}

TuneRecord Tuner::benchmark(const SetInfo &set, const std::string &key, BenchHooks &hooks) {
    const BenchPolicy &policy = policy_;
    {
        std::lock_guard lock(mutex_);
        ++counters_.tunings;
    }
    uint64_t runs = 0;

    struct State {
        size_t index = 0;
        bool alive = true;
        std::vector<Nanos> samples;
        Nanos best = Nanos::max();
        uint32_t noProgress = 0;
        ErrorCode code = ErrorCode::Internal;
        CandidateResult result;
    };
    std::vector<State> states;
    const bool anyDefault = std::any_of(set.options.begin(), set.options.end(),
                                        [](const CandidateOptions &o) { return o.defaultPriority; });
    for (size_t i = 0; i < set.names.size(); ++i) {
        if (policy.defaultOnly && anyDefault && !set.options[i].defaultPriority) continue;
        State s;
        s.index = i;
        s.result.name = set.names[i];
        states.push_back(std::move(s));
    }
    const bool progress = *options_.progress;
    const size_t n = states.size();
    auto bestName = [&]() -> std::string {
        const State *best = nullptr;
        for (const auto &s : states)
            if (s.alive && !s.samples.empty() && (!best || s.best < best->best)) best = &s;
        return best ? best->result.name + " " + formatTime(best->best) : "none yet";
    };
    auto report = [&](const std::string &what) {
        if (progress)
            std::fprintf(stderr, "\r\033[Ktune %s [%s]: %s, best %s", set.name.c_str(),
                         key.c_str(), what.c_str(), bestName().c_str());
    };
    auto fail = [&](State &s, const std::string &why, ErrorCode code) {
        s.alive = false;
        s.result.ok = false;
        s.result.error = why;
        s.code = code;
        logTune(log::Level::Info, "tune '" + set.name + "' [" + key + "]: candidate '" +
                                      s.result.name + "' skipped: " + why);
    };
    auto guarded = [&](State &s, const std::function<void()> &body) {
        try {
            body();
            return true;
        } catch (const Error &e) {
            fail(s, e.what(), e.code());
        } catch (const std::exception &e) {
            fail(s, e.what(), ErrorCode::Internal);
        } catch (...) {
            fail(s, "unknown exception", ErrorCode::Internal);
        }
        return false;
    };

    hooks.prepare();

    // Warm-ups (compile, first-touch) and output checks against the first valid candidate.
    std::optional<size_t> reference;
    const bool single = n == 1;
    for (size_t c = 0; c < n && !single; ++c) {
        State &s = states[c];
        report("warming up candidate " + std::to_string(c + 1) + " of " + std::to_string(n) +
               " (" + s.result.name + ")");
        bool ok = true;
        for (uint32_t w = 0; w < std::max(policy.warmups, 1u) && ok; ++w) {
            ++runs;
            ok = guarded(s, [&] { hooks.run(s.index, w == 0); });
        }
        if (!ok || !hooks.check) continue;
        if (!reference) {
            reference = c;
            continue;
        }
        std::string mismatch;
        guarded(s, [&] { mismatch = hooks.check(states[*reference].index, s.index); });
        if (s.alive && !mismatch.empty())
            fail(s, "output differs from '" + states[*reference].result.name + "': " + mismatch,
                 ErrorCode::Internal);
    }

    // Samples, round robin, so slow drifts of the machine hit every candidate alike.
    for (uint32_t round = 0; round < policy.maxSamples && !single; ++round) {
        for (size_t c = 0; c < n; ++c) {
            State &s = states[c];
            if (!s.alive) continue;
            report("sample " + std::to_string(round + 1) + "/" +
                   std::to_string(policy.maxSamples) + ", candidate " + std::to_string(c + 1) +
                   " of " + std::to_string(n) + " (" + s.result.name + ")");
            Nanos t{0};
            ++runs;
            if (!guarded(s, [&] { t = options_.timer->time([&] { hooks.run(s.index, false); }); }))
                continue;
            s.samples.push_back(t);
            if (s.samples.size() > 1 &&
                static_cast<double>(t.count()) >=
                    static_cast<double>(s.best.count()) * (1.0 - policy.convergence))
                ++s.noProgress;
            else
                s.noProgress = 0;
            s.best = std::min(s.best, t);
        }
        if (round + 1 < policy.minSamples) continue;
        std::vector<State *> alive;
        for (auto &s : states)
            if (s.alive) alive.push_back(&s);
        if (policy.eliminationFactor > 0 && !alive.empty()) {
            std::sort(alive.begin(), alive.end(),
                      [](const State *a, const State *b) { return a->best < b->best; });
            const double limit =
                static_cast<double>(alive.front()->best.count()) * policy.eliminationFactor;
            while (alive.size() > std::max<size_t>(policy.keepAtLeast, 1) &&
                   static_cast<double>(alive.back()->best.count()) > limit) {
                alive.back()->alive = false;
                alive.back()->result.eliminated = true;
                alive.pop_back();
            }
        }
        if (policy.patience > 0 &&
            std::all_of(alive.begin(), alive.end(),
                        [&](const State *s) { return s->noProgress >= policy.patience; }))
            break;
    }
    if (progress) std::fprintf(stderr, "\r\033[K");

    std::vector<std::pair<size_t, std::string>> errors;
    std::vector<ErrorCode> codes;
    for (auto &s : states) {
        if (single) {
            s.result.ok = true;
            continue;
        }
        if (!s.result.error.empty()) {
            errors.emplace_back(s.index, s.result.error);
            codes.push_back(s.code);
            continue;
        }
        std::vector<Nanos> sorted = s.samples;
        std::sort(sorted.begin(), sorted.end());
        s.result.ok = true;
        s.result.samples = static_cast<uint32_t>(sorted.size());
        s.result.min = sorted.front();
        s.result.median = sorted[sorted.size() / 2];
        s.result.score = Nanos(static_cast<int64_t>(0.8 * static_cast<double>(s.result.min.count()) +
                                                    0.2 * static_cast<double>(s.result.median.count())));
    }
    {
        std::lock_guard lock(mutex_);
        counters_.benchmarkRuns += runs;
    }
    if (errors.size() == states.size()) throwAllFailed(set, key, errors, codes);

    // Ranking: survivors by score, then eliminated by score, then untried, then failed.
    std::vector<const State *> ranked;
    for (const auto &s : states)
        if (s.result.ok) ranked.push_back(&s);
    std::stable_sort(ranked.begin(), ranked.end(), [](const State *a, const State *b) {
        if (a->result.eliminated != b->result.eliminated) return !a->result.eliminated;
        return a->result.score < b->result.score;
    });
    TuneRecord record;
    record.set = set.name;
    record.key = key;
    record.device = options_.device;
    record.checksum = set.checksum;
    record.level = toString(options_.level);
    for (const State *s : ranked) record.ranking.push_back(s->result.name);
    std::vector<bool> listed(set.names.size(), false);
    for (const auto &s : states) listed[s.index] = true;
    for (size_t i = 0; i < set.names.size(); ++i)
        if (!listed[i]) record.ranking.push_back(set.names[i]);
    for (const auto &s : states)
        if (!s.result.ok) record.ranking.push_back(s.result.name);
    record.winner = record.ranking.front();
    for (const auto &s : states) record.results.push_back(s.result);

    if (log::enabled(log::Subsystem::Tune, log::Level::Info)) {
        std::string text = "tuned '" + set.name + "' [" + key + "] on " + options_.device +
                           ": winner '" + record.winner + "'";
        for (const State *s : ranked)
            text += "; " + s->result.name + " " + formatTime(s->result.score) +
                    (s->result.eliminated ? " (eliminated)" : "");
        logTune(log::Level::Info, text);
    }
    return record;
}

} // namespace backplane::tune
