// Autotuning: tunable sets of candidate implementations, benchmarking, cached winners.
#pragma once

#include <backplane/cache.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

namespace backplane {
class ComputeClient; // backplane/client.hpp
} // namespace backplane

/// The tuner follows CubeCL's (see docs/autotune.md): a *tunable set* names candidate
/// implementations of one operation; a *key* generated from the inputs buckets problem sizes; the
/// first call with a new key benchmarks the candidates and remembers the winner, in memory and in
/// the cache directory (tune/), so later calls and later processes run the winner directly.
namespace backplane::tune {

// -- keys ----------------------------------------------------------------------------------------

/// How one key axis is bucketed. Values are clamped to [min, max] and then rounded up to the
/// level's anchor (see anchor()); `exact` keeps the value as is at every level.
struct AxisAnchor {
    uint64_t min = 1;
    uint64_t max = UINT64_MAX;
    bool exact = false;
};

/// Rounds `value` up to its bucket at `level`, so that problems of similar size share one tuning
/// result: Minimal to a power of 4, Off and Balanced to a power of 2, Extensive to a power of 2
/// or 1.5 times one (twice as many buckets), Full not at all (every size is tuned).
uint64_t anchor(uint64_t value, TuneLevel level, const AxisAnchor &axis = {});

/// Builds key strings "m=1024,n=512,dtype=f32" with anchored numeric axes.
class KeyBuilder {
public:
    explicit KeyBuilder(TuneLevel level) : level_(level) {}
    /// Appends an anchored numeric axis.
    KeyBuilder &axis(std::string_view name, uint64_t value, const AxisAnchor &anchoring = {});
    /// Appends a value that is never bucketed (element type, layout...).
    KeyBuilder &exact(std::string_view name, std::string_view value);
    const std::string &str() const noexcept { return text_; }

private:
    TuneLevel level_;
    std::string text_;
};

// -- timing --------------------------------------------------------------------------------------

/// Measures one run of a candidate. The tuner calls time() once per sample; the implementation
/// decides what "the duration" is: host time around the run (SystemTimer) or device timestamps
/// of the work the run submitted (a client-based timer). Must let exceptions from `run` through.
class Timer {
public:
    virtual ~Timer() = default;
    /// Runs `run` once and returns how long it took.
    virtual std::chrono::nanoseconds time(const std::function<void()> &run) = 0;
};

/// Host steady clock around `sync(); run(); sync();`. `sync` (optional) waits for the device work
/// the run submitted, so that asynchronous launches are measured, not just their submission.
class SystemTimer final : public Timer {
public:
    explicit SystemTimer(std::function<void()> sync = {}) : sync_(std::move(sync)) {}
    std::chrono::nanoseconds time(const std::function<void()> &run) override;

private:
    std::function<void()> sync_;
};

/// Times a run with the engine's profiling tokens on the client's current stream: device
/// timestamps where the plugin has them, else the host clock around stream syncs (see
/// ComputeClient::profileEnd). Use it for candidates that launch kernels; pair it with
/// deviceFingerprint(client.device()) as the tuner's device.
class ClientTimer final : public Timer {
public:
    explicit ClientTimer(const ComputeClient &client);
    ~ClientTimer() override;
    std::chrono::nanoseconds time(const std::function<void()> &run) override;

private:
    std::unique_ptr<ComputeClient> client_;
};

// -- benchmark policy ----------------------------------------------------------------------------

/// How hard a tuning session works. forLevel() gives each level's defaults (docs/autotune.md has
/// the table); tests and benchmarks may pass their own.
struct BenchPolicy {
    uint32_t warmups = 1;     ///< untimed runs per candidate (compile, caches; first one checks output)
    uint32_t minSamples = 3;  ///< samples before elimination and convergence are considered
    uint32_t maxSamples = 10; ///< cap of timed samples per candidate
    /// After minSamples, a candidate whose best time exceeds this factor times the best
    /// candidate's is dropped (worst first, keeping `keepAtLeast`). 0 disables elimination.
    double eliminationFactor = 1.5;
    uint32_t keepAtLeast = 2;
    /// A sample that improves its candidate's best by less than this fraction makes no progress;
    /// once every survivor has made no progress `patience` samples in a row, sampling stops.
    double convergence = 0.02;
    uint32_t patience = 2; ///< 0: always take maxSamples
    bool defaultOnly = false; ///< try only candidates marked defaultPriority (Minimal)

    /// The defaults of one level. Off returns a policy that is never used (Off does not tune).
    static BenchPolicy forLevel(TuneLevel level);
};

// -- results -------------------------------------------------------------------------------------

/// One candidate's outcome in a tuning session.
struct CandidateResult {
    std::string name;
    bool ok = false;
    std::string error;              ///< why it was skipped ("" when ok)
    bool eliminated = false;        ///< dropped early as clearly slower
    uint32_t samples = 0;           ///< timed samples taken
    std::chrono::nanoseconds min{0};
    std::chrono::nanoseconds median{0};
    /// The ranking statistic: 0.8 * min + 0.2 * median (lower wins). The minimum is what the
    /// candidate can do; the median share penalises candidates that only rarely reach it.
    std::chrono::nanoseconds score{0};
};

/// A tuning decision, as kept in memory and in tune/<hash>.json.
struct TuneRecord {
    std::string set;      ///< tunable set name
    std::string key;      ///< the anchored key
    std::string device;   ///< device fingerprint
    std::string checksum; ///< of the candidate set (names and versions)
    std::string level;    ///< the level it was tuned at
    std::string winner;
    std::vector<std::string> ranking;     ///< candidate names, best first (winner first)
    std::vector<CandidateResult> results; ///< in candidate order; empty when imported sparse
};

/// Counters for tests and benchmarks (since construction or resetCounters()).
struct TuneCounters {
    uint64_t tunings = 0;        ///< tuning sessions (keys benchmarked)
    uint64_t benchmarkRuns = 0;  ///< candidate runs made by tuning (warm-ups and samples)
    uint64_t memoryHits = 0;     ///< decisions found in memory
    uint64_t persistentHits = 0; ///< decisions loaded from the cache directory
    uint64_t fallbackRuns = 0;   ///< calls that ran the fallback while another thread tuned
    uint64_t staleWinners = 0;   ///< cached winners that failed and were marked stale
};

// -- tunable sets --------------------------------------------------------------------------------

/// Per-candidate options.
struct CandidateOptions {
    /// Bump when the implementation changes in a way that can change its speed: it is part of
    /// the set's checksum, so stored results are re-tuned.
    uint32_t version = 1;
    /// Tried at level Minimal. When no candidate of a set has it, Minimal tries all.
    bool defaultPriority = true;
};

/// What the tuner needs of a set without knowing its types.
struct SetInfo {
    std::string name;
    std::vector<std::string> names;
    std::vector<CandidateOptions> options;
    std::string checksum;
    std::optional<size_t> fallback;
};

/// A named family of interchangeable implementations of one operation: `Output(const Inputs &)`.
/// `Output` may be void (no output cross-checks then). Build it once (e.g. a function-local
/// static) and hand it to Tuner::execute; it is immutable while in use.
template <class Inputs, class Output = void>
class TunableSet {
public:
    using Run = std::function<Output(const Inputs &)>;
    /// Inputs -> key. Receives the level so it can anchor sizes (see KeyBuilder).
    using KeyGenerator = std::function<std::string(const Inputs &, TuneLevel)>;
    /// (key, real inputs) -> the inputs candidates are benchmarked on (default: a copy).
    using InputGenerator = std::function<Inputs(const std::string &key, const Inputs &)>;
    using OutputValue = std::conditional_t<std::is_void_v<Output>, std::monostate, Output>;
    /// (reference output, candidate output) -> "" when equivalent, else what differs.
    using OutputCheck = std::function<std::string(const OutputValue &, const OutputValue &)>;

    /// `name` identifies the set in the cache: keep it stable and unique.
    TunableSet(std::string name, KeyGenerator key) : key_(std::move(key)) {
        info_.name = std::move(name);
    }

    /// Adds a candidate. Names must be unique within the set. Candidates may throw (compile or
    /// launch failure): the tuner skips them with the error recorded.
    TunableSet &add(std::string name, Run run, CandidateOptions options = {}) {
        for (const auto &existing : info_.names)
            if (existing == name)
                throw Error(ErrorCode::InvalidArgument,
                            "tunable set '" + info_.name + "': candidate '" + name +
                                "' added twice; candidate names must be unique");
        info_.names.push_back(std::move(name));
        info_.options.push_back(options);
        runs_.push_back(std::move(run));
        info_.checksum = checksumOf(info_);
        return *this;
    }
    /// Sets the benchmark input generator.
    TunableSet &inputs(InputGenerator generator) {
        inputs_ = std::move(generator);
        return *this;
    }
    /// Enables output cross-checks: each candidate's warm-up output is compared with the first
    /// valid candidate's; a mismatch rejects the candidate with the returned reason.
    TunableSet &check(OutputCheck check) {
        check_ = std::move(check);
        return *this;
    }
    /// Names the candidate that runs while another thread tunes the same key (instead of
    /// waiting). Throws Error(InvalidArgument) if there is no such candidate.
    TunableSet &fallback(std::string_view name) {
        for (size_t i = 0; i < info_.names.size(); ++i)
            if (info_.names[i] == name) {
                info_.fallback = i;
                return *this;
            }
        throw Error(ErrorCode::InvalidArgument, "tunable set '" + info_.name +
                                                    "': no candidate named '" +
                                                    std::string(name) + "' for the fallback");
    }

    const SetInfo &info() const noexcept { return info_; }
    const std::string &name() const noexcept { return info_.name; }
    size_t size() const noexcept { return runs_.size(); }
    std::string key(const Inputs &inputs, TuneLevel level) const { return key_(inputs, level); }
    Inputs benchmarkInputs(const std::string &key, const Inputs &inputs) const {
        return inputs_ ? inputs_(key, inputs) : inputs;
    }
    const Run &candidate(size_t index) const { return runs_.at(index); }
    const OutputCheck &outputCheck() const noexcept { return check_; }

private:
    static std::string checksumOf(const SetInfo &info);

    SetInfo info_;
    KeyGenerator key_;
    InputGenerator inputs_;
    OutputCheck check_;
    std::vector<Run> runs_;
};

/// Checksum of the candidate names and versions (hex FNV-1a): changes when a candidate is added,
/// removed, renamed, reordered or its version bumped.
std::string candidateChecksum(const SetInfo &info);

template <class Inputs, class Output>
std::string TunableSet<Inputs, Output>::checksumOf(const SetInfo &info) {
    return candidateChecksum(info);
}

// -- the tuner -----------------------------------------------------------------------------------

/// Type-erased access to one tuning session's candidates (what TunableSet provides to Tuner).
struct BenchHooks {
    std::function<void()> prepare;                   ///< builds the benchmark inputs
    std::function<void(size_t index, bool capture)> run; ///< runs a candidate on them
    /// (reference, candidate) -> "" or the mismatch; empty function: no checks.
    std::function<std::string(size_t reference, size_t index)> check;
};

/// Picks and remembers the fastest candidate of tunable sets for one device.
///
/// execute() computes the key; a decision found in memory or in the store runs directly;
/// otherwise the calling thread benchmarks the candidates (BenchPolicy) and records the ranking.
/// Another thread asking for a key being tuned runs the set's fallback candidate, or waits when
/// it has none: a key is never tuned twice at once. A cached winner that throws is marked stale
/// (removed from the store, re-tuned on the next call) and the next candidate of the ranking
/// runs instead.
///
/// Thread-safety: every member function may be called concurrently. Candidates run on the
/// calling thread; benchmarking holds no lock, so candidates may call into the tuner.
class Tuner {
public:
    struct Options {
        TuneLevel level = TuneLevel::Balanced;
        /// Persistent results (tune/ of the cache directory); nullptr: memory only.
        CacheStore *store = nullptr;
        /// Device identity for the keys (see deviceFingerprint()).
        std::string device = "unknown";
        /// Default: SystemTimer without sync.
        std::shared_ptr<Timer> timer;
        /// Default: BenchPolicy::forLevel(level).
        std::optional<BenchPolicy> policy;
        /// Progress lines on stderr (candidate i of n, current best). Default: when stderr is a
        /// terminal.
        std::optional<bool> progress;
    };

    explicit Tuner(Options options);
    /// A tuner for `config`'s level and cache directory (CacheStore::forConfig).
    Tuner(const Config &config, std::string device);

    /// Runs the best candidate of `set` for `inputs` (tuning first when the key is new) and
    /// returns its output. Throws Error when every candidate fails: the message lists each
    /// candidate's error; the code is theirs when they agree, else Internal.
    template <class Inputs, class Output>
    Output execute(const TunableSet<Inputs, Output> &set, const Inputs &inputs);

    /// The decision for (set, key) if one is in memory or in the store; never tunes.
    std::optional<TuneRecord> lookup(const SetInfo &set, const std::string &key) const;

    TuneLevel level() const noexcept { return options_.level; }
    const std::string &device() const noexcept { return options_.device; }
    TuneCounters counters() const;
    void resetCounters();

    /// Serialisation of records (the payload of tune/ entries and of `backplane tune export`).
    static std::string toJson(const TuneRecord &record);
    /// Throws Error(Config) naming `what` when the text is not a record.
    static TuneRecord fromJson(std::string_view json, std::string_view what);
    /// The store key of (set, key, device, checksum).
    static std::string storeKey(const std::string &set, const std::string &key,
                                const std::string &device, const std::string &checksum);

private:
    /// The candidate order to run on the real inputs, winner first.
    struct Plan {
        std::vector<size_t> order;
        bool cached = false; ///< the first entry is a remembered winner (stale on failure)
    };

    Plan plan(const SetInfo &set, const std::string &key, BenchHooks &hooks);
    TuneRecord benchmark(const SetInfo &set, const std::string &key, BenchHooks &hooks);
    void markStale(const SetInfo &set, const std::string &key);
    [[noreturn]] void throwAllFailed(const SetInfo &set, const std::string &key,
                                     const std::vector<std::pair<size_t, std::string>> &errors,
                                     const std::vector<ErrorCode> &codes) const;

    struct Entry {
        bool pending = false;
        bool stale = false;
        TuneRecord record;
    };

    Options options_;
    BenchPolicy policy_;
    mutable std::mutex mutex_;
    std::condition_variable done_;
    std::map<std::string, Entry> entries_;
    TuneCounters counters_;
};

template <class Inputs, class Output>
Output Tuner::execute(const TunableSet<Inputs, Output> &set, const Inputs &inputs) {
    if (set.size() == 0)
        throw Error(ErrorCode::InvalidArgument,
                    "tunable set '" + set.name() + "' has no candidates; add() some first");
    const std::string key = set.key(inputs, options_.level);

    using Value = typename TunableSet<Inputs, Output>::OutputValue;
    std::optional<Inputs> benchInputs;
    std::vector<std::optional<Value>> outputs(set.size());
    BenchHooks hooks;
    hooks.prepare = [&] { benchInputs.emplace(set.benchmarkInputs(key, inputs)); };
    hooks.run = [&](size_t index, bool capture) {
        if constexpr (std::is_void_v<Output>) {
            set.candidate(index)(*benchInputs);
            if (capture) outputs[index].emplace();
        } else if (capture && set.outputCheck()) {
            outputs[index].emplace(set.candidate(index)(*benchInputs));
        } else {
            (void)set.candidate(index)(*benchInputs);
        }
    };
    if (set.outputCheck())
        hooks.check = [&](size_t reference, size_t index) {
            return set.outputCheck()(*outputs[reference], *outputs[index]);
        };

    const Plan decided = plan(set.info(), key, hooks);
    std::vector<std::pair<size_t, std::string>> errors;
    std::vector<ErrorCode> codes;
    for (size_t i = 0; i < decided.order.size(); ++i) {
        const size_t index = decided.order[i];
        try {
            if constexpr (std::is_void_v<Output>) {
                set.candidate(index)(inputs);
                return;
            } else {
                return set.candidate(index)(inputs);
            }
        } catch (const Error &e) {
            errors.emplace_back(index, e.what());
            codes.push_back(e.code());
        } catch (const std::exception &e) {
            errors.emplace_back(index, e.what());
            codes.push_back(ErrorCode::Internal);
        } catch (...) {
            errors.emplace_back(index, "unknown exception");
            codes.push_back(ErrorCode::Internal);
        }
        if (i == 0 && decided.cached) markStale(set.info(), key);
    }
    throwAllFailed(set.info(), key, errors, codes);
}

} // namespace backplane::tune
