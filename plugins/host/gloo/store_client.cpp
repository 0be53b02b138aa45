// A rank's connection to a communicator's rendezvous store.
#include "store_client.hpp"

#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <thread>

namespace backplane::host {
namespace {

using store::Clock;

constexpr auto kFirstPoll = std::chrono::milliseconds(1);
constexpr auto kLongestPoll = std::chrono::milliseconds(20);
constexpr auto kReconnectPause = std::chrono::milliseconds(100);
/// A request sent just before the deadline still gets this long for its reply: the polling
/// loops decide when to stop asking, not a reply that is on its way.
constexpr auto kReplyGrace = std::chrono::milliseconds(1000);

void pauseUntil(Clock::time_point deadline, std::chrono::milliseconds pause) {
    const auto until = std::min(deadline, Clock::now() + pause);
    std::this_thread::sleep_until(until);
}

std::string quoted(const std::string &key) { return "'" + key + "'"; }

} // namespace

StoreClient::StoreClient(const CommId &id, Clock::time_point deadline)
    : endpoint_(endpointText(id.host, id.port)), deadline_(deadline) {
    connect(id);
}

void StoreClient::connect(const CommId &id) {
    std::string lastError;
    while (true) {
        try {
            for (const store::Endpoint &endpoint : store::resolve(id.host, id.port)) {
                store::Socket socket(
                    ::socket(endpoint.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
                if (!socket) {
                    lastError = "socket: " + store::errorText(errno);
                    continue;
                }
                int rc =
                    ::connect(socket.fd(), reinterpret_cast<const sockaddr *>(&endpoint.address),
                              endpoint.length);
                if (rc != 0 && errno == EINPROGRESS) {
                    pollfd p{socket.fd(), POLLOUT, 0};
                    rc = ::poll(&p, 1, store::pollTimeoutMs(deadline_));
                    int error = 0;
                    socklen_t length = sizeof(error);
                    if (rc == 1 &&
                        getsockopt(socket.fd(), SOL_SOCKET, SO_ERROR, &error, &length) == 0 &&
                        error == 0) {
                        rc = 0;
                    } else {
                        errno = rc == 0 ? ETIMEDOUT : (error != 0 ? error : errno);
                        rc = -1;
                    }
                }
                if (rc != 0) {
                    lastError = "connect: " + store::errorText(errno);
                    continue;
                }
                socket_ = std::move(socket);
                break;
            }
        } catch (const std::runtime_error &e) { // resolve: DNS may come back; retry
            lastError = e.what();
        }
        if (socket_) break;
        if (Clock::now() >= deadline_)
            throw StoreTimeout("could not connect to the rendezvous store at " + endpoint_ + " (" +
                               lastError + ")");
        pauseUntil(deadline_, kReconnectPause);
    }
    const auto reply = call(store::FrameWriter()
                                .u8(store::kHello)
                                .u16(store::kProtocolVersion)
                                .raw(id.nonce.data(), id.nonce.size())
                                .finish());
    if (reply[0] != store::kOk) {
        store::FrameReader in(reply.data() + 1, reply.size() - 1);
        throw StoreFailure("the rendezvous store at " + endpoint_ +
                           " refused the communicator: " + in.text(store::kMaxFrameBytes));
    }
}

void StoreClient::sendAll(const unsigned char *data, size_t size, Clock::time_point until) {
    size_t sent = 0;
    while (sent < size) {
        const ssize_t n =
            ::send(socket_.fd(), data + sent, size - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n >= 0) {
            sent += static_cast<size_t>(n);
            continue;
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            broken_ = true;
            throw StoreFailure("lost the rendezvous store at " + endpoint_ +
                               ": send: " + store::errorText(errno));
        }
        pollfd p{socket_.fd(), POLLOUT, 0};
        if (::poll(&p, 1, store::pollTimeoutMs(until)) == 0) {
            broken_ = true;
            throw StoreTimeout("the rendezvous store at " + endpoint_ + " did not take a request");
        }
    }
}

void StoreClient::receiveExact(unsigned char *data, size_t size, Clock::time_point until) {
    size_t got = 0;
    while (got < size) {
        const ssize_t n = ::recv(socket_.fd(), data + got, size - got, MSG_DONTWAIT);
        if (n > 0) {
            got += static_cast<size_t>(n);
            continue;
        }
        if (n == 0) {
            broken_ = true;
            throw StoreFailure("the rendezvous store at " + endpoint_ +
                               " closed the connection (did the process that made the id exit?)");
        }
        if (errno == EINTR) continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK) {
            broken_ = true;
            throw StoreFailure("lost the rendezvous store at " + endpoint_ +
                               ": recv: " + store::errorText(errno));
        }
        pollfd p{socket_.fd(), POLLIN, 0};
        if (::poll(&p, 1, store::pollTimeoutMs(until)) == 0) {
            broken_ = true;
            throw StoreTimeout("the rendezvous store at " + endpoint_ + " did not answer");
        }
    }
}

std::vector<unsigned char> StoreClient::call(const std::vector<unsigned char> &frame) {
    if (broken_)
        throw StoreFailure("the connection to the rendezvous store at " + endpoint_ +
                           " was cut off by an earlier error");
    const auto until = std::max(deadline_, Clock::now() + kReplyGrace);
    sendAll(frame.data(), frame.size(), until);
    unsigned char header[4];
    receiveExact(header, sizeof(header), until);
    const uint32_t size =
        header[0] | (header[1] << 8) | (header[2] << 16) | (uint32_t{header[3]} << 24);
    if (size == 0 || size > store::kMaxFrameBytes) {
        broken_ = true;
        throw StoreFailure("the rendezvous store at " + endpoint_ + " sent a malformed reply");
    }
    std::vector<unsigned char> body(size);
    receiveExact(body.data(), body.size(), until);
    return body;
}

void StoreClient::set(const std::string &key, const std::vector<char> &data) {
    if (key.size() > store::kMaxKeyBytes || data.size() > store::kMaxValueBytes)
        throw StoreFailure("rendezvous key " + quoted(key) + " or its value is too long");
    const auto reply = call(
        store::FrameWriter().u8(store::kSet).text(key).text(data.data(), data.size()).finish());
    if (reply[0] != store::kOk) {
        store::FrameReader in(reply.data() + 1, reply.size() - 1);
        throw StoreFailure("the rendezvous store at " + endpoint_ + " refused key " + quoted(key) +
                           ": " + in.text(store::kMaxFrameBytes));
    }
}

std::vector<char> StoreClient::get(const std::string &key) {
    auto pause = kFirstPoll;
    const auto frame = store::FrameWriter().u8(store::kGet).text(key).finish();
    while (true) {
        const auto reply = call(frame);
        if (reply[0] == store::kOk) {
            store::FrameReader in(reply.data() + 1, reply.size() - 1);
            const std::string value = in.text(store::kMaxValueBytes);
            if (!in.complete())
                throw StoreFailure("the rendezvous store at " + endpoint_ +
                                   " sent a malformed value");
            return {value.begin(), value.end()};
        }
        if (reply[0] != store::kMissing)
            throw StoreFailure("the rendezvous store at " + endpoint_ + " refused to read " +
                               quoted(key));
        if (Clock::now() >= deadline_) throw StoreTimeout("key " + quoted(key) + " never appeared");
        pauseUntil(deadline_, pause);
        pause = std::min(pause * 2, kLongestPoll);
    }
}

void StoreClient::wait(const std::vector<std::string> &keys) {
    wait(keys, std::chrono::duration_cast<std::chrono::milliseconds>(deadline_ - Clock::now()));
}

void StoreClient::wait(const std::vector<std::string> &keys,
                       const std::chrono::milliseconds &timeout) {
    const auto until = std::min(deadline_, Clock::now() + timeout);
    auto pause = kFirstPoll;
    while (true) {
        const std::vector<bool> present = check(keys);
        const auto missing = std::find(present.begin(), present.end(), false);
        if (missing == present.end()) return;
        if (Clock::now() >= until)
            throw StoreTimeout("key " +
                               quoted(keys[static_cast<size_t>(missing - present.begin())]) +
                               " never appeared");
        pauseUntil(until, pause);
        pause = std::min(pause * 2, kLongestPoll);
    }
}

std::vector<bool> StoreClient::check(const std::vector<std::string> &keys) {
    if (keys.size() > store::kMaxCheckKeys)
        throw StoreFailure("too many rendezvous keys to check at once");
    store::FrameWriter request;
    request.u8(store::kCheck).u32(static_cast<uint32_t>(keys.size()));
    for (const std::string &key : keys)
        request.text(key);
    const auto reply = call(request.finish());
    store::FrameReader in(reply.data(), reply.size());
    const uint8_t status = in.u8();
    const uint32_t count = in.u32();
    std::vector<bool> present;
    for (uint32_t i = 0; i < count && !in.failed(); ++i)
        present.push_back(in.u8() != 0);
    if (status != store::kOk || !in.complete() || present.size() != keys.size())
        throw StoreFailure("the rendezvous store at " + endpoint_ + " answered a check wrongly");
    return present;
}

void StoreClient::done(uint32_t rank, uint32_t size) {
    call(store::FrameWriter().u8(store::kDone).u32(rank).u32(size).finish());
}

} // namespace backplane::host
