// The trace recorder: the one switch every operation checks, and the events of the running trace.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>

namespace backplane::detail {

using TraceClock = std::chrono::steady_clock;

/// True while a trace records. The only cost of tracing when it is off: one relaxed load.
inline std::atomic<bool> traceOn{false};
inline bool tracing() noexcept { return traceOn.load(std::memory_order_relaxed); }
/// True while a trace records device times too (TraceOptions::deviceTimes,
/// BACKPLANE_TRACE_DEVICE=1): servers put timing events around their operations.
inline std::atomic<bool> traceDeviceOn{false};
inline bool tracingDevice() noexcept { return traceDeviceOn.load(std::memory_order_relaxed); }

/// Lanes (Chrome "tid") besides the stream slots, whose lane is the slot index.
inline constexpr uint32_t kTraceMemoryLane = 1u << 20; ///< pool pages taken from / given back
inline constexpr uint32_t kTraceGcLane = kTraceMemoryLane + 1; ///< cross-stream holds released
inline constexpr uint32_t kTraceHostLane = kTraceMemoryLane + 2; ///< waits for every stream
/// Device execution of stream slot N (device times): lane kTraceDeviceLane + N.
inline constexpr uint32_t kTraceDeviceLane = 1u << 21;

/// One numeric argument of an event ("bytes": 4096). `key` is a string literal.
struct TraceArg {
    const char *key;
    uint64_t value;
};

/// Records one complete event from `start` to now on lane `tid` of device `pid` (a
/// ComputeServer's open number). `category` is a string literal; at most 4 args are kept.
/// Thread-safe; takes only the recorder's own small lock (never waits for anything else), so it
/// may be called under an engine lock. Does nothing when no trace records, or when `start` is
/// before the trace began.
void traceComplete(uint32_t pid, uint32_t tid, const char *category, std::string name,
                   TraceClock::time_point start, std::initializer_list<TraceArg> args = {});
/// The same with an explicit end.
void traceComplete(uint32_t pid, uint32_t tid, const char *category, std::string name,
                   TraceClock::time_point start, TraceClock::time_point end,
                   std::initializer_list<TraceArg> args);

/// Registers `flush`, run (with no lock held) when a trace stops, before its events are taken:
/// a server draws its finished device spans (device times). It returns false once its owner is
/// gone; it is then dropped.
void traceAddFlusher(std::function<bool()> flush);

/// Names device `pid` in traces ("host:0 (open #1)"); kept while the process runs, so a trace
/// started after the device was opened still names it.
void traceNameDevice(uint32_t pid, std::string name);

/// The start of a traced span: the time now when a trace records, else nothing (one load).
struct TraceSpan {
    TraceClock::time_point start{};
    bool on = tracing();
    TraceSpan() {
        if (on) start = TraceClock::now();
    }
    explicit operator bool() const noexcept { return on; }
};

/// Starts the trace of BACKPLANE_TRACE when it is set and no trace records (Runtime's
/// constructor). Returns true when it started one: the caller then calls
/// stopEnvironmentTrace() when it goes away. Never throws: a bad value is logged.
bool startEnvironmentTrace() noexcept;
/// Writes BACKPLANE_TRACE's trace if it still records; a failure is logged as a warning.
void stopEnvironmentTrace() noexcept;

} // namespace backplane::detail
