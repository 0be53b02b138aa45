// Trace: a timeline of every device's work in Chrome / Perfetto JSON, and its SVG rendering.
#pragma once

#include <cstdint>
#include <cstddef>
#include <filesystem>
#include <string>

namespace backplane {

/// How a Trace records.
struct TraceOptions {
    /// Also draw when each operation ran on the device (docs/trace.md, "Device times"): on
    /// devices with timestamps (DeviceInfo::capabilities & BP_CAPABILITY_TIMESTAMPS, async
    /// streams) every launch, copy, fill, transfer and collective gets a timing event before and
    /// after it, and its device execution is drawn on the lane "device: stream slot N". This
    /// changes what it measures (two events and a submission per operation): leave it off to see
    /// the runtime's own costs. BACKPLANE_TRACE_DEVICE=1 turns it on for BACKPLANE_TRACE.
    bool deviceTimes = false;
};

/// Records a timeline of the work of every opened device of this process — launches,
/// transfers and their staging chunks, device copies, fills, collectives, cross-stream waits,
/// syncs, allocations, pool pages and GC releases — and writes it as a Chrome / Perfetto trace
/// (docs/trace.md): open the file in https://ui.perfetto.dev or chrome://tracing, or draw it with
/// `backplane trace render FILE OUT.svg` (renderTraceSvg).
///
/// One trace records at a time per process. Times are host times (the submission of an
/// operation and its return; the real length of host waits), in microseconds from the start;
/// with TraceOptions::deviceTimes, device execution is drawn on lanes of its own.
/// Events are kept in memory (at most 4 million; later ones are counted and dropped) and the file
/// is written by stop() or the destructor, never under an engine lock. While no trace records,
/// each operation pays one relaxed atomic load. The environment variable BACKPLANE_TRACE=FILE
/// starts one when a Runtime is created (docs/config.md).
///
/// Thread-safety: any thread may record; start and stop a Trace from one thread.
class Trace {
public:
    /// Starts recording into `file` (created now, written at stop()). Throws
    /// Error(InvalidArgument) when a trace already records (naming its file), or when `file` is
    /// empty or cannot be created (naming it and the reason).
    explicit Trace(std::filesystem::path file, TraceOptions options = {});
    /// stop(), logging a failure to write the file as a warning instead of throwing.
    ~Trace();
    Trace(const Trace &) = delete;
    Trace &operator=(const Trace &) = delete;

    /// Stops recording and writes the file; returns the number of events written. Idempotent
    /// (0 after the first call). Throws Error(InvalidArgument) naming the file and the reason
    /// when it cannot be written (the events are dropped; recording has stopped all the same).
    size_t stop();

    /// The file this trace writes.
    const std::filesystem::path &file() const noexcept { return file_; }
    /// True while any trace of this process records (this one, another, or BACKPLANE_TRACE's).
    static bool recording() noexcept;

private:
    std::filesystem::path file_;
    uint64_t session_ = 0; ///< the recorder's number of this trace; 0 once stopped
};

/// Draws a trace file (as Trace writes it, or any Chrome trace with "X" events) as an SVG: one
/// lane per (process, thread) — for backplane traces (device, stream slot) — with a box per
/// event, its name, and a time axis. The file goes through the bounded JSON reader (at most
/// 64 MiB, 16 levels). Throws Error(InvalidArgument) naming the file and the JSON path of the
/// first bad value (not an object with a "traceEvents" array, an event without a numeric "ts",
/// ...), or when it cannot be read.
std::string renderTraceSvg(const std::filesystem::path &traceFile);

} // namespace backplane
