// The TCP rendezvous's proof of membership: the job's token, the handshake's nonces and MACs.
// The cryptography is OpenSSL's (HMAC-SHA256, RAND_bytes, CRYPTO_memcmp); nothing is written
// here but the order of the bytes.
#include "comm/rendezvous_detail.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <cstring>

#include <cstdio>

namespace backplane::detail {

namespace wire {

namespace {

/// One label per direction: process 0's answer is never a valid proof and the other way round.
constexpr std::string_view kZeroLabel = "backplane rendezvous 2: process 0";
constexpr std::string_view kPeerLabel = "backplane rendezvous 2: peer";

} // namespace

Mac handshakeMac(std::string_view token, Side side, const Nonce &peerNonce, const Nonce &zeroNonce,
                 uint32_t process, uint32_t processCount) {
    const std::string_view label = side == Side::Zero ? kZeroLabel : kPeerLabel;
    std::vector<std::byte> message(label.size());
    std::memcpy(message.data(), label.data(), label.size());
    message.insert(message.end(), peerNonce.begin(), peerNonce.end());
    message.insert(message.end(), zeroNonce.begin(), zeroNonce.end());
    appendU32(message, process);
    appendU32(message, processCount);
    Mac mac{};
    unsigned length = 0;
    const unsigned char *done =
        ::HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()),
               reinterpret_cast<const unsigned char *>(message.data()), message.size(),
               reinterpret_cast<unsigned char *>(mac.data()), &length);
    if (done == nullptr || length != mac.size())
        throw Error(ErrorCode::Internal, "rendezvous handshake: OpenSSL's HMAC-SHA256 failed");
    return mac;
}

bool sameMac(const std::byte *received, const Mac &expected) {
    return ::CRYPTO_memcmp(received, expected.data(), expected.size()) == 0;
}

Nonce freshNonce() {
    Nonce nonce{};
    if (::RAND_bytes(reinterpret_cast<unsigned char *>(nonce.data()),
                     static_cast<int>(nonce.size())) != 1)
        throw Error(ErrorCode::Internal,
                    "rendezvous handshake: OpenSSL's random generator has no entropy");
    return nonce;
}

} // namespace wire

void checkToken(const std::string &what, std::string_view token) {
    const std::string how = "set BACKPLANE_RENDEZVOUS_TOKEN to the same secret in every process of "
                            "the job (`export BACKPLANE_RENDEZVOUS_TOKEN=$(backplane token)` "
                            "before starting them), or pass TcpRendezvousOptions::token";
    if (token.empty())
        throw Error(ErrorCode::InvalidArgument,
                    what + ": no token, so nothing would keep other programs out: " + how);
    if (token.size() < kMinTokenBytes)
        throw Error(ErrorCode::InvalidArgument,
                    what + ": the token has " + std::to_string(token.size()) +
                        " bytes, fewer than " + std::to_string(kMinTokenBytes) +
                        " (a short secret can be guessed from one recorded handshake): " + how);
}

std::string generateToken() {
    const wire::Nonce bytes = wire::freshNonce();
    std::string text;
    for (const std::byte b : bytes) {
        char digits[3];
        std::snprintf(digits, sizeof digits, "%02x", static_cast<unsigned>(b));
        text += digits;
    }
    return text;
}

} // namespace backplane::detail
