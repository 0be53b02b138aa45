// backplane-probe: loads one plugin, probes it and answers on a control descriptor, so that the
// core can contain a plugin that crashes, aborts or hangs while it starts (docs/plugin-abi.md,
// "Isolated probing"). Run by the core only; its command line is not a stable interface.
//
//   backplane-probe --library PATH --name NAME --control-fd FD [--cache-dir DIR]
//
// Reads the plugin's options JSON from FD until end of file, then writes lines to FD:
// "stage NAME" before each step, "result JSON" with the outcome, and "stage done" last.
#include "loader/plugin_probe.hpp"

#include "input/json_input.hpp"

#include <backplane/log.hpp>

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace {

int controlFd = -1;

void writeAll(const std::string &text) {
    for (size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(controlFd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) std::_Exit(3); // the core went away: nobody to answer
        done += static_cast<size_t>(n);
    }
}

void announce(const char *stage) { writeAll(std::string("stage ") + stage + "\n"); }

std::string readOptions() {
    std::string text;
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(controlFd, buffer, sizeof buffer);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        text.append(buffer, static_cast<size_t>(n));
        if (text.size() > backplane::detail::kPluginOptionsJsonLimits.maxBytes) break;
    }
    return text.empty() ? "{}" : text;
}

int usage() {
    std::fprintf(stderr, "usage: backplane-probe --library PATH --name NAME --control-fd FD "
                         "[--cache-dir DIR]\n(run by libbackplane; not meant to be run by hand)\n");
    return 2;
}

} // namespace

int main(int argc, char **argv) {
    std::string library, name, cacheDir;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--library") library = argv[i + 1];
        else if (flag == "--name") name = argv[i + 1];
        else if (flag == "--cache-dir") cacheDir = argv[i + 1];
        else if (flag == "--control-fd") controlFd = std::atoi(argv[i + 1]);
        else return usage();
    }
    if (library.empty() || name.empty() || controlFd < 0) return usage();
    try {
        backplane::log::configure("off"); // the plugin's own output goes to the core's tail
        backplane::detail::PluginInitOptions options;
        options.cacheDir = cacheDir;
        options.optionsJson = readOptions();
        const backplane::detail::ProbeOutcome outcome =
            backplane::detail::probePlugin(library, name, options, &announce);
        writeAll("result " + backplane::detail::dumpJson(backplane::detail::outcomeJson(outcome)) +
                 "\n");
        announce("plugin_destroy");
        // outcome.library goes here: plugin_destroy, then the library is unloaded.
    } catch (const std::exception &e) {
        std::fprintf(stderr, "backplane-probe: %s\n", e.what());
        return 1;
    }
    announce("done");
    return 0;
}
