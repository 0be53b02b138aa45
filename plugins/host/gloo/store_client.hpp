// A rank's connection to a communicator's rendezvous store, as the gloo::rendezvous::Store Gloo
// uses.
#pragma once

#include "comm_id.hpp"
#include "store_protocol.hpp"

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::host {

/// A store operation ran into the client's deadline (typically: a rank that never joined).
class StoreTimeout : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// The store refused the client, closed the connection, or answered something malformed.
class StoreFailure : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// The client side of store_protocol.hpp. Every operation ends by the deadline given at
/// construction (or setDeadline): get() and wait() poll for keys that are not there yet, and
/// throw StoreTimeout when it passes; a request sent before it may take up to a second past it
/// for its reply. One thread at a time (Gloo's rendezvous is sequential).
class StoreClient final : public gloo::rendezvous::Store {
public:
    /// Connects to the store of `id` and says hello, retrying failed connections until
    /// `deadline` (StoreTimeout, with the last connection error). StoreFailure when the store
    /// refuses the id (not made there, or every rank already joined).
    StoreClient(const CommId &id, store::Clock::time_point deadline);
    ~StoreClient() override = default;

    void set(const std::string &key, const std::vector<char> &data) override;
    /// Waits for the key to be set, then returns its value.
    std::vector<char> get(const std::string &key) override;
    void wait(const std::vector<std::string> &keys) override;
    void wait(const std::vector<std::string> &keys,
              const std::chrono::milliseconds &timeout) override;

    /// Which of `keys` are set now (no waiting).
    std::vector<bool> check(const std::vector<std::string> &keys);
    /// Tells the store that `rank` of `size` read everything it needed.
    void done(uint32_t rank, uint32_t size);

    void setDeadline(store::Clock::time_point deadline) noexcept { deadline_ = deadline; }
    /// "host:port" of the store, for messages.
    const std::string &endpoint() const noexcept { return endpoint_; }

private:
    void connect(const CommId &id);
    /// Sends one frame and returns the reply's body (status byte first).
    std::vector<unsigned char> call(const std::vector<unsigned char> &frame);
    void sendAll(const unsigned char *data, size_t size, store::Clock::time_point until);
    void receiveExact(unsigned char *data, size_t size, store::Clock::time_point until);

    std::string endpoint_;
    store::Clock::time_point deadline_;
    store::Socket socket_;
    bool broken_ = false; ///< a request was cut off: the stream of replies is out of step
};

} // namespace backplane::host
