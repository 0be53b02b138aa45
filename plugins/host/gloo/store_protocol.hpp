// The wire format of the host plugin's rendezvous store, and the socket owner both ends use.
#pragma once

// Every message is a frame: a u32 (little-endian) body length, then the body. A request body
// starts with its Request byte, a reply body with its Reply byte. Strings are a u32 length and
// the bytes. A connection first says Hello with the communicator's nonce; the server refuses a
// nonce it did not make an id for. Requests:
//   Hello  u16 version, 16 nonce bytes          -> Ok | Refused text
//   Set    key, value                           -> Ok | Refused text
//   Get    key                                  -> Ok value | Missing
//   Check  u32 n, n keys                        -> Ok u32 n, n bytes (1: present)
//   Done   u32 rank, u32 size                   -> Ok   (this rank read everything it needed)
// Once `size` ranks said Done, the server forgets the communicator's keys and nonce.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <sys/socket.h>
#include <vector>

namespace backplane::host::store {

inline constexpr uint16_t kProtocolVersion = 1;
inline constexpr uint32_t kMaxKeyBytes = 1024;
inline constexpr uint32_t kMaxValueBytes = 1u << 20;
inline constexpr uint32_t kMaxCheckKeys = 4096;
inline constexpr uint32_t kMaxFrameBytes = kMaxValueBytes + 2 * kMaxKeyBytes + 64;

enum Request : uint8_t { kHello = 1, kSet = 2, kGet = 3, kCheck = 4, kDone = 5 };
enum Reply : uint8_t { kOk = 0, kMissing = 1, kRefused = 2 };

/// Builds one frame.
class FrameWriter {
public:
    FrameWriter() : bytes_(4, 0) {}
    FrameWriter &u8(uint8_t value);
    FrameWriter &u16(uint16_t value);
    FrameWriter &u32(uint32_t value);
    FrameWriter &raw(const void *data, size_t size);
    /// A u32 length, then the bytes.
    FrameWriter &text(const void *data, size_t size);
    FrameWriter &text(const std::string &value) { return text(value.data(), value.size()); }
    /// The frame with its length prefix filled in.
    std::vector<unsigned char> finish();

private:
    std::vector<unsigned char> bytes_;
};

/// Reads one frame body. A read past the end sets failed() and returns zeros: check once at the
/// end instead of after every field.
class FrameReader {
public:
    FrameReader(const unsigned char *data, size_t size) : data_(data), size_(size) {}
    uint8_t u8();
    uint16_t u16();
    uint32_t u32();
    void raw(void *out, size_t size);
    /// A u32 length (at most `limit`), then that many bytes.
    std::string text(uint32_t limit);
    bool failed() const noexcept { return failed_; }
    /// True when everything was read and nothing is left over.
    bool complete() const noexcept { return !failed_ && at_ == size_; }

private:
    bool take(size_t size);
    const unsigned char *data_;
    size_t size_;
    size_t at_ = 0;
    bool failed_ = false;
};

/// Owns one socket descriptor (move-only).
class Socket {
public:
    Socket() = default;
    explicit Socket(int fd) noexcept : fd_(fd) {}
    ~Socket() { reset(); }
    Socket(Socket &&other) noexcept : fd_(other.release()) {}
    Socket &operator=(Socket &&other) noexcept {
        if (this != &other) {
            reset();
            fd_ = other.release();
        }
        return *this;
    }
    Socket(const Socket &) = delete;
    Socket &operator=(const Socket &) = delete;

    int fd() const noexcept { return fd_; }
    explicit operator bool() const noexcept { return fd_ >= 0; }
    int release() noexcept {
        const int fd = fd_;
        fd_ = -1;
        return fd;
    }
    void reset() noexcept;

private:
    int fd_ = -1;
};

/// One resolved socket address.
struct Endpoint {
    sockaddr_storage address{};
    socklen_t length = 0;
    int family = 0;
};

/// Resolves a numeric address or host name with getaddrinfo (TCP). Throws std::runtime_error
/// with getaddrinfo's text when nothing is found.
std::vector<Endpoint> resolve(const std::string &host, uint16_t port);

/// The numeric text of an address (no port).
std::string numericHost(const Endpoint &endpoint);

/// strerror for messages, thread-safe.
std::string errorText(int error);

using Clock = std::chrono::steady_clock;

/// Milliseconds left until `deadline` for poll(2): 0 when passed, at most a day.
int pollTimeoutMs(Clock::time_point deadline);

} // namespace backplane::host::store
