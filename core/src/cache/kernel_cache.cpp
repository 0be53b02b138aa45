// Kernel blob cache: placeholder that caches nothing until the persistent store lands.
#include "kernel_cache.hpp"

namespace backplane::detail {

std::optional<std::vector<unsigned char>> loadCachedKernel(const Config &, const std::string &) {
    return std::nullopt;
}

void storeCachedKernel(const Config &, const std::string &, const std::vector<unsigned char> &) {}

} // namespace backplane::detail
