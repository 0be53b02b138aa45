// PluginManifest: the small JSON file that describes a plugin before its library is opened.
#pragma once

#include <backplane/error.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

/// A parsed manifest: {"name", "library", "abi_version": "MAJOR.MINOR", "backend", "description"},
/// optionally "conformance".
struct PluginManifest {
    std::filesystem::path file;    ///< the manifest itself
    std::string name;              ///< plugin name; equals the table's plugin_name
    std::filesystem::path library; ///< resolved: relative paths are relative to file's directory
    uint32_t abiMajor = 0;
    uint32_t abiMinor = 0;
    std::string backend;           ///< backend kind ("cuda", "vulkan", "host"...)
    std::string description;
    /// "conformance": {"expected_failures": [case names]}: optional; conformance cases the plugin
    /// is known to fail.
    std::vector<std::string> expectedFailures;
};

/// Why a manifest is unusable; the message names the file and the JSON pointer.
class ManifestError : public Error {
public:
    explicit ManifestError(const std::string &message) : Error(ErrorCode::PluginLoad, message) {}
};

/// Reads and checks one manifest file (at most kManifestJsonLimits: 256 KiB, 32 levels).
/// Throws ManifestError for any malformed input. Never opens the library.
PluginManifest readManifest(const std::filesystem::path &file);

/// readManifest on text already read from `file` (relative library paths resolve against it).
PluginManifest parseManifest(std::string_view text, const std::filesystem::path &file);

} // namespace backplane::detail
