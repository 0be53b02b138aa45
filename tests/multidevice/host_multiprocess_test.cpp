// Collectives of the host plugin (Gloo) across processes on loopback: one rank per process.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

extern char **environ;

namespace {

using Clock = std::chrono::steady_clock;

/// One host_collectives_worker process with its stdout on a pipe. Killed (SIGKILL) and reaped
/// by the destructor if still running, so a failing test leaves nothing behind.
class Worker {
public:
    explicit Worker(const std::vector<std::string> &args) {
        std::vector<std::string> all = {HOST_WORKER_PATH};
        all.insert(all.end(), args.begin(), args.end());
        std::vector<char *> argv;
        for (auto &a : all)
            argv.push_back(a.data());
        argv.push_back(nullptr);
        int fds[2];
        REQUIRE(pipe2(fds, O_CLOEXEC) == 0);
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
        const int rc =
            posix_spawn(&pid_, HOST_WORKER_PATH, &actions, nullptr, argv.data(), environ);
        posix_spawn_file_actions_destroy(&actions);
        ::close(fds[1]);
        output_ = fds[0];
        REQUIRE(rc == 0);
    }
    ~Worker() {
        if (pid_ > 0 && !status_) {
            ::kill(pid_, SIGKILL);
            int status = 0;
            ::waitpid(pid_, &status, 0);
        }
        ::close(output_);
    }
    Worker(const Worker &) = delete;
    Worker &operator=(const Worker &) = delete;

    pid_t pid() const noexcept { return pid_; }

    /// The next line of output, or nullopt at the deadline or the end of the output.
    std::optional<std::string> readLine(Clock::time_point deadline) {
        for (;;) {
            if (const size_t end = buffer_.find('\n'); end != std::string::npos) {
                std::string line = buffer_.substr(0, end);
                buffer_.erase(0, end + 1);
                return line;
            }
            const auto left =
                std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
            if (left.count() <= 0) return std::nullopt;
            pollfd p{output_, POLLIN, 0};
            if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
            char chunk[4096];
            const ssize_t n = ::read(output_, chunk, sizeof(chunk));
            if (n <= 0) return std::nullopt;
            buffer_.append(chunk, static_cast<size_t>(n));
        }
    }

    /// Reads lines until one starts with `prefix`; returns it, or nullopt at the deadline.
    std::optional<std::string> expectLine(const std::string &prefix, Clock::time_point deadline) {
        while (auto line = readLine(deadline))
            if (line->rfind(prefix, 0) == 0) return line;
        return std::nullopt;
    }

    /// The exit status (128 + signal when killed by one), or nullopt if still running at the
    /// deadline.
    std::optional<int> exitStatus(Clock::time_point deadline) {
        while (!status_) {
            int status = 0;
            const pid_t done = ::waitpid(pid_, &status, WNOHANG);
            if (done == pid_) {
                status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                break;
            }
            if (Clock::now() >= deadline) return std::nullopt;
            std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        return status_;
    }

    void killNow() { ::kill(pid_, SIGKILL); }
    void signal(int number) { ::kill(pid_, number); }

    /// Waits until the process stopped itself (SIGSTOP); false at the deadline or if it ended.
    bool waitStopped(Clock::time_point deadline) {
        while (Clock::now() < deadline) {
            int status = 0;
            const pid_t done = ::waitpid(pid_, &status, WNOHANG | WUNTRACED);
            if (done == pid_) {
                if (WIFSTOPPED(status)) return true;
                status_ = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                return false;
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        return false;
    }

private:
    pid_t pid_ = -1;
    int output_ = -1;
    std::string buffer_;
    std::optional<int> status_;
};

/// Starts `size` ranks of `role`: rank 0 makes the id; the others get it on their command line.
std::vector<std::unique_ptr<Worker>> startRanks(const std::vector<std::string> &roles,
                                                Clock::time_point deadline) {
    const auto size = std::to_string(roles.size());
    std::vector<std::unique_ptr<Worker>> workers;
    workers.push_back(
        std::make_unique<Worker>(std::vector<std::string>{roles[0], "0", size, "new"}));
    const auto idLine = workers[0]->expectLine("ID ", deadline);
    REQUIRE(idLine.has_value());
    const std::string id = idLine->substr(3);
    for (size_t r = 1; r < roles.size(); ++r)
        workers.push_back(std::make_unique<Worker>(
            std::vector<std::string>{roles[r], std::to_string(r), size, id}));
    return workers;
}

void runCaseTableIn(size_t processes) {
    const auto deadline = Clock::now() + std::chrono::seconds(150);
    auto workers = startRanks(std::vector<std::string>(processes, "cases"), deadline);
    for (size_t r = 0; r < workers.size(); ++r) {
        CAPTURE(r);
        const auto status = workers[r]->exitStatus(deadline);
        REQUIRE(status.has_value()); // else: a hang
        CHECK(*status == 0);
    }
}

} // namespace

TEST_CASE("two processes on loopback run every collective, type and reduction exactly") {
    runCaseTableIn(2);
}

TEST_CASE("three processes on loopback run every collective, type and reduction exactly") {
    runCaseTableIn(3);
}

TEST_CASE("a rank killed during an all-reduce fails every other rank's all-reduce fast") {
    // Four ranks; 0, 1 and 3 issue an all-reduce that cannot finish (rank 2 never issues its
    // own), then rank 2 is killed. Their collectives' timeout is 30 s (the workers' default):
    // the failure must come from the dead connections, well before. In Gloo's ring rank 0 only
    // waits on ranks 1 and 3, so it learns of the death only because they close their
    // connections when their all-reduce fails.
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    auto workers = startRanks({"survivor", "survivor", "victim", "survivor"}, deadline);
    REQUIRE(workers[2]->expectLine("JOINED", deadline).has_value());
    for (const size_t r : {0, 1, 3})
        REQUIRE(workers[r]->expectLine("ISSUED", deadline));
    std::this_thread::sleep_for(std::chrono::milliseconds(300)); // all blocked in Gloo now
    const auto killed = Clock::now();
    workers[2]->killNow();
    // The survivors keep their communicators 4 s after their result: 3 s is before any exits.
    const auto bound = killed + std::chrono::seconds(3);
    for (const size_t r : {0, 1, 3}) {
        CAPTURE(r);
        const auto result = workers[r]->expectLine("RESULT ", bound);
        REQUIRE(result.has_value()); // else: still blocked 3 s after the kill
        INFO(*result);
        CHECK(result->rfind("RESULT 13 ", 0) == 0); // BP_ERROR_REMOTE
        CHECK(result->find("all_reduce") != std::string::npos);
    }
    for (const size_t r : {0, 1, 3}) {
        const auto status = workers[r]->exitStatus(killed + std::chrono::seconds(20));
        REQUIRE(status.has_value());
        CHECK(*status == 0); // exited normally: no crash
    }
}

TEST_CASE("a rank whose peer never joins times out across processes") {
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    Worker lonely({"cases", "0", "2", "new", "1500"});
    REQUIRE(lonely.expectLine("ID ", deadline).has_value());
    const auto start = Clock::now();
    const auto failed = lonely.expectLine("JOINFAILED ", start + std::chrono::seconds(10));
    REQUIRE(failed.has_value());
    INFO(*failed);
    CHECK(failed->rfind("JOINFAILED 10 ", 0) == 0); // BP_ERROR_TIMEOUT
    CHECK(failed->find("1 of 2 ranks never joined (rank 1)") != std::string::npos);
    CHECK(Clock::now() - start < std::chrono::seconds(5));
    const auto status = lonely.exitStatus(start + std::chrono::seconds(10));
    REQUIRE(status.has_value());
    CHECK(*status == 1);
}

TEST_CASE("comm_abort while Gloo writes a large send to a stalled peer ends it, and no SIGPIPE") {
    // The receiver posts its RECV, then stops itself: the 64 MiB the aborter sends fill the
    // socket buffers and Gloo's device thread waits to write more. comm_abort shuts the
    // connection down under that writer; its next write fails with EPIPE, which raises SIGPIPE
    // unless the plugin blocked it on that thread (the default action would end the process).
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    auto workers = startRanks({"aborter", "receiver"}, deadline);
    Worker &aborter = *workers[0];
    Worker &receiver = *workers[1];
    REQUIRE(receiver.expectLine("ISSUED", deadline).has_value());
    REQUIRE(receiver.waitStopped(deadline));
    aborter.signal(SIGUSR1);
    REQUIRE(aborter.expectLine("ISSUED", deadline).has_value());
    const auto bound = Clock::now() + std::chrono::seconds(10);
    const auto result = aborter.expectLine("RESULT ", bound);
    const auto status = aborter.exitStatus(bound);
    REQUIRE(status.has_value());
    CHECK(*status == 0); // 141 (128 + SIGPIPE) without the plugin's protection
    REQUIRE(result.has_value());
    INFO(*result);
    CHECK(result->rfind("RESULT 13 ", 0) == 0); // BP_ERROR_REMOTE
    CHECK(result->find("aborted") != std::string::npos);
    receiver.killNow();
}
