// The probe cache: what the isolated probe of one plugin library answered, so later starts run
// no child process. Kept in the cache directory's probes/ (CacheKind::Probes).
#pragma once

#include "loader/plugin_probe.hpp"

#include <backplane/cache.hpp>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

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
    int64_t recordedUnix = 0;
};

/// A timed-out probe may have waited on something transient (a device being reset), so its
/// record is retried after this long; a crash record lasts until the library file changes.
inline constexpr int64_t kTimeoutRecordSeconds = 600;

/// The cache key of `library` probed with `options`: its canonical path, size, modification
/// time, inode and device, and a hash of the options and cache directory handed to
/// plugin_init. Replacing or touching the file changes it. nullopt when the file cannot be
/// examined.
std::optional<std::string> probeCacheKey(const std::filesystem::path &library,
                                         const PluginInitOptions &options);

/// The record under `key`, or nothing (missing, unreadable, expired). A malformed record is
/// ignored with a warning and replaced by the next store.
std::optional<ProbeRecord> loadProbeRecord(const CacheStore &store, const std::string &key);

/// Stores `record` under `key` (stamped with the current time).
void storeProbeRecord(CacheStore &store, const std::string &key, ProbeRecord record);

} // namespace backplane::detail
