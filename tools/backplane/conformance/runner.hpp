// Runs the conformance suite against one plugin device, each case contained in a child process.
#pragma once

#include <backplane/raw_plugin.hpp>

#include <chrono>
#include <string>
#include <vector>

namespace backplane::conformance {

/// How one case ended.
enum class Result {
    Passed,
    Failed,          ///< a check failed (reason says which)
    Crashed,         ///< the case killed its process (signal or exit); counted as failed
    TimedOut,        ///< the case did not finish within the case timeout; counted as failed
    ExpectedFailure, ///< failed, crashed or timed out, and the manifest lists it
    UnexpectedPass,  ///< passed although the manifest lists it as an expected failure
    NotApplicable,   ///< the device lacks what the case needs (reason says what)
};

/// Stable snake_case name ("expected_failure"), as in the JSON report.
const char *toString(Result result) noexcept;

struct RunOptions {
    PluginManifestInfo manifest;
    uint32_t deviceIndex = 0;
    std::string optionsJson = "{}";
    std::vector<std::string> only;         ///< run only cases whose name starts with one of these
    std::chrono::milliseconds caseTimeout{120000};
};

struct CaseResult {
    std::string name;
    std::string summary;
    Result result = Result::Failed;
    std::string reason;
    double seconds = 0;
};

struct Report {
    /// How setup went: Ran (cases ran), NoDevice (the plugin sees no device or no driver here;
    /// nothing ran), SetupFailed (the plugin could not be loaded or described; nothing ran).
    enum class Setup { Ran, NoDevice, SetupFailed } setup = Setup::SetupFailed;
    std::string setupMessage;
    std::string pluginVersion;
    std::string deviceName;
    uint32_t deviceCount = 0;
    std::vector<CaseResult> cases;
    /// The worker crashed, hung or broke the report protocol outside any case (between cases,
    /// closing the device, plugin_destroy); "" when it did not. Makes the run unclean.
    std::string teardownProblem;
    /// Names in expected_failures that match no case of the suite.
    std::vector<std::string> unknownExpected;

    size_t count(Result result) const;
    /// True when no case failed, crashed or timed out (expected failures excepted).
    bool clean() const;
};

/// Runs the suite. The plugin is loaded only in child processes: a case that crashes or hangs
/// is reported as such and the suite goes on with the next case in a fresh child.
Report run(const RunOptions &options);

/// The per-case table and the summary line, for a terminal.
std::string formatTable(const RunOptions &options, const Report &report);
/// `text` as a JSON string literal (invalid UTF-8 replaced).
std::string jsonString(const std::string &text);
/// The report as JSON (docs/conformance.md describes the schema).
std::string formatJson(const RunOptions &options, const Report &report);

} // namespace backplane::conformance
