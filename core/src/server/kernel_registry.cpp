// KernelRegistry: variant choice, in-memory table, disk cache and its healing, compiles outside the
// table's lock.
#include "server/kernel_registry.hpp"

#include "cache/kernel_cache.hpp"

#include <backplane/cache.hpp>
#include <backplane/log.hpp>

#include <cstdio>
#include <exception>
#include <optional>

namespace backplane::detail {
namespace {

// The cache's FNV-1a over raw bytes (kernel keys hash names, sources and function pointers).
uint64_t fnv1a(const void *data, size_t size, uint64_t h = 0xcbf29ce484222325ull) {
    return fnv1a64({static_cast<const unsigned char *>(data), size}, h);
}

// Not hostData: a host variant's data is named by its key (`source`), so a KernelSource rebuilt
// per call with a new data object finds the kernel compiled first (which keeps its own data).
bool sameVariant(const KernelVariant &a, const KernelVariant &b) {
    return a.dialect == b.dialect && a.hostFunction == b.hostFunction &&
           a.entryPoint == b.entryPoint && a.source == b.source && a.options == b.options;
}

uint64_t fastKey(const std::string &name, const KernelVariant &variant) {
    uint64_t key = fnv1a(name.data(), name.size());
    key = fnv1a(variant.entryPoint.data(), variant.entryPoint.size(), key);
    const auto fn = reinterpret_cast<uintptr_t>(variant.hostFunction);
    key = fnv1a(&fn, sizeof(fn), key);
    const uint64_t tail[3] = {static_cast<uint64_t>(variant.dialect), variant.source.size(),
                              variant.options.size()};
    return fnv1a(tail, sizeof(tail), key);
}

std::atomic<uint64_t> nextRegistryId{1};

/// A hit the calling thread remembers: `entry` of registry `registry` was found for the
/// KernelSource at `source` while that registry's epoch was `epoch`, and its kernel was `kernel`.
/// Plain data: nothing is owned, and nothing is read through `entry` unless registry and epoch
/// still match (the registry then keeps the entry alive).
struct RememberedHit {
    uint64_t registry = 0; ///< 0: empty (registry ids start at 1)
    uint64_t epoch = 0;
    const KernelSource *source = nullptr;
    const void *entry = nullptr;
    bp_kernel *kernel = nullptr;
};

// Direct-mapped by the KernelSource's address and the registry: a launch loop over a few kernels
// on a few devices hits; a collision only costs the table lookup.
constexpr size_t kRememberedHits = 16;
thread_local RememberedHit tRemembered[kRememberedHits];

RememberedHit &rememberedFor(uint64_t registry, const KernelSource &kernel) {
    const auto address = reinterpret_cast<uintptr_t>(&kernel);
    return tRemembered[((address >> 4) ^ (registry * 7)) % kRememberedHits];
}

} // namespace

Error afterDiscardedBinary(const Error &error, const std::string &file,
                           const std::string &kernelName) {
    return Error(error.code(),
                 std::string(error.what()) + " (after discarding the cached binary " + file +
                     " of kernel '" + kernelName + "' and recompiling it from source)",
                 error.backend(), error.vendorCode());
}

KernelRegistry::KernelRegistry(std::shared_ptr<Driver> driver, const Config &config)
    : driver_(std::move(driver)), config_(config),
      id_(nextRegistryId.fetch_add(1, std::memory_order_relaxed)) {}

const KernelVariant &KernelRegistry::variantFor(const KernelSource &kernel) const {
    const DeviceInfo &d = driver_->info();
    // A plugin older than ABI 1.2 would drop bp_host_kernel_source::user_data without a word.
    const bool takesHostData = driver_->plugin().abiMinor() >= 2;
    const auto needsData = [](const KernelVariant &v) {
        return v.dialect == Dialect::Host && v.hostData != nullptr;
    };
    bool skippedData = false;
    for (const KernelVariant &v : kernel.variants) {
        if (!d.accepts(v.dialect)) continue;
        if (needsData(v) && !takesHostData) {
            skippedData = true;
            continue;
        }
        return v;
    }
    std::string given;
    for (const KernelVariant &v : kernel.variants)
        given += std::string(given.empty() ? "" : ", ") + toString(v.dialect) +
                 (needsData(v) ? " with data" : "");
    const std::string why =
        skippedData ? "; plugin '" + driver_->plugin().name() + "' speaks ABI " +
                          std::to_string(driver_->plugin().api().abi_major) + "." +
                          std::to_string(driver_->plugin().abiMinor()) +
                          "; host kernels with data need 1.2: update the plugin, or add a "
                          "variant without data"
                    : "; add a variant in one of the device's dialects";
    throw Error(ErrorCode::Unsupported,
                "kernel '" + kernel.name + "' has no variant " + d.id() +
                    " accepts (variants: " + (given.empty() ? "none" : given) + ")" + why,
                d.backend);
}

KernelRegistry::Entry *KernelRegistry::findEntryLocked(uint64_t key, const KernelSource &kernel,
                                                       const KernelVariant &variant) {
    auto it = entries_.find(key);
    if (it == entries_.end()) return nullptr;
    for (const auto &entry : it->second)
        if (entry->name == kernel.name && sameVariant(entry->variant, variant)) return entry.get();
    return nullptr;
}

bp_kernel *KernelRegistry::find(const KernelSource &kernel) {
    const KernelVariant &variant = variantFor(kernel);
    // The launch path: this thread's remembered hit, checked against the full variant (the
    // caller may have changed its KernelSource in place since).
    const RememberedHit &hit = rememberedFor(id_, kernel);
    if (hit.registry == id_ && hit.source == &kernel &&
        hit.epoch == epoch_.load(std::memory_order_acquire)) {
        const auto *entry = static_cast<const Entry *>(hit.entry);
        if (entry->name == kernel.name && sameVariant(entry->variant, variant)) {
            memoryHits_.fetch_add(1, std::memory_order_relaxed);
            return hit.kernel;
        }
    }
    return findInTable(kernel, variant);
}

bp_kernel *KernelRegistry::findInTable(const KernelSource &kernel, const KernelVariant &variant) {
    const uint64_t key = fastKey(kernel.name, variant);
    RememberedHit &hit = rememberedFor(id_, kernel);
    std::optional<std::promise<bp_kernel *>> promise; // made only by the caller that compiles
    Entry *mine = nullptr;
    std::shared_future<bp_kernel *> pending;
    {
        std::lock_guard lock(mutex_);
        if (Entry *entry = findEntryLocked(key, kernel, variant)) {
            if (entry->ready != nullptr) {
                memoryHits_.fetch_add(1, std::memory_order_relaxed);
                hit = {id_, epoch_.load(std::memory_order_relaxed), &kernel, entry, entry->ready};
                return entry->ready;
            }
            pending = entry->loaded;
        } else {
            promise.emplace();
            auto created = std::make_unique<Entry>();
            created->variant = variant;
            created->name = kernel.name;
            created->loaded = promise->get_future().share();
            mine = created.get();
            entries_[key].push_back(std::move(created));
        }
    }
    if (mine == nullptr) {
        // Another thread is compiling it (or recompiling it): wait for that one result.
        bp_kernel *handle = pending.get();
        memoryHits_.fetch_add(1, std::memory_order_relaxed);
        return handle;
    }
    try {
        Built built = build(kernel, variant);
        bp_kernel *handle = built.kernel.get();
        {
            std::lock_guard lock(mutex_);
            mine->kernel = std::move(built.kernel);
            mine->ready = handle;
            mine->fromDisk = built.fromDisk;
            hit = {id_, epoch_.load(std::memory_order_relaxed), &kernel, mine, handle};
        }
        promise->set_value(handle);
        return handle;
    } catch (...) {
        promise->set_exception(std::current_exception());
        std::lock_guard lock(mutex_);
        auto &bucket = entries_[key];
        std::erase_if(bucket, [&](const auto &entry) { return entry.get() == mine; });
        throw;
    }
}

KernelRegistry::Recompiled KernelRegistry::recompileAfterLaunchFailure(const KernelSource &kernel,
                                                                       bp_kernel *failed,
                                                                       const Error &error) {
    // Launch and Compile are what a plugin reports when it cannot build what a binary says (a
    // Vulkan pipeline); bad arguments, lost devices and full memory are not the binary's fault.
    if (error.code() != ErrorCode::Launch && error.code() != ErrorCode::Compile) return {};
    const KernelVariant &chosen = variantFor(kernel);
    const uint64_t key = fastKey(kernel.name, chosen);
    std::promise<bp_kernel *> promise;
    std::shared_future<bp_kernel *> pending;
    Entry *entry = nullptr;
    // The entry's own copy, not the caller's: a host variant's data may be another object than
    // the one the entry keeps alive, and the fresh kernel must point at the kept one.
    KernelVariant variant;
    {
        std::lock_guard lock(mutex_);
        entry = findEntryLocked(key, kernel, chosen);
        if (entry == nullptr) return {};
        variant = entry->variant;
        if (entry->discarded == failed) {
            // Another caller of the same kernel already replaced it (or is replacing it).
            if (entry->ready != nullptr) return {entry->ready, entry->discardedFile};
            pending = entry->loaded;
        } else if (entry->ready == failed && entry->fromDisk) {
            entry->fromDisk = false;
            entry->discarded = failed;
            entry->ready = nullptr; // callers of find() now wait for the recompile
            epoch_.fetch_add(1, std::memory_order_release); // and remembered hits are void
            entry->loaded = promise.get_future().share();
        } else {
            return {};
        }
    }
    if (pending.valid()) {
        bp_kernel *handle = pending.get();
        std::lock_guard lock(mutex_);
        return {handle, entry->discardedFile};
    }

    // This caller recompiles, with no lock held.
    const std::string diskKey = diskCacheKey(variant);
    const std::string file = evictCachedKernel(config_, diskKey);
    log::write(log::Subsystem::Cache, log::Level::Warn,
               "kernel '" + kernel.name + "' loaded from the cache file " + file +
                   " failed at launch (" + error.what() +
                   "); discarded that file, recompiling the kernel from source");
    try {
        KernelOwner fresh = compileAndLoad(kernel, variant, diskKey);
        bp_kernel *handle = fresh.get();
        {
            std::lock_guard lock(mutex_);
            entry->discardedFile = file;
            retired_.push_back({variant.hostData, std::move(entry->kernel)});
            entry->kernel = std::move(fresh);
            entry->ready = handle;
        }
        promise.set_value(handle);
        return {handle, file};
    } catch (...) {
        std::exception_ptr reported = std::current_exception();
        try {
            throw;
        } catch (const Error &e) {
            reported = std::make_exception_ptr(afterDiscardedBinary(e, file, kernel.name));
        } catch (...) {
        }
        promise.set_exception(reported);
        // Like a failed first compile: forget the entry, the next call starts over. The entry
        // itself is kept: a remembered hit of another thread may still point at it.
        {
            std::lock_guard lock(mutex_);
            retired_.push_back({variant.hostData, std::move(entry->kernel)});
            auto &bucket = entries_[key];
            for (auto &item : bucket)
                if (item.get() == entry) formerEntries_.push_back(std::move(item));
            std::erase_if(bucket, [](const auto &item) { return item == nullptr; });
            epoch_.fetch_add(1, std::memory_order_release);
        }
        std::rethrow_exception(reported);
    }
}

KernelRegistry::Built KernelRegistry::build(const KernelSource &kernel,
                                            const KernelVariant &variant) {
    // A host-dialect blob is a function pointer of this process, whatever the plugin declares
    // (ABI 1.5: PORTABLE_BINARIES covers the other dialects only).
    const bool portable = driver_->hasCapability(BP_CAPABILITY_PORTABLE_BINARIES) &&
                          variant.dialect != Dialect::Host && config_.cacheEnabled;
    const std::string key = portable ? diskCacheKey(variant) : std::string();
    if (!portable) return {compileAndLoad(kernel, variant, key), false};
    auto blob = loadCachedKernel(config_, key);
    if (!blob) return {compileAndLoad(kernel, variant, key), false};
    try {
        KernelOwner loaded = driver_->load(kernel.name, static_cast<bp_dialect>(variant.dialect),
                                           variant.entryPoint, blob->data(), blob->size());
        diskHits_.fetch_add(1, std::memory_order_relaxed);
        return {std::move(loaded), true};
    } catch (const Error &e) {
        // Full memory or a lost device say nothing about the binary: keep it.
        if (e.code() == ErrorCode::OutOfMemory || e.code() == ErrorCode::DeviceLost) throw;
        const std::string file = evictCachedKernel(config_, key);
        log::write(log::Subsystem::Cache, log::Level::Warn,
                   "cached binary " + file + " of kernel '" + kernel.name + "' did not load (" +
                       e.what() + "); discarded that file, recompiling the kernel from source");
        try {
            return {compileAndLoad(kernel, variant, key), false};
        } catch (const Error &fresh) {
            throw afterDiscardedBinary(fresh, file, kernel.name);
        }
    }
}

KernelOwner KernelRegistry::compileAndLoad(const KernelSource &kernel, const KernelVariant &variant,
                                           const std::string &diskKey) {
    const auto dialect = static_cast<bp_dialect>(variant.dialect);
    // user_data: the entry that holds `variant` keeps hostData alive as long as the kernel.
    const bp_host_kernel_source hostSource{sizeof(bp_host_kernel_source), variant.hostFunction,
                                           variant.hostData.get()};
    const void *source = variant.source.data();
    size_t sourceSize = variant.source.size();
    if (variant.dialect == Dialect::Host) {
        if (variant.hostFunction == nullptr)
            throw Error(ErrorCode::InvalidArgument,
                        "kernel '" + kernel.name + "': its host variant has no function");
        source = &hostSource;
        sourceSize = sizeof(hostSource);
    }
    CompiledKernel compiled = driver_->compile(kernel.name, dialect, variant.entryPoint, source,
                                               sourceSize, variant.options);
    compiled_.fetch_add(1, std::memory_order_relaxed);
    KernelOwner loaded = driver_->load(kernel.name, dialect, variant.entryPoint,
                                       compiled.binary.data(), compiled.binary.size());
    if (!diskKey.empty()) storeCachedKernel(config_, diskKey, compiled.binary);
    return loaded;
}

std::string KernelRegistry::diskCacheKey(const KernelVariant &v) const {
    const DeviceInfo &d = driver_->info();
    std::string key = std::string("backplane-") + BACKPLANE_VERSION + "|" +
                      driver_->plugin().name() + "-" + driver_->plugin().version() + "|" + d.arch +
                      "|" + d.driverVersion + "|" + d.uuidString() + "|" + toString(v.dialect) +
                      "|" + v.entryPoint + "|";
    uint64_t h = fnv1a(v.source.data(), v.source.size());
    for (const std::string &o : v.options) h = fnv1a(o.data(), o.size() + 1, h);
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    return key + hex + "|" + std::to_string(v.source.size());
}

} // namespace backplane::detail
