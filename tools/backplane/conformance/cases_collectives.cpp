// Cases over ABI 1.1: per-pair peer access and collectives. A single-rank communicator needs no
// other process, so every plugin that declares BP_CAPABILITY_COLLECTIVES is checked here: ids,
// joining, a stream-ordered all-reduce and broadcast, argument refusals, abort.
#include "handles.hpp"

#include <cstring>

namespace backplane::conformance {
namespace {

/// A communicator of one rank on the device under test, destroyed at scope exit.
class SoloComm {
public:
    explicit SoloComm(OpenDevice &device, bp_plugin *plugin) : device_(device) {
        std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
        size_t size = 0;
        bp_error error = makeError();
        succeed(device.api().comm_id_create(plugin, id.data(), id.size(), &size, &error), error,
                "comm_id_create");
        require(size > 0 && size <= BP_COMM_ID_MAX_BYTES,
                "comm_id_create gave " + std::to_string(size) + " bytes");
        auto args = abi::make<bp_comm_create_args>();
        args.id = id.data();
        args.id_size = size;
        args.rank = 0;
        args.size = 1;
        args.timeout_ms = 20000;
        succeed(device.api().comm_create(device.get(), &args, &comm_, &error), error,
                "comm_create (rank 0 of 1)");
        require(comm_ != nullptr, "comm_create succeeded without a communicator");
    }
    ~SoloComm() { device_.api().comm_destroy(device_.get(), comm_); }
    SoloComm(const SoloComm &) = delete;
    SoloComm &operator=(const SoloComm &) = delete;
    bp_comm *get() const noexcept { return comm_; }

private:
    OpenDevice &device_;
    bp_comm *comm_ = nullptr;
};

bp_collective_args allReduce(const Page &send, const Page &recv, uint64_t count) {
    auto a = abi::make<bp_collective_args>();
    a.op = BP_COLLECTIVE_ALL_REDUCE;
    a.type = BP_DATA_F32;
    a.reduce = BP_REDUCE_SUM;
    a.send = send.get();
    a.recv = recv.get();
    a.count = count;
    return a;
}

bool hasCollectiveTable(const bp_plugin_api &api) {
    return api.comm_id_create && api.comm_create && api.comm_destroy && api.comm_abort &&
           api.comm_group && api.collective;
}

/// NotApplicable unless the device declares collectives (with the whole table).
void needCollectives(CaseContext &ctx) {
    if (!ctx.declares(BP_CAPABILITY_COLLECTIVES))
        throw NotApplicable("the device does not declare BP_CAPABILITY_COLLECTIVES");
}

} // namespace

CONFORMANCE_CASE("collectives.declared",
                 "BP_CAPABILITY_COLLECTIVES comes with the whole comm table and an engine name; "
                 "without it comm_id_create fails cleanly") {
    const bp_plugin_api &api = ctx.api();
    const bool declared = ctx.declares(BP_CAPABILITY_COLLECTIVES);
    const bool table = ctx.raw().has(&bp_plugin_api::comm_id_create) && hasCollectiveTable(api);
    if (declared) {
        require(table, "COLLECTIVES is declared but a comm_* function or collective is NULL");
        require(fieldText(ctx.info().collectives, sizeof(ctx.info().collectives)) != "",
                "COLLECTIVES is declared but bp_device_info::collectives names no engine");
        return;
    }
    if (!ctx.raw().has(&bp_plugin_api::comm_id_create) || api.comm_id_create == nullptr) return;
    std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    bp_error error = makeError();
    const bp_status status = api.comm_id_create(ctx.plugin(), id.data(), id.size(), &size, &error);
    if (status != BP_SUCCESS)
        expectFailure(status, error, {BP_ERROR_UNSUPPORTED}, "comm_id_create without COLLECTIVES");
}

CONFORMANCE_CASE("collectives.single_rank",
                 "a one-rank communicator all-reduces and broadcasts in stream order, also in place") {
    needCollectives(ctx);
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    SoloComm comm(device, ctx.plugin());
    const uint64_t count = 1000;
    std::vector<float> values(count);
    for (uint64_t i = 0; i < count; ++i) values[i] = static_cast<float>(i % 97) - 48.0f;
    const Page send = device.pageWith(stream, floatBytes(values));
    const Page recv = device.allocate(BP_MEMORY_DEVICE, count * 4);
    device.fill(stream, recv, 0, count * 4, 0);
    bp_error error = makeError();
    bp_collective_args a = allReduce(send, recv, count);
    succeed(device.api().collective(device.get(), stream.get(), comm.get(), &a, &error), error,
            "collective(all_reduce)");
    require(bytesToFloats(device.readAll(stream, recv)) == values,
            "a one-rank all-reduce (sum) did not copy send to recv");
    a.recv = send.get(); // in place
    a.reduce = BP_REDUCE_MAX;
    succeed(device.api().collective(device.get(), stream.get(), comm.get(), &a, &error), error,
            "collective(all_reduce in place)");
    a.op = BP_COLLECTIVE_BROADCAST;
    a.recv = recv.get();
    a.peer = 0;
    device.fill(stream, recv, 0, count * 4, 0);
    succeed(device.api().collective(device.get(), stream.get(), comm.get(), &a, &error), error,
            "collective(broadcast)");
    require(bytesToFloats(device.readAll(stream, recv)) == values,
            "a one-rank broadcast did not copy send to recv");
    succeed(device.api().comm_group(ctx.plugin(), 1, &error), error, "comm_group(begin)");
    succeed(device.api().comm_group(ctx.plugin(), 0, &error), error, "comm_group(end)");
}

CONFORMANCE_CASE("collectives.bad_arguments",
                 "collective refuses unknown ops, types and reductions, a peer past the size, "
                 "ranges past the page and NULL memory, writing nothing") {
    needCollectives(ctx);
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    SoloComm comm(device, ctx.plugin());
    const Page send = device.pageWith(stream, patternBytes(4096, 7));
    const Page recv = device.pageWith(stream, patternBytes(4096, 9));
    const std::vector<uint8_t> before = device.readAll(stream, recv);
    const auto refused = [&](bp_collective_args a, const std::string &what) {
        bp_error error = makeError();
        const bp_status status =
            device.api().collective(device.get(), stream.get(), comm.get(), &a, &error);
        expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT}, "collective with " + what);
    };
    bp_collective_args a = allReduce(send, recv, 1024);
    bp_collective_args bad = a;
    bad.op = rawEnum<bp_collective>(77);
    refused(bad, "op 77");
    bad = a;
    bad.type = rawEnum<bp_data_type>(99);
    refused(bad, "type 99");
    bad = a;
    bad.reduce = rawEnum<bp_reduce_op>(42);
    refused(bad, "reduce 42");
    bad = a;
    bad.op = BP_COLLECTIVE_BROADCAST;
    bad.peer = 1;
    refused(bad, "root 1 of a one-rank communicator");
    bad = a;
    bad.count = 1025;
    refused(bad, "1025 floats in a 4096-byte page");
    bad = a;
    bad.recv_offset = UINT64_MAX - 3;
    refused(bad, "an overflowing receive offset");
    bad = a;
    bad.send = nullptr;
    refused(bad, "a NULL send page");
    bp_error error = makeError();
    expectFailure(device.api().collective(device.get(), stream.get(), comm.get(), nullptr, &error),
                  error, {BP_ERROR_INVALID_ARGUMENT}, "collective with NULL args");
    require(device.readAll(stream, recv) == before, "a refused collective wrote the receive page");
}

CONFORMANCE_CASE("collectives.join_arguments",
                 "comm_create refuses rank >= size, size 0, NULL out pointers and a malformed id") {
    needCollectives(ctx);
    OpenDevice &device = ctx.device();
    const bp_plugin_api &api = device.api();
    std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    bp_error error = makeError();
    succeed(api.comm_id_create(ctx.plugin(), id.data(), id.size(), &size, &error), error,
            "comm_id_create");
    expectFailure(api.comm_id_create(ctx.plugin(), id.data(), id.size(), nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "comm_id_create with a NULL size");
    auto args = abi::make<bp_comm_create_args>();
    args.id = id.data();
    args.id_size = size;
    args.size = 1;
    args.timeout_ms = 2000;
    bp_comm *comm = nullptr;
    args.rank = 1;
    expectFailure(api.comm_create(device.get(), &args, &comm, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "comm_create with rank 1 of 1");
    args.rank = 0;
    args.size = 0;
    expectFailure(api.comm_create(device.get(), &args, &comm, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "comm_create with size 0");
    args.size = 1;
    expectFailure(api.comm_create(device.get(), &args, nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "comm_create with a NULL out pointer");
    std::vector<unsigned char> garbage(size, 0xab);
    args.id = garbage.data();
    const bp_status status = api.comm_create(device.get(), &args, &comm, &error);
    if (status == BP_SUCCESS) {
        api.comm_destroy(device.get(), comm); // an engine whose ids are opaque random bytes
        return;
    }
    expectFailure(status, error,
                  {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_TIMEOUT, BP_ERROR_REMOTE},
                  "comm_create with a malformed id");
}

CONFORMANCE_CASE("collectives.abort",
                 "after comm_abort a collective fails with BP_ERROR_REMOTE (from the call or the "
                 "stream's next event), and the communicator can still be destroyed") {
    needCollectives(ctx);
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    SoloComm comm(device, ctx.plugin());
    const Page send = device.pageWith(stream, patternBytes(4096, 3));
    const Page recv = device.allocate(BP_MEMORY_DEVICE, 4096);
    device.api().comm_abort(device.get(), comm.get());
    device.api().comm_abort(device.get(), comm.get()); // twice is harmless
    bp_collective_args a = allReduce(send, recv, 1024);
    bp_error error = makeError();
    bp_status status = device.api().collective(device.get(), stream.get(), comm.get(), &a, &error);
    if (status == BP_SUCCESS) {
        bp_event *event = nullptr;
        status = device.api().stream_flush(device.get(), stream.get(), nullptr, &event, &error);
        if (status == BP_SUCCESS) {
            status = device.api().event_wait(device.get(), event, 20'000'000'000ull, &error);
            device.api().event_release(device.get(), event);
        }
    }
    expectFailure(status, error, {BP_ERROR_REMOTE}, "a collective after comm_abort");
}

CONFORMANCE_CASE("peer.access",
                 "device_peer_access answers per pair, refuses a NULL out pointer, and a pair it "
                 "accepts copies with copy_peer") {
    OpenDevice &device = ctx.device();
    const bp_plugin_api &api = device.api();
    if (!ctx.raw().has(&bp_plugin_api::device_peer_access) || api.device_peer_access == nullptr)
        throw NotApplicable("the plugin has no device_peer_access (ABI 1.0)");
    bp_error error = makeError();
    expectFailure(api.device_peer_access(device.get(), device.get(), nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "device_peer_access with a NULL out pointer");
    if (ctx.deviceCount() < 2) return;
    auto openArgs = abi::make<bp_device_open_args>();
    const uint32_t otherIndex = ctx.index() == 0 ? 1 : 0;
    bp_device *other = nullptr;
    succeed(api.device_open(ctx.plugin(), otherIndex, &openArgs, &other, &error), error,
            "device_open(" + std::to_string(otherIndex) + ")");
    struct Close {
        const bp_plugin_api &api;
        bp_device *d;
        ~Close() { api.device_close(d); }
    } close{api, other};
    uint32_t access = 7;
    succeed(api.device_peer_access(device.get(), other, &access, &error), error,
            "device_peer_access");
    require(access <= 1, "device_peer_access answered " + std::to_string(access) + ", not 0 or 1");
    if (access == 1)
        require(ctx.declares(BP_CAPABILITY_PEER_COPY),
                "a pair has peer access but the device does not declare PEER_COPY");
}

} // namespace backplane::conformance
