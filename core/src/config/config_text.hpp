// Reading a config from text (what readConfigFile does after reading the file); for the fuzzer.
#pragma once

#include <backplane/config.hpp>

#include <filesystem>
#include <string_view>

namespace backplane::detail {

/// Parses config JSON `text` as if read from `origin`: the same checks and messages as
/// readConfigFile (relative paths resolve against origin's directory). Throws Error(Config).
Config parseConfigText(std::string_view text, const std::filesystem::path &origin);

} // namespace backplane::detail
