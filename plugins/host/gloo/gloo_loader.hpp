// The host plugin's Gloo module, opened with dlopen when collectives are first needed.
#pragma once

#include "gloo_module.h"

#include <mutex>
#include <string>

namespace backplane::host {

/// Finds and opens the Gloo module (gloo_module.h) once, the way the CUDA plugin opens NCCL: by
/// the first device_info or collective call, never at plugin_init or probe, so a machine without
/// the module or libgloo keeps every other feature of the plugin. The module comes from
/// BACKPLANE_GLOO_MODULE, else the option collectives.module, else the directory of the plugin's
/// own library. Opened once and never closed: Gloo's device threads outlive any one call.
/// Thread-safe.
class GlooLoader {
public:
    /// `configured`: the option collectives.module ("" for none); the environment variable
    /// overrides it, read here.
    explicit GlooLoader(std::string configured);
    GlooLoader(const GlooLoader &) = delete;
    GlooLoader &operator=(const GlooLoader &) = delete;

    /// The module's table, or NULL when the module or libgloo is missing or the module is not
    /// the one this plugin was built with.
    const bp_host_gloo_api *api();
    /// bp_device_info::collectives: "gloo 0.5.0 (tcp)", or why there are no collectives (which
    /// file, what the loader said, what to install).
    const std::string &status();
    /// The table; throws sdk::Error(BP_ERROR_UNSUPPORTED, "<operation>: no collectives: <status>")
    /// when there is none.
    const bp_host_gloo_api &require(const std::string &operation);

private:
    void load();

    std::string path_;
    std::string source_; ///< where path_ came from, for messages
    std::once_flag once_;
    const bp_host_gloo_api *api_ = nullptr;
    std::string status_;
};

} // namespace backplane::host
