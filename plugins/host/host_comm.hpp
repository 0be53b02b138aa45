// Collectives of the host plugin (ABI 1.1) on Gloo: communicators, the stream-ordered collective
// call, and comm_group.
#pragma once

// How it works. comm_id_create starts the plugin's rendezvous store (store_server.hpp) once and
// makes an id naming it plus a random nonce (comm_id.hpp). comm_create connects to that store
// (store_client.hpp), and Gloo's rendezvous exchanges the ranks' pair addresses through it; all
// collective data then flows over Gloo's own TCP transport, a full mesh of connections. A
// collective is one task on the host stream that runs the Gloo algorithm on the host memory, so
// it is ordered like a copy. A failure of Gloo (a peer closed its connection, Gloo's timeout) is
// BP_ERROR_REMOTE from the stream's next event; it also breaks the communicator: its connections
// are closed, so the other ranks' pending collectives fail at once instead of waiting out their
// timeouts, and every later collective fails at once (gloo_connections.hpp: how, around Gloo).
// comm_group matters only on synchronous streams (comm_group.hpp).
//
// Addresses: the store and Gloo's connections bind BACKPLANE_GLOO_ADDRESS, else the host plugin
// option collectives.address, else the host name's address, else 127.0.0.1. Gloo binds the
// interface BACKPLANE_GLOO_INTERFACE or collectives.interface instead when one is given.
//
// Built only with Gloo (BACKPLANE_HOST_GLOO); without it the plugin has no collectives.

#include "host_options.hpp"
#include "host_stream.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::host {

class HostMemory;
class StoreServer;

/// One rank's membership in a communicator. Thread-safe: record() and abort() may run
/// concurrently from any threads; collectives recorded on different streams run concurrently
/// (each has its own Gloo tag).
class HostComm final : public sdk::Comm {
public:
    /// Joins the communicator of `args` (comm_create) as a rank of the device `owner` (compared,
    /// never dereferenced). Blocks until every rank joined. Errors: BP_ERROR_INVALID_ARGUMENT for
    /// a malformed id or a bad address setting, BP_ERROR_TIMEOUT when the ranks did not all join
    /// within args.timeout_ms (default 60 s; the message names the store and the missing ranks),
    /// BP_ERROR_REMOTE when a peer or the store failed during the join.
    static std::unique_ptr<HostComm> join(const void *owner, const bp_comm_create_args &args,
                                          const HostOptions &options);
    /// Leaves: closes the connections once collectives still running on streams are done.
    ~HostComm() override;
    HostComm(const HostComm &) = delete;
    HostComm &operator=(const HostComm &) = delete;

    /// Fails pending and later collectives with BP_ERROR_REMOTE (comm_abort).
    void abort() override;

    const void *owner() const noexcept { return owner_; }

    /// Returns the device's page behind a handle the collective uses, or throws
    /// BP_ERROR_INVALID_ARGUMENT (NULL, or not a page of this device) with `what` in the message.
    using MemoryLookup = std::function<const HostMemory *(bp_memory *, const std::string &what)>;

    /// Checks one collective of this rank and records it on `stream` as one task. `own` resolves
    /// the memory handles the operation uses (those it ignores are not touched). Throws
    /// BP_ERROR_INVALID_ARGUMENT, recording nothing, for any bad argument.
    void record(HostStream &stream, const bp_collective_args &args, const MemoryLookup &own);

    struct State;

private:
    HostComm(const void *owner, std::shared_ptr<State> state);

    const void *owner_;
    std::shared_ptr<State> state_; ///< shared with the recorded tasks
};

/// The plugin's side of comm_id_create: its rendezvous store, started with the first id and
/// serving until this object is destroyed (with the plugin), and the ids naming it. Thread-safe.
class CommIdMaker {
public:
    using Log = std::function<void(bp_log_level, const std::string &)>;
    /// Cheap: nothing starts before the first make(). `options` must outlive this object.
    CommIdMaker(const HostOptions &options, Log log);
    ~CommIdMaker();
    CommIdMaker(const CommIdMaker &) = delete;
    CommIdMaker &operator=(const CommIdMaker &) = delete;

    /// A new id. Throws BP_ERROR_INVALID_ARGUMENT when the configured address cannot be listened
    /// on (the message names the setting).
    std::vector<unsigned char> make();

private:
    void startStore(); ///< with mutex_ held

    const HostOptions &options_;
    Log log_;
    std::mutex mutex_;
    std::unique_ptr<StoreServer> store_; ///< guarded by mutex_
    std::string advertisedHost_;         ///< guarded by mutex_: the host ids name
};

/// "gloo 0.5.0 (tcp)": the engine text of bp_device_info::collectives.
std::string collectivesEngine();

} // namespace backplane::host
