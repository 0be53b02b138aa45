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
#include "loader/probe_cache.hpp"

#include <backplane/log.hpp>

#include <fcntl.h>
#include <link.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace {

int controlFd = -1;
struct stat controlIdentity {};

/// Exit status meaning "the plugin closed or replaced the control channel" (probe_process.cpp).
constexpr int kExitChannelLost = 3;

void writeAll(const std::string &text) {
    // The plugin runs in this process and may have closed descriptors (a closefrom() in a
    // driver); never write into whatever file took the channel's place.
    struct stat now {};
    if (::fstat(controlFd, &now) != 0 || now.st_ino != controlIdentity.st_ino ||
        now.st_dev != controlIdentity.st_dev)
        std::_Exit(kExitChannelLost);
    for (size_t done = 0; done < text.size();) {
        const ssize_t n = ::write(controlFd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) std::_Exit(kExitChannelLost); // the core went away: nobody to answer
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

/// Every shared object loaded now (the plugin, its driver, their dependencies) with what
/// identifies its file: the probe cache is valid while none of them changes (a driver update).
nlohmann::json loadedLibraries() {
    nlohmann::json out = nlohmann::json::array();
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *data) {
            auto &list = *static_cast<nlohmann::json *>(data);
            if (info->dlpi_name == nullptr || info->dlpi_name[0] != '/') return 0;
            struct stat st {};
            if (::stat(info->dlpi_name, &st) != 0) return 0;
            list.push_back({{"path", info->dlpi_name},
                            {"identity", backplane::detail::fileIdentity(st)}});
            return 0;
        },
        &out);
    // The helper itself: it carries the core's loading code (linked in statically), so a new
    // backplane build must invalidate answers this one gave.
    std::error_code ec;
    const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
    struct stat st {};
    if (!ec && ::stat(self.c_str(), &st) == 0)
        out.push_back({{"path", self.string()}, {"identity", backplane::detail::fileIdentity(st)}});
    return out;
}

int usage() {
    std::fprintf(stderr, "usage: backplane-probe --library PATH --name NAME --control-fd FD "
                         "[--cache-dir DIR]\n(run by libbackplane; not meant to be run by hand)\n");
    return 2;
}

} // namespace

int main(int argc, char **argv) {
    std::string library, name, cacheDir;
    pid_t parent = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string flag = argv[i];
        if (flag == "--library") library = argv[i + 1];
        else if (flag == "--name") name = argv[i + 1];
        else if (flag == "--cache-dir") cacheDir = argv[i + 1];
        else if (flag == "--control-fd") controlFd = std::atoi(argv[i + 1]);
        else if (flag == "--parent") parent = static_cast<pid_t>(std::atol(argv[i + 1]));
        else return usage();
    }
    if (library.empty() || name.empty() || controlFd < 0) return usage();
    // Die with the host: a probe that hangs must not outlive the process that started it.
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (parent != 0 && ::getppid() != parent) return 1;
    // Move the channel out of the plugin's way (descriptor 3 is a likely victim of cleanup code).
    if (const int moved = ::fcntl(controlFd, F_DUPFD_CLOEXEC, 200); moved >= 0) {
        ::close(controlFd);
        controlFd = moved;
    }
    if (::fstat(controlFd, &controlIdentity) != 0) return 1;
    try {
        backplane::log::configure("off"); // the plugin's own output goes to the core's tail
        backplane::detail::PluginInitOptions options;
        options.cacheDir = cacheDir;
        options.optionsJson = readOptions();
        const backplane::detail::ProbeOutcome outcome =
            backplane::detail::probePlugin(library, name, options, &announce);
        nlohmann::json answer = backplane::detail::outcomeJson(outcome);
        answer["libraries"] = loadedLibraries();
        writeAll("result " + backplane::detail::dumpJson(answer) + "\n");
        announce("plugin_destroy");
        // outcome.library goes here: plugin_destroy, then the library is unloaded.
    } catch (const std::exception &e) {
        std::fprintf(stderr, "backplane-probe: %s\n", e.what());
        return 1;
    }
    announce("done");
    return 0;
}
