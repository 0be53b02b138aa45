// CacheStore: the one on-disk cache directory (kernels, tuning results, pipeline caches).
#pragma once

#include <backplane/config.hpp>
#include <backplane/device.hpp>

#include <cstdint>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane {

/// The parts of the cache directory. Each kind is one subdirectory: kernels/ (compiled kernel
/// blobs, `<hash>.bin`), tune/ (autotune results, `<hash>.json`), pipelines/ (plugin-owned
/// pipeline caches, e.g. Vulkan's; the store only reports and clears it), probes/ (what each
/// plugin library's isolated probe answered, `<hash>.json`; docs/plugin-abi.md).
enum class CacheKind { Kernels, Tune, Pipelines, Probes };
inline constexpr int kCacheKindCount = 4;

/// Stable lower-case name: "kernels", "tune", "pipelines", "probes" (also the subdirectory name).
const char *toString(CacheKind kind) noexcept;

/// The cache directory in effect for `config`, first match wins: config.cacheDir,
/// BACKPLANE_CACHE_DIR, $XDG_CACHE_HOME/backplane, $HOME/.cache/backplane; "" when none of them
/// is set or config.cacheEnabled is false (memory only). Does not create it.
std::filesystem::path cacheDirectory(const Config &config);

/// The identity of a device for cache keys: backend, name, arch, driver version and UUID (when
/// the plugin reports one). Two devices with equal fingerprints may share compiled kernels and
/// tuning results; a driver update changes it, so old entries stop being used.
std::string deviceFingerprint(const DeviceInfo &device);

/// FNV-1a, 64 bits: the checksum of cache entries and the hash behind their file names. Not
/// cryptographic; corruption detection only.
uint64_t fnv1a64(std::span<const unsigned char> bytes, uint64_t seed = 0xcbf29ce484222325ull);
uint64_t fnv1a64(std::string_view text, uint64_t seed = 0xcbf29ce484222325ull);

/// Sizes of one kind of entries on disk.
struct CacheUsage {
    CacheKind kind = CacheKind::Kernels;
    uint64_t files = 0;
    uint64_t bytes = 0;
};

/// A key-value store of byte blobs under one cache directory, shared safely by threads and
/// processes.
///
/// Every entry file carries a header (magic, format version, the full key, payload size and an
/// FNV-1a checksum of key and payload). The file name is a hash of the key, and the key stored
/// inside is compared on read, so a hash collision or an entry written by another backplane
/// version (the version is part of every key) is a miss, never a wrong hit. A truncated or
/// corrupt file is ignored with one warning (log subsystem Cache) and replaced by the next
/// store(). Writes publish atomically: a temporary file in the same directory, fsync, rename;
/// readers see the old entry or the new one, never a torn one.
///
/// An empty directory means memory only. When the directory cannot be created or written
/// (read-only, disk full, no permission) the store logs one warning and keeps further entries in
/// memory for the life of the process; reads still look on disk.
///
/// Thread-safety: every member function may be called concurrently.
class CacheStore {
public:
    /// A store rooted at `directory` ("" = memory only). Creates nothing until the first store().
    explicit CacheStore(std::filesystem::path directory);

    /// The process-wide store for `config`'s directory (one per distinct directory; lives until
    /// exit). What the engine's kernel cache and the default tuner use.
    static CacheStore &forConfig(const Config &config);

    /// The root directory ("" when memory only).
    const std::filesystem::path &directory() const noexcept { return directory_; }
    /// False when memory only, or after a write failure degraded the store to memory.
    bool persistent() const noexcept;

    /// The payload stored under `key`, or nothing (missing, corrupt, other version).
    std::optional<std::vector<unsigned char>> load(CacheKind kind, std::string_view key) const;
    /// Publishes `payload` under `key`, replacing any older entry. Returns false when it could
    /// only be kept in memory (the reason was logged once). A directory that vanished (a
    /// concurrent clear()) is created again; it never degrades the store. Never throws for I/O
    /// problems.
    bool store(CacheKind kind, std::string_view key, std::span<const unsigned char> payload);
    bool store(CacheKind kind, std::string_view key, std::string_view payload);
    /// Removes the entry under `key` (disk and memory). Missing entries are fine.
    void remove(CacheKind kind, std::string_view key);

    /// Every valid entry of `kind` written by this backplane version: (key, payload). Corrupt
    /// files are skipped with a warning. Order: by file name.
    std::vector<std::pair<std::string, std::vector<unsigned char>>> entries(CacheKind kind) const;
    /// Files and bytes per kind on disk (temporary files included).
    std::vector<CacheUsage> usage() const;
    /// Deletes every file of `kind` (and the memory entries). Returns the number of files
    /// removed. Safe against concurrent writers and clears: a file that vanished meanwhile is not
    /// an error, and an entry stored while the clear runs may stay. Throws Error(Internal) naming
    /// the path when a file cannot be removed (permission, I/O).
    uint64_t clear(CacheKind kind);

    /// The file an entry lives in (whether or not it exists); "" when memory only.
    std::filesystem::path entryPath(CacheKind kind, std::string_view key) const;

private:
    std::string fullKey(std::string_view key) const;
    void degrade(const std::string &reason) const;

    std::filesystem::path directory_;
    mutable std::mutex mutex_;
    mutable bool degraded_ = false;
    /// Entries kept in memory (memory-only or degraded stores): kind, full key -> payload.
    std::map<std::pair<CacheKind, std::string>, std::vector<unsigned char>> memory_;
};

} // namespace backplane
