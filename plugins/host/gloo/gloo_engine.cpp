// The host plugin's Gloo module (libbackplane_host_gloo.so): joining a communicator, one
// collective per stream task, the rendezvous store, behind the C interface of gloo_module.h. The
// plugin loads it with dlopen when collectives are first needed (gloo_loader.hpp), so only this
// module links libgloo.
#include "gloo_module.h"

#include "collective_names.hpp"
#include "comm_id.hpp"
#include "gloo_connections.hpp"
#include "../host_options.hpp"
#include "reduce_ops.hpp"
#include "store_client.hpp"
#include "store_server.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <gloo/allgather.h>
#include <gloo/allreduce.h>
#include <gloo/broadcast.h>
#include <gloo/common/error.h>
#include <gloo/config.h>
#include <gloo/reduce.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/prefix_store.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace backplane::host {
namespace {

constexpr auto kDefaultTimeout = std::chrono::milliseconds(60'000);
/// Each rank holds a connection to every other: beyond this, descriptors run out first.
constexpr uint32_t kMaxRanks = 1024;
constexpr uint64_t kLongestTimeoutMs = uint64_t{30} * 24 * 3600 * 1000; // a month: "forever"
/// How long comm_create may still spend, after a join timed out, asking the store who is missing.
constexpr auto kMissingRanksQuery = std::chrono::milliseconds(1000);
// Slot prefixes of the transfers this file makes itself; Gloo's own collectives use 0x01..0x08.
constexpr uint64_t kSendUpSlotPrefix = 0x70;        ///< from a lower to a higher rank
constexpr uint64_t kSendDownSlotPrefix = 0x71;      ///< from a higher to a lower rank
constexpr uint64_t kReduceScatterSlotPrefix = 0x72; ///< plus the ring's step

[[noreturn]] void invalid(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, message);
}

std::chrono::milliseconds timeoutOf(const bp_comm_create_args &args) {
    if (args.timeout_ms == 0) return kDefaultTimeout;
    return std::chrono::milliseconds(
        static_cast<int64_t>(std::min<uint64_t>(args.timeout_ms, kLongestTimeoutMs)));
}

/// Gloo's TCP device: on the configured interface or address, else the host name's address,
/// else loopback.
std::shared_ptr<gloo::transport::Device> createDevice(const HostOptions &options,
                                                      const std::string &what) {
    std::string source;
    const std::string interface = configuredInterface(options);
    const std::string address = configuredAddress(options, source);
    auto create = [&](const gloo::transport::tcp::attr &attr, const std::string &where) {
        try {
            return gloo::transport::tcp::CreateDevice(attr);
        } catch (const std::exception &e) { // EnforceNotMet, gloo::Exception, system_error
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             what + ": Gloo cannot open a TCP device on " + where + ": " +
                                 e.what() +
                                 "; set BACKPLANE_GLOO_ADDRESS (or BACKPLANE_GLOO_INTERFACE) to "
                                 "an address (interface) of this machine the other ranks reach");
        }
    };
    gloo::transport::tcp::attr attr;
    if (!interface.empty()) {
        attr.iface = interface;
        return create(attr, "interface '" + interface + "'");
    }
    if (!address.empty()) {
        attr.hostname = address;
        return create(attr, "'" + address + "' (from " + source + ")");
    }
    if (const std::string named = hostNameAddress(); !named.empty()) {
        attr.hostname = named;
        try {
            return create(attr, "the host name's address " + named);
        } catch (const sdk::Error &) { // e.g. a name that resolves to another machine: loopback
        }
    }
    attr.hostname = "127.0.0.1";
    return create(attr, "127.0.0.1");
}

} // namespace

// ---- state ---------------------------------------------------------------------------------

/// One rank's membership: shared by its handle and the collectives running on it.
struct CommState {
    uint32_t rank = 0;
    uint32_t size = 1;
    std::chrono::milliseconds timeout{};
    std::string store; ///< "host:port", for messages
    std::shared_ptr<gloo::transport::Device> device;
    std::shared_ptr<gloo::rendezvous::Context> context; ///< after device: destroyed first

    std::atomic<bool> broken{false};
    std::mutex mutex;
    std::string brokenReason;       ///< guarded by mutex
    bool connectionsFailed = false; ///< guarded by mutex
    uint32_t nextTag = 0;           ///< guarded by mutex: tag of the next collective
    std::vector<uint32_t> sent;     ///< guarded by mutex: sends to each peer so far
    std::vector<uint32_t> received; ///< guarded by mutex: receives from each peer so far
    /// Gloo buffers of the collectives running now (guarded by mutex), so that breakComm can
    /// interrupt their waits: Gloo does not wake a send whose data is being written when the
    /// connection fails (only pending ones), so without this it would wait for its timeout.
    std::set<gloo::transport::UnboundBuffer *> running;

    std::string rankText() const {
        return "rank " + std::to_string(rank) + " of " + std::to_string(size);
    }

    /// Marks the communicator unusable and fails its connections (once). Never throws.
    void breakComm(const std::string &reason) noexcept {
        try {
            std::lock_guard lock(mutex);
            if (!broken.load()) {
                brokenReason = reason;
                broken.store(true);
            }
            // The sockets first, as if the network failed: Gloo fails what is pending on them.
            // Then the waits Gloo does not wake (a send being written).
            if (!connectionsFailed && context) {
                connectionsFailed = true;
                shutDownConnections(*context);
            }
            for (gloo::transport::UnboundBuffer *buffer : running) {
                buffer->abortWaitSend();
                buffer->abortWaitRecv();
            }
        } catch (...) { // NOLINT(bugprone-empty-catch): the broken flag is what counts
            broken.store(true);
        }
    }

    /// Returns once no connection of the broken communicator can still touch the memory of a
    /// collective that ends now: a send whose wait was interrupted may still be written by
    /// Gloo's device thread until that thread saw the shutdown and closed the socket. Waits for
    /// that (it also fails what is pending on the socket), then closes what is left by force:
    /// Gloo's close takes each connection's lock, so no write is in progress after it.
    void awaitClosed() noexcept {
        if (!context) return;
        try {
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(1);
            while (anyConnectionOpen(*context) && std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            context->closeConnections();
        } catch (...) { // NOLINT(bugprone-empty-catch): closing is best effort
        }
    }

    [[noreturn]] void throwBroken(const std::string &operation) {
        std::string reason;
        {
            std::lock_guard lock(mutex);
            reason = brokenReason;
        }
        throw sdk::Error(BP_ERROR_REMOTE, operation + " on " + rankText() +
                                              ": the communicator is unusable (" + reason +
                                              "); destroy it and create a new one");
    }
};

namespace {

using Call = bp_host_gloo_call;

using ContextPointer = std::shared_ptr<gloo::Context>;
using BufferPointer = std::unique_ptr<gloo::transport::UnboundBuffer>;

/// The Gloo buffers of one running collective, listed in State::running while it lives. Declare
/// it after whatever owns the buffers (Gloo's options), so it ends first.
class RunningBuffers {
public:
    explicit RunningBuffers(CommState &state) : state_(state) {}
    ~RunningBuffers() {
        std::lock_guard lock(state_.mutex);
        for (gloo::transport::UnboundBuffer *b : mine_)
            state_.running.erase(b);
    }
    RunningBuffers(const RunningBuffers &) = delete;
    RunningBuffers &operator=(const RunningBuffers &) = delete;

    /// A buffer over `size` bytes at `data`, interrupted by breakComm (at once if it already ran).
    BufferPointer make(void *data, size_t size) {
        BufferPointer b = state_.context->createUnboundBuffer(data, size);
        std::lock_guard lock(state_.mutex);
        mine_.push_back(b.get()); // first: if insert throws, the destructor's erase is harmless
        state_.running.insert(b.get());
        if (state_.broken.load()) {
            b->abortWaitSend();
            b->abortWaitRecv();
        }
        return b;
    }

private:
    CommState &state_;
    std::vector<gloo::transport::UnboundBuffer *> mine_;
};

/// Runs the Gloo algorithm of `call`; T only gives Gloo the element size.
template <class T> void runGloo(CommState &state, const Call &call) {
    const ContextPointer context = state.context;
    const size_t bytes = static_cast<size_t>(call.count) * sizeof(T);
    const uint32_t rank = state.rank;
    const bool average = call.reduce == BP_REDUCE_AVG;
    const ReduceFunction reduce = reduceFunction(call.type, call.reduce);

    switch (call.op) {
    case BP_COLLECTIVE_ALL_REDUCE: {
        gloo::AllreduceOptions options(context);
        RunningBuffers running(state);
        if (call.send != call.recv) options.setInput<T>(running.make(call.send, bytes));
        options.setOutput<T>(running.make(call.recv, bytes));
        options.setReduceFunction(reduce);
        options.setTag(call.tag);
        options.setTimeout(state.timeout);
        gloo::allreduce(options);
        if (average) divideElements(call.recv, call.count, call.type, state.size);
        return;
    }
    case BP_COLLECTIVE_REDUCE: {
        // Gloo uses every rank's output as scratch: only the root's is the caller's buffer.
        const bool root = rank == call.peer;
        std::vector<unsigned char> scratch(root ? 0 : bytes);
        unsigned char *out = root ? call.recv : scratch.data();
        gloo::ReduceOptions options(context);
        RunningBuffers running(state);
        if (call.send != out) options.setInput<T>(running.make(call.send, bytes));
        options.setOutput<T>(running.make(out, bytes));
        options.setRoot(static_cast<int>(call.peer));
        options.setReduceFunction(reduce);
        options.setTag(call.tag);
        options.setTimeout(state.timeout);
        gloo::reduce(options);
        if (average && root) divideElements(call.recv, call.count, call.type, state.size);
        return;
    }
    case BP_COLLECTIVE_BROADCAST: {
        gloo::BroadcastOptions options(context);
        RunningBuffers running(state);
        if (rank == call.peer && call.send != call.recv)
            options.setInput<T>(running.make(call.send, bytes));
        options.setOutput<T>(running.make(call.recv, bytes));
        options.setRoot(static_cast<int>(call.peer));
        options.setTag(call.tag);
        options.setTimeout(state.timeout);
        gloo::broadcast(options);
        return;
    }
    case BP_COLLECTIVE_ALL_GATHER: {
        gloo::AllgatherOptions options(context);
        RunningBuffers running(state);
        if (call.send != call.recv + rank * bytes) // else in place: already in its slot
            options.setInput<T>(running.make(call.send, bytes));
        options.setOutput<T>(running.make(call.recv, bytes * state.size));
        options.setTag(call.tag);
        options.setTimeout(state.timeout);
        gloo::allgather(options);
        return;
    }
    case BP_COLLECTIVE_REDUCE_SCATTER: {
        // Gloo 0.5 has no reduce-scatter on unbound buffers: a ring. At step k rank r sends its
        // partial result of part (r - k - 1) to rank r + 1 and receives rank r - 1's partial
        // result of part (r - k - 2), to which it adds its own; after size - 1 steps it holds
        // part r reduced over every rank. Each rank sends (size - 1) / size of its data.
        const uint32_t n = state.size;
        auto part = [&](uint32_t p) { return call.send + size_t{p} * bytes; };
        if (n == 1) {
            std::memmove(call.recv, call.send, bytes);
            return;
        }
        std::vector<unsigned char> scratch(2 * bytes); // [partial to send | partial received]
        RunningBuffers running(state);
        BufferPointer own = running.make(call.send, bytes * n);
        BufferPointer partial = running.make(scratch.data(), scratch.size());
        const auto right = static_cast<int>((rank + 1) % n);
        const auto left = static_cast<int>((rank + n - 1) % n);
        const uint64_t slot = (kReduceScatterSlotPrefix << 56) | (uint64_t{call.tag} << 24);
        for (uint32_t k = 0; k + 1 < n; ++k) {
            const uint32_t sent = (rank + 2 * n - k - 1) % n;
            const uint32_t received = (rank + 2 * n - k - 2) % n;
            partial->recv(left, slot + k, bytes, bytes);
            gloo::transport::UnboundBuffer &from = k == 0 ? *own : *partial;
            from.send(right, slot + k, k == 0 ? size_t{sent} * bytes : 0, bytes);
            if (!partial->waitRecv(state.timeout) || !from.waitSend(state.timeout))
                throw gloo::IoException("the transfer was interrupted");
            unsigned char *out = k + 2 == n ? call.recv : scratch.data();
            reduce(out, part(received), scratch.data() + bytes, call.count);
        }
        if (average) divideElements(call.recv, call.count, call.type, state.size);
        return;
    }
    case BP_COLLECTIVE_SEND:
    case BP_COLLECTIVE_RECV: {
        const bool sending = call.op == BP_COLLECTIVE_SEND;
        const uint32_t from = sending ? rank : call.peer;
        const uint32_t to = sending ? call.peer : rank;
        const uint64_t slot = ((from < to ? kSendUpSlotPrefix : kSendDownSlotPrefix) << 56) |
                              (uint64_t{call.tag} << 24);
        RunningBuffers running(state);
        const auto peer = static_cast<int>(call.peer);
        // A header first: Gloo ends the process (an enforce on its own thread) when more bytes
        // arrive than the receiver posted, so the receiver checks the size before posting.
        uint64_t header[2] = {bytes, call.type};
        auto head = running.make(header, sizeof header);
        bool completed = false;
        if (sending) {
            head->send(peer, slot | 1);
            completed = head->waitSend(state.timeout);
        } else {
            head->recv(peer, slot | 1);
            completed = head->waitRecv(state.timeout);
            if (completed && (header[0] != bytes || header[1] != call.type))
                throw gloo::IoException(
                    "rank " + std::to_string(call.peer) + " sends " + std::to_string(header[0]) +
                    " bytes of type " + std::to_string(header[1]) + ", this rank receives " +
                    std::to_string(bytes) + " of type " + std::to_string(call.type) +
                    " (every send must match its recv)");
        }
        if (!completed) throw gloo::IoException("the transfer was interrupted");
        auto data = running.make(sending ? call.send : call.recv, bytes);
        if (sending) {
            data->send(peer, slot);
            completed = data->waitSend(state.timeout);
        } else {
            data->recv(peer, slot);
            completed = data->waitRecv(state.timeout);
        }
        if (!completed) throw gloo::IoException("the transfer was interrupted");
        return;
    }
    default:
        return;
    }
}

void maxInt64(void *out, const void *a, const void *b, size_t count) {
    for (size_t i = 0; i < count; ++i) {
        int64_t x, y;
        std::memcpy(&x, static_cast<const char *>(a) + i * 8, 8);
        std::memcpy(&y, static_cast<const char *>(b) + i * 8, 8);
        x = std::max(x, y);
        std::memcpy(static_cast<char *>(out) + i * 8, &x, 8);
    }
}

/// Every rank runs the same collective with the same count, type, reduction and root, checked
/// with a small fixed-size all-reduce before any data moves: Gloo ends the process (an enforce
/// on its own thread) when a peer sends more bytes than were posted, so a mismatch must never
/// reach the data transfer. Max of (v, -v) gives each field's max and min at once.
void checkRanksAgree(CommState &state, const Call &call) {
    const bool rooted = call.op == BP_COLLECTIVE_REDUCE || call.op == BP_COLLECTIVE_BROADCAST;
    const int64_t mine[4] = {call.op, call.type, static_cast<int64_t>(call.count),
                             rooted ? static_cast<int64_t>(call.peer) : -1};
    int64_t signature[8];
    for (int i = 0; i < 4; ++i) {
        signature[i] = mine[i];
        signature[4 + i] = -mine[i];
    }
    gloo::AllreduceOptions options(state.context);
    RunningBuffers running(state);
    options.setOutput<int64_t>(running.make(signature, sizeof signature));
    options.setReduceFunction(&maxInt64);
    options.setTag(call.tag | 0x80000000u);
    options.setTimeout(state.timeout);
    gloo::allreduce(options);
    static const char *const kFields[4] = {"operation", "type", "count", "root"};
    for (int i = 0; i < 4; ++i)
        if (signature[i] != mine[i] || -signature[4 + i] != mine[i])
            throw gloo::IoException(
                std::string("the ranks disagree on the collective's ") + kFields[i] +
                " (this rank: " + std::to_string(mine[i]) + ", others between " +
                std::to_string(-signature[4 + i]) + " and " + std::to_string(signature[i]) +
                "); every rank must issue the same collectives in the same order");
}

/// Runs one recorded collective: the body of its stream task.
void runCall(CommState &state, const Call &call) {
    const std::string name = collectiveName(call.op);
    if (state.broken.load()) state.throwBroken(name);
    if (call.count == 0) return;
    const SigpipeBlocked quiet;
    std::string failure;
    bp_status code = BP_ERROR_REMOTE;
    try {
        if (call.op != BP_COLLECTIVE_SEND && call.op != BP_COLLECTIVE_RECV && state.size > 1)
            checkRanksAgree(state, call);
        switch (call.element_size) {
        case 1:
            runGloo<uint8_t>(state, call);
            break;
        case 2:
            runGloo<uint16_t>(state, call);
            break;
        case 4:
            runGloo<uint32_t>(state, call);
            break;
        default:
            runGloo<uint64_t>(state, call);
            break;
        }
        // breakComm interrupts waits, and Gloo's algorithms go on past an interrupted wait.
        if (!state.broken.load()) return;
        failure = "interrupted";
    } catch (const std::bad_alloc &) {
        code = BP_ERROR_OUT_OF_MEMORY;
        failure = "out of host memory for its scratch buffer";
    } catch (const std::exception &e) { // gloo::IoException (a peer left, a timeout), enforce
        failure = e.what();
    } catch (...) {
        failure = "a non-standard exception";
    }
    // Broken before Gloo noticed (comm_abort, or a failure on another stream): that is the cause,
    // Gloo only saw its connections closed.
    std::string cause = failure;
    if (state.broken.load()) {
        std::lock_guard lock(state.mutex);
        cause = state.brokenReason + " (Gloo: " + failure + ")";
    }
    state.breakComm(name + " failed on " + state.rankText() + ": " + failure);
    state.awaitClosed();
    throw sdk::Error(code, name + " on " + state.rankText() + " failed: " + cause +
                               ". A peer failed, left or timed out, or comm_abort was called; "
                               "the communicator is unusable: destroy it and create a new one");
}

} // namespace

// ---- joining -------------------------------------------------------------------------------

/// Joins the communicator of `args` (comm_create). Blocks until every rank joined. Errors:
/// BP_ERROR_INVALID_ARGUMENT for a malformed id or a bad address setting, BP_ERROR_TIMEOUT when
/// the ranks did not all join within args.timeout_ms (default 60 s; the message names the store
/// and the missing ranks), BP_ERROR_REMOTE when a peer or the store failed during the join.
std::shared_ptr<CommState> joinComm(const bp_comm_create_args &args, const HostOptions &options) {
    const CommId id = decodeCommId(args.id, args.id_size);
    if (args.size > kMaxRanks)
        invalid("comm_create: " + std::to_string(args.size) +
                " ranks; the host plugin's Gloo "
                "communicators hold at most " +
                std::to_string(kMaxRanks) + " (a full mesh of TCP connections)");
    auto state = std::make_shared<CommState>();
    state->rank = args.rank;
    state->size = args.size;
    state->timeout = timeoutOf(args);
    state->store = endpointText(id.host, id.port);
    state->sent.assign(args.size, 0);
    state->received.assign(args.size, 0);
    const std::string what = "comm_create (" + state->rankText() + ")";
    const auto start = store::Clock::now();
    const auto deadline = start + state->timeout;

    const SigpipeBlocked quiet; // Gloo's device thread starts here and inherits the mask
    state->device = createDevice(options, what);

    const auto timedOut = [&](const std::string &detail) {
        const auto waited =
            std::chrono::duration_cast<std::chrono::milliseconds>(store::Clock::now() - start);
        return sdk::Error(BP_ERROR_TIMEOUT, what + ": not every rank joined within " +
                                                std::to_string(state->timeout.count()) +
                                                " ms (waited " + std::to_string(waited.count()) +
                                                " ms) at the rendezvous store " + state->store +
                                                ": " + detail);
    };
    std::unique_ptr<StoreClient> client;
    try {
        client = std::make_unique<StoreClient>(id, deadline);
    } catch (const StoreTimeout &e) {
        throw timedOut(e.what());
    } catch (const StoreFailure &e) {
        throw sdk::Error(BP_ERROR_REMOTE, what + ": " + e.what());
    }

    const std::string prefix = nonceHex(id.nonce);
    gloo::rendezvous::PrefixStore prefixed(prefix, *client);
    auto context = std::make_shared<gloo::rendezvous::Context>(static_cast<int>(args.rank),
                                                               static_cast<int>(args.size));
    try {
        // The remaining time bounds Gloo's waits for its pairs' connections too.
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - store::Clock::now());
        context->setTimeout(std::max(left, std::chrono::milliseconds(1)));
        context->connectFullMesh(prefixed, state->device);
    } catch (const StoreTimeout &e) {
        // Which ranks never arrived: each rank's first act is setting "<nonce>/rank_<r>".
        std::string detail = e.what();
        try {
            client->setDeadline(store::Clock::now() + kMissingRanksQuery);
            std::vector<std::string> keys;
            for (uint32_t r = 0; r < args.size; ++r)
                keys.push_back(prefix + "/rank_" + std::to_string(r));
            const std::vector<bool> present = client->check(keys);
            std::string missing;
            uint32_t absent = 0;
            for (uint32_t r = 0; r < args.size; ++r) {
                if (present[r]) continue;
                if (absent++ < 16) missing += (missing.empty() ? "" : ", ") + std::to_string(r);
            }
            if (absent > 16) missing += ", ...";
            if (absent > 0)
                detail = std::to_string(absent) + " of " + std::to_string(args.size) +
                         " ranks never joined (rank" + (absent > 1 ? "s " : " ") + missing + ")";
            else
                detail = "every rank joined, but not every rank published its addresses (" +
                         detail + ")";
        } catch (const std::exception &) { // NOLINT(bugprone-empty-catch): keep the first text
        }
        throw timedOut(detail);
    } catch (const StoreFailure &e) {
        throw sdk::Error(BP_ERROR_REMOTE, what + ": " + e.what());
    } catch (const std::exception &e) { // Gloo: a pair could not connect, or its wait timed out
        const bool late = store::Clock::now() >= deadline;
        if (late) throw timedOut(std::string("Gloo could not connect every pair: ") + e.what());
        throw sdk::Error(BP_ERROR_REMOTE,
                         what + ": Gloo could not connect to a peer: " + e.what() +
                             " (did a rank exit, or is an address unreachable? see "
                             "BACKPLANE_GLOO_ADDRESS)");
    }
    try {
        client->done(args.rank, args.size);
    } catch (const std::exception &) { // NOLINT(bugprone-empty-catch): only lets the store forget
    }
    context->setTimeout(state->timeout);
    state->context = std::move(context);
    return state;
}

// ---- ids ------------------------------------------------------------------------------------

/// The plugin's side of comm_id_create: its rendezvous store, started with the first id and
/// serving until this object is destroyed (with the plugin), and the ids naming it. Thread-safe.
class CommIdMaker {
public:
    using Log = std::function<void(bp_log_level, const std::string &)>;
    /// Cheap: nothing starts before the first make().
    CommIdMaker(HostOptions options, Log log)
        : options_(std::move(options)), log_(std::move(log)) {}
    CommIdMaker(const CommIdMaker &) = delete;
    CommIdMaker &operator=(const CommIdMaker &) = delete;

    /// A new id. Throws BP_ERROR_INVALID_ARGUMENT when the configured address cannot be listened
    /// on (the message names the setting).
    std::vector<unsigned char> make();

private:
    void startStore(); ///< with mutex_ held

    const HostOptions options_;
    Log log_;
    std::mutex mutex_;
    std::unique_ptr<StoreServer> store_; ///< guarded by mutex_
    std::string advertisedHost_;         ///< guarded by mutex_: the host ids name
};

std::vector<unsigned char> CommIdMaker::make() {
    std::lock_guard lock(mutex_);
    if (!store_) startStore();
    CommId id;
    id.nonce = randomNonce();
    id.host = advertisedHost_;
    id.port = store_->port();
    store_->admit(id.nonce);
    return encodeCommId(id);
}

void CommIdMaker::startStore() {
    std::string source;
    const std::string address = configuredAddress(options_, source);
    if (!address.empty()) {
        try {
            store_ = std::make_unique<StoreServer>(address);
        } catch (const std::exception &e) {
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             "comm_id_create: cannot start the rendezvous store on '" + address +
                                 "' (from " + source + "): " + e.what() +
                                 "; give an address of this machine that every rank reaches");
        }
        advertisedHost_ = address; // as given: a host name resolves on each rank's machine
    } else {
        if (const std::string named = hostNameAddress(); !named.empty()) {
            try {
                store_ = std::make_unique<StoreServer>(named);
            } catch (const std::exception &e) {
                log_(BP_LOG_WARN, std::string("collectives: the host name's address does not work "
                                              "for the rendezvous store (") +
                                      e.what() + "); using 127.0.0.1");
            }
        }
        if (!store_) {
            try {
                store_ = std::make_unique<StoreServer>("127.0.0.1");
            } catch (const std::exception &e) {
                throw sdk::Error(BP_ERROR_INTERNAL,
                                 std::string("comm_id_create: cannot start the rendezvous store "
                                             "on 127.0.0.1: ") +
                                     e.what());
            }
        }
        advertisedHost_ = store_->host();
    }
    log_(BP_LOG_DEBUG, "collectives: rendezvous store listening on " +
                           endpointText(store_->host(), store_->port()) + ", ids name " +
                           endpointText(advertisedHost_, store_->port()));
}

HostOptions optionsOf(const bp_host_gloo_settings *settings) {
    HostOptions options;
    if (settings == nullptr) return options;
    if (settings->address != nullptr) options.collectivesAddress = settings->address;
    if (settings->interface != nullptr) options.collectivesInterface = settings->interface;
    return options;
}

const std::string kEngine = "gloo " + std::to_string(GLOO_VERSION_MAJOR) + "." +
                            std::to_string(GLOO_VERSION_MINOR) + "." +
                            std::to_string(GLOO_VERSION_PATCH) + " (tcp)";

} // namespace backplane::host

// ---- the C interface (gloo_module.h) -----------------------------------------------------------

struct bp_host_gloo_ids {
    backplane::host::CommIdMaker maker;
};

struct bp_host_gloo_comm {
    std::shared_ptr<backplane::host::CommState> state;
};

namespace {

using backplane::host::CommState;
namespace sdk = backplane::sdk;

bp_host_gloo_comm &commOf(bp_host_gloo_comm *comm) {
    if (comm == nullptr) throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "null communicator");
    return *comm;
}

const bp_host_gloo_api kApi = [] {
    bp_host_gloo_api api{};
    api.struct_size = sizeof(api);
    api.version = BP_HOST_GLOO_MODULE_VERSION;
    api.engine = backplane::host::kEngine.c_str();
    api.ids_create = [](const bp_host_gloo_settings *settings, bp_host_gloo_log_fn log,
                        void *logUser, bp_host_gloo_ids **out, bp_error *error) {
        return sdk::detail::guard(error, [&] {
            auto forward = [log, logUser](bp_log_level level, const std::string &message) {
                if (log != nullptr) log(logUser, level, message.c_str());
            };
            sdk::detail::outParam(out, "ids_create") =
                new bp_host_gloo_ids{{backplane::host::optionsOf(settings), forward}};
        });
    };
    api.ids_destroy = [](bp_host_gloo_ids *ids) { sdk::detail::guardRelease([&] { delete ids; }); };
    api.id_make = [](bp_host_gloo_ids *ids, void *out, size_t capacity, size_t *size,
                     bp_error *error) {
        return sdk::detail::guard(error, [&] {
            size_t &written = sdk::detail::outParam(size, "comm_id_create");
            if (ids == nullptr || out == nullptr)
                throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "comm_id_create: a NULL argument");
            const std::vector<unsigned char> id = ids->maker.make();
            if (id.size() > capacity)
                throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                                 "comm_id_create: the id takes " + std::to_string(id.size()) +
                                     " bytes, the buffer holds " + std::to_string(capacity));
            std::memcpy(out, id.data(), id.size());
            written = id.size();
        });
    };
    api.comm_join = [](const bp_comm_create_args *args, const bp_host_gloo_settings *settings,
                       bp_host_gloo_comm **out, bp_error *error) {
        return sdk::detail::guard(error, [&] {
            bp_host_gloo_comm *&result = sdk::detail::outParam(out, "comm_create");
            const bp_comm_create_args a = sdk::detail::readArgs(args);
            result = new bp_host_gloo_comm{
                backplane::host::joinComm(a, backplane::host::optionsOf(settings))};
        });
    };
    api.comm_release = [](bp_host_gloo_comm *comm) {
        sdk::detail::guardRelease([&] { delete comm; });
    };
    api.comm_abort = [](bp_host_gloo_comm *comm) {
        sdk::detail::guardRelease(
            [&] { commOf(comm).state->breakComm("the communicator was aborted (comm_abort)"); });
    };
    api.comm_shape = [](const bp_host_gloo_comm *comm, uint32_t *rank, uint32_t *size) {
        if (comm == nullptr) return;
        if (rank != nullptr) *rank = comm->state->rank;
        if (size != nullptr) *size = comm->state->size;
    };
    api.comm_next_tag = [](bp_host_gloo_comm *comm, uint32_t op, uint32_t peer) -> uint32_t {
        if (comm == nullptr) return 0;
        CommState &state = *comm->state;
        std::lock_guard lock(state.mutex);
        if (op == BP_COLLECTIVE_SEND && peer < state.size) return state.sent[peer]++;
        if (op == BP_COLLECTIVE_RECV && peer < state.size) return state.received[peer]++;
        return state.nextTag++;
    };
    api.comm_run = [](bp_host_gloo_comm *comm, const bp_host_gloo_call *call, bp_error *error) {
        return sdk::detail::guard(error, [&] {
            const bp_host_gloo_call c = sdk::detail::readArgs(call);
            backplane::host::runCall(*commOf(comm).state, c);
        });
    };
    return api;
}();

} // namespace

extern "C" __attribute__((visibility("default"))) const bp_host_gloo_api *
bp_host_gloo_module(uint32_t version) {
    return version == BP_HOST_GLOO_MODULE_VERSION ? &kApi : nullptr;
}
