// Plugin discovery, filtering before dlopen, loading and probing; every candidate gets a report.
#include "plugin_loader.hpp"

#include "input/elf_check.hpp"
#include "input/json_input.hpp"
#include "loader/plugin_manifest.hpp"
#include "loader/plugin_probe.hpp"
#include "loader/probe_cache.hpp"
#include "loader/probe_process.hpp"
#include "config/device_selector.hpp"

#include <backplane/cache.hpp>
#include <backplane/log.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <algorithm>
#include <cstring>
#include <optional>
#include <set>
#include <system_error>
#include <fstream>
#include <cerrno>
#include <signal.h>
#include <unistd.h>
#include <thread>

#ifndef BACKPLANE_BUILD_ROOT
#define BACKPLANE_BUILD_ROOT ""
#endif
#ifndef BACKPLANE_INSTALL_PLUGIN_DIR
#define BACKPLANE_INSTALL_PLUGIN_DIR ""
#endif

namespace backplane::detail {
namespace {

namespace fs = std::filesystem;

bool contains(const std::vector<std::string> &list, const std::string &item) {
    return std::find(list.begin(), list.end(), item) != list.end();
}

std::string joined(const std::vector<std::string> &list) {
    std::string out;
    for (const auto &item : list) out += (out.empty() ? "" : ", ") + item;
    return out;
}

bool isUnder(const fs::path &path, const fs::path &root) {
    std::error_code ec;
    const fs::path p = fs::weakly_canonical(path, ec);
    const fs::path r = fs::weakly_canonical(root, ec);
    if (ec || r.empty()) return false;
    auto [rootEnd, pathAt] = std::mismatch(r.begin(), r.end(), p.begin(), p.end());
    return rootEnd == r.end() || (std::next(rootEnd) == r.end() && rootEnd->empty());
}

std::vector<fs::path> sortedEntries(const fs::path &dir, bool directories) {
    std::vector<fs::path> out;
    std::error_code ec;
    for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
        const bool isDir = it->is_directory(ec);
        if (directories ? isDir : (!isDir && it->path().extension() == ".json"))
            out.push_back(it->path());
    }
    std::sort(out.begin(), out.end());
    return out;
}

std::string pluginCacheDir(const Config &config, const std::string &name) {
    const fs::path root = cacheDirectory(config);
    if (root.empty()) return {};
    const fs::path dir = root / toString(CacheKind::Pipelines) / name;
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) {
        log::write(log::Subsystem::Loader, log::Level::Warn,
                   "cannot create the plugin cache directory " + dir.string() + ": " +
                       ec.message() + "; " + name + " runs without a cache");
        return {};
    }
    return dir.string();
}

/// A manifest that passed the filters and the checks before loading, waiting to be probed.
struct Candidate {
    size_t report = 0; ///< index into LoadedPlugins::reports
    PluginManifest manifest;
    PluginInitOptions options;
    std::string probe = "in_process"; ///< how it will be (or was) probed: see PluginReport::probe
    std::optional<std::string> cacheKey;
    std::optional<ProbeOutcome> answer; ///< an isolated probe's outcome (fresh or cached)
    bool settled = false;               ///< its report is final; do not load it
};

/// The checks that need no plugin code: ABI in the manifest, the library file and its ELF
/// headers, the options JSON. False (with the report filled) when the library must not be opened.
bool checkBeforeLoading(const Config &config, const PluginManifest &manifest,
                        PluginReport &report, PluginInitOptions &options) {
    if (manifest.abiMajor != BP_ABI_VERSION_MAJOR) {
        report.state = PluginState::AbiMismatch;
        report.reason = "manifest declares plugin ABI " + std::to_string(manifest.abiMajor) + "." +
                        std::to_string(manifest.abiMinor) + " but this backplane speaks ABI " +
                        std::to_string(BP_ABI_VERSION_MAJOR) + "." +
                        std::to_string(BP_ABI_VERSION_MINOR) +
                        "; the library was not opened. Use a plugin built for ABI " +
                        std::to_string(BP_ABI_VERSION_MAJOR) + ".x";
        return false;
    }
    if (const auto problem = libraryFileProblem(manifest.library)) {
        report.state = PluginState::LibraryLoadFailed;
        report.reason = *problem == "does not exist"
                            ? manifest.library.string() + " does not exist (named by /library of " +
                                  manifest.file.string() + ")"
                            : "cannot load " + manifest.library.string() + ": " + *problem;
        return false;
    }
    if (const auto it = config.pluginOptions.find(manifest.name); it != config.pluginOptions.end()) {
        // Set from code or the config file; the plugin must get one bounded JSON object.
        try {
            const auto json = parseJson(it->second, "plugins.options." + manifest.name,
                                        kPluginOptionsJsonLimits);
            if (!json.is_object())
                throw Error(ErrorCode::Config, "plugins.options." + manifest.name +
                                                   ": expected a JSON object");
            options.optionsJson = it->second;
        } catch (const Error &e) {
            report.state = PluginState::InitFailed;
            report.reason = std::string(e.what()) + "; the plugin was not started";
            return false;
        }
    }
    options.cacheDir = pluginCacheDir(config, manifest.name);
    return true;
}

void settle(Candidate &c, PluginReport &report, PluginState state, const std::string &reason,
            const std::string &probe) {
    report.state = state;
    report.reason = reason;
    report.probe = probe;
    c.settled = true;
}

/// While a plugin's probe runs in this process (before its first device_open, with an answer
/// from the isolated probe), this file next to the answer holds our pid. Finding it with a
/// dead pid means that probe killed its process: the answer is dropped so the next start
/// probes in isolation again (and reports the crash) instead of crashing at every open.
fs::path inHostMarker(const CacheStore &store, const std::string &key) {
    fs::path path = store.entryPath(CacheKind::Probes, key);
    return path.empty() ? path : path.replace_extension(".in-host");
}

/// Drops the answer of a plugin whose in-host probe killed an earlier process; true if so.
bool droppedAfterCrash(CacheStore &store, const std::string &key, const std::string &name) {
    const fs::path marker = inHostMarker(store, key);
    std::ifstream in(marker);
    long pid = 0;
    if (!in || !(in >> pid)) return false;
    if (pid > 0 && pid != ::getpid() && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM))
        return false; // still probing in a live process
    std::error_code ec;
    fs::remove(marker, ec);
    store.remove(CacheKind::Probes, key);
    log::write(log::Subsystem::Loader, log::Level::Warn,
               name + ": process " + std::to_string(pid) +
                   " died while probing it before opening a device; its cached probe answer is "
                   "dropped and it is probed again in isolation");
    return true;
}

/// How many isolated probes run at once: enough to overlap slow drivers, few enough that a
/// busy machine does not push healthy plugins past their timeout.
unsigned probeParallelism() { return std::clamp(std::thread::hardware_concurrency(), 2u, 8u); }

/// Runs backplane-probe for every candidate without a cached answer. Settles those that
/// crashed, hung or could not be probed; the others get the answer to load with.
void probeIsolated(const Config &config, std::vector<Candidate> &candidates,
                   std::vector<PluginReport> &reports) {
    const fs::path helper = probeHelperPath();
    if (helper.empty()) {
        log::write(log::Subsystem::Loader, log::Level::Warn,
                   "backplane-probe was not found (BACKPLANE_PROBE_HELPER, the build tree, "
                   "<prefix>/libexec/backplane); plugins are probed in this process, so one that "
                   "crashes while probing takes this process down");
        for (auto &c : candidates) c.probe = "in_process";
        return;
    }
    CacheStore *store =
        cacheDirectory(config).empty() ? nullptr : &CacheStore::forConfig(config);
    const std::string cachedSuffix =
        " (cached from an earlier run; run `backplane cache clear probes` to probe again)";
    std::vector<size_t> pending;
    std::vector<ProbeRequest> requests;
    for (size_t i = 0; i < candidates.size(); ++i) {
        Candidate &c = candidates[i];
        PluginReport &report = reports[c.report];
        if (store != nullptr) c.cacheKey = probeCacheKey(c.manifest.library, c.options);
        if (c.cacheKey) droppedAfterCrash(*store, *c.cacheKey, c.manifest.name);
        if (c.cacheKey) {
            if (auto record = loadProbeRecord(*store, *c.cacheKey, c.manifest.name)) {
                if (record->kind == ProbeRecord::Kind::Answered) {
                    c.probe = "cached";
                    c.answer = std::move(record->outcome);
                } else {
                    settle(c, report,
                           record->kind == ProbeRecord::Kind::Crashed ? PluginState::ProbeCrashed
                                                                      : PluginState::ProbeTimeout,
                           record->reason + cachedSuffix, "cached");
                }
                continue;
            }
        }
        pending.push_back(i);
        requests.push_back({c.manifest.library, c.manifest.name, c.options.cacheDir,
                            c.options.optionsJson});
    }
    if (requests.empty()) return;
    const auto answers = runProbes(helper, requests, config.probeTimeoutMs, probeParallelism());
    for (size_t k = 0; k < pending.size(); ++k) {
        Candidate &c = candidates[pending[k]];
        PluginReport &report = reports[c.report];
        const ProbeAnswer &answer = answers[k];
        ProbeRecord record;
        switch (answer.outcome) {
        case ProbeAnswer::Outcome::NotStarted:
            settle(c, report, PluginState::ProbeFailed,
                   "could not start its isolated probe: " + answer.reason +
                       "; not loaded (nothing is cached: it is probed again next time)",
                   "isolated");
            continue;
        case ProbeAnswer::Outcome::HelperFailed:
            settle(c, report, PluginState::ProbeFailed,
                   answer.reason + "; not loaded. Reinstall backplane (the helper must come from "
                                   "the same build as libbackplane), or set plugins.probe to "
                                   "\"in_process\"",
                   "isolated");
            continue;
        case ProbeAnswer::Outcome::Answered:
            try {
                record.outcome = outcomeFromJson(answer.result, c.manifest.name);
                for (const auto &entry : answer.result.value("libraries", nlohmann::json::array()))
                    record.libraries.emplace_back(entry.at("path").get<std::string>(),
                                                  entry.at("identity").get<std::string>());
            } catch (const std::exception &e) {
                settle(c, report, PluginState::ProbeFailed,
                       std::string("backplane-probe gave an unreadable answer: ") + e.what(),
                       "isolated");
                continue;
            }
            c.answer = record.outcome;
            // Only an answer with devices is worth keeping: "no driver" or "no device" may change
            // with an install or a cable (and probing again costs only this child).
            if (record.outcome.state != PluginState::Loaded) continue;
            break;
        case ProbeAnswer::Outcome::Crashed:
            record.kind = ProbeRecord::Kind::Crashed;
            record.reason = answer.reason;
            settle(c, report, PluginState::ProbeCrashed, answer.reason, "isolated");
            break;
        case ProbeAnswer::Outcome::TimedOut:
            record.kind = ProbeRecord::Kind::TimedOut;
            record.reason = answer.reason;
            settle(c, report, PluginState::ProbeTimeout, answer.reason, "isolated");
            break;
        }
        if (c.cacheKey) storeProbeRecord(*store, *c.cacheKey, std::move(record));
    }
}

/// In-process probing: a library an isolated probe already saw crash or hang (a record in the
/// probe cache) is not loaded, since here it would take the process down.
void refuseKnownCrashers(const Config &config, std::vector<Candidate> &candidates,
                         std::vector<PluginReport> &reports) {
    if (cacheDirectory(config).empty()) return;
    const CacheStore &store = CacheStore::forConfig(config);
    for (auto &c : candidates) {
        const auto key = probeCacheKey(c.manifest.library, c.options);
        if (!key) continue;
        const auto record = loadProbeRecord(store, *key, c.manifest.name);
        if (!record || record->kind == ProbeRecord::Kind::Answered) continue;
        settle(c, reports[c.report],
               record->kind == ProbeRecord::Kind::Crashed ? PluginState::ProbeCrashed
                                                          : PluginState::ProbeTimeout,
               record->reason + " (cached from an earlier isolated probe; not loaded in process. "
                                "Run `backplane cache clear probes` to try again)",
               "cached");
    }
}

/// Fills `report` from `outcome` and, when it is Loaded, adds its library and devices.
void applyOutcome(ProbeOutcome outcome, const Candidate &c, PluginReport &report,
                  LoadedPlugins &result) {
    report.state = outcome.state;
    report.reason = outcome.reason;
    report.probe = c.probe;
    if (!outcome.version.empty() || outcome.abiMajor != 0) {
        report.version = outcome.version;
        report.optionsSchema = outcome.optionsSchema;
        report.abiMajor = outcome.abiMajor;
        report.abiMinor = outcome.abiMinor;
    }
    report.driverVersion = outcome.driverVersion;
    report.deviceCount = outcome.deviceCount;
    if (outcome.state != PluginState::Loaded) return;
    result.libraries[c.manifest.name] = outcome.library;
    for (auto &d : outcome.devices) result.devices.push_back(std::move(d));
}

/// Loads a candidate: with an isolated probe's answer, only dlopen and plugin_init run here
/// (and only for a plugin that has devices); without one, the probe runs in this process.
void load(const Config &config, Candidate &c, PluginReport &report, LoadedPlugins &result) {
    if (!c.answer) {
        applyOutcome(probePlugin(c.manifest.library, c.manifest.name, c.options), c, report,
                     result);
        return;
    }
    if (c.answer->state != PluginState::Loaded) {
        applyOutcome(std::move(*c.answer), c, report, result);
        return;
    }
    ProbeOutcome outcome =
        loadWithAnswer(c.manifest.library, c.manifest.name, c.options, std::move(*c.answer));
    if (outcome.library) {
        // When this process's own probe (before the first device_open) disagrees with the
        // answer, the cached answer goes, so the next start probes again in isolation.
        CacheStore *store = c.cacheKey ? &CacheStore::forConfig(config) : nullptr;
        outcome.library->expectProbe(
            outcome.deviceCount, outcome.driverVersion,
            [store, key = c.cacheKey.value_or(""), name = c.manifest.name](const std::string &why) {
                log::write(log::Subsystem::Loader, log::Level::Warn,
                           name + " no longer matches its probe answer (" + why +
                               "); the answer is dropped and it is probed again at the next start");
                if (store != nullptr) store->remove(CacheKind::Probes, key);
            },
            [marker = c.cacheKey ? inHostMarker(*store, *c.cacheKey) : fs::path()](bool begin) {
                if (marker.empty()) return;
                std::error_code ec;
                if (begin) std::ofstream(marker) << ::getpid() << "\n";
                else fs::remove(marker, ec);
            });
    }
    applyOutcome(std::move(outcome), c, report, result);
}

} // namespace

std::vector<fs::path> pluginSearchPath(const Config &config) {
    std::vector<fs::path> path = config.pluginPathOverride;
    path.insert(path.end(), config.pluginPaths.begin(), config.pluginPaths.end());
    if (!config.pluginPathOverride.empty()) return path;

    std::error_code ec;
    const fs::path self = boost::dll::this_line_location(ec);
    const fs::path buildRoot = BACKPLANE_BUILD_ROOT;
    if (!ec && !buildRoot.empty() && isUnder(self, buildRoot)) {
        // Running from the build tree (meson test, meson devenv): each plugin's build writes
        // <name>.json next to its module in <build>/plugins/<name>/.
        for (const auto &dir : sortedEntries(buildRoot / "plugins", true)) path.push_back(dir);
        return path;
    }
    if (!ec) path.push_back(self.parent_path() / "backplane" / "plugins");
    const fs::path installed = BACKPLANE_INSTALL_PLUGIN_DIR;
    if (!installed.empty() && std::find(path.begin(), path.end(), installed) == path.end())
        path.push_back(installed);
    return path;
}

std::vector<fs::path> findManifests(const std::vector<fs::path> &path) {
    std::vector<fs::path> manifests;
    std::set<fs::path> seen;
    const auto add = [&](const fs::path &file) {
        std::error_code ec;
        const fs::path key = fs::weakly_canonical(file, ec);
        if (seen.insert(ec ? file : key).second) manifests.push_back(file);
    };
    for (const auto &entry : path) {
        std::error_code ec;
        if (fs::is_directory(entry, ec)) {
            for (const auto &file : sortedEntries(entry, false)) add(file);
        } else if (fs::exists(entry, ec)) {
            add(entry);
        } else {
            log::write(log::Subsystem::Loader, log::Level::Debug,
                       "plugin search path entry " + entry.string() + " does not exist");
        }
    }
    return manifests;
}

LoadedPlugins loadPlugins(const Config &config) {
    LoadedPlugins result;
    result.searchPath = pluginSearchPath(config);
    std::map<std::string, fs::path> winners; // plugin name -> manifest that claimed it
    std::vector<Candidate> candidates;

    for (const auto &file : findManifests(result.searchPath)) {
        PluginReport report;
        report.manifest = file;
        PluginManifest manifest;
        try {
            manifest = readManifest(file);
        } catch (const Error &e) { // ManifestError, or anything else reading it raised
            report.state = PluginState::ManifestInvalid;
            report.reason = e.what();
            result.reports.push_back(std::move(report));
            continue;
        }
        report.name = manifest.name;
        report.backend = manifest.backend;
        report.description = manifest.description;
        report.library = manifest.library;
        report.abiMajor = manifest.abiMajor;
        report.abiMinor = manifest.abiMinor;

        if (const auto it = winners.find(manifest.name); it != winners.end()) {
            report.state = PluginState::Shadowed;
            report.reason = "plugin '" + manifest.name + "' is already provided by " +
                            it->second.string() + ", found earlier in the search path";
        } else {
            winners.emplace(manifest.name, file);
            if (!config.pluginEnable.empty() && !contains(config.pluginEnable, manifest.name)) {
                report.state = PluginState::FilteredOut;
                report.reason = "not in plugins.enable (" + joined(config.pluginEnable) + ")";
            } else if (contains(config.pluginDisable, manifest.name)) {
                report.state = PluginState::FilteredOut;
                report.reason = "listed in plugins.disable";
            } else {
                Candidate c;
                c.report = result.reports.size();
                c.manifest = manifest;
                c.probe = config.probeMode == ProbeMode::InProcess ? "in_process" : "isolated";
                if (checkBeforeLoading(config, manifest, report, c.options))
                    candidates.push_back(std::move(c));
            }
        }
        result.reports.push_back(std::move(report));
    }

    if (config.probeMode == ProbeMode::Isolated)
        probeIsolated(config, candidates, result.reports);
    else
        refuseKnownCrashers(config, candidates, result.reports);
    for (auto &c : candidates) {
        if (c.settled) continue;
        load(config, c, result.reports[c.report], result);
    }

    for (const auto &report : result.reports) {
        const bool failed = report.state != PluginState::Loaded &&
                            report.state != PluginState::FilteredOut &&
                            report.state != PluginState::Shadowed;
        log::write(log::Subsystem::Loader, failed ? log::Level::Info : log::Level::Debug,
                   (report.name.empty() ? report.manifest.string() : report.name) + ": " +
                       toString(report.state) +
                       (report.reason.empty() ? "" : " (" + report.reason + ")"));
    }
    return result;
}

} // namespace backplane::detail
