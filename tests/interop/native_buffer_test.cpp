// A Buffer's place in native memory (ComputeClient::nativeBuffer, nativeHandle(Memory)), on every
// device present. Buffers share pool pages: before issue 28, nativeHandle(Memory) gave the page,
// the same value for every buffer in it, so native code wrote the wrong buffer.
#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/abi/plugin.h>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>
#include <dlfcn.h>

#include <cstring>
#include <string>
#include <vector>

using namespace backplane;

namespace {

const Runtime &runtime() {
    static const Runtime instance([] {
        Config config;
        config.pluginPathOverride = {MANIFESTS};
        config.probeMode = ProbeMode::InProcess;
        config.cacheEnabled = false;
        return config;
    }());
    return instance;
}

/// The CUDA driver's copies, opened at run time (only where a cuda device is present).
struct CudaDriver {
    using Push = int (*)(void *);
    using Pop = int (*)(void **);
    using ToHost = int (*)(void *, uint64_t, size_t);
    using ToDevice = int (*)(uint64_t, const void *, size_t);
    void *library = ::dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    Push push = library ? reinterpret_cast<Push>(::dlsym(library, "cuCtxPushCurrent_v2")) : nullptr;
    Pop pop = library ? reinterpret_cast<Pop>(::dlsym(library, "cuCtxPopCurrent_v2")) : nullptr;
    ToHost toHost = library ? reinterpret_cast<ToHost>(::dlsym(library, "cuMemcpyDtoH_v2")) : nullptr;
    ToDevice toDevice = library ? reinterpret_cast<ToDevice>(::dlsym(library, "cuMemcpyHtoD_v2")) : nullptr;
    bool usable() const { return push && pop && toHost && toDevice; }
};

/// Copies `bytes` between host memory and a native address of `client`'s device (toDevice: host
/// to the address), where this test knows how; false elsewhere.
bool nativeCopy(ComputeClient &client, uint64_t address, void *host, size_t bytes, bool toDevice) {
    const std::string backend = client.device().backend;
    void *native = reinterpret_cast<void *>(address);
    if (backend == "host") {
        std::memcpy(toDevice ? native : host, toDevice ? host : native, bytes);
        return true;
    }
    if (backend != "cuda") return false;
    static CudaDriver cuda;
    REQUIRE(cuda.usable());
    REQUIRE(cuda.push(reinterpret_cast<void *>(client.nativeHandle(NativeKind::Device))) == 0);
    const int status = toDevice ? cuda.toDevice(address, host, bytes) : cuda.toHost(host, address, bytes);
    void *popped = nullptr;
    cuda.pop(&popped);
    REQUIRE(status == 0);
    return true;
}

} // namespace

TEST_CASE("every buffer and view has its own native place: memory, offset, size, address") {
    size_t devices = 0;
    for (const PhysicalDevice &device : runtime().devices())
        for (const DeviceInfo &route : device.routes) {
            ++devices;
            CAPTURE(route.id());
            ComputeClient client = runtime().open(runtime().select(route.id()));
            const bool addressable = (route.capabilities & BP_CAPABILITY_ADDRESSABLE_MEMORY) != 0;
            // Small buffers come from one pool page.
            Buffer a = client.createFrom<uint32_t>(std::vector<uint32_t>(64, 0xA0A0A0A0u));
            Buffer b = client.createFrom<uint32_t>(std::vector<uint32_t>(64, 0xB0B0B0B0u));
            const NativeBuffer na = client.nativeBuffer(a), nb = client.nativeBuffer(b);
            CHECK(na.memory != 0);
            CHECK(na.size == 256);
            CHECK(nb.size == 256);
            // Two buffers never have the same place: a shared page means different offsets.
            CHECK((na.memory != nb.memory || na.offset != nb.offset));
            if (na.memory == nb.memory)
                CHECK((na.offset + na.size <= nb.offset || nb.offset + nb.size <= na.offset));
            // A view is its buffer's place moved by the view's offset.
            const NativeBuffer nv = client.nativeBuffer(b.view(32, 64));
            CHECK(nv.memory == nb.memory);
            CHECK(nv.offset == nb.offset + 32);
            CHECK(nv.size == 64);
            if (addressable) {
                CHECK(na.address == na.memory + na.offset);
                CHECK(nv.address == nb.address + 32);
                CHECK(na.address != nb.address);
                // nativeHandle(Memory) is the buffer's own address, not its page's.
                CHECK(client.nativeHandle(NativeKind::Memory, &a) == na.address);
                CHECK(client.nativeHandle(NativeKind::Memory, &b) == nb.address);
            } else {
                CHECK(na.address == 0);
                CHECK(client.nativeHandle(NativeKind::Memory, &a) == na.memory);
            }
            // Native code reads and writes the buffer itself (after sync(), as documented).
            client.sync();
            std::vector<uint32_t> seen(16);
            if (nativeCopy(client, nv.address, seen.data(), 64, false)) {
                CHECK(seen == std::vector<uint32_t>(16, 0xB0B0B0B0u));
                std::vector<uint32_t> mark(16, 0x12345678u);
                REQUIRE(nativeCopy(client, nv.address, mark.data(), 64, true));
                const std::vector<uint32_t> got = client.readAs<uint32_t>(b);
                for (size_t i = 0; i < got.size(); ++i) {
                    CAPTURE(i);
                    CHECK(got[i] == (i >= 8 && i < 24 ? 0x12345678u : 0xB0B0B0B0u));
                }
                CHECK(client.readAs<uint32_t>(a) == std::vector<uint32_t>(64, 0xA0A0A0A0u));
            } else {
                const std::string note = "no native access to " + route.id() + " in this test; places checked only";
                MESSAGE(note);
            }
            // A zero-byte buffer has no place; a buffer of another client is named as such.
            Buffer zero = client.empty(0);
            CHECK_THROWS_AS((void)client.nativeBuffer(zero), Error);
            CHECK_THROWS_AS((void)client.nativeBuffer(Buffer()), Error);
            // Nor has a zero-byte view at a buffer's end (its address would be the next buffer's).
            const Buffer endView = a.view(256, 0);
            CHECK_THROWS_AS((void)client.nativeBuffer(endView), Error);
            CHECK_THROWS_AS((void)client.nativeHandle(NativeKind::Memory, &endView), Error);
        }
    CHECK(devices > 0);
}
