// Options of the CUDA / HIP plugin, parsed from bp_plugin_init_args::options_json.
#pragma once

#include <string>
#include <string_view>

namespace backplane::gpu {

/// The settings a config file may give the plugin under `plugins.options.cuda` (or `.hip`).
struct GpuOptions {
    /// "nccl": {"library": PATH} ("rccl" for HIP): the collective library to open instead of the
    /// default soname (vendor.hpp kCollectivesLibrary); "" for the default. The environment
    /// variable kCollectivesEnvironment overrides it.
    std::string collectivesLibrary;
};

/// Parses the options JSON text. Throws sdk::Error(BP_ERROR_INVALID_ARGUMENT) whose message names
/// the offending key and what it accepts.
GpuOptions parseGpuOptions(std::string_view json);

} // namespace backplane::gpu
