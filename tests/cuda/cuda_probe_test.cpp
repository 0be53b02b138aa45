// CUDA plugin tests that run everywhere: loading, probe without a driver, offline NVRTC compile.
#include "gpu_test_support.hpp"

#include "gpu_compile.hpp"

using backplane::test::pluginPath;

namespace {

std::shared_ptr<backplane::detail::PluginLibrary> openPlugin() {
    return backplane::detail::PluginLibrary::open(pluginPath(CUDA_PLUGIN_PATH), "cuda", {});
}

const char *const kKernel = R"(
struct Params { float scale; unsigned n; };
extern "C" __global__ void scale_add(const float *a, float *b, Params p) {
    unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) b[i] = a[i] * p.scale + 1.0f;
}
)";

} // namespace

TEST_CASE("the cuda plugin loads and reports no driver, or finds its devices") {
    auto plugin = openPlugin();
    REQUIRE(plugin->name() == "cuda");
    try {
        const bp_probe_result probe = plugin->probe();
        CHECK(probe.device_count > 0);
        CHECK(std::string(probe.driver_version).find('.') != std::string::npos);
        const bp_device_info info = plugin->deviceInfo(0);
        CHECK(std::string(info.arch).rfind("sm_", 0) == 0);
    } catch (const backplane::Error &e) {
        // The CI case: the driver is not installed; the message names the library.
        INFO(std::string(e.what()));
        CHECK((e.code() == backplane::ErrorCode::NoDriver));
        CHECK(std::string(e.what()).find("no CUDA driver (libcuda.so.1 not found: ") !=
              std::string::npos);
    }
}

TEST_CASE("device_info fails like the probe when the driver is missing") {
    auto plugin = openPlugin();
    bool probed = true;
    try {
        plugin->probe();
    } catch (const backplane::Error &) {
        probed = false;
    }
    if (probed) {
        CHECK_NOTHROW(plugin->deviceInfo(0));
    } else {
        CHECK_THROWS_AS(plugin->deviceInfo(0), backplane::Error);
    }
}

// Internals: the shared compile function, compiled into this test with the CUDA mapping.
TEST_CASE("NVRTC compiles a kernel to a CUBIN for sm_90 without a GPU, or says it is missing") {
    try {
        const bpv::Rtc &nvrtc = backplane::gpu::rtc();
        backplane::sdk::CompileOutput out;
        backplane::gpu::CompileRequest request{kKernel, "scale_add", "sm_90", {}};
        backplane::gpu::compileSource(nvrtc, request, out);
        REQUIRE(out.binary.size() > 4);
        // A CUBIN is an ELF file, not PTX text.
        CHECK(out.binary[0] == 0x7f);
        CHECK(out.binary[1] == 'E');

        backplane::sdk::CompileOutput bad;
        backplane::gpu::CompileRequest broken{"extern \"C\" __global__ void broken() { x = 1; }",
                                              "broken", "sm_90", {}};
        try {
            backplane::gpu::compileSource(nvrtc, broken, bad);
            FAIL("a kernel with an undefined identifier compiled");
        } catch (const backplane::sdk::Error &e) {
            CHECK(e.code() == BP_ERROR_COMPILE);
            CHECK(std::string(e.what()).find("'broken'") != std::string::npos);
            CHECK(bad.log.find("undefined") != std::string::npos);
        }
    } catch (const backplane::sdk::Error &e) {
        INFO(std::string(e.what()));
        CHECK(e.code() == BP_ERROR_NO_DRIVER);
        CHECK(std::string(e.what()).find("NVRTC not found") != std::string::npos);
    }
}
