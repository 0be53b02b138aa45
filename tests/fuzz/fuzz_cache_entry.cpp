// Fuzzes the kernel/tuning cache entry reader (detail::parseCacheEntry: header, size, checksum).
#include "cache/cache_entry.hpp"
#include "fuzz_check.hpp"

#include <span>

namespace {
/// magic, format version, key size, payload size, checksum (core/src/cache/cache_store.cpp).
constexpr size_t kHeaderSize = 32;
} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    backplane::fuzz::expectReturnOrError("cache-entry reader", [&] {
        const backplane::detail::CacheEntryView entry =
            backplane::detail::parseCacheEntry(std::span<const unsigned char>(data, size));
        if (entry.ok && kHeaderSize + entry.key.size() + entry.payload.size() != size)
            backplane::fuzz::finding("cache-entry reader",
                                     "accepted an entry whose parts do not add up to its size");
        if (!entry.ok && entry.problem.empty())
            backplane::fuzz::finding("cache-entry reader", "rejected an entry without a reason");
    });
    return 0;
}
