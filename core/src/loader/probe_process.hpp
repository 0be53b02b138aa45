// Probing a plugin in a child process (backplane-probe) with a timeout, so a plugin that crashes,
// aborts or hangs while it starts is reported instead of taking the host down.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace backplane::detail {

/// One plugin to probe in a child.
struct ProbeRequest {
    std::filesystem::path library; ///< the plugin library (already through the ELF check)
    std::string name;              ///< the manifest's plugin name
    std::string cacheDir;          ///< what plugin_init gets as cache_dir ("" = none)
    std::string optionsJson;       ///< what plugin_init gets as options_json
};

/// How a child probe ended.
struct ProbeAnswer {
    enum class Outcome {
        Answered,     ///< the child reported a result (any state) and exited cleanly
        Crashed,      ///< the plugin killed it (signal, exit) before it answered
        TimedOut,     ///< no answer within the timeout; the child was killed
        NotStarted,   ///< no child could be started (out of descriptors, processes...)
        HelperFailed, ///< the child ended before it even loaded the plugin: the helper's fault
    };
    Outcome outcome = Outcome::NotStarted;
    std::string stage;       ///< the last stage the child announced ("probe", "plugin_init"...)
    std::string reason;      ///< for Crashed/TimedOut/NotRun: what happened, in words
    nlohmann::json result;   ///< for Answered: the child's result object
};

/// The backplane-probe program to run: BACKPLANE_PROBE_HELPER, else the build tree's when
/// libbackplane runs from the build tree, else the install's libexec/backplane/backplane-probe
/// next to libbackplane, else the configured install path. "" when none exists.
std::filesystem::path probeHelperPath();

/// Runs `helper` once per request, at most `parallel` at a time, each with `timeoutMs` from its
/// own start, and returns one answer per request in order. Never throws for a child's failure.
/// Safe to call from a multithreaded process (posix_spawn). Each child gets its own process
/// group, killed when the child ends or times out, and dies with this process.
std::vector<ProbeAnswer> runProbes(const std::filesystem::path &helper,
                                   const std::vector<ProbeRequest> &requests, uint32_t timeoutMs,
                                   unsigned parallel);

/// "10 s", "1 s", "0.5 s": a timeout as the reports write it.
std::string secondsText(uint32_t ms);

} // namespace backplane::detail
