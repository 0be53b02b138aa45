// Device selectors ("cuda:0", "vulkan:<uuid prefix>", "hip", "*:gpu", "*"): parsing and matching.
#pragma once

#include <backplane/config.hpp>
#include <backplane/device.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace backplane::detail {

/// One parsed selector. Plain value.
struct DeviceSelector {
    enum class Kind {
        Any,          ///< "*"
        AnyGpu,       ///< "*:gpu": discrete, integrated or virtual GPU
        AnyCpu,       ///< "*:cpu"
        Backend,      ///< "cuda" or "cuda:*": every device of that plugin
        BackendIndex, ///< "cuda:1"
        BackendUuid,  ///< "cuda:<uuid>" or a prefix of it (hex digits, dashes ignored)
    };
    Kind kind = Kind::Any;
    std::string text;       ///< as written
    std::string backend;    ///< plugin name for the Backend* kinds
    uint32_t index = 0;     ///< BackendIndex
    std::string uuidPrefix; ///< BackendUuid: lower-case hex digits without dashes

    /// True when this route matches (for BackendUuid: its UUID starts with the prefix).
    bool matches(const DeviceInfo &route) const;
    /// True when the selector can only match devices of one named plugin.
    bool namesBackend() const { return !backend.empty(); }
};

/// Where `config`'s device preference came from, as messages name it: "BACKPLANE_DEVICE",
/// "<file> devices.prefer", or "devices.prefer" (defaults or code).
std::string preferenceOrigin(const Config &config);

/// Parses one selector (surrounding spaces ignored). Throws Error(Config) saying what is wrong
/// and what the forms are; callers prefix the location (file and JSON path, or variable).
DeviceSelector parseSelector(std::string_view text);

} // namespace backplane::detail
