// Reading one cache entry file's bytes (the format CacheStore writes); a seam for the fuzzer.
#pragma once

#include <span>
#include <string>
#include <vector>

namespace backplane::detail {

/// One entry file, checked and split, or why it is unusable.
struct CacheEntryView {
    bool ok = false;                    ///< header, size and checksum agree; key and payload set
    std::string key;                    ///< the full key stored in the entry (version prefix too)
    std::vector<unsigned char> payload; ///< the stored bytes
    std::string problem;                ///< when !ok: why ("bad magic", "checksum mismatch"...)
};

/// Checks the bytes of an entry file exactly as CacheStore::load does (any key accepted).
/// Never throws except std::bad_alloc.
CacheEntryView parseCacheEntry(std::span<const unsigned char> file);

} // namespace backplane::detail
