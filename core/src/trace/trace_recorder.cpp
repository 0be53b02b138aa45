// The trace recorder and backplane::Trace: events kept in memory, written as Chrome trace JSON.
#include "trace/trace_recorder.hpp"

#include <backplane/error.hpp>
#include <backplane/log.hpp>
#include <backplane/trace.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane::detail {
namespace {

/// Events beyond this are counted and dropped: a forgotten trace must not eat the memory.
constexpr size_t kMaxTraceEvents = 4u << 20;

struct TraceEvent {
    uint32_t pid = 0;
    uint32_t tid = 0;
    const char *category = "";
    std::string name;
    TraceClock::time_point start;
    TraceClock::time_point end;
    std::array<TraceArg, 4> args{};
    uint8_t argCount = 0;
};

/// The running trace. One per process, never destroyed: engines may record from their own
/// threads and static destructors (a Runtime held in a static) until the process ends.
struct Recorder {
    std::mutex mutex; ///< guards everything below; held only to append or to swap out
    bool active = false;
    uint64_t session = 0; ///< numbers every start, so a Trace stops only its own
    std::filesystem::path file;
    TraceClock::time_point start;
    std::vector<TraceEvent> events;
    uint64_t dropped = 0;
    std::map<uint32_t, std::string> deviceNames;
};

Recorder &recorder() {
    static Recorder *r = new Recorder; // leaked on purpose (see Recorder)
    return *r;
}

/// What a stopped trace hands to the writer, outside the recorder's lock.
struct Taken {
    std::filesystem::path file;
    TraceClock::time_point start;
    std::vector<TraceEvent> events;
    uint64_t dropped = 0;
    std::map<uint32_t, std::string> deviceNames;
};

uint64_t startSession(const std::filesystem::path &file, bool deviceTimes) {
    if (file.empty())
        throw Error(ErrorCode::InvalidArgument,
                    "Trace: the file name is empty; name the JSON file to write the trace to");
    Recorder &r = recorder();
    std::lock_guard lock(r.mutex);
    if (r.active)
        throw Error(ErrorCode::InvalidArgument,
                    "Trace: a trace already records into " + r.file.string() +
                        " (another backplane::Trace, or BACKPLANE_TRACE); stop it first: one "
                        "trace records at a time");
    // A file that cannot be written is said now, not after the run it was to record.
    if (std::FILE *probe = std::fopen(file.c_str(), "wb"))
        std::fclose(probe);
    else
        throw Error(ErrorCode::InvalidArgument,
                    "Trace: cannot write " + file.string() + ": " + std::strerror(errno) +
                        "; name a file in a directory that exists and is writable");
    r.active = true;
    r.file = file;
    r.start = TraceClock::now();
    r.events.clear();
    r.dropped = 0;
    traceDeviceOn.store(deviceTimes, std::memory_order_relaxed);
    traceOn.store(true, std::memory_order_relaxed);
    return ++r.session;
}

/// Stops session `session` (0: whichever records) and takes its events; false when that session
/// is not the one recording.
bool stopSession(uint64_t session, Taken &out) {
    Recorder &r = recorder();
    std::lock_guard lock(r.mutex);
    if (!r.active || (session != 0 && r.session != session)) return false;
    r.active = false;
    traceOn.store(false, std::memory_order_relaxed);
    traceDeviceOn.store(false, std::memory_order_relaxed);
    out.file = r.file;
    out.start = r.start;
    out.events.swap(r.events);
    out.dropped = r.dropped;
    out.deviceNames = r.deviceNames;
    return true;
}

std::string jsonString(const std::string &text) {
    // Kernel and device names come from users and plugins: invalid UTF-8 becomes U+FFFD.
    return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string laneName(uint32_t tid) {
    switch (tid) {
    case kTraceMemoryLane: return "memory (pool pages)";
    case kTraceGcLane: return "GC (cross-stream holds released)";
    case kTraceHostLane: return "host (waits for every stream)";
    default:
        if (tid >= kTraceDeviceLane)
            return "device: stream slot " + std::to_string(tid - kTraceDeviceLane);
        return "stream slot " + std::to_string(tid);
    }
}

/// Writes `t` as Chrome trace JSON; Error(InvalidArgument) naming the file when it cannot.
size_t writeTrace(Taken &t) {
    std::stable_sort(t.events.begin(), t.events.end(),
                     [](const TraceEvent &a, const TraceEvent &b) { return a.start < b.start; });
    std::FILE *out = std::fopen(t.file.c_str(), "wb");
    if (out == nullptr)
        throw Error(ErrorCode::InvalidArgument,
                    "Trace: cannot write " + t.file.string() + ": " + std::strerror(errno) +
                        "; the trace of " + std::to_string(t.events.size()) +
                        " events is lost. Name a file in a directory that exists and is writable");
    const auto us = [&](TraceClock::duration d) {
        return std::chrono::duration<double, std::micro>(d).count();
    };
    std::fputs("{\"traceEvents\":[\n", out);
    bool first = true;
    const auto line = [&](const std::string &text) {
        std::fputs(first ? "" : ",\n", out);
        std::fputs(text.c_str(), out);
        first = false;
    };
    std::set<std::pair<uint32_t, uint32_t>> lanes;
    for (const TraceEvent &e : t.events) lanes.emplace(e.pid, e.tid);
    std::set<uint32_t> pids;
    for (const auto &[pid, tid] : lanes) pids.insert(pid);
    for (uint32_t pid : pids) {
        const auto named = t.deviceNames.find(pid);
        const std::string name =
            named != t.deviceNames.end() ? named->second : "device " + std::to_string(pid);
        line("{\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
             ",\"name\":\"process_name\",\"args\":{\"name\":" + jsonString(name) + "}}");
        line("{\"ph\":\"M\",\"pid\":" + std::to_string(pid) +
             ",\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" + std::to_string(pid) +
             "}}");
    }
    for (const auto &[pid, tid] : lanes) {
        const std::string where =
            "{\"ph\":\"M\",\"pid\":" + std::to_string(pid) + ",\"tid\":" + std::to_string(tid);
        line(where + ",\"name\":\"thread_name\",\"args\":{\"name\":" + jsonString(laneName(tid)) +
             "}}");
        line(where + ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" +
             std::to_string(tid) + "}}");
    }
    char number[64];
    for (const TraceEvent &e : t.events) {
        std::string text = "{\"ph\":\"X\",\"pid\":" + std::to_string(e.pid) +
                           ",\"tid\":" + std::to_string(e.tid) + ",\"cat\":\"" + e.category +
                           "\",\"name\":" + jsonString(e.name);
        std::snprintf(number, sizeof(number), ",\"ts\":%.3f,\"dur\":%.3f",
                      us(e.start - t.start), us(std::max(e.end - e.start, TraceClock::duration{})));
        text += number;
        if (e.argCount != 0) {
            text += ",\"args\":{";
            for (uint8_t i = 0; i < e.argCount; ++i)
                text += (i ? ",\"" : "\"") + std::string(e.args[i].key) +
                        "\":" + std::to_string(e.args[i].value);
            text += "}";
        }
        line(text + "}");
    }
    std::fprintf(out,
                 "\n],\"displayTimeUnit\":\"ns\",\"otherData\":{\"writer\":\"backplane %s\","
                 "\"clock\":\"host steady clock, microseconds from the start of the trace\","
                 "\"dropped_events\":%llu}}\n",
                 BACKPLANE_VERSION, static_cast<unsigned long long>(t.dropped));
    const bool failed = std::ferror(out) != 0;
    const int savedErrno = errno;
    if (std::fclose(out) != 0 || failed)
        throw Error(ErrorCode::InvalidArgument,
                    "Trace: writing " + t.file.string() + " failed: " +
                        std::strerror(failed ? savedErrno : errno) +
                        " (disk full?); the file is incomplete");
    if (t.dropped != 0)
        log::write(log::Subsystem::Streams, log::Level::Warn,
                   "trace " + t.file.string() + ": " + std::to_string(t.dropped) +
                       " events past the first " + std::to_string(kMaxTraceEvents) +
                       " were dropped");
    return t.events.size();
}

std::atomic<bool> environmentStarted{false};
std::atomic<uint64_t> environmentSession{0};

} // namespace

void traceComplete(uint32_t pid, uint32_t tid, const char *category, std::string name,
                   TraceClock::time_point start, std::initializer_list<TraceArg> args) {
    if (!tracing()) return;
    traceComplete(pid, tid, category, std::move(name), start, TraceClock::now(), args);
}

void traceComplete(uint32_t pid, uint32_t tid, const char *category, std::string name,
                   TraceClock::time_point start, TraceClock::time_point end,
                   std::initializer_list<TraceArg> args) {
    if (!tracing()) return;
    TraceEvent e;
    e.pid = pid;
    e.tid = tid;
    e.category = category;
    e.name = std::move(name);
    e.start = start;
    e.end = end;
    for (const TraceArg &a : args) {
        if (e.argCount == e.args.size()) break;
        e.args[e.argCount++] = a;
    }
    Recorder &r = recorder();
    std::lock_guard lock(r.mutex);
    // A span begun before this trace started (or in an earlier one) is not part of it.
    if (!r.active || start < r.start) return;
    if (r.events.size() >= kMaxTraceEvents) {
        ++r.dropped;
        return;
    }
    r.events.push_back(std::move(e));
}

namespace {

std::mutex flusherMutex;
std::vector<std::shared_ptr<const std::function<bool()>>> flushers; ///< guarded by flusherMutex

/// Runs every flusher with no lock held, dropping those whose owner is gone.
void runFlushers() {
    std::vector<std::shared_ptr<const std::function<bool()>>> all;
    {
        std::lock_guard lock(flusherMutex);
        all = flushers;
    }
    for (const auto &flush : all) {
        if ((*flush)()) continue;
        std::lock_guard lock(flusherMutex);
        std::erase(flushers, flush);
    }
}

} // namespace

void traceAddFlusher(std::function<bool()> flush) {
    std::lock_guard lock(flusherMutex);
    flushers.push_back(std::make_shared<const std::function<bool()>>(std::move(flush)));
}

void traceNameDevice(uint32_t pid, std::string name) {
    Recorder &r = recorder();
    std::lock_guard lock(r.mutex);
    r.deviceNames[pid] = std::move(name);
}

bool startEnvironmentTrace() noexcept {
    const char *file = std::getenv("BACKPLANE_TRACE");
    if (file == nullptr || *file == '\0') return false;
    // Read once: a later Runtime does not start it again (it would overwrite the file).
    if (environmentStarted.exchange(true)) return false;
    try {
        const char *device = std::getenv("BACKPLANE_TRACE_DEVICE");
        const bool deviceTimes = device != nullptr && std::string_view(device) == "1";
        environmentSession.store(startSession(file, deviceTimes));
        std::atexit([] { stopEnvironmentTrace(); }); // a Runtime that is never destroyed
        log::write(log::Subsystem::Streams, log::Level::Info,
                   std::string("BACKPLANE_TRACE: recording a trace into ") + file);
        return true;
    } catch (const std::exception &e) {
        log::write(log::Subsystem::Streams, log::Level::Warn,
                   std::string("BACKPLANE_TRACE=") + file + ": not started: " + e.what());
    }
    return false;
}

void stopEnvironmentTrace() noexcept {
    const uint64_t session = environmentSession.exchange(0);
    if (session == 0) return;
    try {
        runFlushers();
        Taken taken;
        if (!stopSession(session, taken)) return;
        const size_t n = writeTrace(taken);
        log::write(log::Subsystem::Streams, log::Level::Info,
                   "BACKPLANE_TRACE: wrote " + std::to_string(n) + " events to " +
                       taken.file.string());
    } catch (const std::exception &e) {
        log::write(log::Subsystem::Streams, log::Level::Warn,
                   std::string("BACKPLANE_TRACE: ") + e.what());
    }
}

} // namespace backplane::detail

namespace backplane {

Trace::Trace(std::filesystem::path file, TraceOptions options)
    : file_(std::move(file)), session_(detail::startSession(file_, options.deviceTimes)) {}

Trace::~Trace() {
    try {
        stop();
    } catch (const std::exception &e) {
        log::write(log::Subsystem::Streams, log::Level::Warn, e.what());
    }
}

size_t Trace::stop() {
    const uint64_t session = std::exchange(session_, 0);
    if (session == 0) return 0;
    detail::runFlushers();
    detail::Taken taken;
    if (!detail::stopSession(session, taken)) return 0;
    return detail::writeTrace(taken);
}

bool Trace::recording() noexcept { return detail::tracing(); }

} // namespace backplane
