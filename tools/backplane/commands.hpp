// The backplane command's subcommands: one function each, one file each (cmd_<name>.cpp).
#pragma once

#include <cstdio>
#include <string>
#include <vector>

namespace backplane::tool {

using Args = std::vector<std::string>; ///< the arguments after the subcommand's name

/// Whether the arguments ask for help (--help or -h anywhere): every command then prints its
/// usage to stdout and exits 0.
inline bool wantsHelp(const Args &args) {
    for (const std::string &a : args)
        if (a == "--help" || a == "-h") return true;
    return false;
}
/// Prints a command's usage: asked for (stdout, exit status 0) or after a usage error (stderr,
/// exit status 2). Returns the exit status.
inline int printUsage(const char *text, bool asked) {
    std::fputs(text, asked ? stdout : stderr);
    return asked ? 0 : 2;
}

/// Each returns the process exit code and prints its own errors. Defined in cmd_<name>.cpp;
/// main.cpp dispatches to the ones that exist (BACKPLANE_HAVE_CMD_<NAME>).
int runDevices(const Args &args); ///< backplane devices [--json]
int runConfig(const Args &args);  ///< backplane config check FILE
int runDemo(const Args &args);    ///< backplane demo [--device SELECTOR]
int runBench(const Args &args);   ///< backplane bench [SUITE...] [--json]
int runTune(const Args &args);    ///< backplane tune list|clear|export|import
int runCache(const Args &args);   ///< backplane cache [info|clear]
int runConformance(const Args &args); ///< backplane conformance [--plugin NAME|MANIFEST]...
int runPlugin(const Args &args);  ///< backplane plugin new NAME [--meson|--cmake] [--dir DIR]
int runKernels(const Args &args); ///< backplane kernels dump [--dialect D] [NAME...]
int runTrace(const Args &args);   ///< backplane trace render TRACE.json OUT.svg
int runToken(const Args &args);   ///< backplane token

} // namespace backplane::tool
