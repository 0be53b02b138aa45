// Tests of the host plugin through its C ABI (internals: loads it with detail::PluginLibrary).
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <doctest/doctest.h>

#include <sys/utsname.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace {

using backplane::detail::makeError;
using backplane::detail::PluginLibrary;
using backplane::sdk::makeStruct;

std::shared_ptr<PluginLibrary> loadHost(const std::string &options = "{}") {
    backplane::detail::PluginInitOptions init;
    init.optionsJson = options;
    return PluginLibrary::open(HOST_PLUGIN_PATH, "host", init);
}

// ---- kernels -----------------------------------------------------------------------------------

/// Holds the worker until the test opens it; scalars: a Gate*.
struct Gate {
    std::atomic<bool> open{false};
    ~Gate() { open = true; } // a failing test must not leave a stream blocked forever
};

void gateKernel(const bp_host_kernel_context *context) {
    Gate *gate = nullptr;
    std::memcpy(&gate, context->scalars, sizeof(gate));
    while (!gate->open.load())
        std::this_thread::sleep_for(std::chrono::microseconds(100));
}

/// buffer 0: uint32 values; adds 1 to each element a thread of the grid covers.
void addOneKernel(const bp_host_kernel_context *context) {
    auto *data = static_cast<uint32_t *>(context->buffers[0]);
    const uint64_t count = context->buffer_sizes[0] / sizeof(uint32_t);
    for (uint32_t t = 0; t < context->block[0]; ++t) {
        const uint64_t i = uint64_t{context->workgroup[0]} * context->block[0] + t;
        if (i < count) data[i] += 1;
    }
}

struct Affine {
    uint32_t factor;
    uint32_t offset;
};

/// out[i] = in[i] * factor + offset over one workgroup's block; scalars: Affine.
void affineKernel(const bp_host_kernel_context *context) {
    Affine affine{};
    std::memcpy(&affine, context->scalars, sizeof(affine));
    const auto *in = static_cast<const uint32_t *>(context->buffers[0]);
    auto *out = static_cast<uint32_t *>(context->buffers[1]);
    for (uint32_t t = 0; t < context->block[0]; ++t) {
        const uint64_t i = uint64_t{context->workgroup[0]} * context->block[0] + t;
        out[i] = in[i] * affine.factor + affine.offset;
    }
}

/// Records which workgroups ran, the grid they saw and how many ran at once; scalars: Census*.
struct Census {
    std::atomic<uint32_t> calls{0};
    std::atomic<uint32_t> inFlight{0};
    std::atomic<uint32_t> maxInFlight{0};
    std::atomic<uint32_t> grid[3] = {0, 0, 0};
    std::chrono::microseconds nap{0};
};

/// buffer 0: uint32 per workgroup, set to linear id + 1.
void censusKernel(const bp_host_kernel_context *context) {
    Census *census = nullptr;
    std::memcpy(&census, context->scalars, sizeof(census));
    const uint32_t now = census->inFlight.fetch_add(1) + 1;
    uint32_t seen = census->maxInFlight.load();
    while (now > seen && !census->maxInFlight.compare_exchange_weak(seen, now)) {
    }
    for (int d = 0; d < 3; ++d)
        census->grid[d] = context->grid[d];
    const auto &g = context->grid;
    const auto &w = context->workgroup;
    const uint64_t linear = (uint64_t{w[2]} * g[1] + w[1]) * g[0] + w[0];
    static_cast<uint32_t *>(context->buffers[0])[linear] = static_cast<uint32_t>(linear + 1);
    std::this_thread::sleep_for(census->nap);
    census->inFlight.fetch_sub(1);
    census->calls.fetch_add(1);
}

/// buffer 0: uint32 per workgroup, set to the uint32 that user_data points to; 0 when user_data
/// is NULL, UINT32_MAX when the context is too small to carry it.
void userDataKernel(const bp_host_kernel_context *context) {
    const auto &g = context->grid;
    const auto &w = context->workgroup;
    const uint64_t linear = (uint64_t{w[2]} * g[1] + w[1]) * g[0] + w[0];
    uint32_t seen = UINT32_MAX;
    if (context->struct_size >= offsetof(bp_host_kernel_context, user_data) + sizeof(void *))
        seen = context->user_data ? *static_cast<const uint32_t *>(context->user_data) : 0;
    static_cast<uint32_t *>(context->buffers[0])[linear] = seen;
}

/// Sleeps for the milliseconds in scalars (uint32).
void sleepKernel(const bp_host_kernel_context *context) {
    uint32_t ms = 0;
    std::memcpy(&ms, context->scalars, sizeof(ms));
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
}

// ---- fixture -----------------------------------------------------------------------------------

struct Page {
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    template <class T> T *as() const { return static_cast<T *>(mapped); }
};

void appendToVector(void *user, const void *data, size_t size) {
    auto *out = static_cast<std::vector<unsigned char> *>(user);
    const auto *bytes = static_cast<const unsigned char *>(data);
    out->insert(out->end(), bytes, bytes + size);
}

/// One loaded plugin with one opened device; releases everything it created, in ABI order.
class Session {
public:
    explicit Session(const std::string &options = "{}", uint32_t index = 0)
        : plugin_(loadHost(options)), api(plugin_->api()) {
        device = openDevice(index);
    }
    ~Session() {
        for (bp_event *event : events_)
            api.event_release(device, event);
        for (bp_stream *stream : streams_)
            api.stream_destroy(device, stream);
        for (bp_kernel *kernel : kernels_)
            api.kernel_release(device, kernel);
        for (auto [owner, memory] : memories_)
            api.memory_free(owner, memory);
        for (auto it = devices_.rbegin(); it != devices_.rend(); ++it)
            api.device_close(*it);
    }
    Session(const Session &) = delete;
    Session &operator=(const Session &) = delete;

    /// A fresh error for the next call.
    bp_error *err() {
        error_ = makeError();
        return &error_;
    }
    /// The message of the last failed call.
    std::string message() const { return error_.message; }
    void ok(bp_status status) const { REQUIRE_MESSAGE(status == BP_SUCCESS, error_.message); }

    bp_device *openDevice(uint32_t index) {
        auto args = makeStruct<bp_device_open_args>();
        bp_device *opened = nullptr;
        ok(api.device_open(plugin_->instance(), index, &args, &opened, err()));
        devices_.push_back(opened);
        return opened;
    }

    bp_device_info info(uint32_t index = 0) const { return plugin_->deviceInfo(index); }
    bp_plugin *instance() const { return plugin_->instance(); }

    Page allocate(uint64_t size, bp_memory_kind kind = BP_MEMORY_DEVICE, bp_device *on = nullptr) {
        on = on ? on : device;
        auto args = makeStruct<bp_memory_allocate_args>();
        args.kind = kind;
        args.size = size;
        Page page;
        ok(api.memory_allocate(on, &args, &page.memory, &page.mapped, err()));
        memories_.emplace_back(on, page.memory);
        return page;
    }
    void free(const Page &page) {
        auto it = std::find_if(memories_.begin(), memories_.end(),
                               [&](auto &entry) { return entry.second == page.memory; });
        REQUIRE(it != memories_.end());
        api.memory_free(it->first, it->second);
        memories_.erase(it);
    }

    bp_stream *createStream(bp_device *on = nullptr) {
        auto args = makeStruct<bp_stream_create_args>();
        bp_stream *stream = nullptr;
        ok(api.stream_create(on ? on : device, &args, &stream, err()));
        streams_.push_back(stream);
        return stream;
    }
    void destroyStream(bp_stream *stream) {
        streams_.erase(std::remove(streams_.begin(), streams_.end(), stream), streams_.end());
        api.stream_destroy(device, stream);
    }

    bp_event *flush(bp_stream *stream, bool timing = false, bp_device *on = nullptr) {
        auto args = makeStruct<bp_flush_args>();
        args.flags = timing ? BP_FLUSH_TIMING_EVENT : 0;
        bp_event *event = nullptr;
        ok(api.stream_flush(on ? on : device, stream, &args, &event, err()));
        events_.push_back(event);
        return event;
    }
    void wait(bp_event *event) { ok(api.event_wait(device, event, UINT64_MAX, err())); }
    bp_status query(bp_event *event) { return api.event_query(device, event, err()); }
    /// Flushes and waits: everything recorded on `stream` so far has run.
    void finish(bp_stream *stream) { wait(flush(stream)); }

    /// Compiles and loads a host kernel. `sourceSize` is the bp_host_kernel_source the caller
    /// knows (its struct_size and the source_size): less than sizeof for an older caller.
    bp_kernel *loadKernel(bp_host_kernel_fn function, const char *name,
                          const void *userData = nullptr,
                          size_t sourceSize = sizeof(bp_host_kernel_source)) {
        auto source = makeStruct<bp_host_kernel_source>();
        source.struct_size = sourceSize;
        source.function = function;
        source.user_data = userData;
        std::vector<unsigned char> blob;
        auto compile = makeStruct<bp_kernel_compile_args>();
        compile.dialect = BP_DIALECT_HOST;
        compile.entry_point = name;
        compile.source = &source;
        compile.source_size = sourceSize;
        compile.binary = {&blob, &appendToVector};
        ok(api.kernel_compile(device, &compile, err()));
        auto load = makeStruct<bp_kernel_load_args>();
        load.dialect = BP_DIALECT_HOST;
        load.entry_point = name;
        load.binary = blob.data();
        load.binary_size = blob.size();
        bp_kernel *kernel = nullptr;
        ok(api.kernel_load(device, &load, &kernel, err()));
        kernels_.push_back(kernel);
        return kernel;
    }

    /// A launch of `kernel` on grid (x, 1, 1) with block (block, 1, 1); callers adjust the rest.
    static bp_launch_args launchArgs(bp_kernel *kernel, uint32_t x, uint32_t block = 1) {
        auto args = makeStruct<bp_launch_args>();
        args.kernel = kernel;
        args.grid[0] = x;
        args.grid[1] = args.grid[2] = 1;
        args.block[0] = block;
        args.block[1] = args.block[2] = 1;
        return args;
    }
    bp_status launch(bp_stream *stream, const bp_launch_args &args) {
        return api.kernel_launch(device, stream, &args, err());
    }
    /// Records a gate kernel: the stream stalls there until gate.open is set.
    void launchGate(bp_stream *stream, Gate &gate) {
        bp_kernel *kernel = loadKernel(&gateKernel, "gate");
        auto args = launchArgs(kernel, 1);
        Gate *pointer = &gate;
        args.scalars = &pointer;
        args.scalar_size = sizeof(pointer);
        ok(launch(stream, args));
    }

    void write(bp_stream *stream, const Page &page, const void *data, uint64_t size,
               uint64_t offset = 0) {
        auto args = makeStruct<bp_copy_host_to_device_args>();
        args.src = data;
        args.dst = page.memory;
        args.dst_offset = offset;
        args.size = size;
        ok(api.copy_host_to_device(device, stream, &args, err()));
    }
    void read(bp_stream *stream, const Page &page, void *data, uint64_t size) {
        auto args = makeStruct<bp_copy_device_to_host_args>();
        args.src = page.memory;
        args.dst = data;
        args.size = size;
        ok(api.copy_device_to_host(device, stream, &args, err()));
    }
    bp_status fill(bp_stream *stream, const Page &page, uint32_t pattern, uint64_t size,
                   uint64_t offset = 0) {
        auto args = makeStruct<bp_fill_args>();
        args.dst = page.memory;
        args.offset = offset;
        args.size = size;
        args.pattern = pattern;
        return api.fill(device, stream, &args, err());
    }
    bp_status copy(bp_stream *stream, const Page &src, const Page &dst, uint64_t size,
                   uint64_t srcOffset = 0, uint64_t dstOffset = 0) {
        auto args = makeStruct<bp_copy_device_to_device_args>();
        args.src = src.memory;
        args.src_offset = srcOffset;
        args.dst = dst.memory;
        args.dst_offset = dstOffset;
        args.size = size;
        return api.copy_device_to_device(device, stream, &args, err());
    }

private:
    std::shared_ptr<PluginLibrary> plugin_;

public:
    const bp_plugin_api &api;
    bp_device *device = nullptr;

private:
    bp_error error_ = makeError();
    std::vector<bp_device *> devices_;
    std::vector<std::pair<bp_device *, bp_memory *>> memories_;
    std::vector<bp_stream *> streams_;
    std::vector<bp_event *> events_;
    std::vector<bp_kernel *> kernels_;
};

bool contains(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

/// Sleeps long enough for a worker that is not blocked to have run what was queued.
void letWorkersRun() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

} // namespace

// ---- probe and device info ---------------------------------------------------------------------

TEST_CASE("probe reports one host device and device_info describes the CPU") {
    auto plugin = loadHost();
    CHECK(plugin->name() == "host");
    CHECK(plugin->probe().device_count == 1);

    const bp_device_info info = plugin->deviceInfo(0);
    CHECK(info.type == BP_DEVICE_TYPE_CPU);
    CHECK(std::string(info.vendor) == "backplane");
    CHECK(std::string(info.name) != "");
    utsname names{};
    REQUIRE(uname(&names) == 0);
    CHECK(std::string(info.arch) == names.machine);
    CHECK(info.has_uuid == 1);
    CHECK(info.memory_bytes > 0);
    CHECK(info.max_block_threads == 1024);
    CHECK(info.max_grid_size[0] == 0x7fffffffu);
    CHECK(info.max_streams == 16);
    CHECK(info.max_bindings == 64);
    CHECK(info.max_scalar_bytes == 4096);
    CHECK(info.binding_alignment >= 1);
    // Host functions always; C++ (ABI 1.5) where the plugin found a compiler, whose blobs are
    // then portable (shared objects): kernel_compiler names the compiler, or says why not.
    const bool compiles = (info.dialects & (1u << BP_DIALECT_CPP)) != 0;
    CHECK((info.dialects & ~(1u << BP_DIALECT_CPP)) == (1u << BP_DIALECT_HOST));
    CHECK(std::string(info.kernel_compiler) != "");
    for (uint32_t capability :
         {BP_CAPABILITY_ASYNC_STREAMS, BP_CAPABILITY_TIMESTAMPS, BP_CAPABILITY_PEER_COPY,
          BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY, BP_CAPABILITY_INDIRECT_DISPATCH})
        CHECK((info.capabilities & capability) != 0);
    CHECK(((info.capabilities & BP_CAPABILITY_PORTABLE_BINARIES) != 0) == compiles);
}

namespace {
constexpr uint32_t typeBit(bp_element_type t) { return 1u << t; }
constexpr uint32_t kAllTypes = (1u << (BP_ELEMENT_F64 + 1)) - 1;
constexpr uint32_t kWide = typeBit(BP_ELEMENT_I64) | typeBit(BP_ELEMENT_U64) |
                           typeBit(BP_ELEMENT_F64);
constexpr uint32_t kInts32 = typeBit(BP_ELEMENT_I32) | typeBit(BP_ELEMENT_U32);
} // namespace

TEST_CASE("device_info reports the kernel features the host's kernel path has") {
    auto plugin = loadHost();
    const bp_device_info info = plugin->deviceInfo(0);
    REQUIRE(info.struct_size >= offsetof(bp_device_info, matrix_shapes) +
                                    sizeof(info.matrix_shapes));
    CHECK(info.element_storage == kAllTypes);
    // 64-bit types are stored but not computed: the interpreter has 32-bit registers.
    CHECK(info.element_arithmetic == (kAllTypes & ~kWide));
    CHECK(info.element_atomic_add == (kInts32 | typeBit(BP_ELEMENT_F32)));
    CHECK(info.element_atomic_bits == kInts32);
    CHECK(info.vector_widths == ((1u << 2) | (1u << 4) | (1u << 8)));
    // The interpreter is the matrix units' reference: the language's two tiles, every input.
    CHECK(info.matrix_shape_count == 3);

    using backplane::ElementType;
    const auto features = backplane::detail::toDeviceInfo("host", 0, info).features;
    CHECK(features.stores(ElementType::F64));
    CHECK_FALSE(features.computes(ElementType::F64));
    CHECK(features.computes(ElementType::BF16));
    CHECK(features.addsAtomically(ElementType::F32));
    CHECK_FALSE(features.atomicBitsOn(ElementType::F32));
    CHECK(features.describe() == "types bool i8..u64 f16 bf16 f32 f64; native bool i8..u32 f16 "
                                 "bf16 f32; atomic add i32 u32 f32; atomic bits i32 u32; vectors "
                                 "2 4 8; matrix 16x16x16 f16*f16+f32, 16x16x16 bf16*bf16+f32, "
                                 "16x16x8 f32*f32+f32");
}

TEST_CASE("the disable_types option clears types from every kernel-feature mask") {
    auto plugin = loadHost(R"({"disable_types": ["f64", "f16"], "devices": 2})");
    const uint32_t gone = typeBit(BP_ELEMENT_F64) | typeBit(BP_ELEMENT_F16);
    for (uint32_t index = 0; index < 2; ++index) {
        CAPTURE(index);
        const bp_device_info info = plugin->deviceInfo(index);
        CHECK(info.element_storage == (kAllTypes & ~gone));
        CHECK(info.element_arithmetic == (kAllTypes & ~kWide & ~gone));
        CHECK(info.element_atomic_add == (kInts32 | typeBit(BP_ELEMENT_F32)));
        CHECK(info.element_atomic_bits == kInts32);
        const auto features = backplane::detail::toDeviceInfo("host", index, info).features;
        CHECK_FALSE(features.stores(backplane::ElementType::F64));
        CHECK_FALSE(features.stores(backplane::ElementType::F16));
        CHECK(features.stores(backplane::ElementType::BF16));
    }
    // A smaller device still: no 8-, 16- or 64-bit integers, no bf16.
    const bp_device_info small =
        loadHost(R"({"disable_types": ["i8", "u8", "i16", "u16", "i64", "u64", "bf16"]})")
            ->deviceInfo(0);
    CHECK(small.element_storage == (typeBit(BP_ELEMENT_BOOL) | kInts32 | typeBit(BP_ELEMENT_F16) |
                                    typeBit(BP_ELEMENT_F32) | typeBit(BP_ELEMENT_F64)));
}

TEST_CASE("matrix shapes follow disable_types, and matrix_units: false removes them all") {
    // Without f16 the f16 shape goes; bf16 and tf32 (f32 inputs) stay.
    const bp_device_info noHalf = loadHost(R"({"disable_types": ["f16"]})")->deviceInfo(0);
    REQUIRE(noHalf.matrix_shape_count == 2);
    CHECK(noHalf.matrix_shapes[0].a == BP_ELEMENT_BF16);
    CHECK(noHalf.matrix_shapes[1].a == BP_ELEMENT_F32);
    CHECK(noHalf.matrix_shapes[1].k == 8);
    const bp_device_info none = loadHost(R"({"matrix_units": false})")->deviceInfo(0);
    CHECK(none.matrix_shape_count == 0);
    CHECK(none.element_storage == kAllTypes); // nothing else changes
}

TEST_CASE("the devices option exposes identical devices with distinct, stable UUIDs") {
    std::vector<std::vector<uint8_t>> first;
    for (int load = 0; load < 2; ++load) {
        auto plugin = loadHost(R"({"devices": 3})");
        REQUIRE(plugin->probe().device_count == 3);
        std::vector<std::vector<uint8_t>> uuids;
        for (uint32_t i = 0; i < 3; ++i) {
            const bp_device_info info = plugin->deviceInfo(i);
            CHECK(std::string(info.name) == plugin->deviceInfo(0).name);
            uuids.emplace_back(std::begin(info.uuid), std::end(info.uuid));
        }
        CHECK(std::set(uuids.begin(), uuids.end()).size() == 3);
        if (load == 0)
            first = uuids;
        else
            CHECK(uuids == first);

        bp_device_info info{};
        info.struct_size = sizeof(info);
        bp_error error = makeError();
        CHECK(plugin->api().device_info(plugin->instance(), 3, &info, &error) ==
              BP_ERROR_NOT_FOUND);
    }
}

TEST_CASE("invalid options fail plugin_init with a message naming the key") {
    auto plugin = loadHost();
    const bp_plugin_api &api = plugin->api();
    const std::pair<const char *, const char *> cases[] = {
        {R"({"devices": 0})", "devices"},
        {R"({"devices": "two"})", "devices"},
        {R"({"mode": "fast"})", "mode"},
        {R"({"workers": -1})", "workers"},
        {R"({"memory_bytes": 0})", "memory_bytes"},
        {R"({"bogus": 1})", "bogus"},
        {R"({"disable_types": ["f65"]})", R"("disable_types" names an unknown type "f65")"},
        {R"({"disable_types": "f64"})", R"("disable_types" must be an array)"},
        {R"({"matrix_units": 1})", R"("matrix_units" must be true or false)"},
        {R"({"disable_types": [64]})", R"("disable_types" names an unknown type 64)"},
        {R"({"disable_types": ["f32"]})", R"("disable_types" cannot disable "f32")"},
        {R"({"devices": 1)", "JSON"},
        {"[1, 2]", "object"},
    };
    for (const auto &[options, key] : cases) {
        CAPTURE(options);
        auto args = makeStruct<bp_plugin_init_args>();
        args.host_abi_major = BP_ABI_VERSION_MAJOR;
        args.host_abi_minor = BP_ABI_VERSION_MINOR;
        args.options_json = options;
        bp_plugin *instance = nullptr;
        bp_error error = makeError();
        CHECK(api.plugin_init(&args, &instance, &error) == BP_ERROR_INVALID_ARGUMENT);
        CHECK(instance == nullptr);
        CHECK_MESSAGE(contains(error.message, key), error.message);
    }
    CHECK_THROWS_AS(loadHost(R"({"mode": 1})"), backplane::detail::PluginLoadError);
}

TEST_CASE("a second open of a device is an independent client sharing the memory budget") {
    Session session(R"({"memory_bytes": 1048576})");
    bp_device *second = session.openDevice(0);
    REQUIRE(second != nullptr);
    CHECK(second != session.device);
    // Memory of each open works on its own; the budget is the device's.
    const Page mine = session.allocate(600 * 1024);
    auto args = makeStruct<bp_memory_allocate_args>();
    args.kind = BP_MEMORY_DEVICE;
    args.size = 600 * 1024;
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    CHECK(session.api.memory_allocate(second, &args, &memory, &mapped, session.err()) ==
          BP_ERROR_OUT_OF_MEMORY);
    session.free(mine);
    const Page theirs = session.allocate(600 * 1024, BP_MEMORY_DEVICE, second);
    CHECK(theirs.mapped != nullptr);
    auto none = makeStruct<bp_device_open_args>();
    bp_device *missing = nullptr;
    CHECK(session.api.device_open(session.instance(), 1, &none, &missing, session.err()) ==
          BP_ERROR_NOT_FOUND);
}

// ---- storage -----------------------------------------------------------------------------------

TEST_CASE("memory of every kind is aligned, mapped host memory") {
    Session session;
    for (bp_memory_kind kind : {BP_MEMORY_DEVICE, BP_MEMORY_PINNED_HOST, BP_MEMORY_HOST_VISIBLE}) {
        CAPTURE(kind);
        const Page page = session.allocate(1000, kind);
        REQUIRE(page.mapped != nullptr);
        CHECK(reinterpret_cast<uintptr_t>(page.mapped) % 256 == 0);
        std::memset(page.mapped, 0xab, 1000);
        void *mapped = nullptr;
        session.ok(session.api.memory_map(session.device, page.memory, &mapped, session.err()));
        CHECK(mapped == page.mapped);
        uint64_t native = 0;
        session.ok(session.api.native_handle(session.device, BP_NATIVE_MEMORY, page.memory, &native,
                                             session.err()));
        CHECK(native == reinterpret_cast<uint64_t>(page.mapped));
        session.free(page);
    }
}

TEST_CASE("allocations beyond the memory_bytes option fail with out of memory") {
    Session session(R"({"memory_bytes": 4096})");
    CHECK(session.info().memory_bytes == 4096);
    const Page first = session.allocate(3000);

    auto args = makeStruct<bp_memory_allocate_args>();
    args.kind = BP_MEMORY_DEVICE;
    args.size = 2000;
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    CHECK(session.api.memory_allocate(session.device, &args, &memory, &mapped, session.err()) ==
          BP_ERROR_OUT_OF_MEMORY);
    CHECK(contains(session.message(), "memory_bytes"));

    session.free(first); // the budget comes back
    session.allocate(2000);
    session.allocate(2000);
}

// ---- streams and events ------------------------------------------------------------------------

TEST_CASE("a stream runs many operations in order") {
    Session session;
    bp_stream *stream = session.createStream();
    bp_kernel *addOne = session.loadKernel(&addOneKernel, "add_one");
    constexpr uint32_t kCount = 1000;
    const Page a = session.allocate(kCount * 4);
    const Page b = session.allocate(kCount * 4);

    std::vector<uint32_t> start(kCount);
    for (uint32_t i = 0; i < kCount; ++i)
        start[i] = i;
    session.write(stream, a, start.data(), kCount * 4);
    for (int round = 0; round < 50; ++round) {
        bp_binding binding{round % 2 == 0 ? a.memory : b.memory, 0, kCount * 4};
        auto args = Session::launchArgs(addOne, (kCount + 63) / 64, 64);
        args.bindings = &binding;
        args.binding_count = 1;
        session.ok(session.launch(stream, args));
        session.ok(round % 2 == 0 ? session.copy(stream, a, b, kCount * 4)
                                  : session.copy(stream, b, a, kCount * 4));
    }
    std::vector<uint32_t> result(kCount);
    session.read(stream, a, result.data(), kCount * 4);
    session.finish(stream);
    for (uint32_t i = 0; i < kCount; ++i)
        REQUIRE(result[i] == i + 50);

    session.ok(session.fill(stream, a, 7, kCount * 4));
    session.ok(session.fill(stream, a, 9, 8, 16)); // elements 4 and 5
    session.read(stream, a, result.data(), kCount * 4);
    session.finish(stream);
    CHECK(result[3] == 7);
    CHECK(result[4] == 9);
    CHECK(result[5] == 9);
    CHECK(result[6] == 7);
}

TEST_CASE("pending work is observable until a kernel's flag is set") {
    Session session;
    bp_stream *stream = session.createStream();
    Gate gate;
    session.launchGate(stream, gate);
    bp_event *event = session.flush(stream);

    letWorkersRun();
    CHECK(session.query(event) == BP_ERROR_NOT_READY);
    const auto before = std::chrono::steady_clock::now();
    CHECK(session.api.event_wait(session.device, event, 20'000'000, session.err()) ==
          BP_ERROR_TIMEOUT);
    CHECK(std::chrono::steady_clock::now() - before >= std::chrono::milliseconds(20));
    CHECK(session.query(event) == BP_ERROR_NOT_READY);

    gate.open = true;
    session.wait(event);
    CHECK(session.query(event) == BP_SUCCESS);
}

TEST_CASE("a host wait blocks until the work is done") {
    Session session;
    bp_stream *stream = session.createStream();
    Gate gate;
    session.launchGate(stream, gate);
    bp_event *event = session.flush(stream);
    std::thread opener([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(30));
        gate.open = true;
    });
    const auto before = std::chrono::steady_clock::now();
    session.wait(event);
    CHECK(std::chrono::steady_clock::now() - before >= std::chrono::milliseconds(25));
    CHECK(gate.open.load());
    opener.join();
}

TEST_CASE("a stream that waits on another stream's event runs only after that event") {
    Session session;
    bp_stream *producer = session.createStream();
    bp_stream *consumer = session.createStream();
    const Page source = session.allocate(256);
    const Page target = session.allocate(256);
    std::memset(target.mapped, 0, 256);

    Gate gate;
    session.launchGate(producer, gate);
    session.ok(session.fill(producer, source, 0x01010101, 256));
    bp_event *produced = session.flush(producer);

    session.ok(session.api.stream_wait_event(session.device, consumer, produced, session.err()));
    session.ok(session.copy(consumer, source, target, 256));
    bp_event *consumed = session.flush(consumer);

    letWorkersRun();
    CHECK(session.query(consumed) == BP_ERROR_NOT_READY);
    CHECK(target.as<uint8_t>()[0] == 0);
    CHECK(target.as<uint8_t>()[255] == 0);

    gate.open = true;
    session.wait(consumed);
    CHECK(session.query(produced) == BP_SUCCESS);
    CHECK(target.as<uint8_t>()[0] == 1);
    CHECK(target.as<uint8_t>()[255] == 1);
}

TEST_CASE("events stay valid after their stream is destroyed") {
    Session session;
    bp_stream *stream = session.createStream();
    const Page page = session.allocate(64);
    session.ok(session.fill(stream, page, 5, 64));
    bp_event *event = session.flush(stream);
    session.destroyStream(stream); // drains
    CHECK(session.query(event) == BP_SUCCESS);
    CHECK(page.as<uint32_t>()[15] == 5);
}

TEST_CASE("timing events measure the time of the work between them") {
    Session session;
    bp_stream *stream = session.createStream();
    bp_kernel *sleeper = session.loadKernel(&sleepKernel, "sleep");
    bp_event *start = session.flush(stream, true);
    const uint32_t ms = 20;
    auto args = Session::launchArgs(sleeper, 1);
    args.scalars = &ms;
    args.scalar_size = sizeof(ms);
    session.ok(session.launch(stream, args));
    bp_event *end = session.flush(stream, true);
    bp_event *plain = session.flush(stream);
    session.wait(end);

    uint64_t elapsed = 0;
    session.ok(session.api.event_elapsed_ns(session.device, start, end, &elapsed, session.err()));
    CHECK(elapsed >= 20'000'000u);
    CHECK(elapsed < 5'000'000'000u);
    CHECK(session.api.event_elapsed_ns(session.device, start, plain, &elapsed, session.err()) ==
          BP_ERROR_INVALID_ARGUMENT);
    CHECK(contains(session.message(), "BP_FLUSH_TIMING_EVENT"));
}

TEST_CASE("event_elapsed_ns on a pending event is not ready") {
    Session session;
    bp_stream *stream = session.createStream();
    Gate gate;
    bp_event *start = session.flush(stream, true);
    session.launchGate(stream, gate);
    bp_event *end = session.flush(stream, true);
    uint64_t elapsed = 0;
    CHECK(session.api.event_elapsed_ns(session.device, start, end, &elapsed, session.err()) ==
          BP_ERROR_NOT_READY);
    gate.open = true;
    session.wait(end);
}

// ---- kernels -----------------------------------------------------------------------------------

TEST_CASE("compile produces the host source as a blob and logs that it is process-local") {
    Session session;
    auto source = makeStruct<bp_host_kernel_source>();
    source.function = &addOneKernel;
    std::vector<unsigned char> blob;
    std::vector<unsigned char> log;
    auto args = makeStruct<bp_kernel_compile_args>();
    args.dialect = BP_DIALECT_HOST;
    args.entry_point = "add_one";
    args.source = &source;
    args.source_size = sizeof(source);
    args.binary = {&blob, &appendToVector};
    args.log = {&log, &appendToVector};
    session.ok(session.api.kernel_compile(session.device, &args, session.err()));
    REQUIRE(blob.size() == sizeof(bp_host_kernel_source));
    bp_host_kernel_source back{};
    std::memcpy(&back, blob.data(), sizeof(back));
    CHECK((back.function == &addOneKernel));
    CHECK(contains(std::string(log.begin(), log.end()), "this process only"));
}

TEST_CASE("compiling a non-host dialect is a clear unsupported error") {
    Session session;
    const char glsl[] = "#version 450\nvoid main() {}\n";
    auto args = makeStruct<bp_kernel_compile_args>();
    args.dialect = BP_DIALECT_GLSL;
    args.entry_point = "main";
    args.source = glsl;
    args.source_size = sizeof(glsl) - 1;
    CHECK(session.api.kernel_compile(session.device, &args, session.err()) == BP_ERROR_UNSUPPORTED);
    CHECK(contains(session.message(), "glsl"));
    CHECK(contains(session.message(), "host"));

    auto load = makeStruct<bp_kernel_load_args>();
    load.dialect = BP_DIALECT_SPIRV;
    load.binary = glsl;
    load.binary_size = 16;
    bp_kernel *kernel = nullptr;
    CHECK(session.api.kernel_load(session.device, &load, &kernel, session.err()) ==
          BP_ERROR_UNSUPPORTED);
    CHECK(contains(session.message(), "spirv"));
}

TEST_CASE("scalars are copied when the launch is recorded") {
    Session session;
    bp_stream *stream = session.createStream();
    bp_kernel *affine = session.loadKernel(&affineKernel, "affine");
    const Page in = session.allocate(64 * 4);
    const Page out = session.allocate(64 * 4);
    for (uint32_t i = 0; i < 64; ++i)
        in.as<uint32_t>()[i] = i;

    Gate gate;
    session.launchGate(stream, gate);
    Affine scalars{3, 5};
    bp_binding bindings[2] = {{in.memory, 0, 64 * 4}, {out.memory, 0, 64 * 4}};
    auto args = Session::launchArgs(affine, 4, 16);
    args.bindings = bindings;
    args.binding_count = 2;
    args.scalars = &scalars;
    args.scalar_size = sizeof(scalars);
    session.ok(session.launch(stream, args));
    scalars = {100, 100}; // too late: the launch already holds its copy
    gate.open = true;
    session.finish(stream);
    for (uint32_t i = 0; i < 64; ++i)
        REQUIRE(out.as<uint32_t>()[i] == i * 3 + 5);
}

TEST_CASE("bindings see their offset and size") {
    Session session;
    bp_stream *stream = session.createStream();
    bp_kernel *addOne = session.loadKernel(&addOneKernel, "add_one");
    const Page page = session.allocate(1024);
    std::memset(page.mapped, 0, 1024);
    const uint32_t alignment = session.info().binding_alignment;
    bp_binding binding{page.memory, alignment, 16}; // four elements starting at `alignment`
    auto args = Session::launchArgs(addOne, 1, 64);
    args.bindings = &binding;
    args.binding_count = 1;
    session.ok(session.launch(stream, args));
    session.finish(stream);
    const auto *words = page.as<uint32_t>();
    const uint32_t first = alignment / 4;
    CHECK(words[first - 1] == 0);
    CHECK(words[first] == 1);
    CHECK(words[first + 3] == 1);
    CHECK(words[first + 4] == 0);
}

TEST_CASE("every workgroup runs once, in parallel over the workers") {
    for (uint32_t workers : {1u, 4u}) {
        CAPTURE(workers);
        Session session(R"({"workers": )" + std::to_string(workers) + "}");
        bp_stream *stream = session.createStream();
        bp_kernel *census = session.loadKernel(&censusKernel, "census");
        const uint32_t grid[3] = {5, 3, 2};
        const Page out = session.allocate(30 * 4);
        std::memset(out.mapped, 0, 30 * 4);
        Census state;
        state.nap = std::chrono::milliseconds(2);
        Census *pointer = &state;
        bp_binding binding{out.memory, 0, 30 * 4};
        auto args = Session::launchArgs(census, grid[0]);
        args.grid[1] = grid[1];
        args.grid[2] = grid[2];
        args.bindings = &binding;
        args.binding_count = 1;
        args.scalars = &pointer;
        args.scalar_size = sizeof(pointer);
        session.ok(session.launch(stream, args));
        session.finish(stream);

        CHECK(state.calls == 30);
        for (uint32_t i = 0; i < 30; ++i)
            REQUIRE(out.as<uint32_t>()[i] == i + 1);
        if (workers == 1)
            CHECK(state.maxInFlight == 1);
        else
            CHECK(state.maxInFlight > 1);
    }
}

TEST_CASE("user_data reaches every workgroup call, through compile and load") {
    for (const std::string options : {R"({"workers": 4})", R"({"mode": "sync"})"}) {
        CAPTURE(options);
        Session session(options);
        bp_stream *stream = session.createStream();
        // One function, two kernels: only their user_data tells them apart.
        const uint32_t tags[2] = {11, 22};
        bp_kernel *kernels[2] = {session.loadKernel(&userDataKernel, "user_data", &tags[0]),
                                 session.loadKernel(&userDataKernel, "user_data", &tags[1])};
        Page out[2];
        for (int k = 0; k < 2; ++k) {
            out[k] = session.allocate(30 * 4);
            std::memset(out[k].mapped, 0, 30 * 4);
            bp_binding binding{out[k].memory, 0, 30 * 4};
            auto args = Session::launchArgs(kernels[k], 5);
            args.grid[1] = 3;
            args.grid[2] = 2;
            args.bindings = &binding;
            args.binding_count = 1;
            session.ok(session.launch(stream, args));
        }
        session.finish(stream);
        for (int k = 0; k < 2; ++k)
            for (uint32_t i = 0; i < 30; ++i) {
                CAPTURE(k);
                CAPTURE(i);
                REQUIRE(out[k].as<uint32_t>()[i] == tags[k]);
            }
    }
}

TEST_CASE("a kernel compiled from a 1.1-sized bp_host_kernel_source gets user_data NULL") {
    Session session;
    bp_stream *stream = session.createStream();
    // The 1.1 layout ends before user_data: the pointer stored behind it is not the caller's.
    const uint32_t tag = 33;
    bp_kernel *kernel = session.loadKernel(&userDataKernel, "user_data", &tag,
                                           offsetof(bp_host_kernel_source, user_data));
    const Page out = session.allocate(4 * 4);
    std::memset(out.mapped, 0xff, 4 * 4);
    bp_binding binding{out.memory, 0, 4 * 4};
    auto args = Session::launchArgs(kernel, 4);
    args.bindings = &binding;
    args.binding_count = 1;
    session.ok(session.launch(stream, args));
    session.finish(stream);
    for (uint32_t i = 0; i < 4; ++i)
        REQUIRE(out.as<uint32_t>()[i] == 0);
}

TEST_CASE("indirect dispatch reads the grid from memory when the launch runs") {
    Session session;
    bp_stream *stream = session.createStream();
    bp_kernel *census = session.loadKernel(&censusKernel, "census");
    const Page gridPage = session.allocate(64);
    const Page out = session.allocate(64 * 4);
    auto *gridWords = gridPage.as<uint32_t>();
    gridWords[4] = gridWords[5] = gridWords[6] = 1;

    Gate gate;
    session.launchGate(stream, gate);
    Census state;
    Census *pointer = &state;
    bp_binding binding{out.memory, 0, 64 * 4};
    auto args = Session::launchArgs(census, 1);
    args.grid_memory = gridPage.memory;
    args.grid_offset = 16;
    args.bindings = &binding;
    args.binding_count = 1;
    args.scalars = &pointer;
    args.scalar_size = sizeof(pointer);
    session.ok(session.launch(stream, args));
    // Written after recording but before the stream reaches the launch: the launch sees it.
    gridWords[4] = 4;
    gridWords[5] = 3;
    gridWords[6] = 2;
    gate.open = true;
    session.finish(stream);
    CHECK(state.calls == 24);
    CHECK(state.grid[0] == 4);
    CHECK(state.grid[1] == 3);
    CHECK(state.grid[2] == 2);

    SUBCASE("a zero grid launches nothing") {
        gridWords[5] = 0;
        session.ok(session.launch(stream, args));
        session.finish(stream);
        CHECK(state.calls == 24);
    }
    SUBCASE("a grid beyond the limits fails the events after it") {
        gridWords[5] = 70000;
        session.ok(session.launch(stream, args));
        bp_event *event = session.flush(stream);
        CHECK(session.api.event_wait(session.device, event, UINT64_MAX, session.err()) ==
              BP_ERROR_LAUNCH);
        CHECK(contains(session.message(), "census"));
        CHECK(contains(session.message(), "max_grid_size"));
        CHECK(state.calls == 24);
    }
}

// ---- peer copies, native handles ---------------------------------------------------------------

TEST_CASE("copy_peer copies between two host devices") {
    Session session(R"({"devices": 2})");
    bp_device *other = session.openDevice(1);
    const Page source = session.allocate(128, BP_MEMORY_DEVICE, other);
    const Page target = session.allocate(128);
    for (uint32_t i = 0; i < 32; ++i)
        source.as<uint32_t>()[i] = i * 7;
    bp_stream *stream = session.createStream();

    // A plain device-to-device copy refuses memory of another device.
    CHECK(session.copy(stream, source, target, 128) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(contains(session.message(), "copy_peer"));

    auto args = makeStruct<bp_copy_device_to_device_args>();
    args.src = source.memory;
    args.dst = target.memory;
    args.size = 128;
    session.ok(session.api.copy_peer(session.device, stream, other, &args, session.err()));
    session.finish(stream);
    for (uint32_t i = 0; i < 32; ++i)
        REQUIRE(target.as<uint32_t>()[i] == i * 7);
}

TEST_CASE("native handles give the device, the stream and the memory address") {
    Session session;
    bp_stream *stream = session.createStream();
    uint64_t device = 0;
    uint64_t streamHandle = 0;
    session.ok(session.api.native_handle(session.device, BP_NATIVE_DEVICE, nullptr, &device,
                                         session.err()));
    CHECK(device != 0);
    session.ok(session.api.native_handle(session.device, BP_NATIVE_STREAM, stream, &streamHandle,
                                         session.err()));
    CHECK(streamHandle != 0);
    CHECK(session.api.native_handle(session.device, BP_NATIVE_MEMORY, nullptr, &device,
                                    session.err()) == BP_ERROR_INVALID_ARGUMENT);
}

// ---- sync mode ---------------------------------------------------------------------------------

TEST_CASE("sync mode runs every operation inline and flush returns a completed event") {
    Session session(R"({"mode": "sync"})");
    const bp_device_info info = session.info();
    CHECK((info.capabilities & BP_CAPABILITY_ASYNC_STREAMS) == 0);
    CHECK((info.capabilities & BP_CAPABILITY_TIMESTAMPS) != 0);

    bp_stream *stream = session.createStream();
    const Page page = session.allocate(256);
    const uint32_t values[4] = {1, 2, 3, 4};
    session.write(stream, page, values, sizeof(values));
    CHECK(page.as<uint32_t>()[3] == 4); // already done, before any flush

    bp_kernel *addOne = session.loadKernel(&addOneKernel, "add_one");
    bp_binding binding{page.memory, 0, sizeof(values)};
    auto args = Session::launchArgs(addOne, 1, 4);
    args.bindings = &binding;
    args.binding_count = 1;
    bp_event *start = session.flush(stream, true);
    session.ok(session.launch(stream, args));
    CHECK(page.as<uint32_t>()[0] == 2);
    bp_event *end = session.flush(stream, true);
    CHECK(session.query(start) == BP_SUCCESS);
    CHECK(session.query(end) == BP_SUCCESS);
    uint64_t elapsed = 0;
    session.ok(session.api.event_elapsed_ns(session.device, start, end, &elapsed, session.err()));

    // A second stream waiting on a completed event goes straight on.
    bp_stream *other = session.createStream();
    session.ok(session.api.stream_wait_event(session.device, other, end, session.err()));
    session.ok(session.fill(other, page, 0, 16));
    CHECK(page.as<uint32_t>()[0] == 0);

    // Failures of work reach the recording call itself.
    const Page gridPage = session.allocate(16);
    const uint32_t tooLarge[3] = {1, 1, 1u << 20};
    std::memcpy(gridPage.mapped, tooLarge, sizeof(tooLarge));
    args.grid_memory = gridPage.memory;
    CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
    CHECK(session.query(session.flush(stream)) == BP_SUCCESS);
}

// ---- invalid arguments -------------------------------------------------------------------------

TEST_CASE("invalid arguments produce errors, not crashes") {
    Session session(R"({"devices": 2})");
    bp_stream *stream = session.createStream();
    const Page page = session.allocate(256);
    bp_kernel *addOne = session.loadKernel(&addOneKernel, "add_one");
    uint32_t word = 0;

    SUBCASE("allocation") {
        auto args = makeStruct<bp_memory_allocate_args>();
        bp_memory *memory = nullptr;
        void *mapped = nullptr;
        args.size = 0;
        CHECK(session.api.memory_allocate(session.device, &args, &memory, &mapped, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        args.size = 16;
        args.kind = static_cast<bp_memory_kind>(3); // inside the enum's range, not a kind
        CHECK(session.api.memory_allocate(session.device, &args, &memory, &mapped, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        args.kind = BP_MEMORY_DEVICE;
        args.size = UINT64_MAX;
        CHECK(session.api.memory_allocate(session.device, &args, &memory, &mapped, session.err()) ==
              BP_ERROR_OUT_OF_MEMORY);
    }
    SUBCASE("copies out of range") {
        auto args = makeStruct<bp_copy_host_to_device_args>();
        args.src = &word;
        args.dst = page.memory;
        args.dst_offset = 254;
        args.size = 4;
        CHECK(session.api.copy_host_to_device(session.device, stream, &args, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        CHECK(contains(session.message(), "outside its page of 256 bytes"));
        args.dst_offset = UINT64_MAX - 1; // offset + size overflows
        CHECK(session.api.copy_host_to_device(session.device, stream, &args, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        args.dst_offset = 0;
        args.dst = nullptr;
        CHECK(session.api.copy_host_to_device(session.device, stream, &args, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        CHECK(session.copy(stream, page, page, 200, 100, 0) == BP_ERROR_INVALID_ARGUMENT);
        CHECK(session.fill(stream, page, 0, 4, 2) == BP_ERROR_INVALID_ARGUMENT);
        CHECK(contains(session.message(), "multiples of 4"));
        CHECK(session.fill(stream, page, 0, 260) == BP_ERROR_INVALID_ARGUMENT);
        CHECK(session.api.fill(session.device, stream, nullptr, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
    }
    SUBCASE("launches") {
        bp_binding binding{page.memory, 0, 256};
        auto args = Session::launchArgs(addOne, 1, 64);
        args.bindings = &binding;
        args.binding_count = 1;
        args.block[0] = 2048;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        CHECK(contains(session.message(), "add_one"));
        args.block[0] = 64;
        args.block[1] = 64;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        args.block[1] = 0;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        args.block[1] = 1;
        args.grid[1] = 70000;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        args.grid[1] = 1;
        args.binding_count = 65;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        args.binding_count = 1;
        binding.offset = 4; // not a multiple of binding_alignment
        binding.size = 4;
        CHECK(session.launch(stream, args) == BP_ERROR_INVALID_ARGUMENT);
        CHECK(contains(session.message(), "binding_alignment"));
        binding.offset = 0;
        binding.size = 512;
        CHECK(session.launch(stream, args) == BP_ERROR_INVALID_ARGUMENT);
        binding.size = 256;
        args.scalar_size = 5000;
        args.scalars = page.mapped;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        args.scalar_size = 4;
        args.scalars = nullptr;
        CHECK(session.launch(stream, args) == BP_ERROR_INVALID_ARGUMENT);
        args.scalar_size = 0;
        args.shared_memory_bytes = 1024;
        CHECK(session.launch(stream, args) == BP_ERROR_LAUNCH);
        args.shared_memory_bytes = 0;
        args.grid_memory = page.memory;
        args.grid_offset = 250;
        CHECK(session.launch(stream, args) == BP_ERROR_INVALID_ARGUMENT);
        args.grid_memory = nullptr;
        args.kernel = nullptr;
        CHECK(session.launch(stream, args) == BP_ERROR_INVALID_ARGUMENT);
    }
    SUBCASE("kernels") {
        auto source = makeStruct<bp_host_kernel_source>();
        auto args = makeStruct<bp_kernel_compile_args>();
        args.dialect = BP_DIALECT_HOST;
        args.source = &source;
        args.source_size = sizeof(source);
        CHECK(session.api.kernel_compile(session.device, &args, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT); // function is NULL
        source.function = &addOneKernel;
        args.source_size = 3;
        CHECK(session.api.kernel_compile(session.device, &args, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        auto load = makeStruct<bp_kernel_load_args>();
        load.dialect = BP_DIALECT_HOST;
        load.binary = &word;
        load.binary_size = sizeof(word);
        bp_kernel *kernel = nullptr;
        CHECK(session.api.kernel_load(session.device, &load, &kernel, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
    }
    SUBCASE("handles of another device") {
        bp_device *other = session.openDevice(1);
        bp_stream *otherStream = session.createStream(other);
        CHECK(session.fill(otherStream, page, 0, 4) == BP_ERROR_INVALID_ARGUMENT);
        auto args = makeStruct<bp_fill_args>();
        args.dst = page.memory;
        args.size = 4;
        CHECK(session.api.fill(other, otherStream, &args, session.err()) ==
              BP_ERROR_INVALID_ARGUMENT);
        CHECK(contains(session.message(), "not allocated on this host device"));
    }
}
