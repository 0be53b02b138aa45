// KernelRegistry: the loaded kernels of one device; compiles and disk-cache I/O run outside locks.
#pragma once

#include "server/driver.hpp"

#include <backplane/config.hpp>
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

/// Compiled and loaded kernels of one device, found by the variant the device accepts. Thread-
/// safe: its own small lock guards the table only. The first caller of a kernel compiles (or
/// loads it from the disk cache) without any lock held; other callers of the same kernel wait for
/// that result, callers of other kernels and the rest of the engine go on. A failed compile is
/// not cached: the next call tries again.
class KernelRegistry {
public:
    KernelRegistry(std::shared_ptr<Driver> driver, const Config &config);

    /// The loaded kernel for `kernel`. Throws Error(Unsupported) when no variant fits the device,
    /// Error(Compile) with the log when compiling fails.
    bp_kernel *find(const KernelSource &kernel);

    uint64_t compiled() const noexcept { return compiled_.load(std::memory_order_relaxed); }
    uint64_t memoryHits() const noexcept { return memoryHits_.load(std::memory_order_relaxed); }
    uint64_t diskHits() const noexcept { return diskHits_.load(std::memory_order_relaxed); }

private:
    struct Entry {
        KernelVariant variant; ///< copy, to verify fast-key hits
        std::string name;
        std::shared_future<bp_kernel *> loaded; ///< for callers that arrive while it compiles
        KernelOwner kernel; ///< set by the compiling thread under the lock
        bp_kernel *ready = nullptr; ///< kernel.get() once loaded (guarded by the lock)
    };

    const KernelVariant &variantFor(const KernelSource &kernel) const;
    KernelOwner build(const KernelSource &kernel, const KernelVariant &variant);
    std::string diskCacheKey(const KernelVariant &variant) const;

    std::shared_ptr<Driver> driver_;
    Config config_;
    std::mutex mutex_;
    std::unordered_map<uint64_t, std::vector<std::unique_ptr<Entry>>> entries_;
    std::atomic<uint64_t> compiled_{0};
    std::atomic<uint64_t> memoryHits_{0};
    std::atomic<uint64_t> diskHits_{0};
};

} // namespace backplane::detail
