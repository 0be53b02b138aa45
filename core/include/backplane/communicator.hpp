// backplane::Rendezvous (how the processes of a communicator find each other) and the Communicator.
#pragma once

#include <backplane/buffer.hpp>
#include <backplane/client.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace backplane {

/// How the processes of a communicator find each other. One object per process; every process
/// of the communicator calls the same methods in the same order. An application may implement
/// it (an MPI program: allGather with MPI_Allgather + MPI_Allgatherv on its communicator).
///
/// The built-in ones below: one thread at a time per object; contributions of at most 64 MiB;
/// `timeout` must be positive; after any throw the object is unusable (later calls throw
/// Error(InvalidArgument) naming the first failure): make a new one, in a new directory or on
/// fresh connections. A peer that closes its connection, dies or sends malformed data gives
/// Error(Remote) naming that process, never a crash, a signal or an unbounded wait.
class Rendezvous {
public:
    virtual ~Rendezvous() = default;
    /// This process's index among the processes (0-based) and how many there are.
    virtual uint32_t process() const = 0;
    virtual uint32_t processCount() const = 0;
    /// Every process contributes `mine`; returns every process's bytes, by process index.
    /// Throws backplane::Error(ErrorCode::Timeout) naming the step and the missing processes when
    /// `timeout` passes, Error(ErrorCode::InvalidArgument) for inconsistent use.
    virtual std::vector<std::vector<std::byte>> allGather(std::span<const std::byte> mine,
                                                          std::chrono::milliseconds timeout) = 0;
};

/// One process (all ranks local): allGather returns {mine}.
std::unique_ptr<Rendezvous> localRendezvous();

/// Processes sharing a directory (NFS, a node's /tmp): `directory` must be empty or new for each
/// job/communicator generation; files are written atomically (temp + rename). Created if missing,
/// readable and writable by this user only (mode 0700). Whoever can write the directory can join
/// the job, so it is refused with Error(InvalidArgument) when it is a symbolic link, when another
/// user owns it or group or others may write it (a parent that others may write and that is not
/// sticky is logged as a warning). Throws Error(InvalidArgument) also when process >= processCount, and when
/// the directory already holds files of this process or of a later step (a directory reused from
/// an earlier job).
std::unique_ptr<Rendezvous> directoryRendezvous(const std::string &directory, uint32_t process,
                                                uint32_t processCount);

/// What a TCP rendezvous needs beyond its address. Empty fields come from the environment.
struct TcpRendezvousOptions {
    /// The job's shared secret, the same in every process and at least 16 bytes (newRendezvousToken()
    /// or `backplane token` make one). Every connection proves it knows the token, and process 0
    /// proves it to every peer, with an HMAC-SHA256 challenge: the token itself never crosses the
    /// network. Empty: BACKPLANE_RENDEZVOUS_TOKEN, else (like Erlang's cookie) the user's token
    /// file: BACKPLANE_RENDEZVOUS_TOKEN_FILE, else $XDG_CONFIG_HOME/backplane/rendezvous-token,
    /// else ~/.config/backplane/rendezvous-token, made with a fresh token and mode 0600 on first
    /// use. So one user's processes on one machine (or on machines sharing the home directory)
    /// agree with no setting, and other users cannot read it. A token file that another user
    /// owns or that others may read, or a symbolic link, is refused with Error(InvalidArgument).
    std::string token;
    /// Where process 0 listens: a host or address ("10.0.0.5", "node0", "::1"), or "*" for every
    /// interface. Empty: BACKPLANE_RENDEZVOUS_BIND, else the host of `address` (every address it
    /// resolves to on process 0's node). Unused by the other processes.
    std::string bind;
};

/// Process 0 listens on the port of `address` ("host:port", "[v6addr]:port") at the addresses of
/// options.bind; the others connect to it, retrying until `connectTimeout`. The port must be
/// fixed (1-65535): port 0 is refused with Error(InvalidArgument), since the others must know it.
/// Returns once connected: process 0 when all processCount-1 others have connected and proved
/// they know the token, the others when process 0 has proved it and accepted them.
///
/// A connection that does not prove it knows the token (a stranger, another job, a wrong token,
/// a replayed handshake, a connection that stops half-way) is refused and logged (subsystem
/// "comm", level warn; the first 16, then every 1000th) and changes nothing else: the job waits
/// for its real processes. A peer likewise treats a server that does not prove the token (or is
/// not a backplane rendezvous) as a failed attempt and tries the host's other addresses and
/// again until its deadline. Throws Error(Timeout) naming the address, the processes that did
/// not connect and the last refused connection (process 0), or the last error and the last
/// server that answered (a peer); Error(InvalidArgument) for a malformed address, a missing or
/// short token, a host that does not resolve, a port in use, or a peer that proved the token
/// but was started for another processCount or with a duplicate process index (process 0 tells
/// that peer why).
std::unique_ptr<Rendezvous> tcpRendezvous(const std::string &address, uint32_t process,
                                          uint32_t processCount,
                                          std::chrono::milliseconds connectTimeout,
                                          const TcpRendezvousOptions &options = {});

/// A fresh token for TcpRendezvousOptions::token: 32 random bytes as 64 hexadecimal digits.
std::string newRendezvousToken();

/// This process's place among the processes of a launcher, and which variables said so.
struct LaunchEnvironment {
    uint32_t process = 0;
    uint32_t processCount = 1;
    /// The variables it came from ("OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"); "" when none
    /// was set (one process).
    std::string source;
};

/// From the environment of common launchers: BACKPLANE_RANK/BACKPLANE_WORLD_SIZE (backplane's
/// own), Open MPI (OMPI_COMM_WORLD_RANK/SIZE), MPICH/PMI (PMI_RANK/PMI_SIZE), Slurm
/// (SLURM_PROCID/SLURM_NTASKS), in that order: the first launcher whose rank variable is set
/// wins (backplane's own: either of its two; a launcher's job-wide size alone, as SLURM_NTASKS in
/// an salloc shell, does not count). None set: process 0 of 1, source "". Throws Error(Config)
/// naming the variables when the chosen pair is incomplete or inconsistent (rank >= size, size
/// 0, empty, anything but decimal digits, above 4294967295).
LaunchEnvironment launchEnvironment();

/// The rendezvous the environment describes: launchEnvironment() plus BACKPLANE_RENDEZVOUS =
/// "dir:/path" or "tcp:host:port" (with BACKPLANE_RENDEZVOUS_TOKEN and, optionally,
/// BACKPLANE_RENDEZVOUS_BIND: TcpRendezvousOptions); without it, MASTER_ADDR and MASTER_PORT
/// (as torchrun sets them) mean "tcp:MASTER_ADDR:MASTER_PORT"; without either, localRendezvous() for one process.
/// Throws Error(Config) naming the variables when several processes have no rendezvous, when
/// BACKPLANE_RENDEZVOUS is malformed, only one of MASTER_ADDR/MASTER_PORT is set, or a TCP
/// rendezvous has no BACKPLANE_RENDEZVOUS_TOKEN (or a short one); otherwise
/// what directoryRendezvous/tcpRendezvous throw.
std::unique_ptr<Rendezvous> rendezvousFromEnvironment(std::chrono::milliseconds connectTimeout);

// ----- collectives ------------------------------------------------------------------------------

class Runtime; // backplane/runtime.hpp

namespace detail {
struct CommunicatorState;
} // namespace detail

/// Element types of collectives (mirrors bp_data_type).
enum class DataType { I8 = 0, U8, I32, U32, I64, U64, F16, BF16, F32, F64 };
/// Reductions (mirrors bp_reduce_op). Avg: the sum divided by the rank count (integers truncate).
enum class ReduceOp { Sum = 0, Prod, Min, Max, Avg };
/// Bytes of one element.
size_t sizeOf(DataType type) noexcept;
/// "f32", "sum"...
const char *toString(DataType type) noexcept;
const char *toString(ReduceOp op) noexcept;

/// How a Communicator is made.
struct CommunicatorOptions {
    /// Bound on every rendezvous step and on joining the engine's communicator.
    std::chrono::milliseconds timeout{60000};
    /// Use the staged path through host memory even where every rank's plugin has collectives
    /// (for comparisons and tests). Every process must pass the same value.
    bool forceStaged = false;
    /// The client the staged path uses between processes: a device with collectives on host
    /// memory (Gloo through the host plugin). Communicator::create(Runtime&, ...) picks one by
    /// capability when it needs it (one of the given devices, else the first the runtime lists
    /// of type DeviceType::Cpu with BP_CAPABILITY_COLLECTIVES); with the other overload, pass
    /// one when the staged path may span several processes.
    std::optional<ComputeClient> hostClient;
};

/// Collective operations over ranks: devices of this process and of other processes found
/// through a Rendezvous. Rank numbers: processes in rendezvous order, each process's devices in
/// the order given. Every process issues the same operations in the same order (the engines'
/// rule); each call covers all of this process's ranks: the buffer spans hold one Buffer per
/// local device, in order (a single Buffer for a process with one device).
///
/// Engines, chosen once at create() and the same on every process: when every rank's device
/// comes from one plugin with collectives (BP_CAPABILITY_COLLECTIVES: NCCL for cuda, RCCL for
/// hip, Gloo for host), that plugin's communicator; otherwise the staged path: the bytes go
/// through host memory, are reduced on the host, and cross processes with the host plugin's
/// Gloo. engine() says which.
///
/// Stream order: each rank's part runs on the calling thread's current stream of its device,
/// ordered after earlier work on the buffers (every stream) and before later work, exactly
/// like a kernel launch. Native engines are asynchronous; the staged path returns once its
/// results are written (stream-ordered like write()).
///
/// Counts are elements of `type`: allReduce, reduce, broadcast, send and recv move `count`
/// elements per rank; allGather sends `count` and receives `count * size()` (rank r at
/// r * count); reduceScatter sends `count * size()` and receives `count` (part r on rank r).
/// Buffers may be views. Send and recv ranges of one allocation may overlap only in NCCL's
/// in-place layouts: the same range (allReduce, reduce, broadcast), allGather's send at recv +
/// rank * count elements, reduceScatter's recv at send + rank * count elements.
///
/// Errors: Error(InvalidArgument) for a buffer that is too small, of another device or a
/// zero-byte Buffer, ranges that overlap otherwise, a stream that is recording
/// (ComputeClient::beginRecording), a bad count, type, reduction, root or peer. Every local
/// rank's part is checked before any rank's part is issued, read or written, on every engine:
/// a refused call leaves nothing behind on any rank (ranks of other processes may still wait
/// for it: they are the application's to keep in step). Error(Remote) when a peer failed or
/// left (the communicator is then unusable: abort() it and make a new one); Error(Timeout)
/// from create.
/// Thread-safety: one thread at a time per Communicator (the order of operations matters).
class Communicator {
public:
    Communicator() = default;
    /// Joins every process of `rendezvous` (blocking, bounded by options.timeout).
    static Communicator create(std::vector<ComputeClient> devices, Rendezvous &rendezvous,
                               CommunicatorOptions options = {});
    /// Same, opening the host plugin's device from `runtime` when the staged path needs it.
    static Communicator create(const Runtime &runtime, std::vector<ComputeClient> devices,
                               Rendezvous &rendezvous, CommunicatorOptions options = {});

    /// Ranks in all processes.
    uint32_t size() const;
    /// Ranks of this process (its devices).
    uint32_t localSize() const;
    /// The global rank of this process's device `local`.
    uint32_t rank(size_t local = 0) const;
    /// "nccl 2.28.9", "gloo 0.5.0 (tcp)", "staged (host memory; gloo between processes)".
    std::string engine() const;
    /// True when the staged path is in use.
    bool staged() const;

    void allReduce(std::span<const Buffer> send, std::span<const Buffer> recv, uint64_t count,
                   DataType type, ReduceOp op);
    void reduce(std::span<const Buffer> send, std::span<const Buffer> recv, uint64_t count,
                DataType type, ReduceOp op, uint32_t root);
    void broadcast(std::span<const Buffer> send, std::span<const Buffer> recv, uint64_t count,
                   DataType type, uint32_t root);
    void allGather(std::span<const Buffer> send, std::span<const Buffer> recv, uint64_t count,
                   DataType type);
    void reduceScatter(std::span<const Buffer> send, std::span<const Buffer> recv, uint64_t count,
                       DataType type, ReduceOp op);
    /// Point to point, for local device `local`: sends to / receives from global rank `peer`.
    /// Checked when called (see the class: buffer, stream, peer). Between two ranks of one
    /// process, on every engine: both must be inside a group (groupStart ... groupEnd), and are
    /// issued at the outermost groupEnd only when that group's sends and recvs between ranks of
    /// this process pair up exactly (per sender and receiver, the same number of messages of
    /// the same element count and type, in order). Outside a group such a call is
    /// Error(InvalidArgument).
    void send(const Buffer &buffer, uint64_t count, DataType type, uint32_t peer,
              size_t local = 0);
    void recv(const Buffer &buffer, uint64_t count, DataType type, uint32_t peer,
              size_t local = 0);
    /// Collectives between groupStart and groupEnd are issued together (NCCL's group
    /// semantics): needed for send/recv pairs between ranks that one thread drives. Groups
    /// nest: an inner groupEnd does nothing, the outermost one ends the group. groupEnd with
    /// no open group is Error(InvalidArgument). When the sends and recvs between ranks of this
    /// process do not pair up, the outermost groupEnd throws Error(InvalidArgument) and issues
    /// none of them (the group's other operations, which other processes expect, are still
    /// issued); nothing of them stays queued, and the group is closed: the next one starts
    /// clean.
    void groupStart();
    void groupEnd();

    /// Single-buffer forms for a process with one device.
    void allReduce(const Buffer &send, const Buffer &recv, uint64_t count, DataType type,
                   ReduceOp op) {
        allReduce(std::span(&send, 1), std::span(&recv, 1), count, type, op);
    }
    void broadcast(const Buffer &send, const Buffer &recv, uint64_t count, DataType type,
                   uint32_t root) {
        broadcast(std::span(&send, 1), std::span(&recv, 1), count, type, root);
    }

    /// Makes pending and later operations fail with Error(Remote) instead of waiting for peers
    /// (e.g. when the application learns that another process died). The communicator is then
    /// unusable.
    void abort();

private:
    /// create() with a way to get the host client the staged path between processes needs,
    /// called only when that path is chosen.
    static Communicator createWith(std::vector<ComputeClient> devices, Rendezvous &rendezvous,
                                   CommunicatorOptions options,
                                   const std::function<std::optional<ComputeClient>()> &openHost);
    std::shared_ptr<detail::CommunicatorState> state_;
};

} // namespace backplane
