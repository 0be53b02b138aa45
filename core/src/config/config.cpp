// Reading the JSON config file, the environment overrides, and printing the effective settings.
#include <backplane/cache.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/log.hpp>

#include "config/config_text.hpp"
#include "input/json_input.hpp"
#include "config/device_selector.hpp"

#include <nlohmann/json.hpp>

#include <array>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <limits>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

namespace backplane {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

constexpr std::array<const char *, 5> kTuneLevelNames = {"off", "minimal", "balanced",
                                                         "extensive", "full"};

std::optional<TuneLevel> parseTuneLevel(const std::string &text) {
    for (size_t i = 0; i < kTuneLevelNames.size(); ++i)
        if (text == kTuneLevelNames[i]) return static_cast<TuneLevel>(i);
    return std::nullopt;
}

std::optional<ProbeMode> parseProbeMode(const std::string &text) {
    if (text == "isolated") return ProbeMode::Isolated;
    if (text == "in_process") return ProbeMode::InProcess;
    return std::nullopt;
}

std::optional<SchedulerMode> parseScheduler(const std::string &text) {
    if (text == "interleave") return SchedulerMode::Interleave;
    if (text == "sequential") return SchedulerMode::Sequential;
    return std::nullopt;
}

/// Checks a log spec without leaving it applied: log::configure is the only parser, so apply it
/// and restore the previous thresholds (configure may have changed some before failing).
void validateLogSpec(const std::string &spec) {
    std::array<log::Level, log::kSubsystemCount> saved{};
    for (int i = 0; i < log::kSubsystemCount; ++i)
        saved[i] = log::level(static_cast<log::Subsystem>(i));
    const auto restore = [&] {
        for (int i = 0; i < log::kSubsystemCount; ++i)
            log::setLevel(static_cast<log::Subsystem>(i), saved[i]);
    };
    try {
        log::configure(spec);
    } catch (...) {
        restore();
        throw;
    }
    restore();
}

/// Walks one parsed file; every error names the file and the JSON pointer of the bad value. An
/// error in one value does not stop the walk: read() collects every error (errors()), leaving
/// each bad value at its default.
class FileReader {
public:
    explicit FileReader(fs::path file) : file_(std::move(file)), dir_(file_.parent_path()) {}

    /// Every error read() found, in file order.
    const std::vector<std::string> &errors() const noexcept { return errors_; }

    [[noreturn]] void fail(const std::string &pointer, const std::string &what) const {
        throw Error(ErrorCode::Config, file_.string() + ": " + (pointer.empty() ? "/" : pointer) +
                                           ": " + what);
    }

    [[noreturn]] void wrongType(const Json &value, const std::string &pointer,
                                const std::string &expected) const {
        fail(pointer, "expected " + expected + ", got " + value.type_name());
    }

    /// Runs one read of a value (or of a section); its Error(Config) is recorded and the walk
    /// goes on.
    template <class F> void attempt(F &&read) const {
        try {
            read();
        } catch (const Error &e) {
            if (e.code() != ErrorCode::Config) throw;
            errors_.emplace_back(e.what());
        }
    }

    /// Records an error for every key of `object` not in `known`, listing the known ones.
    void checkKeys(const Json &object, const std::string &pointer,
                   std::initializer_list<const char *> known) const {
        for (const auto &item : object.items()) {
            // A named copy: lambdas may not capture structured bindings before clang 16 (the
            // fuzz build uses clang 14).
            const std::string key = item.key();
            bool found = false;
            for (const char *k : known) found = found || key == k;
            if (found) continue;
            std::string list;
            for (const char *k : known) list += std::string(list.empty() ? "" : ", ") + k;
            attempt([&] {
                fail(pointer + "/" + detail::pointerToken(key),
                     "unknown key '" + key + "' (known keys here: " + list + ")");
            });
        }
    }

    const Json &object(const Json &value, const std::string &pointer) const {
        if (!value.is_object()) wrongType(value, pointer, "an object");
        return value;
    }

    std::string string(const Json &value, const std::string &pointer) const {
        if (!value.is_string()) wrongType(value, pointer, "a string");
        return value.get<std::string>();
    }

    bool boolean(const Json &value, const std::string &pointer) const {
        if (!value.is_boolean()) wrongType(value, pointer, "a boolean");
        return value.get<bool>();
    }

    uint64_t unsignedInt(const Json &value, const std::string &pointer, uint64_t min,
                         uint64_t max) const {
        // An integer past 2^64 - 1 parses as a float: say it is out of range, not "a number".
        if (value.is_number_float()) {
            const double d = value.get<double>();
            if (std::isfinite(d) && std::floor(d) == d)
                fail(pointer, "expected an integer in [" + std::to_string(min) + ", " +
                                  std::to_string(max) + "], got " + value.dump() +
                                  " (out of range)");
        }
        if (!value.is_number_integer()) wrongType(value, pointer, "an integer");
        if (value.is_number_unsigned()) {
            const uint64_t v = value.get<uint64_t>();
            if (v >= min && v <= max) return v;
        }
        fail(pointer, "expected an integer in [" + std::to_string(min) + ", " +
                          std::to_string(max) + "], got " + value.dump());
    }

    std::vector<std::string> strings(const Json &value, const std::string &pointer) const {
        if (!value.is_array()) wrongType(value, pointer, "an array of strings");
        std::vector<std::string> out;
        for (size_t i = 0; i < value.size(); ++i)
            out.push_back(string(value[i], pointer + "/" + std::to_string(i)));
        return out;
    }

    /// A path from the file: relative ones are relative to the file's directory.
    fs::path path(const Json &value, const std::string &pointer) const {
        const std::string text = string(value, pointer);
        if (text.empty()) fail(pointer, "expected a path, got an empty string");
        // The system cuts a path at its first NUL: "/tmp/a\u0000b" would be /tmp/a, silently.
        if (text.find('\0') != std::string::npos)
            fail(pointer, "a path cannot contain a NUL character (\\u0000)");
        const fs::path p = text;
        return p.is_absolute() ? p : (dir_ / p).lexically_normal();
    }

    Config read(const Json &root) const {
        Config c;
        c.source = file_;
        object(root, "");
        checkKeys(root, "", {"devices", "plugins", "streams", "memory", "cache", "autotune", "log"});
        if (root.contains("devices"))
            attempt([&] { readDevices(object(root["devices"], "/devices"), c); });
        if (root.contains("plugins"))
            attempt([&] { readPlugins(object(root["plugins"], "/plugins"), c); });
        if (root.contains("streams"))
            attempt([&] { readStreams(object(root["streams"], "/streams"), c); });
        if (root.contains("memory"))
            attempt([&] { readMemory(object(root["memory"], "/memory"), c); });
        if (root.contains("cache")) {
            attempt([&] {
                const Json &m = object(root["cache"], "/cache");
                checkKeys(m, "/cache", {"dir", "enabled"});
                if (m.contains("dir")) attempt([&] { c.cacheDir = path(m["dir"], "/cache/dir"); });
                if (m.contains("enabled"))
                    attempt([&] { c.cacheEnabled = boolean(m["enabled"], "/cache/enabled"); });
            });
        }
        if (root.contains("autotune")) {
            attempt([&] {
                const Json &m = object(root["autotune"], "/autotune");
                checkKeys(m, "/autotune", {"level"});
                if (!m.contains("level")) return;
                const std::string text = string(m["level"], "/autotune/level");
                const auto level = parseTuneLevel(text);
                if (!level)
                    fail("/autotune/level", "unknown level '" + text +
                                                "' (use off, minimal, balanced, extensive or full)");
                c.tuneLevel = *level;
            });
        }
        if (root.contains("log")) {
            attempt([&] {
                const std::string spec = string(root["log"], "/log");
                try {
                    validateLogSpec(spec);
                } catch (const Error &e) {
                    fail("/log", e.what());
                }
                c.logSpec = spec;
            });
        }
        return c;
    }

private:
    void readMemory(const Json &m, Config &c) const {
        checkKeys(m, "/memory",
                  {"staging_chunk_bytes", "staging_limit_bytes", "staging_ring_depth",
                   "staging_copy_threads", "staging_streaming_stores", "max_page_bytes",
                   "slice_cache", "release_idle_after_ms"});
        constexpr uint64_t kAny = std::numeric_limits<uint64_t>::max();
        auto count = [&](const char *key, auto &out, uint64_t min, uint64_t max) {
            if (!m.contains(key)) return;
            attempt([&] {
                out = static_cast<std::remove_reference_t<decltype(out)>>(
                    unsignedInt(m[key], std::string("/memory/") + key, min, max));
            });
        };
        auto flag = [&](const char *key, bool &out) {
            if (m.contains(key))
                attempt([&] { out = boolean(m[key], std::string("/memory/") + key); });
        };
        count("staging_chunk_bytes", c.stagingChunkBytes, 4096, kAny);
        count("staging_limit_bytes", c.stagingLimitBytes, 0, kAny);
        count("staging_ring_depth", c.stagingRingDepth, 1, 16);
        count("staging_copy_threads", c.stagingCopyThreads, 0, 64);
        flag("staging_streaming_stores", c.stagingStreamingStores);
        flag("slice_cache", c.sliceCache);
        count("max_page_bytes", c.maxPageBytes, 0, kAny);
        count("release_idle_after_ms", c.releaseIdleAfterMs, 0,
              std::numeric_limits<uint32_t>::max());
    }

    void readDevices(const Json &d, Config &c) const {
        checkKeys(d, "/devices", {"prefer", "required", "backend_priority", "reopen_after_fault"});
        if (d.contains("prefer")) {
            attempt([&] {
                const std::vector<std::string> prefer = strings(d["prefer"], "/devices/prefer");
                for (size_t i = 0; i < prefer.size(); ++i) {
                    attempt([&] {
                        try {
                            detail::parseSelector(prefer[i]);
                        } catch (const Error &e) {
                            fail("/devices/prefer/" + std::to_string(i), e.what());
                        }
                        c.devicePreference.push_back(prefer[i]);
                    });
                }
                c.devicePreferenceSource = file_.string();
            });
        }
        if (d.contains("required"))
            attempt([&] { c.deviceRequired = boolean(d["required"], "/devices/required"); });
        if (d.contains("backend_priority"))
            attempt([&] {
                c.backendPriority = strings(d["backend_priority"], "/devices/backend_priority");
            });
        if (d.contains("reopen_after_fault"))
            attempt([&] {
                c.reopenAfterFault = static_cast<uint32_t>(
                    unsignedInt(d["reopen_after_fault"], "/devices/reopen_after_fault", 0, 1000));
            });
    }

    void readPlugins(const Json &p, Config &c) const {
        checkKeys(p, "/plugins",
                  {"paths", "enable", "disable", "options", "probe", "probe_timeout_ms"});
        if (p.contains("probe")) {
            attempt([&] {
                const std::string text = string(p["probe"], "/plugins/probe");
                const auto mode = parseProbeMode(text);
                if (!mode)
                    fail("/plugins/probe", "unknown probe mode '" + text +
                                               "' (use isolated or in_process)");
                c.probeMode = *mode;
            });
        }
        if (p.contains("probe_timeout_ms"))
            attempt([&] {
                c.probeTimeoutMs = static_cast<uint32_t>(
                    unsignedInt(p["probe_timeout_ms"], "/plugins/probe_timeout_ms", 100, 600000));
            });
        if (p.contains("paths")) {
            attempt([&] {
                const Json &paths = p["paths"];
                if (!paths.is_array()) wrongType(paths, "/plugins/paths", "an array of strings");
                for (size_t i = 0; i < paths.size(); ++i)
                    attempt([&] {
                        c.pluginPaths.push_back(
                            path(paths[i], "/plugins/paths/" + std::to_string(i)));
                    });
            });
        }
        if (p.contains("enable"))
            attempt([&] { c.pluginEnable = strings(p["enable"], "/plugins/enable"); });
        if (p.contains("disable"))
            attempt([&] { c.pluginDisable = strings(p["disable"], "/plugins/disable"); });
        if (p.contains("options")) {
            attempt([&] {
                const Json &options = object(p["options"], "/plugins/options");
                for (const auto &item : options.items()) {
                    const std::string name = item.key(); // named: see checkKeys
                    const Json &value = item.value();
                    attempt([&] {
                        c.pluginOptions[name] = detail::dumpJson(
                            object(value, "/plugins/options/" + detail::pointerToken(name)));
                    });
                }
            });
        }
    }

    void readStreams(const Json &s, Config &c) const {
        checkKeys(s, "/streams", {"max_streams", "scheduler", "max_tasks", "native_recordings"});
        if (s.contains("max_streams"))
            attempt([&] {
                c.maxStreams = static_cast<uint32_t>(
                    unsignedInt(s["max_streams"], "/streams/max_streams", 1, 65536));
            });
        if (s.contains("scheduler")) {
            attempt([&] {
                const std::string text = string(s["scheduler"], "/streams/scheduler");
                const auto mode = parseScheduler(text);
                if (!mode)
                    fail("/streams/scheduler",
                         "unknown scheduler '" + text + "' (use interleave or sequential)");
                c.schedulerMode = *mode;
            });
        }
        if (s.contains("max_tasks"))
            attempt([&] {
                c.schedulerMaxTasks = static_cast<uint32_t>(
                    unsignedInt(s["max_tasks"], "/streams/max_tasks", 1, 1u << 20));
            });
        if (s.contains("native_recordings"))
            attempt([&] {
                c.nativeRecordings = boolean(s["native_recordings"], "/streams/native_recordings");
            });
    }

    fs::path file_;
    fs::path dir_;
    mutable std::vector<std::string> errors_;
};

std::optional<std::string> environment(const char *name) {
    const char *value = std::getenv(name);
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
}

std::vector<std::string> split(const std::string &text, char separator) {
    std::vector<std::string> out;
    std::string item;
    std::istringstream in(text);
    while (std::getline(in, item, separator)) {
        const size_t first = item.find_first_not_of(" \t");
        const size_t last = item.find_last_not_of(" \t");
        if (first != std::string::npos) out.push_back(item.substr(first, last - first + 1));
    }
    return out;
}

} // namespace

const char *toString(SchedulerMode mode) noexcept {
    return mode == SchedulerMode::Sequential ? "sequential" : "interleave";
}

const char *toString(ProbeMode mode) noexcept {
    return mode == ProbeMode::InProcess ? "in_process" : "isolated";
}

const char *toString(TuneLevel level) noexcept {
    return kTuneLevelNames[static_cast<size_t>(level)];
}

namespace detail {

/// Error(Config) with every error, one a line (the first alone reads as before).
void throwErrors(const std::vector<std::string> &errors) {
    if (errors.empty()) return;
    std::string text;
    for (const std::string &e : errors) text += (text.empty() ? "" : "\n") + e;
    throw Error(ErrorCode::Config, text);
}

Config parseConfigText(std::string_view text, const fs::path &origin) {
    const FileReader reader(origin);
    Config config = reader.read(parseJson(text, origin.string(), kConfigJsonLimits));
    throwErrors(reader.errors());
    return config;
}

} // namespace detail

Config readConfigFile(const fs::path &file) {
    ConfigCheck check = checkConfigFile(file);
    detail::throwErrors(check.errors);
    return std::move(check.config);
}

ConfigCheck checkConfigFile(const fs::path &file) {
    const FileReader reader(file);
    ConfigCheck check;
    check.config = reader.read(detail::readJsonFile(file, detail::kConfigJsonLimits));
    check.errors = reader.errors();
    return check;
}

void applyEnvironment(Config &config) {
    if (const auto value = environment("BACKPLANE_DEVICE")) {
        std::vector<std::string> selectors = split(*value, ',');
        for (const auto &s : selectors) {
            try {
                detail::parseSelector(s);
            } catch (const Error &e) {
                throw Error(ErrorCode::Config, std::string("BACKPLANE_DEVICE: ") + e.what());
            }
        }
        config.devicePreference = std::move(selectors);
        config.devicePreferenceSource = "BACKPLANE_DEVICE";
    }
    if (const auto value = environment("BACKPLANE_PLUGIN_PATH")) {
        config.pluginPathOverride.clear();
        for (const auto &p : split(*value, ':')) config.pluginPathOverride.emplace_back(p);
    }
    if (const auto value = environment("BACKPLANE_CACHE_DIR")) config.cacheDir = *value;
    if (const auto value = environment("BACKPLANE_AUTOTUNE")) {
        const auto level = parseTuneLevel(*value);
        if (!level)
            throw Error(ErrorCode::Config, "BACKPLANE_AUTOTUNE: unknown level '" + *value +
                                               "' (use off, minimal, balanced, extensive or full)");
        config.tuneLevel = *level;
    }
    if (const auto value = environment("BACKPLANE_MAX_STREAMS")) {
        char *end = nullptr;
        const unsigned long long n = std::strtoull(value->c_str(), &end, 10);
        if (end == value->c_str() || *end != '\0' || n < 1 || n > 65536 || (*value)[0] == '-')
            throw Error(ErrorCode::Config, "BACKPLANE_MAX_STREAMS: expected an integer in [1, "
                                           "65536], got '" + *value + "'");
        config.maxStreams = static_cast<uint32_t>(n);
    }
    if (const auto value = environment("BACKPLANE_PROBE")) {
        const auto mode = parseProbeMode(*value);
        if (!mode)
            throw Error(ErrorCode::Config, "BACKPLANE_PROBE: unknown probe mode '" + *value +
                                               "' (use isolated or in_process)");
        config.probeMode = *mode;
    }
    if (const auto value = environment("BACKPLANE_LOG")) {
        try {
            validateLogSpec(*value);
        } catch (const Error &e) {
            throw Error(ErrorCode::Config, std::string("BACKPLANE_LOG: ") + e.what());
        }
        config.logSpec = *value;
    }
}

Config loadConfig() {
    std::optional<fs::path> file;
    if (const auto value = environment("BACKPLANE_CONFIG")) {
        if (!fs::exists(*value))
            throw Error(ErrorCode::Config, "BACKPLANE_CONFIG names " + *value +
                                               ", which does not exist; fix or unset it");
        file = *value;
    } else if (fs::exists("backplane.json")) {
        file = "backplane.json";
    } else {
        fs::path dir;
        if (const auto xdg = environment("XDG_CONFIG_HOME")) dir = *xdg;
        else if (const auto home = environment("HOME")) dir = fs::path(*home) / ".config";
        if (!dir.empty() && fs::exists(dir / "backplane" / "config.json"))
            file = dir / "backplane" / "config.json";
    }
    Config config = file ? readConfigFile(*file) : Config{};
    log::write(log::Subsystem::Config, log::Level::Debug,
               file ? "config file: " + file->string() : "no config file; using defaults");
    applyEnvironment(config);
    return config;
}

std::string toJson(const Config &config, int indent) {
    const auto paths = [](const std::vector<fs::path> &list) {
        Json out = Json::array();
        for (const auto &p : list) out.push_back(p.string());
        return out;
    };
    Json options = Json::object();
    for (const auto &[name, text] : config.pluginOptions) {
        try {
            options[name] = detail::parseJson(text, "plugins.options." + name,
                                              detail::kPluginOptionsJsonLimits);
        } catch (const Error &e) { // set from code, not read from a file: show what it is
            options[name] = {{"invalid", text.substr(0, 200)}, {"error", e.what()}};
        }
    }
    Json root = {
        {"source", config.source.empty() ? Json(nullptr) : Json(config.source.string())},
        {"devices",
         {{"prefer", config.devicePreference},
          {"prefer_source", config.devicePreferenceSource.empty()
                                ? Json(nullptr)
                                : Json(config.devicePreferenceSource)},
          {"required", config.deviceRequired},
          {"backend_priority", config.backendPriority},
          {"reopen_after_fault", config.reopenAfterFault}}},
        {"plugins",
         {{"paths", paths(config.pluginPaths)},
          {"path_override", paths(config.pluginPathOverride)},
          {"enable", config.pluginEnable},
          {"disable", config.pluginDisable},
          {"options", options},
          {"probe", toString(config.probeMode)},
          {"probe_timeout_ms", config.probeTimeoutMs}}},
        {"streams",
         {{"max_streams", config.maxStreams},
          {"scheduler", toString(config.schedulerMode)},
          {"max_tasks", config.schedulerMaxTasks},
          {"native_recordings", config.nativeRecordings}}},
        {"memory",
         {{"staging_chunk_bytes", config.stagingChunkBytes},
          {"staging_limit_bytes", config.stagingLimitBytes},
          {"staging_ring_depth", config.stagingRingDepth},
          {"staging_copy_threads", config.stagingCopyThreads},
          {"staging_streaming_stores", config.stagingStreamingStores},
          {"max_page_bytes", config.maxPageBytes},
          {"slice_cache", config.sliceCache},
          {"release_idle_after_ms", config.releaseIdleAfterMs}}},
        {"cache",
         {{"dir", cacheDirectory(config).string()}, {"enabled", config.cacheEnabled}}},
        {"autotune", {{"level", toString(config.tuneLevel)}}},
        {"log", config.logSpec},
    };
    return detail::dumpJson(root, indent);
}

} // namespace backplane
