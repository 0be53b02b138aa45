// The rendezvous store the host plugin runs for its communicator ids (like NCCL's bootstrap root).
#pragma once

#include "store_protocol.hpp"

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace backplane::host {

/// A small key-value store on one TCP port, served by one thread: the ranks of a communicator
/// exchange Gloo's pair addresses through it (store_protocol.hpp has the protocol). It carries no
/// collective data. Only communicators admitted by nonce are served; each one is forgotten once
/// all its ranks said they are done. Connections, frames, keys and values are bounded, and a
/// malformed frame closes its connection: a stray or hostile client cannot stop the store.
class StoreServer {
public:
    using Nonce = std::array<uint8_t, 16>;

    /// Listens on `bindHost` (numeric address or host name), on a free port, and starts serving.
    /// Throws std::runtime_error naming the address when it cannot listen.
    explicit StoreServer(const std::string &bindHost);
    /// Stops the thread and closes every connection.
    ~StoreServer();
    StoreServer(const StoreServer &) = delete;
    StoreServer &operator=(const StoreServer &) = delete;

    /// The numeric address it listens on.
    const std::string &host() const noexcept { return host_; }
    uint16_t port() const noexcept { return port_; }

    /// Serves the communicator `nonce` from now on. Thread-safe.
    void admit(const Nonce &nonce);

private:
    struct Connection {
        store::Socket socket;
        std::vector<unsigned char> input;
        std::vector<unsigned char> output;
        size_t sent = 0;
        bool greeted = false; ///< said Hello with an admitted nonce
        Nonce nonce{};
        bool closeAfterReply = false;
        bool dead = false;
    };
    struct Space { ///< one communicator's keys
        std::map<std::string, std::string> values;
        size_t bytes = 0;
        std::set<uint32_t> done;
    };

    void run();
    void accept();
    void receive(Connection &connection);
    void transmit(Connection &connection);
    void handle(Connection &connection, const unsigned char *body, size_t size);

    store::Socket listener_;
    std::string host_;
    uint16_t port_ = 0;
    int wake_[2] = {-1, -1}; ///< a pipe: the destructor writes to stop poll(2)
    std::atomic<bool> stopping_{false};

    std::mutex mutex_;
    std::map<Nonce, Space> spaces_;       ///< guarded by mutex_
    std::vector<Connection> connections_; ///< the thread's own
    std::thread thread_;                  ///< last: starts after everything above is ready
};

} // namespace backplane::host
