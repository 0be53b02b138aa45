// Tests of the config file reader, the environment overrides and the config lookup order.
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/log.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <string>
#include <unistd.h>

namespace fs = std::filesystem;
using backplane::Config;
using backplane::Error;
using backplane::readConfigFile;

namespace {

/// A scratch directory removed at the end of the test.
struct TempDir {
    fs::path path;
    TempDir() {
        static int counter = 0;
        path = fs::temp_directory_path() / ("backplane-config-test-" + std::to_string(getpid()) +
                                            "-" + std::to_string(counter++));
        fs::remove_all(path);
        fs::create_directories(path);
    }
    ~TempDir() { fs::remove_all(path); }
    fs::path write(const std::string &name, const std::string &text) const {
        std::ofstream(path / name) << text;
        return path / name;
    }
};

/// Sets an environment variable for one scope.
struct ScopedEnv {
    std::string name;
    std::optional<std::string> old;
    ScopedEnv(std::string n, const char *value) : name(std::move(n)) {
        if (const char *v = std::getenv(name.c_str())) old = v;
        if (value) setenv(name.c_str(), value, 1);
        else unsetenv(name.c_str());
    }
    ~ScopedEnv() {
        if (old) setenv(name.c_str(), old->c_str(), 1);
        else unsetenv(name.c_str());
    }
};

/// The message of the Error(Config) that reading `text` throws ("" if none).
std::string configError(const std::string &text) {
    TempDir dir;
    const fs::path file = dir.write("backplane.json", text);
    try {
        readConfigFile(file);
    } catch (const Error &e) {
        CHECK(std::string(toString(e.code())) == "config");
        std::string message = e.what();
        const std::string prefix = file.string() + ": ";
        CHECK_MESSAGE(message.rfind(prefix, 0) == 0, "message does not name the file: " << message);
        if (message.rfind(prefix, 0) == 0) message = message.substr(prefix.size());
        return message;
    }
    return "";
}

} // namespace

TEST_CASE("reads every key of the config file") {
    TempDir dir;
    const fs::path file = dir.write("backplane.json", R"({
      "devices": {"prefer": ["fakegpu_a:0", "*:gpu", "host"], "required": true,
                  "backend_priority": ["vulkan", "cuda"], "reopen_after_fault": 3},
      "plugins": {"paths": ["plugins", "/opt/bp/plugins"], "enable": ["a", "b"], "disable": ["c"],
                  "options": {"vulkan": {"validation": true}}},
      "streams": {"max_streams": 16, "scheduler": "sequential", "max_tasks": 4},
      "memory": {"staging_chunk_bytes": 1048576, "staging_limit_bytes": 4194304,
                 "staging_ring_depth": 4, "staging_copy_threads": 6,
                 "staging_streaming_stores": false,
                 "max_page_bytes": 268435456, "release_idle_after_ms": 250},
      "cache": {"dir": "cache", "enabled": false},
      "autotune": {"level": "extensive"},
      "log": "info,loader=debug"
    })");
    const Config c = readConfigFile(file);
    CHECK(c.source == file);
    CHECK(c.devicePreference == std::vector<std::string>{"fakegpu_a:0", "*:gpu", "host"});
    CHECK(c.deviceRequired);
    CHECK(c.backendPriority == std::vector<std::string>{"vulkan", "cuda"});
    CHECK(c.reopenAfterFault == 3);
    REQUIRE(c.pluginPaths.size() == 2);
    CHECK(c.pluginPaths[0] == dir.path / "plugins");
    CHECK(c.pluginPaths[1] == "/opt/bp/plugins");
    CHECK(c.pluginEnable == std::vector<std::string>{"a", "b"});
    CHECK(c.pluginDisable == std::vector<std::string>{"c"});
    CHECK(c.pluginOptions.at("vulkan") == R"({"validation":true})");
    CHECK(c.maxStreams == 16);
    CHECK(std::string(toString(c.schedulerMode)) == "sequential");
    CHECK(c.schedulerMaxTasks == 4);
    CHECK(c.stagingChunkBytes == 1048576);
    CHECK(c.maxPageBytes == 268435456);
    CHECK(c.stagingLimitBytes == 4194304);
    CHECK(c.stagingRingDepth == 4);
    CHECK(c.stagingCopyThreads == 6);
    CHECK_FALSE(c.stagingStreamingStores);
    CHECK(c.releaseIdleAfterMs == 250);
    CHECK(c.cacheDir == dir.path / "cache");
    CHECK_FALSE(c.cacheEnabled);
    CHECK(std::string(toString(c.tuneLevel)) == "extensive");
    CHECK(c.logSpec == "info,loader=debug");
    // Reading validates the log spec but does not apply it.
    CHECK(std::string(toString(backplane::log::level(backplane::log::Subsystem::Loader))) == "off");
}

TEST_CASE("an empty object gives the documented defaults") {
    TempDir dir;
    const Config c = readConfigFile(dir.write("backplane.json", "{}"));
    const Config d;
    CHECK(c.devicePreference.empty());
    CHECK_FALSE(c.deviceRequired);
    CHECK(c.backendPriority == d.backendPriority);
    CHECK(c.maxStreams == 128);
    CHECK(c.schedulerMaxTasks == 8);
    CHECK(c.stagingChunkBytes == (8ull << 20));
    CHECK(c.stagingLimitBytes == 0);
    CHECK(c.releaseIdleAfterMs == 1000);
    CHECK(c.cacheEnabled);
    CHECK(std::string(toString(c.tuneLevel)) == "balanced");
}

TEST_CASE("names the file and JSON pointer of every value of the wrong type") {
    CHECK(configError(R"({"devices": {"prefer": ["cuda", 3]}})") ==
          "/devices/prefer/1: expected a string, got number");
    CHECK(configError(R"({"devices": {"prefer": "cuda"}})") ==
          "/devices/prefer: expected an array of strings, got string");
    CHECK(configError(R"({"devices": {"required": "yes"}})") ==
          "/devices/required: expected a boolean, got string");
    CHECK(configError(R"({"devices": {"backend_priority": [true]}})") ==
          "/devices/backend_priority/0: expected a string, got boolean");
    CHECK(configError(R"({"devices": {"reopen_after_fault": 1001}})") ==
          "/devices/reopen_after_fault: expected an integer in [0, 1000], got 1001");
    CHECK(configError(R"({"devices": []})") == "/devices: expected an object, got array");
    CHECK(configError(R"({"plugins": {"paths": [1]}})") ==
          "/plugins/paths/0: expected a string, got number");
    CHECK(configError(R"({"plugins": {"paths": "x"}})") ==
          "/plugins/paths: expected an array of strings, got string");
    CHECK(configError(R"({"plugins": {"enable": [null]}})") ==
          "/plugins/enable/0: expected a string, got null");
    CHECK(configError(R"({"plugins": {"disable": {}}})") ==
          "/plugins/disable: expected an array of strings, got object");
    CHECK(configError(R"({"plugins": {"options": {"cuda": 1}}})") ==
          "/plugins/options/cuda: expected an object, got number");
    CHECK(configError(R"({"plugins": {"options": []}})") ==
          "/plugins/options: expected an object, got array");
    CHECK(configError(R"({"streams": {"max_streams": "8"}})") ==
          "/streams/max_streams: expected an integer, got string");
    CHECK(configError(R"({"streams": {"max_streams": 0}})") ==
          "/streams/max_streams: expected an integer in [1, 65536], got 0");
    CHECK(configError(R"({"streams": {"max_tasks": -1}})") ==
          "/streams/max_tasks: expected an integer in [1, 1048576], got -1");
    CHECK(configError(R"({"streams": {"max_tasks": 1.5}})") ==
          "/streams/max_tasks: expected an integer, got number");
    CHECK(configError(R"({"streams": {"scheduler": 1}})") ==
          "/streams/scheduler: expected a string, got number");
    CHECK(configError(R"({"streams": {"scheduler": "fifo"}})").find(
              "/streams/scheduler: unknown scheduler 'fifo'") == 0);
    CHECK(configError(R"({"memory": {"staging_chunk_bytes": "1M"}})") ==
          "/memory/staging_chunk_bytes: expected an integer, got string");
    CHECK(configError(R"({"memory": {"max_page_bytes": -5}})").find("/memory/max_page_bytes") == 0);
    CHECK(configError(R"({"cache": {"dir": 5}})") == "/cache/dir: expected a string, got number");
    // Review findings: a NUL cut the path silently; 2^64 was "expected an integer, got number".
    CHECK(configError(R"({"cache": {"dir": "/tmp/a\u0000b"}})") ==
          "/cache/dir: a path cannot contain a NUL character (\\u0000)");
    CHECK(configError(R"({"streams": {"max_streams": 18446744073709551616}})").find(
              "/streams/max_streams: expected an integer in [1, 65536], got ") == 0);
    CHECK(configError(R"({"streams": {"max_streams": 18446744073709551616}})").find("out of range") !=
          std::string::npos);
    CHECK(configError(R"({"cache": {"enabled": 1}})") ==
          "/cache/enabled: expected a boolean, got number");
    CHECK(configError(R"({"autotune": {"level": 3}})") ==
          "/autotune/level: expected a string, got number");
    CHECK(configError(R"({"autotune": {"level": "max"}})").find(
              "/autotune/level: unknown level 'max'") == 0);
    CHECK(configError(R"({"log": 1})") == "/log: expected a string, got number");
    CHECK(configError(R"({"log": "loud"})").find("/log: BACKPLANE_LOG: unknown level") == 0);
    CHECK(configError(R"([1, 2])") == "/: expected an object, got array");
}

TEST_CASE("rejects unknown keys and lists the known ones") {
    CHECK(configError(R"({"device": {}})") ==
          "/device: unknown key 'device' (known keys here: devices, plugins, streams, memory, "
          "cache, autotune, log)");
    CHECK(configError(R"({"devices": {"prefered": []}})") ==
          "/devices/prefered: unknown key 'prefered' (known keys here: prefer, required, "
          "backend_priority, reopen_after_fault)");
    CHECK(configError(R"({"plugins": {"path": []}})").find("/plugins/path: unknown key") == 0);
    CHECK(configError(R"({"streams": {"max": 1}})").find("/streams/max: unknown key") == 0);
    CHECK(configError(R"({"memory": {"x": 1}})").find("/memory/x: unknown key") == 0);
    CHECK(configError(R"({"cache": {"x": 1}})").find("/cache/x: unknown key") == 0);
    CHECK(configError(R"({"autotune": {"x": 1}})").find("/autotune/x: unknown key") == 0);
}

TEST_CASE("rejects malformed JSON and malformed device selectors") {
    CHECK(configError(R"({"devices": )").find("/devices: not valid JSON") == 0);
    CHECK(configError(R"({"devices": {"prefer": ["cuda:"]}})").find(
              "/devices/prefer/0: invalid device selector 'cuda:'") == 0);
    CHECK(configError(R"({"devices": {"prefer": ["*:tpu"]}})").find("/devices/prefer/0") == 0);
    CHECK(configError(R"({"devices": {"prefer": ["vulkan:xyz"]}})").find(
              "neither a device index nor a UUID") != std::string::npos);
}

TEST_CASE("hostile JSON is a config error naming the file and pointer, never an escape") {
    // nlohmann throws out_of_range (not parse_error) for a number no double holds.
    CHECK(configError(R"({"memory": {"max_page_bytes": 1e999}})") ==
          "/memory/max_page_bytes: number overflow parsing '1e999' (line 1, column 31)");
    CHECK(configError(R"({"devices": {"prefer": ["a", -1e999]}})")
              .find("/devices/prefer/1: number overflow parsing '-1e999'") == 0);
    CHECK(configError(std::string("{\"log\": \"\xff\"}")).find("/log: not valid JSON: syntax error") == 0);

    // Deep nesting is refused before parsing, with the pointer of the level that went too deep.
    std::string deep = R"({"plugins": {"options": {"host": )";
    for (int i = 0; i < 100000; ++i) deep += "[";
    const std::string message = configError(deep);
    CHECK(message.find("/plugins/options/host/0/0/") == 0);
    CHECK(message.find("nesting deeper than 64 levels") != std::string::npos);

    // Size is checked before reading.
    const std::string big = "{\"log\": \"" + std::string(2u << 20, 'a') + "\"}";
    CHECK(configError(big).find("bytes, more than the 1,048,576 bytes accepted here") !=
          std::string::npos);

    // A duplicate key would let the last one win silently; a NUL byte would end the input early.
    CHECK(configError(R"({"plugins": {"probe": "in_process"}, "plugins": {}})")
              .find("/plugins: duplicate key 'plugins'") == 0);
    CHECK(configError(std::string("{\"log\": \"info\"}\0{\"garbage\"", 26))
              .find("/: a NUL byte at offset 15") == 0);

    // Not a regular file: refused without blocking on it.
    TempDir dir;
    CHECK_THROWS_WITH_AS(readConfigFile(dir.path), doctest::Contains("not a regular file"), Error);
}

TEST_CASE("plugins.probe and plugins.probe_timeout_ms are read and checked") {
    TempDir dir;
    const auto config = readConfigFile(dir.write(
        "backplane.json", R"({"plugins": {"probe": "in_process", "probe_timeout_ms": 2500}})"));
    CHECK(std::string(toString(config.probeMode)) == "in_process");
    CHECK(config.probeTimeoutMs == 2500);
    CHECK(configError(R"({"plugins": {"probe": "forked"}})") ==
          "/plugins/probe: unknown probe mode 'forked' (use isolated or in_process)");
    CHECK(configError(R"({"plugins": {"probe_timeout_ms": 5}})") ==
          "/plugins/probe_timeout_ms: expected an integer in [100, 600000], got 5");
}

TEST_CASE("a missing file is a config error naming it") {
    CHECK_THROWS_WITH_AS(readConfigFile("/nonexistent/backplane.json"),
                         doctest::Contains("/nonexistent/backplane.json: cannot open"), Error);
}

TEST_CASE("environment variables override single keys") {
    Config c;
    c.devicePreference = {"cuda"};
    const ScopedEnv device("BACKPLANE_DEVICE", "fakegpu_b:1, *:cpu");
    const ScopedEnv path("BACKPLANE_PLUGIN_PATH", "/p1:/p2/x.json");
    const ScopedEnv cache("BACKPLANE_CACHE_DIR", "/tmp/bp-cache");
    const ScopedEnv tune("BACKPLANE_AUTOTUNE", "off");
    const ScopedEnv streams("BACKPLANE_MAX_STREAMS", "4");
    const ScopedEnv logSpec("BACKPLANE_LOG", "off,tool=error");
    backplane::applyEnvironment(c);
    CHECK(c.devicePreference == std::vector<std::string>{"fakegpu_b:1", "*:cpu"});
    CHECK(c.pluginPathOverride == std::vector<fs::path>{"/p1", "/p2/x.json"});
    CHECK(c.cacheDir == "/tmp/bp-cache");
    CHECK(std::string(toString(c.tuneLevel)) == "off");
    CHECK(c.maxStreams == 4);
    CHECK(c.logSpec == "off,tool=error");
}

TEST_CASE("bad environment values are config errors naming the variable") {
    Config c;
    {
        const ScopedEnv env("BACKPLANE_MAX_STREAMS", "many");
        CHECK_THROWS_WITH_AS(backplane::applyEnvironment(c),
                             doctest::Contains("BACKPLANE_MAX_STREAMS"), Error);
    }
    {
        const ScopedEnv env("BACKPLANE_AUTOTUNE", "fast");
        CHECK_THROWS_WITH_AS(backplane::applyEnvironment(c),
                             doctest::Contains("BACKPLANE_AUTOTUNE: unknown level 'fast'"), Error);
    }
    {
        const ScopedEnv env("BACKPLANE_DEVICE", "cuda:0,:1");
        CHECK_THROWS_WITH_AS(backplane::applyEnvironment(c),
                             doctest::Contains("BACKPLANE_DEVICE: invalid device selector"), Error);
    }
    {
        const ScopedEnv env("BACKPLANE_LOG", "loader=chatty");
        CHECK_THROWS_WITH_AS(backplane::applyEnvironment(c), doctest::Contains("BACKPLANE_LOG"),
                             Error);
    }
}

TEST_CASE("finds the config through BACKPLANE_CONFIG, then ./backplane.json, then XDG") {
    TempDir dir;
    const fs::path previous = fs::current_path();
    fs::create_directories(dir.path / "work");
    fs::create_directories(dir.path / "xdg" / "backplane");
    dir.write("xdg/backplane/config.json", R"({"streams": {"max_streams": 3}})");
    dir.write("work/backplane.json", R"({"streams": {"max_streams": 2}})");
    const fs::path explicitFile = dir.write("explicit.json", R"({"streams": {"max_streams": 1}})");
    fs::current_path(dir.path / "work");
    const ScopedEnv xdg("XDG_CONFIG_HOME", (dir.path / "xdg").c_str());
    const ScopedEnv maxStreams("BACKPLANE_MAX_STREAMS", nullptr);
    {
        const ScopedEnv env("BACKPLANE_CONFIG", explicitFile.c_str());
        CHECK(backplane::loadConfig().maxStreams == 1);
    }
    {
        const ScopedEnv env("BACKPLANE_CONFIG", nullptr);
        CHECK(backplane::loadConfig().maxStreams == 2);
        fs::remove(dir.path / "work" / "backplane.json");
        CHECK(backplane::loadConfig().maxStreams == 3);
        fs::remove(dir.path / "xdg" / "backplane" / "config.json");
        CHECK(backplane::loadConfig().maxStreams == 128);
    }
    {
        const ScopedEnv env("BACKPLANE_CONFIG", (dir.path / "missing.json").c_str());
        CHECK_THROWS_WITH_AS(backplane::loadConfig(), doctest::Contains("BACKPLANE_CONFIG"), Error);
    }
    {
        const ScopedEnv env("BACKPLANE_CONFIG", explicitFile.c_str());
        const ScopedEnv override("BACKPLANE_MAX_STREAMS", "9");
        CHECK(backplane::loadConfig().maxStreams == 9);
    }
    fs::current_path(previous);
}

TEST_CASE("prints the effective settings as JSON with the file's keys") {
    Config c;
    c.devicePreference = {"host"};
    c.cacheDir = "/tmp/x";
    const std::string json = backplane::toJson(c);
    CHECK(json.find("\"prefer\": [\n      \"host\"") != std::string::npos);
    CHECK(json.find("\"max_streams\": 128") != std::string::npos);
    CHECK(json.find("\"dir\": \"/tmp/x\"") != std::string::npos);
    CHECK(json.find("\"level\": \"balanced\"") != std::string::npos);
}

TEST_CASE("remembers whether devices.prefer came from the file or from BACKPLANE_DEVICE") {
    TempDir dir;
    const fs::path file = dir.write("backplane.json", R"({"devices": {"prefer": ["host"]}})");
    Config c = readConfigFile(file);
    CHECK(c.devicePreferenceSource == file.string());
    CHECK(backplane::toJson(c).find("\"prefer_source\": \"" + file.string() + "\"") !=
          std::string::npos);
    {
        const ScopedEnv device("BACKPLANE_DEVICE", "fakecpu");
        backplane::applyEnvironment(c);
    }
    CHECK(c.devicePreference == std::vector<std::string>{"fakecpu"});
    CHECK(c.devicePreferenceSource == "BACKPLANE_DEVICE");
    CHECK(backplane::toJson(c).find("\"prefer_source\": \"BACKPLANE_DEVICE\"") !=
          std::string::npos);
    const Config none = readConfigFile(dir.write("none.json", "{}"));
    CHECK(none.devicePreferenceSource.empty());
    CHECK(backplane::toJson(none).find("\"prefer_source\": null") != std::string::npos);
}

TEST_CASE("plugin options against a schema: every problem with its pointer, never a throw") {
    const std::string schema = R"({"type": "object", "additionalProperties": false, "properties": {
        "n": {"type": "integer", "minimum": 1, "maximum": 18446744073709551615},
        "x": {"type": "number", "minimum": -1.5, "maximum": 2},
        "s": {"type": "string", "maxLength": 3, "enum": ["ab", "abc"]},
        "list": {"type": "array", "items": {"type": "integer", "minimum": 0}},
        "inner": {"type": "object", "additionalProperties": false, "properties": {"b": {"type": "boolean"}}},
        "open": {"type": "object"}}})";
    CHECK(backplane::checkPluginOptions(schema, R"({"n": 18446744073709551615, "x": 2, "s": "ab",
        "list": [0, 7], "inner": {"b": true}, "open": {"anything": 1}})", "/o").empty());
    const std::vector<std::string> problems = backplane::checkPluginOptions(
        schema, R"({"n": -3, "x": 2.5, "s": "abcd", "list": [1, -1, "z"], "inner": {"c": 1}, "zz": 0})",
        "/o");
    const auto has = [&](const std::string &text) {
        for (const std::string &p : problems)
            if (p.find(text) != std::string::npos) return true;
        return false;
    };
    CAPTURE(problems.size());
    CHECK(has("/o/n: -3 is less than the minimum 1"));
    CHECK(has("/o/x: 2.5 is more than the maximum 2"));
    CHECK(has("/o/s: a string of 4 bytes, more than 3"));
    CHECK(has("/o/s: \"abcd\" is not one of \"ab\", \"abc\""));
    CHECK(has("/o/list/1: -1 is less than the minimum 0"));
    CHECK(has("/o/list/2: expected an integer, got \"z\""));
    CHECK(has("/o/inner/c: unknown option 'c' (known here: b)"));
    CHECK(has("/o/zz: unknown option 'zz'"));
    CHECK(problems.size() == 8);
    // No schema: nothing to check. A malformed schema or options: one message, no throw.
    CHECK(backplane::checkPluginOptions("", R"({"a": 1})", "/o").empty());
    CHECK(backplane::checkPluginOptions("[1", "{}", "/o").empty()); // the plugin's fault: unchecked
    CHECK(backplane::checkPluginOptions(schema, "{\"n\": 1e999}", "/o").size() == 1);
    const std::string deep = std::string(200, '[') + std::string(200, ']');
    CHECK(backplane::checkPluginOptions(schema, deep, "/o").size() == 1);
    CHECK(backplane::describePluginOptions(schema).find("  inner.b  boolean") != std::string::npos);
}
