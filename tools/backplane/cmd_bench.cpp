// `backplane bench [SUITE...] [--quick] [--json] [--device SEL]`: runtime vs raw API, one table.
#include "bench.hpp"
#include "commands.hpp"
#include "trace_option.hpp"

#include <backplane/error.hpp>

#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

extern char **environ;

namespace backplane::tool {
namespace {

struct Suite {
    const char *name;
    void (*run)(const BenchOptions &, BenchRows &);
};

// Only the suites built into this binary (bench_<name>.cpp present).
const std::vector<Suite> &suites() {
    static const std::vector<Suite> all = {
#ifdef BACKPLANE_HAVE_BENCH_ENGINE
        {"engine", &benchEngine},
#endif
#ifdef BACKPLANE_HAVE_BENCH_VULKAN
        {"vulkan", &benchVulkan},
#endif
#ifdef BACKPLANE_HAVE_BENCH_CUDA
        {"cuda", &benchCuda},
#endif
#ifdef BACKPLANE_HAVE_BENCH_TUNE
        {"tune", &benchTune},
#endif
#ifdef BACKPLANE_HAVE_BENCH_STARTUP
        {"startup", &benchStartup},
#endif
#ifdef BACKPLANE_HAVE_BENCH_MULTIDEVICE
        {"multidevice", &benchMultidevice},
#endif
#ifdef BACKPLANE_HAVE_BENCH_KERNELS
        {"kernels", &benchKernels},
#endif
#ifdef BACKPLANE_HAVE_BENCH_TRANSFERS
        {"transfers", &benchTransfers},
#endif
    };
    return all;
}

int usage(bool asked = false) {
    std::FILE *out = asked ? stdout : stderr;
    std::fputs("usage: backplane bench [SUITE...] [--quick] [--json] [--device SELECTOR] "
               "[--trace FILE | --trace-device FILE]\nsuites:",
               out);
    for (const Suite &s : suites()) std::fprintf(out, " %s", s.name);
    std::fputs("\n", out);
    return asked ? 0 : 2;
}

/// Whether a row meets its target ("<= 1.10x", ">= 0.80x": the ratio against it); nothing
/// for a row without a target or without a raw figure.
std::optional<bool> targetMet(const BenchRow &r) {
    if (r.target.size() < 4) return std::nullopt;
    const std::string op = r.target.substr(0, 2);
    double bound = 0;
    if (std::sscanf(r.target.c_str() + 2, " %lf", &bound) != 1) return std::nullopt;
    // "== N": a count the runtime itself must hit (no raw figure to divide by).
    if (op == "==") return r.runtime == bound;
    if (r.raw == 0 || (op != "<=" && op != ">=")) return std::nullopt;
    return op == "<=" ? r.ratio() <= bound : r.ratio() >= bound;
}

/// The rows as a table whose columns fit the longest text (nothing is cut), each target marked
/// met or MISSED, and a summary line.
void printTable(const BenchRows &rows) {
    size_t suiteWidth = 5, deviceWidth = 6, whatWidth = 4, unitWidth = 4;
    for (const BenchRow &r : rows) {
        suiteWidth = std::max(suiteWidth, r.suite.size());
        deviceWidth = std::max(deviceWidth, r.device.size());
        whatWidth = std::max(whatWidth, r.what.size());
        unitWidth = std::max(unitWidth, r.unit.size());
    }
    const auto w = [](size_t n) { return static_cast<int>(n); };
    std::printf("%-*s %-*s %-*s %12s %12s %-*s %8s  %s\n", w(suiteWidth), "suite", w(deviceWidth),
                "device", w(whatWidth), "what", "runtime", "raw", w(unitWidth), "unit", "ratio",
                "target");
    size_t met = 0, missed = 0;
    for (const BenchRow &r : rows) {
        const std::optional<bool> ok = targetMet(r);
        if (ok) ++(*ok ? met : missed);
        const std::string mark = !ok ? "" : *ok ? "  met" : "  MISSED";
        std::printf("%-*s %-*s %-*s %12.3f %12.3f %-*s %7.2fx  %s%s\n", w(suiteWidth),
                    r.suite.c_str(), w(deviceWidth), r.device.c_str(), w(whatWidth), r.what.c_str(),
                    r.runtime, r.raw, w(unitWidth), r.unit.c_str(), r.ratio(), r.target.c_str(),
                    mark.c_str());
    }
    std::printf("\n%zu rows: %zu with a target met, %zu missed, %zu without a target\n", rows.size(),
                met, missed, rows.size() - met - missed);
}

} // namespace

ChildAnswer runBenchChild(const std::string &suite, const std::string &fdVariable,
                          std::vector<std::string> variables, const std::string &dropPrefix) {
    ChildAnswer answer;
    int pipeFds[2];
    if (::pipe2(pipeFds, O_CLOEXEC) != 0) {
        answer.why = std::string("pipe failed: ") + std::strerror(errno);
        return answer;
    }
    // The write end must survive exec: dup it without O_CLOEXEC.
    const int childFd = ::dup(pipeFds[1]);
    ::close(pipeFds[1]);
    variables.push_back(fdVariable + "=" + std::to_string(childFd));
    std::vector<char *> envp;
    for (std::string &v : variables) envp.push_back(v.data());
    for (char **e = environ; *e != nullptr; ++e)
        if (std::string_view(*e).rfind(dropPrefix, 0) != 0) envp.push_back(*e);
    envp.push_back(nullptr);
    std::string arg0 = "backplane", arg1 = "bench", arg2 = suite;
    char *argv[] = {arg0.data(), arg1.data(), arg2.data(), nullptr};
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, "/proc/self/exe", &actions, nullptr, argv, envp.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(childFd);
    if (spawned != 0) {
        ::close(pipeFds[0]);
        answer.why = std::string("posix_spawn of /proc/self/exe failed: ") + std::strerror(spawned);
        return answer;
    }
    char buffer[256];
    for (ssize_t n; (n = ::read(pipeFds[0], buffer, sizeof buffer)) != 0;) {
        if (n < 0) break;
        answer.text.append(buffer, static_cast<size_t>(n));
    }
    ::close(pipeFds[0]);
    int status = 0;
    ::waitpid(pid, &status, 0);
    answer.exitStatus = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return answer;
}

/// runBench without --trace.
static int runBenchUntraced(const Args &args) {
    if (wantsHelp(args)) return usage(true);
    BenchOptions options;
    bool json = false;
    std::vector<std::string> wanted;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--quick") options.quick = true;
        else if (args[i] == "--json") json = true;
        else if (args[i] == "--device" && i + 1 < args.size()) options.device = args[++i];
        else if (!args[i].empty() && args[i][0] == '-') return usage();
        else wanted.push_back(args[i]);
    }
    for (const std::string &w : wanted) {
        bool known = false;
        for (const Suite &s : suites()) known = known || w == s.name;
        if (!known) {
            std::fprintf(stderr, "backplane bench: unknown suite '%s'\n", w.c_str());
            return usage();
        }
    }
    std::vector<const Suite *> chosen;
    for (const Suite &s : suites()) {
        bool selected = wanted.empty();
        for (const std::string &w : wanted) selected = selected || w == s.name;
        if (selected) chosen.push_back(&s);
    }
    // Progress on a terminal only: piped output (CI logs, files) stays the table alone.
    const bool progress = ::isatty(STDERR_FILENO) == 1;
    BenchRows rows;
    for (size_t i = 0; i < chosen.size(); ++i) {
        const Suite &s = *chosen[i];
        const auto start = std::chrono::steady_clock::now();
        if (progress) std::fprintf(stderr, "[%zu/%zu] bench %s ...\n", i + 1, chosen.size(), s.name);
        const size_t before = rows.size();
        try {
            s.run(options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "backplane bench %s: %s\n", s.name, e.what());
        }
        if (progress)
            std::fprintf(stderr, "[%zu/%zu] bench %s: %zu rows in %.1f s\n", i + 1, chosen.size(),
                         s.name, rows.size() - before,
                         std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (json) {
        nlohmann::json out = nlohmann::json::array();
        for (const BenchRow &r : rows) {
            const std::optional<bool> met = targetMet(r);
            out.push_back({{"suite", r.suite}, {"device", r.device}, {"what", r.what},
                           {"runtime", r.runtime}, {"raw", r.raw}, {"unit", r.unit},
                           {"ratio", r.ratio()}, {"target", r.target},
                           {"met", met ? nlohmann::json(*met) : nlohmann::json(nullptr)}});
        }
        std::printf("%s\n", out.dump(2).c_str());
        return 0;
    }
    printTable(rows);
    return 0;
}

int runBench(const Args &args) { return runTraced(args, "bench", &runBenchUntraced); }

} // namespace backplane::tool
