// The runner: a parent that never loads the plugin, and worker children that run cases in order
// and report each one over a pipe. A worker that dies or stalls costs the case it was running;
// the next worker starts with the case after it.
#include "runner.hpp"

#include "handles.hpp"

#include <backplane/error.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <optional>
#include <poll.h>
#include <set>
#include <sys/wait.h>
#include <unistd.h>

namespace backplane::conformance {
namespace {

using Clock = std::chrono::steady_clock;

/// One line of the worker protocol: no newlines or tabs inside a field, bounded.
std::string field(const std::string &text) {
    std::string out = text.substr(0, 4000);
    for (char &c : out)
        if (c == '\n' || c == '\t' || c == '\r') c = ' ';
    return out;
}

void writeLine(int fd, const std::string &line) {
    const std::string text = line + "\n";
    size_t done = 0;
    while (done < text.size()) {
        const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) _exit(3); // the parent is gone
        done += static_cast<size_t>(n);
    }
}

/// The worker: loads the plugin, describes the device, runs cases[first..] and reports.
[[noreturn]] void worker(const RunOptions &options, const std::vector<Case> &cases, size_t first,
                         int fd) {
    // The plugin runs in this process: keep the report pipe away from the low descriptors a
    // plugin may touch by accident, and send what it prints on stdout to stderr (stdout carries
    // the parent's report, --json included).
    if (const int high = ::fcntl(fd, F_DUPFD_CLOEXEC, 900); high >= 0) {
        ::close(fd);
        fd = high;
    }
    ::dup2(STDERR_FILENO, STDOUT_FILENO);
    std::optional<CaseContext> ctx;
    try {
        RawPlugin plugin = RawPlugin::open(options.manifest, {.optionsJson = options.optionsJson, .cacheDir = {}});
        auto probe = abi::make<bp_probe_result>();
        bp_error error = makeError();
        const bp_status status = plugin.api().probe(plugin.instance(), &probe, &error);
        if (status == BP_ERROR_NO_DRIVER || status == BP_ERROR_NO_DEVICE ||
            (status == BP_SUCCESS && probe.device_count == 0)) {
            writeLine(fd, "S skip\t" + field(status == BP_SUCCESS ? "probe found no device"
                                                                  : "probe: " + errorMessage(error)));
            _exit(0);
        }
        throwIfFailed(status, error, options.manifest.name, "probe");
        if (options.deviceIndex >= probe.device_count) {
            writeLine(fd, "S error\t" + field("device " + std::to_string(options.deviceIndex) +
                                              " does not exist: the probe found " +
                                              std::to_string(probe.device_count)));
            _exit(0);
        }
        auto info = abi::make<bp_device_info>();
        error = makeError();
        throwIfFailed(plugin.api().device_info(plugin.instance(), options.deviceIndex, &info, &error),
                      error, options.manifest.name, "device_info");
        writeLine(fd, "S ok\t" + std::to_string(probe.device_count) + "\t" +
                          field(fieldText(info.name, sizeof(info.name))) + "\t" +
                          field(plugin.version()));
        ctx.emplace(plugin, options.optionsJson, options.deviceIndex, probe.device_count, info);
    } catch (const std::exception &e) {
        writeLine(fd, std::string("S error\t") + field(e.what()));
        _exit(0);
    }
    for (size_t i = first; i < cases.size(); ++i) {
        writeLine(fd, "B " + std::to_string(i));
        char result = 'p';
        std::string reason;
        try {
            CaseContext caseCtx(ctx->raw(), ctx->optionsJson(), ctx->index(), ctx->deviceCount(),
                                ctx->info());
            cases[i].run(caseCtx);
        } catch (const NotApplicable &e) {
            result = 'n';
            reason = e.what();
        } catch (const CaseFailure &e) {
            result = 'f';
            reason = e.what();
        } catch (const std::exception &e) {
            result = 'f';
            reason = std::string("unexpected exception: ") + e.what();
        }
        writeLine(fd, "E " + std::to_string(i) + " " + result + "\t" + field(reason));
    }
    ctx.reset();
    _exit(0);
}

std::string describeExit(int status) {
    if (WIFSIGNALED(status)) {
        const int sig = WTERMSIG(status);
        const char *name = sigabbrev_np(sig);
        return std::string("killed by SIG") + (name ? name : std::to_string(sig).c_str()) + " (" +
               strsignal(sig) + ")";
    }
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    return "ended";
}

/// The parent's side of one worker: its report pipe and its process.
class WorkerPipe {
public:
    enum class Read { Line, Exited, TimedOut };

    WorkerPipe(int fd, pid_t pid) : fd_(fd), pid_(pid) {
        ::fcntl(fd_, F_SETFL, ::fcntl(fd_, F_GETFL) | O_NONBLOCK);
    }
    ~WorkerPipe() {
        if (!exited_) {
            ::kill(-pid_, SIGKILL);
            while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
            }
        }
        ::kill(-pid_, SIGKILL); // what the plugin started in the worker's group goes too
        ::close(fd_);
    }
    WorkerPipe(const WorkerPipe &) = delete;
    WorkerPipe &operator=(const WorkerPipe &) = delete;

    /// The next line before `deadline`. Exited once the worker process ended and every line it
    /// wrote was handed out, even when a process it started still holds the pipe open.
    Read next(std::string &line, Clock::time_point deadline) {
        for (;;) {
            if (const auto nl = buffer_.find('\n'); nl != std::string::npos) {
                line = buffer_.substr(0, nl);
                buffer_.erase(0, nl + 1);
                return Read::Line;
            }
            if (exited_) return Read::Exited;
            pollfd p{fd_, POLLIN, 0};
            if (!eof_ && ::poll(&p, 1, 50) > 0) drain();
            else if (eof_) ::usleep(20000); // closed by the plugin: only the exit can end this
            if (::waitpid(pid_, &status_, WNOHANG) == pid_) {
                exited_ = true;
                drain();
                continue;
            }
            if (Clock::now() >= deadline) return Read::TimedOut;
        }
    }

    /// Kills the worker (and its process group) and reaps it.
    void kill() {
        if (exited_) return;
        ::kill(-pid_, SIGKILL);
        while (::waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
        }
        exited_ = true;
    }

    /// The worker's wait status, once it exited.
    int status() const noexcept { return status_; }

private:
    void drain() {
        char chunk[4096];
        for (;;) {
            const ssize_t n = ::read(fd_, chunk, sizeof(chunk));
            if (n > 0) {
                buffer_.append(chunk, static_cast<size_t>(n));
                continue;
            }
            if (n == 0) eof_ = true;
            if (n < 0 && errno == EINTR) continue;
            break;
        }
        constexpr size_t kMaxBuffer = 1u << 20; // a flood from the plugin is cut, not stored
        if (buffer_.size() > kMaxBuffer) buffer_.erase(0, buffer_.size() - kMaxBuffer);
    }

    int fd_;
    pid_t pid_;
    std::string buffer_;
    bool eof_ = false;
    bool exited_ = false;
    int status_ = 0;
};

/// A decimal number that is the whole of `text`, or nullopt.
std::optional<uint64_t> parseIndex(const std::string &text) {
    if (text.empty() || text.size() > 18 || text.find_first_not_of("0123456789") != std::string::npos)
        return std::nullopt;
    return std::stoull(text);
}

std::vector<std::string> splitTabs(const std::string &text) {
    std::vector<std::string> parts;
    size_t start = 0;
    for (;;) {
        const auto tab = text.find('\t', start);
        parts.push_back(text.substr(start, tab - start));
        if (tab == std::string::npos) return parts;
        start = tab + 1;
    }
}

} // namespace

const char *toString(Result result) noexcept {
    switch (result) {
    case Result::Passed: return "passed";
    case Result::Failed: return "failed";
    case Result::Crashed: return "crashed";
    case Result::TimedOut: return "timed_out";
    case Result::ExpectedFailure: return "expected_failure";
    case Result::UnexpectedPass: return "unexpected_pass";
    case Result::NotApplicable: return "not_applicable";
    }
    return "failed";
}

size_t Report::count(Result result) const {
    return static_cast<size_t>(std::count_if(cases.begin(), cases.end(),
                                             [&](const CaseResult &c) { return c.result == result; }));
}

bool Report::clean() const {
    return setup == Setup::Ran && teardownProblem.empty() &&
           count(Result::Failed) + count(Result::Crashed) + count(Result::TimedOut) == 0;
}

Report run(const RunOptions &options) {
    std::vector<Case> cases;
    for (const Case &c : registry()) {
        const bool selected =
            options.only.empty() || std::any_of(options.only.begin(), options.only.end(),
                                                [&](const std::string &p) {
                                                    return std::string_view(c.name).starts_with(p);
                                                });
        if (selected) cases.push_back(c);
    }
    Report report;
    const std::set<std::string> expected(options.manifest.expectedFailures.begin(),
                                         options.manifest.expectedFailures.end());
    for (const std::string &name : expected)
        if (std::none_of(registry().begin(), registry().end(),
                         [&](const Case &c) { return name == c.name; }))
            report.unknownExpected.push_back(name);

    std::fflush(nullptr); // the children must not print the parent's buffered output again
    size_t next = 0;
    bool setupDone = false;
    while (next < cases.size() || !setupDone) {
        int fds[2];
        if (::pipe2(fds, O_CLOEXEC) != 0) throw Error(ErrorCode::Internal, "pipe failed");
        const pid_t pid = ::fork();
        if (pid < 0) throw Error(ErrorCode::Internal, "fork failed");
        if (pid == 0) {
            ::setpgid(0, 0); // its own group: a timeout kills what the plugin started too
            ::close(fds[0]);
            worker(options, cases, next, fds[1]);
        }
        ::setpgid(pid, pid);
        ::close(fds[1]);
        WorkerPipe pipe(fds[0], pid);
        constexpr size_t kNone = SIZE_MAX;
        size_t running = kNone; // the case the worker began and has not ended
        Clock::time_point started = Clock::now();
        Clock::time_point deadline = started + options.caseTimeout; // setup has the same limit
        std::string line, violation;
        bool workerSetUp = false;
        WorkerPipe::Read read;
        while ((read = pipe.next(line, deadline)) == WorkerPipe::Read::Line) {
            // Anything but the protocol, in order, is the plugin writing into the suite's pipe.
            const auto parts = splitTabs(line.size() > 2 ? line.substr(2) : std::string());
            if (!workerSetUp && line.starts_with("S ")) {
                // Every worker sets up first; the first worker's answer is the report's.
                workerSetUp = true;
                if (setupDone) {
                    if (parts[0] != "ok") violation = line;
                    if (parts[0] != "ok") break;
                    continue;
                }
                setupDone = true;
                std::optional<uint64_t> count;
                if (parts[0] == "ok" && parts.size() >= 4 && (count = parseIndex(parts[1])) &&
                    *count <= UINT32_MAX) {
                    report.setup = Report::Setup::Ran;
                    report.deviceCount = static_cast<uint32_t>(*count);
                    report.deviceName = parts[2];
                    report.pluginVersion = parts[3];
                } else if (parts[0] == "skip" || parts[0] == "error") {
                    report.setup = parts[0] == "skip" ? Report::Setup::NoDevice
                                                      : Report::Setup::SetupFailed;
                    report.setupMessage = parts.size() > 1 ? parts[1] : "";
                } else {
                    violation = line;
                    break;
                }
                continue;
            }
            const auto index = parseIndex(line.size() > 2 ? line.substr(2, line.find('\t') - 2)
                                                          : std::string());
            if (workerSetUp && running == kNone && line.starts_with("B ") && index == next) {
                running = next;
                started = Clock::now();
                deadline = started + options.caseTimeout;
            } else if (running != kNone && line.starts_with("E ") && line.size() > 2 &&
                       parseIndex(line.substr(2, line.find(' ', 2) - 2)) == running) {
                const std::string code = line.substr(line.find(' ', 2) + 1, 1);
                const auto tab = line.find('\t');
                const Case &c = cases[running];
                report.cases.push_back(
                    {c.name, c.summary,
                     code == "p"   ? Result::Passed
                     : code == "n" ? Result::NotApplicable
                                   : Result::Failed,
                     tab == std::string::npos ? "" : line.substr(tab + 1),
                     std::chrono::duration<double>(Clock::now() - started).count()});
                next = running + 1;
                running = kNone;
                deadline = Clock::now() + options.caseTimeout; // until the next case begins
            } else {
                violation = line;
                break;
            }
        }
        const bool timedOut = read == WorkerPipe::Read::TimedOut;
        pipe.kill();
        const int status = pipe.status();
        const std::string ended = !violation.empty()
                                      ? "wrote into the suite's report pipe (\"" +
                                            field(violation.substr(0, 80)) +
                                            "\"); a plugin must not write to file descriptors "
                                            "it did not open"
                                  : timedOut ? "did not finish in " +
                                                   std::to_string(options.caseTimeout.count()) +
                                                   " ms; the worker was killed"
                                             : "the worker " + describeExit(status);
        if (!setupDone) {
            report.setup = Report::Setup::SetupFailed;
            report.setupMessage = "loading and probing the plugin: " + ended;
            setupDone = true;
        }
        if (report.setup != Report::Setup::Ran) break;
        if (running != kNone) {
            const Case &c = cases[running];
            report.cases.push_back(
                {c.name, c.summary, timedOut ? Result::TimedOut : Result::Crashed,
                 violation.empty() && !timedOut ? ended + " during this case" : ended,
                 std::chrono::duration<double>(Clock::now() - started).count()});
            next = running + 1;
        } else if (next < cases.size() || !violation.empty() || timedOut ||
                   !(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            // Between cases, or after the last one (device close, plugin_destroy): the run
            // cannot be trusted, but the cases that ended keep their results.
            report.teardownProblem = "after case " +
                                     (next == 0 ? std::string("setup") : cases[next - 1].name) +
                                     ": " + ended;
            break;
        }
    }
    for (CaseResult &r : report.cases) {
        if (!expected.contains(r.name)) continue;
        if (r.result == Result::Passed) r.result = Result::UnexpectedPass;
        else if (r.result == Result::Failed || r.result == Result::Crashed ||
                 r.result == Result::TimedOut) {
            r.reason = std::string(toString(r.result)) + ": " + r.reason;
            r.result = Result::ExpectedFailure;
        }
    }
    return report;
}

std::string formatTable(const RunOptions &options, const Report &report) {
    std::string out;
    const std::string plugin = options.manifest.name + " " + report.pluginVersion;
    out += "conformance: " + plugin + " (" + options.manifest.file.string() + "), device " +
           std::to_string(options.deviceIndex) + ": " + report.deviceName + "\n\n";
    size_t width = 0;
    for (const CaseResult &c : report.cases) width = std::max(width, c.name.size());
    for (const CaseResult &c : report.cases) {
        std::string line = "  ";
        std::string result = toString(c.result);
        result.resize(17, ' ');
        line += result + c.name;
        if (!c.reason.empty() && c.result != Result::Passed)
            line += std::string(width - c.name.size() + 2, ' ') + c.reason;
        out += line + "\n";
    }
    const size_t total = report.cases.size();
    const size_t failed = report.count(Result::Failed) + report.count(Result::Crashed) +
                          report.count(Result::TimedOut);
    char summary[512];
    std::snprintf(summary, sizeof(summary),
                  "\n%s: passes %zu of %zu, %zu expected failures, %zu failed, %zu not applicable",
                  options.manifest.name.c_str(), report.count(Result::Passed), total,
                  report.count(Result::ExpectedFailure), failed, report.count(Result::NotApplicable));
    out += summary;
    if (const size_t u = report.count(Result::UnexpectedPass); u > 0)
        out += ", " + std::to_string(u) +
               " listed as expected failures now pass (remove them from the manifest's "
               "conformance.expected_failures)";
    out += "\n";
    if (!report.teardownProblem.empty())
        out += "failed: the worker went wrong outside a case, " + report.teardownProblem + "\n";
    for (const std::string &name : report.unknownExpected)
        out += "warning: conformance.expected_failures names '" + name +
               "', which is no case of this suite\n";
    return out;
}

std::string jsonString(const std::string &text) {
    return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string formatJson(const RunOptions &options, const Report &report) {
    nlohmann::json cases = nlohmann::json::array();
    for (const CaseResult &c : report.cases)
        cases.push_back({{"name", c.name},
                         {"summary", c.summary},
                         {"result", toString(c.result)},
                         {"reason", c.reason},
                         {"seconds", c.seconds}});
    const char *setup = report.setup == Report::Setup::Ran        ? "ran"
                        : report.setup == Report::Setup::NoDevice ? "no_device"
                                                                  : "setup_failed";
    const nlohmann::json j = {
        {"schema_version", 1},
        {"plugin", {{"name", options.manifest.name},
                    {"version", report.pluginVersion},
                    {"manifest", options.manifest.file.string()},
                    {"library", options.manifest.library.string()}}},
        {"device", {{"index", options.deviceIndex}, {"name", report.deviceName},
                    {"count", report.deviceCount}}},
        {"setup", setup},
        {"setup_message", report.setupMessage},
        {"summary", {{"cases", report.cases.size()},
                     {"passed", report.count(Result::Passed)},
                     {"failed", report.count(Result::Failed)},
                     {"crashed", report.count(Result::Crashed)},
                     {"timed_out", report.count(Result::TimedOut)},
                     {"expected_failures", report.count(Result::ExpectedFailure)},
                     {"unexpected_passes", report.count(Result::UnexpectedPass)},
                     {"not_applicable", report.count(Result::NotApplicable)}}},
        {"unknown_expected_failures", report.unknownExpected},
        {"teardown_problem", report.teardownProblem},
        {"cases", cases}};
    return j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace);
}

} // namespace backplane::conformance
