// What the built-in rendezvous share: the checked base class, limits, message wording, the TCP
// wire format, and the environment parsing behind a lookup function (so tests need no setenv).
#pragma once

#include <backplane/communicator.hpp>
#include <backplane/error.hpp>

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

/// Largest contribution of one process, and so the largest length a peer may announce: a
/// communicator id is a few hundred bytes, and a peer's garbage must not become an allocation.
inline constexpr uint64_t kMaxContributionBytes = uint64_t{64} << 20;

/// What a built-in rendezvous throws when a peer closed its connection, died or sent malformed
/// data.
inline constexpr ErrorCode kPeerFailed = ErrorCode::Remote;

/// "250 ms", "30 s", "1.5 s".
std::string formatDuration(std::chrono::milliseconds duration);

/// "process 2 of 4", "processes 1, 2 and 3 of 4"; at most 16 indices, then "and 5 more".
std::string formatProcesses(const std::vector<uint32_t> &processes, uint32_t processCount);

/// The base of the built-in rendezvous: checks the arguments every one shares (a positive
/// timeout, a contribution of at most kMaxContributionBytes) and makes the object unusable after
/// its first failure, so that no later step can pair up with another process's different step.
class CheckedRendezvous : public Rendezvous {
public:
    CheckedRendezvous(uint32_t process, uint32_t processCount, std::string what);
    uint32_t process() const override { return process_; }
    uint32_t processCount() const override { return processCount_; }
    std::vector<std::vector<std::byte>> allGather(std::span<const std::byte> mine,
                                                  std::chrono::milliseconds timeout) final;

protected:
    /// One step. `step` counts from 0, one per allGather call.
    virtual std::vector<std::vector<std::byte>>
    gather(std::span<const std::byte> mine, std::chrono::milliseconds timeout, uint64_t step) = 0;
    /// "tcp rendezvous at node0:29500": the start of every message.
    const std::string &what() const { return what_; }

private:
    uint32_t process_;
    uint32_t processCount_;
    std::string what_;
    uint64_t step_ = 0;
    std::optional<std::string> failure_;
};

/// "host:port" or "[v6addr]:port", port 1-65535.
struct TcpAddress {
    std::string host;
    uint16_t port = 0;
};
/// Throws Error(InvalidArgument) naming `address` and what is wrong with it.
TcpAddress parseTcpAddress(const std::string &address);

/// The TCP wire format: every integer little-endian. A peer (process > 0) sends Hello; process 0
/// answers Challenge, the peer checks it and sends Proof, and process 0 answers Welcome or Abort.
/// Each step: every peer sends Contribution, process 0 answers Result, or Abort when the step
/// failed (then closes). Every length is checked against a limit before anything is allocated,
/// and nothing before a Proof has a length at all: what a stranger can make process 0 read is
/// bounded by the fixed sizes of Hello and Proof.
///
/// The handshake proves to both sides that the other knows the job's token without sending it:
/// each side sends a fresh random nonce, and each answers with an HMAC-SHA256 keyed by the token
/// over both nonces, the process index and count, and a label per direction (so an answer can
/// neither be replayed on another connection nor reflected back to its sender).
namespace wire {
inline constexpr uint32_t kHelloMagic = 0x48525042;        // "BPRH"
inline constexpr uint32_t kChallengeMagic = 0x4e525042;    // "BPRN"
inline constexpr uint32_t kProofMagic = 0x50525042;        // "BPRP"
inline constexpr uint32_t kWelcomeMagic = 0x57525042;      // "BPRW"
inline constexpr uint32_t kContributionMagic = 0x43525042; // "BPRC"
inline constexpr uint32_t kResultMagic = 0x52525042;       // "BPRR"
inline constexpr uint32_t kAbortMagic = 0x41525042;        // "BPRA"
/// 2: the authenticated handshake. Version 1 (no token) peers are refused by name.
inline constexpr uint32_t kVersion = 2;
inline constexpr size_t kNonceBytes = 32;
inline constexpr size_t kMacBytes = 32;
using Nonce = std::array<std::byte, kNonceBytes>;
using Mac = std::array<std::byte, kMacBytes>;
/// Hello: magic u32, version u32, process u32, processCount u32 (the head, the same in every
/// version), then the peer's nonce.
inline constexpr size_t kHelloHeadBytes = 16;
inline constexpr size_t kHelloBytes = kHelloHeadBytes + kNonceBytes;
/// Challenge: magic u32, process 0's nonce, process 0's MAC.
inline constexpr size_t kChallengeBytes = 4 + kNonceBytes + kMacBytes;
/// Proof: magic u32, the peer's MAC.
inline constexpr size_t kProofBytes = 4 + kMacBytes;
/// Contribution: magic u32, step u64, size u64, then size bytes.
inline constexpr size_t kContributionHeaderBytes = 20;
/// Result: magic u32, step u64, count u32, then count times (size u64, size bytes).
/// Abort: magic u32, code u32 (an ErrorCode), length u32 (at most kMaxReasonBytes), the reason.
inline constexpr uint32_t kMaxReasonBytes = 4096;

/// Who computes a MAC: process 0 in its Challenge, a peer in its Proof.
enum class Side { Zero, Peer };
/// HMAC-SHA256(token, label(side) | peerNonce | zeroNonce | process | processCount).
Mac handshakeMac(std::string_view token, Side side, const Nonce &peerNonce, const Nonce &zeroNonce,
                 uint32_t process, uint32_t processCount);
/// Constant-time comparison.
bool sameMac(const std::byte *received, const Mac &expected);
/// Random bytes from the system's generator (OpenSSL's RAND_bytes).
Nonce freshNonce();

inline void appendU32(std::vector<std::byte> &out, uint32_t value) {
    for (int i = 0; i < 4; ++i)
        out.push_back(static_cast<std::byte>(value >> (8 * i)));
}
inline void appendU64(std::vector<std::byte> &out, uint64_t value) {
    for (int i = 0; i < 8; ++i)
        out.push_back(static_cast<std::byte>(value >> (8 * i)));
}
inline uint32_t readU32(const std::byte *in) {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i)
        value |= static_cast<uint32_t>(in[i]) << (8 * i);
    return value;
}
inline uint64_t readU64(const std::byte *in) {
    uint64_t value = 0;
    for (int i = 0; i < 8; ++i)
        value |= static_cast<uint64_t>(in[i]) << (8 * i);
    return value;
}
} // namespace wire

/// Reads one environment variable: nullptr when unset. The public functions pass ::getenv.
using EnvironmentLookup = std::function<const char *(const char *name)>;

/// Shortest token accepted: shorter secrets can be guessed offline from one recorded handshake.
inline constexpr size_t kMinTokenBytes = 16;
/// Throws Error(InvalidArgument) beginning with `what` when `token` is empty or too short, saying
/// how to make one.
void checkToken(const std::string &what, std::string_view token);
/// 32 random bytes as 64 hexadecimal digits: what `backplane token` prints.
std::string generateToken();

/// The job's token when the caller gave none, like Erlang's cookie: BACKPLANE_RENDEZVOUS_TOKEN,
/// else the user's token file (BACKPLANE_RENDEZVOUS_TOKEN_FILE, else
/// $XDG_CONFIG_HOME/backplane/rendezvous-token, else ~/.config/backplane/rendezvous-token),
/// created with a fresh token and mode 0600 on first use (the first creator wins when several
/// processes race). So the processes of one user on one machine, or on machines sharing the
/// home directory, agree without any setting, and nobody else can read it. `source` names where
/// the token came from, for messages. Throws Error(InvalidArgument) naming the file when it is
/// not a regular file of this user readable by this user only, or holds no token.
std::string defaultToken(const EnvironmentLookup &lookup, std::string &source);

/// A TCP rendezvous with everything resolved (the public tcpRendezvous reads the environment for
/// what its options leave empty).
/// `tokenSource` says where the token came from, for messages.
std::unique_ptr<Rendezvous> tcpRendezvous(const std::string &address, uint32_t process,
                                          uint32_t processCount,
                                          std::chrono::milliseconds connectTimeout,
                                          const std::string &token, const std::string &bind,
                                          const std::string &tokenSource = "the caller");

LaunchEnvironment launchEnvironment(const EnvironmentLookup &lookup);
std::unique_ptr<Rendezvous> rendezvousFromEnvironment(const EnvironmentLookup &lookup,
                                                      std::chrono::milliseconds connectTimeout);

} // namespace backplane::detail
