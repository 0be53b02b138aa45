// Running backplane-probe children: posix_spawn, a control socket for stages and the answer, a
// pipe for the child's output (kept for the report), one deadline per child, SIGKILL on timeout.
#include "probe_process.hpp"

#include "input/json_input.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/log.hpp>

#include <boost/dll/runtime_symbol_info.hpp>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>

extern char **environ;

#ifndef BACKPLANE_BUILD_ROOT
#define BACKPLANE_BUILD_ROOT ""
#endif
#ifndef BACKPLANE_INSTALL_LIBEXEC_DIR
#define BACKPLANE_INSTALL_LIBEXEC_DIR ""
#endif

namespace backplane::detail {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr size_t kMaxControlBytes = 8u << 20; // the answer: 1024 devices fit easily
constexpr size_t kOutputTail = 4096;           // the child's output kept for the report
constexpr int kExitChannelLost = 3;            // backplane-probe: its control channel went away

std::string signalName(int signal) {
    if (const char *abbrev = sigabbrev_np(signal)) return std::string("SIG") + abbrev;
    return "signal " + std::to_string(signal);
}

/// One running child and what it said so far.
struct Child {
    pid_t pid = -1;
    int control = -1; // our end of the socketpair: options out, stages and answer in
    int output = -1;  // read end of the child's stdout+stderr
    Clock::time_point deadline;
    std::string controlText;
    std::string outputTail;
    std::string stage;        // "" until the child announces its first stage
    bool started = false;
    bool answered = false; // a "result" line arrived
    bool done = false;
    ProbeAnswer answer;
};

void closeFd(int &fd) {
    if (fd >= 0) ::close(fd);
    fd = -1;
}

/// Reads what is available on `fd` without blocking; false at end of file or error.
bool drain(int &fd, std::string &into, size_t limit, bool keepTail) {
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n > 0) {
            into.append(buffer, static_cast<size_t>(n));
            if (into.size() > limit) {
                if (!keepTail) return false; // a child flooding the control channel: stop reading
                into.erase(0, into.size() - limit);
            }
            continue;
        }
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
        closeFd(fd);
        return false;
    }
}

bool isStage(const std::string &stage) {
    for (const char *known : {"loading", "plugin_init", "probe", "plugin_destroy", "done"})
        if (stage == known) return true;
    return stage.rfind("device_info(", 0) == 0 && stage.back() == ')' && stage.size() <= 24 &&
           stage.find_first_not_of("0123456789", 12) == stage.size() - 1;
}

/// Parses complete lines of the control channel: "stage NAME", "result JSON".
void parseControl(Child &child, const std::string &origin) {
    size_t start = 0;
    for (size_t end; (end = child.controlText.find('\n', start)) != std::string::npos;
         start = end + 1) {
        const std::string line = child.controlText.substr(start, end - start);
        if (line.rfind("stage ", 0) == 0) {
            const std::string stage = fieldText(line.c_str() + 6, 64);
            if (isStage(stage)) child.stage = stage; // the plugin cannot name a stage of its own
        } else if (line.rfind("result ", 0) == 0) {
            try {
                child.answer.result =
                    parseJson(std::string_view(line).substr(7), origin, kRecordJsonLimits);
                child.answered = child.answer.result.is_object();
            } catch (const Error &e) {
                child.answer.reason = std::string("unreadable answer: ") + e.what();
            }
        }
    }
    child.controlText.erase(0, start);
}

/// The last non-empty line the child printed, for the report.
std::string lastLine(const std::string &tail) {
    size_t end = tail.find_last_not_of("\r\n \t");
    if (end == std::string::npos) return {};
    const size_t begin = tail.rfind('\n', end);
    const std::string line = tail.substr(begin == std::string::npos ? 0 : begin + 1,
                                         end + 1 - (begin == std::string::npos ? 0 : begin + 1));
    return fieldText(line.c_str(), 200);
}

std::string isolationNote(const Child &child) {
    std::string note = " (in the isolated probe process backplane-probe; the library was not "
                       "loaded into this process)";
    if (const std::string last = lastLine(child.outputTail); !last.empty())
        note += "; its last output: '" + last + "'";
    return note;
}

/// Records how the child ended from its wait status.
void finish(Child &child, int status, bool statusKnown) {
    child.done = true;
    closeFd(child.control);
    closeFd(child.output);
    ProbeAnswer &a = child.answer;
    a.stage = child.stage;
    const bool cleanExit = statusKnown && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (child.answered && child.stage == "done" && (cleanExit || !statusKnown)) {
        a.outcome = ProbeAnswer::Outcome::Answered;
        return;
    }
    std::string how;
    if (!statusKnown) how = "exited without an answer";
    else if (WIFSIGNALED(status)) how = signalName(WTERMSIG(status));
    else if (WEXITSTATUS(status) == kExitChannelLost) how = "lost its control channel";
    else how = "exit status " + std::to_string(WEXITSTATUS(status));
    if (child.stage.empty()) {
        // It never got as far as loading the plugin: the helper itself is broken.
        a.outcome = ProbeAnswer::Outcome::HelperFailed;
        a.reason = "backplane-probe ended (" + how + ") before loading the plugin" +
                   isolationNote(child);
        return;
    }
    a.outcome = ProbeAnswer::Outcome::Crashed;
    if (how == "lost its control channel")
        a.reason = "the plugin closed the probe's control channel during " + child.stage +
                   isolationNote(child);
    else
        a.reason = how + " during " + child.stage + isolationNote(child);
}

/// The helper's environment: ours, except that a sanitizer runtime (in a sanitized build of
/// backplane) must let fatal signals kill the child, so that the report can name them, and must
/// not fail the child's exit over leaks of the plugin or its driver.
std::vector<std::string> childEnvironment() {
    std::vector<std::string> out;
    std::string asan = "ASAN_OPTIONS=";
    for (char **e = environ; e != nullptr && *e != nullptr; ++e) {
        const std::string entry = *e;
        if (entry.rfind("ASAN_OPTIONS=", 0) == 0) asan = entry + ":";
        else out.push_back(entry);
    }
    out.push_back(asan + "handle_segv=0:handle_sigbus=0:handle_sigfpe=0:handle_sigill=0:"
                         "handle_abort=0:detect_leaks=0");
    return out;
}

void spawn(Child &child, const fs::path &helper, const ProbeRequest &request) {
    int control[2] = {-1, -1};
    int output[2] = {-1, -1};
    if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, control) != 0 ||
        ::pipe2(output, O_CLOEXEC) != 0) {
        child.answer.outcome = ProbeAnswer::Outcome::NotStarted;
        child.answer.reason = std::string("cannot create pipes: ") + std::strerror(errno);
        closeFd(control[0]), closeFd(control[1]), closeFd(output[0]), closeFd(output[1]);
        child.done = true;
        return;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, output[1], 1);
    posix_spawn_file_actions_adddup2(&actions, output[1], 2);
    posix_spawn_file_actions_adddup2(&actions, control[1], 3);
    posix_spawn_file_actions_addclosefrom_np(&actions, 4);
    posix_spawnattr_t attributes;
    posix_spawnattr_init(&attributes);
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attributes, &none);
    posix_spawnattr_setsigdefault(&attributes, &all);
    posix_spawnattr_setpgroup(&attributes, 0);
    posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF |
                                              POSIX_SPAWN_SETPGROUP);
    const std::string helperText = helper.string();
    const std::string libraryText = request.library.string();
    std::vector<std::string> args = {helperText, "--library", libraryText, "--name", request.name,
                                     "--control-fd", "3", "--parent", std::to_string(::getpid())};
    if (!request.cacheDir.empty()) {
        args.push_back("--cache-dir");
        args.push_back(request.cacheDir);
    }
    std::vector<char *> argv;
    for (auto &a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> environment = childEnvironment();
    std::vector<char *> envp;
    for (auto &e : environment) envp.push_back(e.data());
    envp.push_back(nullptr);
    const int error = ::posix_spawn(&child.pid, helperText.c_str(), &actions, &attributes,
                                    argv.data(), envp.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attributes);
    closeFd(control[1]);
    closeFd(output[1]);
    if (error != 0) {
        child.answer.outcome = ProbeAnswer::Outcome::NotStarted;
        child.answer.reason = "cannot run " + helperText + ": " + std::strerror(error);
        closeFd(control[0]);
        closeFd(output[0]);
        child.pid = -1;
        child.done = true;
        return;
    }
    child.control = control[0];
    child.output = output[0];
    // The options go first; the child reads them all before it loads anything. A child that
    // died already makes send fail with EPIPE (no SIGPIPE), which the wait below explains.
    const std::string &options = request.optionsJson;
    for (size_t sent = 0; sent < options.size();) {
        const ssize_t n = ::send(child.control, options.data() + sent, options.size() - sent,
                                 MSG_NOSIGNAL);
        if (n <= 0) {
            if (n < 0 && errno == EINTR) continue;
            break;
        }
        sent += static_cast<size_t>(n);
    }
    ::shutdown(child.control, SHUT_WR);
    ::fcntl(child.control, F_SETFL, O_NONBLOCK);
    ::fcntl(child.output, F_SETFL, O_NONBLOCK);
}

} // namespace

std::string secondsText(uint32_t ms) {
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    char text[32];
    std::snprintf(text, sizeof text, "%.1f s", ms / 1000.0);
    return text;
}

fs::path probeHelperPath() {
    std::error_code ec;
    const auto usable = [&](const fs::path &p) {
        return !p.empty() && fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
    };
    if (const char *env = std::getenv("BACKPLANE_PROBE_HELPER"); env && *env) return env;
    const fs::path self = boost::dll::this_line_location(ec);
    const fs::path buildRoot = BACKPLANE_BUILD_ROOT;
    if (!ec && !buildRoot.empty()) {
        const fs::path inBuild = buildRoot / "tools" / "probe" / "backplane-probe";
        const fs::path selfCanonical = fs::weakly_canonical(self, ec);
        const fs::path rootCanonical = fs::weakly_canonical(buildRoot, ec);
        if (selfCanonical.string().rfind(rootCanonical.string(), 0) == 0 && usable(inBuild))
            return inBuild;
    }
    // Relative to the library, so a relocated or staged install finds its own helper.
    const fs::path fromLibdir = BACKPLANE_LIBEXEC_FROM_LIBDIR;
    if (!self.empty() && !fromLibdir.empty()) {
        const fs::path nextToLib = (self.parent_path() / fromLibdir / "backplane-probe").lexically_normal();
        if (usable(nextToLib)) return nextToLib;
    }
    const fs::path installed = fs::path(BACKPLANE_INSTALL_LIBEXEC_DIR) / "backplane-probe";
    if (usable(installed)) return installed;
    return {};
}

std::vector<ProbeAnswer> runProbes(const fs::path &helper, const std::vector<ProbeRequest> &requests,
                                   uint32_t timeoutMs, unsigned parallel) {
    std::vector<Child> children(requests.size());
    size_t next = 0; // the next request to start
    const auto running = [&] {
        unsigned n = 0;
        for (size_t i = 0; i < next; ++i) n += children[i].done ? 0 : 1;
        return n;
    };
    for (;;) {
        // Start children up to the limit; each one's deadline runs from its own start.
        while (next < children.size() && running() < std::max(1u, parallel)) {
            Child &c = children[next];
            c.deadline = Clock::now() + std::chrono::milliseconds(timeoutMs);
            spawn(c, helper, requests[next]);
            ++next;
        }
        std::vector<pollfd> fds;
        std::vector<size_t> owners;
        for (size_t i = 0; i < next; ++i) {
            Child &c = children[i];
            if (c.done) continue;
            for (int fd : {c.control, c.output})
                if (fd >= 0) {
                    fds.push_back({fd, POLLIN, 0});
                    owners.push_back(i);
                }
        }
        if (running() == 0 && next == children.size()) break;
        ::poll(fds.data(), fds.size(), 20); // also the period of the exit and deadline checks
        for (size_t k = 0; k < fds.size(); ++k) {
            if (fds[k].revents == 0) continue;
            Child &c = children[owners[k]];
            if (fds[k].fd == c.control) {
                if (!drain(c.control, c.controlText, kMaxControlBytes, false)) closeFd(c.control);
                parseControl(c, requests[owners[k]].library.string() + " probe answer");
            } else {
                drain(c.output, c.outputTail, kOutputTail, true);
            }
        }
        const auto now = Clock::now();
        for (size_t i = 0; i < next; ++i) {
            Child &c = children[i];
            if (c.done) continue;
            // Look without reaping, so the process group can be killed while its id is still
            // ours (whatever the plugin forked goes with it), then reap.
            siginfo_t info{};
            const int waited = ::waitid(P_PID, static_cast<id_t>(c.pid), &info,
                                        WEXITED | WNOHANG | WNOWAIT);
            const bool exited = waited == 0 && info.si_pid == c.pid;
            const bool vanished = waited < 0 && errno == ECHILD; // SIGCHLD ignored by the host
            if (exited || vanished) {
                if (exited) ::kill(-c.pid, SIGKILL);
                int status = 0;
                const bool known = exited && ::waitpid(c.pid, &status, 0) == c.pid;
                if (c.control >= 0) drain(c.control, c.controlText, kMaxControlBytes, false);
                if (c.output >= 0) drain(c.output, c.outputTail, kOutputTail, true);
                parseControl(c, requests[i].library.string() + " probe answer");
                finish(c, status, known);
            } else if (now >= c.deadline) {
                ::kill(-c.pid, SIGKILL);
                ::kill(c.pid, SIGKILL);
                int status = 0;
                while (::waitpid(c.pid, &status, 0) < 0 && errno == EINTR) {
                }
                if (c.output >= 0) drain(c.output, c.outputTail, kOutputTail, true);
                const bool answeredFirst = c.answered;
                const std::string stage = c.stage;
                finish(c, status, true);
                if (stage.empty()) {
                    // It never reached the plugin: the helper (or the machine) is at fault.
                    c.answer.outcome = ProbeAnswer::Outcome::HelperFailed;
                    c.answer.reason = "backplane-probe gave no sign of life in " +
                                      secondsText(timeoutMs) + " (it never started loading the "
                                      "plugin)" + isolationNote(c);
                    continue;
                }
                c.answer.outcome = ProbeAnswer::Outcome::TimedOut;
                c.answer.reason =
                    answeredFirst ? "answered, then gave no answer in " + secondsText(timeoutMs) +
                                        " during " + stage + isolationNote(c)
                                  : "no answer in " + secondsText(timeoutMs) + " during " + stage +
                                        isolationNote(c);
            }
        }
    }
    std::vector<ProbeAnswer> answers;
    answers.reserve(children.size());
    for (Child &c : children) answers.push_back(std::move(c.answer));
    return answers;
}

} // namespace backplane::detail
