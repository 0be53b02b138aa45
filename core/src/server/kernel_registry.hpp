// KernelRegistry: the loaded kernels of one device; compiles and disk-cache I/O run outside locks.
#pragma once

#include "device/driver.hpp"

#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernel.hpp>

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace backplane::detail {

/// `error`, raised by a freshly compiled kernel, with a note that the cached binary `file` of
/// `kernelName` was discarded before (the message a user sees when healing did not help).
Error afterDiscardedBinary(const Error &error, const std::string &file,
                           const std::string &kernelName);

/// Compiled and loaded kernels of one device, found by the variant the device accepts. Thread-
/// safe: its own small lock guards the table only. The first caller of a kernel compiles (or
/// loads it from the disk cache) without any lock held; other callers of the same kernel wait for
/// that result, callers of other kernels and the rest of the engine go on. A failed compile is
/// not cached: the next call tries again.
///
/// Cached binaries heal: a blob from the disk cache whose checksum is fine but which the plugin
/// refuses (at kernel_load, or at a launch: Vulkan builds its pipeline there) is evicted, logged
/// with its file name, recompiled from source once and stored again, instead of failing every
/// run until `backplane cache clear`.
///
/// Launch path: each thread remembers its last hits (a few per thread, by the KernelSource's
/// address). A remembered hit is used only when the chosen variant still equals the entry's copy
/// in full (name, dialect, entry point, source, options, host function), so a KernelSource changed
/// in place finds its new kernel; it takes no lock and allocates nothing. Entries that were ever
/// ready live as long as the registry, and `epoch_` changes whenever a handle find() returned
/// stops being its entry's current one, which voids every remembered hit.
class KernelRegistry {
public:
    KernelRegistry(std::shared_ptr<Driver> driver, const Config &config);

    /// The loaded kernel for `kernel`. Throws Error(Unsupported) when no variant fits the device
    /// (a Host variant with hostData fits only a plugin of ABI 1.2 or newer), Error(Compile) with
    /// the log when compiling fails. A Host variant's hostData is kept (the first one seen for
    /// its key) as long as the kernel: until the registry is destroyed. A cached binary that does
    /// not load is discarded and the kernel recompiled (see the class comment).
    bp_kernel *find(const KernelSource &kernel);

    /// What recompileAfterLaunchFailure() gives the caller to retry with.
    struct Recompiled {
        bp_kernel *kernel = nullptr; ///< the fresh kernel; nullptr: report the launch error as is
        std::string discardedFile;   ///< the cache file of the binary it replaces
    };

    /// Called with no engine lock held after a launch of `failed` (a handle find() returned for
    /// `kernel`) failed with `error`. When that kernel came from the disk cache and the error is
    /// one a bad binary causes (Launch, Compile), evicts the cache entry (warning naming its
    /// file), recompiles from source, stores the fresh binary and returns the fresh kernel for one
    /// retry; that happens once per kernel, and concurrent callers wait for that one recompile.
    /// Otherwise returns {nullptr}. Throws the recompile's error, naming the discarded file.
    /// The replaced kernel lives as long as the registry (launches recorded with it may pend).
    Recompiled recompileAfterLaunchFailure(const KernelSource &kernel, bp_kernel *failed,
                                           const Error &error);

    uint64_t compiled() const noexcept { return compiled_.load(std::memory_order_relaxed); }
    uint64_t memoryHits() const noexcept { return memoryHits_.load(std::memory_order_relaxed); }
    uint64_t diskHits() const noexcept { return diskHits_.load(std::memory_order_relaxed); }

private:
    struct Entry {
        /// Copy, to verify fast-key hits. Its hostData is what the kernel's user_data points at:
        /// declared before `kernel`, so it outlives it.
        KernelVariant variant;
        std::string name;
        std::shared_future<bp_kernel *> loaded; ///< for callers that arrive while it compiles
        KernelOwner kernel; ///< set by the compiling thread under the lock
        bp_kernel *ready = nullptr; ///< kernel.get() once loaded (guarded by the lock)
        bool fromDisk = false;      ///< `kernel` is a disk-cache binary not yet replaced (guarded)
        bp_kernel *discarded = nullptr; ///< the disk-cache kernel a recompile replaced (guarded)
        std::string discardedFile;      ///< its cache file (guarded)
    };
    /// A replaced kernel and the host data it may still read (an entry erased after a failed
    /// recompile no longer holds it). `kernel` is declared last, so it is released first.
    struct Retired {
        std::shared_ptr<const void> hostData;
        KernelOwner kernel;
    };
    struct Built {
        KernelOwner kernel;
        bool fromDisk = false;
    };

    Entry *findEntryLocked(uint64_t key, const KernelSource &kernel, const KernelVariant &variant);
    /// The slow path of find(): the table under its lock, compiling on a miss.
    bp_kernel *findInTable(const KernelSource &kernel, const KernelVariant &variant);
    const KernelVariant &variantFor(const KernelSource &kernel) const;
    Built build(const KernelSource &kernel, const KernelVariant &variant);
    /// Compiles from source and loads; stores the blob under `diskKey` unless it is empty.
    KernelOwner compileAndLoad(const KernelSource &kernel, const KernelVariant &variant,
                               const std::string &diskKey);
    std::string diskCacheKey(const KernelVariant &variant) const;

    std::shared_ptr<Driver> driver_;
    Config config_;
    /// Names this registry in the threads' remembered hits; unique in the process, never reused.
    const uint64_t id_;
    /// Changes (under mutex_) whenever an entry's ready kernel is replaced or an entry that was
    /// ready leaves the table: remembered hits of an older epoch are not used.
    std::atomic<uint64_t> epoch_{0};
    std::mutex mutex_;
    std::unordered_map<uint64_t, std::vector<std::unique_ptr<Entry>>> entries_;
    /// Kernels replaced after their cached binary failed (guarded by mutex_): launches recorded
    /// with them may still be pending, so they are released with the registry.
    std::vector<Retired> retired_;
    /// Entries that were ready once and left the table (guarded by mutex_): a thread's remembered
    /// hit may still point at one (and then finds the epoch changed), so they are kept.
    std::vector<std::unique_ptr<Entry>> formerEntries_;
    std::atomic<uint64_t> compiled_{0};
    std::atomic<uint64_t> memoryHits_{0};
    std::atomic<uint64_t> diskHits_{0};
};

} // namespace backplane::detail
