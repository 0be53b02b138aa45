// `--trace FILE` for commands that run work (demo, bench): the run recorded as a backplane::Trace;
// `--trace-device FILE` records device times too (TraceOptions::deviceTimes).
#pragma once

#include "commands.hpp"

#include <backplane/error.hpp>
#include <backplane/trace.hpp>

#include <cstdio>
#include <memory>
#include <string>

namespace backplane::tool {

/// Runs `run` with `args` minus `--trace FILE` / `--trace-device FILE`; with one, the run is
/// traced into FILE (with device times for the second), written when `run` returns. A trace that
/// cannot be started or written fails the command (exit 1).
inline int runTraced(const Args &args, const char *command, int (*run)(const Args &)) {
    Args rest;
    std::string file;
    TraceOptions options;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--trace" || args[i] == "--trace-device") {
            if (i + 1 >= args.size()) {
                std::fprintf(stderr, "backplane %s: %s needs a file name\n", command,
                             args[i].c_str());
                return 2;
            }
            options.deviceTimes = args[i] == "--trace-device";
            file = args[++i];
        } else {
            rest.push_back(args[i]);
        }
    }
    if (file.empty()) return run(rest);
    std::unique_ptr<Trace> trace;
    try {
        trace = std::make_unique<Trace>(file, options);
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane %s --trace: %s\n", command, e.what());
        return 1;
    }
    const int rc = run(rest);
    try {
        const size_t events = trace->stop();
        std::printf("trace: %zu events written to %s (backplane trace render %s OUT.svg)\n",
                    events, file.c_str(), file.c_str());
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane %s --trace: %s\n", command, e.what());
        return rc != 0 ? rc : 1;
    }
    return rc;
}

} // namespace backplane::tool
