// Names and shapes of the ABI's collective operations, for the host plugin and its Gloo module.
#pragma once

#include <backplane/abi/plugin.h>

#include <cstdint>

namespace backplane::host {

/// "all_reduce", "send", ...: the operation's name in messages.
inline const char *collectiveName(uint32_t op) {
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
    default:
        return "collective";
    }
}

/// Whether the operation combines the ranks' values (and so takes a bp_reduce_op).
inline bool reduces(uint32_t op) {
    return op == BP_COLLECTIVE_ALL_REDUCE || op == BP_COLLECTIVE_REDUCE ||
           op == BP_COLLECTIVE_REDUCE_SCATTER;
}

/// Whether the operation names a root or a peer.
inline bool hasPeer(uint32_t op) {
    return op == BP_COLLECTIVE_REDUCE || op == BP_COLLECTIVE_BROADCAST ||
           op == BP_COLLECTIVE_SEND || op == BP_COLLECTIVE_RECV;
}

} // namespace backplane::host
