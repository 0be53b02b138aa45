// Reading JSON from files and strings that nobody vouches for: bounded, non-recursive, one error.
#pragma once

#include <backplane/error.hpp>

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>

namespace backplane::detail {

/// How much JSON a reader accepts; checked before and while parsing, so a hostile file costs at
/// most maxBytes of reading and maxDepth levels of containers. docs/config.md states the values.
struct JsonLimits {
    size_t maxBytes;   ///< larger input is refused before it is parsed
    uint32_t maxDepth; ///< objects and arrays nested deeper than this are refused
};

/// The config file (plugins.options included).
inline constexpr JsonLimits kConfigJsonLimits{1u << 20, 64};
/// A plugin manifest.
inline constexpr JsonLimits kManifestJsonLimits{256u << 10, 32};
/// Records the core wrote itself and reads back: tuning records, probe records, bundles.
inline constexpr JsonLimits kRecordJsonLimits{16u << 20, 32};
/// A plugin's `plugins.options` object, as handed to plugin_init.
inline constexpr JsonLimits kPluginOptionsJsonLimits{256u << 10, 32};

/// Parses `text` into JSON. Every failure, whatever its cause (syntax, a number out of range such
/// as 1e999, invalid UTF-8, too deep, too large), throws Error(`code`) with the message
/// "<origin>: <JSON pointer>: <what> (line L, column C)", so the user sees where. Iterative:
/// no recursion whose depth the input controls.
nlohmann::json parseJson(std::string_view text, const std::string &origin,
                         const JsonLimits &limits, ErrorCode code = ErrorCode::Config);

/// Reads `file` (at most limits.maxBytes; larger files are refused without reading them) and
/// parses it as parseJson does, with the file's name as origin. Throws Error(`code`) when the
/// file cannot be read, is not a regular file, or is malformed.
nlohmann::json readJsonFile(const std::filesystem::path &file, const JsonLimits &limits,
                            ErrorCode code = ErrorCode::Config);

/// Serialises `value` without ever throwing: invalid UTF-8 in strings (a plugin's device name,
/// say) is replaced by U+FFFD. Call only on values within a JsonLimits depth.
std::string dumpJson(const nlohmann::json &value, int indent = -1);

/// `text` as a JSON pointer token ("~" -> "~0", "/" -> "~1").
std::string pointerToken(std::string_view text);

} // namespace backplane::detail
