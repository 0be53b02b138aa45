// HIP plugin tests without AMD hardware: the probe's report, and hiprtc compiling offline.
#include "plugin/plugin_library.hpp"

#include "gpu_compile.hpp"

#include <doctest/doctest.h>

#include <cstdlib>

namespace {

const char *const kKernel = R"(
struct Params { float scale; unsigned n; };
extern "C" __global__ void scale_add(const float *a, float *b, Params p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) b[i] = a[i] * p.scale + 1.0f;
}
)";

std::string pluginPath() {
    const char *env = std::getenv("BACKPLANE_TEST_PLUGIN");
    return env != nullptr && *env != '\0' ? env : HIP_PLUGIN_PATH;
}

} // namespace

TEST_CASE("the hip plugin loads and its probe says why there is no AMD GPU here") {
    auto plugin = backplane::detail::PluginLibrary::open(pluginPath(), "hip", {});
    REQUIRE(plugin->name() == "hip");
    try {
        const bp_probe_result probe = plugin->probe();
        // A machine with an AMD GPU: it must be described.
        CHECK(probe.device_count > 0);
        CHECK(std::string(plugin->deviceInfo(0).arch).rfind("gfx", 0) == 0);
    } catch (const backplane::Error &e) {
        const std::string message = e.what();
        INFO(message);
        if (e.code() == backplane::ErrorCode::NoDriver) {
            // ROCm is not installed: the message names the library the loader could not find.
            CHECK(message.find("libamdhip64.so") != std::string::npos);
        } else {
            // ROCm is installed but there is no GPU: HIP's own error name and text are given.
            CHECK((e.code() == backplane::ErrorCode::NoDevice));
            CHECK(message.find("no HIP device (hip") != std::string::npos);
            CHECK(message.find("hipError") != std::string::npos);
        }
    }
}

// Internals: the shared compile function of plugins/cuda, compiled into this test with the HIP
// mapping (plugins/hip/vendor.hpp), exactly as the HIP plugin runs it.
TEST_CASE("hiprtc compiles a kernel offline for gfx90a and gfx1030") {
    const bpv::Rtc &hiprtc = backplane::gpu::rtc();
    for (const char *arch : {"gfx90a", "gfx1030"}) {
        CAPTURE(arch);
        backplane::sdk::CompileOutput out;
        backplane::gpu::CompileRequest request{kKernel, "scale_add", arch, {}};
        backplane::gpu::compileSource(hiprtc, request, out);
        REQUIRE(out.binary.size() > 4);
        // A code object (ELF, or a clang offload bundle on some versions).
        const std::string head(out.binary.begin(), out.binary.begin() + 4);
        CHECK((head == "\x7f" "ELF" || head == "__CL"));
    }
}

TEST_CASE("a hiprtc compile error names the kernel and carries the log") {
    const bpv::Rtc &hiprtc = backplane::gpu::rtc();
    backplane::sdk::CompileOutput out;
    backplane::gpu::CompileRequest request{"extern \"C\" __global__ void broken() { nope(); }",
                                           "broken", "gfx90a", {}};
    try {
        backplane::gpu::compileSource(hiprtc, request, out);
        FAIL("a kernel calling an undeclared function compiled");
    } catch (const backplane::sdk::Error &e) {
        CHECK(e.code() == BP_ERROR_COMPILE);
        CHECK(std::string(e.what()).find("'broken'") != std::string::npos);
        CHECK(out.log.find("nope") != std::string::npos);
    }
}
