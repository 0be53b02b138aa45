// Communicator ids of the host plugin (the bytes comm_id_create makes) and the collectives'
// address.
#pragma once

#include "../host_options.hpp"

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace backplane::host {

/// What a host communicator id says: where its rendezvous store listens and which communicator
/// it is (the nonce: random, so ids made in different processes never collide).
struct CommId {
    std::array<uint8_t, 16> nonce{};
    std::string host; ///< numeric address or host name of the store, 1..255 printable characters
    uint16_t port = 0;
};

/// Id layout, all integers little-endian: "BPGL" magic, u16 version (1), u8 host length, u8 zero,
/// 16 nonce bytes, u16 port, then the host characters. Size is exactly 26 + host length.
inline constexpr size_t kCommIdHeaderBytes = 26;

/// The id bytes of `id`.
std::vector<unsigned char> encodeCommId(const CommId &id);

/// Reads id bytes strictly. Throws sdk::Error(BP_ERROR_INVALID_ARGUMENT) saying what is wrong
/// (size, magic, version, port, host characters): an id of another plugin or a corrupted one.
CommId decodeCommId(const void *bytes, size_t size);

/// 16 random bytes from the system's entropy source (std::random_device).
std::array<uint8_t, 16> randomNonce();

/// The nonce as 32 lowercase hex digits (the key prefix of the communicator in its store).
std::string nonceHex(const std::array<uint8_t, 16> &nonce);

/// "host:port", with brackets around an IPv6 address.
std::string endpointText(const std::string &host, uint16_t port);

/// Where the collectives of this process listen: the environment's BACKPLANE_GLOO_ADDRESS, else
/// the options' "collectives.address"; "" when neither is set (then the host name's address is
/// used, falling back to 127.0.0.1). `source` receives where the value came from, for messages.
std::string configuredAddress(const HostOptions &options, std::string &source);

/// The interface Gloo's TCP device binds to: BACKPLANE_GLOO_INTERFACE, else the options'
/// "collectives.interface"; "" when neither is set.
std::string configuredInterface(const HostOptions &options);

/// The first address of this machine's host name (IPv4 preferred), as numeric text; "" when the
/// name does not resolve.
std::string hostNameAddress();

} // namespace backplane::host
