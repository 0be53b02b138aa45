// Writing and reading a process's description of its ranks; the reader goes through the bounded
// JSON reader and checks every value's type and range itself, because nlohmann's get<> converts
// booleans, floats and out-of-range integers without a word (true -> 1, 2^40 -> 0, -1 -> 2^32-1).
#include "comm/peer_description.hpp"

#include <backplane/error.hpp>

#include <algorithm>
#include <cctype>

namespace backplane::detail {
namespace {

using Json = nlohmann::json;

/// "Communicator::create: process 3's description of its ranks": the start of every message,
/// and parseJson's origin.
std::string originOf(uint32_t process) {
    return "Communicator::create: process " + std::to_string(process) +
           "'s description of its ranks";
}

[[noreturn]] void refuse(uint32_t process, const std::string &pointer, const std::string &why) {
    throw Error(ErrorCode::Remote, originOf(process) + ": " + pointer + ": " + why +
                                       "; every process must run the same backplane version");
}

/// "boolean true", "string \"1\"", "the integer 7", "an array": what a peer sent where something
/// else was expected, cut short (a peer's text is never echoed whole).
std::string describe(const Json &value) {
    // dumpJson escapes control characters; the cut goes back to the start of a UTF-8 character
    // so the message never ends in half of one (review finding).
    std::string text = dumpJson(value);
    if (text.size() > 32) {
        size_t cut = 32;
        while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xC0) == 0x80) --cut;
        text = text.substr(0, cut) + "…";
    }
    if (value.is_null()) return "null";
    if (value.is_boolean()) return "boolean " + text;
    if (value.is_string()) return "string " + text;
    if (value.is_number_float()) return "a floating-point number " + text;
    if (value.is_number()) return "the integer " + text;
    return value.is_array() ? "an array" : "an object";
}

const Json &field(const Json &root, const char *key, uint32_t process) {
    const auto it = root.find(key);
    if (it == root.end()) refuse(process, "/", std::string("no \"") + key + "\"");
    return *it;
}

uint32_t rankCount(const Json &value, uint32_t process) {
    const std::string range = "1 to " + std::to_string(kMaxRanksPerProcess);
    if (!value.is_number_integer())
        refuse(process, "/ranks", describe(value) + "; expected an integer " + range);
    // number_unsigned for every integer >= 0, number_integer for negative ones.
    if (!value.is_number_unsigned() || value.get<uint64_t>() == 0 ||
        value.get<uint64_t>() > kMaxRanksPerProcess)
        refuse(process, "/ranks", dumpJson(value) + " ranks; expected " + range);
    return static_cast<uint32_t>(value.get<uint64_t>());
}

/// The array at `key`, of exactly `ranks` entries.
const Json &rankList(const Json &root, const char *key, uint32_t ranks, uint32_t process) {
    const Json &list = field(root, key, process);
    const std::string pointer = std::string("/") + key;
    if (!list.is_array())
        refuse(process, pointer, describe(list) + "; expected an array, one entry per rank");
    if (list.size() != ranks)
        refuse(process, pointer,
               std::to_string(list.size()) + " entries for " + std::to_string(ranks) +
                   " rank(s); expected one per rank");
    return list;
}

} // namespace

std::string writePeerDescription(const PeerDescription &description) {
    Json out = {{"ranks", description.ranks},
                {"plugins", description.plugins},
                {"collectives", Json::array()},
                {"force_staged", description.forceStaged}};
    for (const bool c : description.collectives)
        out["collectives"].push_back(c);
    return dumpJson(out);
}

PeerDescription parsePeerDescription(std::string_view text, uint32_t process) {
    const Json root =
        parseJson(text, originOf(process), kPeerDescriptionJsonLimits, ErrorCode::Remote);
    if (!root.is_object()) refuse(process, "/", describe(root) + "; expected an object");
    for (const auto &item : root.items()) {
        const std::string &key = item.key();
        if (key != "ranks" && key != "plugins" && key != "collectives" && key != "force_staged")
            refuse(process, "/" + pointerToken(key.substr(0, 64)), "an unknown key");
    }
    PeerDescription d;
    d.ranks = rankCount(field(root, "ranks", process), process);
    const Json &plugins = rankList(root, "plugins", d.ranks, process);
    for (size_t r = 0; r < plugins.size(); ++r) {
        const Json &name = plugins[r];
        const std::string pointer = "/plugins/" + std::to_string(r);
        if (!name.is_string())
            refuse(process, pointer, describe(name) + "; expected a plugin name");
        const auto &value = name.get_ref<const std::string &>();
        if (value.empty() || value.size() > kMaxPeerPluginNameBytes)
            refuse(process, pointer,
                   "a plugin name of " + std::to_string(value.size()) + " bytes; expected 1 to " +
                       std::to_string(kMaxPeerPluginNameBytes));
        // Plugin names are identifiers (manifests allow letters, digits, '_', '-' and '.'):
        // nothing a log line or a message could be garbled by (review finding: "ho\nst\u0000").
        for (const char c : value)
            if (!std::isalnum(static_cast<unsigned char>(c)) && c != '_' && c != '-' && c != '.')
                refuse(process, pointer,
                       describe(name) + "; a plugin name has only letters, digits, '_', '-' "
                                        "and '.'");
        d.plugins.push_back(value);
    }
    const Json &collectives = rankList(root, "collectives", d.ranks, process);
    for (size_t r = 0; r < collectives.size(); ++r) {
        if (!collectives[r].is_boolean())
            refuse(process, "/collectives/" + std::to_string(r),
                   describe(collectives[r]) + "; expected true or false");
        d.collectives.push_back(collectives[r].get<bool>());
    }
    const Json &forceStaged = field(root, "force_staged", process);
    if (!forceStaged.is_boolean())
        refuse(process, "/force_staged", describe(forceStaged) + "; expected true or false");
    d.forceStaged = forceStaged.get<bool>();
    return d;
}

} // namespace backplane::detail
