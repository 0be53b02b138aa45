// Kernel-cache healing on a real plugin: a cached binary whose checksum is fine but which the
// plugin refuses, at kernel_load or at the first launch (lavapipe builds the pipeline there), is
// evicted, recompiled from source once and stored again. Tests internals (opens the Vulkan plugin
// through detail::PluginLibrary): backplane_internal_dep. Exits 77 (SKIP) only when there is no
// Vulkan driver or no lavapipe device.
#define DOCTEST_CONFIG_IMPLEMENT
#include "../test_skip.hpp"

#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"
#include "device/driver.hpp"
#include "server/kernel_registry.hpp"

#include <backplane/cache.hpp>
#include <backplane/client.hpp>
#include <backplane/log.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

using namespace backplane;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<detail::PluginLibrary> gPlugin;
DeviceInfo gDevice;

// x[i] += 1 for i < n; block size from specialization constant 0.
const std::string kIncrement = R"(#version 450
layout(local_size_x_id = 0) in;
layout(set = 0, binding = 0) buffer X { uint x[]; };
layout(push_constant) uniform P { uint n; };
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < n) x[i] += 1u;
}
)";

constexpr uint32_t kWords = 64;

KernelSource incrementKernel() {
    return {"increment", {KernelVariant::text(Dialect::Glsl, "main", kIncrement)}};
}

/// A fresh cache directory, removed with everything in it at scope exit.
class TempDir {
public:
    TempDir() {
        std::string pattern = (fs::temp_directory_path() / "bp-heal-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) std::abort();
        path_ = pattern;
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    const fs::path &path() const { return path_; }

private:
    fs::path path_;
};

/// Warnings of the cache subsystem while alive.
class CacheWarnings {
public:
    CacheWarnings() {
        log::setSink([this](log::Level level, log::Subsystem from, std::string_view message) {
            if (from != log::Subsystem::Cache || level < log::Level::Warn) return;
            std::lock_guard lock(mutex_);
            messages_.emplace_back(message);
        });
    }
    ~CacheWarnings() { log::setSink(nullptr); }
    CacheWarnings(const CacheWarnings &) = delete;
    CacheWarnings &operator=(const CacheWarnings &) = delete;
    std::vector<std::string> messages() const {
        std::lock_guard lock(mutex_);
        return messages_;
    }
    /// How many warnings mention `text`.
    size_t mentioning(const std::string &text) const {
        const auto all = messages();
        return static_cast<size_t>(std::count_if(all.begin(), all.end(), [&](const auto &m) {
            return m.find(text) != std::string::npos;
        }));
    }

private:
    mutable std::mutex mutex_;
    std::vector<std::string> messages_;
};

ComputeClient openClient(const fs::path &cacheDir) {
    Config config;
    config.cacheEnabled = true;
    config.cacheDir = cacheDir;
    return detail::openComputeClient(gPlugin, gDevice, config);
}

/// Increments kWords words of 5 once on the current stream with `block` threads per workgroup;
/// returns what reads back.
std::vector<uint32_t> runIncrement(ComputeClient &client, uint32_t block = 64) {
    Buffer x = client.createFrom<uint32_t>(std::vector<uint32_t>(kWords, 5));
    Dispatch d;
    d.block = {block, 1, 1};
    d.grid = {(kWords + block - 1) / block, 1, 1};
    d.bindings = {x};
    d.scalar(kWords);
    client.execute(incrementKernel(), d);
    return client.readAs<uint32_t>(x);
}

const std::vector<uint32_t> kIncremented(kWords, 6);

struct KernelEntry {
    std::string key;
    std::vector<unsigned char> payload;
    fs::path file;
};

/// The one kernel entry of the cache in `dir`.
KernelEntry onlyKernelEntry(const fs::path &dir) {
    CacheStore store(dir);
    auto entries = store.entries(CacheKind::Kernels);
    REQUIRE(entries.size() == 1);
    return {entries[0].first, entries[0].second,
            store.entryPath(CacheKind::Kernels, entries[0].first)};
}

/// Replaces the entry's payload through the store, so header and checksum are valid.
void rewriteEntry(const fs::path &dir, const KernelEntry &entry,
                  const std::vector<unsigned char> &payload) {
    CacheStore store(dir);
    REQUIRE(store.store(CacheKind::Kernels, entry.key, std::span(payload)));
    REQUIRE(store.load(CacheKind::Kernels, entry.key) == payload);
}

/// `spirv` declaring one more capability, SPV_NV_cooperative_matrix's, that lavapipe lacks: the
/// module stays valid (SPIRV-Tools validates it at kernel_load, SPIRV-Cross reflects it,
/// vkCreateShaderModule takes it), and lavapipe refuses it when the first launch builds the
/// pipeline (vkCreateComputePipelines: VK_ERROR_UNKNOWN, a launch error).
std::vector<unsigned char> failingAtLaunch(const std::vector<unsigned char> &spirv) {
    constexpr uint32_t kOpCapability = 17, kOpExtension = 10, kCooperativeMatrixNv = 5357;
    REQUIRE(spirv.size() % 4 == 0);
    std::vector<uint32_t> words(spirv.size() / 4);
    std::memcpy(words.data(), spirv.data(), spirv.size());
    // After the last OpCapability: the capability, then its extension (before the others).
    size_t at = 5;
    while (at < words.size() && (words[at] & 0xffff) == kOpCapability) at += words[at] >> 16;
    const char name[] = "SPV_NV_cooperative_matrix"; // 25 characters + NUL: 7 words
    std::vector<uint32_t> extension((sizeof(name) + 3) / 4, 0);
    std::memcpy(extension.data(), name, sizeof(name));
    std::vector<uint32_t> inserted = {(2u << 16) | kOpCapability, kCooperativeMatrixNv,
                                      static_cast<uint32_t>((1 + extension.size()) << 16) | kOpExtension};
    inserted.insert(inserted.end(), extension.begin(), extension.end());
    words.insert(words.begin() + static_cast<std::ptrdiff_t>(at), inserted.begin(), inserted.end());
    std::vector<unsigned char> out(words.size() * 4);
    std::memcpy(out.data(), words.data(), out.size());
    return out;
}

/// Runs the kernel once in a fresh client so the cache in `dir` holds its binary; returns it.
KernelEntry primeCache(const fs::path &dir) {
    ComputeClient client = openClient(dir);
    REQUIRE(runIncrement(client) == kIncremented);
    REQUIRE(client.stats().kernelsCompiled == 1);
    return onlyKernelEntry(dir);
}

} // namespace

TEST_CASE("a cached binary that fails at its first launch is evicted, recompiled once and "
          "replaced") {
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    rewriteEntry(dir.path(), good, failingAtLaunch(good.payload));

    CacheWarnings warnings;
    {
        ComputeClient client = openClient(dir.path());
        CHECK(runIncrement(client) == kIncremented);
        CHECK(runIncrement(client) == kIncremented);
        const EngineStats stats = client.stats();
        CHECK(stats.diskCacheHits == 1);   // the bad binary loaded...
        CHECK(stats.kernelsCompiled == 1); // ...and was recompiled exactly once
    }
    // The fresh binary replaced the entry, and the warning named the file it came from.
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, good.key) == good.payload);
    CHECK(warnings.mentioning(good.file.string()) == 1);
    CHECK(warnings.mentioning("failed at launch") == 1);

    // The next process is served by the healed entry without compiling.
    ComputeClient next = openClient(dir.path());
    CHECK(runIncrement(next) == kIncremented);
    CHECK(next.stats().diskCacheHits == 1);
    CHECK(next.stats().kernelsCompiled == 0);
}

TEST_CASE("a cached binary that kernel_load refuses is evicted, recompiled and replaced") {
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    const std::string garbage = "a checksummed entry whose payload is not SPIR-V at all";
    rewriteEntry(dir.path(), good, std::vector<unsigned char>(garbage.begin(), garbage.end()));

    CacheWarnings warnings;
    {
        ComputeClient client = openClient(dir.path());
        CHECK(runIncrement(client) == kIncremented);
        CHECK(client.stats().diskCacheHits == 0);
        CHECK(client.stats().kernelsCompiled == 1);
    }
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, good.key) == good.payload);
    CHECK(warnings.mentioning(good.file.string()) == 1);
    CHECK(warnings.mentioning("did not load") == 1);
}

TEST_CASE("threads launching a cached binary that fails at launch share one recompile") {
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    rewriteEntry(dir.path(), good, failingAtLaunch(good.payload));

    CacheWarnings warnings;
    ComputeClient client = openClient(dir.path());
    // Every thread loads the kernel first, so all of them hold the bad binary when the first
    // launch fails; then they launch together.
    constexpr int kThreads = 4;
    client.prepare(incrementKernel());
    std::atomic<int> ready{0};
    std::vector<std::vector<uint32_t>> results(kThreads);
    std::vector<std::string> errors(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            StreamGuard stream(static_cast<StreamId>(100 + t));
            ready.fetch_add(1);
            while (ready.load() < kThreads)
                std::this_thread::yield();
            try {
                results[t] = runIncrement(client);
            } catch (const std::exception &e) {
                errors[t] = e.what();
            }
        });
    for (std::thread &t : threads)
        t.join();
    for (int t = 0; t < kThreads; ++t) {
        INFO("thread " << t << ": " << errors[t]);
        CHECK(errors[t].empty());
        CHECK(results[t] == kIncremented);
    }
    CHECK(client.stats().diskCacheHits == 1);
    CHECK(client.stats().kernelsCompiled == 1);
    CHECK(warnings.mentioning("failed at launch") == 1);
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, good.key) == good.payload);
}

TEST_CASE("callers holding the same failed binary share one recompile and get the fresh kernel") {
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    rewriteEntry(dir.path(), good, failingAtLaunch(good.payload));
    Config config;
    config.cacheDir = dir.path();
    detail::KernelRegistry registry(detail::Driver::open(gPlugin, gDevice), config);
    const KernelSource kernel = incrementKernel();
    bp_kernel *cached = registry.find(kernel);
    REQUIRE(registry.diskHits() == 1);

    // Errors a binary does not cause leave it alone.
    const Error badArgument(ErrorCode::InvalidArgument, "bindings missing");
    CHECK(registry.recompileAfterLaunchFailure(kernel, cached, badArgument).kernel == nullptr);
    CHECK(registry.compiled() == 0);
    CHECK(fs::exists(good.file));

    // Every caller launched `cached` and saw it fail: all of them report at once.
    CacheWarnings warnings;
    constexpr int kThreads = 4;
    const Error launchFailed(ErrorCode::Launch, "vkCreateComputePipelines failed");
    std::atomic<int> ready{0};
    std::vector<detail::KernelRegistry::Recompiled> results(kThreads);
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            ready.fetch_add(1);
            while (ready.load() < kThreads)
                std::this_thread::yield();
            results[t] = registry.recompileAfterLaunchFailure(kernel, cached, launchFailed);
        });
    for (std::thread &t : threads)
        t.join();
    CHECK(registry.compiled() == 1);
    CHECK(warnings.mentioning(good.file.string()) == 1);
    for (const auto &result : results) {
        CHECK(result.kernel != nullptr);
        CHECK(result.kernel != cached);
        CHECK(result.kernel == results[0].kernel);
        CHECK(result.discardedFile == good.file.string());
    }
    CHECK(registry.find(kernel) == results[0].kernel);
    // Healed once: a failure of the fresh kernel is the caller's to report.
    CHECK(registry.recompileAfterLaunchFailure(kernel, results[0].kernel, launchFailed).kernel ==
          nullptr);
    CHECK(registry.compiled() == 1);
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, good.key) == good.payload);
}

TEST_CASE("a disk-cached kernel launched with too few bindings keeps its cache file") {
    // The plugin refuses a launch that does not match the shader's interface (reflected at
    // load): that is the caller's error (InvalidArgument), never a reason to evict the binary.
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    CacheWarnings warnings;
    ComputeClient client = openClient(dir.path());
    Dispatch d;
    d.block = {64, 1, 1};
    d.grid = {1, 1, 1};
    d.scalar(kWords); // no binding: the shader needs one
    std::string message;
    try {
        client.execute(incrementKernel(), d);
        client.sync();
    } catch (const Error &e) {
        CHECK(std::string(toString(e.code())) == "invalid_argument");
        message = e.what();
    }
    CHECK_MESSAGE(message.find("1 storage-buffer binding") != std::string::npos, message);
    CHECK(message.find("discarding") == std::string::npos);
    CHECK(client.stats().diskCacheHits == 1);
    CHECK(client.stats().kernelsCompiled == 0);
    CHECK(warnings.messages().empty());
    CHECK(fs::exists(good.file));
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, good.key) == good.payload);
    CHECK(runIncrement(client) == kIncremented);
}

TEST_CASE("a launch over the device's block limit is refused before any compile") {
    TempDir dir;
    ComputeClient client = openClient(dir.path());
    std::string message;
    try {
        runIncrement(client, gDevice.maxBlockSize[0] + 1);
    } catch (const Error &e) {
        CHECK(std::string(toString(e.code())) == "launch");
        message = e.what();
    }
    CHECK(message.find("block dimension 0") != std::string::npos);
    CHECK(message.find("discarding") == std::string::npos);
    CHECK(client.stats().kernelsCompiled == 0);
    CHECK(client.stats().diskCacheHits == 0);
}

TEST_CASE("a disk-cached kernel launched with a block over the device limit keeps its cache file") {
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    CacheWarnings warnings;
    ComputeClient client = openClient(dir.path());
    std::string message;
    try {
        runIncrement(client, gDevice.maxBlockSize[0] + 1);
    } catch (const Error &e) {
        CHECK(std::string(toString(e.code())) == "launch");
        message = e.what();
    }
    // The caller's error, named as such, before the kernel is looked up: nothing was loaded,
    // nothing recompiled, and the valid entry is still on disk.
    CHECK_MESSAGE(message.find("block dimension 0") != std::string::npos, message);
    CHECK_MESSAGE(message.find("cached") == std::string::npos, message);
    CHECK(client.stats().kernelsCompiled == 0);
    CHECK(fs::exists(good.file));
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, good.key) == good.payload);
    CHECK(warnings.messages().empty());
    // A valid launch afterwards comes from the disk cache.
    CHECK(runIncrement(client) == kIncremented);
    CHECK(client.stats().diskCacheHits == 1);
    CHECK(client.stats().kernelsCompiled == 0);
}

TEST_CASE("a disk-cached kernel launched with a zero block dimension runs nothing and keeps its "
          "cache file") {
    TempDir dir;
    const KernelEntry good = primeCache(dir.path());
    CacheWarnings warnings;
    ComputeClient client = openClient(dir.path());
    Buffer x = client.createFrom<uint32_t>(std::vector<uint32_t>(kWords, 5));
    Dispatch d;
    d.block = {0};
    d.grid = {1};
    d.bindings = {x};
    d.scalar(kWords);
    CHECK_NOTHROW(client.execute(incrementKernel(), d));
    CHECK(client.readAs<uint32_t>(x) == std::vector<uint32_t>(kWords, 5));
    CHECK(client.stats().kernelsCompiled == 0);
    CHECK(warnings.messages().empty());
    CHECK(fs::exists(good.file));
    CHECK(runIncrement(client) == kIncremented);
    CHECK(client.stats().diskCacheHits == 1);
}

namespace {

int runTests(int argc, char **argv) {
    try {
        const char *path = std::getenv("BACKPLANE_VULKAN_PLUGIN");
        gPlugin = detail::PluginLibrary::open(path ? path : VULKAN_PLUGIN_PATH, "vulkan", {});
        const bp_probe_result probe = gPlugin->probe();
        // The launch-time failure is lavapipe refusing a capability it lacks (cooperative matrices);
        // another driver's response to such a module is not something to try.
        for (uint32_t i = 0; i < probe.device_count; ++i) {
            const DeviceInfo info = detail::toDeviceInfo("vulkan", i, gPlugin->deviceInfo(i));
            if (info.name.find("llvmpipe") != std::string::npos) {
                gDevice = info;
                break;
            }
        }
        if (gDevice.name.empty())
            return test::skip("no lavapipe (llvmpipe) device among the Vulkan plugin's " +
                              std::to_string(probe.device_count) + " devices");
    } catch (const std::exception &e) {
        return test::skipOrFail(e, "opening and probing the Vulkan plugin");
    }
    doctest::Context context(argc, argv);
    return context.run();
}

} // namespace

int main(int argc, char **argv) {
    log::setLevel(log::Subsystem::Cache, log::Level::Warn);
    const int status = runTests(argc, argv);
    // Destroy the plugin now, not during static destruction: NVIDIA's Vulkan driver is torn
    // down by then and its instance's destruction segfaults (seen on the H100 when skipping).
    gPlugin.reset();
    return status;
}
