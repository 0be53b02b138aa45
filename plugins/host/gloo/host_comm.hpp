// Collectives of the host plugin (ABI 1.1): communicators and the stream-ordered collective call,
// run by the Gloo module (gloo_module.h), which the plugin loads when they are first needed.
#pragma once

// How it works. comm_id_create starts the module's rendezvous store (store_server.hpp) once and
// makes an id naming it plus a random nonce (comm_id.hpp). comm_create connects to that store
// (store_client.hpp), and Gloo's rendezvous exchanges the ranks' pair addresses through it; all
// collective data then flows over Gloo's own TCP transport, a full mesh of connections. A
// collective is checked here and becomes one task on the host stream that runs the Gloo
// algorithm on the host memory (the module's comm_run), so it is ordered like a copy. A failure
// of Gloo (a peer closed its connection, Gloo's timeout) is BP_ERROR_REMOTE from the stream's
// next event; it also breaks the communicator: its connections are closed, so the other ranks'
// pending collectives fail at once instead of waiting out their timeouts, and every later
// collective fails at once (gloo_connections.hpp: how, around Gloo). comm_group matters only on
// synchronous streams (comm_group.hpp).
//
// Addresses: the store and Gloo's connections bind BACKPLANE_GLOO_ADDRESS, else the host plugin
// option collectives.address, else the host name's address, else 127.0.0.1. Gloo binds the
// interface BACKPLANE_GLOO_INTERFACE or collectives.interface instead when one is given.
//
// Without the module or libgloo (gloo_loader.hpp) the plugin has no collectives, and says why.

#include "gloo_loader.hpp"
#include "../host_options.hpp"
#include "../host_stream.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::host {

class HostMemory;

/// One rank's membership in a communicator. Thread-safe: record() and abort() may run
/// concurrently from any threads; collectives recorded on different streams run concurrently
/// (each has its own Gloo tag).
class HostComm final : public sdk::Comm {
public:
    /// Joins the communicator of `args` (comm_create) as a rank of the device `owner` (compared,
    /// never dereferenced). Blocks until every rank joined. Errors: BP_ERROR_UNSUPPORTED when
    /// the Gloo module is missing (the message says why), BP_ERROR_INVALID_ARGUMENT for a
    /// malformed id or a bad address setting, BP_ERROR_TIMEOUT when the ranks did not all join
    /// within args.timeout_ms (default 60 s; the message names the store and the missing ranks),
    /// BP_ERROR_REMOTE when a peer or the store failed during the join.
    static std::unique_ptr<HostComm> join(const void *owner, const bp_comm_create_args &args,
                                          const HostOptions &options, GlooLoader &gloo);
    /// Leaves: the connections close once collectives still running on streams are done.
    ~HostComm() override = default;
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

private:
    HostComm(const void *owner, const bp_host_gloo_api &api,
             std::shared_ptr<bp_host_gloo_comm> comm);

    const void *owner_;
    const bp_host_gloo_api &api_;
    std::shared_ptr<bp_host_gloo_comm> comm_; ///< shared with the recorded tasks
    uint32_t rank_ = 0;
    uint32_t size_ = 1;
};

/// The plugin's side of comm_id_create: the module's rendezvous store, started with the first id
/// and serving until this object is destroyed (with the plugin). Thread-safe.
class CommIdMaker {
public:
    using Log = std::function<void(bp_log_level, const std::string &)>;
    /// Cheap: loads nothing before the first make(). `options` and `gloo` must outlive this.
    CommIdMaker(const HostOptions &options, GlooLoader &gloo, Log log);
    ~CommIdMaker();
    CommIdMaker(const CommIdMaker &) = delete;
    CommIdMaker &operator=(const CommIdMaker &) = delete;

    /// A new id. Throws BP_ERROR_UNSUPPORTED without the Gloo module, BP_ERROR_INVALID_ARGUMENT
    /// when the configured address cannot be listened on (the message names the setting).
    std::vector<unsigned char> make();

private:
    const HostOptions &options_;
    GlooLoader &gloo_;
    Log log_;
    std::mutex mutex_;
    bp_host_gloo_ids *ids_ = nullptr; ///< guarded by mutex_; from gloo_'s table
};

} // namespace backplane::host
