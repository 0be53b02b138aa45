// The TCP rendezvous: process 0 listens, the others connect; process 0 gathers each step's
// contributions and sends everyone the result. Non-blocking sockets and poll() give every wait a
// deadline; MSG_NOSIGNAL keeps a closed peer from raising SIGPIPE.
#include "comm/rendezvous_detail.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <charconv>
#include <climits>
#include <cstdio>
#include <cstring>
#include <thread>
#include <utility>

namespace backplane::detail {

TcpAddress parseTcpAddress(const std::string &address) {
    const auto refuse = [&](const std::string &why) {
        return Error(ErrorCode::InvalidArgument,
                     "tcp rendezvous address \"" + address + "\": " + why);
    };
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) throw refuse("expected host:port");
    TcpAddress result;
    result.host = address.substr(0, colon);
    if (result.host.starts_with("[")) {
        if (result.host.size() < 2 || !result.host.ends_with("]"))
            throw refuse("an IPv6 host in brackets lacks its closing bracket");
        result.host = result.host.substr(1, result.host.size() - 2);
    } else if (result.host.find(':') != std::string::npos) {
        throw refuse("write an IPv6 host in brackets: [addr]:port");
    }
    if (result.host.empty()) throw refuse("the host is empty");
    const std::string port = address.substr(colon + 1);
    unsigned value = 0;
    const auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
    if (port.empty() || ec != std::errc() || end != port.data() + port.size() || value > 65535)
        throw refuse("the port \"" + port + "\" is not a number from 1 to 65535");
    if (value == 0)
        throw refuse("port 0 is refused: the other processes must know process 0's port, so "
                     "choose a fixed one");
    result.port = static_cast<uint16_t>(value);
    return result;
}

namespace {

using Clock = std::chrono::steady_clock;

/// Owns one file descriptor.
class Socket {
public:
    Socket() = default;
    explicit Socket(int fd) : fd_(fd) {}
    Socket(Socket &&other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
    Socket &operator=(Socket &&other) noexcept {
        if (this != &other) {
            reset();
            fd_ = std::exchange(other.fd_, -1);
        }
        return *this;
    }
    Socket(const Socket &) = delete;
    Socket &operator=(const Socket &) = delete;
    ~Socket() { reset(); }

    int fd() const { return fd_; }
    bool valid() const { return fd_ >= 0; }
    void reset() {
        if (fd_ >= 0) ::close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
};

/// How a bounded send or receive ended; `error` is the errno of Failed.
struct Io {
    enum Kind { Done, Closed, Failed, TimedOut } kind = Done;
    int error = 0;
};

int pollMillis(Clock::time_point deadline) {
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
    return static_cast<int>(std::clamp<int64_t>(left.count(), 0, INT_MAX));
}

/// Waits until `fd` is ready for `events` or the deadline passes (false).
bool waitFor(int fd, short events, Clock::time_point deadline) {
    while (true) {
        pollfd entry{fd, events, 0};
        const int n = ::poll(&entry, 1, pollMillis(deadline));
        if (n > 0) return true;
        if (n < 0 && errno != EINTR) return true; // the next send/recv reports the error
        if (n == 0 && Clock::now() >= deadline) return false;
    }
}

Io sendAll(int fd, const std::byte *data, size_t size, Clock::time_point deadline) {
    size_t sent = 0;
    while (sent < size) {
        const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
        if (n > 0) {
            sent += static_cast<size_t>(n);
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            if (!waitFor(fd, POLLOUT, deadline)) return {Io::TimedOut};
            continue;
        }
        if (n < 0 && (errno == EPIPE || errno == ECONNRESET)) return {Io::Closed};
        return {Io::Failed, n < 0 ? errno : EIO};
    }
    return {};
}

/// One non-blocking receive into [data + got, data + size): Done when complete, TimedOut when
/// nothing more is there now (the caller polls again).
Io receiveAvailable(int fd, std::byte *data, size_t size, size_t &got) {
    while (got < size) {
        const ssize_t n = ::recv(fd, data + got, size - got, 0);
        if (n > 0) {
            got += static_cast<size_t>(n);
            continue;
        }
        if (n == 0) return {Io::Closed};
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return {Io::TimedOut};
        if (errno == ECONNRESET) return {Io::Closed};
        return {Io::Failed, errno};
    }
    return {};
}

Io receiveAll(int fd, std::byte *data, size_t size, Clock::time_point deadline) {
    size_t got = 0;
    while (true) {
        const Io io = receiveAvailable(fd, data, size, got);
        if (io.kind != Io::TimedOut) return io;
        if (!waitFor(fd, POLLIN, deadline)) return {Io::TimedOut};
    }
}

std::string peerName(sockaddr_storage address, socklen_t length) {
    // A dual-stack listener sees IPv4 peers as ::ffff:a.b.c.d: name them as IPv4.
    const auto *v6 = reinterpret_cast<const sockaddr_in6 *>(&address);
    if (address.ss_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&v6->sin6_addr)) {
        sockaddr_in v4{};
        v4.sin_family = AF_INET;
        v4.sin_port = v6->sin6_port;
        std::memcpy(&v4.sin_addr, v6->sin6_addr.s6_addr + 12, 4);
        address = {};
        std::memcpy(&address, &v4, sizeof v4);
        length = sizeof v4;
    }
    char host[NI_MAXHOST] = {};
    char port[NI_MAXSERV] = {};
    if (::getnameinfo(reinterpret_cast<const sockaddr *>(&address), length, host, sizeof host, port,
                      sizeof port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
        return "an unknown address";
    return std::strchr(host, ':') ? "[" + std::string(host) + "]:" + port
                                  : std::string(host) + ":" + port;
}

void setNoDelay(int fd) {
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

std::string hex(uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "0x%08x", value);
    return text;
}

std::vector<std::byte> abortFrame(ErrorCode code, const std::string &reason) {
    const std::string text = reason.substr(0, wire::kMaxReasonBytes);
    std::vector<std::byte> frame;
    wire::appendU32(frame, wire::kAbortMagic);
    wire::appendU32(frame, static_cast<uint32_t>(code));
    wire::appendU32(frame, static_cast<uint32_t>(text.size()));
    for (char c : text)
        frame.push_back(static_cast<std::byte>(c));
    return frame;
}

class TcpRendezvous final : public CheckedRendezvous {
public:
    TcpRendezvous(const std::string &address, uint32_t process, uint32_t processCount,
                  std::chrono::milliseconds connectTimeout)
        : CheckedRendezvous(process, processCount, "tcp rendezvous at " + address),
          address_(parseTcpAddress(address)) {
        if (connectTimeout.count() <= 0)
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": connectTimeout must be positive, got " +
                            std::to_string(connectTimeout.count()) + " ms");
        if (processCount == 1) return;
        if (process == 0)
            acceptPeers(connectTimeout);
        else
            connectToProcessZero(connectTimeout);
    }

protected:
    std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine,
                                               std::chrono::milliseconds timeout,
                                               uint64_t step) override {
        if (processCount() == 1) return {std::vector<std::byte>(mine.begin(), mine.end())};
        try {
            return process() == 0 ? gatherAtZero(mine, timeout, step)
                                  : gatherAtPeer(mine, timeout, step);
        } catch (...) {
            // The others learn at once instead of at their own timeout.
            peers_.clear();
            zero_.reset();
            throw;
        }
    }

private:
    // ---- process 0 -------------------------------------------------------------------------

    /// Listens on every interface: the address's host names process 0 for the others, and may
    /// resolve to a loopback address on process 0's own node (Debian's 127.0.1.1 for the host
    /// name).
    Socket listenOnPort() const {
        int lastError = 0;
        for (const int family : {AF_INET6, AF_INET}) {
            Socket socket(::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
            if (!socket.valid()) {
                lastError = errno;
                continue;
            }
            const int one = 1;
            const int zero = 0;
            ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
            sockaddr_storage storage{};
            socklen_t length = 0;
            if (family == AF_INET6) {
                ::setsockopt(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
                auto *v6 = reinterpret_cast<sockaddr_in6 *>(&storage);
                v6->sin6_family = AF_INET6;
                v6->sin6_addr = in6addr_any;
                v6->sin6_port = htons(address_.port);
                length = sizeof(sockaddr_in6);
            } else {
                auto *v4 = reinterpret_cast<sockaddr_in *>(&storage);
                v4->sin_family = AF_INET;
                v4->sin_addr.s_addr = htonl(INADDR_ANY);
                v4->sin_port = htons(address_.port);
                length = sizeof(sockaddr_in);
            }
            if (::bind(socket.fd(), reinterpret_cast<sockaddr *>(&storage), length) != 0) {
                lastError = errno;
                if (lastError == EADDRINUSE || lastError == EACCES) break;
                continue; // IPv6 disabled here: IPv4 only
            }
            if (::listen(socket.fd(), static_cast<int>(std::min<uint32_t>(processCount(), 4096))) !=
                0) {
                lastError = errno;
                continue;
            }
            return socket;
        }
        throw Error(ErrorCode::InvalidArgument, what() + ": process 0 cannot listen on port " +
                                                    std::to_string(address_.port) + ": " +
                                                    std::strerror(lastError));
    }

    /// A connection that has not introduced itself yet.
    struct Pending {
        Socket socket;
        std::string from;
        std::array<std::byte, wire::kHelloBytes> hello{};
        size_t got = 0;
    };

    void acceptPeers(std::chrono::milliseconds connectTimeout) {
        const auto deadline = Clock::now() + connectTimeout;
        Socket listener = listenOnPort();
        peers_.resize(processCount());
        peerNames_.resize(processCount());
        uint32_t connected = 1;
        std::vector<Pending> pending;
        std::vector<std::string> strangers; // connections that were not backplane peers

        while (connected < processCount()) {
            // Checked before each wait, not only when one ends empty: a stream of strangers'
            // connections must not keep process 0 here past its deadline.
            if (Clock::now() >= deadline) {
                std::vector<uint32_t> missing;
                for (uint32_t p = 1; p < processCount(); ++p)
                    if (!peers_[p].valid()) missing.push_back(p);
                std::string reason = formatProcesses(missing, processCount()) +
                                     " did not connect within " + formatDuration(connectTimeout);
                if (!strangers.empty())
                    reason +=
                        " (ignored " + std::to_string(strangers.size()) +
                        " connection(s) that did not introduce themselves as backplane peers, the "
                        "last from " +
                        strangers.back() + ")";
                failAtZero(ErrorCode::Timeout, reason);
            }
            std::vector<pollfd> fds{{listener.fd(), POLLIN, 0}};
            for (const auto &p : pending)
                fds.push_back({p.socket.fd(), POLLIN, 0});
            const int ready = ::poll(fds.data(), fds.size(), pollMillis(deadline));
            if (ready < 0 && errno != EINTR)
                failAtZero(ErrorCode::InvalidArgument,
                           std::string("poll failed: ") + std::strerror(errno));
            if (ready <= 0) continue;
            // Introductions first: the listener's new connections are appended to `pending`.
            for (size_t i = fds.size() - 1; i >= 1; --i) {
                if (fds[i].revents == 0) continue;
                Pending &p = pending[i - 1];
                const Io io =
                    receiveAvailable(p.socket.fd(), p.hello.data(), p.hello.size(), p.got);
                if (io.kind == Io::TimedOut) continue;
                if (io.kind != Io::Done) {
                    strangers.push_back(p.from);
                    pending.erase(pending.begin() + static_cast<ptrdiff_t>(i - 1));
                    continue;
                }
                Pending introduced = std::move(p);
                pending.erase(pending.begin() + static_cast<ptrdiff_t>(i - 1));
                if (admit(std::move(introduced), strangers, deadline)) ++connected;
            }
            if (fds[0].revents != 0) {
                while (true) {
                    sockaddr_storage from{};
                    socklen_t length = sizeof from;
                    const int fd = ::accept4(listener.fd(), reinterpret_cast<sockaddr *>(&from),
                                             &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0) break; // EAGAIN, or a connection that went away meanwhile
                    setNoDelay(fd);
                    pending.push_back({Socket(fd), peerName(from, length)});
                }
            }
        }
    }

    /// Takes a complete introduction: true when it is a new peer. A stranger is dropped and
    /// noted; a backplane peer that does not fit this communicator fails the rendezvous.
    bool admit(Pending introduced, std::vector<std::string> &strangers,
               Clock::time_point deadline) {
        const std::byte *h = introduced.hello.data();
        if (wire::readU32(h) != wire::kHelloMagic) {
            strangers.push_back(introduced.from);
            return false;
        }
        const uint32_t version = wire::readU32(h + 4);
        const uint32_t peer = wire::readU32(h + 8);
        const uint32_t count = wire::readU32(h + 12);
        std::string refusal;
        if (version != wire::kVersion)
            refusal = "the peer at " + introduced.from + " speaks rendezvous protocol version " +
                      std::to_string(version) + ", process 0 version " +
                      std::to_string(wire::kVersion) + " (different backplane versions)";
        else if (count != processCount())
            refusal = "the peer at " + introduced.from + " says it is process " +
                      std::to_string(peer) + " of " + std::to_string(count) +
                      ", process 0 was started for " + std::to_string(processCount()) +
                      " processes";
        else if (peer == 0 || peer >= processCount())
            refusal = "the peer at " + introduced.from + " says it is process " +
                      std::to_string(peer) + ", which is not in 1.." +
                      std::to_string(processCount() - 1);
        else if (peers_[peer].valid())
            refusal = "process " + std::to_string(peer) + " connected twice, from " +
                      peerNames_[peer] + " and from " + introduced.from;
        if (!refusal.empty()) {
            const auto frame = abortFrame(ErrorCode::InvalidArgument, refusal);
            sendAll(introduced.socket.fd(), frame.data(), frame.size(),
                    std::min(deadline, Clock::now() + std::chrono::milliseconds(100)));
            failAtZero(ErrorCode::InvalidArgument, refusal);
        }
        std::vector<std::byte> welcome;
        wire::appendU32(welcome, wire::kWelcomeMagic);
        const Io io = sendAll(introduced.socket.fd(), welcome.data(), welcome.size(), deadline);
        if (io.kind != Io::Done) {
            strangers.push_back(introduced.from);
            return false;
        }
        peers_[peer] = std::move(introduced.socket);
        peerNames_[peer] = introduced.from;
        return true;
    }

    /// Tells every connected peer why the rendezvous failed (best effort, briefly), closes every
    /// connection and throws.
    [[noreturn]] void failAtZero(ErrorCode code, const std::string &reason) {
        const auto frame = abortFrame(code, reason);
        const auto deadline = Clock::now() + std::chrono::milliseconds(100);
        for (auto &peer : peers_)
            if (peer.valid()) sendAll(peer.fd(), frame.data(), frame.size(), deadline);
        peers_.clear();
        throw Error(code, what() + ": " + reason);
    }

    /// One peer's contribution as it arrives.
    struct Incoming {
        std::array<std::byte, wire::kContributionHeaderBytes> header{};
        size_t headerGot = 0;
        std::vector<std::byte> payload;
        size_t payloadGot = 0;
        bool sized = false;
        bool done = false;
    };

    std::vector<std::vector<std::byte>> gatherAtZero(std::span<const std::byte> mine,
                                                     std::chrono::milliseconds timeout,
                                                     uint64_t step) {
        const auto deadline = Clock::now() + timeout;
        const std::string stepText = "step " + std::to_string(step) + ": ";
        std::vector<Incoming> incoming(processCount());
        incoming[0].done = true;
        uint32_t done = 1;
        while (done < processCount()) {
            std::vector<pollfd> fds;
            std::vector<uint32_t> owners;
            for (uint32_t p = 1; p < processCount(); ++p)
                if (!incoming[p].done) {
                    fds.push_back({peers_[p].fd(), POLLIN, 0});
                    owners.push_back(p);
                }
            if (Clock::now() >= deadline)
                failAtZero(ErrorCode::Timeout, stepText + formatProcesses(owners, processCount()) +
                                                   " did not contribute within " +
                                                   formatDuration(timeout));
            const int ready = ::poll(fds.data(), fds.size(), pollMillis(deadline));
            if (ready < 0 && errno != EINTR)
                failAtZero(ErrorCode::InvalidArgument,
                           stepText + "poll failed: " + std::strerror(errno));
            if (ready <= 0) continue;
            for (size_t i = 0; i < fds.size(); ++i) {
                if (fds[i].revents == 0) continue;
                const uint32_t p = owners[i];
                receiveContribution(p, incoming[p], step, stepText);
                if (incoming[p].done) ++done;
            }
        }

        std::vector<std::vector<std::byte>> all(processCount());
        all[0].assign(mine.begin(), mine.end());
        for (uint32_t p = 1; p < processCount(); ++p)
            all[p] = std::move(incoming[p].payload);

        std::vector<std::byte> frame;
        wire::appendU32(frame, wire::kResultMagic);
        wire::appendU64(frame, step);
        wire::appendU32(frame, processCount());
        for (const auto &bytes : all) {
            wire::appendU64(frame, bytes.size());
            frame.insert(frame.end(), bytes.begin(), bytes.end());
        }
        for (uint32_t p = 1; p < processCount(); ++p) {
            const Io io = sendAll(peers_[p].fd(), frame.data(), frame.size(), deadline);
            if (io.kind == Io::TimedOut)
                failAtZero(ErrorCode::Timeout, stepText + "process " + std::to_string(p) +
                                                   " did not take the result within " +
                                                   formatDuration(timeout));
            if (io.kind != Io::Done) failAtZero(kPeerFailed, stepText + lost(p, io));
        }
        return all;
    }

    void receiveContribution(uint32_t p, Incoming &in, uint64_t step, const std::string &stepText) {
        const int fd = peers_[p].fd();
        if (!in.sized) {
            const Io io = receiveAvailable(fd, in.header.data(), in.header.size(), in.headerGot);
            if (io.kind == Io::TimedOut) return;
            if (io.kind != Io::Done) failAtZero(kPeerFailed, stepText + lost(p, io));
            const std::byte *h = in.header.data();
            if (wire::readU32(h) != wire::kContributionMagic)
                failAtZero(kPeerFailed, stepText + "process " + std::to_string(p) +
                                            " sent a malformed message (magic " +
                                            hex(wire::readU32(h)) + ")");
            const uint64_t peerStep = wire::readU64(h + 4);
            if (peerStep != step)
                failAtZero(ErrorCode::InvalidArgument,
                           stepText + "process " + std::to_string(p) + " is at step " +
                               std::to_string(peerStep) +
                               ": every process must call allGather equally often");
            const uint64_t size = wire::readU64(h + 12);
            if (size > kMaxContributionBytes)
                failAtZero(kPeerFailed, stepText + "process " + std::to_string(p) + " announced " +
                                            std::to_string(size) +
                                            " bytes, more than the limit of " +
                                            std::to_string(kMaxContributionBytes));
            in.payload.resize(size);
            in.sized = true;
        }
        const Io io = receiveAvailable(fd, in.payload.data(), in.payload.size(), in.payloadGot);
        if (io.kind == Io::TimedOut) return;
        if (io.kind != Io::Done) failAtZero(kPeerFailed, stepText + lost(p, io));
        in.done = true;
    }

    std::string lost(uint32_t p, const Io &io) const {
        if (io.kind == Io::Closed)
            return "process " + std::to_string(p) + " (" + peerNames_[p] +
                   ") closed its connection (it failed or exited)";
        return "the connection to process " + std::to_string(p) +
               " failed: " + std::strerror(io.error);
    }

    // ---- processes 1..N-1 ------------------------------------------------------------------

    void connectToProcessZero(std::chrono::milliseconds connectTimeout) {
        const auto deadline = Clock::now() + connectTimeout;
        const std::string self =
            "process " + std::to_string(process()) + " of " + std::to_string(processCount());
        std::string lastError = "no attempt";
        auto pause = std::chrono::milliseconds(10);
        while (true) {
            Socket socket = tryConnect(deadline, lastError);
            if (socket.valid()) {
                zero_ = std::move(socket);
                introduce(deadline, connectTimeout);
                return;
            }
            const auto now = Clock::now();
            if (now >= deadline)
                throw Error(ErrorCode::Timeout, what() + ": " + self +
                                                    " could not connect to process 0 within " +
                                                    formatDuration(connectTimeout) +
                                                    " (last error: " + lastError + ")");
            std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
            pause = std::min(pause * 2, std::chrono::milliseconds(500));
        }
    }

    /// One round over the host's addresses; an invalid socket and `lastError` when none answered.
    Socket tryConnect(Clock::time_point deadline, std::string &lastError) const {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo *found = nullptr;
        const std::string port = std::to_string(address_.port);
        const int rc = ::getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &found);
        if (rc == EAI_AGAIN) {
            lastError = ::gai_strerror(rc);
            return {};
        }
        if (rc != 0)
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": cannot resolve \"" + address_.host + "\": " +
                            (rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc)));
        std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, ::freeaddrinfo);
        for (const addrinfo *ai = found; ai != nullptr; ai = ai->ai_next) {
            Socket socket(::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                                   ai->ai_protocol));
            if (!socket.valid()) {
                lastError = std::strerror(errno);
                continue;
            }
            if (::connect(socket.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
                if (errno != EINPROGRESS) {
                    lastError = std::strerror(errno);
                    continue;
                }
                if (!waitFor(socket.fd(), POLLOUT, deadline)) {
                    lastError = "the connection attempt timed out";
                    continue;
                }
                int error = 0;
                socklen_t length = sizeof error;
                ::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
                if (error != 0) {
                    lastError = std::strerror(error);
                    continue;
                }
            }
            setNoDelay(socket.fd());
            return socket;
        }
        return {};
    }

    void introduce(Clock::time_point deadline, std::chrono::milliseconds connectTimeout) {
        std::vector<std::byte> hello;
        wire::appendU32(hello, wire::kHelloMagic);
        wire::appendU32(hello, wire::kVersion);
        wire::appendU32(hello, process());
        wire::appendU32(hello, processCount());
        const std::string during = "introducing itself";
        expect(sendAll(zero_.fd(), hello.data(), hello.size(), deadline), during, connectTimeout);
        std::array<std::byte, 4> magic{};
        expect(receiveAll(zero_.fd(), magic.data(), magic.size(), deadline), during,
               connectTimeout);
        const uint32_t answer = wire::readU32(magic.data());
        if (answer == wire::kWelcomeMagic) return;
        if (answer == wire::kAbortMagic) throwAbort(deadline, during, connectTimeout);
        throw Error(ErrorCode::InvalidArgument,
                    peerPrefix(during) +
                        "the server there is not a backplane rendezvous (it "
                        "answered " +
                        hex(answer) + ")");
    }

    std::vector<std::vector<std::byte>> gatherAtPeer(std::span<const std::byte> mine,
                                                     std::chrono::milliseconds timeout,
                                                     uint64_t step) {
        const auto deadline = Clock::now() + timeout;
        const std::string during = "step " + std::to_string(step);
        std::vector<std::byte> frame;
        frame.reserve(wire::kContributionHeaderBytes + mine.size());
        wire::appendU32(frame, wire::kContributionMagic);
        wire::appendU64(frame, step);
        wire::appendU64(frame, mine.size());
        frame.insert(frame.end(), mine.begin(), mine.end());
        expect(sendAll(zero_.fd(), frame.data(), frame.size(), deadline), during, timeout);

        std::array<std::byte, 4> magic{};
        expect(receiveAll(zero_.fd(), magic.data(), magic.size(), deadline), during, timeout);
        const uint32_t answer = wire::readU32(magic.data());
        if (answer == wire::kAbortMagic) throwAbort(deadline, during, timeout);
        std::array<std::byte, 12> header{};
        expect(receiveAll(zero_.fd(), header.data(), header.size(), deadline), during, timeout);
        const uint64_t resultStep = wire::readU64(header.data());
        const uint32_t count = wire::readU32(header.data() + 8);
        if (answer != wire::kResultMagic || resultStep != step || count != processCount())
            throw Error(kPeerFailed, peerPrefix(during) +
                                         "process 0 sent a malformed result (magic " + hex(answer) +
                                         ", step " + std::to_string(resultStep) + ", " +
                                         std::to_string(count) + " contributions)");
        std::vector<std::vector<std::byte>> all(processCount());
        for (uint32_t p = 0; p < processCount(); ++p) {
            std::array<std::byte, 8> sizeBytes{};
            expect(receiveAll(zero_.fd(), sizeBytes.data(), sizeBytes.size(), deadline), during,
                   timeout);
            const uint64_t size = wire::readU64(sizeBytes.data());
            if (size > kMaxContributionBytes)
                throw Error(kPeerFailed, peerPrefix(during) +
                                             "process 0 sent a malformed result (process " +
                                             std::to_string(p) + "'s contribution of " +
                                             std::to_string(size) + " bytes exceeds the limit)");
            all[p].resize(size);
            expect(receiveAll(zero_.fd(), all[p].data(), size, deadline), during, timeout);
        }
        return all;
    }

    /// Reads the rest of an Abort from process 0 and throws its error here.
    [[noreturn]] void throwAbort(Clock::time_point deadline, const std::string &during,
                                 std::chrono::milliseconds timeout) {
        std::array<std::byte, 8> header{};
        expect(receiveAll(zero_.fd(), header.data(), header.size(), deadline), during, timeout);
        const uint32_t code = wire::readU32(header.data());
        const uint32_t length = wire::readU32(header.data() + 4);
        if (length > wire::kMaxReasonBytes)
            throw Error(kPeerFailed, peerPrefix(during) +
                                         "process 0 sent a malformed error message (" +
                                         std::to_string(length) + " bytes)");
        std::string reason(length, '\0');
        expect(
            receiveAll(zero_.fd(), reinterpret_cast<std::byte *>(reason.data()), length, deadline),
            during, timeout);
        // Process 0 sends Timeout, InvalidArgument or kPeerFailed; anything else is a peer's
        // failure too.
        ErrorCode errorCode = kPeerFailed;
        for (const ErrorCode known : {ErrorCode::Timeout, ErrorCode::InvalidArgument})
            if (code == static_cast<uint32_t>(known)) errorCode = known;
        throw Error(errorCode, peerPrefix(during) + "process 0 reports: " + reason);
    }

    /// "tcp rendezvous at node0:29500: process 2 of 4, step 3: ".
    std::string peerPrefix(const std::string &during) const {
        return what() + ": process " + std::to_string(process()) + " of " +
               std::to_string(processCount()) + ", " + during + ": ";
    }

    /// Throws unless `io` completed: process 0 gone, the connection broken, or the deadline.
    void expect(const Io &io, const std::string &during, std::chrono::milliseconds timeout) const {
        if (io.kind == Io::Done) return;
        const std::string prefix = peerPrefix(during);
        if (io.kind == Io::Closed)
            throw Error(kPeerFailed,
                        prefix + "process 0 closed the connection (it failed or exited)");
        if (io.kind == Io::Failed)
            throw Error(kPeerFailed,
                        prefix + "the connection to process 0 failed: " + std::strerror(io.error));
        throw Error(ErrorCode::Timeout, prefix + "no answer from process 0 within " +
                                            formatDuration(timeout) + " (it answers once all " +
                                            std::to_string(processCount()) +
                                            " processes have contributed)");
    }

    TcpAddress address_;
    std::vector<Socket> peers_;          // process 0: by process index; [0] unused
    std::vector<std::string> peerNames_; // process 0: each peer's address, for messages
    Socket zero_;                        // the others: the connection to process 0
};

} // namespace
} // namespace backplane::detail

namespace backplane {

std::unique_ptr<Rendezvous> tcpRendezvous(const std::string &address, uint32_t process,
                                          uint32_t processCount,
                                          std::chrono::milliseconds connectTimeout) {
    return std::make_unique<detail::TcpRendezvous>(address, process, processCount, connectTimeout);
}

} // namespace backplane
