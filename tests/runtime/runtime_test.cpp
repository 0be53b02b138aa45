// Tests of Runtime: device list and dedup, selection, fallback, errors and the JSON report.
#include <backplane/error.hpp>
#include <backplane/log.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

using backplane::Config;
using backplane::Error;
using backplane::Runtime;

namespace {

Config fixtureConfig() {
    Config config;
    config.pluginPathOverride = {FIXTURE_DIR};
    config.cacheEnabled = false;
    return config;
}

std::string codeOf(const Error &e) { return backplane::toString(e.code()); }

/// Sets an environment variable for one scope, then restores it.
class ScopedEnv {
public:
    ScopedEnv(const char *name, const std::string &value) : name_(name) {
        if (const char *old = std::getenv(name)) old_ = old;
        setenv(name, value.c_str(), 1);
    }
    ~ScopedEnv() {
        if (old_)
            setenv(name_, old_->c_str(), 1);
        else
            unsetenv(name_);
    }
    ScopedEnv(const ScopedEnv &) = delete;
    ScopedEnv &operator=(const ScopedEnv &) = delete;

private:
    const char *name_;
    std::optional<std::string> old_;
};

/// A config file for one scope (removed at the end).
struct ScopedConfigFile {
    std::filesystem::path path;
    explicit ScopedConfigFile(const std::string &text)
        : path(std::filesystem::temp_directory_path() /
               ("backplane_runtime_test_" + std::to_string(::getpid()) + ".json")) {
        std::ofstream(path) << text;
    }
    ~ScopedConfigFile() {
        std::error_code ec;
        std::filesystem::remove(path, ec);
    }
};

const backplane::PluginReport &reportNamed(const Runtime &runtime, const std::string &name) {
    const auto &reports = runtime.plugins();
    const auto it = std::find_if(reports.begin(), reports.end(),
                                 [&](const backplane::PluginReport &r) { return r.name == name; });
    REQUIRE(it != reports.end());
    return *it;
}

/// Collects log messages of one scope.
struct LogCapture {
    std::mutex mutex;
    std::vector<std::string> lines;
    LogCapture() {
        backplane::log::setLevel(backplane::log::Subsystem::Loader, backplane::log::Level::Info);
        backplane::log::setSink([this](backplane::log::Level level, backplane::log::Subsystem,
                                       std::string_view message) {
            const std::lock_guard lock(mutex);
            lines.push_back(std::string(backplane::log::toString(level)) + ": " +
                            std::string(message));
        });
    }
    ~LogCapture() {
        backplane::log::setSink(nullptr);
        backplane::log::setLevel(backplane::log::Subsystem::Loader, backplane::log::Level::Off);
    }
    bool contains(const std::string &text) {
        const std::lock_guard lock(mutex);
        return std::any_of(lines.begin(), lines.end(), [&](const std::string &l) {
            return l.find(text) != std::string::npos;
        });
    }
};

} // namespace

TEST_CASE("lists the same GPU reached through two plugins once, with both routes") {
    const Runtime runtime(fixtureConfig());
    const auto &devices = runtime.devices();
    // fakegpu_a:0 = fakegpu_b:1 (one discrete GPU), fakegpu_b:0 (integrated), newer_minor:0 and
    // optional_missing:0 (other), fakecpu:0 (CPU).
    REQUIRE(devices.size() == 5);
    const auto &gpu = devices.front();
    CHECK(std::string(toString(gpu.info().type)) == "discrete_gpu");
    REQUIRE(gpu.routes.size() == 2);
    CHECK(gpu.routes[0].id() == "fakegpu_a:0");
    CHECK(gpu.routes[1].id() == "fakegpu_b:1");
    CHECK(gpu.info().id() == "fakegpu_a:0"); // neither is in backend_priority: discovery order
    CHECK(gpu.info().uuidString() == "aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa");
    CHECK(devices[1].info().id() == "fakegpu_b:0");
    CHECK(devices.back().info().id() == "fakecpu:0");
}

TEST_CASE("devices.backend_priority picks the preferred route of a shared GPU") {
    Config config = fixtureConfig();
    config.backendPriority = {"fakegpu_b", "fakegpu_a"};
    const Runtime runtime(config);
    CHECK(runtime.devices().front().info().id() == "fakegpu_b:1");
    CHECK(runtime.select("*:gpu").device.id() == "fakegpu_b:1");
    // An explicit route is honoured even when it is not the preferred one.
    CHECK(runtime.select("fakegpu_a:0").device.id() == "fakegpu_a:0");
}

TEST_CASE("a bad plugin does not stop the runtime from using the others") {
    const Runtime runtime(fixtureConfig());
    size_t failed = 0;
    for (const auto &p : runtime.plugins())
        if (p.state != backplane::PluginState::Loaded) ++failed;
    CHECK(failed >= 10);
    CHECK(runtime.select().device.id() == "fakegpu_a:0");
}

TEST_CASE("selects with every selector form") {
    const Runtime runtime(fixtureConfig());
    CHECK(runtime.select("fakegpu_b:0").device.id() == "fakegpu_b:0");
    CHECK(runtime.select("fakegpu_b").device.id() == "fakegpu_b:1"); // its best device
    CHECK(runtime.select("fakegpu_b:*").device.id() == "fakegpu_b:1");
    CHECK(runtime.select("fakegpu_b:aaaaaaaa-aaaa-aaaa-aaaa-aaaaaaaaaaaa").device.id() ==
          "fakegpu_b:1");
    CHECK(runtime.select("fakegpu_b:BBBB").device.id() == "fakegpu_b:0");
    CHECK(runtime.select("*:gpu").device.id() == "fakegpu_a:0");
    CHECK(runtime.select("*:cpu").device.id() == "fakecpu:0");
    CHECK(runtime.select("*").device.id() == "fakegpu_a:0");
    CHECK(runtime.select("fakecpu:7, fakegpu_b:0").device.id() == "fakegpu_b:0");
}

TEST_CASE("the first preference that matches wins, and earlier misses are reported") {
    Config config = fixtureConfig();
    config.devicePreference = {"no_driver", "fakegpu_a:3", "*:cpu", "*:gpu"};
    const Runtime runtime(config);
    const auto selection = runtime.select();
    CHECK(selection.device.id() == "fakecpu:0");
    REQUIRE(selection.rejected.size() == 2);
    CHECK(selection.rejected[0].find("no CUDA driver (libcuda.so.1 not found)") !=
          std::string::npos);
    CHECK(selection.rejected[1].find("fakegpu_a:0 but none matches") != std::string::npos);
    CHECK(selection.reason.find("'*:cpu'") != std::string::npos);
}

TEST_CASE("falls back to the best device with a warning when nothing preferred matches") {
    Config config = fixtureConfig();
    config.devicePreference = {"cuda:0", "missing_library_file"};
    LogCapture capture;
    const Runtime runtime(config);
    const auto selection = runtime.select();
    CHECK(selection.device.id() == "fakegpu_a:0");
    CHECK(selection.rejected.size() == 2);
    CHECK(selection.reason.find("nothing in devices.prefer matched") != std::string::npos);
    CHECK(capture.contains("warn: selected fakegpu_a:0"));
    CHECK(capture.contains("no plugin named 'cuda'"));
    CHECK(capture.contains("does_not_exist.so does not exist"));
}

TEST_CASE("a required preference that matches nothing throws with the plugin report") {
    Config config = fixtureConfig();
    config.devicePreference = {"no_driver:0", "fakegpu_a:5"};
    config.deviceRequired = true;
    const Runtime runtime(config);
    try {
        runtime.select();
        FAIL("select() should have thrown");
    } catch (const Error &e) {
        CHECK(codeOf(e) == "no_matching_device");
        const std::string message = e.what();
        CHECK(message.find("no CUDA driver (libcuda.so.1 not found)") != std::string::npos);
        CHECK(message.find("fakegpu_a has fakegpu_a:0 but none matches") != std::string::npos);
        // A required preference governs selection only (issue 26): the plugin it does not
        // name still loaded, and the report says what it has.
        CHECK(message.find("fakegpu_b: filtered_out") == std::string::npos);
        CHECK(runtime.devices().size() >= 2);
    }
}

TEST_CASE("an explicit selector is required and a malformed one is a config error") {
    const Runtime runtime(fixtureConfig());
    CHECK_THROWS_WITH_AS(runtime.select("nonexistent"),
                         doctest::Contains("no plugin named 'nonexistent'"), Error);
    try {
        runtime.select("fakegpu_a:");
        FAIL("select() should have thrown");
    } catch (const Error &e) {
        CHECK(codeOf(e) == "config");
    }
}

TEST_CASE("no device at all is a NoDevice error listing why each plugin failed") {
    Config config = fixtureConfig();
    config.pluginEnable = {"no_device", "no_driver"};
    const Runtime runtime(config);
    CHECK(runtime.devices().empty());
    try {
        runtime.select();
        FAIL("select() should have thrown");
    } catch (const Error &e) {
        CHECK(codeOf(e) == "no_device");
        CHECK(std::string(e.what()).find("no_driver: probe_failed") != std::string::npos);
    }
}

TEST_CASE("the JSON report follows schema version 1") {
    Config config = fixtureConfig();
    config.devicePreference = {"cuda", "*:cpu"};
    const Runtime runtime(config);
    const auto report = nlohmann::json::parse(runtime.reportJson());
    CHECK(report["schema_version"] == 1);
    CHECK(report["abi_version"] == "1.7");
    CHECK(report["search_path"][0] == FIXTURE_DIR);
    REQUIRE(report["plugins"].size() == runtime.plugins().size());
    bool sawLiar = false;
    for (const auto &p : report["plugins"]) {
        CHECK(p.contains("state"));
        CHECK(p.contains("reason"));
        CHECK(p.contains("manifest"));
        if (p["name"] == "abi_liar") {
            sawLiar = true;
            CHECK(p["state"] == "abi_mismatch");
        }
    }
    CHECK(sawLiar);
    REQUIRE(report["devices"].size() == 5);
    const auto &gpu = report["devices"][0];
    CHECK(gpu["id"] == "fakegpu_a:0");
    CHECK(gpu["type"] == "discrete_gpu");
    CHECK(gpu["memory_bytes"] == (16ull << 30));
    CHECK(gpu["routes"] == nlohmann::json::array({"fakegpu_a:0", "fakegpu_b:1"}));
    // Kernel features per route, types by name (the fixtures report ABI 1.3's set).
    const nlohmann::json baseTypes = {"bool", "i32", "u32", "f32"};
    for (const char *route : {"fakegpu_a:0", "fakegpu_b:1"}) {
        CAPTURE(route);
        REQUIRE(gpu.contains("kernel_features"));
        const auto &features = gpu["kernel_features"].at(route);
        CHECK(features["storage"] == baseTypes);
        CHECK(features["arithmetic"] == baseTypes);
        CHECK(features["atomic_add"] == nlohmann::json::array({"i32", "u32"}));
        CHECK(features["atomic_bits"] == nlohmann::json::array({"i32", "u32"}));
        CHECK(features["vector_widths"] == nlohmann::json::array());
        CHECK(features["matrix_shapes"] == nlohmann::json::array());
    }
    CHECK(report["devices"][4]["uuid"].is_null());
    CHECK(report["selection"]["device"] == "fakecpu:0");
    CHECK(report["selection"]["rejected"].size() == 1);
}

TEST_CASE("Runtime() reads the environment (BACKPLANE_PLUGIN_PATH, BACKPLANE_DEVICE)") {
    setenv("BACKPLANE_DEVICE", "fakegpu_b:0", 1);
    const Runtime runtime;
    unsetenv("BACKPLANE_DEVICE");
    CHECK(runtime.searchPath().front() == FIXTURE_DIR);
    CHECK(runtime.select().device.id() == "fakegpu_b:0");
}

TEST_CASE("a moved-from runtime's successor keeps the plugins loaded") {
    Runtime first(fixtureConfig());
    Runtime second(std::move(first));
    CHECK(second.devices().size() == 5);
    CHECK(second.select("fakecpu").device.name == "Fake CPU");
}

TEST_CASE("a preference from BACKPLANE_DEVICE is named as such, not as the config file's") {
    const ScopedConfigFile file(
        R"({"devices": {"prefer": ["fakecpu"]}, "cache": {"enabled": false}})");
    const ScopedEnv config("BACKPLANE_CONFIG", file.path.string());
    {
        const ScopedEnv device("BACKPLANE_DEVICE", "cuda:0");
        const ScopedEnv log("BACKPLANE_LOG", "off,loader=info"); // Runtime() applies it
        LogCapture capture;
        const Runtime runtime;
        const auto selection = runtime.select();
        CHECK(selection.device.id() == "fakegpu_a:0"); // the best device: nothing matched
        CHECK(selection.reason.find("nothing in BACKPLANE_DEVICE matched") != std::string::npos);
        CHECK(selection.reason.find("devices.prefer") == std::string::npos);
        CHECK(selection.reason.find(file.path.string()) == std::string::npos);
        CHECK(capture.contains("nothing in BACKPLANE_DEVICE matched"));
        const auto report = nlohmann::json::parse(runtime.reportJson());
        CHECK(report["selection"]["reason"].get<std::string>().find("BACKPLANE_DEVICE") !=
              std::string::npos);
    }
    {
        // Without the variable, the file's own preference is named with the file.
        const Runtime runtime;
        const auto selection = runtime.select();
        CHECK(selection.device.id() == "fakecpu:0");
        CHECK(selection.reason.find(file.path.string() + " devices.prefer") != std::string::npos);
    }
}

TEST_CASE("a required preference from BACKPLANE_DEVICE names the variable when nothing matches") {
    const ScopedConfigFile file(
        R"({"devices": {"prefer": ["fakecpu"], "required": true}, "cache": {"enabled": false}})");
    const ScopedEnv config("BACKPLANE_CONFIG", file.path.string());
    const ScopedEnv device("BACKPLANE_DEVICE", "fakegpu_a:7");
    const Runtime runtime;
    try {
        runtime.select();
        FAIL("select() should have thrown");
    } catch (const Error &e) {
        CHECK(codeOf(e) == "no_matching_device");
        const std::string message = e.what();
        CHECK(message.find("required selection (BACKPLANE_DEVICE)") != std::string::npos);
        CHECK(message.find("devices.prefer") == std::string::npos);
    }
    // The plugins the variable does not name still load: `required` governs selection only.
    bool found = false;
    for (const auto &d : runtime.devices())
        for (const auto &r : d.routes) found = found || r.id() == "fakegpu_b:0";
    CHECK(found);
}

TEST_CASE("a loaded plugin reports its table's ABI and version, not its manifest's") {
    // newer_minor's manifest declares ABI 1.3; its table says 1.7 and version 0.2.0. Probed in
    // this process, in backplane-probe, and from the probe cache: the report is the table's.
    const std::filesystem::path cache =
        std::filesystem::temp_directory_path() /
        ("backplane_runtime_test_cache_" + std::to_string(::getpid()));
    std::error_code ec;
    std::filesystem::remove_all(cache, ec);
    for (const std::string how : {"in_process", "isolated", "cached"}) {
        CAPTURE(how);
        Config config = fixtureConfig();
        config.probeMode =
            how == "in_process" ? backplane::ProbeMode::InProcess : backplane::ProbeMode::Isolated;
        config.cacheEnabled = how != "in_process";
        config.cacheDir = cache;
        const Runtime runtime(config);
        const auto &report = reportNamed(runtime, "newer_minor");
        CHECK(std::string(toString(report.state)) == "loaded");
        CHECK(report.probe == how);
        CHECK(report.abiMajor == 1);
        CHECK(report.abiMinor == 7);
        CHECK(report.version == "0.2.0");
        const auto json = nlohmann::json::parse(runtime.reportJson());
        for (const auto &p : json["plugins"])
            if (p["name"] == "newer_minor" && p["state"] == "loaded") {
                CHECK(p["abi_version"] == "1.7");
                CHECK(p["version"] == "0.2.0");
            }
    }
    std::filesystem::remove_all(cache, ec);
}

TEST_CASE("a plugin opened but not loaded reports what its table says") {
    for (const std::string how : {"in_process", "isolated"}) {
        CAPTURE(how);
        Config config = fixtureConfig();
        config.probeMode =
            how == "in_process" ? backplane::ProbeMode::InProcess : backplane::ProbeMode::Isolated;
        const Runtime runtime(config);
        // Its manifest says 1.0, its table 2.0: the version field of a table of another ABI
        // major is not read.
        const auto &liar = reportNamed(runtime, "abi_liar");
        CHECK(std::string(toString(liar.state)) == "abi_mismatch");
        CHECK(liar.abiMajor == 2);
        CHECK(liar.version.empty());
        const auto &init = reportNamed(runtime, "init_fails");
        CHECK(std::string(toString(init.state)) == "init_failed");
        CHECK(init.version == "0.1.0");
        const auto &small = reportNamed(runtime, "small_table");
        CHECK(std::string(toString(small.state)) == "invalid_table");
        CHECK(small.version == "0.2.0");
        // Never opened: the manifest's ABI, no version.
        const auto &two = reportNamed(runtime, "abi_two");
        CHECK(two.abiMajor == 2);
        CHECK(two.version.empty());
    }
}
