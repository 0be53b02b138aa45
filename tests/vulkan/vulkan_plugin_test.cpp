// Tests of the Vulkan plugin through its C ABI (internals: detail::PluginLibrary), on lavapipe in
// CI. Exits 77 (SKIP) only when there is no Vulkan loader or device; fails when validation is
// requested (`vulkan_validation`) but the Khronos validation layer is not installed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "../test_skip.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/abi/caller.hpp>
#include <backplane/log.hpp>

#include <vulkan/vulkan.h>

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <sys/resource.h>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using backplane::detail::PluginLibrary;
namespace abi = backplane::abi;

namespace {

constexpr const char *kValidationLayer = "VK_LAYER_KHRONOS_validation";

std::atomic<int> gValidationErrors{0};
std::atomic<bool> gPluginLacksValidationLayer{false};
std::atomic<int> gCacheLoads{0};
std::atomic<int> gCacheIgnored{0};
std::mutex gFirstErrorMutex;
std::string gFirstValidationError;

void installLogSink() {
    backplane::log::setLevel(backplane::log::Subsystem::Plugin, backplane::log::Level::Debug);
    backplane::log::setSink([](backplane::log::Level level, backplane::log::Subsystem,
                               std::string_view message) {
        const std::string text(message);
        if (text.find("validation: ") != std::string::npos &&
            level == backplane::log::Level::Error) {
            if (gValidationErrors.fetch_add(1) == 0) {
                std::lock_guard lock(gFirstErrorMutex);
                gFirstValidationError = text;
            }
        }
        if (text.find("validation requested but") != std::string::npos)
            gPluginLacksValidationLayer = true;
        if (text.find("pipeline cache loaded") != std::string::npos) ++gCacheLoads;
        if (text.find("ignoring corrupt") != std::string::npos) ++gCacheIgnored;
        if (level >= backplane::log::Level::Warn) std::cerr << text << "\n";
    });
}

/// Whether validation is requested, read as the plugin reads BACKPLANE_VULKAN_VALIDATION.
bool validationRequested() {
    const char *value = std::getenv("BACKPLANE_VULKAN_VALIDATION");
    return value != nullptr && value[0] != '\0' && std::strcmp(value, "0") != 0;
}

/// Whether the Vulkan loader, asked directly (not through the plugin), lists the Khronos
/// validation layer; nullopt without a usable loader, which the plugin's probe then reports.
std::optional<bool> loaderListsValidationLayer() {
    void *loader = dlopen("libvulkan.so.1", RTLD_NOW | RTLD_LOCAL);
    if (loader == nullptr) return std::nullopt;
    const auto getProc =
        reinterpret_cast<PFN_vkGetInstanceProcAddr>(dlsym(loader, "vkGetInstanceProcAddr"));
    const auto enumerate =
        getProc == nullptr ? nullptr
                           : reinterpret_cast<PFN_vkEnumerateInstanceLayerProperties>(
                                 getProc(VK_NULL_HANDLE, "vkEnumerateInstanceLayerProperties"));
    std::optional<bool> listed;
    if (enumerate != nullptr) {
        uint32_t count = 0;
        std::vector<VkLayerProperties> layers;
        VkResult result = VK_INCOMPLETE;
        while (result == VK_INCOMPLETE) {
            enumerate(&count, nullptr);
            layers.resize(count);
            result = enumerate(&count, layers.data());
        }
        layers.resize(count);
        listed = std::any_of(layers.begin(), layers.end(), [](const VkLayerProperties &l) {
            return std::strcmp(l.layerName, kValidationLayer) == 0;
        });
    }
    dlclose(loader);
    return listed;
}

std::shared_ptr<PluginLibrary> openPlugin(const std::string &cacheDir = {},
                                          const std::string &options = "{}") {
    backplane::detail::PluginInitOptions init;
    init.cacheDir = cacheDir;
    init.optionsJson = options;
    // BACKPLANE_VULKAN_PLUGIN: run the built test elsewhere (the GPU machine) with its module.
    const char *path = std::getenv("BACKPLANE_VULKAN_PLUGIN");
    return PluginLibrary::open(path ? path : VULKAN_PLUGIN_PATH, "vulkan", init);
}

/// Fails the current test with the plugin's message when a call does not succeed.
#define VK_OK(call)                                                                                \
    do {                                                                                           \
        auto error_ = abi::make<bp_error>();                                                       \
        bp_error *err = &error_;                                                                   \
        const bp_status status_ = (call);                                                          \
        INFO(#call << ": " << error_.message);                                                     \
        REQUIRE(status_ == BP_SUCCESS);                                                            \
    } while (false)

/// One opened device of the plugin, with helpers over the raw table.
struct Device {
    std::shared_ptr<PluginLibrary> plugin;
    const bp_plugin_api *api = nullptr;
    abi::Owned<bp_device> device; // device_close when the Device goes
    bp_device_info info{};

    explicit Device(std::shared_ptr<PluginLibrary> p) : plugin(std::move(p)), api(&plugin->api()) {
        info = plugin->deviceInfo(0);
        const auto args = abi::make<bp_device_open_args>();
        bp_device *opened = nullptr;
        VK_OK(api->device_open(plugin->instance(), 0, &args, &opened, err));
        device = abi::Owned<bp_device>(*api, opened);
    }

    bp_memory *allocate(uint64_t size, bp_memory_kind kind = BP_MEMORY_DEVICE,
                        void **mapped = nullptr) {
        auto args = abi::make<bp_memory_allocate_args>();
        args.kind = kind;
        args.size = size;
        bp_memory *memory = nullptr;
        void *m = nullptr;
        VK_OK(api->memory_allocate(device.get(), &args, &memory, &m, err));
        if (mapped) *mapped = m;
        return memory;
    }
    void free(bp_memory *memory) { api->memory_free(device.get(), memory); }
    bp_stream *stream() {
        const auto args = abi::make<bp_stream_create_args>();
        bp_stream *s = nullptr;
        VK_OK(api->stream_create(device.get(), &args, &s, err));
        return s;
    }
    void destroy(bp_stream *s) { api->stream_destroy(device.get(), s); }
    bp_event *flush(bp_stream *s, uint32_t flags = 0) {
        auto args = abi::make<bp_flush_args>();
        args.flags = flags;
        bp_event *event = nullptr;
        VK_OK(api->stream_flush(device.get(), s, &args, &event, err));
        return event;
    }
    void sync(bp_stream *s) {
        const abi::Owned<bp_event> event(*api, device.get(), flush(s));
        VK_OK(api->event_wait(device.get(), event.get(), UINT64_MAX, err));
    }
    void write(bp_stream *s, bp_memory *dst, uint64_t offset, const void *src, uint64_t size) {
        auto args = abi::make<bp_copy_host_to_device_args>();
        args.src = src;
        args.dst = dst;
        args.dst_offset = offset;
        args.size = size;
        VK_OK(api->copy_host_to_device(device.get(), s, &args, err));
    }
    void read(bp_stream *s, bp_memory *src, uint64_t offset, void *dst, uint64_t size) {
        auto args = abi::make<bp_copy_device_to_host_args>();
        args.src = src;
        args.src_offset = offset;
        args.dst = dst;
        args.size = size;
        VK_OK(api->copy_device_to_host(device.get(), s, &args, err));
    }
    void copy(bp_stream *s, bp_memory *src, uint64_t srcOffset, bp_memory *dst, uint64_t dstOffset,
              uint64_t size) {
        auto args = abi::make<bp_copy_device_to_device_args>();
        args.src = src;
        args.src_offset = srcOffset;
        args.dst = dst;
        args.dst_offset = dstOffset;
        args.size = size;
        VK_OK(api->copy_device_to_device(device.get(), s, &args, err));
    }
    void fill(bp_stream *s, bp_memory *dst, uint64_t offset, uint64_t size, uint32_t pattern) {
        auto args = abi::make<bp_fill_args>();
        args.dst = dst;
        args.offset = offset;
        args.size = size;
        args.pattern = pattern;
        VK_OK(api->fill(device.get(), s, &args, err));
    }
    /// Compiles; returns the status, the blob and the log.
    bp_status compile(bp_dialect dialect, const std::string &source, const char *entry,
                      std::vector<unsigned char> &binary, std::string &log, bp_error &error) {
        auto args = abi::make<bp_kernel_compile_args>();
        args.dialect = dialect;
        args.entry_point = entry;
        args.source = source.data();
        args.source_size = source.size();
        args.binary = {&binary, [](void *user, const void *data, size_t size) {
                           auto *out = static_cast<std::vector<unsigned char> *>(user);
                           const auto *bytes = static_cast<const unsigned char *>(data);
                           out->insert(out->end(), bytes, bytes + size);
                       }};
        args.log = {&log, [](void *user, const void *data, size_t size) {
                        static_cast<std::string *>(user)->append(static_cast<const char *>(data),
                                                                 size);
                    }};
        error = abi::make<bp_error>();
        return api->kernel_compile(device.get(), &args, &error);
    }
    bp_kernel *kernel(const std::string &glsl, const char *entry = "main") {
        std::vector<unsigned char> binary;
        std::string log;
        bp_error error{};
        const bp_status status = compile(BP_DIALECT_GLSL, glsl, entry, binary, log, error);
        INFO(error.message);
        REQUIRE(status == BP_SUCCESS);
        auto args = abi::make<bp_kernel_load_args>();
        args.dialect = BP_DIALECT_GLSL;
        args.entry_point = entry;
        args.binary = binary.data();
        args.binary_size = binary.size();
        bp_kernel *k = nullptr;
        VK_OK(api->kernel_load(device.get(), &args, &k, err));
        return k;
    }
    bp_status launch(bp_stream *s, const bp_launch_args &args, bp_error &error) {
        error = abi::make<bp_error>();
        return api->kernel_launch(device.get(), s, &args, &error);
    }
};

// b[i] = a[i] * scale + add, for i < n; block size from specialization constants.
const std::string kAxpb = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer A { uint a[]; };
layout(set = 0, binding = 1) buffer B { uint b[]; };
layout(push_constant) uniform P { uint n; uint scale; uint add; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < n) b[i] = a[i] * scale + add;
}
)";

// x[i] += 1 for i < n.
const std::string kIncrement = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { uint x[]; };
layout(push_constant) uniform P { uint n; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < n) x[i] += 1u;
}
)";

bp_launch_args launchArgs(bp_kernel *kernel, const bp_binding *bindings, uint32_t count,
                          const void *scalars, size_t scalarSize, uint32_t grid, uint32_t block) {
    auto args = abi::make<bp_launch_args>();
    args.kernel = kernel;
    args.grid[0] = grid;
    args.grid[1] = args.grid[2] = 1;
    args.block[0] = block;
    args.block[1] = args.block[2] = 1;
    args.bindings = bindings;
    args.binding_count = count;
    args.scalars = scalars;
    args.scalar_size = scalarSize;
    return args;
}

/// Runs the increment kernel `times` times on x (n uints) on stream s.
void increment(Device &d, bp_stream *s, bp_kernel *k, bp_memory *x, uint32_t n, int times) {
    const bp_binding binding{x, 0, n * 4ull};
    for (int i = 0; i < times; ++i) {
        const auto args = launchArgs(k, &binding, 1, &n, 4, (n + 63) / 64, 64);
        bp_error error{};
        const bp_status status = d.launch(s, args, error);
        INFO(error.message);
        REQUIRE(status == BP_SUCCESS);
    }
}

void runAxpb(Device &d) {
    bp_stream *s = d.stream();
    bp_kernel *k = d.kernel(kAxpb, "axpb");
    const uint32_t align = d.info.binding_alignment;
    const uint32_t n = 1000;
    bp_memory *page = d.allocate(8 * align + 2 * n * 4);
    std::vector<uint32_t> input(n);
    std::iota(input.begin(), input.end(), 7u);
    const uint64_t aOffset = 3ull * align, bOffset = aOffset + ((n * 4 + align - 1) / align) * align;
    d.write(s, page, aOffset, input.data(), n * 4);
    const bp_binding bindings[2] = {{page, aOffset, n * 4}, {page, bOffset, n * 4}};
    const uint32_t scalars[3] = {n, 3, 5};
    for (uint32_t block : {32u, 128u}) {
        d.fill(s, page, bOffset, n * 4, 0);
        const auto args = launchArgs(k, bindings, 2, scalars, sizeof scalars, (n + block - 1) / block,
                                     block);
        bp_error error{};
        const bp_status status = d.launch(s, args, error);
        INFO(error.message);
        REQUIRE(status == BP_SUCCESS);
        std::vector<uint32_t> output(n, 0);
        d.read(s, page, bOffset, output.data(), n * 4);
        d.sync(s);
        for (uint32_t i = 0; i < n; ++i) REQUIRE(output[i] == input[i] * 3 + 5);
    }
    d.api->kernel_release(d.device.get(), k);
    d.free(page);
    d.destroy(s);
}

std::string gSelf;

} // namespace

TEST_CASE("probe reports the lavapipe device with identity, limits and capabilities") {
    auto plugin = openPlugin();
    const bp_probe_result probe = plugin->probe();
    REQUIRE(probe.device_count >= 1);
    CHECK(std::string(probe.driver_version).find("Vulkan loader") == 0);
    const bp_device_info info = plugin->deviceInfo(0);
    MESSAGE("device 0: " << info.name << " (" << info.vendor << ", " << info.arch << ", "
                         << info.driver_version << ")");
    CHECK(std::strlen(info.name) > 0);
    CHECK(info.has_uuid == 1);
    CHECK(info.memory_bytes > 0);
    CHECK(info.max_allocation_bytes > 0);
    CHECK(info.max_block_threads >= 128);
    CHECK(info.max_grid_size[0] >= 65535);
    CHECK(info.binding_alignment >= 4);
    CHECK(info.max_bindings >= 4);
    CHECK(info.max_scalar_bytes >= 128);
    CHECK(info.max_streams >= 1);
    CHECK(info.dialects == ((1u << BP_DIALECT_GLSL) | (1u << BP_DIALECT_SPIRV)));
    CHECK((info.capabilities & BP_CAPABILITY_ASYNC_STREAMS) != 0);
    CHECK((info.capabilities & BP_CAPABILITY_PORTABLE_BINARIES) != 0);
    CHECK((info.capabilities & BP_CAPABILITY_INDIRECT_DISPATCH) != 0);
    if (std::string(info.arch) == "lavapipe") {
        CHECK(info.type == BP_DEVICE_TYPE_CPU);
        CHECK((info.capabilities & BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY) != 0);
    }
    auto missing = abi::make<bp_device_info>();
    auto error = abi::make<bp_error>();
    CHECK(plugin->api().device_info(plugin->instance(), 99, &missing, &error) ==
          BP_ERROR_NOT_FOUND);
}

TEST_CASE("copies round-trip with odd sizes and offsets through pinned and pageable memory") {
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_memory *page = d.allocate(1 << 20);
    void *pinnedHost = nullptr;
    bp_memory *pinned = d.allocate(1 << 16, BP_MEMORY_PINNED_HOST, &pinnedHost);
    REQUIRE(pinnedHost != nullptr);
    for (uint64_t size : {1ull, 3ull, 1001ull, 65535ull}) {
        for (uint64_t offset : {0ull, 1ull, 4093ull}) {
            std::vector<unsigned char> data(size), back(size, 0);
            for (uint64_t i = 0; i < size; ++i) data[i] = static_cast<unsigned char>(i * 7 + size);
            // Pageable (not ours): staged by the plugin.
            d.write(s, page, offset, data.data(), size);
            d.read(s, page, offset, back.data(), size);
            d.sync(s);
            REQUIRE(back == data);
            // From/to one of our pinned pages: copied directly, at an odd offset in it.
            auto *host = static_cast<unsigned char *>(pinnedHost);
            const uint64_t hostOffset = size < 1000 ? 17 : 0;
            std::memcpy(host + hostOffset, data.data(), size);
            d.write(s, page, offset + 8, host + hostOffset, size);
            d.sync(s); // the host bytes must stay unchanged until the copy completed
            std::memset(host + hostOffset, 0, size);
            d.read(s, page, offset + 8, host + hostOffset, size);
            d.sync(s);
            REQUIRE(std::memcmp(host + hostOffset, data.data(), size) == 0);
        }
    }
    // Device to device at odd offsets, and out-of-range arguments are rejected.
    const char text[] = "backplane vulkan";
    d.write(s, page, 5, text, sizeof text);
    d.copy(s, page, 5, page, 100003, sizeof text);
    char back[sizeof text] = {};
    d.read(s, page, 100003, back, sizeof text);
    d.sync(s);
    CHECK(std::string(back) == text);
    auto args = abi::make<bp_copy_host_to_device_args>();
    args.src = text;
    args.dst = page;
    args.dst_offset = (1 << 20) - 2;
    args.size = sizeof text;
    auto error = abi::make<bp_error>();
    CHECK(d.api->copy_host_to_device(d.device.get(), s, &args, &error) == BP_ERROR_INVALID_ARGUMENT);
    d.free(pinned);
    d.free(page);
    d.destroy(s);
}

TEST_CASE("fill writes a pattern into a sub-range only") {
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_memory *page = d.allocate(4096);
    d.fill(s, page, 0, 4096, 0);
    d.fill(s, page, 64, 128, 0xdeadbeef);
    std::vector<uint32_t> back(1024);
    d.read(s, page, 0, back.data(), 4096);
    d.sync(s);
    for (size_t i = 0; i < back.size(); ++i)
        REQUIRE(back[i] == (i >= 16 && i < 48 ? 0xdeadbeefu : 0u));
    auto args = abi::make<bp_fill_args>();
    args.dst = page;
    args.offset = 2;
    args.size = 8;
    auto error = abi::make<bp_error>();
    CHECK(d.api->fill(d.device.get(), s, &args, &error) == BP_ERROR_INVALID_ARGUMENT);
    d.free(page);
    d.destroy(s);
}

TEST_CASE("a 256 MiB buffer is filled, copied (transfer and shader copy) and read back") {
  for (const char *options : {R"({"shader_copy": "off"})", R"({"shader_copy": "on"})"}) {
    CAPTURE(options);
    Device d(openPlugin({}, options));
    const uint64_t size = 256ull << 20;
    if (d.info.max_allocation_bytes < size) {
        MESSAGE("device cannot allocate 256 MiB; skipped");
        return;
    }
    bp_stream *s = d.stream();
    bp_memory *a = d.allocate(size);
    bp_memory *b = d.allocate(size);
    d.fill(s, a, 0, size, 0x01020304);
    const uint32_t marker = 0xabcdef01;
    d.write(s, a, size - 4, &marker, 4);
    d.copy(s, a, 0, b, 0, size);
    std::vector<uint32_t> back(size / 4);
    d.read(s, b, 0, back.data(), size);
    d.sync(s);
    CHECK(back.front() == 0x01020304u);
    CHECK(back[back.size() / 2] == 0x01020304u);
    CHECK(back.back() == marker);
    d.free(b);
    d.free(a);
    d.destroy(s);
  }
}

TEST_CASE("a GLSL kernel runs with bindings at offsets, push-constant scalars and a spec-constant block size") {
    Device d(openPlugin());
    runAxpb(d);
}

TEST_CASE("kernels run with descriptor pools when push descriptors are turned off") {
    Device d(openPlugin({}, R"({"push_descriptors": false})"));
    runAxpb(d);
}

TEST_CASE("a GLSL compile error returns the compiler log naming the kernel") {
    Device d(openPlugin());
    std::vector<unsigned char> binary;
    std::string log;
    bp_error error{};
    const std::string broken = "#version 450\nlayout(local_size_x = 1) in;\nvoid main() { "
                               "undeclared_thing = 1; }\n";
    const bp_status status = d.compile(BP_DIALECT_GLSL, broken, "broken_kernel", binary, log, error);
    CHECK(status == BP_ERROR_COMPILE);
    CHECK(log.find("undeclared_thing") != std::string::npos);
    CHECK(std::string(error.message).find("broken_kernel") != std::string::npos);
    CHECK(binary.empty());
}

TEST_CASE("SPIR-V input is validated: garbage is rejected, a real module passes through") {
    Device d(openPlugin());
    std::vector<unsigned char> binary;
    std::string log;
    bp_error error{};
    CHECK(d.compile(BP_DIALECT_SPIRV, std::string(64, 'x'), "main", binary, log, error) ==
          BP_ERROR_INVALID_ARGUMENT);
    CHECK(std::string(error.message).find("magic") != std::string::npos);
    CHECK(d.compile(BP_DIALECT_SPIRV, std::string(30, '\0'), "main", binary, log, error) ==
          BP_ERROR_INVALID_ARGUMENT);
    auto load = abi::make<bp_kernel_load_args>();
    const uint32_t garbage[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    load.dialect = BP_DIALECT_SPIRV;
    load.entry_point = "main";
    load.binary = garbage;
    load.binary_size = sizeof garbage;
    bp_kernel *k = nullptr;
    error = abi::make<bp_error>();
    CHECK(d.api->kernel_load(d.device.get(), &load, &k, &error) == BP_ERROR_INVALID_ARGUMENT);

    std::vector<unsigned char> spirv;
    REQUIRE(d.compile(BP_DIALECT_GLSL, kIncrement, "main", spirv, log, error) == BP_SUCCESS);
    binary.clear();
    const std::string blob(spirv.begin(), spirv.end());
    CHECK(d.compile(BP_DIALECT_SPIRV, blob, "main", binary, log, error) == BP_SUCCESS);
    CHECK(binary == spirv);
}

TEST_CASE("more commands than the batch bound run in order with correct results") {
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *k = d.kernel(kIncrement);
    const uint32_t n = 4096;
    bp_memory *x = d.allocate(n * 4);
    d.fill(s, x, 0, n * 4, 0);
    const int times = 200; // > 3 batches of 64
    increment(d, s, k, x, n, times);
    // Interleave copies and fills across a batch boundary too.
    bp_memory *y = d.allocate(n * 4);
    for (int i = 0; i < 70; ++i) {
        d.copy(s, x, 0, y, 0, n * 4);
        d.copy(s, y, 0, x, 0, n * 4);
    }
    std::vector<uint32_t> back(n);
    d.read(s, x, 0, back.data(), n * 4);
    d.sync(s);
    for (uint32_t v : back) REQUIRE(v == static_cast<uint32_t>(times));
    d.free(y);
    d.free(x);
    d.api->kernel_release(d.device.get(), k);
    d.destroy(s);
}

TEST_CASE("a stream waits on an event of another stream before it reads the data") {
    Device d(openPlugin());
    bp_stream *producer = d.stream();
    bp_stream *consumer = d.stream();
    bp_kernel *k = d.kernel(kIncrement);
    const uint32_t n = 1 << 16;
    bp_memory *x = d.allocate(n * 4);
    bp_memory *y = d.allocate(n * 4);
    d.fill(producer, x, 0, n * 4, 0);
    increment(d, producer, k, x, n, 50);
    bp_event *done = d.flush(producer);
    VK_OK(d.api->stream_wait_event(d.device.get(), consumer, done, err));
    d.copy(consumer, x, 0, y, 0, n * 4);
    std::vector<uint32_t> back(n);
    d.read(consumer, y, 0, back.data(), n * 4);
    d.sync(consumer);
    auto error = abi::make<bp_error>();
    CHECK(d.api->event_query(d.device.get(), done, &error) == BP_SUCCESS);
    for (uint32_t v : back) REQUIRE(v == 50u);
    d.api->event_release(d.device.get(), done);
    d.free(y);
    d.free(x);
    d.api->kernel_release(d.device.get(), k);
    d.destroy(consumer);
    d.destroy(producer);
}

TEST_CASE("timing events measure device time between two flushes") {
    Device d(openPlugin());
    if (!(d.info.capabilities & BP_CAPABILITY_TIMESTAMPS)) {
        MESSAGE("device has no timestamps; skipped");
        return;
    }
    bp_stream *s = d.stream();
    bp_kernel *k = d.kernel(kIncrement);
    const uint32_t n = 1 << 18;
    bp_memory *x = d.allocate(n * 4);
    d.fill(s, x, 0, n * 4, 0);
    bp_event *start = d.flush(s, BP_FLUSH_TIMING_EVENT);
    increment(d, s, k, x, n, 20);
    bp_event *end = d.flush(s, BP_FLUSH_TIMING_EVENT);
    VK_OK(d.api->event_wait(d.device.get(), end, UINT64_MAX, err));
    uint64_t ns = 0;
    VK_OK(d.api->event_elapsed_ns(d.device.get(), start, end, &ns, err));
    MESSAGE("20 increments of 1 MiB: " << ns / 1000.0 << " us of device time");
    CHECK(ns > 0);
    CHECK(ns < 60'000'000'000ull);
    bp_event *plain = d.flush(s);
    uint64_t unused = 0;
    auto error = abi::make<bp_error>();
    CHECK(d.api->event_elapsed_ns(d.device.get(), start, plain, &unused, &error) ==
          BP_ERROR_INVALID_ARGUMENT);
    for (bp_event *e : {start, end, plain}) d.api->event_release(d.device.get(), e);
    d.free(x);
    d.api->kernel_release(d.device.get(), k);
    d.destroy(s);
}

TEST_CASE("an indirect dispatch reads its grid from a buffer") {
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *k = d.kernel(kIncrement);
    const uint32_t n = 1000;
    bp_memory *x = d.allocate(n * 4);
    bp_memory *grid = d.allocate(64);
    d.fill(s, x, 0, n * 4, 0);
    const uint32_t dims[3] = {(n + 63) / 64, 1, 1};
    d.write(s, grid, 16, dims, sizeof dims);
    const bp_binding binding{x, 0, n * 4};
    auto args = launchArgs(k, &binding, 1, &n, 4, 0, 64);
    args.grid_memory = grid;
    args.grid_offset = 16;
    bp_error error{};
    const bp_status status = d.launch(s, args, error);
    INFO(error.message);
    REQUIRE(status == BP_SUCCESS);
    std::vector<uint32_t> back(n);
    d.read(s, x, 0, back.data(), n * 4);
    d.sync(s);
    for (uint32_t v : back) REQUIRE(v == 1u);
    d.free(grid);
    d.free(x);
    d.api->kernel_release(d.device.get(), k);
    d.destroy(s);
}

TEST_CASE("launch arguments the device cannot honour are rejected before recording") {
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *k = d.kernel(kIncrement);
    bp_memory *x = d.allocate(4096);
    const uint32_t n = 16;
    bp_binding binding{x, 1, 64}; // misaligned offset
    auto args = launchArgs(k, &binding, 1, &n, 4, 1, 64);
    bp_error error{};
    CHECK(d.launch(s, args, error) == BP_ERROR_INVALID_ARGUMENT);
    binding.offset = 0;
    args.block[0] = d.info.max_block_size[0] + 1;
    CHECK(d.launch(s, args, error) == BP_ERROR_LAUNCH);
    d.free(x);
    d.api->kernel_release(d.device.get(), k);
    d.destroy(s);
}

namespace {

/// kernel_load of a blob; returns the status and fills `error`, `out` on success.
bp_status loadKernel(Device &d, bp_dialect dialect, const std::vector<unsigned char> &binary,
                     const char *entry, bp_kernel *&out, bp_error &error) {
    auto args = abi::make<bp_kernel_load_args>();
    args.dialect = dialect;
    args.entry_point = entry;
    args.binary = binary.data();
    args.binary_size = binary.size();
    error = abi::make<bp_error>();
    out = nullptr;
    return d.api->kernel_load(d.device.get(), &args, &out, &error);
}

/// Compiles GLSL (must succeed) and loads it; returns the load's status.
bp_status loadGlsl(Device &d, const std::string &glsl, const char *entry, bp_kernel *&out,
                   bp_error &error, std::vector<unsigned char> *spirv = nullptr) {
    std::vector<unsigned char> binary;
    std::string log;
    REQUIRE(d.compile(BP_DIALECT_GLSL, glsl, entry, binary, log, error) == BP_SUCCESS);
    if (spirv) *spirv = binary;
    return loadKernel(d, BP_DIALECT_GLSL, binary, entry, out, error);
}

bool contains(const char *text, const char *part) { return std::strstr(text, part) != nullptr; }

// Uses bindings 0 and 2 only: a launch must still give 3 (binding i is launch binding i).
const std::string kGapBindings = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) readonly buffer A { uint a[]; };
layout(set = 0, binding = 2) buffer C { uint c[]; };
layout(push_constant) uniform P { uint n; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < n) c[i] = a[i] + 1u;
}
)";

// Declares a second buffer and a push-constant block it never reads: the optimizer (the
// plugin's default -O) removes both, so the module uses one buffer and no push constants.
const std::string kUnusedInterface = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { uint x[]; };
layout(set = 0, binding = 1) buffer Unused { uint unused[]; };
layout(push_constant) uniform P { uint ignored; };
void main() { x[gl_GlobalInvocationID.x] = 7u; }
)";

} // namespace

TEST_CASE("a launch without the scalars of the shader's push-constant block is refused and the "
          "process survives") {
    // Before the check, this launch recorded a dispatch whose push constants were never pushed:
    // lavapipe crashed the process (SIGSEGV), also under the validation layer.
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *k = d.kernel(kAxpb, "axpb");
    const uint32_t n = 256;
    bp_memory *a = d.allocate(n * 4);
    bp_memory *b = d.allocate(n * 4);
    const bp_binding bindings[2] = {{a, 0, n * 4}, {b, 0, n * 4}};
    bp_error error{};
    {
        const auto args = launchArgs(k, bindings, 2, nullptr, 0, n / 64, 64);
        CHECK(d.launch(s, args, error) == BP_ERROR_INVALID_ARGUMENT);
        MESSAGE(error.message);
        CHECK(contains(error.message, "'axpb'"));
        CHECK(contains(error.message, "2 storage-buffer bindings"));
        CHECK(contains(error.message, "12 bytes of push constants"));
        CHECK(contains(error.message, "2 bindings and 0 scalar bytes"));
    }
    {
        const uint32_t tooFew = n; // 4 of the block's 12 bytes
        const auto args = launchArgs(k, bindings, 2, &tooFew, sizeof tooFew, n / 64, 64);
        CHECK(d.launch(s, args, error) == BP_ERROR_INVALID_ARGUMENT);
        INFO(error.message);
        CHECK(contains(error.message, "2 bindings and 4 scalar bytes"));
    }
    // Nothing was recorded (had the launches above been accepted, they would run at the sync
    // below): the stream is intact and a correct launch runs.
    std::vector<uint32_t> input(n);
    std::iota(input.begin(), input.end(), 1u);
    d.write(s, a, 0, input.data(), n * 4);
    const uint32_t scalars[3] = {n, 2, 1};
    const auto args = launchArgs(k, bindings, 2, scalars, sizeof scalars, n / 64, 64);
    REQUIRE(d.launch(s, args, error) == BP_SUCCESS);
    std::vector<uint32_t> output(n);
    d.read(s, b, 0, output.data(), n * 4);
    d.sync(s);
    for (uint32_t i = 0; i < n; ++i) REQUIRE(output[i] == input[i] * 2 + 1);
    d.free(b);
    d.free(a);
    d.api->kernel_release(d.device.get(), k);
    d.destroy(s);
}

TEST_CASE("a launch with fewer bindings than the shader uses is refused naming both counts") {
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *axpb = d.kernel(kAxpb, "axpb");
    bp_kernel *gap = d.kernel(kGapBindings, "gap");
    const uint32_t n = 128;
    bp_memory *a = d.allocate(n * 4);
    bp_memory *c = d.allocate(n * 4);
    const bp_binding bindings[3] = {{a, 0, n * 4}, {c, 0, n * 4}, {c, 0, n * 4}};
    const uint32_t scalars[3] = {n, 1, 0};
    bp_error error{};
    {
        const auto args = launchArgs(axpb, bindings, 1, scalars, sizeof scalars, n / 64, 64);
        CHECK(d.launch(s, args, error) == BP_ERROR_INVALID_ARGUMENT);
        INFO(error.message);
        CHECK(contains(error.message, "'axpb'"));
        CHECK(contains(error.message, "2 storage-buffer bindings"));
        CHECK(contains(error.message, "1 binding and 12 scalar bytes"));
        const auto none = launchArgs(axpb, nullptr, 0, scalars, sizeof scalars, n / 64, 64);
        CHECK(d.launch(s, none, error) == BP_ERROR_INVALID_ARGUMENT);
    }
    // Bindings 0 and 2: the count is the highest binding + 1, whatever lies between.
    {
        const auto args = launchArgs(gap, bindings, 2, &n, 4, n / 64, 64);
        CHECK(d.launch(s, args, error) == BP_ERROR_INVALID_ARGUMENT);
        INFO(error.message);
        MESSAGE(error.message);
        CHECK(contains(error.message, "'gap'"));
        CHECK(contains(error.message, "3 storage-buffer bindings"));
    }
    std::vector<uint32_t> input(n, 41u);
    d.write(s, a, 0, input.data(), n * 4);
    d.fill(s, c, 0, n * 4, 0);
    const auto args = launchArgs(gap, bindings, 3, &n, 4, n / 64, 64);
    REQUIRE(d.launch(s, args, error) == BP_SUCCESS);
    std::vector<uint32_t> output(n);
    d.read(s, c, 0, output.data(), n * 4);
    d.sync(s);
    for (uint32_t v : output) REQUIRE(v == 42u);
    d.free(c);
    d.free(a);
    d.api->kernel_release(d.device.get(), gap);
    d.api->kernel_release(d.device.get(), axpb);
    d.destroy(s);
}

TEST_CASE("bindings and scalar bytes beyond what the shader uses are accepted") {
    // The optimizer drops unused buffers and push-constant blocks from the module, so a launch
    // that binds what the source declares must keep working; extra descriptors and push-constant
    // bytes are harmless (the pipeline layout has room for them). Scalars larger than the block
    // are a C struct's tail padding (a std430 block's size has none).
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *unused = d.kernel(kUnusedInterface, "unused_interface");
    bp_kernel *inc = d.kernel(kIncrement, "increment");
    const uint32_t n = 64;
    bp_memory *x = d.allocate(n * 4);
    bp_memory *y = d.allocate(n * 4);
    const bp_binding bindings[2] = {{x, 0, n * 4}, {y, 0, n * 4}};
    bp_error error{};
    const uint32_t padded[2] = {n, 0xdeadbeef};
    for (const auto &args : {launchArgs(unused, bindings, 2, &n, 4, 1, 64),
                             launchArgs(inc, bindings, 1, padded, sizeof padded, 1, 64),
                             launchArgs(inc, bindings, 2, &n, 4, 1, 64)}) {
        const bp_status status = d.launch(s, args, error);
        INFO(error.message);
        REQUIRE(status == BP_SUCCESS);
    }
    std::vector<uint32_t> output(n);
    d.read(s, x, 0, output.data(), n * 4);
    d.sync(s);
    for (uint32_t v : output) REQUIRE(v == 9u);
    d.free(y);
    d.free(x);
    d.api->kernel_release(d.device.get(), inc);
    d.api->kernel_release(d.device.get(), unused);
    d.destroy(s);
}

TEST_CASE("a kernel whose interface the plugin cannot bind is refused at load") {
    Device d(openPlugin());
    bp_kernel *k = nullptr;
    bp_error error{};
    // Descriptors other than set-0 storage buffers: the plugin binds nothing else.
    const std::string uniformBuffer = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer X { uint x[]; };
layout(set = 0, binding = 1) uniform U { uint value; };
void main() { x[0] = value; }
)";
    CHECK(loadGlsl(d, uniformBuffer, "with_uniform", k, error) == BP_ERROR_UNSUPPORTED);
    MESSAGE(error.message);
    CHECK(k == nullptr);
    CHECK(contains(error.message, "'with_uniform'"));
    CHECK(contains(error.message, "uniform buffer"));
    const std::string otherSet = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 1, binding = 0) buffer X { uint x[]; };
void main() { x[0] = 1u; }
)";
    CHECK(loadGlsl(d, otherSet, "other_set", k, error) == BP_ERROR_UNSUPPORTED);
    CHECK(contains(error.message, "'other_set'"));
    CHECK(contains(error.message, "set 1"));
    const std::string bufferArray = R"(#version 450
layout(local_size_x = 1) in;
layout(set = 0, binding = 0) buffer X { uint x[]; } xs[2];
void main() { xs[1].x[0] = 1u; }
)";
    CHECK(loadGlsl(d, bufferArray, "buffer_array", k, error) == BP_ERROR_UNSUPPORTED);
    CHECK(contains(error.message, "array"));
    // A module with a valid header and a broken body is refused before the driver sees it.
    std::vector<unsigned char> spirv;
    REQUIRE(loadGlsl(d, kIncrement, "main", k, error, &spirv) == BP_SUCCESS);
    d.api->kernel_release(d.device.get(), k);
    std::vector<unsigned char> broken(spirv.begin(), spirv.begin() + 20);
    for (int i = 0; i < 16; ++i) broken.insert(broken.end(), {0xff, 0xff, 0x0f, 0x00});
    CHECK(loadKernel(d, BP_DIALECT_SPIRV, broken, "main", k, error) ==
          BP_ERROR_INVALID_ARGUMENT);
    MESSAGE(error.message);
    CHECK(k == nullptr);
    CHECK(contains(error.message, "'main'"));
}

namespace {

/// Child process of the pipeline-cache tests: open, build a pipeline, close (which saves).
/// `mode` "fsize=N": no file of this process may grow beyond N bytes (RLIMIT_FSIZE, SIGXFSZ
/// ignored, so a write fails with EFBIG as on a full disk); "vanish": the cache directory is
/// removed before the device closes (as `backplane cache clear` may do).
int pipelineCacheChild(const std::string &dir, const std::string &mode) {
    installLogSink();
    doctest::Context context; // assertions of the helpers run outside a test case here
    context.setAsDefaultForAssertsOutOfTestCases();
    if (mode.rfind("fsize=", 0) == 0) {
        std::signal(SIGXFSZ, SIG_IGN);
        const rlim_t bytes = std::stoull(mode.substr(6));
        const rlimit limit{bytes, bytes};
        if (::setrlimit(RLIMIT_FSIZE, &limit) != 0) return 13;
    }
    {
        Device d(openPlugin(dir));
        bp_stream *s = d.stream();
        bp_kernel *k = d.kernel(kIncrement);
        bp_memory *x = d.allocate(256);
        increment(d, s, k, x, 64, 1);
        d.sync(s);
        d.free(x);
        d.api->kernel_release(d.device.get(), k);
        d.destroy(s);
        if (mode == "vanish") fs::remove_all(dir);
    }
    std::printf("cache-loads=%d cache-ignored=%d\n", gCacheLoads.load(), gCacheIgnored.load());
    return gCacheLoads.load() > 0 ? 10 : (gCacheIgnored.load() > 0 ? 11 : 12);
}

int runChild(const fs::path &dir, const std::string &mode = "normal") {
    const std::string command =
        "'" + gSelf + "' --pipeline-cache-child '" + dir.string() + "' " + mode;
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::vector<unsigned char> fileBytes(const fs::path &path) {
    std::vector<unsigned char> bytes;
    if (std::FILE *f = std::fopen(path.c_str(), "rb")) {
        unsigned char buffer[4096];
        for (size_t n; (n = std::fread(buffer, 1, sizeof buffer, f)) > 0;)
            bytes.insert(bytes.end(), buffer, buffer + n);
        std::fclose(f);
    }
    return bytes;
}

std::vector<fs::path> filesIn(const fs::path &dir) {
    std::vector<fs::path> files;
    for (const auto &entry : fs::directory_iterator(dir))
        files.push_back(entry.path());
    return files;
}

} // namespace

TEST_CASE("the pipeline cache is written at close and reused by a second process") {
    const fs::path dir = fs::temp_directory_path() / ("bp-vulkan-cache-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    CHECK(runChild(dir) == 12); // nothing to load the first time
    std::vector<fs::path> files;
    for (const auto &entry : fs::directory_iterator(dir)) files.push_back(entry.path());
    REQUIRE(files.size() == 1);
    CHECK(files[0].filename().string().rfind("vulkan-pipelines-", 0) == 0);
    CHECK(fs::file_size(files[0]) > 32);
    CHECK(runChild(dir) == 10); // loaded by the second process
    // A corrupt file is ignored (and replaced at close).
    {
        std::FILE *f = std::fopen(files[0].c_str(), "r+b");
        REQUIRE(f != nullptr);
        std::fseek(f, 40, SEEK_SET);
        std::fputs("corruption", f);
        std::fclose(f);
    }
    CHECK(runChild(dir) == 11);
    CHECK(runChild(dir) == 10);
    fs::remove_all(dir);
}

TEST_CASE("a pipeline cache that cannot be written whole leaves the previous file and no "
          "temporary file") {
    const fs::path dir =
        fs::temp_directory_path() / ("bp-vulkan-full-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    CHECK(runChild(dir) == 12);
    auto files = filesIn(dir);
    REQUIRE(files.size() == 1);
    const std::vector<unsigned char> previous = fileBytes(files[0]);
    REQUIRE(previous.size() > 41);
    // A disk with room for 40 bytes: the save fails (at write, flush or close) after the child
    // loaded the previous file.
    CHECK(runChild(dir, "fsize=40") == 10);
    files = filesIn(dir);
    REQUIRE(files.size() == 1); // no temporary file left
    CHECK(fileBytes(files[0]) == previous);
    CHECK(runChild(dir) == 10); // and it is still used
    fs::remove_all(dir);
}

TEST_CASE("a pipeline cache directory removed while the device is open is created again at "
          "close") {
    const fs::path dir =
        fs::temp_directory_path() / ("bp-vulkan-vanish-" + std::to_string(::getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    CHECK(runChild(dir, "vanish") == 12);
    REQUIRE(fs::is_directory(dir));
    CHECK(filesIn(dir).size() == 1);
    CHECK(runChild(dir) == 10);
    fs::remove_all(dir);
}

TEST_CASE("narrow barriers and skipped state binds keep every result in order") {
    // Barriers name only the stage classes they separate, and a launch records only the state
    // that differs from the bound one; under `vulkan_validation` synchronization validation
    // checks each hazard below.
    Device d(openPlugin());
    bp_stream *s = d.stream();
    bp_kernel *inc = d.kernel(kIncrement);
    bp_kernel *axpb = d.kernel(kAxpb, "axpb");
    const uint32_t n = 1024;
    bp_memory *x = d.allocate(n * 4);
    bp_memory *y = d.allocate(n * 4);
    bp_memory *z = d.allocate(n * 4);
    bp_memory *grid = d.allocate(16);
    d.fill(s, x, 0, n * 4, 0);
    d.fill(s, y, 0, n * 4, 0);
    const uint32_t gridInit[3] = {n / 64 - 1, 0, 0};
    d.write(s, grid, 0, gridInit, sizeof gridInit);
    increment(d, s, inc, y, n, 1); // transfer -> compute
    increment(d, s, inc, x, n, 2); // compute -> compute barriers only
    // y was written by a dispatch before those compute-only barriers: the copy needs its own.
    d.copy(s, y, 0, z, 0, n * 4);
    // A kernel writes the grid (then a compute-only barrier); the indirect read needs its own.
    increment(d, s, inc, grid, 3, 1);
    increment(d, s, inc, x, n, 1);
    {
        const bp_binding binding{z, 0, n * 4};
        auto args = launchArgs(inc, &binding, 1, &n, 4, 0, 64);
        args.grid_memory = grid;
        bp_error error{};
        const bp_status status = d.launch(s, args, error);
        INFO(error.message);
        REQUIRE(status == BP_SUCCESS);
    }
    // Alternating kernels (layouts), scalars that change or repeat, the same buffers.
    const bp_binding pair[2] = {{x, 0, n * 4}, {y, 0, n * 4}};
    const bp_binding single{y, 0, n * 4};
    const uint32_t half = n / 2;
    for (uint32_t i = 0; i < 5; ++i) {
        const uint32_t scalars[3] = {n, i + 1, i};
        for (const auto &args : {launchArgs(axpb, pair, 2, scalars, sizeof scalars, n / 64, 64),
                                 launchArgs(inc, &single, 1, &n, 4, n / 64, 64),
                                 launchArgs(inc, &single, 1, &half, 4, n / 64, 64)}) {
            bp_error error{};
            const bp_status status = d.launch(s, args, error);
            INFO(error.message);
            REQUIRE(status == BP_SUCCESS);
        }
    }
    std::vector<uint32_t> xs(n), ys(n), zs(n), dims(3);
    d.read(s, x, 0, xs.data(), n * 4);
    d.read(s, y, 0, ys.data(), n * 4);
    d.read(s, z, 0, zs.data(), n * 4);
    d.read(s, grid, 0, dims.data(), 12);
    d.sync(s);
    CHECK(dims == std::vector<uint32_t>{n / 64, 1, 1});
    for (uint32_t i = 0; i < n; ++i) {
        REQUIRE(xs[i] == 3u);
        REQUIRE(zs[i] == 2u);
        REQUIRE(ys[i] == (i < half ? 21u : 20u)); // 3 * 5 + 4, + 1, + 1 on the first half
    }
    d.free(grid);
    d.free(z);
    d.free(y);
    d.free(x);
    d.api->kernel_release(d.device.get(), axpb);
    d.api->kernel_release(d.device.get(), inc);
    d.destroy(s);
}

TEST_CASE("the validation layer reported no errors") {
    // Runs last: every operation above ran under the layer in the `vulkan_validation` entry.
    const bool validation = validationRequested();
    const std::string summary = std::string("validation ") + (validation ? "on" : "off") +
                                ", errors: " + std::to_string(gValidationErrors.load());
    MESSAGE(summary);
    // Zero errors means nothing when the plugin ran without the layer it was asked for.
    if (validation) {
        INFO("the plugin logged: validation requested but " << std::string(kValidationLayer)
                                                            << " is not installed");
        CHECK_FALSE(gPluginLacksValidationLayer.load());
    }
    std::lock_guard lock(gFirstErrorMutex);
    INFO(gFirstValidationError);
    CHECK(gValidationErrors.load() == 0);
}

int main(int argc, char **argv) {
    gSelf = fs::read_symlink("/proc/self/exe").string();
    if (argc == 4 && std::string(argv[1]) == "--pipeline-cache-child")
        return pipelineCacheChild(argv[2], argv[3]);
    installLogSink();
    // A missing layer is the machine's setup, not absent hardware: without it the last test
    // case would count zero errors from a layer that never ran.
    const std::optional<bool> layerListed =
        validationRequested() ? loaderListsValidationLayer() : std::nullopt;
    if (layerListed.has_value() && !*layerListed) {
        const char *layerPath = std::getenv("VK_LAYER_PATH");
        return backplane::test::fail(
            std::string("validation requested but ") + kValidationLayer +
            " is not installed (Debian: vulkan-validationlayers" +
            (layerPath != nullptr ? std::string("; VK_LAYER_PATH=") + layerPath : "") + ")");
    }
    try {
        if (openPlugin()->probe().device_count == 0)
            return backplane::test::skip("the Vulkan plugin found no device");
    } catch (const std::exception &e) {
        return backplane::test::skipOrFail(e, "opening and probing the Vulkan plugin");
    }
    doctest::Context context(argc, argv);
    return context.run();
}
