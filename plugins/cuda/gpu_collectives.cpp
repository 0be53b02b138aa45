// Collectives of the GPU plugin: NCCL / RCCL loaded with dlopen, communicators, their watchdog.
#include "gpu_collectives.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <type_traits>
#include <utility>

// How a communicator behaves (docs/cuda.md, "Collectives"):
// - It is created nonblocking (ncclConfig_t.blocking = 0, NCCL >= 2.14): every NCCL call returns
//   at once, ncclInProgress when the work goes on in NCCL's background thread, and the plugin
//   polls ncclCommGetAsyncError with the communicator's mutex released in between. So no plugin
//   call waits inside NCCL for a peer: joining and enqueueing have a deadline, and comm_abort
//   (ncclCommAbort, which also frees the communicator) can always take the mutex. The price is
//   NCCL's thread per ncclGroupEnd, some 10-50 us per collective on the host. NCCL_COMM_BLOCKING=1
//   in the environment makes NCCL ignore the config: calls then block, which is faster for small
//   collectives but leaves comm_create without a timeout and comm_abort waiting for a blocked call.
// - NCCL has no timeout of its own for a collective whose peer died: its kernel spins on the GPU
//   forever (within a node), and only network transports report ncclRemoteError. The watchdog
//   thread of each communicator aborts it when ncclCommGetAsyncError reports an error or when the
//   oldest pending collective has run longer than the timeout; the kernel then returns, the
//   stream moves on, and waits on the events after it fail with BP_ERROR_REMOTE (CollectiveMarks).

namespace backplane::gpu {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// The timeout when bp_comm_create_args::timeout_ms is 0 (PyTorch's default for NCCL too), and
/// the largest one taken (longer ones would overflow the clock arithmetic).
constexpr milliseconds kDefaultTimeout = std::chrono::minutes(10);
constexpr milliseconds kMaxTimeout = std::chrono::hours(24 * 365);
/// How often the watchdog looks at a communicator.
constexpr milliseconds kWatchdogTick{50};

[[noreturn]] void invalid(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, message);
}

std::string resultName(nccl::Result r) {
    switch (r) {
    case nccl::Success:
        return "ncclSuccess";
    case nccl::UnhandledCudaError:
        return "ncclUnhandledCudaError";
    case nccl::SystemError:
        return "ncclSystemError";
    case nccl::InternalError:
        return "ncclInternalError";
    case nccl::InvalidArgument:
        return "ncclInvalidArgument";
    case nccl::InvalidUsage:
        return "ncclInvalidUsage";
    case nccl::RemoteError:
        return "ncclRemoteError";
    case nccl::InProgress:
        return "ncclInProgress";
    }
    return "ncclResult_t " + std::to_string(static_cast<int>(r));
}

/// Polls with a pause that grows: short waits stay responsive, long ones leave the core alone.
class Backoff {
public:
    explicit Backoff(std::chrono::microseconds longest) : longest_(longest) {}
    void pause() {
        if (spins_ < 64) {
            ++spins_;
            std::this_thread::yield();
            return;
        }
        std::this_thread::sleep_for(sleep_);
        sleep_ = std::min(sleep_ * 2, longest_);
    }

private:
    int spins_ = 0;
    std::chrono::microseconds sleep_{20};
    std::chrono::microseconds longest_;
};

std::string rankText(const CommState &s) {
    return "rank " + std::to_string(s.rank) + " of " + std::to_string(s.size);
}

// --- communicator state (callers hold s.mutex) ------------------------------------------------

/// Drops the pending collectives whose done event completed, and notes when the oldest one
/// started on the device.
void retireLocked(CommState &s) {
    s.device.enterForRelease();
    const auto &d = s.device.driver();
    while (!s.pending.empty()) {
        PendingCollective &head = s.pending.front();
        if (bpv::eventQuery(d, head.done).result == bpv::kNotReady) {
            if (!head.started && bpv::eventQuery(d, head.start).ok()) {
                head.started = true;
                head.startedAt = Clock::now();
            }
            return;
        }
        // Completed, or the query failed: a failed query is a sticky device error, which the
        // device reports on its own calls; the collective has nothing more to say.
        s.device.recycleEvent(head.start, false);
        s.device.recycleEvent(head.done, false);
        s.pending.pop_front();
    }
}

/// Marks the communicator failed (later collectives fail at the call; events after pending ones
/// fail when waited for) and aborts it, which ends its kernels and frees it.
void failLocked(CommState &s, bp_status status, std::string reason) {
    if (s.failed.load(std::memory_order_relaxed)) return;
    retireLocked(s);
    s.firstIncomplete = s.pending.empty() ? s.issued + 1 : s.pending.front().sequence;
    for (const PendingCollective &p : s.pending) {
        s.device.recycleEvent(p.start, false);
        s.device.recycleEvent(p.done, false);
    }
    s.pending.clear();
    s.failStatus = status;
    s.failReason = std::move(reason);
    // Before the abort: a waiter whose event completes because the abort ended the kernel must
    // already see the failure.
    s.failed.store(true, std::memory_order_release);
    if (s.handle != nullptr) {
        s.library.fn.commAbort(s.handle);
        s.handle = nullptr;
    }
}

void throwIfFailed(const CommState &s, const std::string &what) {
    if (s.failed.load(std::memory_order_acquire))
        throw sdk::Error(s.failStatus, what + ": the communicator (" + rankText(s) +
                                           ") failed earlier: " + s.failReason);
}

/// Fails the communicator after a failed NCCL call when the error leaves it in doubt: every
/// error polled from ncclCommGetAsyncError (it sticks to the communicator), and peer or internal
/// errors returned by a call. An argument error returned by a call leaves it usable.
void failAfterLocked(CommState &s, const sdk::Error &error, bool polled) {
    if (polled || error.code() != BP_ERROR_INVALID_ARGUMENT)
        failLocked(s, error.code() == BP_ERROR_INVALID_ARGUMENT ? BP_ERROR_REMOTE : error.code(),
                   std::string(error.what()) + "; the communicator was aborted");
}

/// Waits (mutex released between polls) until NCCL's background work on the communicator ended;
/// returns its result. Throws the failure when the communicator failed meanwhile, and fails it
/// with BP_ERROR_REMOTE when the timeout ran out (a peer that never answers).
nccl::Result waitProgress(CommState &s, const std::string &what) {
    const auto deadline = Clock::now() + s.timeout;
    Backoff backoff(std::chrono::microseconds(1000));
    for (;;) {
        {
            std::lock_guard lock(s.mutex);
            throwIfFailed(s, what);
            nccl::Result async = nccl::InProgress;
            const nccl::Result r = s.library.fn.commGetAsyncError(s.handle, &async);
            if (r != nccl::Success) return r;
            if (async != nccl::InProgress) return async;
            if (Clock::now() >= deadline) {
                failLocked(s, BP_ERROR_REMOTE,
                           what + " was still being set up after " +
                               std::to_string(s.timeout.count()) +
                               " ms (NCCL connects to the peers on the first collective): a "
                               "peer does not answer; the communicator was aborted");
                throwIfFailed(s, what);
            }
        }
        backoff.pause();
    }
}

/// After a collective was enqueued: the done event, the pending entry, the stream's mark.
void finishLocked(const std::shared_ptr<CommState> &shared, GpuStream &stream, bpv::Event start) {
    CommState &s = *shared;
    const uint64_t sequence = ++s.issued;
    stream.marks().add(shared, sequence);
    if (s.failed.load(std::memory_order_relaxed)) {
        s.device.recycleEvent(start, false);
        return; // the mark makes the stream's next event fail
    }
    bpv::Event done{};
    try {
        done = s.device.acquireEvent(false);
        s.device.check(bpv::eventRecord(s.device.driver(), done, stream.get()));
    } catch (...) {
        s.device.recycleEvent(start, false);
        if (done != bpv::Event{}) s.device.recycleEvent(done, false);
        throw;
    }
    s.pending.push_back({sequence, start, done, false, {}});
}

// --- one collective call ------------------------------------------------------------------------

nccl::DataType toNcclType(uint32_t type) {
    switch (type) {
    case BP_DATA_I8:
        return nccl::Int8;
    case BP_DATA_U8:
        return nccl::Uint8;
    case BP_DATA_I32:
        return nccl::Int32;
    case BP_DATA_U32:
        return nccl::Uint32;
    case BP_DATA_I64:
        return nccl::Int64;
    case BP_DATA_U64:
        return nccl::Uint64;
    case BP_DATA_F16:
        return nccl::Float16;
    case BP_DATA_BF16:
        return nccl::Bfloat16;
    case BP_DATA_F32:
        return nccl::Float32;
    case BP_DATA_F64:
        return nccl::Float64;
    }
    invalid("collective: type " + std::to_string(type) + " is not a bp_data_type");
}

nccl::RedOp toNcclOp(uint32_t op) {
    switch (op) {
    case BP_REDUCE_SUM:
        return nccl::Sum;
    case BP_REDUCE_PROD:
        return nccl::Prod;
    case BP_REDUCE_MIN:
        return nccl::Min;
    case BP_REDUCE_MAX:
        return nccl::Max;
    case BP_REDUCE_AVG:
        return nccl::Avg;
    }
    invalid("collective: reduce " + std::to_string(op) + " is not a bp_reduce_op");
}

const char *collectiveName(uint32_t op) {
    switch (op) {
    case BP_COLLECTIVE_ALL_REDUCE:
        return "all_reduce";
    case BP_COLLECTIVE_REDUCE:
        return "reduce";
    case BP_COLLECTIVE_BROADCAST:
        return "broadcast";
    case BP_COLLECTIVE_ALL_GATHER:
        return "all_gather";
    case BP_COLLECTIVE_REDUCE_SCATTER:
        return "reduce_scatter";
    case BP_COLLECTIVE_SEND:
        return "send";
    case BP_COLLECTIVE_RECV:
        return "recv";
    }
    return "unknown collective";
}

uint64_t multiply(uint64_t a, uint64_t b, const std::string &what) {
    if (b != 0 && a > std::numeric_limits<uint64_t>::max() / b)
        invalid("collective: " + what + " overflows 64 bits");
    return a * b;
}

void *pointer(bpv::DevicePtr p) {
    return reinterpret_cast<void *>(static_cast<uintptr_t>(bpv::ptrValue(p)));
}

/// One NCCL call, checked and resolved to device pointers.
struct NcclCall {
    uint32_t op = 0;
    const void *send = nullptr;
    void *recv = nullptr;
    size_t count = 0;
    nccl::DataType type = nccl::Int8;
    nccl::RedOp reduce = nccl::Sum;
    int peer = 0;

    nccl::Result invoke(const nccl::Functions &fn, nccl::Comm comm, bpv::Stream stream) const {
        switch (op) {
        case BP_COLLECTIVE_ALL_REDUCE:
            return fn.allReduce(send, recv, count, type, reduce, comm, stream);
        case BP_COLLECTIVE_REDUCE:
            return fn.reduce(send, recv, count, type, reduce, peer, comm, stream);
        case BP_COLLECTIVE_BROADCAST:
            return fn.broadcast(send, recv, count, type, peer, comm, stream);
        case BP_COLLECTIVE_ALL_GATHER:
            return fn.allGather(send, recv, count, type, comm, stream);
        case BP_COLLECTIVE_REDUCE_SCATTER:
            return fn.reduceScatter(send, recv, count, type, reduce, comm, stream);
        case BP_COLLECTIVE_SEND:
            return fn.send(send, count, type, peer, comm, stream);
        case BP_COLLECTIVE_RECV:
            return fn.recv(recv, count, type, peer, comm, stream);
        }
        return nccl::InvalidArgument; // prepareCall accepted only the ops above
    }
};

/// Checks one collective against the ABI's rules (plugin.h, bp_collective_args) and resolves its
/// ranges. Everything NCCL would not check, or would only check with NCCL_CHECK_POINTERS, is
/// refused here with BP_ERROR_INVALID_ARGUMENT: another device's memory, ranges past a page,
/// element counts that overflow, a peer that is no rank, ranges that overlap other than in NCCL's
/// in-place layouts.
NcclCall prepareCall(const GpuDevice &device, const CommState &comm, const bp_collective_args &a) {
    NcclCall call;
    call.op = sdk::rawValue(a.op);
    const std::string name = std::string("collective ") + collectiveName(call.op);
    const size_t element = sdk::dataTypeSize(a.type);
    call.type = toNcclType(sdk::rawValue(a.type));
    const bool reduces = call.op == BP_COLLECTIVE_ALL_REDUCE || call.op == BP_COLLECTIVE_REDUCE ||
                         call.op == BP_COLLECTIVE_REDUCE_SCATTER;
    if (reduces) call.reduce = toNcclOp(sdk::rawValue(a.reduce));
    const bool rooted = call.op == BP_COLLECTIVE_REDUCE || call.op == BP_COLLECTIVE_BROADCAST ||
                        call.op == BP_COLLECTIVE_SEND || call.op == BP_COLLECTIVE_RECV;
    if (rooted) {
        if (a.peer >= comm.size)
            invalid(name + ": peer " + std::to_string(a.peer) +
                    " is not a rank of the communicator (size " + std::to_string(comm.size) + ")");
        call.peer = static_cast<int>(a.peer);
    }
    const bool root = a.peer == comm.rank;
    const uint64_t ranks = comm.size;

    // Elements on each side, and whether this rank's call reads (send) or writes (recv) it.
    uint64_t sendCount = a.count, recvCount = a.count;
    bool sendUsed = true, recvUsed = true, sendNeeded = true, recvNeeded = true;
    switch (call.op) {
    case BP_COLLECTIVE_REDUCE: // NCCL writes recv on the root only
        recvNeeded = root;
        break;
    case BP_COLLECTIVE_BROADCAST: // and reads send on the root only
        sendNeeded = root;
        break;
    case BP_COLLECTIVE_ALL_GATHER:
        recvCount = multiply(a.count, ranks, "count * size of all_gather");
        break;
    case BP_COLLECTIVE_REDUCE_SCATTER:
        sendCount = multiply(a.count, ranks, "count * size of reduce_scatter");
        break;
    case BP_COLLECTIVE_SEND:
        recvUsed = recvNeeded = false;
        break;
    case BP_COLLECTIVE_RECV:
        sendUsed = sendNeeded = false;
        break;
    default:
        break;
    }
    const uint64_t sendBytes = multiply(sendCount, element, "the send range in bytes");
    const uint64_t recvBytes = multiply(recvCount, element, "the recv range in bytes");

    auto resolve = [&](bp_memory *memory, uint64_t offset, uint64_t bytes, bool used, bool needed,
                       const char *side) -> const GpuMemory * {
        if (!used) return nullptr;
        if (memory == nullptr) {
            if (needed) invalid(name + ": the " + side + " memory is NULL");
            return nullptr;
        }
        const auto &m = sdk::as<GpuMemory>(memory);
        if (&m.device() != &device)
            invalid(name + ": the " + side + " memory belongs to " + m.device().name() +
                    ", the communicator's rank to " + device.name());
        m.at(offset, bytes); // throws when the range leaves the page
        return &m;
    };
    const GpuMemory *send = resolve(a.send, a.send_offset, sendBytes, sendUsed, sendNeeded, "send");
    const GpuMemory *recv = resolve(a.recv, a.recv_offset, recvBytes, recvUsed, recvNeeded, "recv");
    if (send != nullptr) call.send = pointer(send->at(a.send_offset, sendBytes));
    if (recv != nullptr) call.recv = pointer(recv->at(a.recv_offset, recvBytes));

    // Overlapping ranges are undefined for NCCL except in its in-place layouts.
    if (send != nullptr && send == recv && sendBytes > 0 && recvBytes > 0 &&
        a.send_offset < a.recv_offset + recvBytes && a.recv_offset < a.send_offset + sendBytes) {
        bool inPlace = false;
        switch (call.op) {
        case BP_COLLECTIVE_ALL_GATHER: // this rank's part of recv is send
            inPlace = a.send_offset == a.recv_offset + comm.rank * sendBytes;
            break;
        case BP_COLLECTIVE_REDUCE_SCATTER: // recv is this rank's part of send
            inPlace = a.recv_offset == a.send_offset + comm.rank * recvBytes;
            break;
        default:
            inPlace = a.send_offset == a.recv_offset && sendBytes == recvBytes;
            break;
        }
        if (!inPlace)
            invalid(name + ": the send range [" + std::to_string(a.send_offset) + ", +" +
                    std::to_string(sendBytes) + ") and the recv range [" +
                    std::to_string(a.recv_offset) + ", +" + std::to_string(recvBytes) +
                    ") overlap; they must be disjoint or in place (the same range; for "
                    "all_gather send at recv + rank * count, for reduce_scatter recv at send + "
                    "rank * count)");
    }
    call.count = static_cast<size_t>(a.count);
    return call;
}

// --- groups of the calling thread -------------------------------------------------------------

/// One collective recorded inside comm_group(begin) ... comm_group(end) and not launched yet.
struct GroupEntry {
    std::shared_ptr<CommState> comm;
    GpuStream *stream = nullptr;
    bpv::Event start{};
    /// Held from the collective to ncclGroupEnd, so that no abort frees a communicator that
    /// NCCL's group still names; empty when an earlier entry of the same communicator holds it.
    std::unique_lock<std::mutex> lock;
    std::string what;
};

/// A failure to record on a communicator once this thread's group ended.
struct DeferredFailure {
    std::shared_ptr<CommState> comm;
    bp_status status;
    std::string reason;
};

/// NCCL's group state is per thread (ncclGroupStart nests per thread); so is this record.
struct ThreadGroup {
    int depth = 0;
    std::vector<GroupEntry> entries;
    /// Aborts due while this thread's group is open (comm_abort, a failed call): ncclCommAbort
    /// would join the open group, so they are done when it ends.
    std::vector<DeferredFailure> deferredFailures;

    bool holds(const CommState *comm) const {
        return std::any_of(entries.begin(), entries.end(), [&](const GroupEntry &e) {
            return e.comm.get() == comm && e.lock.owns_lock();
        });
    }
};

ThreadGroup &threadGroup() {
    thread_local ThreadGroup group;
    return group;
}

} // namespace

// --- versions and errors ------------------------------------------------------------------------

std::string nccl::versionString(int code) {
    const bool old = code < 10000; // before 2.9: major * 1000 + minor * 100 + patch
    const int major = old ? code / 1000 : code / 10000;
    const int minor = old ? code / 100 % 10 : code / 100 % 100;
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

sdk::Error NcclLibrary::error(const std::string &call, nccl::Result result, nccl::Comm comm,
                              bool peers) const {
    const char *text = fn.getErrorString != nullptr ? fn.getErrorString(result) : nullptr;
    std::string message = call + " failed: " + resultName(result) + " (" +
                          (text != nullptr ? text : "no description") + ")";
    if (fn.getLastError != nullptr) {
        const char *last = fn.getLastError(comm);
        if (last != nullptr && *last != '\0') message += ": " + std::string(last);
    }
    bp_status code = BP_ERROR_INTERNAL;
    switch (result) {
    case nccl::RemoteError:
    case nccl::SystemError:
        if (peers) {
            code = BP_ERROR_REMOTE;
            message += "; a peer failed or left, or the network to it did; the communicator is "
                       "unusable: destroy it and create a new one";
        } else {
            message += "; NCCL could not set up its network (NCCL_SOCKET_IFNAME selects the "
                       "interface)";
        }
        break;
    case nccl::InvalidArgument:
    case nccl::InvalidUsage:
        code = BP_ERROR_INVALID_ARGUMENT;
        break;
    default:
        break;
    }
    if (code != BP_ERROR_INVALID_ARGUMENT) message += " (NCCL_DEBUG=WARN prints NCCL's own report)";
    return sdk::Error(code, message, static_cast<int64_t>(result));
}

// --- the library --------------------------------------------------------------------------------

NcclLoader::NcclLoader(std::string configured) {
    const char *environment = std::getenv(bpv::kCollectivesEnvironment);
    if (environment != nullptr && *environment != '\0') {
        path_ = environment;
        source_ = std::string(" (from ") + bpv::kCollectivesEnvironment + ")";
    } else if (!configured.empty()) {
        path_ = std::move(configured);
        source_ = std::string(" (from plugins.options.") + bpv::kPluginName + "." +
                  bpv::kCollectivesName + ".library)";
    } else {
        path_ = bpv::kCollectivesLibrary;
    }
}

const NcclLibrary *NcclLoader::library() {
    std::call_once(once_, [this] { load(); });
    return library_.get();
}

const std::string &NcclLoader::status() {
    library();
    return status_;
}

const NcclLibrary &NcclLoader::require(const std::string &operation) {
    if (const NcclLibrary *loaded = library()) return *loaded;
    throw sdk::Error(BP_ERROR_UNSUPPORTED, operation + ": no collectives: " + status_);
}

void NcclLoader::load() {
    const std::string hint = std::string("install ") + bpv::kCollectivesProduct +
                             " or set plugins.options." + bpv::kPluginName + "." +
                             bpv::kCollectivesName + ".library (or " +
                             bpv::kCollectivesEnvironment + ")";
    // Opened once and never closed: NCCL starts proxy threads that outlive any one call. Local
    // symbols: nothing else in the process resolves against it.
    void *handle = ::dlopen(path_.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
        const char *why = ::dlerror();
        status_ =
            path_ + source_ + " not found: " + (why ? why : "unknown loader error") + "; " + hint;
        return;
    }
    auto library = std::make_unique<NcclLibrary>();
    library->path = path_;
    nccl::Functions &fn = library->fn;
    std::string missing;
    auto resolve = [&](auto &slot, const char *symbol, bool required) {
        slot = reinterpret_cast<std::remove_reference_t<decltype(slot)>>(::dlsym(handle, symbol));
        if (slot == nullptr && required && missing.empty()) missing = symbol;
    };
    resolve(fn.getVersion, "ncclGetVersion", true);
    resolve(fn.getUniqueId, "ncclGetUniqueId", true);
    resolve(fn.commInitRank, "ncclCommInitRank", true);
    resolve(fn.commInitRankConfig, "ncclCommInitRankConfig", false);
    resolve(fn.commDestroy, "ncclCommDestroy", true);
    resolve(fn.commAbort, "ncclCommAbort", true);
    resolve(fn.commGetAsyncError, "ncclCommGetAsyncError", true);
    resolve(fn.getErrorString, "ncclGetErrorString", true);
    resolve(fn.getLastError, "ncclGetLastError", false);
    resolve(fn.groupStart, "ncclGroupStart", true);
    resolve(fn.groupEnd, "ncclGroupEnd", true);
    resolve(fn.allReduce, "ncclAllReduce", true);
    resolve(fn.reduce, "ncclReduce", true);
    resolve(fn.broadcast, "ncclBroadcast", true);
    resolve(fn.allGather, "ncclAllGather", true);
    resolve(fn.reduceScatter, "ncclReduceScatter", true);
    resolve(fn.send, "ncclSend", true);
    resolve(fn.recv, "ncclRecv", true);
    if (!missing.empty()) {
        status_ = path_ + source_ + " has no " + missing + ": it is not " +
                  bpv::kCollectivesProduct + " 2.12 or newer; " + hint;
        return;
    }
    int code = 0;
    if (const nccl::Result r = fn.getVersion(&code); r != nccl::Success) {
        status_ = path_ + source_ + ": ncclGetVersion failed (" + resultName(r) + "); " + hint;
        return;
    }
    library->version = code;
    const std::string version =
        std::string(bpv::kCollectivesName) + " " + nccl::versionString(code);
    if (code < nccl::kMinimumVersion) {
        status_ = version + " is older than 2.12; " + hint + " with a newer one";
        return;
    }
    library->description = version;
    status_ = version;
    library_ = std::move(library);
}

// --- marks
// ----------------------------------------------------------------------------------------

void CollectiveMarks::add(const std::shared_ptr<CommState> &comm, uint64_t sequence) {
    forgetDestroyed();
    for (auto &mark : marks_)
        if (mark.first == comm) {
            mark.second = std::max(mark.second, sequence);
            return;
        }
    marks_.emplace_back(comm, sequence);
}

void CollectiveMarks::forgetDestroyed() {
    std::erase_if(marks_, [](const auto &mark) {
        return mark.first->destroyed.load(std::memory_order_acquire);
    });
}

void CollectiveMarks::merge(const CollectiveMarks &other) {
    for (const auto &[comm, sequence] : other.marks_)
        add(comm, sequence);
}

void CollectiveMarks::check() const {
    for (const auto &[comm, sequence] : marks_) {
        const CommState &s = *comm;
        if (s.failed.load(std::memory_order_acquire) && sequence >= s.firstIncomplete)
            throw sdk::Error(s.failStatus, "collective #" + std::to_string(sequence) + " of " +
                                               rankText(s) + " on " + s.deviceName +
                                               " did not complete: " + s.failReason);
    }
}

// --- communicators ------------------------------------------------------------------------------

std::unique_ptr<GpuComm> GpuComm::join(GpuDevice &device, const NcclLibrary &library,
                                       const bp_comm_create_args &args) {
    nccl::UniqueId id{};
    if (args.id_size != sizeof id.internal)
        invalid("comm_create: an " + std::string(bpv::kCollectivesProduct) + " id has " +
                std::to_string(sizeof id.internal) + " bytes, this one " +
                std::to_string(args.id_size) + " (was it made by another plugin?)");
    if (args.size > static_cast<uint32_t>(std::numeric_limits<int>::max()))
        invalid("comm_create: size " + std::to_string(args.size) + " is more than " +
                std::string(bpv::kCollectivesProduct) + " takes");
    std::memcpy(id.internal, args.id, sizeof id.internal);
    const milliseconds timeout =
        args.timeout_ms == 0 ? kDefaultTimeout
                             : milliseconds(static_cast<milliseconds::rep>(std::min<uint64_t>(
                                   args.timeout_ms, static_cast<uint64_t>(kMaxTimeout.count()))));
    auto state = std::make_shared<CommState>(device, library, args.rank, args.size, timeout);
    const std::string what = std::string(bpv::kCollectivesProduct) + " communicator " +
                             rankText(*state) + " on " + device.name();
    const int size = static_cast<int>(args.size);
    const int rank = static_cast<int>(args.rank);

    nccl::Comm handle = nullptr;
    if (library.fn.commInitRankConfig == nullptr) {
        // NCCL 2.12 / 2.13: blocking, without a timeout (docs/cuda.md).
        const nccl::Result r = library.fn.commInitRank(&handle, size, id, rank);
        if (r != nccl::Success)
            throw library.error("ncclCommInitRank (" + what + ")", r, nullptr, true);
    } else {
        nccl::ConfigV21400 config{};
        config.size = sizeof config;
        config.magic = nccl::kConfigMagic;
        config.version = nccl::kConfigVersion;
        config.blocking = 0;
        nccl::Result r = library.fn.commInitRankConfig(&handle, size, id, rank, &config);
        const auto deadline = Clock::now() + timeout;
        Backoff backoff(std::chrono::microseconds(10000));
        while (r == nccl::InProgress) {
            if (Clock::now() >= deadline) {
                library.fn.commAbort(handle);
                throw sdk::Error(BP_ERROR_TIMEOUT,
                                 "comm_create: " + what + ": not every rank joined within " +
                                     std::to_string(timeout.count()) +
                                     " ms (each rank must call comm_create with the same id and "
                                     "size); the communicator was abandoned");
            }
            backoff.pause();
            nccl::Result async = nccl::InProgress;
            const nccl::Result polled = library.fn.commGetAsyncError(handle, &async);
            r = polled != nccl::Success ? polled : async;
        }
        if (r != nccl::Success) {
            sdk::Error error =
                library.error("ncclCommInitRankConfig (" + what + ")", r, handle, true);
            if (handle != nullptr) library.fn.commAbort(handle);
            // Joining fails "internally" when the id's bootstrap address is garbage or rank 0 is
            // unreachable (NCCL reports ncclInternalError from its socket layer): for the
            // caller that is a failed peer, not a bug of NCCL's.
            if (error.code() == BP_ERROR_INTERNAL)
                throw sdk::Error(BP_ERROR_REMOTE,
                                 std::string(error.what()) +
                                     "; the id may be malformed, or rank 0 (which made it) is "
                                     "not reachable",
                                 error.vendorCode());
            throw error;
        }
    }
    state->handle = handle;
    try {
        return std::make_unique<GpuComm>(std::move(state));
    } catch (...) {
        library.fn.commAbort(handle);
        throw;
    }
}

GpuComm::GpuComm(std::shared_ptr<CommState> state) : state_(std::move(state)) {
    watchdog_ = std::thread([this] { watch(); });
}

GpuComm::~GpuComm() {
    {
        std::lock_guard lock(stopMutex_);
        stop_ = true;
    }
    stopped_.notify_all();
    if (watchdog_.joinable()) watchdog_.join();
    CommState &s = *state_;
    std::lock_guard lock(s.mutex);
    retireLocked(s);
    // The core destroys after the communicator's work completed (or after an abort): whatever is
    // still pending here is not waited for.
    for (const PendingCollective &p : s.pending) {
        s.device.recycleEvent(p.start, false);
        s.device.recycleEvent(p.done, false);
    }
    s.pending.clear();
    if (s.handle != nullptr) {
        s.library.fn.commDestroy(s.handle);
        s.handle = nullptr;
    }
    s.destroyed.store(true, std::memory_order_release);
}

void GpuComm::abort() {
    ThreadGroup &group = threadGroup();
    if (group.depth > 0) {
        // NCCL would make ncclCommAbort part of this thread's open group (and this thread may
        // hold the communicator's mutex for it): abort when the group ends.
        group.deferredFailures.push_back(
            {state_, BP_ERROR_REMOTE, "the communicator was aborted (comm_abort)"});
        return;
    }
    CommState &s = *state_;
    std::lock_guard lock(s.mutex);
    failLocked(s, BP_ERROR_REMOTE, "the communicator was aborted (comm_abort)");
}

void GpuComm::watch() {
    CommState &s = *state_;
    for (;;) {
        {
            std::unique_lock lock(stopMutex_);
            if (stopped_.wait_for(lock, kWatchdogTick, [this] { return stop_; })) return;
        }
        std::lock_guard lock(s.mutex);
        if (s.handle == nullptr) return; // failed: nothing left to watch
        nccl::Result async = nccl::Success;
        const nccl::Result polled = s.library.fn.commGetAsyncError(s.handle, &async);
        if (polled != nccl::Success) async = polled;
        if (async != nccl::Success && async != nccl::InProgress) {
            failAfterLocked(s, s.library.error("NCCL (" + rankText(s) + ")", async, s.handle, true),
                            true);
            return;
        }
        retireLocked(s);
        if (!s.pending.empty() && s.pending.front().started &&
            Clock::now() - s.pending.front().startedAt > s.timeout) {
            failLocked(s, BP_ERROR_REMOTE,
                       "collective #" + std::to_string(s.pending.front().sequence) +
                           " ran for more than " + std::to_string(s.timeout.count()) +
                           " ms without completing: a peer is dead or stuck, or did not issue the "
                           "same collective; the communicator was aborted");
            return;
        }
    }
}

// --- entry points
// ---------------------------------------------------------------------------------

std::unique_ptr<sdk::Comm> GpuDevice::createComm(const bp_comm_create_args &args) {
    enter();
    return GpuComm::join(*this, nccl_->require("comm_create"), args);
}

void GpuDevice::collective(sdk::Stream &stream, sdk::Comm &comm, const bp_collective_args &args) {
    enter();
    const std::shared_ptr<CommState> &shared = sdk::as<GpuComm>(comm).state();
    CommState &s = *shared;
    if (&s.device != this)
        invalid("collective: the communicator's rank lives on " + s.device.name() + ", not on " +
                name());
    const NcclCall call = prepareCall(*this, s, args);
    auto &gpuStream = sdk::as<GpuStream>(stream);
    const std::string what = std::string("collective ") + collectiveName(call.op) + " (" +
                             rankText(s) + " on " + name() + ")";

    ThreadGroup &group = threadGroup();
    std::unique_lock lock(s.mutex, std::defer_lock);
    if (group.depth == 0 || !group.holds(&s)) lock.lock();
    throwIfFailed(s, what);
    retireLocked(s);
    const bpv::Event start = acquireEvent(false);
    if (const bpv::Call recorded = bpv::eventRecord(driver_, start, gpuStream.get());
        !recorded.ok()) {
        recycleEvent(start, false);
        check(recorded);
    }
    nccl::Result r;
    {
        const ProfilerRange range(what.c_str());
        r = call.invoke(s.library.fn, s.handle, gpuStream.get());
    }
    if (group.depth > 0) {
        // Queued in NCCL's group: launched (and finished here) by comm_group(end).
        if (r != nccl::Success && r != nccl::InProgress) {
            recycleEvent(start, false);
            const sdk::Error error = s.library.error(what, r, s.handle, true);
            if (error.code() != BP_ERROR_INVALID_ARGUMENT)
                group.deferredFailures.push_back(
                    {shared, error.code(),
                     std::string(error.what()) + "; the communicator was aborted"});
            throw error;
        }
        group.entries.push_back({shared, &gpuStream, start, std::move(lock), what});
        return;
    }
    bool polled = false;
    if (r == nccl::InProgress) {
        lock.unlock();
        try {
            r = waitProgress(s, what);
        } catch (...) {
            recycleEvent(start, false);
            throw;
        }
        polled = true;
        lock.lock();
    }
    if (r != nccl::Success) {
        recycleEvent(start, false);
        const sdk::Error error = s.library.error(what, r, s.handle, true);
        failAfterLocked(s, error, polled);
        throw error;
    }
    finishLocked(shared, gpuStream, start);
    throwIfFailed(s, what); // aborted while this one was being enqueued
}

void groupCollectives(const NcclLibrary &library, bool begin) {
    ThreadGroup &group = threadGroup();
    if (begin) {
        if (const nccl::Result r = library.fn.groupStart(); r != nccl::Success)
            throw library.error("ncclGroupStart", r, nullptr, false);
        ++group.depth;
        return;
    }
    if (group.depth == 0) invalid("comm_group(end) without a comm_group(begin) on this thread");
    const nccl::Result ended = library.fn.groupEnd();
    if (--group.depth > 0) {
        // An inner group: NCCL launches at the outermost end.
        if (ended != nccl::Success) throw library.error("ncclGroupEnd", ended, nullptr, true);
        return;
    }
    std::vector<GroupEntry> entries = std::move(group.entries);
    group.entries.clear();
    std::vector<DeferredFailure> failures = std::move(group.deferredFailures);
    group.deferredFailures.clear();
    // NCCL has taken the group over: from here on, aborts may free its communicators.
    for (GroupEntry &entry : entries)
        if (entry.lock.owns_lock()) entry.lock.unlock();

    // The outcome per communicator: NCCL's background work (nonblocking communicators) or the
    // group's result (blocking ones, or a group that failed as a whole).
    struct Outcome {
        CommState *comm;
        std::optional<sdk::Error> error;
    };
    std::vector<Outcome> outcomes;
    for (const GroupEntry &entry : entries) {
        if (std::any_of(outcomes.begin(), outcomes.end(),
                        [&](const Outcome &o) { return o.comm == entry.comm.get(); }))
            continue;
        CommState &s = *entry.comm;
        Outcome outcome{&s, std::nullopt};
        nccl::Result r = ended;
        bool polled = false;
        try {
            if (ended == nccl::InProgress) {
                r = waitProgress(s, entry.what);
                polled = true;
            }
            if (r != nccl::Success) {
                std::lock_guard lock(s.mutex);
                outcome.error = s.library.error(
                    polled ? entry.what : "ncclGroupEnd (" + entry.what + ")", r, s.handle, true);
                failAfterLocked(s, *outcome.error, polled);
            }
        } catch (const sdk::Error &e) {
            outcome.error = e;
        }
        outcomes.push_back(std::move(outcome));
    }

    std::optional<sdk::Error> first;
    for (GroupEntry &entry : entries) {
        CommState &s = *entry.comm;
        const auto outcome = std::find_if(outcomes.begin(), outcomes.end(),
                                          [&](const Outcome &o) { return o.comm == &s; });
        std::lock_guard lock(s.mutex);
        if (outcome->error) {
            s.device.recycleEvent(entry.start, false);
            if (!first) first = outcome->error;
            continue;
        }
        try {
            s.device.enterForRelease();
            finishLocked(entry.comm, *entry.stream, entry.start);
        } catch (const sdk::Error &e) {
            if (!first) first = e;
        }
    }
    for (DeferredFailure &failure : failures) {
        std::lock_guard lock(failure.comm->mutex);
        failLocked(*failure.comm, failure.status, std::move(failure.reason));
    }
    if (first) throw *first;
    if (ended != nccl::Success && ended != nccl::InProgress) // a group with no collective in it
        throw library.error("ncclGroupEnd", ended, nullptr, true);
}

} // namespace backplane::gpu
