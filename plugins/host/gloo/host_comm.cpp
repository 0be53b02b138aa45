// Collectives of the host plugin: checking a collective's arguments, recording it on a stream,
// and handing it to the Gloo module (gloo_module.h) to run.
#include "host_comm.hpp"

#include "collective_names.hpp"
#include "comm_group.hpp"
#include "../host_device.hpp"

#include <limits>
#include <string>

namespace backplane::host {
namespace {

[[noreturn]] void invalid(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, message);
}

/// Throws the module's failure as the plugin's.
void check(bp_status status, const bp_error &error) {
    if (status != BP_SUCCESS) throw sdk::Error(status, error.message);
}

bp_host_gloo_settings settingsOf(const HostOptions &options) {
    auto settings = sdk::makeStruct<bp_host_gloo_settings>();
    settings.address = options.collectivesAddress.c_str();
    settings.interface = options.collectivesInterface.c_str();
    return settings;
}

} // namespace

// ---- HostComm --------------------------------------------------------------------------------

HostComm::HostComm(const void *owner, const bp_host_gloo_api &api,
                   std::shared_ptr<bp_host_gloo_comm> comm)
    : owner_(owner), api_(api), comm_(std::move(comm)) {
    api_.comm_shape(comm_.get(), &rank_, &size_);
}

void HostComm::abort() { api_.comm_abort(comm_.get()); }

std::unique_ptr<HostComm> HostComm::join(const void *owner, const bp_comm_create_args &args,
                                         const HostOptions &options, GlooLoader &gloo) {
    const bp_host_gloo_api &api = gloo.require("comm_create");
    const bp_host_gloo_settings settings = settingsOf(options);
    bp_host_gloo_comm *joined = nullptr;
    bp_error error = sdk::makeStruct<bp_error>();
    check(api.comm_join(&args, &settings, &joined, &error), error);
    // Tasks still queued hold the membership; the last one to drop it closes the connections.
    std::shared_ptr<bp_host_gloo_comm> comm(joined, api.comm_release);
    return std::unique_ptr<HostComm>(new HostComm(owner, api, std::move(comm)));
}

void HostComm::record(HostStream &stream, const bp_collective_args &args, const MemoryLookup &own) {
    bp_host_gloo_call call{};
    call.struct_size = sizeof(call);
    call.op = sdk::rawValue(args.op);
    call.type = sdk::rawValue(args.type);
    call.reduce = sdk::rawValue(args.reduce);
    call.peer = args.peer;
    call.count = args.count;
    const std::string what = std::string("collective ") + collectiveName(call.op);
    if (call.op > BP_COLLECTIVE_RECV)
        invalid("collective: op " + std::to_string(call.op) + " is not a bp_collective");
    call.element_size = sdk::dataTypeSize(args.type);
    if (call.element_size == 0)
        invalid(what + ": type " + std::to_string(call.type) + " is not a bp_data_type");
    if (reduces(call.op) && call.reduce > BP_REDUCE_AVG)
        invalid(what + ": reduce " + std::to_string(call.reduce) + " is not a bp_reduce_op");
    const uint32_t rank = rank_;
    const uint32_t size = size_;
    if (hasPeer(call.op) && call.peer >= size)
        invalid(what + ": peer " + std::to_string(call.peer) + " is not a rank of this " +
                std::to_string(size) + "-rank communicator");
    if ((call.op == BP_COLLECTIVE_SEND || call.op == BP_COLLECTIVE_RECV) && call.peer == rank)
        invalid(what + ": peer " + std::to_string(call.peer) +
                " is this rank; send and recv need another rank");

    // Byte counts, overflow-checked: count elements, or count * size for the gathered side.
    const uint64_t maxBytes = std::numeric_limits<size_t>::max();
    if (call.count > maxBytes / call.element_size)
        invalid(what + ": count " + std::to_string(call.count) + " overflows the byte count");
    const uint64_t partBytes = call.count * call.element_size;
    if (partBytes > maxBytes / size)
        invalid(what + ": count " + std::to_string(call.count) + " times " + std::to_string(size) +
                " ranks overflows the byte count");
    const uint64_t allBytes = partBytes * size;
    const bool root = rank == call.peer;
    uint64_t sendBytes = partBytes;
    uint64_t recvBytes = partBytes;
    bool usesSend = true;
    bool usesRecv = true;
    switch (call.op) {
    case BP_COLLECTIVE_REDUCE: // the result exists on the root only
        usesRecv = root;
        break;
    case BP_COLLECTIVE_BROADCAST: // only the root's data is read
        usesSend = root;
        break;
    case BP_COLLECTIVE_ALL_GATHER:
        recvBytes = allBytes;
        break;
    case BP_COLLECTIVE_REDUCE_SCATTER:
        sendBytes = allBytes;
        break;
    case BP_COLLECTIVE_SEND:
        usesRecv = false;
        break;
    case BP_COLLECTIVE_RECV:
        usesSend = false;
        break;
    default:
        break;
    }
    auto checkSide = [&](bp_memory *memory, uint64_t offset, uint64_t bytes,
                         const char *side) -> unsigned char * {
        const HostMemory *page = own(memory, what + ": " + side);
        if (bytes > page->size() || offset > page->size() - bytes)
            invalid(what + ": the " + side + " range of " + std::to_string(bytes) +
                    " bytes at offset " + std::to_string(offset) + " lies outside its page of " +
                    std::to_string(page->size()) + " bytes");
        return page->data() + offset;
    };
    if (usesSend) call.send = checkSide(args.send, args.send_offset, sendBytes, "send");
    if (usesRecv) call.recv = checkSide(args.recv, args.recv_offset, recvBytes, "recv");

    // Overlapping ranges: only the in-place layouts of NCCL are allowed.
    if (usesSend && usesRecv && sendBytes > 0 && recvBytes > 0) {
        const unsigned char *s = call.send;
        const unsigned char *r = call.recv;
        const bool overlap = s < r + recvBytes && r < s + sendBytes;
        bool inPlace = false;
        const char *layout = "";
        switch (call.op) {
        case BP_COLLECTIVE_ALL_GATHER:
            inPlace = s == r + rank * partBytes;
            layout = "send at recv + rank * count elements";
            break;
        case BP_COLLECTIVE_REDUCE_SCATTER:
            inPlace = r == s + rank * partBytes;
            layout = "recv at send + rank * count elements";
            break;
        default:
            inPlace = s == r;
            layout = "send and recv the same range";
            break;
        }
        if (overlap && !inPlace)
            invalid(what + ": the send and recv ranges overlap; the only in-place layout is " +
                    layout);
    }

    call.tag = api_.comm_next_tag(comm_.get(), call.op, call.peer);
    std::function<void()> task = [api = &api_, comm = comm_, call] {
        bp_error error = sdk::makeStruct<bp_error>();
        const bp_status status = api->comm_run(comm.get(), &call, &error);
        if (status != BP_SUCCESS) throw sdk::Error(status, error.message);
    };
    if (!deferToGroup(stream, task)) stream.submit(std::move(task));
}

// ---- CommIdMaker -----------------------------------------------------------------------------

CommIdMaker::CommIdMaker(const HostOptions &options, GlooLoader &gloo, Log log)
    : options_(options), gloo_(gloo), log_(std::move(log)) {}

CommIdMaker::~CommIdMaker() {
    if (ids_ != nullptr) gloo_.api()->ids_destroy(ids_);
}

std::vector<unsigned char> CommIdMaker::make() {
    const bp_host_gloo_api &api = gloo_.require("comm_id_create");
    std::lock_guard lock(mutex_);
    bp_error error = sdk::makeStruct<bp_error>();
    if (ids_ == nullptr) {
        const bp_host_gloo_settings settings = settingsOf(options_);
        auto forward = [](void *user, bp_log_level level, const char *message) {
            (*static_cast<Log *>(user))(level, message);
        };
        check(api.ids_create(&settings, forward, &log_, &ids_, &error), error);
    }
    std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    check(api.id_make(ids_, id.data(), id.size(), &size, &error), error);
    id.resize(size);
    return id;
}

} // namespace backplane::host
