// Driver: status checks and handle ownership over one opened device of a plugin.
#include "device/driver.hpp"

#include <backplane/log.hpp>

namespace backplane::detail {

namespace {

/// The bp_error of the calls made for every operation (launch, stream flush, stream wait): the
/// header and an empty message, not the whole 1 KiB that makeError() zeroes. A plugin writes its
/// message NUL-terminated (plugin.h), and errorText() stops at the capacity when one does not.
bp_error operationError() {
    bp_error error; // NOLINT(cppcoreguidelines-pro-type-member-init): see above
    error.struct_size = sizeof(error);
    error.code = BP_SUCCESS;
    error.vendor_code = 0;
    error.message[0] = '\0';
    return error;
}

} // namespace

void releaseMemory(Driver &driver, bp_memory *memory) {
    releaseContained(driver.plugin().name(), "memory_free",
                     [&] { driver.api().memory_free(driver.device(), memory); });
}
void releaseStream(Driver &driver, bp_stream *stream) {
    releaseContained(driver.plugin().name(), "stream_destroy",
                     [&] { driver.api().stream_destroy(driver.device(), stream); });
}
void releaseEvent(Driver &driver, bp_event *event) {
    releaseContained(driver.plugin().name(), "event_release",
                     [&] { driver.api().event_release(driver.device(), event); });
}
void releaseKernel(Driver &driver, bp_kernel *kernel) {
    releaseContained(driver.plugin().name(), "kernel_release",
                     [&] { driver.api().kernel_release(driver.device(), kernel); });
}
void releaseComm(Driver &driver, bp_comm *comm) {
    if (!driver.plugin().has(&bp_plugin_api::comm_destroy)) return;
    releaseContained(driver.plugin().name(), "comm_destroy",
                     [&] { driver.api().comm_destroy(driver.device(), comm); });
}

void releaseGraph(Driver &driver, bp_graph *graph) {
    if (!driver.plugin().has(&bp_plugin_api::graph_release)) return;
    releaseContained(driver.plugin().name(), "graph_release",
                     [&] { driver.api().graph_release(driver.device(), graph); });
}

namespace {

void appendToString(void *user, const void *data, size_t size) {
    static_cast<std::string *>(user)->append(static_cast<const char *>(data), size);
}
void appendToBytes(void *user, const void *data, size_t size) {
    auto *out = static_cast<std::vector<unsigned char> *>(user);
    const auto *bytes = static_cast<const unsigned char *>(data);
    out->insert(out->end(), bytes, bytes + size);
}

} // namespace

std::shared_ptr<Driver> Driver::open(std::shared_ptr<PluginLibrary> plugin,
                                     const DeviceInfo &info) {
    const bp_plugin_api &api = plugin->api();
    if (api.device_open == nullptr || api.device_close == nullptr)
        throw Error(ErrorCode::Unsupported,
                    plugin->name() + " plugin cannot open devices (no device_open in its table)",
                    plugin->name());
    plugin->ensureProbed(info); // its devices may come from an isolated probe's answer
    std::shared_ptr<Driver> driver(new Driver());
    driver->plugin_ = std::move(plugin);
    driver->info_ = info;
    bp_device_open_args args{};
    args.struct_size = sizeof(args);
    bp_error error = makeError();
    const bp_status status = callContained("device_open", error, [&] {
        return api.device_open(driver->plugin_->instance(), info.index, &args, &driver->device_, &error);
    });
    if (status != BP_SUCCESS) {
        driver->device_ = nullptr;
        driver->fail(status, error, "device_open(" + info.id() + ")");
    }
    log::write(log::Subsystem::Memory, log::Level::Debug, "opened " + info.id() + " " + info.name);
    return driver;
}

Driver::~Driver() {
    if (device_ != nullptr)
        releaseContained(plugin_->name(), "device_close", [&] { plugin_->api().device_close(device_); });
}

void Driver::fail(bp_status status, const bp_error &error, const std::string &what) const {
    if (status == BP_ERROR_DEVICE_LOST) {
        std::lock_guard lock(lostMutex_);
        if (!lost_.load(std::memory_order_relaxed)) {
            lostReason_ = plugin_->name() + " " + what + ": " + error.message;
            lost_.store(true, std::memory_order_release);
        }
    }
    throwStatus(status, error, plugin_->name(), plugin_->name() + " " + what);
}

std::string Driver::lostReason() const {
    std::lock_guard lock(lostMutex_);
    return lostReason_;
}

MemoryPage Driver::allocate(bp_memory_kind kind, uint64_t size) {
    bp_memory_allocate_args args{};
    args.struct_size = sizeof(args);
    args.kind = kind;
    args.size = size;
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    const bp_status status = callContained("memory_allocate", error, [&] {
        return api().memory_allocate(device_, &args, &memory, &mapped, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error, "memory_allocate(" + std::to_string(size) + " bytes) on " + info_.id());
    MemoryPage page;
    page.memory = {shared_from_this(), memory};
    page.mapped = mapped;
    page.size = size;
    page.kind = kind;
    return page;
}

StreamOwner Driver::createStream() {
    bp_stream_create_args args{};
    args.struct_size = sizeof(args);
    bp_stream *stream = nullptr;
    bp_error error = makeError();
    const bp_status status = callContained("stream_create", error, [&] {
        return api().stream_create(device_, &args, &stream, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "stream_create on " + info_.id());
    return {shared_from_this(), stream};
}

EventOwner Driver::flush(bp_stream *stream, bool wantEvent, bool timing) {
    bp_flush_args args{};
    args.struct_size = sizeof(args);
    args.flags = timing ? static_cast<uint32_t>(BP_FLUSH_TIMING_EVENT) : 0u;
    bp_event *event = nullptr;
    bp_error error = operationError();
    const bp_status status = callContained("stream_flush", error, [&] {
        return api().stream_flush(device_, stream, &args, wantEvent ? &event : nullptr, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "stream_flush on " + info_.id());
    if (!wantEvent) return {};
    return {shared_from_this(), event};
}

void Driver::waitEvent(bp_stream *stream, bp_event *event) {
    bp_error error = operationError();
    const bp_status status = callContained("stream_wait_event", error, [&] {
        return api().stream_wait_event(device_, stream, event, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "stream_wait_event on " + info_.id());
}

void Driver::eventWait(bp_event *event) {
    bp_error error = makeError();
    const bp_status status = callContained("event_wait", error, [&] {
        return api().event_wait(device_, event, UINT64_MAX, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "event_wait on " + info_.id());
}

bool Driver::eventWaitFor(bp_event *event, uint64_t timeoutNs) {
    bp_error error = makeError();
    const bp_status status = callContained("event_wait", error, [&] {
        return api().event_wait(device_, event, timeoutNs, &error);
    });
    if (status == BP_ERROR_TIMEOUT || status == BP_ERROR_NOT_READY) return false;
    if (status != BP_SUCCESS) fail(status, error, "event_wait on " + info_.id());
    return true;
}

bool Driver::eventQuery(bp_event *event) {
    bp_error error = makeError();
    const bp_status status = callContained("event_query", error, [&] {
        return api().event_query(device_, event, &error);
    });
    if (status == BP_ERROR_NOT_READY) return false;
    if (status != BP_SUCCESS) fail(status, error, "event_query on " + info_.id());
    return true;
}

uint64_t Driver::elapsedNs(bp_event *start, bp_event *end) {
    if (!plugin_->has(&bp_plugin_api::event_elapsed_ns))
        throw Error(ErrorCode::Unsupported, plugin_->name() + " has no event_elapsed_ns",
                    plugin_->name());
    uint64_t out = 0;
    bp_error error = makeError();
    const bp_status status = callContained("event_elapsed_ns", error, [&] {
        return api().event_elapsed_ns(device_, start, end, &out, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "event_elapsed_ns on " + info_.id());
    return out;
}

void Driver::copyHostToDevice(bp_stream *stream, const void *src, bp_memory *dst,
                              uint64_t dstOffset, uint64_t size) {
    bp_copy_host_to_device_args args{sizeof(args), src, dst, dstOffset, size};
    bp_error error = makeError();
    const bp_status status = callContained("copy_host_to_device", error, [&] {
        return api().copy_host_to_device(device_, stream, &args, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "copy_host_to_device on " + info_.id());
}

void Driver::copyDeviceToHost(bp_stream *stream, bp_memory *src, uint64_t srcOffset, void *dst,
                              uint64_t size) {
    bp_copy_device_to_host_args args{sizeof(args), src, srcOffset, dst, size};
    bp_error error = makeError();
    const bp_status status = callContained("copy_device_to_host", error, [&] {
        return api().copy_device_to_host(device_, stream, &args, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "copy_device_to_host on " + info_.id());
}

void Driver::copyDeviceToDevice(bp_stream *stream, bp_memory *src, uint64_t srcOffset,
                                bp_memory *dst, uint64_t dstOffset, uint64_t size) {
    bp_copy_device_to_device_args args{sizeof(args), src, srcOffset, dst, dstOffset, size};
    bp_error error = makeError();
    const bp_status status = callContained("copy_device_to_device", error, [&] {
        return api().copy_device_to_device(device_, stream, &args, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "copy_device_to_device on " + info_.id());
}

void Driver::fill(bp_stream *stream, bp_memory *dst, uint64_t offset, uint64_t size,
                  uint32_t pattern) {
    bp_fill_args args{sizeof(args), dst, offset, size, pattern};
    bp_error error = makeError();
    const bp_status status = callContained("fill", error, [&] {
        return api().fill(device_, stream, &args, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "fill on " + info_.id());
}

CompiledKernel Driver::compile(const std::string &kernelName, bp_dialect dialect,
                               const std::string &entryPoint, const void *source,
                               size_t sourceSize, const std::vector<std::string> &options) {
    CompiledKernel out;
    std::vector<const char *> optionPointers;
    for (const std::string &o : options) optionPointers.push_back(o.c_str());
    bp_kernel_compile_args args{};
    args.struct_size = sizeof(args);
    args.dialect = dialect;
    args.entry_point = entryPoint.c_str();
    args.source = source;
    args.source_size = sourceSize;
    args.options = optionPointers.empty() ? nullptr : optionPointers.data();
    args.option_count = static_cast<uint32_t>(optionPointers.size());
    args.binary = {&out.binary, &appendToBytes};
    args.log = {&out.log, &appendToString};
    bp_error error = makeError();
    const bp_status status = callContained("kernel_compile", error, [&] {
        return api().kernel_compile(device_, &args, &error);
    });
    if (status != BP_SUCCESS) {
        std::string message = "kernel '" + kernelName + "' (entry " + entryPoint + ", " +
                              toString(static_cast<Dialect>(dialect)) + ") failed to compile on " +
                              info_.id();
        if (const std::string text = errorText(error); !text.empty()) message += ": " + text;
        if (!out.log.empty()) message += "\ncompiler log:\n" + out.log;
        throw Error(status == BP_ERROR_COMPILE ? ErrorCode::Compile : ErrorCode::Internal, message,
                    plugin_->name(), error.vendor_code);
    }
    if (!out.log.empty())
        log::write(log::Subsystem::Compile, log::Level::Debug,
                   "kernel '" + kernelName + "' compile log: " + out.log);
    return out;
}

KernelOwner Driver::load(const std::string &kernelName, bp_dialect dialect,
                         const std::string &entryPoint, const void *binary, size_t size) {
    bp_kernel_load_args args{};
    args.struct_size = sizeof(args);
    args.dialect = dialect;
    args.entry_point = entryPoint.c_str();
    args.binary = binary;
    args.binary_size = size;
    bp_kernel *kernel = nullptr;
    bp_error error = makeError();
    const bp_status status = callContained("kernel_load", error, [&] {
        return api().kernel_load(device_, &args, &kernel, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error, "kernel_load of '" + kernelName + "' on " + info_.id());
    return {shared_from_this(), kernel};
}

void Driver::launch(bp_stream *stream, const bp_launch_args &args, const std::string &kernelName) {
    bp_error error = operationError();
    const bp_status status = callContained("kernel_launch", error, [&] {
        return api().kernel_launch(device_, stream, &args, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error, "kernel_launch of '" + kernelName + "' on " + info_.id());
}

uint64_t Driver::nativeHandle(bp_native_kind kind, const void *object) {
    if (!plugin_->has(&bp_plugin_api::native_handle))
        throw Error(ErrorCode::Unsupported, plugin_->name() + " offers no native handles",
                    plugin_->name());
    uint64_t out = 0;
    bp_error error = makeError();
    const bp_status status = callContained("native_handle", error, [&] {
        return api().native_handle(device_, kind, object, &out, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "native_handle on " + info_.id());
    return out;
}

// ----- peers and collectives (ABI 1.1) ----------------------------------------------------------

void Driver::copyPeer(bp_stream *stream, const Driver &source, bp_memory *src, uint64_t srcOffset,
                      bp_memory *dst, uint64_t dstOffset, uint64_t size) {
    if (!plugin_->has(&bp_plugin_api::copy_peer))
        throw Error(ErrorCode::Unsupported, plugin_->name() + " has no copy_peer", plugin_->name());
    bp_copy_device_to_device_args args{sizeof(args), src, srcOffset, dst, dstOffset, size};
    bp_error error = makeError();
    const bp_status status = callContained("copy_peer", error, [&] {
        return api().copy_peer(device_, stream, source.device_, &args, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error, "copy_peer from " + source.info_.id() + " to " + info_.id());
}

bool Driver::peerAccess(const Driver &source) {
    if (plugin_ != source.plugin_ || !plugin_->has(&bp_plugin_api::device_peer_access) ||
        !plugin_->has(&bp_plugin_api::copy_peer) || !hasCapability(BP_CAPABILITY_PEER_COPY) ||
        !source.hasCapability(BP_CAPABILITY_PEER_COPY))
        return false;
    uint32_t out = 0;
    bp_error error = makeError();
    const bp_status status = callContained("device_peer_access", error, [&] {
        return api().device_peer_access(device_, source.device_, &out, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error, "device_peer_access from " + source.info_.id() + " to " + info_.id());
    return out != 0;
}

bool Driver::hasCollectives() const noexcept {
    return hasCapability(BP_CAPABILITY_COLLECTIVES) &&
           plugin_->has(&bp_plugin_api::comm_id_create) &&
           plugin_->has(&bp_plugin_api::comm_create) &&
           plugin_->has(&bp_plugin_api::comm_destroy) && plugin_->has(&bp_plugin_api::comm_abort) &&
           plugin_->has(&bp_plugin_api::comm_group) && plugin_->has(&bp_plugin_api::collective);
}

std::vector<std::byte> Driver::commIdCreate() {
    if (!hasCollectives())
        throw Error(ErrorCode::Unsupported, info_.id() + " has no collectives", plugin_->name());
    std::vector<std::byte> id(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    bp_error error = makeError();
    const bp_status status = callContained("comm_id_create", error, [&] {
        return api().comm_id_create(plugin_->instance(), id.data(), id.size(), &size, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "comm_id_create");
    if (size > id.size())
        throw Error(ErrorCode::Internal,
                    plugin_->name() + " comm_id_create reported " + std::to_string(size) +
                        " bytes, more than the " + std::to_string(id.size()) + " it was given",
                    plugin_->name());
    id.resize(size);
    return id;
}

CommOwner Driver::commCreate(std::span<const std::byte> id, uint32_t rank, uint32_t size,
                             uint64_t timeoutMs) {
    bp_comm_create_args args{};
    args.struct_size = sizeof(args);
    args.id = id.data();
    args.id_size = id.size();
    args.rank = rank;
    args.size = size;
    args.timeout_ms = timeoutMs;
    bp_comm *comm = nullptr;
    bp_error error = makeError();
    const bp_status status = callContained("comm_create", error, [&] {
        return api().comm_create(device_, &args, &comm, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error,
             "comm_create (rank " + std::to_string(rank) + " of " + std::to_string(size) +
                 ") on " + info_.id());
    return {shared_from_this(), comm};
}

void Driver::commAbort(bp_comm *comm) {
    releaseContained(plugin_->name(), "comm_abort", [&] { api().comm_abort(device_, comm); });
}

void Driver::commGroup(bool begin) {
    bp_error error = makeError();
    const bp_status status = callContained("comm_group", error, [&] {
        return api().comm_group(plugin_->instance(), begin ? 1u : 0u, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, begin ? "comm_group(begin)" : "comm_group(end)");
}

void Driver::collective(bp_stream *stream, bp_comm *comm, const bp_collective_args &args) {
    bp_error error = makeError();
    const bp_status status = callContained("collective", error, [&] {
        return api().collective(device_, stream, comm, &args, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "collective on " + info_.id());
}

// ----- recorded sequences (ABI 1.3) -------------------------------------------------------------

GraphOwner Driver::graphCreate(std::span<const bp_graph_op> ops, std::string &why) {
    if (!plugin_->has(&bp_plugin_api::graph_create) || !plugin_->has(&bp_plugin_api::graph_launch) ||
        !plugin_->has(&bp_plugin_api::graph_release)) {
        why = plugin_->name() + " has no graphs (ABI " + std::to_string(api().abi_major) + "." +
              std::to_string(api().abi_minor) + ")";
        return {};
    }
    bp_graph_create_args args{};
    args.struct_size = sizeof(args);
    args.ops = ops.data();
    args.op_count = static_cast<uint32_t>(ops.size());
    bp_graph *graph = nullptr;
    bp_error error = makeError();
    const bp_status status = callContained("graph_create", error, [&] {
        return api().graph_create(device_, &args, &graph, &error);
    });
    if (status == BP_ERROR_UNSUPPORTED) {
        why = error.message;
        return {};
    }
    if (status != BP_SUCCESS) fail(status, error, "graph_create on " + info_.id());
    if (graph == nullptr)
        throw Error(ErrorCode::Internal,
                    plugin_->name() + ": graph_create succeeded without returning a graph",
                    plugin_->name());
    return GraphOwner(shared_from_this(), graph);
}

void Driver::graphLaunch(bp_stream *stream, bp_graph *graph) {
    bp_error error = makeError();
    const bp_status status = callContained("graph_launch", error, [&] {
        return api().graph_launch(device_, stream, graph, &error);
    });
    if (status != BP_SUCCESS) fail(status, error, "graph_launch on " + info_.id());
}

bool Driver::graphUpdate(bp_graph *graph, uint32_t index, const bp_graph_op &op) {
    if (!plugin_->has(&bp_plugin_api::graph_update)) return false;
    bp_error error = makeError();
    const bp_status status = callContained("graph_update", error, [&] {
        return api().graph_update(device_, graph, index, &op, &error);
    });
    if (status == BP_ERROR_UNSUPPORTED) return false;
    if (status != BP_SUCCESS) fail(status, error, "graph_update on " + info_.id());
    return true;
}

MemoryPage Driver::registerHost(void *host, uint64_t size) {
    if (!plugin_->has(&bp_plugin_api::memory_register))
        throw Error(ErrorCode::Unsupported,
                    "registerHost: the " + plugin_->name() + " plugin cannot register host memory "
                        "(it has no memory_register; ABI " + std::to_string(api().abi_major) +
                        "." + std::to_string(api().abi_minor) + "): transfer from pageable "
                        "memory (staged) or from allocatePinned() memory instead",
                    plugin_->name());
    bp_memory_register_args args{};
    args.struct_size = sizeof(args);
    args.host = host;
    args.size = size;
    bp_memory *memory = nullptr;
    bp_error error = makeError();
    const bp_status status = callContained("memory_register", error, [&] {
        return api().memory_register(device_, &args, &memory, &error);
    });
    if (status != BP_SUCCESS)
        fail(status, error,
             "memory_register(" + std::to_string(size) + " bytes) on " + info_.id() +
                 (status == BP_ERROR_UNSUPPORTED
                      ? ": this device cannot register host memory; transfer from pageable memory "
                        "(staged) or from allocatePinned() memory instead"
                      : ""));
    MemoryPage page;
    page.memory = {shared_from_this(), memory};
    page.mapped = host;
    page.size = size;
    page.kind = BP_MEMORY_PINNED_HOST;
    return page;
}

} // namespace backplane::detail
