// The Communicator's shared state and the parts its files share: the staged engine
// (staged_engine.cpp) and joining the plugins' communicators (communicator_join.cpp).
// communicator.cpp holds the public API, its checks, the native path and the groups.
#pragma once

#include "server/compute_server.hpp"

#include <backplane/communicator.hpp>
#include <backplane/runtime.hpp>

#include <backplane/error.hpp>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace backplane::detail {

using Bytes = std::vector<std::byte>;

struct CommunicatorState {
    std::vector<ComputeClient> clients;
    std::vector<std::shared_ptr<ComputeServer>> servers;
    uint32_t process = 0;
    uint32_t processCount = 1;
    uint32_t firstRank = 0; ///< global rank of local device 0
    uint32_t worldSize = 0;
    std::vector<uint32_t> processOfRank; ///< global rank -> process
    std::string engine;
    bool staged = false;
    /// Open groupStart()s: operations are issued when the outermost group ends (NCCL nests them
    /// the same way).
    uint32_t groupDepth = 0;
    std::atomic<bool> aborted{false};

    // native engine
    std::vector<CommOwner> comms; ///< per local rank

    // staged engine
    std::optional<ComputeClient> host;       ///< between processes (processCount > 1)
    std::shared_ptr<ComputeServer> hostServer;
    CommOwner processComm;                   ///< ranks = processes, on the host plugin
    /// Point-to-point operations with other processes in a staged group: at groupEnd every
    /// `post` runs inside one group of the host plugin (so a ring of sends and recvs between
    /// processes cannot wait on each other), then every `finish` in order.
    struct Deferred {
        std::function<void()> post;
        std::function<void()> finish;
    };
    std::vector<Deferred> deferred;
    /// Every engine: point-to-point calls between two ranks of this process, held until the
    /// outermost groupEnd checks that they pair up exactly. An unmatched one would pair with a
    /// later collective and wait forever (native), or its payload would reach a later group's
    /// recv (staged).
    struct LocalP2p {
        uint32_t from = 0;
        uint32_t to = 0;
        uint64_t bytes = 0;
        bool sending = false;
        size_t local = 0;    ///< the local device that sends or receives
        Buffer buffer;
        StreamId stream = 0; ///< the calling thread's current stream at the call
        bp_collective_args args{};
    };
    std::vector<LocalP2p> localP2p;

    ~CommunicatorState() {
        // A collective still pending uses its communicator: wait for the streams first. A device
        // that failed cannot be waited for; its communicator is aborted instead.
        for (size_t i = 0; i < servers.size() && i < comms.size(); ++i) {
            try {
                servers[i]->syncAll();
            } catch (...) {
                if (comms[i]) servers[i]->driver().commAbort(comms[i].get());
            }
        }
        if (hostServer && processComm) {
            try {
                hostServer->syncAll();
            } catch (...) {
                hostServer->driver().commAbort(processComm.get());
            }
        }
    }

    StreamId stream() const { return ComputeClient::currentStream(); }
    void checkUsable(const char *what) const {
        if (aborted.load())
            throw Error(ErrorCode::Remote,
                        std::string(what) + ": the communicator was aborted; make a new one");
    }
};

inline constexpr const char *kStagedEngine = "staged (host memory; gloo between processes)";

[[noreturn]] inline void invalid(const std::string &what, const std::string &why) {
    throw Error(ErrorCode::InvalidArgument, what + ": " + why);
}

/// The plugin's arguments of one collective (send and recv are filled in by the server).
inline bp_collective_args collectiveArgs(bp_collective op, DataType type, ReduceOp reduce,
                                         uint32_t peer, uint64_t count) {
    bp_collective_args args{};
    args.struct_size = sizeof(args);
    args.op = op;
    args.type = static_cast<bp_data_type>(type);
    args.reduce = static_cast<bp_reduce_op>(reduce);
    args.peer = peer;
    args.count = count;
    return args;
}

// ----- joining (communicator_join.cpp) -----------------------------------------------------------

/// Joins `comms[i]` for every local server concurrently (a plugin's comm_create returns once
/// every rank joined, so ranks of one process must join from separate threads).
std::vector<CommOwner> joinAll(const std::vector<Driver *> &drivers, const Bytes &id,
                               uint32_t firstRank, uint32_t size, uint64_t timeoutMs);
/// The id bytes process 0 made, handed to every process through the rendezvous.
Bytes shareId(Rendezvous &rendezvous, uint32_t process, const std::function<Bytes()> &make,
              std::chrono::milliseconds timeout);
/// One of `given` whose device can carry the staged path between processes (a CPU device with
/// collectives and async streams), else the first such device of `runtime`, opened.
ComputeClient openProcessCarrier(const Runtime &runtime, const std::vector<ComputeClient> &given);

// ----- the staged engine (staged_engine.cpp) -----------------------------------------------------

/// A collective of the process communicator recorded on the host plugin, its result not read yet.
struct ProcessPending {
    /// Kept until the result is read: inside a comm group the host plugin runs the group's
    /// collectives together at its end, not in stream order, so a send buffer freed after its
    /// post could be handed to a later post of the same group while the send still reads it.
    Buffer send;
    Buffer recv;
    uint64_t recvBytes = 0;
};

/// The bytes of `buffer` (count elements), read on the current stream.
Bytes readAll(ComputeServer &server, StreamId stream, const Buffer &buffer, uint64_t bytes);
void writeAll(ComputeServer &server, StreamId stream, const Buffer &buffer, const Bytes &data,
              uint64_t offset = 0, uint64_t bytes = UINT64_MAX);
/// Records one collective of the process communicator over `data` (host memory) on the host
/// plugin; finishProcess reads its result.
ProcessPending postProcess(CommunicatorState &s, bp_collective op, DataType type, ReduceOp reduce,
                           uint32_t peer, const Bytes &data, uint64_t count, uint64_t recvBytes);
Bytes finishProcess(CommunicatorState &s, const ProcessPending &pending);
/// postProcess, then its result.
Bytes processCollective(CommunicatorState &s, bp_collective op, DataType type, ReduceOp reduce,
                        uint32_t peer, const Bytes &data, uint64_t count, uint64_t recvBytes);
/// The reduction of every local rank's bytes, then (several processes) of every process's; Avg
/// is summed, then divided by the world size at the end.
Bytes reduceEverywhere(CommunicatorState &s, std::span<const Buffer> send, uint64_t count,
                       DataType type, ReduceOp op);

} // namespace backplane::detail
