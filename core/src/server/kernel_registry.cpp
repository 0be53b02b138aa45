// KernelRegistry: variant choice, in-memory table, disk cache, compiles outside the table's lock.
#include "server/kernel_registry.hpp"

#include "cache/kernel_cache.hpp"

#include <backplane/cache.hpp>
#include <backplane/log.hpp>

#include <cstdio>

namespace backplane::detail {
namespace {

// The cache's FNV-1a over raw bytes (kernel keys hash names, sources and function pointers).
uint64_t fnv1a(const void *data, size_t size, uint64_t h = 0xcbf29ce484222325ull) {
    return fnv1a64({static_cast<const unsigned char *>(data), size}, h);
}

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

} // namespace

KernelRegistry::KernelRegistry(std::shared_ptr<Driver> driver, const Config &config)
    : driver_(std::move(driver)), config_(config) {}

const KernelVariant &KernelRegistry::variantFor(const KernelSource &kernel) const {
    const DeviceInfo &d = driver_->info();
    for (const KernelVariant &v : kernel.variants)
        if (d.accepts(v.dialect)) return v;
    std::string given;
    for (const KernelVariant &v : kernel.variants)
        given += std::string(given.empty() ? "" : ", ") + toString(v.dialect);
    throw Error(ErrorCode::Unsupported,
                "kernel '" + kernel.name + "' has no variant " + d.id() +
                    " accepts (variants: " + (given.empty() ? "none" : given) +
                    "); add a variant in one of the device's dialects",
                d.backend);
}

bp_kernel *KernelRegistry::find(const KernelSource &kernel) {
    const KernelVariant &variant = variantFor(kernel);
    const uint64_t key = fastKey(kernel.name, variant);
    std::promise<bp_kernel *> promise;
    Entry *mine = nullptr;
    std::shared_future<bp_kernel *> pending;
    {
        std::lock_guard lock(mutex_);
        auto &bucket = entries_[key];
        for (const auto &entry : bucket)
            if (entry->name == kernel.name && sameVariant(entry->variant, variant)) {
                if (entry->ready != nullptr) {
                    memoryHits_.fetch_add(1, std::memory_order_relaxed);
                    return entry->ready;
                }
                pending = entry->loaded;
                break;
            }
        if (!pending.valid()) {
            auto entry = std::make_unique<Entry>();
            entry->variant = variant;
            entry->name = kernel.name;
            entry->loaded = promise.get_future().share();
            mine = entry.get();
            bucket.push_back(std::move(entry));
        }
    }
    if (mine == nullptr) {
        // Ready, or another thread is compiling it: wait for that one (only this caller waits).
        bp_kernel *handle = pending.get();
        memoryHits_.fetch_add(1, std::memory_order_relaxed);
        return handle;
    }
    try {
        KernelOwner owner = build(kernel, variant);
        bp_kernel *handle = owner.get();
        {
            std::lock_guard lock(mutex_);
            mine->kernel = std::move(owner);
            mine->ready = handle;
        }
        promise.set_value(handle);
        return handle;
    } catch (...) {
        promise.set_exception(std::current_exception());
        std::lock_guard lock(mutex_);
        auto &bucket = entries_[key];
        std::erase_if(bucket, [&](const auto &entry) { return entry.get() == mine; });
        throw;
    }
}

KernelOwner KernelRegistry::build(const KernelSource &kernel, const KernelVariant &variant) {
    const auto dialect = static_cast<bp_dialect>(variant.dialect);
    bp_host_kernel_source hostSource{sizeof(bp_host_kernel_source), variant.hostFunction};
    const void *source = variant.source.data();
    size_t sourceSize = variant.source.size();
    if (variant.dialect == Dialect::Host) {
        if (variant.hostFunction == nullptr)
            throw Error(ErrorCode::InvalidArgument,
                        "kernel '" + kernel.name + "': its host variant has no function");
        source = &hostSource;
        sourceSize = sizeof(hostSource);
    }
    const bool portable =
        driver_->hasCapability(BP_CAPABILITY_PORTABLE_BINARIES) && config_.cacheEnabled;
    const std::string key = portable ? diskCacheKey(variant) : std::string();
    if (portable) {
        if (auto blob = loadCachedKernel(config_, key)) {
            try {
                KernelOwner loaded = driver_->load(kernel.name, dialect, variant.entryPoint,
                                                   blob->data(), blob->size());
                diskHits_.fetch_add(1, std::memory_order_relaxed);
                return loaded;
            } catch (const Error &e) {
                log::write(log::Subsystem::Cache, log::Level::Warn,
                           "cached binary of kernel '" + kernel.name +
                               "' did not load, recompiling: " + e.what());
            }
        }
    }
    CompiledKernel compiled = driver_->compile(kernel.name, dialect, variant.entryPoint, source,
                                               sourceSize, variant.options);
    compiled_.fetch_add(1, std::memory_order_relaxed);
    KernelOwner loaded = driver_->load(kernel.name, dialect, variant.entryPoint,
                                       compiled.binary.data(), compiled.binary.size());
    if (portable) storeCachedKernel(config_, key, compiled.binary);
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
