// The CUDA plugin's NCCL loading, without a GPU: which library it opens (options, environment),
// what it says when NCCL is missing, incomplete or too old, and comm_id_create / comm_group
// through the C table. Uses the public RawPlugin; fake NCCLs come from cuda_fake_nccl.cpp.
#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>

#include <doctest/doctest.h>

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <vector>

using backplane::RawPlugin;

namespace {

/// $BACKPLANE_TEST_CUDA_MANIFEST (a copied build), else the build tree's manifest.
std::string manifestPath() {
    const char *env = std::getenv("BACKPLANE_TEST_CUDA_MANIFEST");
    return env != nullptr && *env != '\0' ? env : CUDA_PLUGIN_MANIFEST;
}

RawPlugin openCuda(const std::string &optionsJson = "{}") {
    return RawPlugin::open(backplane::readPluginManifest(manifestPath()),
                           {.optionsJson = optionsJson, .cacheDir = {}});
}

std::string libraryOption(const std::string &path) {
    return R"({"nccl": {"library": ")" + path + R"("}})";
}

/// The NCCL the machine points at (tools/gpu-check.sh sets BACKPLANE_NCCL_LIBRARY on the GPU
/// machine). Taken, then unset, before any case runs: it beats the nccl.library option, which
/// the other cases set to the fake libraries.
const std::string gConfiguredNccl = [] {
    const char *value = std::getenv("BACKPLANE_NCCL_LIBRARY");
    std::string configured = value != nullptr ? value : "";
    ::unsetenv("BACKPLANE_NCCL_LIBRARY");
    return configured;
}();

/// Sets an environment variable for one scope (the plugin reads it in plugin_init).
class ScopedEnvironment {
public:
    ScopedEnvironment(const char *name, const std::string &value) : name_(name) {
        if (const char *old = std::getenv(name)) {
            had_ = true;
            old_ = old;
        }
        ::setenv(name, value.c_str(), 1);
    }
    ~ScopedEnvironment() {
        if (had_)
            ::setenv(name_, old_.c_str(), 1);
        else
            ::unsetenv(name_);
    }
    ScopedEnvironment(const ScopedEnvironment &) = delete;
    ScopedEnvironment &operator=(const ScopedEnvironment &) = delete;

private:
    const char *name_;
    bool had_ = false;
    std::string old_;
};

/// comm_id_create's status, bytes and message.
struct IdResult {
    bp_status status = BP_ERROR_INTERNAL;
    std::vector<unsigned char> id;
    std::string message;
};

IdResult createId(const RawPlugin &plugin) {
    REQUIRE(plugin.has(&bp_plugin_api::comm_id_create));
    IdResult result;
    result.id.resize(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    bp_error error = backplane::makeError();
    result.status = plugin.api().comm_id_create(plugin.instance(), result.id.data(),
                                                result.id.size(), &size, &error);
    result.id.resize(result.status == BP_SUCCESS ? size : 0);
    result.message = backplane::errorMessage(error);
    return result;
}

} // namespace

TEST_CASE("a missing NCCL makes comm_id_create unsupported and names the library and the fix") {
    const IdResult result = createId(openCuda(libraryOption("/nonexistent/libnccl.so.2")));
    INFO(result.message);
    CHECK(result.status == BP_ERROR_UNSUPPORTED);
    CHECK(result.message.find("/nonexistent/libnccl.so.2 (from plugins.options.cuda.nccl.library) "
                              "not found") != std::string::npos);
    CHECK(result.message.find("install NCCL or set plugins.options.cuda.nccl.library") !=
          std::string::npos);
}

TEST_CASE("BACKPLANE_NCCL_LIBRARY overrides the nccl.library option") {
    const ScopedEnvironment environment("BACKPLANE_NCCL_LIBRARY", "/also/missing/libnccl.so.2");
    const IdResult result = createId(openCuda(libraryOption(FAKE_NCCL)));
    INFO(result.message);
    CHECK(result.status == BP_ERROR_UNSUPPORTED);
    CHECK(result.message.find("/also/missing/libnccl.so.2 (from BACKPLANE_NCCL_LIBRARY) not "
                              "found") != std::string::npos);
}

TEST_CASE("an NCCL older than 2.12 turns collectives off and says its version") {
    const IdResult result = createId(openCuda(libraryOption(FAKE_NCCL_OLD)));
    INFO(result.message);
    CHECK(result.status == BP_ERROR_UNSUPPORTED);
    CHECK(result.message.find("nccl 2.7.8 is older than 2.12") != std::string::npos);
}

TEST_CASE("a library without one of NCCL's entry points is refused naming the missing one") {
    const IdResult result = createId(openCuda(libraryOption(FAKE_NCCL_WITHOUT_SEND)));
    INFO(result.message);
    CHECK(result.status == BP_ERROR_UNSUPPORTED);
    CHECK(result.message.find("has no ncclSend") != std::string::npos);
}

TEST_CASE("comm_id_create returns the 128 bytes of ncclGetUniqueId") {
    const IdResult result = createId(openCuda(libraryOption(FAKE_NCCL)));
    INFO(result.message);
    REQUIRE(result.status == BP_SUCCESS);
    REQUIRE(result.id.size() == 128);
    for (size_t i = 0; i < result.id.size(); ++i)
        CHECK(result.id[i] == static_cast<unsigned char>((i * 7 + 3) % 256));
}

TEST_CASE("comm_group brackets work when NCCL is there and is unsupported when it is not") {
    const RawPlugin plugin = openCuda(libraryOption(FAKE_NCCL));
    REQUIRE(plugin.has(&bp_plugin_api::comm_group));
    bp_error error = backplane::makeError();
    CHECK(plugin.api().comm_group(plugin.instance(), 1, &error) == BP_SUCCESS);
    CHECK(plugin.api().comm_group(plugin.instance(), 0, &error) == BP_SUCCESS);
    // An end without a begin is the caller's error, not NCCL's.
    CHECK(plugin.api().comm_group(plugin.instance(), 0, &error) == BP_ERROR_INVALID_ARGUMENT);

    const RawPlugin without = openCuda(libraryOption("/nonexistent/libnccl.so.2"));
    CHECK(without.api().comm_group(without.instance(), 1, &error) == BP_ERROR_UNSUPPORTED);
}

TEST_CASE("a real NCCL, when one is installed, gives a fresh id each time") {
    // Whether there is one is asked of the loader directly, not of the plugin under test.
    const std::string path = !gConfiguredNccl.empty() ? gConfiguredNccl : "libnccl.so.2";
    void *nccl = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (nccl == nullptr) {
        MESSAGE("no NCCL here (" << ::dlerror() << "); nothing to compare");
        return;
    }
    const RawPlugin plugin = openCuda(gConfiguredNccl.empty() ? "{}" : libraryOption(path));
    const IdResult first = createId(plugin);
    INFO(path << ": " << first.message);
    REQUIRE(first.status == BP_SUCCESS);
    const IdResult second = createId(plugin);
    REQUIRE(second.status == BP_SUCCESS);
    CHECK(first.id.size() == 128);
    CHECK(first.id != second.id);
}

TEST_CASE("options the plugin does not know fail plugin_init with the key named") {
    // The core reports any plugin_init failure as a plugin that did not load, with its message.
    try {
        openCuda(R"({"nccl": {"library": 5}})");
        FAIL("plugin_init accepted a library that is not a string");
    } catch (const backplane::Error &e) {
        CHECK(std::string(backplane::toString(e.code())) == "plugin_load");
        CHECK(std::string(e.what()).find("\"nccl.library\" must be a non-empty path") !=
              std::string::npos);
    }
    try {
        openCuda(R"({"ncl": {}})");
        FAIL("plugin_init accepted an unknown key");
    } catch (const backplane::Error &e) {
        CHECK(std::string(backplane::toString(e.code())) == "plugin_load");
        CHECK(std::string(e.what()).find("unknown key \"ncl\"") != std::string::npos);
    }
}
