// CUDA plugin tests on a real GPU, through the C ABI; exits 77 (SKIP) only without a CUDA driver
// or device, and fails on any other setup error.
#define DOCTEST_CONFIG_IMPLEMENT
#include "gpu_test_support.hpp"

#include "../test_skip.hpp"

#include <cuda.h>
#include <dlfcn.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iostream>

using backplane::test::AbiDevice;
using backplane::test::pluginPath;

namespace {

const char *const kKernels = R"(
struct Params { float scale; unsigned n; };
extern "C" __global__ void scale_add(const float *a, float *b, Params p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) b[i] = a[i] * p.scale + 1.0f;
}
extern "C" __global__ void trap_now() { __trap(); }
extern "C" __global__ void split_scalars(float *a, unsigned n) {
    if (threadIdx.x < n) a[threadIdx.x] = 0.0f;
}
)";

struct Params {
    float scale;
    unsigned n;
};

std::shared_ptr<backplane::detail::PluginLibrary> openPlugin() {
    return backplane::detail::PluginLibrary::open(pluginPath(CUDA_PLUGIN_PATH), "cuda", {});
}

std::string selfPath;

// Runs this executable again with `flag`; returns its exit status (-1 if it did not exit).
int runSelf(const std::string &flag) {
    const pid_t pid = fork();
    if (pid == 0) {
        execl("/proc/self/exe", selfPath.c_str(), flag.c_str(), static_cast<char *>(nullptr));
        _exit(127);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    MESSAGE("child " << flag << " exited with " << code);
    return code;
}

// Launches scale_add over n floats (a at offset 256, b at offset 512) and checks the result.
void runScaleAdd(AbiDevice &gpu, bp_kernel *kernel, unsigned n) {
    auto &api = gpu.api();
    bp_stream *s = gpu.stream();
    bp_memory *a = gpu.allocate(256 + n * 4);
    bp_memory *b = gpu.allocate(512 + n * 4);
    std::vector<float> input(n);
    for (unsigned i = 0; i < n; ++i) input[i] = static_cast<float>(i);
    gpu.write(s, a, 256, input.data(), n * 4);
    const Params params{2.0f, n};
    const bp_binding bindings[2] = {{a, 256, n * 4}, {b, 512, n * 4}};
    auto launch = AbiDevice::makeArgs<bp_launch_args>();
    launch.kernel = kernel;
    launch.grid[0] = (n + 127) / 128;
    launch.grid[1] = launch.grid[2] = 1;
    launch.block[0] = 128;
    launch.block[1] = launch.block[2] = 1;
    launch.bindings = bindings;
    launch.binding_count = 2;
    launch.scalars = &params;
    launch.scalar_size = sizeof params;
    gpu.expectOk(api.kernel_launch(gpu.get(), s, &launch, &gpu.error()), "kernel_launch");
    std::vector<float> output(n);
    gpu.read(s, b, 512, output.data(), n * 4);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    for (unsigned i = 0; i < n; ++i) REQUIRE(output[i] == input[i] * 2.0f + 1.0f);
    api.memory_free(gpu.get(), a);
    api.memory_free(gpu.get(), b);
    api.stream_destroy(gpu.get(), s);
}

std::vector<char> compileKernels(AbiDevice &gpu) {
    std::vector<char> binary;
    std::string log;
    gpu.expectOk(gpu.compile(kKernels, "scale_add", binary, log), "kernel_compile");
    return binary;
}

// Child mode: load a CUBIN from a file (no compile in this process) and run it.
int childLoadBlob(const std::string &file) {
    std::ifstream in(file, std::ios::binary);
    std::vector<char> blob((std::istreambuf_iterator<char>(in)), {});
    if (blob.empty()) return 2;
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    bp_kernel *k = gpu.load(blob, "scale_add");
    runScaleAdd(gpu, k, 1000);
    gpu.api().kernel_release(gpu.get(), k);
    return 0;
}

// Child mode: trap in a kernel; the wait reports DEVICE_LOST, later calls fail fast.
int childTrap() {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    auto blob = compileKernels(gpu);
    bp_kernel *k = gpu.load(blob, "trap_now");
    bp_stream *s = gpu.stream();
    auto launch = AbiDevice::makeArgs<bp_launch_args>();
    launch.kernel = k;
    launch.grid[0] = launch.grid[1] = launch.grid[2] = 1;
    launch.block[0] = launch.block[1] = launch.block[2] = 1;
    if (api.kernel_launch(gpu.get(), s, &launch, &gpu.error()) != BP_SUCCESS) return 3;
    const bp_status waited = gpu.finish(s);
    std::printf("trap wait: %d %s\n", waited, gpu.error().message);
    if (waited != BP_ERROR_DEVICE_LOST) return 4;
    auto args = AbiDevice::makeArgs<bp_memory_allocate_args>();
    args.size = 1024;
    bp_memory *m = nullptr;
    void *mapped = nullptr;
    const bp_status later = api.memory_allocate(gpu.get(), &args, &m, &mapped, &gpu.error());
    std::printf("later call: %d %s\n", later, gpu.error().message);
    if (later != BP_ERROR_DEVICE_LOST || std::strstr(gpu.error().message, "is lost since") == nullptr)
        return 5;
    // Release what we hold; these must not crash on a lost device.
    api.stream_destroy(gpu.get(), s);
    api.kernel_release(gpu.get(), k);
    return 0;
}

// The driver's own answer, for every ordered pair of ordinals, to "can device a read device b's
// memory" (cuDeviceCanAccessPeer through libcuda.so.1, bypassing the plugin).
std::vector<std::vector<bool>> driverPeerAccess(uint32_t count) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(cuda != nullptr);
    const auto init = reinterpret_cast<decltype(&cuInit)>(dlsym(cuda, "cuInit"));
    const auto deviceGet = reinterpret_cast<decltype(&cuDeviceGet)>(dlsym(cuda, "cuDeviceGet"));
    const auto canAccessPeer = reinterpret_cast<decltype(&cuDeviceCanAccessPeer)>(
        dlsym(cuda, "cuDeviceCanAccessPeer"));
    REQUIRE((init != nullptr && deviceGet != nullptr && canAccessPeer != nullptr));
    REQUIRE(init(0) == CUDA_SUCCESS);
    std::vector<CUdevice> devices(count);
    for (uint32_t i = 0; i < count; ++i)
        REQUIRE(deviceGet(&devices[i], static_cast<int>(i)) == CUDA_SUCCESS);
    std::vector<std::vector<bool>> access(count, std::vector<bool>(count, false));
    for (uint32_t a = 0; a < count; ++a)
        for (uint32_t b = 0; b < count; ++b) {
            int can = 0;
            if (a != b) REQUIRE(canAccessPeer(&can, devices[a], devices[b]) == CUDA_SUCCESS);
            access[a][b] = can != 0;
        }
    dlclose(cuda);
    return access;
}

// Copies a pattern that exists only on `from` into `to` with copy_peer (on a stream of `to`, at
// offsets in both buffers) and reads it back from `to`: the copied range holds the pattern and
// the bytes around it keep their sentinel.
void checkPeerCopy(AbiDevice &from, AbiDevice &to) {
    constexpr uint32_t kWords = 16384;
    constexpr uint64_t kBytes = kWords * 4, kSrcOffset = 4096, kDstOffset = 8192, kSize = 32768;
    std::vector<uint32_t> pattern(kWords);
    for (uint32_t i = 0; i < kWords; ++i) pattern[i] = (i * 2654435761u) ^ 0x5bd1e995u;
    const std::vector<uint32_t> sentinel(kWords, 0xdeadbeefu);
    bp_stream *sFrom = from.stream();
    bp_stream *sTo = to.stream();
    bp_memory *src = from.allocate(kBytes);
    bp_memory *dst = to.allocate(kBytes);
    from.write(sFrom, src, 0, pattern.data(), kBytes);
    REQUIRE(from.finish(sFrom) == BP_SUCCESS);
    to.write(sTo, dst, 0, sentinel.data(), kBytes);
    auto copy = AbiDevice::makeArgs<bp_copy_device_to_device_args>();
    copy.src = src;
    copy.src_offset = kSrcOffset;
    copy.dst = dst;
    copy.dst_offset = kDstOffset;
    copy.size = kSize;
    to.expectOk(to.api().copy_peer(to.get(), sTo, from.get(), &copy, &to.error()), "copy_peer");
    std::vector<uint32_t> back(kWords);
    to.read(sTo, dst, 0, back.data(), kBytes);
    REQUIRE(to.finish(sTo) == BP_SUCCESS);
    std::vector<uint32_t> expected = sentinel;
    std::copy_n(pattern.begin() + kSrcOffset / 4, kSize / 4, expected.begin() + kDstOffset / 4);
    size_t wrong = 0, first = kWords;
    for (size_t i = 0; i < kWords; ++i)
        if (back[i] != expected[i] && wrong++ == 0) first = i;
    INFO("first wrong word " << first << " of " << kWords);
    CHECK(wrong == 0);
    from.api().memory_free(from.get(), src);
    to.api().memory_free(to.get(), dst);
    from.api().stream_destroy(from.get(), sFrom);
    to.api().stream_destroy(to.get(), sTo);
}

// cuDriverGetVersion through libcuda.so.1, bypassing the plugin (12040 = CUDA 12.4).
int driverVersion() {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    REQUIRE(cuda != nullptr);
    const auto version =
        reinterpret_cast<decltype(&cuDriverGetVersion)>(dlsym(cuda, "cuDriverGetVersion"));
    REQUIRE((version != nullptr));
    int v = 0;
    REQUIRE(version(&v) == CUDA_SUCCESS);
    dlclose(cuda);
    return v;
}

// Launches `kernel` with `bindingCount` bindings and `scalarSize` scalar bytes (one block of
// one thread); returns the status, the message in gpu.error().
bp_status launchWith(AbiDevice &gpu, bp_stream *s, bp_kernel *kernel, bp_memory *buffer,
                     uint32_t bindingCount, size_t scalarSize) {
    const bp_binding bindings[3] = {{buffer, 0, 256}, {buffer, 256, 256}, {buffer, 512, 256}};
    const unsigned char scalars[16] = {};
    auto launch = AbiDevice::makeArgs<bp_launch_args>();
    launch.kernel = kernel;
    launch.grid[0] = launch.grid[1] = launch.grid[2] = 1;
    launch.block[0] = launch.block[1] = launch.block[2] = 1;
    launch.bindings = bindings;
    launch.binding_count = bindingCount;
    launch.scalars = scalars;
    launch.scalar_size = scalarSize;
    return gpu.api().kernel_launch(gpu.get(), s, &launch, &gpu.error());
}

} // namespace

TEST_CASE("device info describes the GPU: arch, UUID, PCI id and limits") {
    auto plugin = openPlugin();
    const bp_device_info info = plugin->deviceInfo(0);
    MESSAGE(info.name << " " << info.arch << " pci " << info.pci_bus_id << " driver "
                      << info.driver_version);
    CHECK(std::string(info.arch).rfind("sm_", 0) == 0);
    CHECK(info.has_uuid == 1);
    CHECK(std::strlen(info.pci_bus_id) >= 12);
    CHECK(info.memory_bytes > (1ull << 30));
    CHECK(info.max_block_threads >= 1024);
    CHECK(info.subgroup_size == 32);
    CHECK(info.binding_alignment == 256);
    CHECK((info.capabilities & BP_CAPABILITY_ASYNC_STREAMS) != 0);
    CHECK((info.capabilities & BP_CAPABILITY_INDIRECT_DISPATCH) == 0);
}

TEST_CASE("allocates, copies host to device, device to device, fills and reads back") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    bp_stream *s = gpu.stream();
    void *pinned = nullptr;
    bp_memory *staging = gpu.allocate(4096, BP_MEMORY_PINNED_HOST, &pinned);
    REQUIRE(pinned != nullptr);
    bp_memory *a = gpu.allocate(1 << 20);
    bp_memory *b = gpu.allocate(1 << 20);
    std::vector<uint32_t> data(1024);
    for (uint32_t i = 0; i < 1024; ++i) data[i] = i * 7;
    gpu.write(s, a, 4096, data.data(), 4096);
    auto copy = AbiDevice::makeArgs<bp_copy_device_to_device_args>();
    copy.src = a;
    copy.src_offset = 4096;
    copy.dst = b;
    copy.dst_offset = 0;
    copy.size = 4096;
    gpu.expectOk(api.copy_device_to_device(gpu.get(), s, &copy, &gpu.error()), "d2d");
    auto fill = AbiDevice::makeArgs<bp_fill_args>();
    fill.dst = b;
    fill.offset = 1024;
    fill.size = 256;
    fill.pattern = 0xdeadbeef;
    gpu.expectOk(api.fill(gpu.get(), s, &fill, &gpu.error()), "fill");
    gpu.read(s, b, 0, pinned, 4096);
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    const auto *out = static_cast<const uint32_t *>(pinned);
    for (uint32_t i = 0; i < 1024; ++i)
        REQUIRE(out[i] == (i >= 256 && i < 320 ? 0xdeadbeefu : i * 7));

    // Out of range is an argument error, not a crash.
    copy.size = 2u << 20;
    CHECK(api.copy_device_to_device(gpu.get(), s, &copy, &gpu.error()) ==
          BP_ERROR_INVALID_ARGUMENT);
    // Too large an allocation is OUT_OF_MEMORY.
    auto huge = AbiDevice::makeArgs<bp_memory_allocate_args>();
    huge.size = 1ull << 50;
    bp_memory *none = nullptr;
    void *mapped = nullptr;
    CHECK(api.memory_allocate(gpu.get(), &huge, &none, &mapped, &gpu.error()) ==
          BP_ERROR_OUT_OF_MEMORY);
    api.memory_free(gpu.get(), a);
    api.memory_free(gpu.get(), b);
    api.memory_free(gpu.get(), staging);
    api.stream_destroy(gpu.get(), s);
}

TEST_CASE("compiles a kernel to a CUBIN and launches it with bindings at offsets and scalars") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto blob = compileKernels(gpu);
    REQUIRE(blob.size() > 4);
    CHECK(blob[0] == 0x7f); // ELF: a CUBIN, not PTX
    bp_kernel *k = gpu.load(blob, "scale_add");
    runScaleAdd(gpu, k, 100000);
    gpu.api().kernel_release(gpu.get(), k);
}

TEST_CASE("a launch that does not match the kernel's parameters is refused naming the kernel") {
    // The plugin asks the driver for the parameter sizes (cuFuncGetParamInfo, CUDA 12.4+).
    // Without the check, cuLaunchKernel copies each parameter's size from the pointers it is
    // given: a missing parameter or a struct larger than the scalars is read from past the
    // caller's arguments.
    const int version = driverVersion();
    if (version < 12040) {
        MESSAGE("driver " << version << " predates cuFuncGetParamInfo: launches are not checked");
        return;
    }
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto blob = compileKernels(gpu);
    bp_kernel *scaleAdd = gpu.load(blob, "scale_add");
    bp_kernel *split = gpu.load(blob, "split_scalars");
    bp_stream *s = gpu.stream();
    bp_memory *buffer = gpu.allocate(1024);
    const auto message = [&] { return std::string(gpu.error().message); };

    // scale_add(const float *, float *, Params): two bindings and 8 scalar bytes.
    CHECK(launchWith(gpu, s, scaleAdd, buffer, 2, 0) == BP_ERROR_INVALID_ARGUMENT);
    MESSAGE(message());
    CHECK(message().find("'scale_add'") != std::string::npos);
    CHECK(message().find("3 parameters of 8, 8 and 8 bytes") != std::string::npos);
    CHECK(message().find("2 bindings and 0 scalar bytes") != std::string::npos);
    CHECK(launchWith(gpu, s, scaleAdd, buffer, 1, 8) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message().find("1 binding and 8 scalar bytes") != std::string::npos);
    CHECK(launchWith(gpu, s, scaleAdd, buffer, 3, 8) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(launchWith(gpu, s, scaleAdd, buffer, 2, 4) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message().find("2 bindings and 4 scalar bytes") != std::string::npos);
    CHECK(launchWith(gpu, s, scaleAdd, buffer, 2, 16) == BP_ERROR_INVALID_ARGUMENT);
    // split_scalars(float *, unsigned): the count matches two bindings, but the second
    // parameter is 4 bytes, not a pointer.
    CHECK(launchWith(gpu, s, split, buffer, 2, 0) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message().find("2 parameters of 8 and 4 bytes") != std::string::npos);
    // The matching launches run; the stream is intact after the refusals.
    gpu.expectOk(launchWith(gpu, s, split, buffer, 1, 4), "kernel_launch split_scalars");
    REQUIRE(gpu.finish(s) == BP_SUCCESS);
    runScaleAdd(gpu, scaleAdd, 1000);
    gpu.api().memory_free(gpu.get(), buffer);
    gpu.api().stream_destroy(gpu.get(), s);
    gpu.api().kernel_release(gpu.get(), split);
    gpu.api().kernel_release(gpu.get(), scaleAdd);
}

TEST_CASE("a compile error reports BP_ERROR_COMPILE with NVRTC's log and the kernel name") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    std::vector<char> binary;
    std::string log;
    const bp_status status =
        gpu.compile("extern \"C\" __global__ void bad_kernel() { nope(); }", "bad_kernel",
                    binary, log);
    CHECK(status == BP_ERROR_COMPILE);
    CHECK(std::string(gpu.error().message).find("'bad_kernel'") != std::string::npos);
    CHECK(log.find("nope") != std::string::npos);
    CHECK(binary.empty());
}

TEST_CASE("a stream waits on another stream's event before it copies") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    bp_stream *producer = gpu.stream();
    bp_stream *consumer = gpu.stream();
    const uint64_t size = 64u << 20;
    bp_memory *a = gpu.allocate(size);
    bp_memory *b = gpu.allocate(size);
    auto fill = AbiDevice::makeArgs<bp_fill_args>();
    fill.dst = a;
    fill.size = size;
    fill.pattern = 0x12345678;
    gpu.expectOk(api.fill(gpu.get(), producer, &fill, &gpu.error()), "fill");
    bp_event *filled = gpu.flush(producer);
    gpu.expectOk(api.stream_wait_event(gpu.get(), consumer, filled, &gpu.error()), "wait");
    auto copy = AbiDevice::makeArgs<bp_copy_device_to_device_args>();
    copy.src = a;
    copy.dst = b;
    copy.size = size;
    gpu.expectOk(api.copy_device_to_device(gpu.get(), consumer, &copy, &gpu.error()), "d2d");
    std::vector<uint32_t> tail(1024);
    gpu.read(consumer, b, size - 4096, tail.data(), 4096);
    REQUIRE(gpu.finish(consumer) == BP_SUCCESS);
    for (uint32_t v : tail) REQUIRE(v == 0x12345678u);
    CHECK(api.event_query(gpu.get(), filled, &gpu.error()) == BP_SUCCESS);
    api.event_release(gpu.get(), filled);
    api.memory_free(gpu.get(), a);
    api.memory_free(gpu.get(), b);
    api.stream_destroy(gpu.get(), producer);
    api.stream_destroy(gpu.get(), consumer);
}

TEST_CASE("timing events measure device time; a short host wait times out on pending work") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto &api = gpu.api();
    bp_stream *s = gpu.stream();
    const uint64_t size = 256u << 20;
    bp_memory *a = gpu.allocate(size);
    bp_event *start = gpu.flush(s, BP_FLUSH_TIMING_EVENT);
    auto fill = AbiDevice::makeArgs<bp_fill_args>();
    fill.dst = a;
    fill.size = size;
    for (int i = 0; i < 20; ++i)
        gpu.expectOk(api.fill(gpu.get(), s, &fill, &gpu.error()), "fill");
    bp_event *end = gpu.flush(s, BP_FLUSH_TIMING_EVENT);
    const bp_status early = api.event_wait(gpu.get(), end, 1000, &gpu.error());
    CHECK((early == BP_ERROR_TIMEOUT || early == BP_SUCCESS));
    gpu.expectOk(api.event_wait(gpu.get(), end, UINT64_MAX, &gpu.error()), "event_wait");
    uint64_t ns = 0;
    gpu.expectOk(api.event_elapsed_ns(gpu.get(), start, end, &ns, &gpu.error()), "elapsed");
    MESSAGE("20 fills of 256 MiB: " << ns / 1000 << " us");
    CHECK(ns > 0);
    bp_event *plain = gpu.flush(s);
    CHECK(api.event_elapsed_ns(gpu.get(), start, plain, &ns, &gpu.error()) ==
          BP_ERROR_INVALID_ARGUMENT);
    for (bp_event *e : {start, end, plain}) api.event_release(gpu.get(), e);
    api.memory_free(gpu.get(), a);
    api.stream_destroy(gpu.get(), s);
}

TEST_CASE("copies between two GPUs when the machine has two with peer access") {
    auto plugin = openPlugin();
    const uint32_t count = plugin->probe().device_count;
    std::vector<bool> claims(count);
    for (uint32_t i = 0; i < count; ++i)
        claims[i] = (plugin->deviceInfo(i).capabilities & BP_CAPABILITY_PEER_COPY) != 0;
    // The capability is per device: set exactly where the driver lets the device reach another.
    const auto access = driverPeerAccess(count);
    for (uint32_t i = 0; i < count; ++i) {
        bool reachesAnother = false;
        for (uint32_t j = 0; j < count; ++j) reachesAnother = reachesAnother || access[i][j];
        CAPTURE(i);
        CHECK(claims[i] == reachesAnother);
    }
    if (count < 2) {
        MESSAGE("peer copy not tested: " << count << " GPU");
        // One GPU has no peer to copy from, so it must not claim the capability.
        CHECK_FALSE(claims[0]);
        return;
    }
    AbiDevice gpu0(plugin, 0);
    AbiDevice gpu1(plugin, 1);
    REQUIRE((gpu0.api().copy_peer != nullptr));
    if (!claims[0] || !claims[1]) {
        MESSAGE("no peer access between GPU 0 (" << claims[0] << ") and GPU 1 (" << claims[1]
                                                 << "): copy_peer must refuse");
        AbiDevice &without = claims[1] ? gpu0 : gpu1;
        AbiDevice &other = claims[1] ? gpu1 : gpu0;
        bp_stream *s = without.stream();
        bp_memory *src = other.allocate(4096);
        bp_memory *dst = without.allocate(4096);
        auto copy = AbiDevice::makeArgs<bp_copy_device_to_device_args>();
        copy.src = src;
        copy.dst = dst;
        copy.size = 4096;
        CHECK(without.api().copy_peer(without.get(), s, other.get(), &copy, &without.error()) ==
              BP_ERROR_UNSUPPORTED);
        without.api().memory_free(other.get(), src);
        without.api().memory_free(without.get(), dst);
        without.api().stream_destroy(without.get(), s);
        return;
    }
    SUBCASE("from GPU 0 to GPU 1") { checkPeerCopy(gpu0, gpu1); }
    SUBCASE("from GPU 1 to GPU 0") { checkPeerCopy(gpu1, gpu0); }
}

TEST_CASE("a CUBIN compiled here loads and runs in a new process without recompiling") {
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto blob = compileKernels(gpu);
    char path[] = "/tmp/backplane_cubin_XXXXXX";
    const int fd = mkstemp(path);
    REQUIRE(fd >= 0);
    REQUIRE(write(fd, blob.data(), blob.size()) == static_cast<ssize_t>(blob.size()));
    close(fd);
    CHECK(runSelf(std::string("--child-load-blob=") + path) == 0);
    std::remove(path);
}

TEST_CASE("a trapping kernel loses the device in its process; this process still works") {
    CHECK(runSelf("--child-trap") == 0);
    auto plugin = openPlugin();
    AbiDevice gpu(plugin, 0);
    auto blob = compileKernels(gpu);
    bp_kernel *k = gpu.load(blob, "scale_add");
    runScaleAdd(gpu, k, 1000);
    gpu.api().kernel_release(gpu.get(), k);
}

int main(int argc, char **argv) {
    selfPath = argv[0];
    // Child modes use the same helpers outside a test case: a failed assertion there prints
    // and exits non-zero, which the parent's test reports.
    doctest::Context childContext;
    childContext.setAsDefaultForAssertsOutOfTestCases();
    childContext.setAssertHandler([](const doctest::AssertData &ad) {
        std::cerr << "child assertion failed at " << ad.m_file << ":" << ad.m_line << ": "
                  << ad.m_expr << "\n";
        std::exit(6);
    });
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        if (arg.rfind("--child-load-blob=", 0) == 0) {
            try {
                return childLoadBlob(arg.substr(std::strlen("--child-load-blob=")));
            } catch (const std::exception &e) {
                std::cerr << "child: " << e.what() << "\n";
                return 1;
            }
        }
        if (arg == "--child-trap") {
            try {
                return childTrap();
            } catch (const std::exception &e) {
                std::cerr << "child: " << e.what() << "\n";
                return 1;
            }
        }
    }
    try {
        if (openPlugin()->probe().device_count == 0)
            return backplane::test::skip("the CUDA driver reports no device");
    } catch (const std::exception &e) {
        return backplane::test::skipOrFail(e, "opening and probing the CUDA plugin");
    }
    doctest::Context context(argc, argv);
    return context.run();
}
