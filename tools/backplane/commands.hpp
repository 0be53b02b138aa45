// The backplane command's subcommands: one function each, one file each (cmd_<name>.cpp).
#pragma once

#include <string>
#include <vector>

namespace backplane::tool {

using Args = std::vector<std::string>; ///< the arguments after the subcommand's name

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

} // namespace backplane::tool
