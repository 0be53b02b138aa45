// What the built-in rendezvous share: the checked base class, limits, message wording, the TCP
// wire format, and the environment parsing behind a lookup function (so tests need no setenv).
#pragma once

#include <backplane/communicator.hpp>
#include <backplane/error.hpp>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
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

/// The TCP wire format: every integer little-endian. A peer (process > 0) sends Hello, process 0
/// answers Welcome or Abort. Each step: every peer sends Contribution, process 0 answers Result,
/// or Abort when the step failed (then closes). Every length is checked against a limit before
/// anything is allocated.
namespace wire {
inline constexpr uint32_t kHelloMagic = 0x48525042;        // "BPRH"
inline constexpr uint32_t kWelcomeMagic = 0x57525042;      // "BPRW"
inline constexpr uint32_t kContributionMagic = 0x43525042; // "BPRC"
inline constexpr uint32_t kResultMagic = 0x52525042;       // "BPRR"
inline constexpr uint32_t kAbortMagic = 0x41525042;        // "BPRA"
inline constexpr uint32_t kVersion = 1;
/// Hello: magic u32, version u32, process u32, processCount u32.
inline constexpr size_t kHelloBytes = 16;
/// Contribution: magic u32, step u64, size u64, then size bytes.
inline constexpr size_t kContributionHeaderBytes = 20;
/// Result: magic u32, step u64, count u32, then count times (size u64, size bytes).
/// Abort: magic u32, code u32 (an ErrorCode), length u32 (at most kMaxReasonBytes), the reason.
inline constexpr uint32_t kMaxReasonBytes = 4096;

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
LaunchEnvironment launchEnvironment(const EnvironmentLookup &lookup);
std::unique_ptr<Rendezvous> rendezvousFromEnvironment(const EnvironmentLookup &lookup,
                                                      std::chrono::milliseconds connectTimeout);

} // namespace backplane::detail
