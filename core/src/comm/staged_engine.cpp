// The Communicator's staged engine: collectives through host memory, reduced on the host, and
// between processes on the collectives of a CPU device (the host plugin's Gloo).
#include "comm/communicator_state.hpp"
#include "comm/host_reduce.hpp"

#include <algorithm>

namespace backplane::detail {

/// The bytes of `buffer` (count elements), read on the current stream.
Bytes readAll(ComputeServer &server, StreamId stream, const Buffer &buffer, uint64_t bytes) {
    Bytes out(bytes);
    if (bytes != 0) server.readInto(stream, buffer, 0, out.data(), bytes);
    return out;
}

void writeAll(ComputeServer &server, StreamId stream, const Buffer &buffer, const Bytes &data,
              uint64_t offset, uint64_t bytes) {
    if (bytes == UINT64_MAX) bytes = data.size() - offset;
    if (bytes != 0) server.write(stream, buffer, 0, data.data() + offset, bytes);
}

/// Records one collective of the process communicator over `data` (host memory) on the host
/// plugin; finishProcess reads its result.
ProcessPending postProcess(CommunicatorState &s, bp_collective op, DataType type, ReduceOp reduce,
                           uint32_t peer, const Bytes &data, uint64_t count, uint64_t recvBytes) {
    ComputeServer &host = *s.hostServer;
    const StreamId stream = s.stream();
    const uint64_t sendBytes = data.size();
    Buffer send = host.empty(stream, std::max<uint64_t>(sendBytes, 1));
    Buffer recv = host.empty(stream, std::max<uint64_t>(recvBytes, 1));
    if (sendBytes != 0) host.write(stream, send, 0, data.data(), sendBytes);
    host.collective(stream, s.processComm.get(), collectiveArgs(op, type, reduce, peer, count),
                    &send, sendBytes, &recv, recvBytes,
                    "staged collective between processes");
    return {send, recv, recvBytes};
}

Bytes finishProcess(CommunicatorState &s, const ProcessPending &pending) {
    return readAll(*s.hostServer, s.stream(), pending.recv, pending.recvBytes);
}

/// postProcess, then its result.
Bytes processCollective(CommunicatorState &s, bp_collective op, DataType type, ReduceOp reduce,
                        uint32_t peer, const Bytes &data, uint64_t count, uint64_t recvBytes) {
    return finishProcess(s, postProcess(s, op, type, reduce, peer, data, count, recvBytes));
}

// Avg: summed everywhere, divided by the world size once at the end.
Bytes reduceEverywhere(CommunicatorState &s, std::span<const Buffer> send, uint64_t count,
                       DataType type, ReduceOp op) {
    const uint64_t bytes = count * sizeOf(type);
    const ReduceOp partial = op == ReduceOp::Avg ? ReduceOp::Sum : op;
    Bytes acc = readAll(*s.servers[0], s.stream(), send[0], bytes);
    for (size_t i = 1; i < send.size(); ++i)
        reduceInto(acc, readAll(*s.servers[i], s.stream(), send[i], bytes), type, partial);
    if (s.processCount > 1)
        acc = processCollective(s, BP_COLLECTIVE_ALL_REDUCE, type, partial, 0, acc, count, bytes);
    if (op == ReduceOp::Avg) divideBy(acc, type, s.worldSize);
    return acc;
}

} // namespace backplane::detail
