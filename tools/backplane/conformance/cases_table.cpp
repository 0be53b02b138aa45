// Cases over the function table, plugin lifecycle, probe, device description and device open,
// error reporting, and native handles.
#include "handles.hpp"

#include <atomic>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

namespace backplane::conformance {
namespace {

constexpr uint32_t kKnownCapabilities =
    BP_CAPABILITY_ASYNC_STREAMS | BP_CAPABILITY_TIMESTAMPS | BP_CAPABILITY_PEER_COPY |
    BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY | BP_CAPABILITY_INDIRECT_DISPATCH |
    BP_CAPABILITY_PORTABLE_BINARIES | BP_CAPABILITY_COLLECTIVES |
    BP_CAPABILITY_ADDRESSABLE_MEMORY;
constexpr uint32_t kKnownDialects = (1u << (BP_DIALECT_CPP + 1)) - 1;

bool terminated(const char *field, size_t capacity) {
    return std::memchr(field, '\0', capacity) != nullptr;
}

bp_device_info describe(CaseContext &ctx, uint32_t index, bp_status &status, bp_error &error) {
    auto info = abi::make<bp_device_info>();
    status = ctx.api().device_info(ctx.plugin(), index, &info, &error);
    return info;
}

/// A second plugin instance made through plugin_init (destroyed at scope end).
struct Instance {
    const bp_plugin_api &api;
    bp_plugin *plugin = nullptr;
    ~Instance() {
        if (plugin != nullptr) api.plugin_destroy(plugin);
    }
};

bp_plugin_init_args initArgs() {
    auto args = abi::make<bp_plugin_init_args>();
    args.host_abi_major = BP_ABI_VERSION_MAJOR;
    args.host_abi_minor = BP_ABI_VERSION_MINOR;
    args.options_json = "{}";
    return args;
}

} // namespace

// Table ----------------------------------------------------------------------------------------

CONFORMANCE_CASE("table.identity",
                 "the table speaks ABI major 1, names the plugin as its manifest does and has a version") {
    const bp_plugin_api &api = ctx.api();
    require(api.abi_major == BP_ABI_VERSION_MAJOR,
            "abi_major is " + std::to_string(api.abi_major) + ", expected " +
                std::to_string(BP_ABI_VERSION_MAJOR));
    require(api.plugin_name != nullptr && ctx.name() == api.plugin_name,
            "plugin_name differs from the manifest's name '" + ctx.name() + "'");
    require(api.plugin_version != nullptr && api.plugin_version[0] != '\0',
            "plugin_version is empty: it is part of every cache key, give the plugin a version");
    require(ctx.raw().manifest().abiMajor == api.abi_major,
            "the manifest's abi_version major differs from the table's abi_major");
}

CONFORMANCE_CASE("table.complete",
                 "every ABI 1.0 function is present (copy_peer may be NULL when peer copy is not declared)") {
    const RawPlugin &p = ctx.raw();
    require(ctx.api().struct_size >= offsetof(bp_plugin_api, native_handle) + sizeof(void *),
            "struct_size " + std::to_string(ctx.api().struct_size) + " is smaller than ABI 1.0's table");
    const std::pair<bool, const char *> functions[] = {
        {p.has(&bp_plugin_api::plugin_init), "plugin_init"},
        {p.has(&bp_plugin_api::plugin_destroy), "plugin_destroy"},
        {p.has(&bp_plugin_api::probe), "probe"},
        {p.has(&bp_plugin_api::device_info), "device_info"},
        {p.has(&bp_plugin_api::device_open), "device_open"},
        {p.has(&bp_plugin_api::device_close), "device_close"},
        {p.has(&bp_plugin_api::memory_allocate), "memory_allocate"},
        {p.has(&bp_plugin_api::memory_free), "memory_free"},
        {p.has(&bp_plugin_api::memory_map), "memory_map"},
        {p.has(&bp_plugin_api::stream_create), "stream_create"},
        {p.has(&bp_plugin_api::stream_destroy), "stream_destroy"},
        {p.has(&bp_plugin_api::stream_flush), "stream_flush"},
        {p.has(&bp_plugin_api::stream_wait_event), "stream_wait_event"},
        {p.has(&bp_plugin_api::event_wait), "event_wait"},
        {p.has(&bp_plugin_api::event_query), "event_query"},
        {p.has(&bp_plugin_api::event_release), "event_release"},
        {p.has(&bp_plugin_api::event_elapsed_ns), "event_elapsed_ns"},
        {p.has(&bp_plugin_api::copy_host_to_device), "copy_host_to_device"},
        {p.has(&bp_plugin_api::copy_device_to_host), "copy_device_to_host"},
        {p.has(&bp_plugin_api::copy_device_to_device), "copy_device_to_device"},
        {p.has(&bp_plugin_api::fill), "fill"},
        {p.has(&bp_plugin_api::kernel_compile), "kernel_compile"},
        {p.has(&bp_plugin_api::kernel_load), "kernel_load"},
        {p.has(&bp_plugin_api::kernel_release), "kernel_release"},
        {p.has(&bp_plugin_api::kernel_launch), "kernel_launch"},
        {p.has(&bp_plugin_api::native_handle), "native_handle"},
    };
    std::string missing;
    for (const auto &[present, name] : functions)
        if (!present) missing += (missing.empty() ? "" : ", ") + std::string(name);
    require(missing.empty(), "missing functions: " + missing);
    if (ctx.declares(BP_CAPABILITY_PEER_COPY))
        require(p.has(&bp_plugin_api::copy_peer),
                "BP_CAPABILITY_PEER_COPY is declared but copy_peer is NULL");
}

// Plugin lifecycle -------------------------------------------------------------------------------

CONFORMANCE_CASE("plugin.second_instance",
                 "plugin_init creates a second, independent instance that probes and is destroyed alone") {
    Instance second{ctx.api()};
    bp_plugin_init_args args = initArgs();
    // The options the first instance got: a plugin's device count may come from them.
    args.options_json = ctx.optionsJson().c_str();
    bp_error error = makeError();
    succeed(ctx.api().plugin_init(&args, &second.plugin, &error), error, "a second plugin_init");
    require(second.plugin != nullptr && second.plugin != ctx.plugin(),
            "the second plugin_init returned NULL or the first instance");
    auto probe = abi::make<bp_probe_result>();
    error = makeError();
    succeed(ctx.api().probe(second.plugin, &probe, &error), error, "probe of the second instance");
    require(probe.device_count == ctx.deviceCount(),
            "the second instance sees " + std::to_string(probe.device_count) +
                " devices, the first " + std::to_string(ctx.deviceCount()));
}

CONFORMANCE_CASE("plugin.init_rejects_other_major",
                 "plugin_init refuses a host of another ABI major with a status and a message") {
    Instance other{ctx.api()};
    bp_plugin_init_args args = initArgs();
    args.host_abi_major = BP_ABI_VERSION_MAJOR + 1;
    bp_error error = makeError();
    const bp_status status = ctx.api().plugin_init(&args, &other.plugin, &error);
    expectFailure(status, error, {BP_ERROR_UNSUPPORTED, BP_ERROR_INVALID_ARGUMENT},
                  "plugin_init with host_abi_major " + std::to_string(args.host_abi_major));
    other.plugin = nullptr; // nothing was created
}

CONFORMANCE_CASE("plugin.init_null_arguments",
                 "plugin_init with NULL args or a NULL out pointer fails with invalid_argument") {
    bp_error error = makeError();
    bp_plugin *plugin = nullptr;
    expectFailure(ctx.api().plugin_init(nullptr, &plugin, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "plugin_init(NULL args)");
    bp_plugin_init_args args = initArgs();
    error = makeError();
    expectFailure(ctx.api().plugin_init(&args, nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "plugin_init(NULL out)");
}

CONFORMANCE_CASE("plugin.init_malformed_options",
                 "plugin_init with options that are not JSON fails cleanly or ignores them, never crashes") {
    Instance other{ctx.api()};
    bp_plugin_init_args args = initArgs();
    args.options_json = "{\"unterminated";
    bp_error error = makeError();
    const bp_status status = ctx.api().plugin_init(&args, &other.plugin, &error);
    if (status != BP_SUCCESS) {
        expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_UNSUPPORTED},
                      "plugin_init(options \"{\\\"unterminated\")");
        other.plugin = nullptr;
    }
}

CONFORMANCE_CASE("plugin.init_without_host_services",
                 "plugin_init works without a log sink and without a cache directory") {
    Instance other{ctx.api()};
    bp_plugin_init_args args = initArgs();
    args.log = nullptr;
    args.log_user = nullptr;
    args.cache_dir = nullptr;
    args.options_json = nullptr;
    bp_error error = makeError();
    succeed(ctx.api().plugin_init(&args, &other.plugin, &error), error,
            "plugin_init(log NULL, cache_dir NULL, options_json NULL)");
}

// Probe --------------------------------------------------------------------------------------------

CONFORMANCE_CASE("probe.consistent",
                 "probe answers the same device count every time, from many threads at once") {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
        threads.emplace_back([&] {
            for (int i = 0; i < 20; ++i) {
                auto r = abi::make<bp_probe_result>();
                bp_error error = makeError();
                const bp_status s = ctx.api().probe(ctx.plugin(), &r, &error);
                if (s != BP_SUCCESS || r.device_count != ctx.deviceCount() ||
                    !terminated(r.driver_version, sizeof(r.driver_version)))
                    ++wrong;
            }
        });
    for (auto &t : threads) t.join();
    require(wrong == 0, std::to_string(wrong.load()) +
                            " of 160 concurrent probes failed, changed the device count or left "
                            "driver_version unterminated");
}

CONFORMANCE_CASE("probe.null_result", "probe with a NULL result fails with invalid_argument") {
    bp_error error = makeError();
    expectFailure(ctx.api().probe(ctx.plugin(), nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "probe(NULL out)");
}

// Device description -------------------------------------------------------------------------------

CONFORMANCE_CASE("info.strings",
                 "device name, vendor and arch are non-empty and terminated; driver version and PCI id terminated") {
    const bp_device_info &i = ctx.info();
    require(terminated(i.name, sizeof(i.name)) && i.name[0] != '\0', "name is empty or unterminated");
    require(terminated(i.vendor, sizeof(i.vendor)) && i.vendor[0] != '\0',
            "vendor is empty or unterminated");
    require(terminated(i.arch, sizeof(i.arch)) && i.arch[0] != '\0', "arch is empty or unterminated");
    require(terminated(i.driver_version, sizeof(i.driver_version)), "driver_version is unterminated");
    require(terminated(i.pci_bus_id, sizeof(i.pci_bus_id)), "pci_bus_id is unterminated");
}

CONFORMANCE_CASE("info.limits",
                 "device limits are usable: block, grid, alignment (a power of two), bindings, streams") {
    const bp_device_info &i = ctx.info();
    require(i.type >= BP_DEVICE_TYPE_OTHER && i.type <= BP_DEVICE_TYPE_CPU,
            "type " + std::to_string(i.type) + " is no bp_device_type");
    require(i.memory_bytes > 0, "memory_bytes is 0");
    require(i.max_allocation_bytes > 0, "max_allocation_bytes is 0");
    for (int d = 0; d < 3; ++d) {
        require(i.max_block_size[d] >= 1, "max_block_size[" + std::to_string(d) + "] is 0");
        require(i.max_grid_size[d] >= 1, "max_grid_size[" + std::to_string(d) + "] is 0");
    }
    require(i.max_block_threads >= 1, "max_block_threads is 0");
    require(i.subgroup_size >= 1, "subgroup_size is 0 (1 on a CPU)");
    require(i.binding_alignment >= 1 && (i.binding_alignment & (i.binding_alignment - 1)) == 0,
            "binding_alignment " + std::to_string(i.binding_alignment) + " is not a power of two");
    require(i.max_bindings >= 2, "max_bindings " + std::to_string(i.max_bindings) + " is below 2");
    require(i.max_streams >= 1, "max_streams is 0");
}

CONFORMANCE_CASE("info.known_bits",
                 "declared dialects and capabilities are non-empty and use only bits the ABI defines") {
    const bp_device_info &i = ctx.info();
    require(i.dialects != 0, "the device declares no kernel dialect");
    require((i.dialects & ~kKnownDialects) == 0,
            "dialects has unknown bits " + std::to_string(i.dialects & ~kKnownDialects));
    // A bit the plugin's own ABI minor does not define is unknown to it as well.
    uint32_t known = kKnownCapabilities;
    if (ctx.api().abi_minor < 7) known &= ~static_cast<uint32_t>(BP_CAPABILITY_ADDRESSABLE_MEMORY);
    require((i.capabilities & ~known) == 0,
            "capabilities has unknown bits " + std::to_string(i.capabilities & ~known) +
                " for a plugin of ABI 1." + std::to_string(ctx.api().abi_minor));
    if (i.has_uuid == 0) {
        bool zero = true;
        for (const uint8_t b : i.uuid) zero = zero && b == 0;
        require(zero, "has_uuid is 0 but uuid is not all zero");
    }
}

CONFORMANCE_CASE("info.stable",
                 "device_info describes the same device every time, from many threads at once") {
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
        threads.emplace_back([&] {
            for (int n = 0; n < 20; ++n) {
                bp_status status;
                bp_error error = makeError();
                const bp_device_info again = describe(ctx, ctx.index(), status, error);
                if (status != BP_SUCCESS ||
                    std::memcmp(again.name, ctx.info().name, sizeof(again.name)) != 0 ||
                    std::memcmp(again.uuid, ctx.info().uuid, sizeof(again.uuid)) != 0 ||
                    again.capabilities != ctx.info().capabilities ||
                    again.dialects != ctx.info().dialects)
                    ++wrong;
            }
        });
    for (auto &t : threads) t.join();
    require(wrong == 0, std::to_string(wrong.load()) + " of 160 device_info calls failed or differed");
}

CONFORMANCE_CASE("info.index_out_of_range",
                 "device_info of an index at or past the device count fails with not_found or invalid_argument") {
    for (const uint32_t index : {ctx.deviceCount(), ctx.deviceCount() + 1000, UINT32_MAX}) {
        bp_status status;
        bp_error error = makeError();
        describe(ctx, index, status, error);
        expectFailure(status, error, {BP_ERROR_NOT_FOUND, BP_ERROR_INVALID_ARGUMENT},
                      "device_info(" + std::to_string(index) + ")");
    }
}

CONFORMANCE_CASE("info.older_host_struct",
                 "device_info writes no byte past the struct_size of an older host's smaller struct") {
    constexpr size_t kOlder = offsetof(bp_device_info, max_block_size);
    struct Guarded {
        bp_device_info info;
        unsigned char guard[64];
    } g;
    std::memset(&g, 0xA5, sizeof(g));
    g.info.struct_size = kOlder;
    bp_error error = makeError();
    succeed(ctx.api().device_info(ctx.plugin(), ctx.index(), &g.info, &error), error,
            "device_info(struct_size " + std::to_string(kOlder) + ")");
    const auto *bytes = reinterpret_cast<const unsigned char *>(&g);
    for (size_t b = kOlder; b < sizeof(g); ++b)
        require(bytes[b] == 0xA5, "device_info wrote byte " + std::to_string(b) +
                                      " past the caller's struct_size of " + std::to_string(kOlder));
    require(std::memcmp(g.info.name, ctx.info().name, sizeof(g.info.name)) == 0,
            "device_info with the smaller struct described another name");
}

CONFORMANCE_CASE("info.kernel_features",
                 "kernel features (ABI 1.4): bool/i32/u32/f32 stored and computed, the rest only "
                 "on stored types, known bits, valid matrix shapes, the same every time") {
    constexpr size_t kEnd = offsetof(bp_device_info, matrix_shapes) +
                            sizeof(bp_device_info::matrix_shapes);
    if (ctx.api().abi_minor < 4)
        throw NotApplicable("the plugin speaks ABI 1." + std::to_string(ctx.api().abi_minor) +
                            "; kernel features came with 1.4");
    const bp_device_info &i = ctx.info();
    require(i.struct_size >= kEnd, "an ABI 1.4 plugin wrote back struct_size " +
                                       std::to_string(i.struct_size) + ", which ends before " +
                                       "matrix_shapes (" + std::to_string(kEnd) + ")");
    constexpr uint32_t kKnownTypes = (1u << (BP_ELEMENT_F64 + 1)) - 1;
    constexpr uint32_t kBase = (1u << BP_ELEMENT_BOOL) | (1u << BP_ELEMENT_I32) |
                               (1u << BP_ELEMENT_U32) | (1u << BP_ELEMENT_F32);
    const std::pair<const char *, uint32_t> masks[] = {
        {"element_storage", i.element_storage},
        {"element_arithmetic", i.element_arithmetic},
        {"element_atomic_add", i.element_atomic_add},
        {"element_atomic_bits", i.element_atomic_bits}};
    for (const auto &[name, mask] : masks) {
        require((mask & ~kKnownTypes) == 0, std::string(name) +
                                                " has bits of no bp_element_type: " +
                                                std::to_string(mask & ~kKnownTypes));
        require((mask & ~i.element_storage) == 0,
                std::string(name) + " names types that element_storage lacks: mask " +
                    std::to_string(mask & ~i.element_storage));
    }
    require((i.element_storage & kBase) == kBase,
            "element_storage lacks one of bool, i32, u32, f32 (mask " +
                std::to_string(i.element_storage) + ")");
    require((i.element_arithmetic & kBase) == kBase,
            "element_arithmetic lacks one of bool, i32, u32, f32 (mask " +
                std::to_string(i.element_arithmetic) + ")");
    constexpr uint32_t kWidths = (1u << 2) | (1u << 4) | (1u << 8);
    require((i.vector_widths & ~kWidths) == 0,
            "vector_widths has bits other than 2, 4 and 8: " + std::to_string(i.vector_widths));
    require(i.matrix_shape_count <= BP_MAX_MATRIX_SHAPES,
            "matrix_shape_count " + std::to_string(i.matrix_shape_count) + " is above " +
                std::to_string(BP_MAX_MATRIX_SHAPES));
    for (uint32_t n = 0; n < i.matrix_shape_count; ++n) {
        const bp_matrix_shape &m = i.matrix_shapes[n];
        const std::string which = "matrix_shapes[" + std::to_string(n) + "]";
        require(m.m > 0 && m.n > 0 && m.k > 0, which + " has a zero dimension");
        require(m.a <= BP_ELEMENT_F64 && m.b <= BP_ELEMENT_F64 && m.c <= BP_ELEMENT_F64,
                which + " has a type that is no bp_element_type");
        require(m.reserved == 0, which + ".reserved is not 0");
    }
    // The description is the same every time (kernels compiled for it run later).
    bp_status status;
    bp_error error = makeError();
    const bp_device_info again = describe(ctx, ctx.index(), status, error);
    succeed(status, error, "device_info");
    require(again.element_storage == i.element_storage &&
                again.element_arithmetic == i.element_arithmetic &&
                again.element_atomic_add == i.element_atomic_add &&
                again.element_atomic_bits == i.element_atomic_bits &&
                again.vector_widths == i.vector_widths &&
                again.matrix_shape_count == i.matrix_shape_count &&
                std::memcmp(again.matrix_shapes, i.matrix_shapes, sizeof(i.matrix_shapes)) == 0,
            "a second device_info reported other kernel features");
}

CONFORMANCE_CASE("info.null_result", "device_info with a NULL result fails with invalid_argument") {
    bp_error error = makeError();
    expectFailure(ctx.api().device_info(ctx.plugin(), ctx.index(), nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "device_info(NULL out)");
}

// Device open --------------------------------------------------------------------------------------

CONFORMANCE_CASE("device.open_close_reopen",
                 "a device opens, closes, and opens again on the same plugin instance") {
    for (int round = 0; round < 3; ++round) {
        OpenDevice &device = ctx.device();
        Stream stream = device.createStream();
        device.finish(stream);
        stream.reset();
        ctx.closeDevice();
    }
}

CONFORMANCE_CASE("device.open_twice",
                 "a second device_open of an open device gives an independent device: its own "
                 "streams and memory, working while the first is open and after it closed") {
    OpenDevice &first = ctx.device();
    auto second = std::make_unique<OpenDevice>(ctx);
    require(second->get() != first.get(), "the second device_open returned the first device");
    Stream a = first.createStream();
    Stream b = second->createStream();
    const std::vector<uint8_t> one(4096, 0x11), two(4096, 0x22);
    std::vector<uint8_t> back(4096);
    const Page pb = second->pageWith(b, two);
    {
        const Page pa = first.pageWith(a, one);
        first.download(a, pa, 0, back.data(), back.size());
        first.finish(a);
        require(back == one, "the first open's page changed under the second open's upload");
        second->download(b, pb, 0, back.data(), back.size());
        second->finish(b);
        require(back == two, "the second open's page does not hold what it uploaded");
    }
    // Closing the first open leaves the second working.
    a.reset();
    ctx.closeDevice();
    second->download(b, pb, 0, back.data(), back.size());
    second->finish(b);
    require(back == two, "the second open lost its page when the first closed");
}

CONFORMANCE_CASE("device.open_index_out_of_range",
                 "device_open of an index past the device count fails cleanly") {
    auto args = abi::make<bp_device_open_args>();
    bp_device *device = nullptr;
    bp_error error = makeError();
    const bp_status status = ctx.api().device_open(ctx.plugin(), ctx.deviceCount(), &args, &device, &error);
    expectFailure(status, error, {BP_ERROR_NOT_FOUND, BP_ERROR_INVALID_ARGUMENT},
                  "device_open(" + std::to_string(ctx.deviceCount()) + ")");
}

CONFORMANCE_CASE("device.open_unknown_flags",
                 "device_open refuses flags ABI 1 does not define (they must be 0)") {
    auto args = abi::make<bp_device_open_args>();
    args.flags = 0x80000000u;
    bp_device *device = nullptr;
    bp_error error = makeError();
    const bp_status status = ctx.api().device_open(ctx.plugin(), ctx.index(), &args, &device, &error);
    if (status == BP_SUCCESS) ctx.api().device_close(device);
    expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_UNSUPPORTED},
                  "device_open(flags 0x80000000)");
}

CONFORMANCE_CASE("device.open_null_out", "device_open with a NULL out pointer fails with invalid_argument") {
    auto args = abi::make<bp_device_open_args>();
    bp_error error = makeError();
    expectFailure(ctx.api().device_open(ctx.plugin(), ctx.index(), &args, nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "device_open(NULL out)");
}

// Errors ----------------------------------------------------------------------------------------

CONFORMANCE_CASE("error.null_error_pointer",
                 "a failing call with a NULL bp_error still returns its status (the error is optional)") {
    auto info = abi::make<bp_device_info>();
    const bp_status status = ctx.api().device_info(ctx.plugin(), UINT32_MAX, &info, nullptr);
    require(status == BP_ERROR_NOT_FOUND || status == BP_ERROR_INVALID_ARGUMENT,
            std::string("device_info(UINT32_MAX, error NULL) returned ") + toString(status));
}

CONFORMANCE_CASE("error.small_error_struct",
                 "a failing call writes no byte past an older caller's smaller bp_error") {
    constexpr size_t kSmall = offsetof(bp_error, message) + 16;
    struct Guarded {
        bp_error error;
    } g;
    std::memset(&g, 0xA5, sizeof(g));
    g.error.struct_size = kSmall;
    auto info = abi::make<bp_device_info>();
    const bp_status status = ctx.api().device_info(ctx.plugin(), UINT32_MAX, &info, &g.error);
    require(status != BP_SUCCESS, "device_info(UINT32_MAX) succeeded");
    const auto *bytes = reinterpret_cast<const unsigned char *>(&g);
    for (size_t b = kSmall; b < sizeof(g); ++b)
        require(bytes[b] == 0xA5, "the plugin wrote byte " + std::to_string(b) +
                                      " of a bp_error whose struct_size is " + std::to_string(kSmall));
    require(std::memchr(g.error.message, '\0', 16) != nullptr,
            "the message in a 16-byte room is not NUL-terminated");
}

// Native handles ------------------------------------------------------------------------------------

CONFORMANCE_CASE("native.handles",
                 "native_handle answers for the device, a stream and a page, or says unsupported") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, 4096);
    const std::pair<bp_native_kind, const void *> kinds[] = {
        {BP_NATIVE_DEVICE, nullptr}, {BP_NATIVE_STREAM, stream.get()}, {BP_NATIVE_MEMORY, page.get()}};
    for (const auto &[kind, object] : kinds) {
        uint64_t handle = 0;
        bp_error error = makeError();
        const bp_status status = ctx.api().native_handle(device.get(), kind, object, &handle, &error);
        if (status == BP_SUCCESS) continue;
        expectFailure(status, error, {BP_ERROR_UNSUPPORTED},
                      "native_handle(kind " + std::to_string(kind) + ")");
    }
}

CONFORMANCE_CASE("native.unknown_kind", "native_handle of an unknown kind fails with invalid_argument or unsupported") {
    OpenDevice &device = ctx.device();
    uint64_t handle = 0;
    bp_error error = makeError();
    const bp_status status = ctx.api().native_handle(device.get(), rawEnum<bp_native_kind>(77),
                                                     nullptr, &handle, &error);
    expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_UNSUPPORTED},
                  "native_handle(kind 77)");
}

} // namespace backplane::conformance
