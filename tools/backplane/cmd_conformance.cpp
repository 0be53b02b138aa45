// `backplane conformance [--plugin NAME|MANIFEST] [--device INDEX] [--json] ...`: runs the
// plugin conformance suite (tools/backplane/conformance, docs/conformance.md).
#include "commands.hpp"

#include "conformance/runner.hpp"
#include "conformance/suite.hpp"

#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>

#include <algorithm>
#include <cstdio>
#include <optional>
#include <cstdlib>
#include <string>
#include <vector>

namespace backplane::tool {
namespace {

constexpr const char *kUsage =
    "usage: backplane conformance [--plugin NAME|MANIFEST]... [--device INDEX] [--json]\n"
    "                             [--options JSON] [--case PREFIX]... [--timeout SECONDS] [--list]\n"
    "\n"
    "Runs the plugin conformance suite: every function of the plugin ABI, error paths,\n"
    "thread-safety rules and capability honesty, one case at a time in a child process.\n"
    "Without --plugin, every plugin on the search path is tested (BACKPLANE_PLUGIN_PATH,\n"
    "plugins.paths). A MANIFEST is a plugin's .json file; NAME is looked up on the search path.\n"
    "Cases listed in the manifest's conformance.expected_failures are reported as expected.\n"
    "\n"
    "exit status: 0 every case passed or is an expected failure, 1 a case failed,\n"
    "             77 no plugin has a device here (nothing ran), 2 usage or load errors\n";

/// A whole decimal number in [low, high], or nullopt ("1x", "-1", "" and overflow are not).
std::optional<uint64_t> number(const std::string &text, uint64_t low, uint64_t high) {
    if (text.empty() || text.size() > 12 || text.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    const uint64_t value = std::stoull(text);
    if (value < low || value > high) return std::nullopt;
    return value;
}

bool looksLikeFile(const std::string &text) {
    return text.find('/') != std::string::npos || text.ends_with(".json");
}

} // namespace

int runConformance(const Args &args) {
    std::vector<std::string> plugins, only;
    std::string options;
    bool json = false, list = false, haveOptions = false;
    uint32_t device = 0, timeoutSeconds = 120;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        const bool hasValue = i + 1 < args.size();
        if (a == "--json") json = true;
        else if (a == "--list") list = true;
        else if ((a == "--plugin" || a == "-p") && hasValue) plugins.push_back(args[++i]);
        else if (a == "--options" && hasValue) options = args[++i], haveOptions = true;
        else if (a == "--case" && hasValue) only.push_back(args[++i]);
        else if ((a == "--device" || a == "--timeout") && hasValue) {
            const bool isDevice = a == "--device";
            const auto value = isDevice ? number(args[++i], 0, UINT32_MAX - 1)
                                        : number(args[++i], 1, 24 * 3600);
            if (!value) {
                std::fprintf(stderr, "backplane conformance: %s takes %s, got '%s'\n", a.c_str(),
                             isDevice ? "a device index (0, 1, ...)" : "seconds from 1 to 86400",
                             args[i].c_str());
                return 2;
            }
            (isDevice ? device : timeoutSeconds) = static_cast<uint32_t>(*value);
        } else if (a == "--help" || a == "-h") {
            return printUsage(kUsage, true);
        } else {
            std::fprintf(stderr, "backplane conformance: unexpected argument '%s'\n\n%s",
                         a.c_str(), kUsage);
            return 2;
        }
    }
    for (const std::string &prefix : only)
        if (std::none_of(conformance::registry().begin(), conformance::registry().end(),
                         [&](const conformance::Case &c) {
                             return std::string_view(c.name).starts_with(prefix);
                         })) {
            std::fprintf(stderr, "backplane conformance: --case '%s' matches no case "
                                 "(backplane conformance --list)\n", prefix.c_str());
            return 2;
        }
    if (list) {
        for (const conformance::Case &c : conformance::registry())
            std::printf("%-44s %s\n", c.name, c.summary);
        return 0;
    }

    std::vector<PluginManifestInfo> manifests;
    Config config;
    try {
        config = loadConfig();
        if (plugins.empty()) {
            // Every plugin on the search path: read manifests only; nothing is loaded here.
            manifests = findPluginManifests(config);
            if (manifests.empty()) {
                std::fprintf(stderr, "backplane conformance: no plugin manifest on the search "
                                     "path; pass --plugin MANIFEST\n");
                return 2;
            }
        }
        for (const std::string &p : plugins)
            manifests.push_back(looksLikeFile(p) ? readPluginManifest(p)
                                                 : findPluginManifest(config, p));
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane conformance: %s\n", e.what());
        // --json readers get one shape in every case: no run, and why.
        if (json)
            std::printf("{\"schema_version\": 1, \"runs\": [], \"error\": %s}\n",
                        conformance::jsonString(e.what()).c_str());
        return 2;
    }

    int status = 77;
    std::string jsonRuns;
    for (const PluginManifestInfo &manifest : manifests) {
        conformance::RunOptions run;
        run.manifest = manifest;
        run.deviceIndex = device;
        run.only = only;
        run.caseTimeout = std::chrono::seconds(timeoutSeconds);
        if (haveOptions) run.optionsJson = options;
        else if (const auto it = config.pluginOptions.find(manifest.name);
                 it != config.pluginOptions.end())
            run.optionsJson = it->second;
        const conformance::Report report = conformance::run(run);
        int runStatus = 0;
        switch (report.setup) {
        case conformance::Report::Setup::NoDevice:
            runStatus = 77;
            if (!json)
                std::printf("conformance: %s: skipped, no device here (%s)\n",
                            manifest.name.c_str(), report.setupMessage.c_str());
            break;
        case conformance::Report::Setup::SetupFailed:
            runStatus = 2;
            std::fprintf(stderr, "conformance: %s (%s): cannot run: %s\n", manifest.name.c_str(),
                         manifest.file.c_str(), report.setupMessage.c_str());
            break;
        case conformance::Report::Setup::Ran:
            runStatus = report.clean() ? 0 : 1;
            if (!json) std::fputs(conformance::formatTable(run, report).c_str(), stdout);
            break;
        }
        if (json) jsonRuns += (jsonRuns.empty() ? "" : ",\n") + conformance::formatJson(run, report);
        // The worst outcome wins: 2 (could not run) > 1 (failed) > 0 (passed) > 77 (nothing ran).
        const auto rank = [](int s) { return s == 2 ? 3 : s == 1 ? 2 : s == 0 ? 1 : 0; };
        if (rank(runStatus) > rank(status)) status = runStatus;
    }
    if (json) std::printf("{\"schema_version\": 1, \"runs\": [\n%s\n]}\n", jsonRuns.c_str());
    return status;
}

} // namespace backplane::tool
