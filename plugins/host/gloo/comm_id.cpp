// Communicator ids of the host plugin and the choice of the collectives' address.
#include "comm_id.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <random>

namespace backplane::host {
namespace {

constexpr unsigned char kMagic[4] = {'B', 'P', 'G', 'L'};
constexpr uint16_t kVersion = 1;

[[noreturn]] void invalidId(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                     "comm_create: the communicator id " + message +
                         "; pass the bytes comm_id_create of the host plugin made, unchanged");
}

bool hostCharacter(char c) {
    // Host names, IPv4 and IPv6 literals (with a zone: fe80::1%eth0).
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == ':' || c == '%' || c == '_';
}

void putU16(std::vector<unsigned char> &out, uint16_t value) {
    out.push_back(static_cast<unsigned char>(value & 0xff));
    out.push_back(static_cast<unsigned char>(value >> 8));
}

uint16_t getU16(const unsigned char *p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }

std::string environment(const char *name) {
    const char *value = std::getenv(name);
    return value != nullptr ? std::string(value) : std::string();
}

/// Checks an address or interface name given by the environment (the options were checked when
/// they were parsed).
std::string checkedName(const std::string &value, const char *variable) {
    bool ok = !value.empty() && value.size() <= 255;
    for (const char c : value)
        ok = ok && c > ' ' && c <= '~';
    if (!ok)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         std::string(variable) + "='" + value +
                             "' is not an address or interface name (1 to 255 printable "
                             "characters, no spaces); fix or unset it");
    return value;
}

} // namespace

std::vector<unsigned char> encodeCommId(const CommId &id) {
    std::vector<unsigned char> out(std::begin(kMagic), std::end(kMagic));
    putU16(out, kVersion);
    out.push_back(static_cast<unsigned char>(id.host.size()));
    out.push_back(0);
    out.insert(out.end(), id.nonce.begin(), id.nonce.end());
    putU16(out, id.port);
    out.insert(out.end(), id.host.begin(), id.host.end());
    return out;
}

CommId decodeCommId(const void *bytes, size_t size) {
    if (bytes == nullptr || size < kCommIdHeaderBytes)
        invalidId("has " + std::to_string(bytes == nullptr ? 0 : size) +
                  " bytes; a host plugin id has at least " + std::to_string(kCommIdHeaderBytes));
    const auto *p = static_cast<const unsigned char *>(bytes);
    if (std::memcmp(p, kMagic, sizeof(kMagic)) != 0)
        invalidId("does not start with the host plugin's magic \"BPGL\" (made by another plugin?)");
    if (const uint16_t version = getU16(p + 4); version != kVersion)
        invalidId("has version " + std::to_string(version) + "; this host plugin reads version " +
                  std::to_string(kVersion));
    const size_t hostLength = p[6];
    if (p[7] != 0) invalidId("has a nonzero reserved byte");
    if (hostLength == 0 || size != kCommIdHeaderBytes + hostLength)
        invalidId("has " + std::to_string(size) + " bytes but its header announces " +
                  std::to_string(kCommIdHeaderBytes + hostLength));
    CommId id;
    std::memcpy(id.nonce.data(), p + 8, id.nonce.size());
    id.port = getU16(p + 24);
    if (id.port == 0) invalidId("names port 0");
    id.host.assign(reinterpret_cast<const char *>(p + kCommIdHeaderBytes), hostLength);
    for (const char c : id.host)
        if (!hostCharacter(c)) invalidId("names a store address with invalid characters");
    return id;
}

std::array<uint8_t, 16> randomNonce() {
    std::array<uint8_t, 16> nonce{};
    try {
        std::random_device source;
        for (size_t i = 0; i < nonce.size(); i += 4) {
            const uint32_t word = source();
            std::memcpy(nonce.data() + i, &word, 4);
        }
    } catch (const std::exception &e) {
        throw sdk::Error(BP_ERROR_INTERNAL,
                         std::string("comm_id_create: no random source for the id's nonce: ") +
                             e.what());
    }
    return nonce;
}

std::string nonceHex(const std::array<uint8_t, 16> &nonce) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string text;
    for (const uint8_t b : nonce) {
        text += kDigits[b >> 4];
        text += kDigits[b & 15];
    }
    return text;
}

std::string endpointText(const std::string &host, uint16_t port) {
    const bool ipv6 = host.find(':') != std::string::npos;
    return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

std::string configuredAddress(const HostOptions &options, std::string &source) {
    if (std::string value = environment("BACKPLANE_GLOO_ADDRESS"); !value.empty()) {
        source = "BACKPLANE_GLOO_ADDRESS";
        return checkedName(value, "BACKPLANE_GLOO_ADDRESS");
    }
    if (!options.collectivesAddress.empty()) {
        source = "the host plugin option collectives.address";
        return options.collectivesAddress;
    }
    source = "the host name";
    return {};
}

std::string configuredInterface(const HostOptions &options) {
    if (std::string value = environment("BACKPLANE_GLOO_INTERFACE"); !value.empty())
        return checkedName(value, "BACKPLANE_GLOO_INTERFACE");
    return options.collectivesInterface;
}

std::string hostNameAddress() {
    char name[HOST_NAME_MAX + 1] = {};
    if (gethostname(name, sizeof(name) - 1) != 0 || name[0] == '\0') return {};
    std::string found;
    for (const int family : {AF_INET, AF_INET6}) {
        addrinfo hints{};
        hints.ai_family = family;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo *list = nullptr;
        if (getaddrinfo(name, nullptr, &hints, &list) != 0 || list == nullptr) continue;
        char text[NI_MAXHOST] = {};
        if (getnameinfo(list->ai_addr, list->ai_addrlen, text, sizeof(text), nullptr, 0,
                        NI_NUMERICHOST) == 0)
            found = text;
        freeaddrinfo(list);
        if (!found.empty()) break;
    }
    return found;
}

} // namespace backplane::host
