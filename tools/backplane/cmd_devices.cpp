// `backplane devices [--json]`: plugins, devices and the why-not report.
#include "commands.hpp"

#include <backplane/error.hpp>
#include <backplane/abi/plugin.h>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace backplane::tool {
namespace {

std::string humanBytes(uint64_t bytes) {
    const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    double value = static_cast<double>(bytes);
    size_t unit = 0;
    while (value >= 1024 && unit + 1 < std::size(units)) {
        value /= 1024;
        ++unit;
    }
    char text[32];
    std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", value, units[unit]);
    return text;
}

/// Prints rows as left-aligned columns; the last column is not padded.
void printTable(const std::vector<std::vector<std::string>> &rows) {
    std::vector<size_t> widths;
    for (const auto &row : rows)
        for (size_t i = 0; i < row.size(); ++i) {
            if (widths.size() <= i) widths.push_back(0);
            widths[i] = std::max(widths[i], row[i].size());
        }
    for (const auto &row : rows) {
        std::string line = "  ";
        for (size_t i = 0; i < row.size(); ++i) {
            line += row[i];
            if (i + 1 < row.size()) line += std::string(widths[i] - row[i].size() + 2, ' ');
        }
        std::printf("%s\n", line.c_str());
    }
}

void printReport(const Runtime &runtime) {
    std::printf("Plugins (searched:");
    for (const auto &p : runtime.searchPath()) std::printf(" %s", p.string().c_str());
    std::printf(")\n");
    if (runtime.plugins().empty()) {
        std::printf("  no plugin manifest found; set BACKPLANE_PLUGIN_PATH or plugins.paths\n");
    } else {
        std::vector<std::vector<std::string>> rows = {
            {"NAME", "STATE", "DEVICES", "VERSION", "ABI", "PROBE", "MANIFEST"}};
        for (const auto &p : runtime.plugins())
            rows.push_back({p.name.empty() ? "?" : p.name, toString(p.state),
                            std::to_string(p.deviceCount), p.version.empty() ? "-" : p.version,
                            std::to_string(p.abiMajor) + "." + std::to_string(p.abiMinor),
                            p.probe.empty() ? "-" : p.probe, p.manifest.string()});
        printTable(rows);
        bool header = false;
        for (const auto &p : runtime.plugins()) {
            if (p.reason.empty()) continue;
            if (!header) std::printf("\nWhy not:\n");
            header = true;
            std::printf("  %s (%s): %s\n", p.name.empty() ? p.manifest.string().c_str()
                                                          : p.name.c_str(),
                        toString(p.state), p.reason.c_str());
        }
    }

    std::printf("\nDevices (best first)\n");
    if (runtime.devices().empty()) {
        std::printf("  none\n");
    } else {
        std::vector<std::vector<std::string>> rows = {
            {"ID", "TYPE", "MEMORY", "NAME", "UUID", "ROUTES"}};
        for (const auto &d : runtime.devices()) {
            std::string routes;
            for (const auto &r : d.routes) routes += (routes.empty() ? "" : ", ") + r.id();
            rows.push_back({d.info().id(), toString(d.info().type),
                            humanBytes(d.info().memoryBytes), d.info().name,
                            d.info().hasUuid ? d.info().uuidString() : "-", routes});
        }
        printTable(rows);
        std::printf("\nKernel features (per route; what kernels may use there)\n");
        for (const auto &d : runtime.devices())
            for (const auto &r : d.routes)
                std::printf("  %s: %s\n", r.id().c_str(), r.features.describe().c_str());
        std::printf("\nLimits and capabilities (per route)\n");
        for (const auto &d : runtime.devices())
            for (const auto &r : d.routes) {
                std::string caps;
                const std::pair<uint32_t, const char *> names[] = {
                    {BP_CAPABILITY_ASYNC_STREAMS, "async streams"},
                    {BP_CAPABILITY_TIMESTAMPS, "timestamps"},
                    {BP_CAPABILITY_PEER_COPY, "peer copy"},
                    {BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY, "mappable memory"},
                    {BP_CAPABILITY_INDIRECT_DISPATCH, "indirect dispatch"},
                    {BP_CAPABILITY_PORTABLE_BINARIES, "portable binaries"}};
                for (const auto &[bit, name] : names)
                    if ((r.capabilities & bit) != 0) caps += std::string(caps.empty() ? "" : ", ") + name;
                const std::string shared = r.maxSharedMemoryBytes == 0
                                               ? std::string("not reported")
                                               : std::to_string(r.maxSharedMemoryBytes / 1024) + " KiB";
                std::printf("  %s: subgroup %u, block up to %u threads, shared memory %s, "
                            "streams %u; %s\n",
                            r.id().c_str(), r.subgroupSize, r.maxBlockThreads, shared.c_str(),
                            r.maxStreams, caps.empty() ? "no optional capabilities" : caps.c_str());
            }
        bool compilers = false;
        for (const auto &d : runtime.devices())
            for (const auto &r : d.routes) compilers = compilers || !r.kernelCompiler.empty();
        if (compilers) {
            std::printf("\nHost kernels (per route; portable kernels are compiled or interpreted)\n");
            for (const auto &d : runtime.devices())
                for (const auto &r : d.routes)
                    if (!r.kernelCompiler.empty())
                        std::printf("  %s: %s%s\n", r.id().c_str(),
                                    r.accepts(Dialect::Cpp) ? "compiled by " : "interpreted: ",
                                    r.kernelCompiler.c_str());
        }
        std::printf("\nCollectives (per route; devices without them use the staged path)\n");
        for (const auto &d : runtime.devices())
            for (const auto &r : d.routes) {
                const bool on = (r.capabilities & BP_CAPABILITY_COLLECTIVES) != 0;
                std::printf("  %s: %s%s\n", r.id().c_str(), on ? "" : "off",
                            r.collectives.empty() ? "" : ((on ? "" : ": ") + r.collectives).c_str());
            }
    }

    std::printf("\nSelection\n");
    try {
        const Selection s = runtime.select();
        std::printf("  %s: %s\n", s.device.id().c_str(), s.reason.c_str());
        for (const auto &r : s.rejected) std::printf("  not taken: %s\n", r.c_str());
    } catch (const Error &e) {
        std::printf("  none: %s\n", e.what());
    }
}

} // namespace

/// `backplane devices --options PLUGIN`: the plugin's options schema as text.
int printOptions(const std::string &name) {
    try {
        Config config = loadConfig();
        config.deviceRequired = false;
        const Runtime runtime(config);
        std::string names;
        for (const PluginReport &r : runtime.plugins()) {
            if (r.name.empty()) continue;
            names += (names.empty() ? "" : ", ") + r.name;
            if (r.name != name) continue;
            if (r.version.empty()) {
                std::fprintf(stderr,
                             "backplane devices: plugin '%s' was not opened (%s: %s), so its "
                             "options schema was not read\n",
                             name.c_str(), toString(r.state), r.reason.c_str());
                return 1;
            }
            std::printf("Options of plugin '%s' %s (config: plugins.options.%s)\n%s", name.c_str(),
                        r.version.c_str(), name.c_str(), describePluginOptions(r.optionsSchema).c_str());
            return 0;
        }
        std::fprintf(stderr, "backplane devices: no plugin named '%s' was found (found: %s)\n",
                     name.c_str(), names.empty() ? "none" : names.c_str());
        return 1;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane devices: %s\n", e.what());
        return 1;
    }
}

int runDevices(const Args &args) {
    static constexpr const char *kUsage =
        "usage: backplane devices [--json]\n"
        "       backplane devices --options PLUGIN\n"
        "Lists the plugins found, the devices each one has and why each candidate was or was\n"
        "not used (docs/devices-json.md: the --json form); --options prints the options a\n"
        "plugin takes (config plugins.options.PLUGIN), from the schema it publishes.\n";
    if (wantsHelp(args)) return printUsage(kUsage, true);
    bool json = false;
    if (args.size() == 2 && args[0] == "--options") return printOptions(args[1]);
    for (const auto &a : args) {
        if (a == "--json") {
            json = true;
        } else {
            std::fprintf(stderr, "backplane devices: unknown argument '%s'\n", a.c_str());
            return printUsage(kUsage, false);
        }
    }
    try {
        const Runtime runtime;
        if (json) std::printf("%s\n", runtime.reportJson().c_str());
        else printReport(runtime);
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane devices: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
