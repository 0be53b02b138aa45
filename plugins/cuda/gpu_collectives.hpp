// NCCL (CUDA) / RCCL (HIP) opened with dlopen, and the communicators of the GPU plugin.
#pragma once

// No nccl.h at build time: the few types and functions used are declared here, from the public
// header of NCCL 2.28.9 (/usr/local/cuda/include/nccl.h of CUDA 13) and checked against the
// NVIDIA/nccl tags v2.12.12-1 (the oldest release accepted), v2.14.3-1 and v2.17.1-1 (the config
// struct). RCCL declares the same names with the same values, with hipStream_t as the stream.

#include "gpu_device.hpp"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace backplane::gpu {

namespace nccl {

/// ncclResult_t.
enum Result : int {
    Success = 0,
    UnhandledCudaError = 1,
    SystemError = 2,
    InternalError = 3,
    InvalidArgument = 4,
    InvalidUsage = 5,
    RemoteError = 6, ///< NCCL >= 2.13
    InProgress = 7,  ///< NCCL >= 2.14, nonblocking communicators
};

struct Opaque;
/// ncclComm_t: an opaque pointer.
using Comm = Opaque *;

/// ncclUniqueId: 128 bytes, passed by value to ncclCommInitRank*.
struct UniqueId {
    char internal[128];
};

/// ncclDataType_t (bp_data_type orders them differently: BP_DATA_BF16 is 7, Bfloat16 is 9).
enum DataType : int {
    Int8 = 0,
    Uint8 = 1,
    Int32 = 2,
    Uint32 = 3,
    Int64 = 4,
    Uint64 = 5,
    Float16 = 6,
    Float32 = 7,
    Float64 = 8,
    Bfloat16 = 9, ///< NCCL >= 2.10
};

/// ncclRedOp_t (bp_reduce_op has MIN before MAX; NCCL has Max = 2, Min = 3).
enum RedOp : int {
    Sum = 0,
    Prod = 1,
    Max = 2,
    Min = 3,
    Avg = 4, ///< NCCL >= 2.10
};

/// ncclConfig_t as NCCL 2.14 to 2.16 declare it (ncclConfig_v21400). Later releases read a
/// caller's config up to its `size` and take the fields past `blocking` as unset when `version`
/// is below 2.17, so this prefix stays valid (init.cc, parseCommConfig).
struct ConfigV21400 {
    size_t size;
    unsigned int magic;   ///< kConfigMagic
    unsigned int version; ///< kConfigVersion
    int blocking;         ///< 0: calls return InProgress and finish in the background
};
inline constexpr unsigned int kConfigMagic = 0xcafebeef;
inline constexpr unsigned int kConfigVersion = 21400; // NCCL_VERSION(2, 14, 0)

/// The entry points, resolved with dlsym. Optional ones are NULL when the library lacks them.
struct Functions {
    Result (*getVersion)(int *version) = nullptr;
    Result (*getUniqueId)(UniqueId *id) = nullptr;
    Result (*commInitRank)(Comm *comm, int nranks, UniqueId id, int rank) = nullptr;
    /// Optional (NCCL >= 2.14): nonblocking init, so that comm_create can time out.
    Result (*commInitRankConfig)(Comm *comm, int nranks, UniqueId id, int rank,
                                 ConfigV21400 *config) = nullptr;
    Result (*commDestroy)(Comm comm) = nullptr;
    Result (*commAbort)(Comm comm) = nullptr;
    Result (*commGetAsyncError)(Comm comm, Result *asyncError) = nullptr;
    const char *(*getErrorString)(Result result) = nullptr;
    /// Optional (NCCL >= 2.13): the last error's detail, for messages.
    const char *(*getLastError)(Comm comm) = nullptr;
    Result (*groupStart)() = nullptr;
    Result (*groupEnd)() = nullptr;
    Result (*allReduce)(const void *send, void *recv, size_t count, DataType type, RedOp op,
                        Comm comm, bpv::Stream stream) = nullptr;
    Result (*reduce)(const void *send, void *recv, size_t count, DataType type, RedOp op, int root,
                     Comm comm, bpv::Stream stream) = nullptr;
    Result (*broadcast)(const void *send, void *recv, size_t count, DataType type, int root,
                        Comm comm, bpv::Stream stream) = nullptr;
    Result (*allGather)(const void *send, void *recv, size_t sendCount, DataType type, Comm comm,
                        bpv::Stream stream) = nullptr;
    Result (*reduceScatter)(const void *send, void *recv, size_t recvCount, DataType type, RedOp op,
                            Comm comm, bpv::Stream stream) = nullptr;
    Result (*send)(const void *send, size_t count, DataType type, int peer, Comm comm,
                   bpv::Stream stream) = nullptr;
    Result (*recv)(void *recv, size_t count, DataType type, int peer, Comm comm,
                   bpv::Stream stream) = nullptr;
};

/// The oldest release accepted: 2.12 (RemoteError aside, every entry point above but the optional
/// ones, bf16 and avg exist there).
inline constexpr int kMinimumVersion = 21200;

/// ncclGetVersion's code as "2.28.9": major * 10000 + minor * 100 + patch since 2.9, major * 1000
/// + minor * 100 + patch before.
std::string versionString(int code);

} // namespace nccl

/// One opened NCCL (RCCL): its table and version. Never unloaded (it starts threads).
struct NcclLibrary {
    nccl::Functions fn;
    int version = 0;
    std::string path;        ///< what was passed to dlopen
    std::string description; ///< "nccl 2.28.9"

    /// THE translation of a failed NCCL call: names the call, NCCL's error string and its last
    /// error detail, keeps the ncclResult_t. RemoteError and SystemError become BP_ERROR_REMOTE
    /// when `peers` (the call talks to other ranks), InvalidArgument / InvalidUsage
    /// BP_ERROR_INVALID_ARGUMENT, anything else BP_ERROR_INTERNAL.
    sdk::Error error(const std::string &call, nccl::Result result, nccl::Comm comm,
                     bool peers) const;
};

/// Opens the collective library on first use, once per plugin instance. Thread-safe; never
/// throws for a missing or unusable library: library() is then NULL and status() says why.
class NcclLoader {
public:
    /// `configured`: the path from the plugin options ("" for none); the environment variable
    /// vendor.hpp names (BACKPLANE_NCCL_LIBRARY) overrides it, read here.
    explicit NcclLoader(std::string configured);
    NcclLoader(const NcclLoader &) = delete;
    NcclLoader &operator=(const NcclLoader &) = delete;

    /// The library, or NULL when it is missing, incomplete or too old.
    const NcclLibrary *library();
    /// bp_device_info::collectives: "nccl 2.28.9", or why there are no collectives.
    const std::string &status();
    /// The library; throws BP_ERROR_UNSUPPORTED "<operation>: <status>" when there is none.
    const NcclLibrary &require(const std::string &operation);

private:
    void load();

    std::string path_;
    std::string source_; ///< where path_ came from, for messages
    std::once_flag once_;
    std::unique_ptr<NcclLibrary> library_;
    std::string status_;
};

/// comm_group of the calling thread: ncclGroupStart, or ncclGroupEnd followed by the completion
/// of the collectives recorded in the group (their events, their streams' marks).
void groupCollectives(const NcclLibrary &library, bool begin);

/// One collective recorded and not yet seen complete (its two events come from the device pool).
struct PendingCollective {
    uint64_t sequence = 0;
    bpv::Event start{}; ///< recorded before the collective: it started once this completed
    bpv::Event done{};  ///< recorded after it
    bool started = false;
    std::chrono::steady_clock::time_point startedAt{};
};

/// The state of one rank's membership, shared by the GpuComm, its watchdog thread, and the marks
/// of the streams and events that recorded its collectives (which may outlive it).
struct CommState {
    CommState(GpuDevice &owner, const NcclLibrary &loaded, uint32_t rankInComm, uint32_t ranks,
              std::chrono::milliseconds limit)
        : device(owner), library(loaded), deviceName(owner.name()), rank(rankInComm), size(ranks),
          timeout(limit) {}

    /// Used only while the GpuComm lives (marks may outlive the device: they use deviceName).
    GpuDevice &device;
    const NcclLibrary &library;
    const std::string deviceName;
    const uint32_t rank;
    const uint32_t size;
    const std::chrono::milliseconds timeout; ///< joining, enqueueing, and one collective's run

    /// Guards every NCCL call on `handle` (NCCL communicators are not thread-safe) and the
    /// fields below. Held only for calls that do not wait for peers, except with a blocking
    /// communicator (NCCL_COMM_BLOCKING=1, or NCCL < 2.14).
    std::mutex mutex;
    nccl::Comm handle = nullptr; ///< NULL once aborted or destroyed
    uint64_t issued = 0;         ///< sequence number of the last collective recorded
    std::deque<PendingCollective> pending;

    /// Set once, before `failed` (release); read after it (acquire) without the mutex.
    std::atomic<bool> failed{false};
    std::atomic<bool> destroyed{false};
    bp_status failStatus = BP_ERROR_REMOTE;
    std::string failReason;
    uint64_t firstIncomplete = 0; ///< once failed: collectives from this sequence on did not finish
};

/// One rank's membership in an NCCL communicator, on one GpuDevice. A watchdog thread polls
/// ncclCommGetAsyncError and the oldest pending collective; on an error, or when that collective
/// has been running for longer than the timeout, it aborts the communicator so that the stream
/// moves on and waits on its events fail with BP_ERROR_REMOTE.
class GpuComm : public sdk::Comm {
public:
    /// ncclCommInitRankConfig (nonblocking, polled until every rank joined or the timeout ran
    /// out: BP_ERROR_TIMEOUT), or ncclCommInitRank with NCCL < 2.14 (blocks, no timeout). The
    /// device's context must be current.
    static std::unique_ptr<GpuComm> join(GpuDevice &device, const NcclLibrary &library,
                                         const bp_comm_create_args &args);
    explicit GpuComm(std::shared_ptr<CommState> state);
    ~GpuComm() override;
    GpuComm(const GpuComm &) = delete;
    GpuComm &operator=(const GpuComm &) = delete;

    void abort() override;
    const std::shared_ptr<CommState> &state() const noexcept { return state_; }

private:
    void watch();

    std::shared_ptr<CommState> state_;
    std::mutex stopMutex_;
    std::condition_variable stopped_;
    bool stop_ = false;
    std::thread watchdog_;
};

} // namespace backplane::gpu
