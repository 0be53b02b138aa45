// What each process of a communicator tells the others about its ranks (the first rendezvous
// step), written and read in one place; the reader takes another process's bytes as untrusted.
#pragma once

#include "input/json_input.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

/// Most ranks one process may describe (its local devices). Far above any machine's device count;
/// low enough that a peer's number never becomes a large allocation.
inline constexpr uint32_t kMaxRanksPerProcess = 4096;
/// Longest plugin name in a description: a manifest's name has at most 64 bytes.
inline constexpr size_t kMaxPeerPluginNameBytes = 64;
/// A description is one object holding two arrays (depth 2): at most kMaxRanksPerProcess names
/// of kMaxPeerPluginNameBytes and as many booleans fit well within 1 MiB.
inline constexpr JsonLimits kPeerDescriptionJsonLimits{1u << 20, 4};

/// One process's ranks, as it describes them to the others.
struct PeerDescription {
    uint32_t ranks = 0;               ///< 1 to kMaxRanksPerProcess
    std::vector<std::string> plugins; ///< per local rank: its plugin's name
    std::vector<bool> collectives;    ///< per local rank: the plugin has an engine for it
    bool forceStaged = false;         ///< CommunicatorOptions::forceStaged of that process
};

/// The bytes this process sends: a JSON object {"ranks", "plugins", "collectives",
/// "force_staged"}. `description` must be valid (parsePeerDescription accepts the result).
std::string writePeerDescription(const PeerDescription &description);

/// Reads what process `process` sent. Every malformed description (not JSON, larger than
/// kPeerDescriptionJsonLimits.maxBytes, nested deeper, duplicate or unknown keys, a missing
/// field, a value of the wrong type, a rank count out of 1..kMaxRanksPerProcess, lists whose
/// length is not the rank count, a plugin name that is empty or longer than
/// kMaxPeerPluginNameBytes) throws Error(Remote) whose message names the process, the JSON pointer
/// of the bad value and what is wrong. Never throws anything else but std::bad_alloc.
PeerDescription parsePeerDescription(std::string_view text, uint32_t process);

} // namespace backplane::detail
