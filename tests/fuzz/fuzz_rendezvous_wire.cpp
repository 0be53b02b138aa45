// Fuzzes what process 0 of a TCP rendezvous reads from the network, over real loopback sockets.
// The input's first byte picks who sends the rest:
//   even: a stranger. The bytes go to a process 0 that lives for the whole run (a job of two
//         processes whose second never comes), then the connection is half-closed. Process 0
//         must refuse it and keep listening: admitting it (a peer without the token) or giving up
//         is a finding, like a crash or a sanitizer report.
//   odd:  a peer that knows the token. It completes the handshake with a fresh process 0, then
//         the bytes are all it sends for allGather (contribution frames: magic, step, size,
//         payload). Process 0 must return or throw backplane::Error within its timeout.
// What a peer reads from a hostile process 0 is not fuzzed here (a peer retries until its
// deadline, too slow per input); tests/multidevice/rendezvous_test.cpp covers it by cases.
#include "comm/rendezvous_detail.hpp"
#include "fuzz_check.hpp"

#include <backplane/communicator.hpp>
#include <backplane/log.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using namespace std::chrono_literals;
namespace wire = backplane::detail::wire;

const std::string kToken(64, 'a');

/// A loopback port nobody listens on now (bound to port 0, then closed).
uint16_t freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) != 0 ||
        ::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length) != 0)
        backplane::fuzz::finding("rendezvous wire", "no loopback port for the harness");
    ::close(fd);
    return ntohs(address.sin_port);
}

/// Connects to 127.0.0.1:port, retrying while process 0 starts listening; -1 after 5 s.
int connectTo(uint16_t port) {
    const auto until = std::chrono::steady_clock::now() + 5s;
    while (std::chrono::steady_clock::now() < until) {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(port);
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0) return fd;
        ::close(fd);
        std::this_thread::sleep_for(1ms);
    }
    return -1;
}

void sendAll(int fd, const std::byte *data, size_t size) {
    while (size > 0) {
        const ssize_t n = ::send(fd, data, size, MSG_NOSIGNAL);
        if (n <= 0) return; // process 0 closed it: fine
        data += n;
        size -= static_cast<size_t>(n);
    }
}

/// Closes `fd` with a reset (SO_LINGER 0): no TIME_WAIT is left behind, so a long run does not
/// use up the loopback's ports.
void closeNow(int fd) {
    const linger reset{1, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof reset);
    ::close(fd);
}

/// Reads until the other side closes or `within` passes; returns what came.
std::vector<std::byte> drain(int fd, std::chrono::milliseconds within, size_t atMost = 1 << 20) {
    std::vector<std::byte> got;
    const auto until = std::chrono::steady_clock::now() + within;
    while (got.size() < atMost) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            until - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) break;
        std::byte buffer[4096];
        const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
        if (n <= 0) break;
        got.insert(got.end(), buffer, buffer + n);
    }
    return got;
}

/// Exactly `size` bytes, or fewer when the connection ends first.
std::vector<std::byte> receive(int fd, size_t size) {
    std::vector<std::byte> got;
    while (got.size() < size) {
        pollfd p{fd, POLLIN, 0};
        if (::poll(&p, 1, 5000) <= 0) break;
        std::byte buffer[256];
        const ssize_t n = ::recv(fd, buffer, std::min(sizeof buffer, size - got.size()), 0);
        if (n <= 0) break;
        got.insert(got.end(), buffer, buffer + n);
    }
    return got;
}

// ----- a stranger against a long-lived process 0 -------------------------------------------------

struct LongLivedZero {
    uint16_t port = freePort();
    std::atomic<bool> returned{false};
    std::thread thread;

    LongLivedZero() {
        thread = std::thread([this] {
            backplane::TcpRendezvousOptions options;
            options.token = kToken;
            try {
                (void)backplane::tcpRendezvous("127.0.0.1:" + std::to_string(port), 0, 2,
                                               std::chrono::hours(24 * 365), options);
            } catch (const backplane::Error &) {
            }
            returned = true;
        });
        thread.detach(); // lives as long as the fuzzing process
    }
};

void stranger(const std::byte *data, size_t size) {
    static LongLivedZero zero;
    const int fd = connectTo(zero.port);
    if (fd >= 0) {
        sendAll(fd, data, size);
        ::shutdown(fd, SHUT_WR);
        (void)drain(fd, 2s);
        closeNow(fd);
    }
    if (zero.returned.load())
        backplane::fuzz::finding("rendezvous wire (stranger)",
                                 "process 0 stopped waiting for its peer after a stranger's bytes "
                                 "(admitted it, or gave up)");
}

// ----- a peer with the token, then any bytes as its contributions -------------------------------

void authenticatedPeer(const std::byte *data, size_t size) {
    const uint16_t port = freePort();
    std::promise<void> zeroDone;
    std::future<void> finished = zeroDone.get_future();
    std::thread zero([&, port] {
        backplane::fuzz::expectReturnOrError("rendezvous wire (contributions)", [&] {
            backplane::TcpRendezvousOptions options;
            options.token = kToken;
            auto rendezvous = backplane::tcpRendezvous("127.0.0.1:" + std::to_string(port), 0, 2,
                                                       5s, options);
            const std::byte mine[] = {std::byte{1}, std::byte{2}};
            (void)rendezvous->allGather(mine, 2s);
        });
        zeroDone.set_value();
    });
    const int fd = connectTo(port);
    if (fd >= 0) {
        // The handshake as a real peer makes it (process 1 of 2).
        std::vector<std::byte> hello;
        wire::appendU32(hello, wire::kHelloMagic);
        wire::appendU32(hello, wire::kVersion);
        wire::appendU32(hello, 1);
        wire::appendU32(hello, 2);
        const wire::Nonce nonce = wire::freshNonce();
        hello.insert(hello.end(), nonce.begin(), nonce.end());
        sendAll(fd, hello.data(), hello.size());
        const std::vector<std::byte> challenge = receive(fd, wire::kChallengeBytes);
        if (challenge.size() == wire::kChallengeBytes) {
            wire::Nonce zeroNonce{};
            std::memcpy(zeroNonce.data(), challenge.data() + 4, zeroNonce.size());
            const wire::Mac mac =
                wire::handshakeMac(kToken, wire::Side::Peer, nonce, zeroNonce, 1, 2);
            std::vector<std::byte> proof;
            wire::appendU32(proof, wire::kProofMagic);
            proof.insert(proof.end(), mac.begin(), mac.end());
            sendAll(fd, proof.data(), proof.size());
            sendAll(fd, data, size);
        }
        ::shutdown(fd, SHUT_WR);
        (void)drain(fd, 4s);
        closeNow(fd);
    }
    if (finished.wait_for(15s) != std::future_status::ready)
        backplane::fuzz::finding("rendezvous wire (contributions)",
                                 "process 0 still runs 15 s after its peer closed the connection");
    zero.join();
}

} // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    backplane::log::setLevel(backplane::log::Subsystem::Comm, backplane::log::Level::Off);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const auto *bytes = reinterpret_cast<const std::byte *>(data + 1);
    if (data[0] % 2 == 0) stranger(bytes, size - 1);
    else authenticatedPeer(bytes, size - 1);
    return 0;
}
