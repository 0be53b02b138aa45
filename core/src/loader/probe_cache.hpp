// The probe cache: what the isolated probe of one plugin library answered, so later starts run
// no child process. Kept in the cache directory's probes/ (CacheKind::Probes).
#pragma once

#include "loader/plugin_probe.hpp"

#include <backplane/cache.hpp>

#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace backplane::detail {

/// One cached probe result.
struct ProbeRecord {
    enum class Kind {
        Answered, ///< the probe finished (any state): probing in process is safe
        Crashed,  ///< the probe process died; the library must not be loaded in process
        TimedOut, ///< the probe hung; trusted for kTimeoutRecordSeconds only
    };
    Kind kind = Kind::Answered;
    std::string reason;    ///< Crashed/TimedOut: what happened
    ProbeOutcome outcome;  ///< Answered: the child's outcome (no library)
    /// Answered: every shared object the probe process had loaded (the plugin's driver and its
    /// dependencies) with its fileIdentity; the record holds while none of them changes.
    std::vector<std::pair<std::string, std::string>> libraries;
    int64_t recordedUnix = 0;
};

/// What identifies a file's content without reading it: size, modification and change time
/// (the latter cannot be set by hand), inode and device.
std::string fileIdentity(const struct stat &st);

/// A timed-out probe may have waited on something transient (a device being reset), so its
/// record is retried after this long; a crash record lasts until the library file changes.
inline constexpr int64_t kTimeoutRecordSeconds = 600;

/// The environment variables that steer drivers (CUDA_*, HIP_*, ROCR_*, HSA_*, VK_*, MESA_*,
/// NVIDIA_*, ZE_*, LD_LIBRARY_PATH, LD_PRELOAD, BACKPLANE_GLOO_MODULE, BACKPLANE_NCCL_LIBRARY...),
/// sorted, one per line.
std::string driverEnvironment();

/// The cache key of `library` probed with `options`: its canonical path and fileIdentity, a
/// hash of the options and cache directory handed to plugin_init, and a hash of
/// driverEnvironment(). Replacing or touching the file, or changing CUDA_VISIBLE_DEVICES, changes
/// it. nullopt when the file cannot be examined.
std::optional<std::string> probeCacheKey(const std::filesystem::path &library,
                                         const PluginInitOptions &options);

/// The record under `key`, or nothing (missing, unreadable, expired, or one of its libraries
/// changed: a driver update). A malformed record is ignored with a warning and replaced by the
/// next store.
/// `plugin` names the devices' backend.
std::optional<ProbeRecord> loadProbeRecord(const CacheStore &store, const std::string &key,
                                           const std::string &plugin);

/// Stores `record` under `key` (stamped with the current time).
void storeProbeRecord(CacheStore &store, const std::string &key, ProbeRecord record);

} // namespace backplane::detail
