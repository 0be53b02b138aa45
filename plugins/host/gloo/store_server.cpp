// The rendezvous store of the host plugin's communicators: one thread, poll(2), bounded buffers.
#include "store_server.hpp"

#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace backplane::host {
namespace {

constexpr size_t kMaxConnections = 1024;
/// Per communicator: Gloo's full mesh stores (n - 1) addresses of 136 bytes per rank, 142 MB for
/// the host plugin's largest communicator (1024 ranks).
constexpr size_t kMaxSpaceBytes = size_t{160} << 20;
constexpr size_t kMaxPendingOutput = size_t{4} << 20; ///< stop reading a client that does not read
constexpr size_t kReadChunk = 64 * 1024;

std::vector<unsigned char> refusal(const std::string &why) {
    return store::FrameWriter().u8(store::kRefused).text(why).finish();
}

} // namespace

StoreServer::StoreServer(const std::string &bindHost) {
    std::string lastError = "no address";
    for (const store::Endpoint &endpoint : store::resolve(bindHost, 0)) {
        store::Socket socket(
            ::socket(endpoint.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!socket) {
            lastError = "socket: " + store::errorText(errno);
            continue;
        }
        const int on = 1;
        setsockopt(socket.fd(), SOL_SOCKET, SO_REUSEADDR, &on, sizeof(on));
        if (::bind(socket.fd(), reinterpret_cast<const sockaddr *>(&endpoint.address),
                   endpoint.length) != 0) {
            lastError = "bind " + store::numericHost(endpoint) + ": " + store::errorText(errno);
            continue;
        }
        if (::listen(socket.fd(), SOMAXCONN) != 0) {
            lastError = "listen: " + store::errorText(errno);
            continue;
        }
        store::Endpoint bound;
        bound.length = sizeof(bound.address);
        if (getsockname(socket.fd(), reinterpret_cast<sockaddr *>(&bound.address), &bound.length) !=
            0) {
            lastError = "getsockname: " + store::errorText(errno);
            continue;
        }
        bound.family = endpoint.family;
        port_ = ntohs(bound.family == AF_INET6
                          ? reinterpret_cast<const sockaddr_in6 *>(&bound.address)->sin6_port
                          : reinterpret_cast<const sockaddr_in *>(&bound.address)->sin_port);
        host_ = store::numericHost(bound);
        listener_ = std::move(socket);
        break;
    }
    if (!listener_) throw std::runtime_error("cannot listen on '" + bindHost + "': " + lastError);
    if (pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0)
        throw std::runtime_error("pipe2: " + store::errorText(errno));
    try {
        thread_ = std::thread([this] { run(); });
    } catch (...) {
        ::close(wake_[0]);
        ::close(wake_[1]);
        throw;
    }
}

StoreServer::~StoreServer() {
    stopping_ = true;
    const char byte = 1;
    // The pipe is non-blocking; a full pipe already wakes the thread.
    [[maybe_unused]] const ssize_t written = ::write(wake_[1], &byte, 1);
    thread_.join();
    ::close(wake_[0]);
    ::close(wake_[1]);
}

void StoreServer::admit(const Nonce &nonce) {
    std::lock_guard lock(mutex_);
    spaces_.try_emplace(nonce);
}

void StoreServer::run() {
    std::vector<pollfd> fds;
    while (!stopping_) {
        fds.clear();
        fds.push_back({wake_[0], POLLIN, 0});
        fds.push_back({listener_.fd(), POLLIN, 0});
        for (const Connection &c : connections_) {
            short events = 0;
            const size_t pending = c.output.size() - c.sent;
            if (pending < kMaxPendingOutput && !c.closeAfterReply) events |= POLLIN;
            if (pending > 0) events |= POLLOUT;
            fds.push_back({c.socket.fd(), events, 0});
        }
        if (::poll(fds.data(), fds.size(), -1) < 0) {
            if (errno != EINTR) std::this_thread::sleep_for(std::chrono::milliseconds(10));
            continue;
        }
        if (fds[0].revents != 0) {
            char drain[64];
            while (::read(wake_[0], drain, sizeof(drain)) > 0) {
            }
            if (stopping_) break;
        }
        for (size_t i = 0; i < connections_.size(); ++i) {
            Connection &c = connections_[i];
            const short revents = fds[i + 2].revents;
            if ((revents & (POLLIN | POLLHUP | POLLERR)) != 0) receive(c);
            if (!c.dead && (revents & POLLOUT) != 0) transmit(c);
            if (!c.dead && c.closeAfterReply && c.sent == c.output.size()) c.dead = true;
        }
        std::erase_if(connections_, [](const Connection &c) { return c.dead; });
        if ((fds[1].revents & POLLIN) != 0) accept();
    }
}

void StoreServer::accept() {
    for (;;) {
        store::Socket socket(
            ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!socket) {
            // Out of descriptors or memory: the connection stays queued and poll(2) reports it
            // again at once; pause instead of spinning.
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
                std::this_thread::sleep_for(std::chrono::milliseconds(10));
            return; // EAGAIN, or a connection that failed before we took it
        }
        if (connections_.size() >= kMaxConnections) {
            // Full: make room by dropping the oldest client that never said Hello (idle or
            // hostile), never a rank's.
            const auto idle = std::find_if(connections_.begin(), connections_.end(),
                                           [](const Connection &c) { return !c.greeted; });
            if (idle == connections_.end()) continue; // the new one is closed at once
            connections_.erase(idle);
        }
        Connection connection;
        connection.socket = std::move(socket);
        connections_.push_back(std::move(connection));
    }
}

void StoreServer::receive(Connection &c) {
    unsigned char chunk[kReadChunk];
    for (;;) {
        const ssize_t n = ::recv(c.socket.fd(), chunk, sizeof(chunk), MSG_DONTWAIT);
        if (n == 0) {
            c.dead = true; // the client closed
            return;
        }
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
            break;
        }
        c.input.insert(c.input.end(), chunk, chunk + n);
        if (c.input.size() > store::kMaxFrameBytes + 4) break; // handle what is there first
    }
    size_t at = 0;
    while (!c.dead && !c.closeAfterReply && c.input.size() - at >= 4) {
        const unsigned char *p = c.input.data() + at;
        const uint32_t size = p[0] | (p[1] << 8) | (p[2] << 16) | (uint32_t{p[3]} << 24);
        if (size == 0 || size > store::kMaxFrameBytes) {
            c.dead = true;
            break;
        }
        if (c.input.size() - at - 4 < size) break;
        handle(c, p + 4, size);
        at += 4 + size;
    }
    c.input.erase(c.input.begin(), c.input.begin() + static_cast<std::ptrdiff_t>(at));
    if (!c.dead) transmit(c);
}

void StoreServer::transmit(Connection &c) {
    while (c.sent < c.output.size()) {
        const ssize_t n = ::send(c.socket.fd(), c.output.data() + c.sent, c.output.size() - c.sent,
                                 MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) c.dead = true;
            return;
        }
        c.sent += static_cast<size_t>(n);
    }
    c.output.clear();
    c.sent = 0;
}

void StoreServer::handle(Connection &c, const unsigned char *body, size_t size) {
    store::FrameReader in(body, size);
    const uint8_t request = in.u8();
    auto send = [&](std::vector<unsigned char> frame) {
        c.output.insert(c.output.end(), frame.begin(), frame.end());
    };

    std::lock_guard lock(mutex_);
    if (!c.greeted) {
        const uint16_t version = in.u16();
        Nonce nonce{};
        in.raw(nonce.data(), nonce.size());
        if (request != store::kHello || !in.complete()) {
            c.dead = true;
            return;
        }
        c.closeAfterReply = true; // unless accepted below
        if (version != store::kProtocolVersion) {
            send(refusal("the store speaks protocol version " +
                         std::to_string(store::kProtocolVersion) + ", the client " +
                         std::to_string(version) + " (mixed backplane versions?)"));
        } else if (spaces_.find(nonce) == spaces_.end()) {
            send(refusal("the store does not know this communicator: its id was not made by this "
                         "process, or all of its ranks already joined"));
        } else {
            c.greeted = true;
            c.closeAfterReply = false;
            c.nonce = nonce;
            send(store::FrameWriter().u8(store::kOk).finish());
        }
        return;
    }

    const auto found = spaces_.find(c.nonce);
    if (found == spaces_.end()) {
        send(refusal("the store forgot this communicator: all of its ranks already joined"));
        c.closeAfterReply = true;
        return;
    }
    Space &space = found->second;
    switch (request) {
    case store::kSet: {
        std::string key = in.text(store::kMaxKeyBytes);
        std::string value = in.text(store::kMaxValueBytes);
        if (!in.complete()) break;
        const auto existing = space.values.find(key);
        const size_t freed =
            existing == space.values.end() ? 0 : existing->first.size() + existing->second.size();
        const size_t added = key.size() + value.size();
        if (space.bytes - freed + added > kMaxSpaceBytes) {
            send(refusal("the communicator's keys exceed " + std::to_string(kMaxSpaceBytes) +
                         " bytes"));
            return;
        }
        space.bytes = space.bytes - freed + added;
        space.values[std::move(key)] = std::move(value);
        send(store::FrameWriter().u8(store::kOk).finish());
        return;
    }
    case store::kGet: {
        const std::string key = in.text(store::kMaxKeyBytes);
        if (!in.complete()) break;
        const auto value = space.values.find(key);
        if (value == space.values.end())
            send(store::FrameWriter().u8(store::kMissing).finish());
        else
            send(store::FrameWriter().u8(store::kOk).text(value->second).finish());
        return;
    }
    case store::kCheck: {
        const uint32_t count = in.u32();
        if (count > store::kMaxCheckKeys) break;
        store::FrameWriter out;
        out.u8(store::kOk).u32(count);
        for (uint32_t i = 0; i < count && !in.failed(); ++i)
            out.u8(space.values.count(in.text(store::kMaxKeyBytes)) != 0 ? 1 : 0);
        if (!in.complete()) break;
        send(out.finish());
        return;
    }
    case store::kDone: {
        const uint32_t rank = in.u32();
        const uint32_t ranks = in.u32();
        if (!in.complete() || ranks == 0 || rank >= ranks) break;
        space.done.insert(rank);
        send(store::FrameWriter().u8(store::kOk).finish());
        // Every rank read what it needed: the keys (and the id) are of no further use.
        if (space.done.size() >= ranks) spaces_.erase(found);
        return;
    }
    default:
        break;
    }
    c.dead = true; // malformed or unknown request
}

} // namespace backplane::host
