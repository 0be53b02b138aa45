// Randomized model test of the engine: T threads issue random operations on S shared streams and
// every read is checked against a sequential model of what each buffer must hold. The plugin is
// named by BACKPLANE_MODEL_PLUGIN / BACKPLANE_MODEL_LIBRARY / BACKPLANE_MODEL_OPTIONS; exits 77
// (SKIP) when it has no device here (tests internals: opens the plugin through
// detail::PluginLibrary, backplane_internal_dep).
//
// Knobs: BACKPLANE_MODEL_SEED (default random, printed), BACKPLANE_MODEL_SECONDS (default 4),
// BACKPLANE_MODEL_THREADS (4), BACKPLANE_MODEL_STREAMS (6), BACKPLANE_MODEL_OPS (operations per
// thread, 0 = until the time is up), BACKPLANE_MODEL_TRACE=1 (print every operation),
// BACKPLANE_MODEL_DISABLE=read-dropped,drop-deferred (operations never picked, to narrow a failure
// down; create and drop still run where a thread must allocate or free),
// BACKPLANE_MODEL_FAULTS=N (host plugin, N <= 16: N refused faults of each kind, launch, copy, fill and
// replay, injected at random points through the plugin's inject_faults option; the model then
// also tracks which words are poisoned, and checks that every read and every operation reading
// them fails with Error(Poisoned) and nothing else: docs/streams.md "What failed work leaves
// behind").
// Thread t draws from an RNG seeded with seed + t, so one thread with a given seed and
// BACKPLANE_MODEL_OPS replays the same operations exactly.
#define DOCTEST_CONFIG_IMPLEMENT
#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/kernel.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <thread>
#include <functional>
#include <utility>
#include <vector>

using namespace backplane;

namespace {

// ----- settings and plugin ----------------------------------------------------------------------

struct Settings {
    std::string plugin;
    uint64_t seed = 0;
    double seconds = 4;
    uint32_t threads = 4;
    uint32_t streams = 6;
    uint64_t opsPerThread = 0; ///< 0: until the time is up
    bool trace = false;
    std::vector<bool> disabled; ///< by Op: never picked
    uint64_t faults = 0;        ///< refused faults injected per operation kind (host plugin)
};

Settings gSettings;
std::shared_ptr<detail::PluginLibrary> gPlugin;
DeviceInfo gDevice;
std::optional<ComputeClient> gClient;

// Small enough that writes and reads of a few hundred KiB run the multi-chunk staging pipeline.
constexpr uint64_t kStagingChunkBytes = 64ull << 10;
// A thread's live buffers are bounded so the run's memory stays modest.
constexpr size_t kMaxLiveBuffers = 12;
constexpr uint64_t kMaxThreadWords = (24ull << 20) / 4;
constexpr size_t kMaxDeferredReads = 6;
constexpr uint64_t kMaxDeferredWords = 16ull << 10;
constexpr size_t kMaxReports = 8;
// After the time is up, a thread that has not finished by then is reported as hung.
constexpr int kHangGraceSeconds = 60;

// Deterministic on every platform (std:: distributions are not): splitmix64.
class Rng {
public:
    explicit Rng(uint64_t seed) : state_(seed) {}
    uint64_t next() {
        uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
        z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
        z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
        return z ^ (z >> 31);
    }
    /// Uniform in [0, n) (0 when n <= 1); the modulo bias is irrelevant here.
    uint64_t below(uint64_t n) { return n <= 1 ? 0 : next() % n; }
    bool percent(uint32_t p) { return below(100) < p; }
    uint32_t word() { return static_cast<uint32_t>(next() >> 32); }

private:
    uint64_t state_;
};

// ----- the kernel: y[yOffset + i] = a * x[xOffset + i] + y[yOffset + i] (mod 2^32), i < n ------

struct AxpyScalars {
    uint32_t a;
    uint32_t n;
    uint32_t xOffset; ///< in words
    uint32_t yOffset; ///< in words
    uint32_t delayUs; ///< host variant only: every workgroup spins this long before its work
};

void axpyHost(const bp_host_kernel_context *c) {
    AxpyScalars s;
    std::memcpy(&s, c->scalars, sizeof(s));
    if (s.delayUs != 0) {
        // Holds the launch in flight so that hazards on its buffers have time to show.
        const auto until = std::chrono::steady_clock::now() + std::chrono::microseconds(s.delayUs);
        while (std::chrono::steady_clock::now() < until) {
        }
    }
    const auto *x = static_cast<const uint32_t *>(c->buffers[0]);
    auto *y = static_cast<uint32_t *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < s.n) y[s.yOffset + i] = s.a * x[s.xOffset + i] + y[s.yOffset + i];
    }
}

constexpr const char *kAxpyGlsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer X { uint x[]; };
layout(set = 0, binding = 1) buffer Y { uint y[]; };
layout(push_constant) uniform Scalars {
    uint a; uint n; uint xOffset; uint yOffset; uint delayUs;
} s;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < s.n) y[s.yOffset + i] = s.a * x[s.xOffset + i] + y[s.yOffset + i];
}
)";

constexpr const char *kAxpyCuda = R"(
struct AxpyScalars { unsigned int a, n, xOffset, yOffset, delayUs; };
extern "C" __global__ void model_axpy(const unsigned int *x, unsigned int *y, AxpyScalars s) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < s.n) y[s.yOffset + i] = s.a * x[s.xOffset + i] + y[s.yOffset + i];
}
)";

/// x is read, y read and written (what a failed launch poisons: all of y).
KernelSource axpyKernel() {
    return {"model_axpy",
            {KernelVariant::host(&axpyHost, "model_axpy"),
             KernelVariant::text(Dialect::Cuda, "model_axpy", kAxpyCuda),
             KernelVariant::text(Dialect::Hip, "model_axpy", kAxpyCuda),
             KernelVariant::text(Dialect::Glsl, "main", kAxpyGlsl)},
            {BindingAccess::Read, BindingAccess::ReadWrite}};
}

// ----- the model --------------------------------------------------------------------------------

/// A buffer and what it must hold. Owned by one thread at a time, so the model is exact.
struct Tracked {
    Buffer buffer;
    std::vector<uint32_t> words;
    std::vector<uint8_t> known; ///< 0 where nothing defined was written (empty())
    std::vector<uint8_t> poison; ///< 1 where a failed operation was to write (reads must fail)
    std::string name;           ///< "t1.b42": thread 1's 42nd buffer

    bool poisoned(uint64_t first, uint64_t count) const {
        return std::any_of(poison.begin() + static_cast<std::ptrdiff_t>(first),
                           poison.begin() + static_cast<std::ptrdiff_t>(first + count),
                           [](uint8_t p) { return p != 0; });
    }
    bool poisoned() const { return poisoned(0, poison.size()); }
    void setPoison(uint64_t first, uint64_t count, bool on) {
        std::fill_n(poison.begin() + static_cast<std::ptrdiff_t>(first), count, on ? 1 : 0);
    }
};
using TrackedPtr = std::unique_ptr<Tracked>;

/// A read whose future is kept for later: what the range held when the read was ordered.
struct DeferredRead {
    ReadFuture future;
    std::string name;
    uint64_t opIndex = 0;
    StreamId stream = 0;
    uint64_t firstWord = 0;
    std::vector<uint32_t> words;
    std::vector<uint8_t> known;
};

enum class Op {
    Create,
    Empty,
    Write,
    Read,
    ReadDropped,
    ReadDeferred,
    FinishDeferred,
    DropDeferred,
    Copy,
    Fill,
    Kernel,
    Recycle,
    Drop,
    HandOff,
    Flush,
    Sync,
    SyncAll,
    Cleanup,
    Replay,
    Absurd,
};

constexpr size_t kOpCount = static_cast<size_t>(Op::Absurd) + 1;

// Per mille.
constexpr std::array<std::pair<Op, uint32_t>, kOpCount> kOpWeights = {{
    {Op::Create, 90},         {Op::Empty, 50},        {Op::Write, 90},
    {Op::Read, 110},          {Op::ReadDropped, 50},  {Op::ReadDeferred, 40},
    {Op::FinishDeferred, 30}, {Op::DropDeferred, 10}, {Op::Copy, 115},
    {Op::Fill, 80},           {Op::Kernel, 105},      {Op::Recycle, 40},
    {Op::Drop, 90},           {Op::HandOff, 40},      {Op::Flush, 25},
    {Op::Sync, 25},           {Op::SyncAll, 8},       {Op::Cleanup, 2},
    {Op::Replay, 40},         {Op::Absurd, 20},
}};

const char *toString(Op op) {
    switch (op) {
    case Op::Create: return "create";
    case Op::Empty: return "empty";
    case Op::Write: return "write";
    case Op::Read: return "read";
    case Op::ReadDropped: return "read-dropped";
    case Op::ReadDeferred: return "read-deferred";
    case Op::FinishDeferred: return "finish-deferred";
    case Op::DropDeferred: return "drop-deferred";
    case Op::Copy: return "copy";
    case Op::Fill: return "fill";
    case Op::Kernel: return "kernel";
    case Op::Recycle: return "recycle";
    case Op::Drop: return "drop";
    case Op::HandOff: return "hand-off";
    case Op::Flush: return "flush";
    case Op::Sync: return "sync";
    case Op::SyncAll: return "sync-all";
    case Op::Cleanup: return "memory-cleanup";
    case Op::Replay: return "record-replay";
    case Op::Absurd: return "absurd-size";
    }
    return "?";
}

/// What a thread is doing, for the hang report.
struct Progress {
    std::atomic<uint64_t> op{0};
    std::atomic<const char *> name{"start"};
    std::atomic<uint64_t> stream{0};
    std::atomic<bool> done{false};
};

/// State the threads share: the client, the mailboxes of handed-off buffers, the results.
struct Shared {
    explicit Shared(uint32_t threads) : inboxes(threads), progress(threads) {}

    std::chrono::steady_clock::time_point deadline;
    bool hostDelays = false;
    std::atomic<bool> stop{false};
    std::atomic<uint64_t> ops{0};
    std::atomic<uint64_t> readsChecked{0};
    std::atomic<uint64_t> mismatches{0};
    std::atomic<uint64_t> errors{0};
    std::atomic<uint64_t> injected{0};         ///< calls an injected fault refused
    std::atomic<uint64_t> poisonedRefusals{0}; ///< calls refused for poisoned words, as expected

    std::mutex mailMutex;
    std::vector<std::vector<TrackedPtr>> inboxes;
    std::vector<Progress> progress;

    std::mutex reportMutex;
    std::vector<std::string> reports;

    void report(std::atomic<uint64_t> &counter, const std::string &text) {
        counter.fetch_add(1);
        std::lock_guard lock(reportMutex);
        if (reports.size() < kMaxReports) reports.push_back(text);
    }
};

std::string hex(uint32_t v) {
    std::array<char, 16> text{};
    std::snprintf(text.data(), text.size(), "0x%08x", v);
    return text.data();
}

struct Range {
    uint64_t first = 0; ///< in words
    uint64_t count = 0;
};

class Worker {
public:
    Worker(Shared &shared, uint32_t index)
        : shared_(shared), client_(*gClient), index_(index), rng_(gSettings.seed + index) {}

    void run() {
        Progress &progress = shared_.progress[index_];
        try {
            while (!shared_.stop.load() && std::chrono::steady_clock::now() < shared_.deadline &&
                   (gSettings.opsPerThread == 0 || op_ < gSettings.opsPerThread)) {
                stream_ = rng_.below(gSettings.streams);
                StreamGuard guard(stream_);
                if (rng_.percent(15)) receive();
                Op op = pickOp();
                progress.op.store(op_);
                progress.name.store(toString(op));
                progress.stream.store(stream_);
                perform(op);
                ++op_;
                shared_.ops.fetch_add(1);
            }
            progress.name.store("final check");
            finish();
        } catch (const std::exception &e) {
            shared_.report(shared_.errors, "error: seed=" + std::to_string(gSettings.seed) +
                                               " thread=" + std::to_string(index_) + " op=#" +
                                               std::to_string(op_) + " (" +
                                               progress.name.load() + ", stream " +
                                               std::to_string(stream_) + "): " + e.what());
            shared_.stop.store(true);
        }
        progress.done.store(true);
    }

private:
    // ----- choosing ----------------------------------------------------------------------------

    Op pickOp() {
        uint32_t total = 0;
        for (const auto &[op, weight] : kOpWeights) total += weightOf(op, weight);
        uint64_t r = rng_.below(total);
        Op op = Op::Create;
        for (const auto &[candidate, w] : kOpWeights) {
            const uint32_t weight = weightOf(candidate, w);
            if (r < weight) {
                op = candidate;
                break;
            }
            r -= weight;
        }
        const bool allocates = op == Op::Create || op == Op::Empty;
        if (allocates && (live_.size() >= kMaxLiveBuffers || liveWords() > kMaxThreadWords))
            return Op::Drop;
        if (live_.empty() && !allocates && op != Op::FinishDeferred &&
            op != Op::DropDeferred && op != Op::Flush &&
            op != Op::Sync && op != Op::SyncAll && op != Op::Cleanup)
            return Op::Create;
        return op;
    }

    static uint32_t weightOf(Op op, uint32_t weight) {
        return gSettings.disabled[static_cast<size_t>(op)] ? 0 : weight;
    }

    [[nodiscard]] uint64_t liveWords() const {
        uint64_t words = 0;
        for (const auto &t : live_) words += t->words.size();
        return words;
    }

    // Mostly small, sometimes up to a few MiB; often a size just freed, so memory is recycled.
    uint64_t pickWords() {
        if (!recentWords_.empty() && rng_.percent(35))
            return recentWords_[rng_.below(recentWords_.size())];
        const uint64_t r = rng_.below(100);
        constexpr uint64_t kKi = 1024;
        if (r < 55) return 1 + rng_.below(kKi);              // 4 B .. 4 KiB
        if (r < 90) return 1 + rng_.below(16 * kKi);         // .. 64 KiB
        if (r < 99) return 16 * kKi + rng_.below(240 * kKi); // .. 1 MiB
        return 256 * kKi + rng_.below(768 * kKi);            // .. 4 MiB
    }

    Range pickRange(uint64_t total) {
        if (rng_.percent(25)) return {0, total};
        const uint64_t count = rng_.percent(50) ? 1 + rng_.below(std::min<uint64_t>(total, 64))
                                                : 1 + rng_.below(total);
        return {rng_.below(total - count + 1), count};
    }

    // Two ranges of one length: disjoint inside one buffer, or one in each of two buffers.
    std::optional<std::pair<Range, Range>> pickPair(uint64_t totalA, uint64_t totalB, bool same) {
        if (!same) {
            const uint64_t count = pickRange(std::min(totalA, totalB)).count;
            return std::pair{Range{rng_.below(totalA - count + 1), count},
                             Range{rng_.below(totalB - count + 1), count}};
        }
        if (totalA < 2) return std::nullopt;
        const uint64_t count = 1 + rng_.below(totalA / 2);
        const uint64_t a = rng_.below(totalA - 2 * count + 1);
        const uint64_t b = a + count + rng_.below(totalA - 2 * count - a + 1);
        if (rng_.percent(50)) return std::pair{Range{a, count}, Range{b, count}};
        return std::pair{Range{b, count}, Range{a, count}};
    }

    size_t pickLive() { return rng_.below(live_.size()); }

    std::vector<uint32_t> randomWords(uint64_t count) {
        std::vector<uint32_t> data(count);
        for (uint64_t i = 0; i < count; i += 2) {
            const uint64_t v = rng_.next();
            data[i] = static_cast<uint32_t>(v);
            if (i + 1 < count) data[i + 1] = static_cast<uint32_t>(v >> 32);
        }
        return data;
    }

    // ----- failures (BACKPLANE_MODEL_FAULTS) ----------------------------------------------------

    /// How a call ended: it ran, it was refused for reading poisoned words, or an injected
    /// fault refused it. Any other error ends the thread's run as an error.
    enum class Result { Done, Poisoned, Injected };

    template <class F> Result attempt(F &&call) {
        try {
            call();
            return Result::Done;
        } catch (const Error &e) {
            if (e.code() == ErrorCode::Poisoned) {
                note("  refused: %s", e.what());
                return Result::Poisoned;
            }
            if (gSettings.faults != 0 &&
                std::string_view(e.what()).find("injected refused fault") !=
                    std::string_view::npos) {
                shared_.injected.fetch_add(1);
                note("  failed (injected): %s", e.what());
                return Result::Injected;
            }
            throw;
        }
    }

    /// A mismatch unless the call was refused with Error(Poisoned) exactly when the model says
    /// it reads poisoned words.
    void expectPoison(Result got, bool expected, const std::string &what) {
        if (expected == (got == Result::Poisoned)) {
            if (expected) shared_.poisonedRefusals.fetch_add(1);
            return;
        }
        shared_.report(shared_.mismatches,
                       "mismatch: seed=" + std::to_string(gSettings.seed) + " thread=" +
                           std::to_string(index_) + " op=#" + std::to_string(op_) + ": " + what +
                           (expected ? " reads poisoned words but was not refused with "
                                       "Error(Poisoned)"
                                     : " was refused with Error(Poisoned), but the model has no "
                                       "poisoned word there"));
    }

    // ----- operations --------------------------------------------------------------------------

    void perform(Op op) {
        switch (op) {
        case Op::Create: create(); break;
        case Op::Empty: makeEmpty(); break;
        case Op::Write: write(); break;
        case Op::Read: read(); break;
        case Op::ReadDropped: readDropped(); break;
        case Op::ReadDeferred: readDeferred(); break;
        case Op::FinishDeferred: finishDeferred(true); break;
        case Op::DropDeferred: finishDeferred(false); break;
        case Op::Copy: copy(); break;
        case Op::Fill: fill(); break;
        case Op::Kernel: kernel(); break;
        case Op::Recycle: recycle(); break;
        case Op::Drop: drop(pickLive()); break;
        case Op::HandOff: handOff(); break;
        case Op::Flush:
            note("flush");
            client_.flush();
            break;
        case Op::Sync:
            note("sync");
            client_.sync();
            break;
        case Op::SyncAll:
            note("sync-all");
            client_.syncAll();
            break;
        case Op::Cleanup:
            note("memory-cleanup");
            client_.memoryCleanup();
            break;
        case Op::Replay: recordAndReplay(); break;
        case Op::Absurd: absurd(); break;
        }
    }

    TrackedPtr track(uint64_t words) {
        auto t = std::make_unique<Tracked>();
        t->words.resize(words);
        t->known.resize(words);
        t->poison.resize(words);
        t->name = "t" + std::to_string(index_) + ".b" + std::to_string(serial_++);
        return t;
    }

    void create() {
        TrackedPtr t = track(pickWords());
        t->words = randomWords(t->words.size());
        std::fill(t->known.begin(), t->known.end(), 1);
        note("create %s %llu B", t->name.c_str(), bytes(t->words.size()));
        const Result r =
            attempt([&] { t->buffer = client_.create(t->words.data(), t->words.size() * 4); });
        expectPoison(r, false, "create");
        if (r != Result::Done) return; // no Buffer came back
        live_.push_back(std::move(t));
    }

    void makeEmpty() {
        TrackedPtr t = track(pickWords());
        t->buffer = client_.empty(t->words.size() * 4);
        note("empty %s %llu B", t->name.c_str(), bytes(t->words.size()));
        live_.push_back(std::move(t));
    }

    void write() {
        Tracked &t = *live_[pickLive()];
        const Range r = pickRange(t.words.size());
        const std::vector<uint32_t> data = randomWords(r.count);
        note("write %s [%llu, +%llu) B", t.name.c_str(), bytes(r.first), bytes(r.count));
        const Result done =
            attempt([&] { client_.write(t.buffer, r.first * 4, data.data(), r.count * 4); });
        expectPoison(done, false, "write");
        wrote(t, r, done, [&] {
            std::copy(data.begin(), data.end(), t.words.data() + r.first);
            std::fill_n(t.known.data() + r.first, r.count, 1);
        });
    }

    /// The model's side of an operation that writes `r` of `t` and ended with `done`: `apply`
    /// when it ran (the range is valid), else the range is poisoned.
    template <class F> static void wrote(Tracked &t, Range r, Result done, F &&apply) {
        if (done == Result::Done) {
            apply();
            t.setPoison(r.first, r.count, false);
        } else {
            t.setPoison(r.first, r.count, true);
        }
    }

    void read() {
        const size_t at = pickLive();
        Tracked &t = *live_[at];
        const uint64_t how = rng_.below(3);
        bool right = true;
        if (how == 0) {
            note("read %s all (readAs)", t.name.c_str());
            std::vector<uint32_t> got;
            const Result done = attempt([&] { got = client_.readAs<uint32_t>(t.buffer); });
            expectPoison(done, t.poisoned(), "read (readAs) of " + t.name);
            if (done == Result::Done)
                right = check(t.name, 0, got.data(), got.size(), t.words.data(), t.known.data(),
                              t.words.size(), "read (readAs)");
        } else if (how == 1) {
            const Range r = pickRange(t.words.size());
            note("read %s [%llu, +%llu) B (future)", t.name.c_str(), bytes(r.first),
                 bytes(r.count));
            std::vector<std::byte> got;
            const Result done =
                attempt([&] { got = client_.read(t.buffer, r.first * 4, r.count * 4).wait(); });
            expectPoison(done, t.poisoned(r.first, r.count), "read (future) of " + t.name);
            const std::vector<uint32_t> words = toWords(got);
            if (done == Result::Done)
                right = check(t.name, r.first, words.data(), words.size(),
                              t.words.data() + r.first, t.known.data() + r.first, r.count,
                              "read (future)");
        } else {
            const Range r = pickRange(t.words.size());
            note("read %s [%llu, +%llu) B (into memory)", t.name.c_str(), bytes(r.first),
                 bytes(r.count));
            std::vector<uint32_t> got(r.count);
            const Result done = attempt(
                [&] { client_.readInto(t.buffer, r.first * 4, got.data(), r.count * 4); });
            expectPoison(done, t.poisoned(r.first, r.count), "read (into memory) of " + t.name);
            if (done == Result::Done)
                right = check(t.name, r.first, got.data(), got.size(), t.words.data() + r.first,
                              t.known.data() + r.first, r.count, "read (into memory)");
        }
        // A wrong buffer would repeat its error in every later read: it leaves the run.
        if (!right) drop(at);
    }

    void readDropped() {
        const size_t at = pickLive();
        Tracked &t = *live_[at];
        const Range r = pickRange(t.words.size());
        note("read %s [%llu, +%llu) B, future dropped", t.name.c_str(), bytes(r.first),
             bytes(r.count));
        const Result done =
            attempt([&] { ReadFuture dropped = client_.read(t.buffer, r.first * 4, r.count * 4); });
        expectPoison(done, t.poisoned(r.first, r.count), "read (future dropped) of " + t.name);
        if (rng_.percent(20)) drop(at);
    }

    void readDeferred() {
        if (deferred_.size() >= kMaxDeferredReads) finishDeferred(true);
        if (live_.empty()) return;
        const size_t at = pickLive();
        keepRead(at);
        // Sometimes the pending read is all that still uses the memory.
        if (rng_.percent(30)) drop(at);
    }

    // Orders a read of part of live_[at] and keeps its future with what the range holds now.
    void keepRead(size_t at) {
        Tracked &t = *live_[at];
        Range r = pickRange(t.words.size());
        r.count = std::min(r.count, kMaxDeferredWords);
        DeferredRead d;
        d.name = t.name;
        d.opIndex = op_;
        d.stream = stream_;
        d.firstWord = r.first;
        d.words.assign(t.words.data() + r.first, t.words.data() + r.first + r.count);
        d.known.assign(t.known.data() + r.first, t.known.data() + r.first + r.count);
        note("read %s [%llu, +%llu) B, future kept", t.name.c_str(), bytes(r.first),
             bytes(r.count));
        const Result done =
            attempt([&] { d.future = client_.read(t.buffer, r.first * 4, r.count * 4); });
        expectPoison(done, t.poisoned(r.first, r.count), "read (future kept) of " + t.name);
        if (done == Result::Done) deferred_.push_back(std::move(d));
    }

    // Waits for a kept read and checks it, or drops its future unwaited.
    void finishDeferred(bool wait) {
        if (deferred_.empty()) return;
        const size_t at = rng_.below(deferred_.size());
        DeferredRead d = std::move(deferred_[at]);
        deferred_.erase(deferred_.begin() + static_cast<std::ptrdiff_t>(at));
        if (!wait) {
            note("drop the future of op #%llu (%s) unwaited", ull(d.opIndex), d.name.c_str());
            return;
        }
        note("wait for the read of op #%llu (%s)", ull(d.opIndex), d.name.c_str());
        const std::vector<uint32_t> words = toWords(d.future.wait());
        const std::string how = "read ordered at op #" + std::to_string(d.opIndex) +
                                " on stream " + std::to_string(d.stream) + ", waited later";
        check(d.name, d.firstWord, words.data(), words.size(), d.words.data(), d.known.data(),
              d.words.size(), how.c_str());
    }

    void copy() {
        const size_t from = pickLive();
        const size_t to = rng_.percent(20) ? from : pickLive();
        Tracked &src = *live_[from];
        Tracked &dst = *live_[to];
        const auto ranges = pickPair(src.words.size(), dst.words.size(), from == to);
        if (!ranges) return;
        const auto [rs, rd] = *ranges;
        note("copy %s [%llu, +%llu) B -> %s at %llu", src.name.c_str(), bytes(rs.first),
             bytes(rs.count), dst.name.c_str(), bytes(rd.first));
        const Result done = attempt(
            [&] { client_.copy(src.buffer, rs.first * 4, dst.buffer, rd.first * 4, rs.count * 4); });
        expectPoison(done, src.poisoned(rs.first, rs.count), "copy from " + src.name);
        wrote(dst, rd, done, [&] {
            std::copy_n(src.words.data() + rs.first, rs.count, dst.words.data() + rd.first);
            std::copy_n(src.known.data() + rs.first, rs.count, dst.known.data() + rd.first);
        });
        // Dropping the source while the copy may still be pending.
        if (from != to && rng_.percent(15)) drop(from);
    }

    /// A call with a size or offset near 2^64 (or one whose end wraps) that must be refused
    /// with Error before it does anything: later reads of every buffer check that nothing
    /// changed and nothing aliased.
    void absurd() {
        const uint64_t near = UINT64_MAX - rng_.below(1ull << 16);
        const uint64_t how = rng_.below(live_.empty() ? 2 : 9);
        note("absurd size %llu, form %llu", ull(near), ull(how));
        std::vector<uint32_t> host(16);
        bool refusedCall = false;
        try {
            switch (how) {
            case 0: (void)client_.empty(near); break;
            case 1: {
                const uint64_t shape[] = {near / 8 + 1, 8};
                (void)client_.emptyTensor(shape, 1 + rng_.below(8));
                break;
            }
            default: {
                Tracked &t = *live_[pickLive()];
                switch (how) {
                case 2: client_.write(t.buffer, near, host.data(), 64); break;
                case 3: client_.write(t.buffer, 4, host.data(), near); break;
                case 4: client_.readInto(t.buffer, near & ~uint64_t{3}, host.data(), 64); break;
                case 5: client_.copy(t.buffer, near, t.buffer, 0, 64); break;
                case 6: client_.copy(t.buffer, 0, t.buffer, 4, near); break;
                case 7: client_.fill(t.buffer, 0u, near & ~uint64_t{3}, 8); break;
                default: (void)t.buffer.view(8, near); break;
                }
            }
            }
        } catch (const Error &) {
            refusedCall = true;
        }
        if (!refusedCall)
            shared_.report(shared_.mismatches,
                           "mismatch: seed=" + std::to_string(gSettings.seed) + " thread=" +
                               std::to_string(index_) + " op=#" + std::to_string(op_) +
                               ": a call with size/offset " + std::to_string(near) + " (form " +
                               std::to_string(how) + ") was accepted");
    }

    void fill() {
        Tracked &t = *live_[pickLive()];
        static constexpr std::array<uint32_t, 3> kPatterns = {0u, 0xffffffffu, 0xdeadbeefu};
        const uint32_t pattern = rng_.percent(50) ? rng_.word() : kPatterns[rng_.below(3)];
        const uint64_t how = rng_.below(10);
        Range r;
        Result done = Result::Done;
        if (how < 2) {
            r = {0, t.words.size()};
            note("fill %s all with %s", t.name.c_str(), hex(pattern).c_str());
            done = attempt([&] { client_.fill(t.buffer, pattern); });
        } else if (how < 3) {
            r.first = rng_.below(t.words.size());
            r.count = t.words.size() - r.first;
            note("fill %s from %llu B to the end with %s", t.name.c_str(), bytes(r.first),
                 hex(pattern).c_str());
            done = attempt([&] { client_.fill(t.buffer, pattern, r.first * 4); });
        } else {
            r = pickRange(t.words.size());
            note("fill %s [%llu, +%llu) B with %s", t.name.c_str(), bytes(r.first),
                 bytes(r.count), hex(pattern).c_str());
            done = attempt([&] { client_.fill(t.buffer, pattern, r.first * 4, r.count * 4); });
        }
        expectPoison(done, false, "fill");
        wrote(t, r, done, [&] {
            std::fill_n(t.words.data() + r.first, r.count, pattern);
            std::fill_n(t.known.data() + r.first, r.count, 1);
        });
    }

    void kernel() {
        const size_t ix = pickLive();
        const size_t iy = rng_.percent(15) ? ix : pickLive();
        Tracked &x = *live_[ix];
        Tracked &y = *live_[iy];
        const auto ranges = pickPair(x.words.size(), y.words.size(), ix == iy);
        if (!ranges) return;
        const auto [rx, ry] = *ranges;
        // Host plugin: sometimes hold small launches in flight for up to 300 us.
        uint32_t delayUs = 0;
        if (shared_.hostDelays && rx.count <= 1024 && rng_.percent(25))
            delayUs = static_cast<uint32_t>(1 + rng_.below(300));
        launchAxpy(x, rx, y, ry, delayUs);
        if (ix != iy && rng_.percent(15)) drop(ix);
    }

    // y[ry] = a * x[rx] + y[ry] with a random a, on the device and in the model.
    // The kernel reads all of x and y (its bindings are whole buffers) and writes all of y:
    // refused when either has a poisoned word, and y is poisoned whenever it did not run.
    void launchAxpy(const Tracked &x, Range rx, Tracked &y, Range ry, uint32_t delayUs) {
        const bool poisoned = x.poisoned() || y.poisoned();
        uint32_t a = 0;
        const Result done = attempt([&] { a = issueAxpy(x, rx, y, ry, delayUs); });
        expectPoison(done, poisoned, "kernel on x=" + x.name + ", y=" + y.name);
        if (done == Result::Done) applyAxpy(x, rx, y, ry, a);
        else y.setPoison(0, y.poison.size(), true);
    }

    // The launch alone (recorded when the stream records); returns its factor a.
    uint32_t issueAxpy(const Tracked &x, Range rx, const Tracked &y, Range ry, uint32_t delayUs) {
        AxpyScalars s{};
        s.a = rng_.word();
        s.n = static_cast<uint32_t>(rx.count);
        s.xOffset = static_cast<uint32_t>(rx.first);
        s.yOffset = static_cast<uint32_t>(ry.first);
        s.delayUs = delayUs;
        Dispatch d;
        d.block = {256, 1, 1};
        d.grid = {(s.n + 255) / 256, 1, 1};
        d.bindings = {x.buffer, y.buffer};
        d.scalar(s);
        note("kernel y=%s [%llu, +%llu) B, x=%s at %llu, a=%s, delay %u us", y.name.c_str(),
             bytes(ry.first), bytes(ry.count), x.name.c_str(), bytes(rx.first),
             hex(s.a).c_str(), s.delayUs);
        client_.execute(axpyKernel(), d);
        return s.a;
    }

    // The model's side of issueAxpy().
    static void applyAxpy(const Tracked &x, Range rx, Tracked &y, Range ry, uint32_t a) {
        for (uint64_t i = 0; i < rx.count; ++i) {
            const uint64_t xi = rx.first + i, yi = ry.first + i;
            y.words[yi] = a * x.words[xi] + y.words[yi];
            y.known[yi] = x.known[xi] && y.known[yi];
        }
    }

    // Records one to three launches, copies and fills on live buffers plus a temporary the
    // recording alone keeps (filled, then copied into a live buffer), then replays it one to
    // three times, on this stream or others, applying the recorded effects to the model at
    // each replay. The recording is dropped before this returns: it never outlives the
    // buffers' ownership by this thread.
    void recordAndReplay() {
        // The model's side of each recorded op: its effect, and the ranges it reads and writes.
        struct Effect {
            std::function<void()> apply;
            std::vector<std::pair<Tracked *, Range>> reads, writes;
        };
        std::vector<Effect> effects;
        const uint32_t tempPattern = rng_.word();
        note("begin recording");
        client_.beginRecording();
        const uint64_t ops = 1 + rng_.below(3);
        for (uint64_t k = 0; k < ops; ++k) {
            const uint64_t what = rng_.below(4);
            Tracked &y = *live_[pickLive()];
            if (what == 0) {
                const size_t ix = pickLive();
                Tracked &x = *live_[ix];
                const auto ranges = pickPair(x.words.size(), y.words.size(), &x == &y);
                if (!ranges) continue;
                const auto [rx, ry] = *ranges;
                uint32_t delayUs = 0; // as kernel() does: widens the hazard windows
                if (shared_.hostDelays && rx.count <= 1024 && rng_.percent(25))
                    delayUs = static_cast<uint32_t>(1 + rng_.below(300));
                note("  (recorded) ");
                const uint32_t a = issueAxpy(x, rx, y, ry, delayUs);
                effects.push_back({[&x, rx, &y, ry, a] { applyAxpy(x, rx, y, ry, a); },
                                   {{&x, Range{0, x.words.size()}}, {&y, Range{0, y.words.size()}}},
                                   {{&y, Range{0, y.words.size()}}}});
            } else if (what == 1) {
                Tracked &x = *live_[pickLive()];
                const auto ranges = pickPair(x.words.size(), y.words.size(), &x == &y);
                if (!ranges) continue;
                const auto [rs, rd] = *ranges;
                note("  (recorded) copy %s [%llu, +%llu) B -> %s at %llu", x.name.c_str(),
                     bytes(rs.first), bytes(rs.count), y.name.c_str(), bytes(rd.first));
                client_.copy(x.buffer, rs.first * 4, y.buffer, rd.first * 4, rs.count * 4);
                effects.push_back({[&x, rs, &y, rd] {
                                       std::copy_n(x.words.data() + rs.first, rs.count,
                                                   y.words.data() + rd.first);
                                       std::copy_n(x.known.data() + rs.first, rs.count,
                                                   y.known.data() + rd.first);
                                   },
                                   {{&x, rs}},
                                   {{&y, rd}}});
            } else if (what == 2) {
                const Range r = pickRange(y.words.size());
                const uint32_t pattern = rng_.word();
                note("  (recorded) fill %s [%llu, +%llu) B with %s", y.name.c_str(),
                     bytes(r.first), bytes(r.count), hex(pattern).c_str());
                client_.fill(y.buffer, pattern, r.first * 4, r.count * 4);
                effects.push_back({[&y, r, pattern] {
                                       std::fill_n(y.words.data() + r.first, r.count, pattern);
                                       std::fill_n(y.known.data() + r.first, r.count, 1);
                                   },
                                   {},
                                   {{&y, r}}});
            } else {
                // A temporary allocated while recording, dropped right after: only the
                // recording keeps its memory (tracel-ai/cubecl#1612).
                const Range r = pickRange(y.words.size());
                Buffer temporary = client_.empty(r.count * 4);
                note("  (recorded) temporary of %llu B filled with %s, copied to %s at %llu",
                     bytes(r.count), hex(tempPattern).c_str(), y.name.c_str(), bytes(r.first));
                client_.fill(temporary, tempPattern);
                client_.copy(temporary, 0, y.buffer, r.first * 4, r.count * 4);
                // (The temporary is written by the recording before it is read: never poisoned
                // when read.)
                effects.push_back({[&y, r, tempPattern] {
                                       std::fill_n(y.words.data() + r.first, r.count, tempPattern);
                                       std::fill_n(y.known.data() + r.first, r.count, 1);
                                   },
                                   {},
                                   {{&y, r}}});
            }
        }
        const Recording recording = client_.endRecording();
        note("end recording: %llu op(s), %s", ull(recording.operations()),
             recording.native() ? "native" : "calls");
        const uint64_t replays = 1 + rng_.below(3);
        for (uint64_t k = 0; k < replays; ++k) {
            if (gSettings.streams > 1 && rng_.percent(50))
                stream_ = rng_.below(gSettings.streams);
            StreamGuard guard(stream_);
            note("replay on stream %llu", ull(stream_));
            // The engine's rule: walking the ops in order, one that reads poisoned words (not
            // written by an earlier op of the replay) means the replay is not issued, and every
            // range it writes is poisoned; otherwise what each op writes is valid.
            bool refused = false;
            for (const Effect &e : effects) {
                for (const auto &[t, r] : e.reads) refused = refused || t->poisoned(r.first, r.count);
                if (refused) break;
                for (const auto &[t, r] : e.writes) t->setPoison(r.first, r.count, false);
            }
            const auto poisonWrites = [&] {
                for (const Effect &e : effects)
                    for (const auto &[t, r] : e.writes) t->setPoison(r.first, r.count, true);
            };
            if (refused) poisonWrites();
            const Result done = attempt([&] { client_.replay(recording); });
            expectPoison(done, refused, "replay");
            if (done == Result::Done)
                for (const Effect &effect : effects) effect.apply();
            else if (done == Result::Injected)
                poisonWrites();
            // Memory allocated now must never be memory the recording uses: a buffer with
            // known contents, so a replay writing into it shows at its next read.
            if (rng_.percent(40) && live_.size() < kMaxLiveBuffers) create();
        }
    }

    // Reused memory: work on this stream still reads (or writes) a buffer when it is dropped, a
    // buffer of the same size is allocated right after on the same stream (the pool hands out
    // the same memory), and its first use is on another stream. The pending work must still see
    // the old contents, and the new buffer must not receive the pending work's writes.
    void recycle() {
        const size_t ib = pickLive();
        const size_t iy = pickLive();
        Tracked &b = *live_[ib];
        Tracked &y = *live_[iy];
        if (auto ranges = pickPair(b.words.size(), y.words.size(), ib == iy)) {
            auto [rx, ry] = *ranges;
            uint32_t delayUs = 0;
            if (shared_.hostDelays) {
                rx.count = ry.count = std::min<uint64_t>(rx.count, 1024);
                delayUs = static_cast<uint32_t>(50 + rng_.below(450));
            }
            launchAxpy(b, rx, y, ry, delayUs);
        }
        if (deferred_.size() < kMaxDeferredReads && rng_.percent(50)) keepRead(ib);
        const uint64_t words = b.words.size();
        drop(ib);
        TrackedPtr t = track(words);
        t->buffer = client_.empty(words * 4);
        note("empty %s %llu B (recycled)", t->name.c_str(), bytes(words));
        if (gSettings.streams > 1)
            stream_ = (stream_ + 1 + rng_.below(gSettings.streams - 1)) % gSettings.streams;
        StreamGuard guard(stream_);
        Result done = Result::Done;
        if (rng_.percent(50)) {
            const uint32_t pattern = rng_.word();
            note("fill %s all with %s", t->name.c_str(), hex(pattern).c_str());
            done = attempt([&] { client_.fill(t->buffer, pattern); });
            std::fill(t->words.begin(), t->words.end(), pattern);
        } else {
            t->words = randomWords(words);
            note("write %s all", t->name.c_str());
            done = attempt([&] { client_.write(t->buffer, 0, t->words.data(), words * 4); });
        }
        expectPoison(done, false, "fill or write of recycled memory");
        std::fill(t->known.begin(), t->known.end(), 1);
        t->setPoison(0, words, done != Result::Done);
        live_.push_back(std::move(t));
    }

    void drop(size_t at) {
        note("drop %s", live_[at]->name.c_str());
        recentWords_.push_back(live_[at]->words.size());
        if (recentWords_.size() > 8) recentWords_.erase(recentWords_.begin());
        live_[at] = std::move(live_.back());
        live_.pop_back();
    }

    void handOff() {
        const uint32_t threads = gSettings.threads;
        uint32_t to = index_;
        if (threads > 1)
            to = static_cast<uint32_t>((index_ + 1 + rng_.below(threads - 1)) % threads);
        const size_t at = pickLive();
        note("hand %s to thread %u", live_[at]->name.c_str(), to);
        TrackedPtr t = std::move(live_[at]);
        live_[at] = std::move(live_.back());
        live_.pop_back();
        std::lock_guard lock(shared_.mailMutex);
        shared_.inboxes[to].push_back(std::move(t));
    }

    void receive() {
        std::vector<TrackedPtr> mail;
        {
            std::lock_guard lock(shared_.mailMutex);
            mail.swap(shared_.inboxes[index_]);
        }
        for (auto &t : mail) {
            note("receive %s", t->name.c_str());
            live_.push_back(std::move(t));
        }
    }

    // Waits for the kept reads, then reads back and checks every buffer this thread holds.
    void finish() {
        while (!deferred_.empty()) finishDeferred(true);
        receive();
        for (auto &t : live_) {
            stream_ = rng_.below(gSettings.streams);
            StreamGuard guard(stream_);
            note("final read %s", t->name.c_str());
            std::vector<uint32_t> got;
            const Result done = attempt([&] { got = client_.readAs<uint32_t>(t->buffer); });
            expectPoison(done, t->poisoned(), "final read of " + t->name);
            if (done == Result::Done)
                check(t->name, 0, got.data(), got.size(), t->words.data(), t->known.data(),
                      t->words.size(), "final read");
        }
        live_.clear();
    }

    // ----- checking and reporting --------------------------------------------------------------

    static std::vector<uint32_t> toWords(const std::vector<std::byte> &bytes) {
        std::vector<uint32_t> words(bytes.size() / 4);
        if (!words.empty()) std::memcpy(words.data(), bytes.data(), words.size() * 4);
        return words;
    }

    bool check(const std::string &name, uint64_t firstWord, const uint32_t *got, uint64_t gotCount,
               const uint32_t *expected, const uint8_t *known, uint64_t count, const char *how) {
        shared_.readsChecked.fetch_add(1);
        std::string what;
        if (gotCount != count) {
            what = "got " + std::to_string(gotCount * 4) + " bytes instead of " +
                   std::to_string(count * 4);
        } else {
            uint64_t wrong = 0, first = 0;
            for (uint64_t i = 0; i < count; ++i)
                if (known[i] && got[i] != expected[i] && wrong++ == 0) first = i;
            if (wrong == 0) return true;
            what = "byte offset " + std::to_string((firstWord + first) * 4) + " expected " +
                   hex(expected[first]) + " got " + hex(got[first]) + " (" +
                   std::to_string(wrong) + " of " + std::to_string(count) + " words wrong)";
        }
        shared_.report(shared_.mismatches,
                       "mismatch: seed=" + std::to_string(gSettings.seed) +
                           " thread=" + std::to_string(index_) + " op=#" + std::to_string(op_) +
                           " (" + how + "; current stream " + std::to_string(stream_) +
                           ") buffer " + name + ": " + what);
        return false;
    }

    static unsigned long long bytes(uint64_t words) { return words * 4; }
    static unsigned long long ull(uint64_t v) { return v; }

#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    void note(const char *format, ...) const {
        if (!gSettings.trace) return;
        std::array<char, 512> text{};
        va_list args;
        va_start(args, format);
        std::vsnprintf(text.data(), text.size(), format, args);
        va_end(args);
        std::printf("t%u #%llu s%llu %s\n", index_, ull(op_), ull(stream_), text.data());
    }

    Shared &shared_;
    ComputeClient &client_;
    uint32_t index_;
    Rng rng_;
    uint64_t op_ = 0;
    StreamId stream_ = 0;
    uint64_t serial_ = 0;
    std::vector<TrackedPtr> live_;
    std::vector<DeferredRead> deferred_;
    std::vector<uint64_t> recentWords_;
};

// Aborts the run with each thread's current operation when it outlives the time bound by far.
class HangWatch {
public:
    HangWatch(Shared &shared, std::chrono::steady_clock::time_point limit)
        : thread_([this, &shared, limit] {
              std::unique_lock lock(mutex_);
              if (cv_.wait_until(lock, limit, [this] { return finished_; })) return;
              std::printf("hang: seed=%llu: threads still running %d s after the time bound\n",
                          static_cast<unsigned long long>(gSettings.seed), kHangGraceSeconds);
              for (size_t t = 0; t < shared.progress.size(); ++t) {
                  const Progress &p = shared.progress[t];
                  if (!p.done.load())
                      std::printf("  thread %zu at op #%llu (%s, stream %llu)\n", t,
                                  static_cast<unsigned long long>(p.op.load()), p.name.load(),
                                  static_cast<unsigned long long>(p.stream.load()));
              }
              std::fflush(stdout);
              std::abort();
          }) {}
    ~HangWatch() {
        {
            std::lock_guard lock(mutex_);
            finished_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    HangWatch(const HangWatch &) = delete;
    HangWatch &operator=(const HangWatch &) = delete;

private:
    std::mutex mutex_;
    std::condition_variable cv_;
    bool finished_ = false;
    std::thread thread_;
};

} // namespace

TEST_CASE("random operations on shared streams leave every buffer as a sequential model says") {
    ComputeClient &client = *gClient;
    // The first launch compiles; that must not eat the time bound.
    client.prepare(axpyKernel());

    const Settings &s = gSettings;
    Shared shared(s.threads);
    shared.hostDelays = gDevice.accepts(Dialect::Host);
    const auto start = std::chrono::steady_clock::now();
    shared.deadline = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                  std::chrono::duration<double>(s.seconds));
    {
        HangWatch watch(shared, shared.deadline + std::chrono::seconds(kHangGraceSeconds));
        std::vector<std::thread> threads;
        for (uint32_t t = 0; t < s.threads; ++t)
            threads.emplace_back([&shared, t] { Worker(shared, t).run(); });
        for (auto &t : threads) t.join();
    }

    // Buffers handed to a thread after it finished: checked here, then released.
    uint32_t leftovers = 0;
    try {
        StreamGuard guard(0);
        for (auto &inbox : shared.inboxes)
            for (TrackedPtr &t : inbox) {
                if (t->poisoned()) { // every read of it must be refused
                    bool refused = false;
                    try {
                        (void)client.readAs<uint32_t>(t->buffer);
                    } catch (const Error &e) {
                        refused = e.code() == ErrorCode::Poisoned;
                    }
                    if (!refused)
                        shared.report(shared.mismatches,
                                      "mismatch: seed=" + std::to_string(s.seed) + " buffer " +
                                          t->name + " left in a mailbox has poisoned words but "
                                                    "reads back");
                    continue;
                }
                const std::vector<uint32_t> got = client.readAs<uint32_t>(t->buffer);
                shared.readsChecked.fetch_add(1);
                ++leftovers;
                bool right = got.size() == t->words.size();
                for (size_t i = 0; right && i < got.size(); ++i)
                    right = !t->known[i] || got[i] == t->words[i];
                if (!right)
                    shared.report(shared.mismatches, "mismatch: seed=" + std::to_string(s.seed) +
                                                         " buffer " + t->name +
                                                         " left in a mailbox reads back wrong");
            }
        for (auto &inbox : shared.inboxes) inbox.clear();
        client.syncAll();
    } catch (const std::exception &e) {
        shared.report(shared.errors, std::string("error in the final check: ") + e.what());
    }

    const double elapsed =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    for (const std::string &r : shared.reports) std::printf("%s\n", r.c_str());
    std::printf("model: plugin=%s seed=%llu threads=%u streams=%u ops=%llu reads_checked=%llu "
                "mismatches=%llu\n",
                s.plugin.c_str(), static_cast<unsigned long long>(s.seed), s.threads, s.streams,
                static_cast<unsigned long long>(shared.ops.load()),
                static_cast<unsigned long long>(shared.readsChecked.load()),
                static_cast<unsigned long long>(shared.mismatches.load()));
    std::printf("model: %.1f s, %u buffer(s) checked from mailboxes, errors=%llu\n", elapsed,
                leftovers, static_cast<unsigned long long>(shared.errors.load()));
    if (s.faults != 0)
        std::printf("model: %llu call(s) failed by injected faults, %llu refused for poisoned "
                    "words as the model expected\n",
                    static_cast<unsigned long long>(shared.injected.load()),
                    static_cast<unsigned long long>(shared.poisonedRefusals.load()));
    std::fflush(stdout);
    CHECK(shared.errors.load() == 0);
    CHECK(shared.mismatches.load() == 0);
}

namespace {

// Reads an unsigned knob; a malformed value is an error, not a silent default.
uint64_t unsignedKnob(const char *name, uint64_t fallback, uint64_t least) {
    const char *text = std::getenv(name);
    if (text == nullptr || *text == '\0') return fallback;
    char *end = nullptr;
    const unsigned long long value = std::strtoull(text, &end, 10);
    if (*end != '\0' || value < least)
        throw std::invalid_argument(std::string(name) + "=" + text + ": expected an integer >= " +
                                    std::to_string(least));
    return value;
}

double secondsKnob() {
    const char *text = std::getenv("BACKPLANE_MODEL_SECONDS");
    if (text == nullptr || *text == '\0') return 4;
    char *end = nullptr;
    const double value = std::strtod(text, &end);
    if (*end != '\0' || !(value > 0))
        throw std::invalid_argument(std::string("BACKPLANE_MODEL_SECONDS=") + text +
                                    ": expected a positive number of seconds");
    return value;
}

std::vector<bool> disabledKnob() {
    std::vector<bool> disabled(kOpCount, false);
    const char *text = std::getenv("BACKPLANE_MODEL_DISABLE");
    std::string list = text != nullptr ? text : "";
    while (!list.empty()) {
        const size_t comma = list.find(',');
        const std::string name = list.substr(0, comma);
        list = comma == std::string::npos ? "" : list.substr(comma + 1);
        if (name.empty()) continue;
        bool found = false;
        for (size_t i = 0; i < kOpCount; ++i)
            if (name == toString(static_cast<Op>(i))) found = disabled[i] = true;
        if (!found)
            throw std::invalid_argument("BACKPLANE_MODEL_DISABLE: no operation named '" + name +
                                        "'");
    }
    return disabled;
}

uint64_t randomSeed() {
    std::random_device device;
    const uint64_t clock =
        static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return ((static_cast<uint64_t>(device()) << 32) ^ device() ^ clock) % 1000000000000ull;
}

} // namespace

int main(int argc, char **argv) {
    const char *name = std::getenv("BACKPLANE_MODEL_PLUGIN");
    const char *library = std::getenv("BACKPLANE_MODEL_LIBRARY");
    if (name == nullptr || library == nullptr) {
        std::puts("error: set BACKPLANE_MODEL_PLUGIN (plugin name) and BACKPLANE_MODEL_LIBRARY "
                  "(its module); BACKPLANE_MODEL_OPTIONS optionally holds its options JSON");
        return 1;
    }
    const char *options = std::getenv("BACKPLANE_MODEL_OPTIONS");
    try {
        gSettings.plugin = name;
        gSettings.seed = unsignedKnob("BACKPLANE_MODEL_SEED", randomSeed(), 0);
        gSettings.seconds = secondsKnob();
        gSettings.threads = static_cast<uint32_t>(unsignedKnob("BACKPLANE_MODEL_THREADS", 4, 1));
        gSettings.streams = static_cast<uint32_t>(unsignedKnob("BACKPLANE_MODEL_STREAMS", 6, 1));
        gSettings.opsPerThread = unsignedKnob("BACKPLANE_MODEL_OPS", 0, 0);
        gSettings.trace = unsignedKnob("BACKPLANE_MODEL_TRACE", 0, 0) != 0;
        gSettings.disabled = disabledKnob();
        gSettings.faults = unsignedKnob("BACKPLANE_MODEL_FAULTS", 0, 0);
    } catch (const std::exception &e) {
        std::printf("error: %s\n", e.what());
        return 1;
    }
    std::string optionsJson = options ? options : "{}";
    if (gSettings.faults != 0) {
        // Refused faults of each kind at random operation counts (the plugin counts per device,
        // over every thread), appended to the options object.
        Rng rng(gSettings.seed ^ 0x5eedfa17ull);
        std::string faults;
        for (const char *operation : {"launch", "copy", "fill", "replay"})
            for (uint64_t i = 0; i < gSettings.faults; ++i)
                faults += std::string(faults.empty() ? "" : ",") + R"({"operation": ")" +
                          operation + R"(", "nth": )" + std::to_string(1 + rng.below(3000)) +
                          R"(, "class": "refused"})";
        const size_t close = optionsJson.rfind('}');
        const bool empty = optionsJson.find_first_not_of(" \t\n{") == close;
        optionsJson.insert(close, std::string(empty ? "" : ",") + R"("inject_faults": [)" +
                                      faults + "]");
        std::printf("model: %llu refused fault(s) of each kind injected\n",
                    static_cast<unsigned long long>(gSettings.faults));
    }
    try {
        gPlugin = detail::PluginLibrary::open(
            library, name, {.cacheDir = "", .optionsJson = optionsJson});
        const bp_probe_result probe = gPlugin->probe();
        if (probe.device_count == 0) {
            std::printf("SKIP: plugin %s reports no device\n", name);
            return 77;
        }
        gDevice = detail::toDeviceInfo(name, 0, gPlugin->deviceInfo(0));
        Config config;
        config.cacheEnabled = false;
        config.stagingChunkBytes = kStagingChunkBytes;
        gClient.emplace(detail::openComputeClient(gPlugin, gDevice, config));
    } catch (const Error &e) {
        if (e.code() == ErrorCode::NoDriver || e.code() == ErrorCode::NoDevice) {
            std::printf("SKIP: plugin %s has no usable device here: %s\n", name, e.what());
            return 77;
        }
        std::printf("error: opening plugin %s failed (%s): %s\n", name, toString(e.code()),
                    e.what());
        return 1;
    } catch (const std::exception &e) {
        std::printf("error: opening plugin %s failed: %s\n", name, e.what());
        return 1;
    }
    std::printf("model: %s on %s (%s), options %s, seed=%llu (BACKPLANE_MODEL_SEED repeats it), "
                "%u thread(s) x %u stream(s) on %u backend stream(s), %.1f s\n",
                name, gDevice.id().c_str(), gDevice.name.c_str(), options ? options : "{}",
                static_cast<unsigned long long>(gSettings.seed), gSettings.threads,
                gSettings.streams, std::min(gSettings.streams, std::max(gDevice.maxStreams, 1u)),
                gSettings.seconds);
    std::fflush(stdout);
    doctest::Context context(argc, argv);
    const int rc = context.run();
    gClient.reset();
    gPlugin.reset();
    return rc;
}
