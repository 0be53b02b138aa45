// PluginManifest: the small JSON file that describes a plugin before its library is opened.
#pragma once

#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>

namespace backplane::detail {

/// A parsed manifest: {"name", "library", "abi_version": "MAJOR.MINOR", "backend", "description"}.
struct PluginManifest {
    std::filesystem::path file;    ///< the manifest itself
    std::string name;              ///< plugin name; equals the table's plugin_name
    std::filesystem::path library; ///< resolved: relative paths are relative to file's directory
    uint32_t abiMajor = 0;
    uint32_t abiMinor = 0;
    std::string backend;           ///< backend kind ("cuda", "vulkan", "host"...)
    std::string description;
};

/// Why a manifest is unusable; the message names the file and the JSON path.
class ManifestError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Reads and checks one manifest file. Throws ManifestError. Never opens the library.
PluginManifest readManifest(const std::filesystem::path &file);

} // namespace backplane::detail
