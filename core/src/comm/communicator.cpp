// Communicator: collectives over ranks of one or several processes, on the plugins' engines
// (NCCL, RCCL, Gloo) or, for any other mix of devices, staged through host memory.
#include "comm/communicator_state.hpp"
#include "comm/host_reduce.hpp"
#include "comm/peer_description.hpp"
#include "server/compute_server.hpp"

#include <backplane/communicator.hpp>
#include <backplane/log.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <deque>
#include <exception>
#include <future>
#include <map>
#include <thread>

namespace backplane {

size_t sizeOf(DataType type) noexcept {
    switch (type) {
    case DataType::I8:
    case DataType::U8: return 1;
    case DataType::F16:
    case DataType::BF16: return 2;
    case DataType::I32:
    case DataType::U32:
    case DataType::F32: return 4;
    case DataType::I64:
    case DataType::U64:
    case DataType::F64: return 8;
    }
    return 0;
}

const char *toString(DataType type) noexcept {
    switch (type) {
    case DataType::I8: return "i8";
    case DataType::U8: return "u8";
    case DataType::I32: return "i32";
    case DataType::U32: return "u32";
    case DataType::I64: return "i64";
    case DataType::U64: return "u64";
    case DataType::F16: return "f16";
    case DataType::BF16: return "bf16";
    case DataType::F32: return "f32";
    case DataType::F64: return "f64";
    }
    return "unknown";
}

const char *toString(ReduceOp op) noexcept {
    switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Prod: return "prod";
    case ReduceOp::Min: return "min";
    case ReduceOp::Max: return "max";
    case ReduceOp::Avg: return "avg";
    }
    return "unknown";
}

namespace detail {
namespace {

Bytes toBytes(const std::string &text) {
    Bytes out(text.size());
    std::memcpy(out.data(), text.data(), text.size());
    return out;
}

std::string toText(const Bytes &bytes) {
    return std::string(reinterpret_cast<const char *>(bytes.data()), bytes.size());
}

} // namespace
} // namespace detail

using detail::Bytes;
using detail::CommunicatorState;

// ----- create -----------------------------------------------------------------------------------

Communicator Communicator::create(std::vector<ComputeClient> devices, Rendezvous &rendezvous,
                                  CommunicatorOptions options) {
    return createWith(std::move(devices), rendezvous, std::move(options),
                                      [] { return std::optional<ComputeClient>(); });
}

Communicator Communicator::create(const Runtime &runtime, std::vector<ComputeClient> devices,
                                  Rendezvous &rendezvous, CommunicatorOptions options) {
    const std::vector<ComputeClient> given = devices;
    // Chosen by what a device can do, not by its plugin's name: an out-of-tree CPU plugin with
    // collectives serves as well as the host plugin.
    return createWith(std::move(devices), rendezvous, std::move(options),
                      [&]() -> std::optional<ComputeClient> {
                          return detail::openProcessCarrier(runtime, given);
                      });
}

Communicator Communicator::createWith(
    std::vector<ComputeClient> devices, Rendezvous &rendezvous, CommunicatorOptions options,
    const std::function<std::optional<ComputeClient>()> &openHost) {
    if (devices.empty()) detail::invalid("Communicator::create", "no device given");
    if (options.timeout.count() <= 0)
        detail::invalid("Communicator::create", "the timeout must be positive");
    auto s = std::make_shared<CommunicatorState>();
    s->clients = devices;
    for (const ComputeClient &c : devices) s->servers.push_back(detail::serverOf(c));
    for (size_t i = 0; i < s->servers.size(); ++i)
        for (size_t j = 0; j < i; ++j)
            if (s->servers[i] == s->servers[j])
                detail::invalid("Communicator::create",
                                "device " + std::to_string(i) + " (" +
                                    s->servers[i]->info().id() + ") is given twice; each rank "
                                    "needs its own device");
    s->process = rendezvous.process();
    s->processCount = rendezvous.processCount();

    // Step 1: every process says what its ranks are; all choose the same engine from that.
    detail::PeerDescription mine;
    mine.ranks = static_cast<uint32_t>(devices.size());
    mine.forceStaged = options.forceStaged;
    for (const auto &server : s->servers) {
        mine.plugins.push_back(server->info().backend);
        mine.collectives.push_back(server->asyncStreams() && server->driver().hasCollectives());
    }
    if (mine.ranks > detail::kMaxRanksPerProcess)
        detail::invalid("Communicator::create",
                        std::to_string(devices.size()) +
                            " devices; one process may bring at most " +
                            std::to_string(detail::kMaxRanksPerProcess));
    const Bytes sent = detail::toBytes(detail::writePeerDescription(mine));
    const std::vector<Bytes> all = rendezvous.allGather(sent, options.timeout);
    if (all.size() != s->processCount)
        detail::invalid("Communicator::create", "the rendezvous returned " +
                                                    std::to_string(all.size()) + " answers for " +
                                                    std::to_string(s->processCount) + " processes");
    // Another description under this process's index would give its ranks other numbers here
    // than the others give them.
    if (all[s->process] != sent)
        throw Error(ErrorCode::Remote,
                    "Communicator::create: the rendezvous returned other bytes as the description "
                    "of this process's (" + std::to_string(s->process) + ") ranks than it sent; "
                    "the rendezvous is broken");
    bool native = true;
    std::string plugin;
    for (uint32_t p = 0; p < s->processCount; ++p) {
        const detail::PeerDescription d = detail::parsePeerDescription(detail::toText(all[p]), p);
        if (uint64_t{s->worldSize} + d.ranks > UINT32_MAX)
            throw Error(ErrorCode::Remote, "Communicator::create: processes 0 to " +
                                               std::to_string(p) + " describe more than " +
                                               std::to_string(UINT32_MAX) + " ranks");
        if (p == s->process) s->firstRank = s->worldSize;
        for (uint32_t r = 0; r < d.ranks; ++r) {
            s->processOfRank.push_back(p);
            if (plugin.empty()) plugin = d.plugins[r];
            native = native && !d.forceStaged && d.collectives[r] && d.plugins[r] == plugin;
        }
        s->worldSize += d.ranks;
    }
    const uint64_t timeoutMs = static_cast<uint64_t>(options.timeout.count());

    if (native) {
        // Step 2: process 0 makes the engine's id; every local rank joins with it.
        detail::Driver &first = s->servers[0]->driver();
        const Bytes id = detail::shareId(
            rendezvous, s->process, [&] { return first.commIdCreate(); }, options.timeout);
        std::vector<detail::Driver *> drivers;
        for (const auto &server : s->servers) drivers.push_back(&server->driver());
        s->comms = detail::joinAll(drivers, id, s->firstRank, s->worldSize, timeoutMs);
        s->engine = s->servers[0]->info().collectives;
        if (s->engine.empty()) s->engine = plugin;
    } else {
        s->staged = true;
        s->engine = detail::kStagedEngine;
        if (s->processCount > 1) {
            if (!options.hostClient) options.hostClient = openHost();
            if (!options.hostClient)
                detail::invalid("Communicator::create",
                                "the staged path between processes runs on the host plugin's "
                                "Gloo: pass CommunicatorOptions::hostClient, or use "
                                "Communicator::create(runtime, ...)");
            s->host = *options.hostClient;
            s->hostServer = detail::serverOf(*s->host);
            detail::Driver &host = s->hostServer->driver();
            if (!host.hasCollectives())
                detail::invalid("Communicator::create",
                                "the staged path between processes needs the host plugin's "
                                "collectives, and " + s->hostServer->info().id() +
                                    " has none (" + s->hostServer->info().collectives + ")");
            const Bytes id = detail::shareId(
                rendezvous, s->process, [&] { return host.commIdCreate(); }, options.timeout);
            std::vector<detail::Driver *> one{&host};
            s->processComm =
                std::move(detail::joinAll(one, id, s->process, s->processCount, timeoutMs).front());
        }
    }
    log::write(log::Subsystem::Streams, log::Level::Info,
               "communicator: " + std::to_string(s->worldSize) + " ranks in " +
                   std::to_string(s->processCount) + " processes, engine " + s->engine);
    Communicator c;
    c.state_ = std::move(s);
    return c;
}

// ----- accessors --------------------------------------------------------------------------------

namespace {
CommunicatorState &stateOf(const std::shared_ptr<CommunicatorState> &state, const char *what) {
    if (!state)
        throw Error(ErrorCode::InvalidArgument,
                    std::string("Communicator::") + what +
                        ": the Communicator is empty (default-constructed)");
    return *state;
}
} // namespace

uint32_t Communicator::size() const { return stateOf(state_, "size").worldSize; }
uint32_t Communicator::localSize() const {
    return static_cast<uint32_t>(stateOf(state_, "localSize").servers.size());
}
uint32_t Communicator::rank(size_t local) const {
    CommunicatorState &s = stateOf(state_, "rank");
    if (local >= s.servers.size())
        detail::invalid("Communicator::rank", "local device " + std::to_string(local) +
                                                  " of " + std::to_string(s.servers.size()));
    return s.firstRank + static_cast<uint32_t>(local);
}
std::string Communicator::engine() const { return stateOf(state_, "engine").engine; }
bool Communicator::staged() const { return stateOf(state_, "staged").staged; }

void Communicator::abort() {
    CommunicatorState &s = stateOf(state_, "abort");
    s.aborted = true;
    for (size_t i = 0; i < s.comms.size(); ++i)
        if (s.comms[i]) s.servers[i]->driver().commAbort(s.comms[i].get());
    if (s.processComm) s.hostServer->driver().commAbort(s.processComm.get());
}

// ----- operations -------------------------------------------------------------------------------

namespace {

/// Checks the spans: one buffer per local device.
void checkSpans(const CommunicatorState &s, std::span<const Buffer> send,
                std::span<const Buffer> recv, const char *what) {
    if (send.size() != s.servers.size() || recv.size() != s.servers.size())
        detail::invalid(std::string("Communicator::") + what,
                        "give one send and one receive Buffer per local device (" +
                            std::to_string(s.servers.size()) + "); got " +
                            std::to_string(send.size()) + " and " + std::to_string(recv.size()));
}

void checkOp(ReduceOp op, const char *what) {
    if (static_cast<unsigned>(op) > static_cast<unsigned>(ReduceOp::Avg))
        detail::invalid(std::string("Communicator::") + what,
                        "reduction " + std::to_string(static_cast<int>(op)) +
                            " is not a ReduceOp");
}

void checkRoot(const CommunicatorState &s, uint32_t root, const char *what) {
    if (root >= s.worldSize)
        detail::invalid(std::string("Communicator::") + what,
                        "rank " + std::to_string(root) + " is not below the size " +
                            std::to_string(s.worldSize));
}

uint64_t bytesOf(uint64_t count, DataType type, uint64_t times, const char *what) {
    const uint64_t es = sizeOf(type);
    if (es == 0)
        detail::invalid(std::string("Communicator::") + what,
                        "data type " + std::to_string(static_cast<int>(type)) +
                            " is not a DataType");
    if (count > UINT64_MAX / es / std::max<uint64_t>(times, 1))
        detail::invalid(std::string("Communicator::") + what, "the byte count overflows");
    return count * es * times;
}

/// The plugins' rule for send and recv ranges that overlap (plugins/host/gloo/host_comm.cpp,
/// plugins/cuda/gpu_collectives.cpp prepareCall): only NCCL's in-place layouts are allowed. Two
/// Buffers share bytes only when they are views of one allocation (Buffer::id; allocations never
/// overlap), so the views' offsets compare as the plugins compare memory and absolute offsets.
/// Checked whenever both buffers are given, as the CUDA plugin does; the host plugin skips a
/// reduce's recv and a broadcast's send off the root, so this refuses a little more there.
void checkOverlap(bp_collective op, uint32_t rank, const Buffer &send, uint64_t sendBytes,
                  const Buffer &recv, uint64_t recvBytes, const std::string &what) {
    if (send.id() != recv.id() || sendBytes == 0 || recvBytes == 0) return;
    const uint64_t s = send.offset();
    const uint64_t r = recv.offset();
    if (s >= r + recvBytes || r >= s + sendBytes) return;
    bool inPlace = false;
    switch (op) {
    case BP_COLLECTIVE_ALL_GATHER: inPlace = s == r + rank * sendBytes; break;
    case BP_COLLECTIVE_REDUCE_SCATTER: inPlace = r == s + rank * recvBytes; break;
    default: inPlace = s == r && sendBytes == recvBytes; break;
    }
    if (!inPlace)
        detail::invalid(what, "rank " + std::to_string(rank) + ": the send range [" +
                                  std::to_string(s) + ", +" + std::to_string(sendBytes) +
                                  ") and the recv range [" + std::to_string(r) + ", +" +
                                  std::to_string(recvBytes) +
                                  ") of one Buffer overlap; they must be disjoint or in place "
                                  "(the same range; for allGather send at recv + rank * count, "
                                  "for reduceScatter recv at send + rank * count)");
}

/// Every refusal of local rank `local`'s part of an operation, on every engine, so that a call
/// is checked on all local ranks before anything of it is issued, read or written (a part
/// refused after others went out would leave those waiting for it until the engine timeout):
/// the device is alive, `stream` does not record (the message ComputeServer::collective gives),
/// the buffers are the device's, large enough and not zero-byte Buffers, send and recv do not
/// overlap (checkOverlap).
void checkPart(CommunicatorState &s, size_t local, StreamId stream, bp_collective op,
               const Buffer *send, uint64_t sendBytes, const Buffer *recv, uint64_t recvBytes,
               const std::string &what) {
    detail::ComputeServer &server = *s.servers[local];
    server.refuseWhileRecording(stream, "a collective");
    server.checkCollective(send, sendBytes, recv, recvBytes, what);
    if (send != nullptr && recv != nullptr)
        checkOverlap(op, s.firstRank + static_cast<uint32_t>(local), *send, sendBytes, *recv,
                     recvBytes, what);
}

/// checkPart for every local rank of a collective.
void checkAllParts(CommunicatorState &s, bp_collective op, std::span<const Buffer> send,
                   uint64_t sendBytes, std::span<const Buffer> recv, uint64_t recvBytes,
                   const char *what) {
    const std::string name = std::string("Communicator::") + what;
    const StreamId stream = s.stream();
    for (size_t i = 0; i < s.servers.size(); ++i)
        checkPart(s, i, stream, op, &send[i], sendBytes, &recv[i], recvBytes, name);
}

/// One native collective for every local rank (checkAllParts passed), grouped when there are
/// several.
void nativeAll(CommunicatorState &s, bp_collective op, std::span<const Buffer> send,
               std::span<const Buffer> recv, uint64_t count, DataType type, ReduceOp reduce,
               uint32_t peer, uint64_t sendBytes, uint64_t recvBytes, const char *what) {
    const std::string name = std::string("Communicator::") + what;
    const bool group = s.servers.size() > 1 && s.groupDepth == 0;
    detail::Driver &driver = s.servers[0]->driver();
    if (group) driver.commGroup(true);
    try {
        const bp_collective_args args = detail::collectiveArgs(op, type, reduce, peer, count);
        for (size_t i = 0; i < s.servers.size(); ++i)
            s.servers[i]->collective(s.stream(), s.comms[i].get(), args, &send[i], sendBytes,
                                     &recv[i], recvBytes, name);
    } catch (...) {
        if (group) driver.commGroup(false);
        throw;
    }
    if (group) driver.commGroup(false);
}

bool isLocal(const CommunicatorState &s, uint32_t rank) {
    return rank >= s.firstRank && rank < s.firstRank + s.servers.size();
}

/// Runs `issue`, a collective whose parts passed checkAllParts, with the poisoning rules of
/// docs/streams.md ("What failed work leaves behind") over every local rank at once: when a
/// send buffer it reads holds poisoned bytes, nothing is issued on any rank and every receive
/// buffer it writes takes that poison (one rank issued without the others would wait for them
/// until the timeout); when it fails, every receive buffer it writes is poisoned. `readRoot` /
/// `writeRoot`: only that rank's send / receive buffer is read / written (broadcast, reduce).
template <class F>
void poisonGuarded(CommunicatorState &s, const char *what, std::span<const Buffer> send,
                   uint64_t sendBytes, std::span<const Buffer> recv, uint64_t recvBytes,
                   std::optional<uint32_t> readRoot, std::optional<uint32_t> writeRoot,
                   F &&issue) {
    const auto reads = [&](size_t i) { return !readRoot || s.firstRank + i == *readRoot; };
    const auto writes = [&](size_t i) { return !writeRoot || s.firstRank + i == *writeRoot; };
    for (size_t i = 0; i < s.servers.size(); ++i) {
        if (!reads(i)) continue;
        const detail::Poison::Hit hit = detail::ComputeServer::poisonedIn(send[i], sendBytes);
        if (!hit.why) continue;
        for (size_t j = 0; j < s.servers.size(); ++j)
            if (writes(j)) detail::ComputeServer::poisonLike(recv[j], recvBytes, hit.why);
        detail::refuseDependent(hit, {},
                                std::string("Communicator::") + what + " (not issued; rank " +
                                    std::to_string(s.firstRank + i) + "'s send buffer)");
    }
    try {
        issue();
    } catch (const std::exception &e) {
        const std::string name = std::string("Communicator::") + what;
        for (size_t j = 0; j < s.servers.size(); ++j)
            if (writes(j)) s.servers[j]->poisonAfter(recv[j], recvBytes, s.stream(), name, e);
        throw;
    }
}

void broadcastParts(CommunicatorState &s, std::span<const Buffer> send,
                    std::span<const Buffer> recv, uint64_t count, DataType type, uint32_t root,
                    uint64_t bytes);
void allGatherParts(CommunicatorState &s, std::span<const Buffer> send,
                    std::span<const Buffer> recv, uint64_t count, DataType type, uint64_t bytes,
                    uint64_t total);
void reduceScatterParts(CommunicatorState &s, std::span<const Buffer> send,
                        std::span<const Buffer> recv, uint64_t count, DataType type, ReduceOp op,
                        uint64_t bytes, uint64_t total);

} // namespace

void Communicator::allReduce(std::span<const Buffer> send, std::span<const Buffer> recv,
                             uint64_t count, DataType type, ReduceOp op) {
    CommunicatorState &s = stateOf(state_, "allReduce");
    s.checkUsable("allReduce");
    checkOp(op, "allReduce");
    checkSpans(s, send, recv, "allReduce");
    const uint64_t bytes = bytesOf(count, type, 1, "allReduce");
    checkAllParts(s, BP_COLLECTIVE_ALL_REDUCE, send, bytes, recv, bytes, "allReduce");
    poisonGuarded(s, "allReduce", send, bytes, recv, bytes, {}, {}, [&] {
        if (!s.staged)
            return nativeAll(s, BP_COLLECTIVE_ALL_REDUCE, send, recv, count, type, op, 0, bytes,
                             bytes, "allReduce");
        const Bytes result = detail::reduceEverywhere(s, send, count, type, op);
        for (size_t i = 0; i < s.servers.size(); ++i)
            detail::writeAll(*s.servers[i], s.stream(), recv[i], result);
    });
}

void Communicator::reduce(std::span<const Buffer> send, std::span<const Buffer> recv,
                          uint64_t count, DataType type, ReduceOp op, uint32_t root) {
    CommunicatorState &s = stateOf(state_, "reduce");
    s.checkUsable("reduce");
    checkOp(op, "reduce");
    checkSpans(s, send, recv, "reduce");
    checkRoot(s, root, "reduce");
    const uint64_t bytes = bytesOf(count, type, 1, "reduce");
    checkAllParts(s, BP_COLLECTIVE_REDUCE, send, bytes, recv, bytes, "reduce");
    poisonGuarded(s, "reduce", send, bytes, recv, bytes, {}, root, [&] {
        if (!s.staged)
            return nativeAll(s, BP_COLLECTIVE_REDUCE, send, recv, count, type, op, root, bytes,
                             bytes, "reduce");
        // Staged: the reduction reaches every process (an all-reduce), only the root writes it.
        const Bytes result = detail::reduceEverywhere(s, send, count, type, op);
        if (isLocal(s, root)) {
            const size_t local = root - s.firstRank;
            detail::writeAll(*s.servers[local], s.stream(), recv[local], result);
        }
    });
}

void Communicator::broadcast(std::span<const Buffer> send, std::span<const Buffer> recv,
                             uint64_t count, DataType type, uint32_t root) {
    CommunicatorState &s = stateOf(state_, "broadcast");
    s.checkUsable("broadcast");
    checkSpans(s, send, recv, "broadcast");
    checkRoot(s, root, "broadcast");
    const uint64_t bytes = bytesOf(count, type, 1, "broadcast");
    checkAllParts(s, BP_COLLECTIVE_BROADCAST, send, bytes, recv, bytes, "broadcast");
    poisonGuarded(s, "broadcast", send, bytes, recv, bytes, root, {},
                  [&] { broadcastParts(s, send, recv, count, type, root, bytes); });
}

namespace {

/// broadcast() after its checks.
void broadcastParts(CommunicatorState &s, std::span<const Buffer> send,
                    std::span<const Buffer> recv, uint64_t count, DataType type, uint32_t root,
                    uint64_t bytes) {
    if (!s.staged)
        return nativeAll(s, BP_COLLECTIVE_BROADCAST, send, recv, count, type, ReduceOp::Sum, root,
                         bytes, bytes, "broadcast");
    Bytes data;
    if (isLocal(s, root)) {
        const size_t local = root - s.firstRank;
        data = detail::readAll(*s.servers[local], s.stream(), send[local], bytes);
    } else {
        data.assign(bytes, std::byte{0});
    }
    if (s.processCount > 1)
        data = detail::processCollective(s, BP_COLLECTIVE_BROADCAST, type, ReduceOp::Sum,
                                         s.processOfRank[root], data, count, bytes);
    for (size_t i = 0; i < s.servers.size(); ++i)
        detail::writeAll(*s.servers[i], s.stream(), recv[i], data);
}

/// allGather() after its checks.
void allGatherParts(CommunicatorState &s, std::span<const Buffer> send,
                    std::span<const Buffer> recv, uint64_t count, DataType type, uint64_t bytes,
                    uint64_t total) {
    if (!s.staged)
        return nativeAll(s, BP_COLLECTIVE_ALL_GATHER, send, recv, count, type, ReduceOp::Sum, 0,
                         bytes, total, "allGather");
    // Each process fills its ranks' parts; a byte-wise sum over processes (zeros elsewhere)
    // assembles the whole without a variable-size gather.
    Bytes whole(total, std::byte{0});
    for (size_t i = 0; i < s.servers.size(); ++i) {
        const Bytes part = detail::readAll(*s.servers[i], s.stream(), send[i], bytes);
        if (bytes != 0) std::memcpy(whole.data() + (s.firstRank + i) * bytes, part.data(), bytes);
    }
    if (s.processCount > 1)
        whole = detail::processCollective(s, BP_COLLECTIVE_ALL_REDUCE, DataType::U8, ReduceOp::Sum,
                                          0, whole, total, total);
    for (size_t i = 0; i < s.servers.size(); ++i)
        detail::writeAll(*s.servers[i], s.stream(), recv[i], whole);
}

/// reduceScatter() after its checks.
void reduceScatterParts(CommunicatorState &s, std::span<const Buffer> send,
                        std::span<const Buffer> recv, uint64_t count, DataType type, ReduceOp op,
                        uint64_t bytes, uint64_t total) {
    if (!s.staged)
        return nativeAll(s, BP_COLLECTIVE_REDUCE_SCATTER, send, recv, count, type, op, 0, total,
                         bytes, "reduceScatter");
    const Bytes whole = detail::reduceEverywhere(s, send, count * s.worldSize, type, op);
    for (size_t i = 0; i < s.servers.size(); ++i) {
        if (bytes == 0) continue;
        s.servers[i]->write(s.stream(), recv[i], 0, whole.data() + (s.firstRank + i) * bytes,
                            bytes);
    }
}

} // namespace

void Communicator::allGather(std::span<const Buffer> send, std::span<const Buffer> recv,
                             uint64_t count, DataType type) {
    CommunicatorState &s = stateOf(state_, "allGather");
    s.checkUsable("allGather");
    checkSpans(s, send, recv, "allGather");
    const uint64_t bytes = bytesOf(count, type, 1, "allGather");
    const uint64_t total = bytesOf(count, type, s.worldSize, "allGather");
    checkAllParts(s, BP_COLLECTIVE_ALL_GATHER, send, bytes, recv, total, "allGather");
    poisonGuarded(s, "allGather", send, bytes, recv, total, {}, {},
                  [&] { allGatherParts(s, send, recv, count, type, bytes, total); });
}

void Communicator::reduceScatter(std::span<const Buffer> send, std::span<const Buffer> recv,
                                 uint64_t count, DataType type, ReduceOp op) {
    CommunicatorState &s = stateOf(state_, "reduceScatter");
    s.checkUsable("reduceScatter");
    checkOp(op, "reduceScatter");
    checkSpans(s, send, recv, "reduceScatter");
    const uint64_t bytes = bytesOf(count, type, 1, "reduceScatter");
    const uint64_t total = bytesOf(count, type, s.worldSize, "reduceScatter");
    checkAllParts(s, BP_COLLECTIVE_REDUCE_SCATTER, send, total, recv, bytes, "reduceScatter");
    poisonGuarded(s, "reduceScatter", send, total, recv, bytes, {}, {},
                  [&] { reduceScatterParts(s, send, recv, count, type, op, bytes, total); });
}

namespace {

/// Every engine: a send or recv between two ranks of this process waits for the outermost
/// groupEnd, which issues it only when all of them pair up.
void holdLocalP2p(CommunicatorState &s, CommunicatorState::LocalP2p p2p, const char *what) {
    if (s.groupDepth == 0)
        detail::invalid(std::string("Communicator::") + what,
                        "ranks " + std::to_string(p2p.from) + " and " + std::to_string(p2p.to) +
                            " are both of this process: put the send and the recv in one group "
                            "(groupStart ... groupEnd), as NCCL requires when one thread drives "
                            "both");
    s.localP2p.push_back(std::move(p2p));
}

/// The held sends and recvs pair up exactly (each send with a recv of the same size, in order).
void checkLocalPairs(const std::vector<CommunicatorState::LocalP2p> &held) {
    // A message is its element count and type: every engine pairs on both (the Gloo engine
    // refuses a recv of another type at run time, and loses the communicator doing so).
    using Message = std::pair<uint64_t, int>;
    std::map<std::pair<uint32_t, uint32_t>, std::pair<std::vector<Message>, std::vector<Message>>>
        pairs;
    for (const auto &p : held) {
        const Message m{p.args.count, static_cast<int>(p.args.type)};
        (p.sending ? pairs[{p.from, p.to}].first : pairs[{p.from, p.to}].second).push_back(m);
    }
    for (const auto &[key, sides] : pairs)
        if (sides.first != sides.second)
            detail::invalid("Communicator::groupEnd",
                            "rank " + std::to_string(key.first) + " sends " +
                                std::to_string(sides.first.size()) + " message(s) to rank " +
                                std::to_string(key.second) + ", which receives " +
                                std::to_string(sides.second.size()) +
                                " (or their counts or types differ); nothing of the group's "
                                "point-to-point operations between ranks of this process was "
                                "issued");
}

/// checkPart of a send or recv: when called, and again at groupEnd for one held until then (its
/// stream may record by then).
void checkPointToPoint(CommunicatorState &s, const CommunicatorState::LocalP2p &p) {
    const Buffer *buffer = &p.buffer;
    checkPart(s, p.local, p.stream, p.args.op, p.sending ? buffer : nullptr,
              p.sending ? p.bytes : 0, p.sending ? nullptr : buffer, p.sending ? 0 : p.bytes,
              p.sending ? "Communicator::send" : "Communicator::recv");
}

/// Runs the held local sends and recvs of a staged group, which pair up: every send's bytes
/// are read first (a recv may come before its send in the group), then every recv writes the
/// bytes of its pair's next send.
void runStagedLocal(CommunicatorState &s, const std::vector<CommunicatorState::LocalP2p> &held) {
    std::map<std::pair<uint32_t, uint32_t>, std::deque<Bytes>> sent;
    for (const auto &p : held)
        if (p.sending)
            sent[{p.from, p.to}].push_back(
                detail::readAll(*s.servers[p.local], p.stream, p.buffer, p.bytes));
    for (const auto &p : held) {
        if (p.sending) continue;
        std::deque<Bytes> &queue = sent[{p.from, p.to}];
        detail::writeAll(*s.servers[p.local], p.stream, p.buffer, queue.front());
        queue.pop_front();
    }
}

void checkPeer(const CommunicatorState &s, uint32_t peer, size_t local, const char *what) {
    if (local >= s.servers.size())
        detail::invalid(std::string("Communicator::") + what,
                        "local device " + std::to_string(local) + " of " +
                            std::to_string(s.servers.size()));
    checkRoot(s, peer, what);
    if (peer == s.firstRank + local)
        detail::invalid(std::string("Communicator::") + what,
                        "rank " + std::to_string(peer) + " cannot send to or receive from itself");
}

/// A send (`sending`) or recv of local device `local`, checked now on every engine. To a rank
/// of this process: held for groupEnd's pairing. To another process's rank: native, issued now
/// (inside a group the plugin holds it); staged, through the process communicator, at groupEnd
/// inside a group.
void pointToPoint(CommunicatorState &s, bool sending, const Buffer &buffer, uint64_t count,
                  DataType type, uint32_t peer, size_t local) {
    const char *verb = sending ? "send" : "recv";
    s.checkUsable(verb);
    checkPeer(s, peer, local, verb);
    const uint64_t bytes = bytesOf(count, type, 1, verb);
    const StreamId stream = s.stream();
    CommunicatorState::LocalP2p p2p;
    const uint32_t me = s.firstRank + static_cast<uint32_t>(local);
    p2p.from = sending ? me : peer;
    p2p.to = sending ? peer : me;
    p2p.bytes = bytes;
    p2p.sending = sending;
    p2p.local = local;
    p2p.buffer = buffer;
    p2p.stream = stream;
    p2p.args = detail::collectiveArgs(sending ? BP_COLLECTIVE_SEND : BP_COLLECTIVE_RECV, type,
                              ReduceOp::Sum, peer, count);
    checkPointToPoint(s, p2p);
    if (s.processOfRank[peer] == s.process) return holdLocalP2p(s, std::move(p2p), verb);

    const std::string what = std::string("Communicator::") + verb;
    if (!s.staged) {
        s.servers[local]->collective(stream, s.comms[local].get(), p2p.args,
                                     sending ? &buffer : nullptr, sending ? bytes : 0,
                                     sending ? nullptr : &buffer, sending ? 0 : bytes, what);
        return;
    }
    const uint32_t process = s.processOfRank[peer];
    if (sending) {
        Bytes data = detail::readAll(*s.servers[local], stream, buffer, bytes);
        if (s.groupDepth == 0) {
            detail::processCollective(s, BP_COLLECTIVE_SEND, type, ReduceOp::Sum, process, data,
                                      count, 0);
            return;
        }
        // Its buffers live until the group ended (see ProcessPending).
        auto pending = std::make_shared<detail::ProcessPending>();
        s.deferred.push_back({[&s, pending, type, process, count, data = std::move(data)] {
                                  *pending = detail::postProcess(s, BP_COLLECTIVE_SEND, type,
                                                                 ReduceOp::Sum, process, data,
                                                                 count, 0);
                              },
                              [pending] { *pending = {}; }});
        return;
    }
    if (s.groupDepth == 0) {
        detail::writeAll(*s.servers[local], stream, buffer,
                         detail::processCollective(s, BP_COLLECTIVE_RECV, type, ReduceOp::Sum,
                                                   process, Bytes{}, count, bytes));
        return;
    }
    auto pending = std::make_shared<detail::ProcessPending>();
    s.deferred.push_back(
        {[&s, pending, type, process, count, bytes] {
             *pending = detail::postProcess(s, BP_COLLECTIVE_RECV, type, ReduceOp::Sum, process,
                                            Bytes{}, count, bytes);
         },
         [&s, pending, buffer, local, stream] {
             detail::writeAll(*s.servers[local], stream, buffer,
                              detail::finishProcess(s, *pending));
         }});
}

/// The staged group's operations with other processes: every post inside one group of the
/// host plugin, then every finish in order.
void runStagedRemote(CommunicatorState &s, std::vector<CommunicatorState::Deferred> &runs) {
    const bool posts = std::any_of(runs.begin(), runs.end(),
                                   [](const CommunicatorState::Deferred &d) { return !!d.post; });
    if (posts) {
        detail::Driver &host = s.hostServer->driver();
        host.commGroup(true);
        try {
            for (auto &run : runs)
                if (run.post) run.post();
        } catch (...) {
            host.commGroup(false);
            throw;
        }
        host.commGroup(false);
    }
    for (auto &run : runs)
        if (run.finish) run.finish();
}

} // namespace

void Communicator::send(const Buffer &buffer, uint64_t count, DataType type, uint32_t peer,
                        size_t local) {
    pointToPoint(stateOf(state_, "send"), true, buffer, count, type, peer, local);
}

void Communicator::recv(const Buffer &buffer, uint64_t count, DataType type, uint32_t peer,
                        size_t local) {
    pointToPoint(stateOf(state_, "recv"), false, buffer, count, type, peer, local);
}

void Communicator::groupStart() {
    CommunicatorState &s = stateOf(state_, "groupStart");
    if (s.groupDepth == 0 && !s.staged) s.servers[0]->driver().commGroup(true);
    ++s.groupDepth;
}

void Communicator::groupEnd() {
    CommunicatorState &s = stateOf(state_, "groupEnd");
    if (s.groupDepth == 0) detail::invalid("Communicator::groupEnd", "no group is open");
    if (--s.groupDepth > 0) return;
    std::vector<CommunicatorState::LocalP2p> held = std::move(s.localP2p);
    s.localP2p.clear();
    std::vector<CommunicatorState::Deferred> runs = std::move(s.deferred);
    s.deferred.clear();
    // The local sends and recvs are checked as a whole before any of them runs; refused, none
    // runs, and the rest of the group (collectives, operations with other processes, which
    // those processes expect) is still issued before the refusal is thrown, as on NCCL.
    std::exception_ptr refused;
    try {
        checkLocalPairs(held);
        for (const auto &p : held) checkPointToPoint(s, p);
    } catch (...) {
        refused = std::current_exception();
        held.clear();
    }
    if (!s.staged) {
        detail::Driver &driver = s.servers[0]->driver();
        try {
            for (const auto &p : held) {
                const Buffer *buffer = &p.buffer;
                s.servers[p.local]->collective(
                    p.stream, s.comms[p.local].get(), p.args, p.sending ? buffer : nullptr,
                    p.sending ? p.bytes : 0, p.sending ? nullptr : buffer, p.sending ? 0 : p.bytes,
                    p.sending ? "Communicator::send" : "Communicator::recv");
            }
        } catch (...) {
            driver.commGroup(false);
            throw;
        }
        driver.commGroup(false);
    } else {
        runStagedRemote(s, runs);
        runStagedLocal(s, held);
    }
    if (refused) std::rethrow_exception(refused);
}

} // namespace backplane
