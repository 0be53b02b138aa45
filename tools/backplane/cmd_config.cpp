// `backplane config check FILE` and `backplane config show`: validate and print settings.
#include "commands.hpp"

#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

namespace backplane::tool {
namespace {

/// The in-tree plugins: suggested for a misspelt name even where one is not installed.
constexpr const char *kKnownPlugins[] = {"cuda", "hip", "vulkan", "host"};

size_t editDistance(const std::string &a, const std::string &b) {
    std::vector<size_t> row(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j)
        row[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        size_t diagonal = row[0];
        row[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t up = row[j];
            row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] != b[j - 1])});
            diagonal = up;
        }
    }
    return row[b.size()];
}

/// A multi-line message as one line.
std::string oneLine(std::string text) {
    std::string out;
    bool space = false;
    for (const char c : text) {
        if (c == '\n' || c == ' ') {
            space = !out.empty();
            continue;
        }
        if (space) out += ' ';
        space = false;
        out += c;
    }
    return out;
}

/// A plugin name the config uses, and where.
struct NameUse {
    std::string name;
    std::string where; ///< JSON pointer in the file, or the environment variable
};

std::vector<NameUse> pluginNamesOf(const Config &config) {
    std::vector<NameUse> uses;
    auto list = [&](const std::vector<std::string> &names, const std::string &pointer) {
        for (size_t i = 0; i < names.size(); ++i)
            uses.push_back({names[i], pointer + "/" + std::to_string(i)});
    };
    list(config.pluginEnable, "/plugins/enable");
    list(config.pluginDisable, "/plugins/disable");
    list(config.backendPriority, "/devices/backend_priority");
    for (const auto &[name, options] : config.pluginOptions)
        uses.push_back({name, "/plugins/options/" + name});
    // A selector's plugin part: "cuda:0" and "hip" name a plugin, "*:gpu" and "*" do not.
    const bool fromEnvironment = config.devicePreferenceSource == "BACKPLANE_DEVICE";
    for (size_t i = 0; i < config.devicePreference.size(); ++i) {
        const std::string &selector = config.devicePreference[i];
        const std::string plugin = selector.substr(0, selector.find(':'));
        if (plugin.empty() || plugin == "*") continue;
        uses.push_back({plugin, fromEnvironment ? std::string("BACKPLANE_DEVICE")
                                                : "/devices/prefer/" + std::to_string(i)});
    }
    return uses;
}

/// Warnings that need the machine: plugin names no installed plugin has, selectors that match
/// no device present. Errors: options that break the schema their plugin publishes (every
/// one), and plugins that refuse the options the file gives them.
std::vector<std::string> machineWarnings(const Config &checked, const std::string &file,
                                         std::vector<std::string> &errors) {
    Config config = checked;
    config.deviceRequired = false; // look at every plugin, whatever the selection would load
    std::vector<std::string> warnings;
    try {
        const Runtime runtime(config);
        std::set<std::string> installed;
        for (const PluginReport &r : runtime.plugins())
            if (!r.name.empty()) installed.insert(r.name);
        std::set<std::string> reported;
        for (const NameUse &use : pluginNamesOf(config)) {
            const bool inTree = std::find(std::begin(kKnownPlugins), std::end(kKnownPlugins),
                                          use.name) != std::end(kKnownPlugins);
            // backend_priority lists every in-tree plugin by default, installed or not.
            if (inTree && use.where.rfind("/devices/backend_priority", 0) == 0) continue;
            if (installed.count(use.name) != 0 || !reported.insert(use.name).second) continue;
            std::string closest;
            size_t best = inTree ? 0 : 3; // suggest only a near miss, and not for an in-tree name
            std::set<std::string> candidates = installed;
            candidates.insert(std::begin(kKnownPlugins), std::end(kKnownPlugins));
            for (const std::string &candidate : candidates) {
                const size_t d = editDistance(use.name, candidate);
                if (d > 0 && d < best) {
                    best = d;
                    closest = candidate;
                }
            }
            std::string text =
                file + ": " + use.where + ": no installed plugin is named '" + use.name + "'";
            if (!closest.empty()) text += "; did you mean '" + closest + "'?";
            if (installed.empty())
                text += " (no plugin was found at all)";
            else {
                std::string list;
                for (const std::string &name : installed)
                    list += (list.empty() ? "" : ", ") + name;
                text += " (installed: " + list + ")";
            }
            warnings.push_back(text);
        }
        const bool fromEnvironment = config.devicePreferenceSource == "BACKPLANE_DEVICE";
        for (size_t i = 0; i < config.devicePreference.size(); ++i) {
            try {
                (void)runtime.select(config.devicePreference[i]);
            } catch (const Error &e) {
                warnings.push_back(file + ": " +
                                   (fromEnvironment ? std::string("BACKPLANE_DEVICE")
                                                    : "/devices/prefer/" + std::to_string(i)) +
                                   ": '" + config.devicePreference[i] +
                                   "' matches no device present: " + oneLine(e.what()));
            }
        }
        for (const PluginReport &r : runtime.plugins()) {
            const auto options = config.pluginOptions.find(r.name);
            if (options == config.pluginOptions.end()) continue;
            const std::vector<std::string> problems =
                checkPluginOptions(r.optionsSchema, options->second, "/plugins/options/" + r.name);
            for (const std::string &problem : problems)
                errors.push_back(file + ": " + problem + " (`backplane devices --options " + r.name +
                                 "` lists the plugin's options)");
            // The plugin's own check, for what a schema cannot say (and plugins without one).
            if (r.state == PluginState::InitFailed && problems.empty())
                errors.push_back(file + ": /plugins/options/" + r.name + ": plugin '" + r.name +
                                 "' did not start with these options: " + r.reason);
        }
    } catch (const Error &e) {
        warnings.push_back(file + ": could not look for plugins and devices: " + e.what());
    }
    return warnings;
}

int check(const std::string &file) {
    ConfigCheck result;
    try {
        result = checkConfigFile(file);
        applyEnvironment(result.config);
    } catch (const Error &e) {
        if (result.config.source.empty()) { // unreadable, not JSON: nothing more to check
            std::fprintf(stderr, "backplane config: %s\n", e.what());
            return 1;
        }
        result.errors.emplace_back(e.what()); // a bad environment variable
    }
    for (const std::string &error : result.errors)
        std::fprintf(stderr, "backplane config: error: %s\n", error.c_str());
    std::vector<std::string> optionErrors;
    const std::vector<std::string> warnings = machineWarnings(result.config, file, optionErrors);
    for (const std::string &error : optionErrors) {
        std::fprintf(stderr, "backplane config: error: %s\n", error.c_str());
        result.errors.push_back(error);
    }
    for (const std::string &warning : warnings)
        std::fprintf(stderr, "backplane config: warning: %s\n", warning.c_str());
    if (!result.errors.empty()) {
        std::fprintf(stderr, "backplane config: %s: %zu error%s, %zu warning%s\n", file.c_str(),
                     result.errors.size(), result.errors.size() == 1 ? "" : "s", warnings.size(),
                     warnings.size() == 1 ? "" : "s");
        return 1;
    }
    std::printf("OK: %s%s\n", file.c_str(),
                warnings.empty() ? ""
                                 : (" (" + std::to_string(warnings.size()) + " warning" +
                                    (warnings.size() == 1 ? "" : "s") + ")")
                                       .c_str());
    std::printf("%s\n", toJson(result.config).c_str());
    return 0;
}

} // namespace

int runConfig(const Args &args) {
    static constexpr const char *kUsage =
        "usage: backplane config check FILE   validate FILE (every error, and warnings about "
        "plugins and devices not present), print the effective settings (file + environment)\n"
        "       backplane config show         print the settings in effect now\n";
    if (wantsHelp(args)) return printUsage(kUsage, true);
    const bool checking = args.size() == 2 && args[0] == "check";
    const bool show = args.size() == 1 && args[0] == "show";
    if (!checking && !show) return printUsage(kUsage, false);
    if (checking) return check(args[1]);
    try {
        std::printf("%s\n", toJson(loadConfig()).c_str());
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane config: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
