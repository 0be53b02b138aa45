// The backplane command: devices, config check, demo, bench, tune, cache, kernels.
#include "commands.hpp"

#include <backplane/abi/plugin.h>

#include <cstdio>
#include <string>

namespace {

struct Command {
    const char *name;
    int (*run)(const backplane::tool::Args &);
    const char *usage;
};

// Only the subcommands built into this binary (cmd_<name>.cpp present) are listed.
constexpr Command kCommands[] = {
#ifdef BACKPLANE_HAVE_CMD_DEVICES
    {"devices", &backplane::tool::runDevices,
     "devices [--json]          plugins, devices and why each candidate was (not) used"},
#endif
#ifdef BACKPLANE_HAVE_CMD_CONFIG
    {"config", &backplane::tool::runConfig,
     "config check FILE | show  validate a config file / print the effective settings"},
#endif
#ifdef BACKPLANE_HAVE_CMD_DEMO
    {"demo", &backplane::tool::runDemo, "demo [--device SELECTOR]  run the built-in demo workload"},
#endif
#ifdef BACKPLANE_HAVE_CMD_BENCH
    {"bench", &backplane::tool::runBench,
     "bench [SUITE...] [--json]  compare the runtime with the raw vendor APIs"},
#endif
#ifdef BACKPLANE_HAVE_CMD_TUNE
    {"tune", &backplane::tool::runTune, "tune list|clear|export|import  autotune results"},
#endif
#ifdef BACKPLANE_HAVE_CMD_CONFORMANCE
    {"conformance", &backplane::tool::runConformance,
     "conformance [--plugin NAME|MANIFEST] [--json]  test a plugin against the ABI"},
#endif
#ifdef BACKPLANE_HAVE_CMD_PLUGIN
    {"plugin", &backplane::tool::runPlugin,
     "plugin new NAME [--meson|--cmake] [--dir DIR]  write an out-of-tree plugin skeleton"},
#endif
#ifdef BACKPLANE_HAVE_CMD_KERNELS
    {"kernels", &backplane::tool::runKernels,
     "kernels dump [--dialect cuda|hip|glsl|host|cpp|all] [NAME...]  portable kernels' sources"},
#endif
#ifdef BACKPLANE_HAVE_CMD_TRACE
    {"trace", &backplane::tool::runTrace,
     "trace render TRACE.json OUT.svg  draw a trace (BACKPLANE_TRACE, --trace) as an SVG"},
#endif
#ifdef BACKPLANE_HAVE_CMD_TOKEN
    {"token", &backplane::tool::runToken,
     "token                     a fresh secret for BACKPLANE_RENDEZVOUS_TOKEN (multi-process jobs)"},
#endif
#ifdef BACKPLANE_HAVE_CMD_CACHE
    {"cache", &backplane::tool::runCache, "cache [info|clear]        kernel and pipeline caches"},
#endif
    {nullptr, nullptr, nullptr},
};

int usage(std::FILE *out) {
    std::fputs("usage: backplane <command> [arguments]\n       backplane --version\n\n"
               "commands:\n",
               out);
    for (const Command &c : kCommands)
        if (c.name != nullptr) std::fprintf(out, "  %s\n", c.usage);
    std::fputs("\nenvironment: BACKPLANE_CONFIG, BACKPLANE_DEVICE, BACKPLANE_PLUGIN_PATH, "
               "BACKPLANE_CACHE_DIR,\n  BACKPLANE_AUTOTUNE, BACKPLANE_MAX_STREAMS, BACKPLANE_LOG, BACKPLANE_TRACE "
               "(docs/config.md),\n  BACKPLANE_RENDEZVOUS, BACKPLANE_RENDEZVOUS_TOKEN (docs/multi-device.md)\n",
               out);
    return out == stdout ? 0 : 2;
}

} // namespace

int main(int argc, char **argv) {
    if (argc < 2) return usage(stderr);
    const std::string name = argv[1];
    if (name == "help" || name == "--help" || name == "-h") return usage(stdout);
    if (name == "--version" || name == "version") {
        std::printf("backplane %s (plugin ABI %d.%d)\n", BACKPLANE_VERSION, BP_ABI_VERSION_MAJOR,
                    BP_ABI_VERSION_MINOR);
        return 0;
    }
    for (const Command &c : kCommands) {
        if (c.name == nullptr || name != c.name) continue;
        return c.run(backplane::tool::Args(argv + 2, argv + argc));
    }
    for (const char *suite : {"bench", "conformance", "plugin"})
        if (name == suite) {
            std::fprintf(stderr,
                         "backplane: '%s' is not in this build (configured with "
                         "-Dtool_suites=false, as tools/run demo does); tools/run test builds "
                         "every command\n",
                         suite);
            return 2;
        }
    std::fprintf(stderr, "backplane: unknown command '%s'\n\n", name.c_str());
    return usage(stderr);
}
