// Kernel blob cache: the engine's compiled kernels, kept in the shared CacheStore (kernels/).
#include "kernel_cache.hpp"

#include <backplane/cache.hpp>

namespace backplane::detail {

std::optional<std::vector<unsigned char>> loadCachedKernel(const Config &config,
                                                           const std::string &key) {
    return CacheStore::forConfig(config).load(CacheKind::Kernels, key);
}

void storeCachedKernel(const Config &config, const std::string &key,
                       const std::vector<unsigned char> &blob) {
    CacheStore::forConfig(config).store(CacheKind::Kernels, key, std::span(blob));
}

std::string evictCachedKernel(const Config &config, const std::string &key) {
    CacheStore &store = CacheStore::forConfig(config);
    store.remove(CacheKind::Kernels, key);
    return store.entryPath(CacheKind::Kernels, key).string();
}

} // namespace backplane::detail
