// Config: every setting of the runtime, as read from the JSON config file and the environment.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace backplane {

/// How streams without native async support are scheduled (SchedulerMultiStream).
enum class SchedulerMode { Interleave, Sequential };

/// How plugins are probed the first time they are seen (docs/plugin-abi.md, "Isolated probing").
/// `Isolated` runs each probe in the backplane-probe helper process with a timeout, so a plugin
/// that crashes, aborts or hangs while probing cannot take the host down; `InProcess` probes in
/// this process (for sandboxes that forbid child processes).
enum class ProbeMode { Isolated, InProcess };

/// Stable name: "isolated", "in_process".
const char *toString(ProbeMode mode) noexcept;

/// Autotune effort. `Off` uses the first valid candidate (or a cached winner) without benchmarking.
enum class TuneLevel { Off, Minimal, Balanced, Extensive, Full };

/// The whole configuration. Defaults are what a missing key means; docs/config.md lists every
/// key with its JSON path, type and default. Values come, lowest precedence first, from the
/// defaults, the config file, then environment variables (BACKPLANE_DEVICE, BACKPLANE_PLUGIN_PATH,
/// BACKPLANE_CACHE_DIR, BACKPLANE_AUTOTUNE, BACKPLANE_LOG, BACKPLANE_MAX_STREAMS, BACKPLANE_PROBE).
struct Config {
    /// Where the file came from ("" when defaults only); errors and reports name it.
    std::filesystem::path source;

    // "devices": selection --------------------------------------------------------------------
    /// devices.prefer: ordered selectors ("cuda:0", "vulkan:<uuid>", "hip", "*:gpu", "*:cpu",
    /// "host"). Empty = the built-in order: discrete GPU, integrated GPU, other, CPU.
    std::vector<std::string> devicePreference;
    /// Where devicePreference came from, so selection messages blame the right place:
    /// "BACKPLANE_DEVICE" (applyEnvironment set it), the config file's path (readConfigFile, when
    /// the file has devices.prefer), or "" (defaults, or set in code). Set it along with
    /// devicePreference when code overrides the preference.
    std::string devicePreferenceSource;
    /// devices.required: nothing in devicePreference matched -> Error(NoMatchingDevice) instead
    /// of falling back to the best device present.
    bool deviceRequired = false;
    /// devices.backend_priority: which plugin owns a physical GPU reached through several
    /// (same UUID). First listed wins.
    std::vector<std::string> backendPriority = {"cuda", "hip", "vulkan", "host"};
    /// devices.reopen_after_fault: how many times a ComputeClient reopens its device by itself
    /// after a sticky fault (Error(DeviceLost)), 0 = never (the application closes and reopens).
    /// The call that meets the fault still fails with DeviceLost; the next call runs on a fresh
    /// open of the device, and Buffers, futures and recordings from before fail with DeviceLost
    /// naming the fault. Each reopen is logged (subsystem "streams", level warn).
    uint32_t reopenAfterFault = 0;

    // "plugins": discovery --------------------------------------------------------------------
    /// plugins.paths: directories or manifest files searched after BACKPLANE_PLUGIN_PATH.
    std::vector<std::filesystem::path> pluginPaths;
    /// BACKPLANE_PLUGIN_PATH (directories or manifest files): searched first and, when non-empty,
    /// replaces the default locations (the install dir and the build tree). No JSON key.
    std::vector<std::filesystem::path> pluginPathOverride;
    /// plugins.enable: when non-empty, only these plugin names are loaded.
    std::vector<std::string> pluginEnable;
    /// plugins.disable: these plugin names are never loaded (applied after enable).
    std::vector<std::string> pluginDisable;
    /// plugins.options.<name>: JSON text handed to that plugin's init.
    std::map<std::string, std::string> pluginOptions;
    /// plugins.probe (also BACKPLANE_PROBE=isolated|in_process): where a plugin whose probe
    /// result is not cached yet is probed. The answer is cached in <cache dir>/probes, keyed by
    /// the library file's identity and its options, so later starts run no helper.
    ProbeMode probeMode = ProbeMode::Isolated;
    /// plugins.probe_timeout_ms: how long an isolated probe may take before it is killed and the
    /// plugin is reported probe_timeout.
    uint32_t probeTimeoutMs = 10000;

    // "streams" -------------------------------------------------------------------------------
    /// streams.max_streams: backend streams per device; stream id -> slot id % max_streams.
    uint32_t maxStreams = 128;
    /// streams.scheduler: for plugins without native async streams.
    SchedulerMode schedulerMode = SchedulerMode::Interleave;
    /// streams.max_tasks: tasks batched per scheduler flush.
    uint32_t schedulerMaxTasks = 8;
    /// streams.native_recordings: replay recordings through the plugin's graphs (CUDA graphs,
    /// Vulkan command buffers, host replay lists) where it has them; false makes the core issue
    /// the recorded calls itself (to compare, or to work around a driver's graphs).
    bool nativeRecordings = true;

    // "memory" --------------------------------------------------------------------------------
    /// memory.staging_chunk_bytes: chunk of the pinned staging pipeline for pageable transfers.
    uint64_t stagingChunkBytes = 8ull << 20;
    /// memory.staging_limit_bytes: pinned staging memory of one device, all streams together
    /// (0 = derived: 8 chunks, at most an eighth of the device's memory; the chunk shrinks so
    /// that two fit). Transfers that find no free block copy unstaged.
    uint64_t stagingLimitBytes = 0;
    /// memory.staging_ring_depth: staging blocks one pageable transfer keeps in flight (1-16):
    /// the host fills (write) or empties (read) one while the device copies the others. Fewer
    /// when the device's bound leaves fewer free.
    uint32_t stagingRingDepth = 3;
    /// memory.staging_copy_threads: threads that copy between pageable memory and the staging
    /// blocks, the calling thread included (0 = derived: 3/4 of the hardware threads, 1-16).
    uint32_t stagingCopyThreads = 0;
    /// memory.staging_streaming_stores: copies of a megabyte or more into and out of staging
    /// use non-temporal stores (x86-64), which write memory without first reading it into the
    /// cache; false uses memcpy.
    bool stagingStreamingStores = true;
    /// memory.slice_cache: keep a few freed slices per stream slot and hand them out again
    /// without the engine lock (docs/memory.md, "Slice caches"); false sends every freed slice
    /// straight back to the pool.
    bool sliceCache = true;
    /// memory.max_page_bytes: cap on sliced-pool page size (0 = derived from device memory).
    uint64_t maxPageBytes = 0;
    /// memory.release_idle_after_ms: a page with no live buffer whose work completed goes back
    /// to the plugin once it has been idle this long (checked on allocations and usage queries).
    uint32_t releaseIdleAfterMs = 1000;

    // "cache" ---------------------------------------------------------------------------------
    /// cache.dir: kernels, tuning results, pipeline caches. Default $XDG_CACHE_HOME/backplane
    /// (or ~/.cache/backplane).
    std::filesystem::path cacheDir;
    /// cache.enabled: false keeps everything in memory.
    bool cacheEnabled = true;

    // "autotune" ------------------------------------------------------------------------------
    /// autotune.level (also BACKPLANE_AUTOTUNE=off|minimal|balanced|extensive|full).
    TuneLevel tuneLevel = TuneLevel::Balanced;

    // "log" -----------------------------------------------------------------------------------
    /// log: a level spec as in backplane::log::configure ("info,loader=debug"); "" = unchanged.
    std::string logSpec;
};

/// Finds and reads the config: BACKPLANE_CONFIG, then ./backplane.json, then
/// $XDG_CONFIG_HOME/backplane/config.json (~/.config/...); none found = defaults. Then applies
/// the environment overrides. Throws Error(Config) naming the file and the JSON path of a bad
/// value ("backplane.json: /devices/prefer/2: expected a string, got 3").
Config loadConfig();

/// Reads one file (no environment overrides). Throws Error(Config) as above; unknown keys are
/// errors too (they are usually typos), with the list of known keys at that level. A file with
/// several errors names them all in one Error, one a line.
Config readConfigFile(const std::filesystem::path &file);

/// What checkConfigFile found in one file.
struct ConfigCheck {
    /// The settings the file gives, each bad value left at its default.
    Config config;
    /// Every error of the file, in file order, each "FILE: /json/pointer: what".
    std::vector<std::string> errors;
};

/// Reads one file like readConfigFile but does not stop at the first error: returns them all
/// (what `backplane config check` reports). Throws Error(Config) only when the file cannot be
/// read or is not JSON (nothing further can be checked then).
ConfigCheck checkConfigFile(const std::filesystem::path &file);

/// A plugin's options (`plugins.options.<name>`, JSON text) against the schema the plugin
/// publishes (PluginReport::optionsSchema, ABI 1.5): every problem, each "POINTER: what is
/// wrong" with POINTER starting at `where` ("/plugins/options/host"). Empty when they conform,
/// or the plugin publishes no schema or a malformed one. Never throws. Strings are compared as
/// JSON Schema says except that maxLength counts bytes, and integers are written without a
/// fraction (2, not 2.0), as the in-tree plugins parse them.
std::vector<std::string> checkPluginOptions(const std::string &schemaJson,
                                            const std::string &optionsJson,
                                            const std::string &where);
/// The schema as text, one option a line (name, type, range, default) with its description
/// below: what `backplane devices --options NAME` prints.
std::string describePluginOptions(const std::string &schemaJson);

/// Applies BACKPLANE_* environment overrides to `config`. Throws Error(Config) naming the
/// variable on a bad value.
void applyEnvironment(Config &config);

/// Stable lower-case names: "interleave", "sequential"; "off", "minimal", "balanced"...
const char *toString(SchedulerMode mode) noexcept;
const char *toString(TuneLevel level) noexcept;

/// Every setting of `config` as a JSON object using the file's keys (what `backplane config
/// check` prints); plugin paths appear as given after resolution, cache.dir as effective.
std::string toJson(const Config &config, int indent = 2);

} // namespace backplane
