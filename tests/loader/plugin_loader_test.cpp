// Tests of plugin discovery, manifests, filtering before dlopen and per-plugin states.
// Internal test: uses core/src headers (backplane_internal_dep).
#include "loader/plugin_loader.hpp"
#include "loader/plugin_manifest.hpp"
#include "loader/plugin_probe.hpp"
#include "plugin/device_info.hpp"

#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <nlohmann/json.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <sys/wait.h>
#include <unistd.h>

namespace fs = std::filesystem;
using backplane::Config;
using backplane::PluginReport;

namespace {

Config fixtureConfig() {
    Config config;
    config.pluginPathOverride = {FIXTURE_DIR};
    config.cacheEnabled = false;
    return config;
}

const PluginReport &reportOf(const backplane::detail::LoadedPlugins &loaded,
                             const std::string &name) {
    const auto it = std::find_if(loaded.reports.begin(), loaded.reports.end(),
                                 [&](const PluginReport &r) { return r.name == name; });
    REQUIRE_MESSAGE(it != loaded.reports.end(), "no report for " << name);
    return *it;
}

const PluginReport &reportOfManifest(const backplane::detail::LoadedPlugins &loaded,
                                     const std::string &file) {
    const auto it = std::find_if(loaded.reports.begin(), loaded.reports.end(),
                                 [&](const PluginReport &r) {
                                     return r.manifest.filename() == file;
                                 });
    REQUIRE_MESSAGE(it != loaded.reports.end(), "no report for manifest " << file);
    return *it;
}

/// The report's state by its stable name (doctest cannot print the enum).
std::string stateOf(const PluginReport &report) { return backplane::toString(report.state); }

bool mapped(const std::string &fileName) {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line))
        if (line.size() >= fileName.size() &&
            line.compare(line.size() - fileName.size(), fileName.size(), fileName) == 0)
            return true;
    return false;
}

fs::path tempDir(const std::string &name) {
    const fs::path dir = fs::temp_directory_path() /
                         ("backplane-loader-test-" + name + "-" + std::to_string(getpid()));
    fs::remove_all(dir);
    fs::create_directories(dir);
    return dir;
}

} // namespace

TEST_CASE("reads a well-formed manifest and resolves the library next to it") {
    const auto m = backplane::detail::readManifest(fs::path(FIXTURE_DIR) / "fakegpu_a.json");
    CHECK(m.name == "fakegpu_a");
    CHECK(m.backend == "fake");
    CHECK(m.abiMajor == 1);
    CHECK(m.abiMinor == 0);
    CHECK(m.library == fs::path(FIXTURE_DIR) / "fakegpu_a.so");
}

TEST_CASE("rejects manifests with missing or mistyped fields, naming the file and JSON path") {
    using backplane::detail::ManifestError;
    using backplane::detail::readManifest;
    CHECK_THROWS_WITH_AS(readManifest(fs::path(FIXTURE_DIR) / "bad_missing_name.json"),
                         doctest::Contains("bad_missing_name.json: /name: missing"),
                         ManifestError);
    CHECK_THROWS_WITH_AS(readManifest(fs::path(FIXTURE_DIR) / "bad_abi_type.json"),
                         doctest::Contains("/abi_version: expected a string, got number"),
                         ManifestError);
    CHECK_THROWS_WITH_AS(readManifest(fs::path(FIXTURE_DIR) / "bad_syntax.json"),
                         doctest::Contains("not valid JSON"), ManifestError);
}

TEST_CASE("refuses plugin names that are not plain (they become directory names)") {
    using backplane::detail::ManifestError;
    using backplane::detail::parseManifest;
    const auto manifest = [](const std::string &name) {
        return R"({"name": ")" + name +
               R"(", "library": "x.so", "abi_version": "1.0", "backend": "x", "description": ""})";
    };
    CHECK(parseManifest(manifest("good_name-1.0"), "/m/a.json").name == "good_name-1.0");
    // Before the check, this name made the loader create /tmp/escaped outside the cache.
    CHECK_THROWS_WITH_AS(parseManifest(manifest("../../../../tmp/escaped"), "/m/a.json"),
                         doctest::Contains("/m/a.json: /name: \"../../../../tmp/escaped\" is "
                                           "not a plugin name"),
                         ManifestError);
    CHECK_THROWS_AS(parseManifest(manifest("a\\u001b[31mred"), "/m/a.json"), ManifestError);
    CHECK_THROWS_AS(parseManifest(manifest(std::string(65, 'a')), "/m/a.json"), ManifestError);
}

TEST_CASE("finds manifests of a directory in name order, each file once") {
    const auto files = backplane::detail::findManifests(
        {FIXTURE_DIR, fs::path(FIXTURE_DIR) / "fakecpu.json", "/nonexistent/backplane"});
    REQUIRE(files.size() >= 10);
    CHECK(std::is_sorted(files.begin(), files.end()));
    CHECK(std::count(files.begin(), files.end(), fs::path(FIXTURE_DIR) / "fakecpu.json") == 1);
}

TEST_CASE("gives every fixture its precise state and keeps loading the others") {
    const auto loaded = backplane::detail::loadPlugins(fixtureConfig());

    CHECK(stateOf(reportOf(loaded, "fakegpu_a")) == "loaded");
    CHECK(stateOf(reportOf(loaded, "fakegpu_b")) == "loaded");
    CHECK(reportOf(loaded, "fakegpu_b").deviceCount == 2);
    CHECK(reportOf(loaded, "fakegpu_b").version == "2.0.0");
    CHECK(reportOf(loaded, "fakegpu_b").driverVersion == "fixture-driver 1.0");
    CHECK(stateOf(reportOf(loaded, "fakecpu")) == "loaded");

    const auto &init = reportOf(loaded, "init_fails");
    CHECK(stateOf(init) == "init_failed");
    CHECK(init.reason.find("fixture init refuses to start") != std::string::npos);

    const auto &throws = reportOf(loaded, "probe_throws");
    CHECK(stateOf(throws) == "probe_failed");
    CHECK(throws.reason.find("fixture probe exploded") != std::string::npos);

    const auto &noDriver = reportOf(loaded, "no_driver");
    CHECK(stateOf(noDriver) == "probe_failed");
    CHECK(noDriver.reason.find("no CUDA driver (libcuda.so.1 not found)") != std::string::npos);

    CHECK(stateOf(reportOf(loaded, "no_device")) == "no_device");

    const auto &abiTwo = reportOf(loaded, "abi_two");
    CHECK(stateOf(abiTwo) == "abi_mismatch");
    CHECK(abiTwo.reason.find("ABI 2.0") != std::string::npos);
    CHECK(abiTwo.reason.find("ABI 1.7") != std::string::npos);

    const auto &liar = reportOf(loaded, "abi_liar");
    CHECK(stateOf(liar) == "abi_mismatch");
    CHECK(liar.reason.find("built for plugin ABI 2.") != std::string::npos);

    const auto &newer = reportOf(loaded, "newer_minor");
    CHECK(stateOf(newer) == "loaded");
    CHECK(newer.abiMinor == 7);

    CHECK(stateOf(reportOf(loaded, "small_table")) == "invalid_table");
    CHECK(stateOf(reportOf(loaded, "optional_missing")) == "loaded");
    CHECK(stateOf(reportOf(loaded, "no_entry")) == "entry_missing");

    const auto &notLib = reportOf(loaded, "not_a_library");
    CHECK(stateOf(notLib) == "library_load_failed");
    CHECK(notLib.reason.find("not_a_library.so") != std::string::npos);

    const auto &missingFile = reportOf(loaded, "missing_library_file");
    CHECK(stateOf(missingFile) == "library_load_failed");
    CHECK(missingFile.reason.find("does_not_exist.so does not exist") != std::string::npos);

    const auto &badName = reportOfManifest(loaded, "bad_missing_name.json");
    CHECK(stateOf(badName) == "manifest_invalid");
    CHECK(badName.reason.find("/name") != std::string::npos);
    CHECK(stateOf(reportOfManifest(loaded, "bad_abi_type.json")) == "manifest_invalid");
    CHECK(stateOf(reportOfManifest(loaded, "bad_syntax.json")) == "manifest_invalid");

    const auto &shadow = reportOfManifest(loaded, "zz_fakecpu_again.json");
    CHECK(stateOf(shadow) == "shadowed");
    CHECK(shadow.reason.find("fakecpu.json") != std::string::npos);

    // Every manifest ends in exactly one report.
    CHECK(loaded.reports.size() ==
          backplane::detail::findManifests(loaded.searchPath).size());
    // 1 + 2 + 1 devices from the fake GPUs/CPU, one each from newer_minor and optional_missing.
    CHECK(loaded.devices.size() == 6);
    CHECK(loaded.libraries.size() == 5);
}

TEST_CASE("does not dlopen a library whose manifest declares another ABI major") {
    const auto loaded = backplane::detail::loadPlugins(fixtureConfig());
    CHECK(stateOf(reportOf(loaded, "abi_two")) == "abi_mismatch");
    CHECK_FALSE(mapped("/abi_two.so"));
    CHECK_FALSE(mapped("/not_a_library.so"));
}

TEST_CASE("detects functions missing from a plugin's table through PluginLibrary::has") {
    const auto loaded = backplane::detail::loadPlugins(fixtureConfig());
    const auto &library = loaded.libraries.at("optional_missing");
    CHECK_FALSE(library->has(&bp_plugin_api::copy_peer));
    CHECK_FALSE(library->has(&bp_plugin_api::native_handle));
    CHECK(library->has(&bp_plugin_api::kernel_launch));
    CHECK(loaded.libraries.at("fakecpu")->has(&bp_plugin_api::native_handle));
}

TEST_CASE("applies plugins.enable and plugins.disable before opening any library") {
    Config config = fixtureConfig();
    config.pluginPathOverride.push_back(TRIPWIRE_DIR);
    config.pluginDisable = {"tripwire", "fakegpu_b"};
    // The tripwire aborts the process when dlopen'ed: reaching the checks proves it was not.
    const auto loaded = backplane::detail::loadPlugins(config);
    CHECK(stateOf(reportOf(loaded, "tripwire")) == "filtered_out");
    CHECK(reportOf(loaded, "tripwire").reason == "listed in plugins.disable");
    CHECK(stateOf(reportOf(loaded, "fakegpu_b")) == "filtered_out");
    CHECK(stateOf(reportOf(loaded, "fakegpu_a")) == "loaded");
    CHECK_FALSE(mapped("/tripwire.so"));
    CHECK_FALSE(mapped("/fakegpu_b.so"));

    Config only = fixtureConfig();
    only.pluginPathOverride.push_back(TRIPWIRE_DIR);
    only.pluginEnable = {"fakecpu"};
    const auto enabled = backplane::detail::loadPlugins(only);
    CHECK(stateOf(reportOf(enabled, "fakecpu")) == "loaded");
    CHECK(stateOf(reportOf(enabled, "tripwire")) == "filtered_out");
    CHECK(stateOf(reportOf(enabled, "fakegpu_a")) == "filtered_out");
    CHECK(reportOf(enabled, "fakegpu_a").reason.find("plugins.enable") != std::string::npos);
    CHECK(enabled.devices.size() == 1);
}

TEST_CASE("a required preference governs selection only: every other plugin still loads") {
    // Issue 26: `required: true` used to keep the plugins its selectors did not name closed, so
    // devices the config did not mention disappeared from the program. plugins.enable is what
    // restricts loading (the case above).
    Config config = fixtureConfig();
    config.devicePreference = {"fakegpu_a:0", "fakecpu"};
    config.deviceRequired = true;
    const auto loaded = backplane::detail::loadPlugins(config);
    CHECK(stateOf(reportOf(loaded, "fakegpu_a")) == "loaded");
    CHECK(stateOf(reportOf(loaded, "fakecpu")) == "loaded");
    CHECK(stateOf(reportOf(loaded, "fakegpu_b")) == "loaded");
}

TEST_CASE("reports the dynamic loader's message for a library whose dependency is missing") {
    // meson test puts the stub's directory in LD_LIBRARY_PATH, which ld.so reads once at start:
    // run this case again in a child process without it.
    if (const char *ld = std::getenv("LD_LIBRARY_PATH");
        ld != nullptr && std::string(ld).find(MISSING_DEP_DIR) != std::string::npos) {
        std::string kept;
        std::istringstream dirs(ld);
        for (std::string dir; std::getline(dirs, dir, ':');)
            if (dir != MISSING_DEP_DIR) kept += (kept.empty() ? "" : ":") + dir;
        const pid_t child = fork();
        REQUIRE(child >= 0);
        if (child == 0) {
            setenv("LD_LIBRARY_PATH", kept.c_str(), 1);
            execl("/proc/self/exe", "loader_test",
                  "--test-case=reports the dynamic loader's message*", "--no-version=true",
                  static_cast<char *>(nullptr));
            _exit(127);
        }
        int status = 0;
        waitpid(child, &status, 0);
        CHECK_MESSAGE((WIFEXITED(status) && WEXITSTATUS(status) == 0),
                      "the re-run without the stub's directory failed; see its output above");
        return;
    }
    const fs::path dir = tempDir("missing-dep");
    fs::copy_file(fs::path(MISSING_DEP_DIR) / "missing_dep.so", dir / "missing_dep.so");
    fs::copy_file(fs::path(MISSING_DEP_DIR) / "missing_dep.json", dir / "missing_dep.json");
    Config config;
    config.pluginPathOverride = {dir};
    config.cacheEnabled = false;
    const auto loaded = backplane::detail::loadPlugins(config);
    const auto &report = reportOf(loaded, "missing_dep");
    CHECK(stateOf(report) == "library_load_failed");
    CHECK(report.reason.find("libbp_missing_dep.so") != std::string::npos);
    MESSAGE("loader said: " << report.reason);

    // In its build directory, next to the stub, the same fixture loads.
    Config inPlace;
    inPlace.pluginPathOverride = {MISSING_DEP_DIR};
    inPlace.cacheEnabled = false;
    CHECK(stateOf(reportOf(backplane::detail::loadPlugins(inPlace), "missing_dep")) == "loaded");
    fs::remove_all(dir);
}

TEST_CASE("searches the override, then plugins.paths, and skips the defaults when overridden") {
    Config config;
    config.pluginPathOverride = {"/a", "/b"};
    config.pluginPaths = {"/c"};
    CHECK(backplane::detail::pluginSearchPath(config) == std::vector<fs::path>{"/a", "/b", "/c"});
}

TEST_CASE("finds the build tree's plugins when libbackplane runs from the build tree") {
    Config config;
    config.pluginPaths = {"/c"};
    const auto path = backplane::detail::pluginSearchPath(config);
    REQUIRE(!path.empty());
    CHECK(path.front() == "/c");
    const fs::path hostDir = fs::path(PROJECT_BUILD_ROOT) / "plugins" / "host";
    if (fs::exists(hostDir)) CHECK(std::find(path.begin(), path.end(), hostDir) != path.end());
    for (const auto &p : path) {
        const bool inBuildTree = p.string().rfind(PROJECT_BUILD_ROOT, 0) == 0 || p == "/c";
        CHECK_MESSAGE(inBuildTree, p << " is outside the build tree");
    }
    if (fs::exists(hostDir / "host.json")) {
        config.cacheEnabled = false;
        const auto loaded = backplane::detail::loadPlugins(config);
        const bool found = std::any_of(loaded.reports.begin(), loaded.reports.end(),
                                       [](const PluginReport &r) { return r.name == "host"; });
        CHECK(found);
    } else {
        MESSAGE("no " << (hostDir / "host.json") << " in this build: host discovery unchecked");
    }
}

// ---- kernel features (ABI 1.4) in device descriptions -------------------------------------------

namespace {

/// A description a plugin might fill, with struct_size as it wrote it back.
bp_device_info describedAs(size_t structSize) {
    bp_device_info info{};
    std::strcpy(info.name, "test device");
    info.binding_alignment = 4;
    info.struct_size = structSize;
    return info;
}

} // namespace

TEST_CASE("a device_info of ABI 1.3's size gets the kernel features ABI 1.3 kernels had") {
    using backplane::ElementType;
    // 1.3's struct ended in 4 bytes of padding where element_storage now lies: whatever a 1.3
    // plugin left there must not count.
    static_assert(backplane::detail::kDeviceInfoSize13 > offsetof(bp_device_info, element_storage));
    bp_device_info info = describedAs(backplane::detail::kDeviceInfoSize13);
    info.element_storage = ~0u;
    info.element_arithmetic = ~0u;
    const backplane::KernelFeatures f =
        backplane::detail::toDeviceInfo("old", 0, info).features;
    for (const ElementType t : {ElementType::Bool, ElementType::I32, ElementType::U32,
                                ElementType::F32}) {
        CAPTURE(backplane::toString(t));
        CHECK(f.stores(t));
        CHECK(f.computes(t));
    }
    for (const ElementType t : {ElementType::I8, ElementType::I16, ElementType::I64,
                                ElementType::U64, ElementType::F16, ElementType::BF16,
                                ElementType::F64}) {
        CAPTURE(backplane::toString(t));
        CHECK_FALSE(f.stores(t));
        CHECK_FALSE(f.computes(t));
    }
    CHECK(f.addsAtomically(ElementType::I32));
    CHECK(f.addsAtomically(ElementType::U32));
    CHECK_FALSE(f.addsAtomically(ElementType::F32));
    CHECK(f.atomicBitsOn(ElementType::U32));
    CHECK_FALSE(f.atomicBitsOn(ElementType::F32));
    CHECK(f.vectorWidths == 0);
    CHECK_FALSE(f.loadsVectorsOf(2));
    CHECK(f.matrixShapes.empty());
    CHECK(f == backplane::detail::kernelFeaturesBeforeAbi14());
    // Still a 1.3 size one byte short of the whole group.
    CHECK(backplane::detail::toDeviceInfo("old", 0,
                                          describedAs(backplane::detail::kDeviceInfoSize14 - 1))
              .features == backplane::detail::kernelFeaturesBeforeAbi14());
}

TEST_CASE("a 1.4 device_info's kernel features are taken as reported, unknown bits dropped") {
    using backplane::ElementType;
    bp_device_info info = describedAs(sizeof(bp_device_info));
    info.element_storage = (1u << BP_ELEMENT_F64) | (1u << BP_ELEMENT_F32) | (1u << 20);
    info.element_arithmetic = 1u << BP_ELEMENT_F32;
    info.element_atomic_add = 1u << BP_ELEMENT_F32;
    info.element_atomic_bits = 0;
    info.vector_widths = (1u << 4) | (1u << 3) | 1u;
    info.matrix_shape_count = 40; // more than the array: the core reads 16
    for (auto &s : info.matrix_shapes) s = {16, 16, 16, BP_ELEMENT_F16, BP_ELEMENT_F16,
                                            BP_ELEMENT_F32, 0};
    info.matrix_shapes[1].k = 0;                // unusable: dropped
    info.matrix_shapes[2].a = BP_ELEMENT_F64 + 1; // no such type: dropped
    const backplane::KernelFeatures f = backplane::detail::toDeviceInfo("new", 0, info).features;
    CHECK(f.storage == ((1u << BP_ELEMENT_F64) | (1u << BP_ELEMENT_F32)));
    CHECK(f.computes(ElementType::F32));
    CHECK_FALSE(f.computes(ElementType::F64));
    CHECK_FALSE(f.stores(ElementType::I32)); // as reported (conformance would flag it)
    CHECK(f.vectorWidths == (1u << 4));
    CHECK(f.loadsVectorsOf(4));
    CHECK_FALSE(f.loadsVectorsOf(3));
    REQUIRE(f.matrixShapes.size() == 14);
    CHECK(f.matrixShapes[0] ==
          backplane::MatrixShape{16, 16, 16, ElementType::F16, ElementType::F16, ElementType::F32});
    CHECK(f.describe() == "types f32 f64; native f32; atomic add f32; atomic bits none; vectors "
                          "4; matrix 16x16x16 16x16x16 16x16x16 16x16x16 16x16x16 16x16x16 "
                          "16x16x16 16x16x16 16x16x16 16x16x16 16x16x16 16x16x16 16x16x16 "
                          "16x16x16 f16*f16+f32");
}

TEST_CASE("kernel features survive the probe answer, and an answer without them gets 1.3's") {
    using backplane::ElementType;
    backplane::detail::ProbeOutcome outcome;
    outcome.state = backplane::PluginState::Loaded;
    outcome.deviceCount = 1;
    backplane::DeviceInfo device;
    device.backend = "gpu";
    device.name = "answered";
    device.features.storage = (1u << 13) - 1;
    device.features.arithmetic = 1u << BP_ELEMENT_BF16;
    device.features.atomicAdd = 1u << BP_ELEMENT_F64;
    device.features.atomicBits = 1u << BP_ELEMENT_U64;
    device.features.vectorWidths = (1u << 2) | (1u << 8);
    device.features.matrixShapes = {
        {16, 16, 16, ElementType::BF16, ElementType::BF16, ElementType::F32},
        {32, 8, 16, ElementType::F16, ElementType::F16, ElementType::F32}};
    outcome.devices.push_back(device);
    nlohmann::json answer = backplane::detail::outcomeJson(outcome);
    const auto back = backplane::detail::outcomeFromJson(answer, "gpu");
    REQUIRE(back.devices.size() == 1);
    CHECK(back.devices[0].features == device.features);

    answer["devices"][0].erase("kernel_features");
    CHECK(backplane::detail::outcomeFromJson(answer, "gpu").devices[0].features ==
          backplane::detail::kernelFeaturesBeforeAbi14());

    answer["devices"][0]["kernel_features"] =
        backplane::detail::outcomeJson(outcome)["devices"][0]["kernel_features"];
    answer["devices"][0]["kernel_features"]["matrix_shapes"][0][2] = 0;
    CHECK_THROWS_WITH_AS(backplane::detail::outcomeFromJson(answer, "gpu"),
                         doctest::Contains("matrix_shapes"), backplane::Error);
}
