// The TCP rendezvous: process 0 listens, the others connect; process 0 gathers each step's
// contributions and sends everyone the result. Non-blocking sockets and poll() give every wait a
// deadline; MSG_NOSIGNAL keeps a closed peer from raising SIGPIPE.
#include "comm/rendezvous_detail.hpp"

#include <backplane/log.hpp>

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
#include <cstdlib>
#include <memory>
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

/// `text` with control characters (a terminal escape, a newline) shown as '?': for words that
/// come from the network.
std::string printable(const std::string &text) {
    std::string out;
    for (size_t i = 0; i < text.size(); ++i) {
        const auto c = static_cast<unsigned char>(text[i]);
        const auto next = i + 1 < text.size() ? static_cast<unsigned char>(text[i + 1]) : 0;
        const auto third = i + 2 < text.size() ? static_cast<unsigned char>(text[i + 2]) : 0;
        if (c < 0x20 || c == 0x7f) {
            out += '?';
        } else if (c == 0xc2 && next >= 0x80 && next <= 0x9f) { // C1 controls (U+0080..U+009F)
            out += '?';
            ++i;
        } else if (c == 0xe2 && ((next == 0x80 && third >= 0xaa && third <= 0xae) ||
                                 (next == 0x81 && third >= 0xa6 && third <= 0xa9))) {
            out += '?'; // bidirectional overrides and isolates, which reorder what is shown
            i += 2;
        } else {
            out += static_cast<char>(c);
        }
    }
    return out;
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
                  std::chrono::milliseconds connectTimeout, std::string token, std::string bind,
                  std::string tokenSource)
        : CheckedRendezvous(process, processCount, "tcp rendezvous at " + address),
          address_(parseTcpAddress(address)), token_(std::move(token)), bind_(std::move(bind)),
          tokenSource_(std::move(tokenSource)) {
        if (connectTimeout.count() <= 0)
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": connectTimeout must be positive, got " +
                            std::to_string(connectTimeout.count()) + " ms");
        if (processCount == 1) return;
        checkToken(what(), token_);
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

    /// One listening socket on `address` (an AF_INET6 wildcard also takes IPv4): invalid when
    /// the family is not available here; throws when the port is taken.
    Socket listenAt(const sockaddr *address, socklen_t length, bool dualStack,
                    std::string &lastError) const {
        Socket socket(::socket(address->sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
        if (!socket.valid()) {
            lastError = std::strerror(errno);
            return {};
        }
        const int one = 1;
        ::setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (address->sa_family == AF_INET6) {
            const int v6only = dualStack ? 0 : 1;
            ::setsockopt(socket.fd(), IPPROTO_IPV6, IPV6_V6ONLY, &v6only, sizeof v6only);
        }
        if (::bind(socket.fd(), address, length) != 0) {
            lastError = std::strerror(errno);
            if (errno == EADDRINUSE || errno == EACCES)
                throw Error(ErrorCode::InvalidArgument,
                            what() + ": process 0 cannot listen on port " +
                                std::to_string(address_.port) + ": " + lastError);
            return {}; // the family or the address is not available on this node
        }
        // Room for the job's processes and for strangers' connections beside them, which
        // process 0 refuses: a full queue would turn the real peers away.
        const uint32_t backlog = std::clamp<uint32_t>(processCount() + 128, 128, 4096);
        if (::listen(socket.fd(), static_cast<int>(backlog)) != 0) {
            lastError = std::strerror(errno);
            return {};
        }
        return socket;
    }

    /// Listens where bind_ says: "*" every interface (one dual-stack socket, or IPv4 where IPv6
    /// is off), else every address the bind host (by default the address's host) resolves to on
    /// this node. Remembers the addresses in listening_ for messages.
    std::vector<Socket> listen() {
        const std::string host = bind_.empty() ? address_.host : bind_;
        std::string lastError = "no address";
        std::vector<Socket> sockets;
        if (host == "*") {
            sockaddr_in6 v6{};
            v6.sin6_family = AF_INET6;
            v6.sin6_addr = in6addr_any;
            v6.sin6_port = htons(address_.port);
            Socket any = listenAt(reinterpret_cast<const sockaddr *>(&v6), sizeof v6, true,
                                  lastError);
            if (!any.valid()) {
                sockaddr_in v4{};
                v4.sin_family = AF_INET;
                v4.sin_addr.s_addr = htonl(INADDR_ANY);
                v4.sin_port = htons(address_.port);
                any = listenAt(reinterpret_cast<const sockaddr *>(&v4), sizeof v4, false,
                               lastError);
            }
            if (any.valid()) sockets.push_back(std::move(any));
            listening_ = "every interface";
        } else {
            addrinfo hints{};
            hints.ai_family = AF_UNSPEC;
            hints.ai_socktype = SOCK_STREAM;
            hints.ai_flags = AI_PASSIVE;
            addrinfo *found = nullptr;
            const std::string port = std::to_string(address_.port);
            const int rc = ::getaddrinfo(host.c_str(), port.c_str(), &hints, &found);
            if (rc != 0)
                throw Error(ErrorCode::InvalidArgument,
                            what() + ": process 0 cannot resolve the address to listen on, \"" +
                                host + "\": " +
                                (rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc)) +
                                " (set BACKPLANE_RENDEZVOUS_BIND or TcpRendezvousOptions::bind "
                                "to this node's address, or \"*\" for every interface)");
            std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, ::freeaddrinfo);
            std::vector<std::string> names;
            for (const addrinfo *ai = found; ai != nullptr; ai = ai->ai_next) {
                sockaddr_storage storage{};
                std::memcpy(&storage, ai->ai_addr, ai->ai_addrlen);
                const std::string name = peerName(storage, ai->ai_addrlen);
                if (std::find(names.begin(), names.end(), name) != names.end()) continue;
                // "::" means every address, as "*" does: the IPv4 ones too.
                const bool wildcard =
                    ai->ai_family == AF_INET6 &&
                    IN6_IS_ADDR_UNSPECIFIED(
                        &reinterpret_cast<const sockaddr_in6 *>(ai->ai_addr)->sin6_addr);
                Socket socket = listenAt(ai->ai_addr, ai->ai_addrlen, wildcard, lastError);
                if (!socket.valid()) continue;
                sockets.push_back(std::move(socket));
                names.push_back(name);
            }
            for (const auto &name : names)
                listening_ += (listening_.empty() ? "" : ", ") + name;
        }
        if (sockets.empty())
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": process 0 cannot listen on port " +
                            std::to_string(address_.port) + ": " + lastError);
        log::write(log::Subsystem::Comm, log::Level::Debug,
                   what() + ": process 0 listens on " + listening_);
        return sockets;
    }

    /// A connection that has not proved it belongs to the job yet.
    struct Pending {
        Socket socket;
        std::string from;
        /// What arrives next: Hello's head, its nonce, or (after the Challenge) the Proof.
        enum Stage { Head, HelloNonce, Proof } stage = Head;
        std::array<std::byte, std::max(wire::kHelloBytes, wire::kProofBytes)> buffer{};
        size_t got = 0;
        uint32_t process = 0;
        uint32_t count = 0;
        wire::Nonce peerNonce{};
        wire::Nonce zeroNonce{};
        Clock::time_point challenged{}; ///< when the Challenge went out

        size_t expected() const {
            return stage == Head ? wire::kHelloHeadBytes
                                 : stage == HelloNonce ? wire::kNonceBytes : wire::kProofBytes;
        }
    };

    /// Most connections that may be half-way through their introduction at once; a new one past
    /// this closes the oldest, so a flood of silent connections cannot lock the real peers out.
    static constexpr size_t kMaxPending = 64;
    /// Refusals logged one by one before only every thousandth is.
    static constexpr size_t kLoggedRefusals = 16;

    void acceptPeers(std::chrono::milliseconds connectTimeout) {
        const auto deadline = Clock::now() + connectTimeout;
        std::vector<Socket> listeners = listen();
        peers_.resize(processCount());
        peerNames_.resize(processCount());
        uint32_t connected = 1;
        std::vector<Pending> pending;
        refused_ = 0;

        while (connected < processCount()) {
            // Checked before each wait, not only when one ends empty: a stream of strangers'
            // connections must not keep process 0 here past its deadline.
            if (Clock::now() >= deadline) {
                std::vector<uint32_t> missing;
                for (uint32_t p = 1; p < processCount(); ++p)
                    if (!peers_[p].valid()) missing.push_back(p);
                std::string reason = formatProcesses(missing, processCount()) +
                                     " did not connect within " + formatDuration(connectTimeout) +
                                     " (process 0 listened on " + listening_ + ")";
                if (refused_ > 0)
                    reason += "; refused " + std::to_string(refused_) +
                              " connection(s) that did not prove they belong to this job, the "
                              "last: " +
                              lastRefusal_;
                failAtZero(ErrorCode::Timeout, reason);
            }
            std::vector<pollfd> fds;
            for (const auto &listener : listeners)
                fds.push_back({listener.fd(), POLLIN, 0});
            for (const auto &p : pending)
                fds.push_back({p.socket.fd(), POLLIN, 0});
            const int ready = ::poll(fds.data(), fds.size(), pollMillis(deadline));
            if (ready < 0 && errno != EINTR)
                failAtZero(ErrorCode::InvalidArgument,
                           std::string("poll failed: ") + std::strerror(errno));
            if (ready <= 0) continue;
            // Introductions first: the listeners' new connections are appended to `pending`.
            for (size_t i = fds.size() - 1; i >= listeners.size(); --i) {
                if (fds[i].revents == 0) continue;
                const size_t index = i - listeners.size();
                std::optional<Pending> done = advance(pending[index], deadline);
                if (pending[index].socket.valid() && !done) continue; // more to come
                pending.erase(pending.begin() + static_cast<ptrdiff_t>(index));
                if (done && admit(std::move(*done), deadline)) ++connected;
            }
            for (size_t l = 0; l < listeners.size(); ++l) {
                if (fds[l].revents == 0) continue;
                while (true) {
                    sockaddr_storage from{};
                    socklen_t length = sizeof from;
                    const int fd = ::accept4(listeners[l].fd(), reinterpret_cast<sockaddr *>(&from),
                                             &length, SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (fd < 0) {
                        // Out of descriptors: the listener stays readable, so free one (or
                        // wait a moment) instead of spinning until the deadline.
                        if (errno == EMFILE || errno == ENFILE) {
                            if (!pending.empty())
                                evict(pending, "was closed: process 0 ran out of file "
                                               "descriptors");
                            else
                                std::this_thread::sleep_for(std::chrono::milliseconds(10));
                        }
                        break; // EAGAIN, or a connection that went away meanwhile
                    }
                    setNoDelay(fd);
                    if (pending.size() == kMaxPending)
                        evict(pending, "still had not introduced itself when " +
                                           std::to_string(kMaxPending) +
                                           " newer connections were waiting");
                    pending.push_back({Socket(fd), peerName(from, length)});
                }
            }
        }
    }

    /// Closes one waiting connection to make room: the oldest that sent nothing yet, else the
    /// oldest still in its Hello, else the oldest of all. One that was challenged is closed last:
    /// it is most likely a real peer about to prove the token (and a peer dropped before its
    /// verdict connects again).
    void evict(std::vector<Pending> &pending, const std::string &why) {
        const auto pick = [&](auto &&matches) -> std::optional<size_t> {
            for (size_t i = 0; i < pending.size(); ++i)
                if (matches(pending[i])) return i;
            return std::nullopt;
        };
        // Challenged, then silent for longer than any real peer's round trip: a stranger that
        // only sent a Hello to hold a place.
        const auto stale = Clock::now() - std::chrono::seconds(2);
        size_t victim = pending.size() - 1; // else the newest challenged: not a peer mid-proof
        if (auto silent = pick([](const Pending &p) { return p.stage == Pending::Head && p.got == 0; }))
            victim = *silent;
        else if (auto hello = pick([](const Pending &p) { return p.stage != Pending::Proof; }))
            victim = *hello;
        else if (auto parked = pick([&](const Pending &p) { return p.challenged < stale; }))
            victim = *parked;
        refuse(pending[victim], why);
        pending.erase(pending.begin() + static_cast<ptrdiff_t>(victim));
    }

    /// Reads what `p` has sent: the completed introduction once its Proof checks out, else
    /// nothing (p.socket closed when it was refused).
    std::optional<Pending> advance(Pending &p, Clock::time_point deadline) {
        while (true) {
            const Io io = receiveAvailable(p.socket.fd(), p.buffer.data(), p.expected(), p.got);
            if (io.kind == Io::TimedOut) return std::nullopt;
            if (io.kind != Io::Done) {
                refuse(p, p.stage == Pending::Head && p.got == 0
                              ? "closed without a word"
                              : "closed its connection half-way through the introduction");
                return std::nullopt;
            }
            const std::byte *in = p.buffer.data();
            p.got = 0;
            if (p.stage == Pending::Head) {
                if (wire::readU32(in) != wire::kHelloMagic) {
                    refuse(p, "is not a backplane peer (its first bytes are " +
                                  hex(wire::readU32(in)) + ")");
                    return std::nullopt;
                }
                if (const uint32_t version = wire::readU32(in + 4); version != wire::kVersion) {
                    refuse(p, "speaks rendezvous protocol version " + std::to_string(version) +
                                  ", process 0 version " + std::to_string(wire::kVersion) +
                                  " (different backplane versions)",
                           true);
                    return std::nullopt;
                }
                p.process = wire::readU32(in + 8);
                p.count = wire::readU32(in + 12);
                p.stage = Pending::HelloNonce;
            } else if (p.stage == Pending::HelloNonce) {
                std::memcpy(p.peerNonce.data(), in, wire::kNonceBytes);
                p.zeroNonce = wire::freshNonce();
                const wire::Mac mac = wire::handshakeMac(token_, wire::Side::Zero, p.peerNonce,
                                                         p.zeroNonce, p.process, p.count);
                std::vector<std::byte> challenge;
                wire::appendU32(challenge, wire::kChallengeMagic);
                challenge.insert(challenge.end(), p.zeroNonce.begin(), p.zeroNonce.end());
                challenge.insert(challenge.end(), mac.begin(), mac.end());
                if (sendAll(p.socket.fd(), challenge.data(), challenge.size(),
                            std::min(deadline, Clock::now() + std::chrono::milliseconds(100)))
                        .kind != Io::Done) {
                    refuse(p, "did not take process 0's challenge");
                    return std::nullopt;
                }
                p.stage = Pending::Proof;
                p.challenged = Clock::now();
            } else {
                const wire::Mac expected = wire::handshakeMac(
                    token_, wire::Side::Peer, p.peerNonce, p.zeroNonce, p.process, p.count);
                if (wire::readU32(in) != wire::kProofMagic || !wire::sameMac(in + 4, expected)) {
                    refuse(p, "did not prove it knows the job's token (another job, a different "
                              "BACKPLANE_RENDEZVOUS_TOKEN, or a replayed handshake)",
                           true);
                    return std::nullopt;
                }
                return std::move(p);
            }
        }
    }

    /// Closes a connection that did not prove it belongs to the job, logs why and remembers it
    /// for the timeout message; `tell`: first sends the reason (to a backplane peer, which then
    /// fails with it instead of waiting).
    void refuse(Pending &p, const std::string &why, bool tell = false) {
        const std::string line = "the connection from " + p.from + " " + why;
        if (tell) {
            const auto frame = abortFrame(ErrorCode::InvalidArgument, line);
            sendAll(p.socket.fd(), frame.data(), frame.size(),
                    Clock::now() + std::chrono::milliseconds(100));
        }
        p.socket.reset();
        ++refused_;
        lastRefusal_ = line;
        // The first ones each, then every thousandth: a flood must not become a log flood.
        if (refused_ <= kLoggedRefusals)
            log::write(log::Subsystem::Comm, log::Level::Warn,
                       what() + ": refused " + line + "; still waiting for the job's processes" +
                           (refused_ == kLoggedRefusals
                                ? " (further refusals are logged every 1000th)"
                                : ""));
        else if (refused_ % 1000 == 0)
            log::write(log::Subsystem::Comm, log::Level::Warn,
                       what() + ": refused " + std::to_string(refused_) +
                           " connections so far, the last " + line);
    }

    /// Takes a peer that proved it knows the token: true when it is a new peer. One that does
    /// not fit this communicator fails the rendezvous: it belongs to this job, so the job was
    /// started inconsistently.
    bool admit(Pending introduced, Clock::time_point deadline) {
        const uint32_t peer = introduced.process;
        const uint32_t count = introduced.count;
        std::string refusal;
        if (count != processCount())
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
            refuse(introduced, "closed before process 0 could welcome it");
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
        std::string lastAnswer; // the last server that answered but was not this job's process 0
        auto pause = std::chrono::milliseconds(10);
        while (true) {
            if (tryJoin(deadline, connectTimeout, lastError, lastAnswer)) return;
            const auto now = Clock::now();
            if (now >= deadline)
                throw Error(ErrorCode::Timeout,
                            what() + ": " + self + " could not connect to process 0 within " +
                                formatDuration(connectTimeout) + " (last error: " + lastError +
                                (lastAnswer.empty() || lastAnswer == lastError
                                     ? std::string()
                                     : "; before that " + lastAnswer) +
                                ")");
            std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
            pause = std::min(pause * 2, std::chrono::milliseconds(500));
        }
    }

    /// One round over the host's addresses: connects to each and introduces itself until
    /// process 0 welcomes it (true). A server that is not this job's process 0 (another program
    /// on the port, a wrong token, a connection dropped before the verdict) is one failed
    /// attempt, noted in `lastError`: the next address or round may reach the real one. Throws
    /// only what retrying cannot fix: process 0 proved the token and refused this process.
    bool tryJoin(Clock::time_point deadline, std::chrono::milliseconds connectTimeout,
                 std::string &lastError, std::string &lastAnswer) {
        addrinfo hints{};
        hints.ai_family = AF_UNSPEC;
        hints.ai_socktype = SOCK_STREAM;
        addrinfo *found = nullptr;
        const std::string port = std::to_string(address_.port);
        const int rc = ::getaddrinfo(address_.host.c_str(), port.c_str(), &hints, &found);
        if (rc == EAI_AGAIN) {
            lastError = ::gai_strerror(rc);
            return false;
        }
        if (rc != 0)
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": cannot resolve \"" + address_.host + "\": " +
                            (rc == EAI_SYSTEM ? std::strerror(errno) : ::gai_strerror(rc)));
        std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> owner(found, ::freeaddrinfo);
        for (const addrinfo *ai = found; ai != nullptr; ai = ai->ai_next) {
            zero_ = connectTo(ai, deadline, lastError);
            if (!zero_.valid()) continue;
            sockaddr_storage storage{};
            std::memcpy(&storage, ai->ai_addr, ai->ai_addrlen);
            const std::string at = peerName(storage, ai->ai_addrlen);
            if (const auto failed = introduce(deadline, connectTimeout)) {
                lastError = at + ": " + failed->why;
                if (failed->answered) lastAnswer = lastError;
                zero_.reset();
                continue;
            }
            return true;
        }
        return false;
    }

    /// A connected socket to `ai`, or an invalid one and `lastError`.
    Socket connectTo(const addrinfo *ai, Clock::time_point deadline,
                     std::string &lastError) const {
        Socket socket(
            ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
        if (!socket.valid()) {
            lastError = std::strerror(errno);
            return {};
        }
        if (::connect(socket.fd(), ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS) {
                lastError = std::strerror(errno);
                return {};
            }
            if (!waitFor(socket.fd(), POLLOUT, deadline)) {
                lastError = "the connection attempt timed out";
                return {};
            }
            int error = 0;
            socklen_t length = sizeof error;
            ::getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length);
            if (error != 0) {
                lastError = std::strerror(error);
                return {};
            }
        }
        setNoDelay(socket.fd());
        return socket;
    }

    /// The handshake on zero_: nothing when process 0 welcomed this process, else why this
    /// server is not (or not yet) this job's process 0. Until process 0's MAC checks out, what
    /// the server says is not trusted: an Abort is shown as the server's words, cleaned of
    /// control characters, and only fails this attempt.
    /// Why a handshake attempt failed; `answered`: the server said something (it is there, but
    /// is not this job's process 0), rather than the connection breaking or going silent.
    struct Refusal {
        std::string why;
        bool answered = true;
    };

    std::optional<Refusal> introduce(Clock::time_point deadline,
                                     std::chrono::milliseconds connectTimeout) {
        // A server that never answers costs at most a few seconds of the connect timeout.
        const auto attemptDeadline = std::min(deadline, Clock::now() + std::chrono::seconds(5));
        const auto broken = [](const Io &io) -> Refusal {
            if (io.kind == Io::Closed) return {"the server closed the connection", false};
            if (io.kind == Io::TimedOut) return {"the server did not answer", false};
            return {std::string("the connection failed: ") + std::strerror(io.error), false};
        };
        const wire::Nonce mine = wire::freshNonce();
        std::vector<std::byte> hello;
        wire::appendU32(hello, wire::kHelloMagic);
        wire::appendU32(hello, wire::kVersion);
        wire::appendU32(hello, process());
        wire::appendU32(hello, processCount());
        hello.insert(hello.end(), mine.begin(), mine.end());
        if (const Io io = sendAll(zero_.fd(), hello.data(), hello.size(), attemptDeadline);
            io.kind != Io::Done)
            return broken(io);
        std::array<std::byte, wire::kChallengeBytes> challenge{};
        if (const Io io = receiveAll(zero_.fd(), challenge.data(), 4, attemptDeadline);
            io.kind != Io::Done)
            return broken(io);
        const uint32_t answer = wire::readU32(challenge.data());
        if (answer == wire::kAbortMagic)
            return Refusal{"the server refused it, saying (not proven to be this job's process "
                           "0): " +
                           readAbortText(attemptDeadline).value_or("(an unreadable reason)")};
        if (answer != wire::kChallengeMagic)
            return Refusal{"the server there is not a backplane rendezvous (it answered " +
                           hex(answer) + ")"};
        if (const Io io = receiveAll(zero_.fd(), challenge.data() + 4, challenge.size() - 4,
                                     attemptDeadline);
            io.kind != Io::Done)
            return broken(io);
        wire::Nonce theirs{};
        std::memcpy(theirs.data(), challenge.data() + 4, theirs.size());
        if (!wire::sameMac(challenge.data() + 4 + wire::kNonceBytes,
                           wire::handshakeMac(token_, wire::Side::Zero, mine, theirs, process(),
                                              processCount())))
            return Refusal{"the process listening there does not know this job's token "
                           "(another job's rendezvous on the same port, or a different "
                           "BACKPLANE_RENDEZVOUS_TOKEN): nothing was sent to it; this process's "
                           "token comes from " +
                           tokenSource_};
        // Process 0 is authentic from here on: its answers are trusted.
        const wire::Mac proof =
            wire::handshakeMac(token_, wire::Side::Peer, mine, theirs, process(), processCount());
        std::vector<std::byte> frame;
        wire::appendU32(frame, wire::kProofMagic);
        frame.insert(frame.end(), proof.begin(), proof.end());
        if (const Io io = sendAll(zero_.fd(), frame.data(), frame.size(), deadline);
            io.kind != Io::Done)
            return broken(io);
        // The verdict may take until the deadline: giving up earlier could leave this process
        // admitted on a connection it abandoned.
        std::array<std::byte, 4> magic{};
        if (const Io io = receiveAll(zero_.fd(), magic.data(), magic.size(), deadline);
            io.kind != Io::Done) {
            Refusal refusal = broken(io);
            refusal.why += " before it answered the proof";
            return refusal;
        }
        const uint32_t verdict = wire::readU32(magic.data());
        if (verdict == wire::kWelcomeMagic) return std::nullopt;
        const std::string during = "introducing itself";
        if (verdict == wire::kAbortMagic) throwAbort(deadline, during, connectTimeout);
        throw Error(kPeerFailed, peerPrefix(during) + "process 0 sent a malformed answer (magic " +
                                     hex(verdict) + ")");
    }

    /// The code and text of an Abort whose magic was read; nothing when it is malformed.
    std::optional<std::pair<uint32_t, std::string>> readAbort(Clock::time_point deadline) {
        std::array<std::byte, 8> header{};
        if (receiveAll(zero_.fd(), header.data(), header.size(), deadline).kind != Io::Done)
            return std::nullopt;
        const uint32_t code = wire::readU32(header.data());
        const uint32_t length = wire::readU32(header.data() + 4);
        if (length > wire::kMaxReasonBytes) return std::nullopt;
        std::string reason(length, '\0');
        if (receiveAll(zero_.fd(), reinterpret_cast<std::byte *>(reason.data()), length, deadline)
                .kind != Io::Done)
            return std::nullopt;
        return std::make_pair(code, printable(reason));
    }
    std::optional<std::string> readAbortText(Clock::time_point deadline) {
        const auto abort = readAbort(deadline);
        if (!abort) return std::nullopt;
        return "\"" + abort->second + "\"";
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
        const auto abort = readAbort(deadline);
        (void)timeout;
        if (!abort)
            throw Error(kPeerFailed, peerPrefix(during) +
                                         "process 0 sent a malformed or incomplete error message");
        // Process 0 sends Timeout, InvalidArgument or kPeerFailed; anything else is a peer's
        // failure too.
        ErrorCode errorCode = kPeerFailed;
        for (const ErrorCode known : {ErrorCode::Timeout, ErrorCode::InvalidArgument})
            if (abort->first == static_cast<uint32_t>(known)) errorCode = known;
        throw Error(errorCode, peerPrefix(during) + "process 0 reports: " + abort->second);
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
    std::string token_;
    std::string bind_;
    std::string tokenSource_;            // "BACKPLANE_RENDEZVOUS_TOKEN", for messages
    std::string listening_;              // process 0: "127.0.0.1:29500", for messages
    size_t refused_ = 0;                 // process 0: connections refused while accepting
    std::string lastRefusal_;            // process 0: the last one, and why
    std::vector<Socket> peers_;          // process 0: by process index; [0] unused
    std::vector<std::string> peerNames_; // process 0: each peer's address, for messages
    Socket zero_;                        // the others: the connection to process 0
};

} // namespace
} // namespace backplane::detail

namespace backplane::detail {

std::unique_ptr<Rendezvous> tcpRendezvous(const std::string &address, uint32_t process,
                                          uint32_t processCount,
                                          std::chrono::milliseconds connectTimeout,
                                          const std::string &token, const std::string &bind,
                                          const std::string &tokenSource) {
    return std::make_unique<TcpRendezvous>(address, process, processCount, connectTimeout, token,
                                           bind, tokenSource);
}

} // namespace backplane::detail

namespace backplane {

std::unique_ptr<Rendezvous> tcpRendezvous(const std::string &address, uint32_t process,
                                          uint32_t processCount,
                                          std::chrono::milliseconds connectTimeout,
                                          const TcpRendezvousOptions &options) {
    std::string source = "TcpRendezvousOptions::token";
    std::string token = options.token;
    // One process meets nobody: no token, and no token file made for it.
    if (token.empty() && processCount > 1) {
        detail::parseTcpAddress(address); // a malformed address is said first
        token = detail::defaultToken(::getenv, source);
    }
    std::string bind = options.bind;
    if (bind.empty())
        if (const char *value = ::getenv("BACKPLANE_RENDEZVOUS_BIND")) bind = value;
    return detail::tcpRendezvous(address, process, processCount, connectTimeout, token, bind,
                                 source);
}

std::string newRendezvousToken() { return detail::generateToken(); }

} // namespace backplane
