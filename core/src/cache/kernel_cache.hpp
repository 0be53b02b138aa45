// On-disk cache of compiled kernel blobs, shared by processes (the engine's compile path uses it).
#pragma once

#include <backplane/config.hpp>

#include <optional>
#include <string>
#include <vector>

namespace backplane::detail {

/// Returns the blob stored under `key`, or nothing (missing, corrupt, caching disabled). A
/// corrupt entry is logged and ignored, never trusted. Thread- and process-safe.
std::optional<std::vector<unsigned char>> loadCachedKernel(const Config &config,
                                                           const std::string &key);

/// Publishes a blob atomically (temp file + rename). Failures (read-only or full disk) only log a
/// warning: the cache degrades to memory.
void storeCachedKernel(const Config &config, const std::string &key,
                       const std::vector<unsigned char> &blob);

/// Removes the entry under `key` (a blob that checks out but that the plugin refused) and returns
/// the file it lived in, for messages ("" when the cache is memory only). Never throws for I/O.
std::string evictCachedKernel(const Config &config, const std::string &key);

} // namespace backplane::detail
