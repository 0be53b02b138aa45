// The built-in rendezvous (core/src/comm/rendezvous*.cpp): one process, a shared directory and
// TCP, across threads (one object each) and forked processes; timeouts, peers that send garbage
// or leave, and the launcher environment. Every case runs under a watchdog, so a missing timeout
// is a failure, not a hang. Tests internals (the wire format and the environment parsing behind
// a lookup function): backplane_internal_dep.
#include "comm/rendezvous_detail.hpp"

#include <backplane/communicator.hpp>
#include <backplane/error.hpp>
#include <backplane/log.hpp>

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace backplane;
using namespace std::chrono_literals;
namespace fs = std::filesystem;
namespace wire = backplane::detail::wire;

namespace {

/// Longest any case may take; a case that needs longer hangs, which is the failure it tests.
constexpr auto kCaseLimit = 20s;

/// Runs `body`; if it has not returned within `limit`, reports and exits the whole test
/// executable with a failure (a hung rendezvous thread cannot be cancelled).
void bounded(const char *what, const std::function<void()> &body,
             std::chrono::seconds limit = kCaseLimit) {
    std::packaged_task<void()> task(body);
    auto done = task.get_future();
    std::thread runner(std::move(task));
    if (done.wait_for(limit) != std::future_status::ready) {
        std::fprintf(stderr, "FAIL: \"%s\" did not finish within %lld s (a missing timeout)\n",
                     what, static_cast<long long>(limit.count()));
        std::fflush(stderr);
        std::_Exit(1);
    }
    runner.join();
    done.get(); // rethrows a doctest REQUIRE failure or any exception
}

std::vector<std::byte> bytes(const std::string &text) {
    std::vector<std::byte> out(text.size());
    std::memcpy(out.data(), text.data(), text.size());
    return out;
}

std::string text(const std::vector<std::byte> &data) {
    return std::string(reinterpret_cast<const char *>(data.data()), data.size());
}

/// Process p's contribution at `step`: sizes differ per process and step, one is empty.
std::vector<std::byte> contribution(uint32_t p, uint64_t step) {
    if (p == 1 && step == 1) return {};
    std::string body = "process " + std::to_string(p) + " step " + std::to_string(step) + ":";
    body.append((p * 37 + step * 11) % 300, static_cast<char>('a' + (p + step) % 26));
    return bytes(body);
}

/// Empty string when `all` is every process's contribution at `step`, else what differs.
std::string checkGathered(const std::vector<std::vector<std::byte>> &all, uint32_t count,
                          uint64_t step) {
    if (all.size() != count)
        return "got " + std::to_string(all.size()) + " contributions, expected " +
               std::to_string(count);
    for (uint32_t p = 0; p < count; ++p)
        if (all[p] != contribution(p, step))
            return "step " + std::to_string(step) + ": process " + std::to_string(p) +
                   "'s contribution differs: \"" + text(all[p]).substr(0, 40) + "\"";
    return {};
}

/// What an exception said, with the code of a backplane::Error.
struct Failure {
    std::optional<ErrorCode> code;
    std::string message;
};

Failure failureOf(const std::function<void()> &body) {
    try {
        body();
    } catch (const Error &e) {
        return {e.code(), e.what()};
    } catch (const std::exception &e) {
        return {std::nullopt, e.what()};
    }
    return {std::nullopt, "(no exception)"};
}

bool contains(const std::string &haystack, const std::string &needle) {
    return haystack.find(needle) != std::string::npos;
}

/// Runs body(p) on `count` threads at once; each one's failure (empty when it returned).
std::vector<std::string> onThreads(uint32_t count, const std::function<void(uint32_t)> &body) {
    std::vector<std::string> failures(count);
    std::vector<std::thread> threads;
    for (uint32_t p = 0; p < count; ++p)
        threads.emplace_back([&, p] {
            try {
                body(p);
            } catch (const std::exception &e) {
                failures[p] = e.what();
            }
        });
    for (auto &t : threads)
        t.join();
    return failures;
}

/// Runs body(p) in `count` forked processes; each exits with body's status (an exception: 1).
/// Fails the case, killing the rest, when they are not all done within kCaseLimit.
std::vector<int> onProcesses(uint32_t count, const std::function<int(uint32_t)> &body) {
    std::fflush(nullptr);
    std::vector<pid_t> pids;
    for (uint32_t p = 0; p < count; ++p) {
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::alarm(static_cast<unsigned>(kCaseLimit.count())); // dies on its own if it hangs
            int status = 1;
            try {
                status = body(p);
            } catch (const std::exception &e) {
                std::fprintf(stderr, "process %u: %s\n", p, e.what());
            }
            std::fflush(nullptr);
            std::_Exit(status);
        }
        pids.push_back(pid);
    }
    std::vector<int> statuses(count, -1);
    const auto deadline = std::chrono::steady_clock::now() + kCaseLimit;
    uint32_t left = count;
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
        for (uint32_t p = 0; p < count; ++p) {
            int status = 0;
            if (statuses[p] != -1 || ::waitpid(pids[p], &status, WNOHANG) != pids[p]) continue;
            statuses[p] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
            --left;
        }
        std::this_thread::sleep_for(5ms);
    }
    for (uint32_t p = 0; p < count; ++p)
        if (statuses[p] == -1) {
            ::kill(pids[p], SIGKILL);
            ::waitpid(pids[p], nullptr, 0);
        }
    return statuses;
}

/// A directory that is removed at the end of the case.
struct TempDir {
    fs::path path;
    TempDir() {
        std::string pattern = (fs::temp_directory_path() / "rendezvous-test-XXXXXX").string();
        REQUIRE(::mkdtemp(pattern.data()) != nullptr);
        path = pattern;
    }
    ~TempDir() {
        std::error_code ignored;
        fs::remove_all(path, ignored);
    }
};

/// A TCP port nobody listens on right now.
uint16_t freePort() {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(::bind(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0);
    socklen_t length = sizeof address;
    REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr *>(&address), &length) == 0);
    ::close(fd);
    return ntohs(address.sin_port);
}

std::string loopback(uint16_t port) { return "127.0.0.1:" + std::to_string(port); }

/// A raw blocking TCP connection, for playing a misbehaving peer or process 0.
struct RawSocket {
    int fd = -1;
    explicit RawSocket(int descriptor) : fd(descriptor) {}
    RawSocket(RawSocket &&other) noexcept : fd(std::exchange(other.fd, -1)) {}
    ~RawSocket() {
        if (fd >= 0) ::close(fd);
    }
    void send(const std::vector<std::byte> &data) const {
        REQUIRE(::send(fd, data.data(), data.size(), MSG_NOSIGNAL) ==
                static_cast<ssize_t>(data.size()));
    }
    /// Exactly n bytes, or fewer when the other side closes or nothing comes within 10 s.
    std::vector<std::byte> receive(size_t n) const {
        std::vector<std::byte> data(n);
        size_t got = 0;
        while (got < n) {
            pollfd entry{fd, POLLIN, 0};
            if (::poll(&entry, 1, 10000) <= 0) break;
            const ssize_t r = ::recv(fd, data.data() + got, n - got, 0);
            if (r <= 0) break;
            got += static_cast<size_t>(r);
        }
        data.resize(got);
        return data;
    }
};

/// Connects to 127.0.0.1:port, retrying for a few seconds while nobody listens yet.
RawSocket connectRaw(uint16_t port) {
    for (int attempt = 0; attempt < 500; ++attempt) {
        const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
        REQUIRE(fd >= 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = htons(port);
        if (::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0)
            return RawSocket(fd);
        ::close(fd);
        std::this_thread::sleep_for(10ms);
    }
    FAIL("nobody listened on port " << port);
    return RawSocket(-1);
}

/// Listens on 127.0.0.1:port and accepts one connection (blocking, 10 s at most).
RawSocket acceptRaw(uint16_t port) {
    const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(listener >= 0);
    const int one = 1;
    ::setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(port);
    REQUIRE(::bind(listener, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0);
    REQUIRE(::listen(listener, 4) == 0);
    pollfd entry{listener, POLLIN, 0};
    REQUIRE(::poll(&entry, 1, 10000) == 1);
    const int fd = ::accept(listener, nullptr, nullptr);
    ::close(listener);
    REQUIRE(fd >= 0);
    return RawSocket(fd);
}

/// The job's token in these cases, and another job's.
const std::string kToken = "rendezvous-test-token-0123456789";
const std::string kOtherToken = "another-jobs-token-9876543210abc";

/// A TCP rendezvous of this job (the token given, nothing from the environment).
std::unique_ptr<Rendezvous> tcp(const std::string &address, uint32_t process, uint32_t count,
                                std::chrono::milliseconds timeout,
                                const std::string &token = kToken, const std::string &bind = "") {
    return tcpRendezvous(address, process, count, timeout, {token, bind});
}

/// Hello's head (magic, version, process, count) and, unless `nonce` is empty, the nonce.
std::vector<std::byte> hello(uint32_t process, uint32_t count, uint32_t magic = wire::kHelloMagic,
                             std::optional<wire::Nonce> nonce = wire::Nonce{},
                             uint32_t version = wire::kVersion) {
    std::vector<std::byte> frame;
    wire::appendU32(frame, magic);
    wire::appendU32(frame, version);
    wire::appendU32(frame, process);
    wire::appendU32(frame, count);
    if (nonce) frame.insert(frame.end(), nonce->begin(), nonce->end());
    return frame;
}

std::vector<std::byte> u32Frame(uint32_t value) {
    std::vector<std::byte> frame;
    wire::appendU32(frame, value);
    return frame;
}

/// A peer's half of the handshake as bytes: what it sent, so a case can replay it.
struct PeerHandshake {
    std::vector<std::byte> hello;
    std::vector<std::byte> proof;
};

/// Introduces a raw connection as process `process` of `count` knowing `token`: sends Hello,
/// checks process 0's Challenge, sends the Proof. Returns what was sent.
PeerHandshake introduceRaw(const RawSocket &peer, uint32_t process, uint32_t count,
                           const std::string &token = kToken) {
    const wire::Nonce mine = wire::freshNonce();
    PeerHandshake sent{hello(process, count, wire::kHelloMagic, mine), {}};
    peer.send(sent.hello);
    const auto challenge = peer.receive(wire::kChallengeBytes);
    REQUIRE(challenge.size() == wire::kChallengeBytes);
    REQUIRE(wire::readU32(challenge.data()) == wire::kChallengeMagic);
    wire::Nonce theirs{};
    std::memcpy(theirs.data(), challenge.data() + 4, theirs.size());
    REQUIRE(wire::sameMac(challenge.data() + 4 + wire::kNonceBytes,
                          wire::handshakeMac(token, wire::Side::Zero, mine, theirs, process, count)));
    const wire::Mac proof = wire::handshakeMac(token, wire::Side::Peer, mine, theirs, process, count);
    wire::appendU32(sent.proof, wire::kProofMagic);
    sent.proof.insert(sent.proof.end(), proof.begin(), proof.end());
    peer.send(sent.proof);
    return sent;
}

/// Connects as process `process` of `count` and checks that process 0 welcomes it.
RawSocket joinAsPeer(uint16_t port, uint32_t process, uint32_t count) {
    RawSocket peer = connectRaw(port);
    introduceRaw(peer, process, count);
    const auto answer = peer.receive(4);
    REQUIRE(answer.size() == 4);
    REQUIRE(wire::readU32(answer.data()) == wire::kWelcomeMagic);
    return peer;
}

/// Reads a peer's Hello, challenges it with the job's token, reads its Proof and answers
/// Welcome: a fake process 0's side of the introduction (the proof is not checked).
void welcome(const RawSocket &zero) {
    const auto introduction = zero.receive(wire::kHelloBytes);
    REQUIRE(introduction.size() == wire::kHelloBytes);
    REQUIRE(wire::readU32(introduction.data()) == wire::kHelloMagic);
    wire::Nonce theirs{};
    std::memcpy(theirs.data(), introduction.data() + wire::kHelloHeadBytes, theirs.size());
    const wire::Nonce mine = wire::freshNonce();
    std::vector<std::byte> challenge = u32Frame(wire::kChallengeMagic);
    challenge.insert(challenge.end(), mine.begin(), mine.end());
    const wire::Mac mac = wire::handshakeMac(kToken, wire::Side::Zero, theirs, mine,
                                             wire::readU32(introduction.data() + 8),
                                             wire::readU32(introduction.data() + 12));
    challenge.insert(challenge.end(), mac.begin(), mac.end());
    zero.send(challenge);
    REQUIRE(zero.receive(wire::kProofBytes).size() == wire::kProofBytes);
    zero.send(u32Frame(wire::kWelcomeMagic));
}

using Clock = std::chrono::steady_clock;

double secondsSince(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Three steps of allGather on `rendezvous` as process p of count; "" or what went wrong.
std::string gatherSteps(Rendezvous &rendezvous, uint32_t p, uint32_t count, uint64_t steps = 3) {
    if (rendezvous.process() != p || rendezvous.processCount() != count)
        return "process()/processCount() say " + std::to_string(rendezvous.process()) + "/" +
               std::to_string(rendezvous.processCount());
    for (uint64_t step = 0; step < steps; ++step) {
        const auto all = rendezvous.allGather(contribution(p, step), 10s);
        if (auto wrong = checkGathered(all, count, step); !wrong.empty()) return wrong;
    }
    return {};
}

} // namespace

// ---- local -----------------------------------------------------------------------------------

TEST_CASE("a local rendezvous is one process and returns the caller's bytes at every step") {
    auto local = localRendezvous();
    CHECK(local->process() == 0);
    CHECK(local->processCount() == 1);
    for (uint64_t step = 0; step < 3; ++step) {
        const auto all = local->allGather(contribution(0, step), 1s);
        CHECK(checkGathered(all, 1, step) == "");
    }
    CHECK(local->allGather({}, 1s) == std::vector<std::vector<std::byte>>{{}});
}

TEST_CASE(
    "every built-in rendezvous refuses a non-positive timeout and a contribution over 64 MiB") {
    TempDir dir;
    std::vector<std::unique_ptr<Rendezvous>> all;
    all.push_back(localRendezvous());
    all.push_back(directoryRendezvous(dir.path.string(), 0, 1));
    all.push_back(tcp(loopback(freePort()), 0, 1, 1s));
    const std::vector<std::byte> tooLarge(detail::kMaxContributionBytes + 1);
    for (auto &rendezvous : all) {
        const Failure zero = failureOf([&] { rendezvous->allGather({}, 0ms); });
        CHECK(zero.code == ErrorCode::InvalidArgument);
        CHECK(contains(zero.message, "timeout must be positive"));
        const Failure large = failureOf([&] { rendezvous->allGather(tooLarge, 1s); });
        CHECK(large.code == ErrorCode::InvalidArgument);
        CHECK(contains(large.message, "exceeds the limit of 67108864"));
    }
}

TEST_CASE("a rendezvous index outside the process count is refused") {
    TempDir dir;
    const Failure directory = failureOf([&] { directoryRendezvous(dir.path.string(), 3, 3); });
    CHECK(directory.code == ErrorCode::InvalidArgument);
    CHECK(contains(directory.message, "process 3 is out of range for 3 processes"));
    const Failure none = failureOf([&] { directoryRendezvous(dir.path.string(), 0, 0); });
    CHECK(none.code == ErrorCode::InvalidArgument);
    const Failure overTcp = failureOf([&] { tcp(loopback(freePort()), 2, 2, 1s); });
    CHECK(overTcp.code == ErrorCode::InvalidArgument);
    CHECK(contains(overTcp.message, "out of range"));
}

TEST_CASE("timeouts and process lists read naturally in messages") {
    CHECK(detail::formatDuration(250ms) == "250 ms");
    CHECK(detail::formatDuration(30s) == "30 s");
    CHECK(detail::formatDuration(1500ms) == "1.5 s");
    CHECK(detail::formatDuration(2050ms) == "2.05 s");
    CHECK(detail::formatProcesses({2}, 4) == "process 2 of 4");
    CHECK(detail::formatProcesses({1, 3}, 4) == "processes 1 and 3 of 4");
    CHECK(detail::formatProcesses({1, 2, 3}, 4) == "processes 1, 2 and 3 of 4");
    std::vector<uint32_t> many(20);
    for (uint32_t i = 0; i < 20; ++i)
        many[i] = i + 1;
    CHECK(detail::formatProcesses(many, 64) ==
          "processes 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16 and 4 more of 64");
}

// ---- directory -------------------------------------------------------------------------------

TEST_CASE("a directory rendezvous gathers five threads' contributions over several steps") {
    bounded("directory threads", [] {
        TempDir dir;
        constexpr uint32_t kCount = 5;
        const auto failures = onThreads(kCount, [&](uint32_t p) {
            auto rendezvous = directoryRendezvous((dir.path / "job").string(), p, kCount);
            if (auto wrong = gatherSteps(*rendezvous, p, kCount, 4); !wrong.empty())
                throw std::runtime_error(wrong);
        });
        for (uint32_t p = 0; p < kCount; ++p)
            CHECK_MESSAGE(failures[p] == "", "process " << p);
        // Each process removed its files but the last step's, which a slower reader may still
        // need; no temporary file is left.
        std::vector<std::string> left;
        for (const auto &entry : fs::directory_iterator(dir.path / "job"))
            left.push_back(entry.path().filename().string());
        CHECK(left.size() == kCount);
        for (const auto &name : left)
            CHECK_MESSAGE(name.starts_with("step3.process"), name);
    });
}

TEST_CASE("a directory rendezvous gathers four forked processes' contributions over several "
          "steps") {
    TempDir dir;
    constexpr uint32_t kCount = 4;
    const auto statuses = onProcesses(kCount, [&](uint32_t p) {
        auto rendezvous = directoryRendezvous(dir.path.string(), p, kCount);
        const std::string wrong = gatherSteps(*rendezvous, p, kCount);
        if (!wrong.empty()) std::fprintf(stderr, "process %u: %s\n", p, wrong.c_str());
        return wrong.empty() ? 0 : 1;
    });
    for (uint32_t p = 0; p < kCount; ++p)
        CHECK_MESSAGE(statuses[p] == 0, "process " << p);
}

TEST_CASE("a directory rendezvous times out naming the step and the process that never came") {
    bounded("directory timeout", [] {
        TempDir dir;
        const auto start = Clock::now();
        std::vector<Failure> failures(2);
        onThreads(2, [&](uint32_t p) {
            auto rendezvous = directoryRendezvous(dir.path.string(), p, 3);
            failures[p] = failureOf([&] { rendezvous->allGather(contribution(p, 0), 1s); });
        });
        CHECK(secondsSince(start) < 5.0);
        for (const Failure &failure : failures) {
            CHECK(failure.code == ErrorCode::Timeout);
            CHECK_MESSAGE(contains(failure.message, "step 0: process 2 of 3 did not arrive within "
                                                    "1 s (no step0.process2)"),
                          failure.message);
            CHECK(contains(failure.message, dir.path.string()));
        }
    });
}

TEST_CASE("a directory rendezvous that timed out refuses later steps, naming the first failure") {
    bounded("directory unusable", [] {
        TempDir dir;
        auto rendezvous = directoryRendezvous(dir.path.string(), 0, 2);
        CHECK(failureOf([&] { rendezvous->allGather({}, 50ms); }).code == ErrorCode::Timeout);
        const Failure later = failureOf([&] { rendezvous->allGather({}, 50ms); });
        CHECK(later.code == ErrorCode::InvalidArgument);
        CHECK(contains(later.message, "unusable after an earlier failure"));
        CHECK(contains(later.message, "did not arrive within 50 ms"));
    });
}

TEST_CASE("a directory rendezvous refuses a directory left by an earlier job") {
    bounded("directory reuse", [] {
        TempDir dir;
        onThreads(2, [&](uint32_t p) {
            directoryRendezvous(dir.path.string(), p, 2)->allGather(contribution(p, 0), 10s);
        });
        for (uint32_t p = 0; p < 2; ++p) {
            const Failure again = failureOf([&] { directoryRendezvous(dir.path.string(), p, 2); });
            CHECK(again.code == ErrorCode::InvalidArgument);
            CHECK_MESSAGE(contains(again.message, "from an earlier job"), again.message);
        }
    });
}

TEST_CASE("a directory rendezvous refuses a peer's file for another process count or of garbage") {
    bounded("directory malformed", [] {
        TempDir three;
        // Process 1 of a 3-process job meets process 0 of a 2-process job in one directory.
        auto other = directoryRendezvous(three.path.string(), 1, 3);
        std::thread writer([&] { failureOf([&] { other->allGather(bytes("x"), 300ms); }); });
        auto mine = directoryRendezvous(three.path.string(), 0, 2);
        const Failure count = failureOf([&] { mine->allGather(bytes("y"), 5s); });
        writer.join();
        CHECK(count.code == ErrorCode::InvalidArgument);
        CHECK_MESSAGE(contains(count.message, "process 1 uses 3 processes, this one (0) 2"),
                      count.message);

        TempDir garbage;
        {
            std::FILE *f = std::fopen((garbage.path / "step0.process1").c_str(), "w");
            REQUIRE(f != nullptr);
            std::fputs("this is not a rendezvous file, but it is long enough to have a header", f);
            std::fclose(f);
        }
        auto reader = directoryRendezvous(garbage.path.string(), 0, 2);
        const Failure bad = failureOf([&] { reader->allGather(bytes("z"), 5s); });
        CHECK(bad.code == ErrorCode::Remote);
        CHECK_MESSAGE(contains(bad.message, "the file of process 1, step0.process1, is malformed"),
                      bad.message);
    });
}

// ---- tcp -------------------------------------------------------------------------------------

TEST_CASE("a tcp rendezvous gathers four threads' contributions over several steps") {
    bounded("tcp threads", [] {
        const std::string address = loopback(freePort());
        constexpr uint32_t kCount = 4;
        const auto failures = onThreads(kCount, [&](uint32_t p) {
            auto rendezvous = tcp(address, p, kCount, 10s);
            if (auto wrong = gatherSteps(*rendezvous, p, kCount, 5); !wrong.empty())
                throw std::runtime_error(wrong);
        });
        for (uint32_t p = 0; p < kCount; ++p)
            CHECK_MESSAGE(failures[p] == "", "process " << p);
    });
}

TEST_CASE("a tcp rendezvous gathers four forked processes' contributions, large ones included") {
    const std::string address = loopback(freePort());
    constexpr uint32_t kCount = 4;
    const auto statuses = onProcesses(kCount, [&](uint32_t p) {
        auto rendezvous = tcp(address, p, kCount, 10s);
        if (const std::string wrong = gatherSteps(*rendezvous, p, kCount); !wrong.empty()) {
            std::fprintf(stderr, "process %u: %s\n", p, wrong.c_str());
            return 1;
        }
        // 3 MiB each: many partial reads and writes on every socket.
        std::vector<std::byte> large(3u << 20, static_cast<std::byte>(p + 1));
        const auto all = rendezvous->allGather(large, 10s);
        for (uint32_t q = 0; q < kCount; ++q)
            if (all[q] != std::vector<std::byte>(3u << 20, static_cast<std::byte>(q + 1))) {
                std::fprintf(stderr, "process %u: large contribution of %u differs\n", p, q);
                return 1;
            }
        return 0;
    });
    for (uint32_t p = 0; p < kCount; ++p)
        CHECK_MESSAGE(statuses[p] == 0, "process " << p);
}

TEST_CASE("tcp process 0 times out naming the process that never connected, and tells the others") {
    bounded("tcp connect timeout", [] {
        const uint16_t port = freePort();
        const auto start = Clock::now();
        std::vector<Failure> failures(2);
        onThreads(2, [&](uint32_t p) {
            failures[p] = failureOf([&] {
                auto rendezvous = tcp(loopback(port), p, 3, 2s);
                rendezvous->allGather(contribution(p, 0), 10s);
            });
        });
        CHECK(secondsSince(start) < 5.0);
        CHECK(failures[0].code == ErrorCode::Timeout);
        CHECK_MESSAGE(failures[0].message == "tcp rendezvous at 127.0.0.1:" + std::to_string(port) +
                                                 ": process 2 of 3 did not connect within 2 s "
                                                 "(process 0 listened on 127.0.0.1:" +
                                                 std::to_string(port) + ")",
                      failures[0].message);
        // Process 1 connected, and hears process 0's reason instead of waiting 10 s.
        CHECK(failures[1].code == ErrorCode::Timeout);
        CHECK_MESSAGE(contains(failures[1].message,
                               "process 0 reports: process 2 of 3 did not connect within 2 s"),
                      failures[1].message);
    });
}

TEST_CASE("a tcp peer times out when process 0 never listens, naming the address and the error") {
    bounded("tcp peer connect timeout", [] {
        const uint16_t port = freePort();
        const auto start = Clock::now();
        const Failure failure = failureOf([&] { tcp(loopback(port), 1, 2, 300ms); });
        CHECK(secondsSince(start) < 5.0);
        CHECK(failure.code == ErrorCode::Timeout);
        CHECK_MESSAGE(
            contains(failure.message, "tcp rendezvous at 127.0.0.1:" + std::to_string(port) +
                                          ": process 1 of 2 could not connect to "
                                          "process 0 within 300 ms (last error: "
                                          "Connection refused)"),
            failure.message);
    });
}

TEST_CASE("a tcp step where one process never contributes times out naming it") {
    bounded("tcp step timeout", [] {
        const std::string address = loopback(freePort());
        std::vector<Failure> failures(3);
        std::atomic<int> finished = 0;
        const auto start = Clock::now();
        onThreads(3, [&](uint32_t p) {
            auto rendezvous = tcp(address, p, 3, 10s);
            if (p == 2) { // connected, then silent until the others are done
                while (finished < 2)
                    std::this_thread::sleep_for(5ms);
                return;
            }
            failures[p] = failureOf([&] { rendezvous->allGather(contribution(p, 0), 1s); });
            ++finished;
        });
        CHECK(secondsSince(start) < 5.0);
        CHECK(failures[0].code == ErrorCode::Timeout);
        CHECK_MESSAGE(
            contains(failures[0].message, "step 0: process 2 of 3 did not contribute within 1 s"),
            failures[0].message);
        CHECK(failures[1].code == ErrorCode::Timeout);
    });
}

TEST_CASE("tcp process 0 fails at once, naming the peer, when a peer announces a huge length") {
    bounded("tcp huge length", [] {
        const uint16_t port = freePort();
        Failure failure;
        std::thread zero([&] {
            failure = failureOf([&] {
                auto rendezvous = tcp(loopback(port), 0, 2, 10s);
                rendezvous->allGather(bytes("zero"), 10s);
            });
        });
        const auto start = Clock::now();
        {
            RawSocket peer = joinAsPeer(port, 1, 2);
            std::vector<std::byte> frame;
            wire::appendU32(frame, wire::kContributionMagic);
            wire::appendU64(frame, 0);
            wire::appendU64(frame, uint64_t{1} << 62); // an allocation no process survives
            peer.send(frame);
            zero.join();
            // Process 0 told the peer why before closing.
            const auto answer = peer.receive(4);
            REQUIRE(answer.size() == 4);
            CHECK(wire::readU32(answer.data()) == wire::kAbortMagic);
        }
        CHECK(secondsSince(start) < 5.0);
        CHECK(failure.code == ErrorCode::Remote);
        CHECK_MESSAGE(contains(failure.message, "step 0: process 1 announced 4611686018427387904 "
                                                "bytes, more than the limit of 67108864"),
                      failure.message);
    });
}

TEST_CASE("tcp process 0 fails at once, naming the peer, when a peer sends garbage") {
    bounded("tcp garbage", [] {
        const uint16_t port = freePort();
        Failure failure;
        std::thread zero([&] {
            failure = failureOf([&] {
                auto rendezvous = tcp(loopback(port), 0, 2, 10s);
                rendezvous->allGather(bytes("zero"), 10s);
            });
        });
        {
            RawSocket peer = joinAsPeer(port, 1, 2);
            peer.send(bytes("GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
            zero.join();
        }
        CHECK(failure.code == ErrorCode::Remote);
        CHECK_MESSAGE(contains(failure.message, "process 1 sent a malformed message (magic "
                                                "0x20544547)"),
                      failure.message);
    });
}

TEST_CASE("tcp process 0 fails at once, naming the peer, when a peer closes its connection") {
    bounded("tcp peer closes", [] {
        const uint16_t port = freePort();
        Failure failure;
        std::thread zero([&] {
            failure = failureOf([&] {
                auto rendezvous = tcp(loopback(port), 0, 3, 10s);
                rendezvous->allGather(bytes("zero"), 10s);
            });
        });
        const auto start = Clock::now();
        {
            RawSocket one = joinAsPeer(port, 1, 3);
            RawSocket two = joinAsPeer(port, 2, 3);
            std::vector<std::byte> frame;
            wire::appendU32(frame, wire::kContributionMagic);
            wire::appendU64(frame, 0);
            wire::appendU64(frame, 100);
            one.send(frame); // half a message: the header of 100 bytes that never come
            ::close(std::exchange(one.fd, -1));
            zero.join();
        }
        CHECK(secondsSince(start) < 5.0);
        CHECK(failure.code == ErrorCode::Remote);
        CHECK_MESSAGE(contains(failure.message, "step 0: process 1 (127.0.0.1:"), failure.message);
        CHECK(contains(failure.message, ") closed its connection (it failed or exited)"));
    });
}

TEST_CASE(
    "a stranger's connection to tcp process 0 is ignored, and named if the peer never comes") {
    bounded("tcp stranger", [] {
        const uint16_t port = freePort();
        {
            Failure failure;
            std::thread zero(
                [&] { failure = failureOf([&] { tcp(loopback(port), 0, 2, 1s); }); });
            RawSocket stranger = connectRaw(port);
            stranger.send(bytes("SSH-2.0-OpenSSH_9.2\r\n"));
            zero.join();
            CHECK(failure.code == ErrorCode::Timeout);
            CHECK_MESSAGE(contains(failure.message,
                                   "process 1 of 2 did not connect within 1 s (process 0 listened "
                                   "on 127.0.0.1:" +
                                       std::to_string(port) +
                                       "); refused 1 connection(s) that did not prove they "
                                       "belong to this job, the last: the connection from "
                                       "127.0.0.1:"),
                          failure.message);
            CHECK_MESSAGE(contains(failure.message,
                                   "is not a backplane peer (its first bytes are 0x2d485353)"),
                          failure.message);
        }
        // A stranger first, then the real peer: the rendezvous works.
        const uint16_t port2 = freePort();
        std::vector<std::string> failures(2);
        std::thread zero([&] {
            try {
                auto rendezvous = tcp(loopback(port2), 0, 2, 10s);
                failures[0] = gatherSteps(*rendezvous, 0, 2);
            } catch (const std::exception &e) {
                failures[0] = e.what();
            }
        });
        RawSocket stranger = connectRaw(port2);
        stranger.send(bytes("\x01\x02\x03\x04 garbage garbage"));
        try {
            auto rendezvous = tcp(loopback(port2), 1, 2, 10s);
            failures[1] = gatherSteps(*rendezvous, 1, 2);
        } catch (const std::exception &e) {
            failures[1] = e.what();
        }
        zero.join();
        CHECK(failures[0] == "");
        CHECK(failures[1] == "");
    });
}

TEST_CASE("tcp process 0 refuses a peer of another process count or a duplicate index, and says "
          "why to the peer") {
    bounded("tcp inconsistent peers", [] {
        for (const bool duplicate : {false, true}) {
            CAPTURE(duplicate);
            const uint16_t port = freePort();
            Failure zeroFailure;
            std::thread zero([&] {
                zeroFailure = failureOf([&] { tcp(loopback(port), 0, 3, 10s); });
            });
            Failure peerFailure;
            std::optional<RawSocket> first;
            if (duplicate) first.emplace(joinAsPeer(port, 1, 3));
            peerFailure =
                failureOf([&] { tcp(loopback(port), 1, duplicate ? 3 : 4, 10s); });
            zero.join();
            CHECK(zeroFailure.code == ErrorCode::InvalidArgument);
            CHECK(peerFailure.code == ErrorCode::InvalidArgument);
            const std::string expected =
                duplicate ? "process 1 connected twice, from 127.0.0.1:"
                          : "says it is process 1 of 4, process 0 was started for 3 processes";
            CHECK_MESSAGE(contains(zeroFailure.message, expected), zeroFailure.message);
            CHECK_MESSAGE(contains(peerFailure.message, "introducing itself: process 0 reports: "),
                          peerFailure.message);
            CHECK_MESSAGE(contains(peerFailure.message, expected), peerFailure.message);
        }
    });
}

TEST_CASE("a tcp peer fails with a clear error when process 0 sends garbage, a huge length, or "
          "closes") {
    bounded("tcp bad process 0", [] {
        enum Misdeed { NotBackplane, HugeLength, Closes, ClosesMidResult };
        for (const Misdeed misdeed : {NotBackplane, HugeLength, Closes, ClosesMidResult}) {
            CAPTURE(static_cast<int>(misdeed));
            const uint16_t port = freePort();
            std::thread fakeZero([&] {
                RawSocket zero = acceptRaw(port);
                if (misdeed == NotBackplane) {
                    zero.receive(wire::kHelloBytes); // closing with it unread would reset
                    zero.send(bytes("HTTP/1.1 400 Bad Request\r\n\r\n"));
                    return;
                }
                welcome(zero);
                if (zero.receive(wire::kContributionHeaderBytes + 3).size() !=
                    wire::kContributionHeaderBytes + 3)
                    return;
                if (misdeed == Closes) return;
                std::vector<std::byte> result;
                wire::appendU32(result, wire::kResultMagic);
                wire::appendU64(result, 0);
                wire::appendU32(result, 2);
                wire::appendU64(result, misdeed == HugeLength ? uint64_t{1} << 40 : 1000);
                zero.send(result);
            });
            const auto start = Clock::now();
            // A server that is not process 0 is one failed attempt: the peer tries again until
            // its deadline (another address, or a later round, may reach the real one).
            const auto connectTimeout = misdeed == NotBackplane ? 1s : 10s;
            const Failure failure = failureOf([&] {
                auto rendezvous = tcp(loopback(port), 1, 2, connectTimeout);
                rendezvous->allGather(bytes("one"), 10s);
            });
            fakeZero.join();
            CHECK(secondsSince(start) < 5.0);
            const std::map<Misdeed, std::pair<ErrorCode, std::string>> expected = {
                {NotBackplane,
                 {ErrorCode::Timeout,
                  "the server there is not a backplane rendezvous (it answered 0x50545448)"}},
                {HugeLength,
                 {ErrorCode::Remote, "process 1 of 2, step 0: process 0 sent a malformed result "
                                     "(process 0's contribution of 1099511627776 bytes exceeds "
                                     "the limit)"}},
                {Closes,
                 {ErrorCode::Remote,
                  "process 1 of 2, step 0: process 0 closed the connection (it failed or exited)"}},
                {ClosesMidResult,
                 {ErrorCode::Remote,
                  "process 1 of 2, step 0: process 0 closed the connection (it failed or exited)"}},
            };
            CHECK(failure.code == expected.at(misdeed).first);
            CHECK_MESSAGE(contains(failure.message, expected.at(misdeed).second), failure.message);
        }
    });
}

TEST_CASE("tcp process 0 survives a peer that closes while it sends the result (no SIGPIPE)") {
    bounded("tcp sigpipe", [] {
        // The default action of SIGPIPE ends the process: only the send flags protect it.
        struct sigaction previous {};
        struct sigaction fallback {};
        fallback.sa_handler = SIG_DFL;
        ::sigaction(SIGPIPE, &fallback, &previous);
        const uint16_t port = freePort();
        Failure failure;
        std::thread zero([&] {
            failure = failureOf([&] {
                auto rendezvous = tcp(loopback(port), 0, 2, 10s);
                // 32 MiB cannot sit in socket buffers: process 0 is still sending when the peer
                // is gone.
                rendezvous->allGather(std::vector<std::byte>(32u << 20), 10s);
            });
        });
        {
            RawSocket peer = joinAsPeer(port, 1, 2);
            std::vector<std::byte> frame;
            wire::appendU32(frame, wire::kContributionMagic);
            wire::appendU64(frame, 0);
            wire::appendU64(frame, 0);
            peer.send(frame);
            peer.receive(1000); // the result started coming
        }                       // closed with unread data: the peer's kernel resets the connection
        zero.join();
        ::sigaction(SIGPIPE, &previous, nullptr);
        CHECK(failure.code == ErrorCode::Remote);
        CHECK_MESSAGE(contains(failure.message, "process 1 (127.0.0.1:"), failure.message);
    });
}

TEST_CASE("a tcp rendezvous refuses port 0 and malformed addresses") {
    const std::map<std::string, std::string> cases = {
        {"127.0.0.1:0", "port 0 is refused: the other processes must know process 0's port"},
        {"127.0.0.1", "expected host:port"},
        {"127.0.0.1:", "is not a number from 1 to 65535"},
        {"127.0.0.1:65536", "is not a number from 1 to 65535"},
        {"127.0.0.1:80x", "is not a number from 1 to 65535"},
        {":29500", "the host is empty"},
        {"::1:29500", "write an IPv6 host in brackets"},
        {"[::1:29500", "an IPv6 host in brackets lacks its closing bracket"},
        {"[]:29500", "the host is empty"},
    };
    for (const auto &[address, expected] : cases) {
        CAPTURE(address);
        for (uint32_t p : {0u, 1u}) {
            const Failure failure = failureOf([&] { tcp(address, p, 2, 1s); });
            CHECK(failure.code == ErrorCode::InvalidArgument);
            CHECK_MESSAGE(contains(failure.message, expected), failure.message);
        }
    }
    const auto parsed = detail::parseTcpAddress("[::1]:29500");
    CHECK(parsed.host == "::1");
    CHECK(parsed.port == 29500);
}

TEST_CASE("a tcp rendezvous works over IPv6 loopback where the machine has it") {
    const int probe = ::socket(AF_INET6, SOCK_STREAM, 0);
    sockaddr_in6 address{};
    address.sin6_family = AF_INET6;
    address.sin6_addr = in6addr_loopback;
    const bool haveV6 =
        probe >= 0 && ::bind(probe, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0;
    if (probe >= 0) ::close(probe);
    if (!haveV6) {
        MESSAGE("no IPv6 loopback here: the case checks nothing");
        return;
    }
    bounded("tcp ipv6", [] {
        const std::string target = "[::1]:" + std::to_string(freePort());
        const auto failures = onThreads(2, [&](uint32_t p) {
            auto rendezvous = tcp(target, p, 2, 10s);
            if (auto wrong = gatherSteps(*rendezvous, p, 2); !wrong.empty())
                throw std::runtime_error(wrong);
        });
        CHECK(failures[0] == "");
        CHECK(failures[1] == "");
    });
}

// ---- who may join ----------------------------------------------------------------------------

namespace {

/// Collects what the core logs (subsystem "comm") while it lives.
struct LogCapture {
    std::mutex mutex;
    std::vector<std::string> lines;
    log::Level previous = log::level(log::Subsystem::Comm);
    LogCapture() {
        log::setLevel(log::Subsystem::Comm, log::Level::Warn); // whatever BACKPLANE_LOG says
        log::setSink([this](log::Level level, log::Subsystem from, std::string_view message) {
            if (from != log::Subsystem::Comm || level < log::Level::Warn) return;
            std::lock_guard lock(mutex);
            lines.emplace_back(message);
        });
    }
    ~LogCapture() {
        log::setSink(nullptr);
        log::setLevel(log::Subsystem::Comm, previous);
    }
    /// The lines that contain `needle`.
    size_t count(const std::string &needle) {
        std::lock_guard lock(mutex);
        size_t n = 0;
        for (const auto &line : lines)
            n += contains(line, needle) ? 1 : 0;
        return n;
    }
};

/// Whether a connection to ip:port is accepted now.
bool accepts(const char *ip, uint16_t port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    REQUIRE(fd >= 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    ::inet_pton(AF_INET, ip, &address.sin_addr);
    address.sin_port = htons(port);
    const bool ok = ::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof address) == 0;
    ::close(fd);
    return ok;
}

} // namespace

TEST_CASE("tcp process 0 admits only connections that prove they know the token, and the job "
          "goes on") {
    bounded("tcp admission", [] {
        LogCapture log;
        const uint16_t port = freePort();
        // A handshake recorded from an earlier job with the same token, to replay below.
        PeerHandshake recorded;
        {
            const uint16_t earlier = freePort();
            std::thread zero([&] { tcp(loopback(earlier), 0, 3, 10s); });
            RawSocket peer = connectRaw(earlier);
            recorded = introduceRaw(peer, 1, 3);
            RawSocket other = joinAsPeer(earlier, 2, 3);
            const auto answer = peer.receive(4);
            REQUIRE(answer.size() == 4);
            CHECK(wire::readU32(answer.data()) == wire::kWelcomeMagic);
            zero.join();
        }
        std::string zeroFailure = "(not run)";
        std::thread zero([&] {
            try {
                auto rendezvous = tcp(loopback(port), 0, 3, 15s);
                zeroFailure = gatherSteps(*rendezvous, 0, 3);
            } catch (const std::exception &e) {
                zeroFailure = e.what();
            }
        });
        const auto start = Clock::now();
        // Each of these is refused, and said so to the ones that are backplane peers.
        const auto refusedWith = [&](const std::vector<std::byte> &first,
                                     const std::vector<std::byte> &then = {}) {
            RawSocket stranger = connectRaw(port);
            stranger.send(first);
            if (!then.empty()) {
                stranger.receive(wire::kChallengeBytes);
                stranger.send(then);
            }
            const auto answer = stranger.receive(4);
            return answer.size() == 4 ? wire::readU32(answer.data()) : 0u;
        };
        // No token: a made-up proof.
        std::vector<std::byte> madeUp = u32Frame(wire::kProofMagic);
        madeUp.resize(wire::kProofBytes, std::byte{0x5a});
        CHECK(refusedWith(hello(1, 3, wire::kHelloMagic, wire::freshNonce()), madeUp) ==
              wire::kAbortMagic);
        // The earlier job's handshake, replayed: process 0's nonce differs now.
        CHECK(refusedWith(recorded.hello, recorded.proof) == wire::kAbortMagic);
        // A peer of the previous protocol version (no handshake).
        CHECK(refusedWith(hello(1, 3, wire::kHelloMagic, std::nullopt, 1)) == wire::kAbortMagic);
        // A contribution announcing 1 GiB before any introduction, and a deeply nested JSON text:
        // process 0 reads 16 bytes of each.
        std::vector<std::byte> huge = u32Frame(wire::kContributionMagic);
        wire::appendU64(huge, 0);
        wire::appendU64(huge, uint64_t{1} << 30);
        CHECK(refusedWith(huge) == 0u);
        CHECK(refusedWith(bytes(std::string(100000, '[') + std::string(100000, ']'))) == 0u);
        // A process of another job (another token): it sends nothing and, at its deadline,
        // says why.
        const Failure other = failureOf([&] { tcp(loopback(port), 1, 3, 500ms, kOtherToken); });
        CHECK(other.code == ErrorCode::Timeout);
        CHECK_MESSAGE(contains(other.message, "the process listening there does not know this "
                                              "job's token"),
                      other.message);
        // Then connections that stay open and silent or stop half-way, more than process 0
        // keeps waiting at once: none may hold a real peer out.
        std::vector<RawSocket> silent;
        for (int i = 0; i < 80; ++i)
            silent.push_back(connectRaw(port));
        silent.front().send(hello(1, 3, wire::kHelloMagic, std::nullopt)); // the head only

        // The job's real processes still get in, and every step works.
        const auto failures = onThreads(2, [&](uint32_t i) {
            auto rendezvous = tcp(loopback(port), i + 1, 3, 10s);
            if (auto wrong = gatherSteps(*rendezvous, i + 1, 3); !wrong.empty())
                throw std::runtime_error(wrong);
        });
        zero.join();
        CHECK(secondsSince(start) < 10.0);
        CHECK(zeroFailure == "");
        CHECK(failures[0] == "");
        CHECK(failures[1] == "");
        // One warning per refused connection, each naming the reason.
        CHECK(log.count("did not prove it knows the job's token (another job, a different "
                        "BACKPLANE_RENDEZVOUS_TOKEN, or a replayed handshake)") == 2);
        CHECK(log.count("speaks rendezvous protocol version 1, process 0 version 2") == 1);
        CHECK(log.count("is not a backplane peer (its first bytes are 0x43525042)") == 1);
        CHECK(log.count("is not a backplane peer (its first bytes are 0x5b5b5b5b)") == 1);
        // The first 16 refusals are logged one by one, then only every thousandth.
        CHECK(log.count("newer connections were waiting") >= 1);
        CHECK(log.count("; still waiting for the job's processes") == 16);
        CHECK(log.count("(further refusals are logged every 1000th)") == 1);
    });
}

TEST_CASE("a tcp peer sends nothing to a process 0 that does not know the job's token") {
    bounded("tcp impostor", [] {
        const uint16_t port = freePort();
        size_t afterChallenge = 1;
        std::thread impostor([&] {
            RawSocket zero = acceptRaw(port);
            REQUIRE(zero.receive(wire::kHelloBytes).size() == wire::kHelloBytes);
            std::vector<std::byte> challenge = u32Frame(wire::kChallengeMagic);
            challenge.resize(wire::kChallengeBytes, std::byte{0x11}); // a nonce and a guessed MAC
            zero.send(challenge);
            afterChallenge = zero.receive(wire::kProofBytes).size(); // the peer closes instead
        });
        const Failure failure = failureOf([&] { tcp(loopback(port), 1, 2, 1s); });
        impostor.join();
        CHECK(afterChallenge == 0);
        // It tries again until its deadline (the real process 0 may be at another address),
        // then names what it met.
        CHECK(failure.code == ErrorCode::Timeout);
        CHECK_MESSAGE(contains(failure.message,
                               "process 1 of 2 could not connect to process 0 within 1 s"),
                      failure.message);
        CHECK_MESSAGE(contains(failure.message, "the process listening there does not know this "
                                                "job's token (another job's rendezvous on the "
                                                "same port, or a different "
                                                "BACKPLANE_RENDEZVOUS_TOKEN): nothing was sent"),
                      failure.message);
    });
}

TEST_CASE("a peer half-way through its handshake survives a flood of silent connections (review "
          "finding)") {
    bounded("tcp eviction", [] {
        const uint16_t port = freePort();
        std::string zeroFailure = "(not run)";
        std::thread zero([&] { zeroFailure = failureOf([&] { tcp(loopback(port), 0, 2, 10s); }).message; });
        // A real peer (it knows the token) sends Hello and gets its challenge...
        RawSocket peer = connectRaw(port);
        const wire::Nonce mine = wire::freshNonce();
        peer.send(hello(1, 2, wire::kHelloMagic, mine));
        const auto challenge = peer.receive(wire::kChallengeBytes);
        REQUIRE(challenge.size() == wire::kChallengeBytes);
        // ...then more silent connections arrive than process 0 keeps waiting at once...
        std::vector<RawSocket> silent;
        for (int i = 0; i < 100; ++i)
            silent.push_back(connectRaw(port));
        std::this_thread::sleep_for(200ms); // process 0 accepted (and evicted) them
        // ...and its proof is still welcome: the silent ones went first.
        wire::Nonce theirs{};
        std::memcpy(theirs.data(), challenge.data() + 4, theirs.size());
        std::vector<std::byte> proof = u32Frame(wire::kProofMagic);
        const wire::Mac mac = wire::handshakeMac(kToken, wire::Side::Peer, mine, theirs, 1, 2);
        proof.insert(proof.end(), mac.begin(), mac.end());
        peer.send(proof);
        const auto answer = peer.receive(4);
        REQUIRE(answer.size() == 4);
        CHECK(wire::readU32(answer.data()) == wire::kWelcomeMagic);
        zero.join();
        CHECK(zeroFailure == "(no exception)");
    });
}

TEST_CASE("what a server says before it proved the token is labelled and cleaned, and only "
          "fails that attempt (review finding)") {
    bounded("tcp unproven abort", [] {
        const uint16_t port = freePort();
        std::thread squatter([&] {
            RawSocket zero = acceptRaw(port);
            zero.receive(wire::kHelloBytes);
            const std::string text = "\x1b[31mset BACKPLANE_RENDEZVOUS_TOKEN=evil\n";
            std::vector<std::byte> frame = u32Frame(wire::kAbortMagic);
            wire::appendU32(frame, static_cast<uint32_t>(ErrorCode::InvalidArgument));
            wire::appendU32(frame, static_cast<uint32_t>(text.size()));
            const auto body = bytes(text);
            frame.insert(frame.end(), body.begin(), body.end());
            zero.send(frame);
        });
        const Failure failure = failureOf([&] { tcp(loopback(port), 1, 2, 500ms); });
        squatter.join();
        CHECK(failure.code == ErrorCode::Timeout);
        CHECK_MESSAGE(contains(failure.message,
                               "the server refused it, saying (not proven to be this job's "
                               "process 0): \"?[31mset BACKPLANE_RENDEZVOUS_TOKEN=evil?\""),
                      failure.message);
        CHECK(failure.message.find('\x1b') == std::string::npos);
    });
}

TEST_CASE("tcp process 0 listens only at the address it was given, unless told \"*\"") {
    bounded("tcp bind", [] {
        // 127.0.0.2 reaches this machine too (all of 127/8 is loopback on Linux): a listener on
        // every interface answers there, one bound to 127.0.0.1 does not.
        for (const bool everywhere : {false, true}) {
            CAPTURE(everywhere);
            const uint16_t port = freePort();
            std::string zeroFailure = "(not run)";
            std::thread zero([&] {
                zeroFailure = failureOf([&] {
                                  tcp(loopback(port), 0, 2, 10s, kToken, everywhere ? "*" : "");
                              }).message;
            });
            connectRaw(port); // listening now (a connection that says nothing is dropped)
            CHECK(accepts("127.0.0.2", port) == everywhere);
            tcp(loopback(port), 1, 2, 10s);
            zero.join();
            CHECK(zeroFailure == "(no exception)");
        }
    });
}

TEST_CASE("a tcp rendezvous of several processes needs a token of at least 16 bytes") {
    const std::vector<std::pair<std::string, std::string>> cases = {
        {"", "no token, so nothing would keep other programs out: set BACKPLANE_RENDEZVOUS_TOKEN"},
        {"fifteen-bytes!!", "the token has 15 bytes, fewer than 16"},
    };
    for (const auto &[token, expected] : cases)
        for (uint32_t p : {0u, 1u}) {
            CAPTURE(p);
            // Given explicitly (the public function falls back to the user's token file).
            const Failure failure = failureOf(
                [&] { detail::tcpRendezvous(loopback(freePort()), p, 2, 1s, token, ""); });
            CHECK(failure.code == ErrorCode::InvalidArgument);
            CHECK_MESSAGE(contains(failure.message, expected), failure.message);
        }
    // One process meets nobody: no token needed.
    CHECK(tcp(loopback(freePort()), 0, 1, 1s, "")->allGather(bytes("a"), 1s).size() == 1);
    // Fresh tokens: 64 hexadecimal digits, never the same twice.
    const std::string a = newRendezvousToken();
    CHECK(a.size() == 64);
    CHECK(a.find_first_not_of("0123456789abcdef") == std::string::npos);
    CHECK(a != newRendezvousToken());
}

TEST_CASE("without a token, the processes of one user share the user's token file, made 0600 on "
          "first use by whichever process comes first") {
    bounded("tcp token file", [] {
        TempDir dir;
        const fs::path file = dir.path / "config" / "backplane" / "rendezvous-token";
        ::unsetenv("BACKPLANE_RENDEZVOUS_TOKEN");
        ::setenv("BACKPLANE_RENDEZVOUS_TOKEN_FILE", file.c_str(), 1);
        const std::string address = loopback(freePort());
        // Three processes race to create the file; all must end up with the same token.
        const auto statuses = onProcesses(3, [&](uint32_t p) {
            auto rendezvous = tcp(address, p, 3, 10s, "");
            const std::string wrong = gatherSteps(*rendezvous, p, 3);
            if (!wrong.empty()) std::fprintf(stderr, "process %u: %s\n", p, wrong.c_str());
            return wrong.empty() ? 0 : 1;
        });
        CHECK(statuses == std::vector<int>{0, 0, 0});
        REQUIRE(fs::exists(file));
        CHECK((fs::status(file).permissions() & (fs::perms::group_all | fs::perms::others_all)) ==
              fs::perms::none);
        // A token file others can read is refused, naming it and what to do.
        fs::permissions(file, fs::perms::others_read, fs::perm_options::add);
        Failure exposed = failureOf([&] { tcp(loopback(freePort()), 1, 2, 1s, ""); });
        CHECK(exposed.code == ErrorCode::InvalidArgument);
        CHECK_MESSAGE(contains(exposed.message, "rendezvous token file " + file.string() +
                                                    " must belong to this user and be readable "
                                                    "by nobody else (chmod 600"),
                      exposed.message);
        // So is a symbolic link to one.
        fs::permissions(file, fs::perms::others_read, fs::perm_options::remove);
        const fs::path link = dir.path / "link-token";
        fs::create_symlink(file, link);
        ::setenv("BACKPLANE_RENDEZVOUS_TOKEN_FILE", link.c_str(), 1);
        exposed = failureOf([&] { tcp(loopback(freePort()), 1, 2, 1s, ""); });
        CHECK(exposed.code == ErrorCode::InvalidArgument);
        CHECK_MESSAGE(contains(exposed.message, "(a symbolic link is refused)"), exposed.message);
        ::unsetenv("BACKPLANE_RENDEZVOUS_TOKEN_FILE");
    });
}

TEST_CASE("a directory rendezvous is private to its user: created 0700, refused when others may "
          "write it") {
    TempDir parent;
    const fs::path fresh = parent.path / "job";
    {
        auto rendezvous = directoryRendezvous(fresh.string(), 0, 1);
        rendezvous->allGather(bytes("zero"), 1s);
    }
    CHECK((fs::status(fresh).permissions() & fs::perms::all) == fs::perms::owner_all);
    for (const auto &entry : fs::directory_iterator(fresh))
        CHECK_MESSAGE((fs::status(entry).permissions() & (fs::perms::group_all | fs::perms::others_all)) ==
                          fs::perms::none,
                      entry.path().string());
    const std::vector<std::pair<::mode_t, std::string>> cases = {
        {0777, "the directory is writable by every user (mode 0777), who could take a process's "
               "place: `chmod go-w` it"},
        {0770, "the directory is writable by its group (mode 0770)"},
    };
    for (const auto &[mode, expected] : cases) {
        const fs::path shared = parent.path / ("shared" + std::to_string(mode));
        fs::create_directory(shared);
        REQUIRE(::chmod(shared.c_str(), mode) == 0);
        const Failure failure = failureOf([&] { directoryRendezvous(shared.string(), 0, 2); });
        CHECK(failure.code == ErrorCode::InvalidArgument);
        CHECK_MESSAGE(contains(failure.message, expected), failure.message);
    }
    // A symbolic link: it could be pointed elsewhere after the check (review finding).
    const fs::path link = parent.path / "link";
    fs::create_directory_symlink(fresh, link);
    const Failure linked = failureOf([&] { directoryRendezvous(link.string(), 0, 2); });
    CHECK(linked.code == ErrorCode::InvalidArgument);
    CHECK_MESSAGE(contains(linked.message, "the path is a symbolic link; give the directory itself"),
                  linked.message);
    // Also written "link/" or "link/." (lstat would follow those; review finding).
    for (const std::string &spelling : {link.string() + "/", link.string() + "/."}) {
        CAPTURE(spelling);
        const Failure respelled = failureOf([&] { directoryRendezvous(spelling, 0, 2); });
        CHECK_MESSAGE(contains(respelled.message, "the path is a symbolic link"),
                      respelled.message);
    }
    // Another user's directory: only root can make one here.
    if (::geteuid() == 0) {
        const fs::path foreign = parent.path / "foreign";
        fs::create_directory(foreign);
        REQUIRE(::chmod(foreign.c_str(), 0700) == 0);
        REQUIRE(::chown(foreign.c_str(), 65534, 65534) == 0);
        const Failure failure = failureOf([&] { directoryRendezvous(foreign.string(), 0, 2); });
        CHECK_MESSAGE(contains(failure.message, "the directory belongs to user 65534, not to this "
                                                "user (0)"),
                      failure.message);
    } else {
        MESSAGE("not root: another user's directory cannot be made here; that part checks nothing");
    }
}

// ---- environment -----------------------------------------------------------------------------

namespace {

using Environment = std::map<std::string, std::string>;

detail::EnvironmentLookup lookupIn(const Environment &environment) {
    return [&environment](const char *name) -> const char * {
        const auto found = environment.find(name);
        return found == environment.end() ? nullptr : found->second.c_str();
    };
}

} // namespace

TEST_CASE("the launch environment comes from each launcher's variables, in order") {
    struct Case {
        Environment environment;
        uint32_t process;
        uint32_t count;
        std::string source;
    };
    const std::vector<Case> cases = {
        {{}, 0, 1, ""},
        {{{"BACKPLANE_RANK", "2"}, {"BACKPLANE_WORLD_SIZE", "4"}},
         2,
         4,
         "BACKPLANE_RANK/BACKPLANE_WORLD_SIZE"},
        {{{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "8"}},
         3,
         8,
         "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"},
        {{{"PMI_RANK", "0"}, {"PMI_SIZE", "1"}}, 0, 1, "PMI_RANK/PMI_SIZE"},
        {{{"SLURM_PROCID", "15"}, {"SLURM_NTASKS", "16"}}, 15, 16, "SLURM_PROCID/SLURM_NTASKS"},
        // mpirun inside a Slurm allocation: Open MPI's variables win over the allocation's.
        {{{"OMPI_COMM_WORLD_RANK", "1"},
          {"OMPI_COMM_WORLD_SIZE", "2"},
          {"SLURM_PROCID", "0"},
          {"SLURM_NTASKS", "1"}},
         1,
         2,
         "OMPI_COMM_WORLD_RANK/OMPI_COMM_WORLD_SIZE"},
        {{{"BACKPLANE_RANK", "0"},
          {"BACKPLANE_WORLD_SIZE", "2"},
          {"OMPI_COMM_WORLD_RANK", "5"},
          {"OMPI_COMM_WORLD_SIZE", "6"}},
         0,
         2,
         "BACKPLANE_RANK/BACKPLANE_WORLD_SIZE"},
        // A job-wide size without a rank (an salloc shell) is not a launched process.
        {{{"SLURM_NTASKS", "4"}}, 0, 1, ""},
        {{{"PMI_SIZE", "4"}, {"SLURM_PROCID", "1"}, {"SLURM_NTASKS", "2"}},
         1,
         2,
         "SLURM_PROCID/SLURM_NTASKS"},
        {{{"BACKPLANE_RANK", "007"}, {"BACKPLANE_WORLD_SIZE", "4294967295"}},
         7,
         4294967295u,
         "BACKPLANE_RANK/BACKPLANE_WORLD_SIZE"},
    };
    for (const Case &c : cases) {
        CAPTURE(c.source);
        const LaunchEnvironment env = detail::launchEnvironment(lookupIn(c.environment));
        CHECK(env.process == c.process);
        CHECK(env.processCount == c.count);
        CHECK(env.source == c.source);
    }
}

TEST_CASE("the launch environment refuses missing partners and bad values, naming the variables") {
    const std::vector<std::pair<Environment, std::string>> cases = {
        {{{"BACKPLANE_RANK", "1"}},
         "BACKPLANE_RANK is set but BACKPLANE_WORLD_SIZE is not: set both"},
        {{{"BACKPLANE_WORLD_SIZE", "4"}},
         "BACKPLANE_WORLD_SIZE is set but BACKPLANE_RANK is not: set both or neither"},
        {{{"OMPI_COMM_WORLD_RANK", "1"}},
         "OMPI_COMM_WORLD_RANK is set but OMPI_COMM_WORLD_SIZE is not"},
        {{{"PMI_RANK", "0"}}, "PMI_RANK is set but PMI_SIZE is not"},
        {{{"SLURM_PROCID", "0"}}, "SLURM_PROCID is set but SLURM_NTASKS is not"},
        {{{"BACKPLANE_RANK", "4"}, {"BACKPLANE_WORLD_SIZE", "4"}},
         "BACKPLANE_RANK=4 is not below BACKPLANE_WORLD_SIZE=4"},
        {{{"SLURM_PROCID", "9"}, {"SLURM_NTASKS", "2"}},
         "SLURM_PROCID=9 is not below SLURM_NTASKS=2"},
        {{{"PMI_RANK", "0"}, {"PMI_SIZE", "0"}}, "PMI_SIZE=0: there must be at least one process"},
        {{{"BACKPLANE_RANK", "one"}, {"BACKPLANE_WORLD_SIZE", "2"}},
         "BACKPLANE_RANK=\"one\" is not a number"},
        {{{"BACKPLANE_RANK", ""}, {"BACKPLANE_WORLD_SIZE", "2"}},
         "BACKPLANE_RANK=\"\" is not a number"},
        {{{"OMPI_COMM_WORLD_RANK", "-1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
         "OMPI_COMM_WORLD_RANK=\"-1\" is not a number"},
        {{{"OMPI_COMM_WORLD_RANK", "+1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
         "OMPI_COMM_WORLD_RANK=\"+1\" is not a number"},
        {{{"OMPI_COMM_WORLD_RANK", " 1"}, {"OMPI_COMM_WORLD_SIZE", "2"}},
         "OMPI_COMM_WORLD_RANK=\" 1\" is not a number"},
        {{{"OMPI_COMM_WORLD_RANK", "1"}, {"OMPI_COMM_WORLD_SIZE", "2 "}},
         "OMPI_COMM_WORLD_SIZE=\"2 \" is not a number"},
        {{{"PMI_RANK", "0"}, {"PMI_SIZE", "4294967296"}},
         "PMI_SIZE=\"4294967296\" is not a number from 0 to 4294967295"},
        {{{"SLURM_PROCID", "0x1"}, {"SLURM_NTASKS", "2"}}, "SLURM_PROCID=\"0x1\" is not a number"},
    };
    for (const auto &[environment, expected] : cases) {
        CAPTURE(expected);
        const Failure failure =
            failureOf([&] { detail::launchEnvironment(lookupIn(environment)); });
        CHECK(failure.code == ErrorCode::Config);
        CHECK_MESSAGE(contains(failure.message, expected), failure.message);
    }
}

TEST_CASE("the rendezvous from the environment follows BACKPLANE_RENDEZVOUS, then MASTER_ADDR") {
    bounded("environment rendezvous", [] {
        // One process, nothing set: local.
        {
            Environment none;
            auto rendezvous = detail::rendezvousFromEnvironment(lookupIn(none), 1s);
            CHECK(rendezvous->processCount() == 1);
            CHECK(rendezvous->allGather(bytes("a"), 1s).size() == 1);
        }
        // dir: two processes of Open MPI meet in the directory.
        {
            TempDir dir;
            const auto failures = onThreads(2, [&](uint32_t p) {
                const Environment environment = {
                    {"OMPI_COMM_WORLD_RANK", std::to_string(p)},
                    {"OMPI_COMM_WORLD_SIZE", "2"},
                    {"BACKPLANE_RENDEZVOUS", "dir:" + dir.path.string()}};
                auto rendezvous = detail::rendezvousFromEnvironment(lookupIn(environment), 10s);
                if (auto wrong = gatherSteps(*rendezvous, p, 2); !wrong.empty())
                    throw std::runtime_error(wrong);
            });
            CHECK(failures[0] == "");
            CHECK(failures[1] == "");
            CHECK(fs::exists(dir.path / "step2.process1"));
        }
        // tcp: from BACKPLANE_RENDEZVOUS, and from torchrun's MASTER_ADDR/MASTER_PORT (Slurm).
        for (const bool torchrun : {false, true}) {
            const std::string port = std::to_string(freePort());
            const auto failures = onThreads(3, [&](uint32_t p) {
                Environment environment = {{"SLURM_PROCID", std::to_string(p)},
                                           {"SLURM_NTASKS", "3"},
                                           {"BACKPLANE_RENDEZVOUS_TOKEN", kToken}};
                if (torchrun) {
                    environment["MASTER_ADDR"] = "127.0.0.1";
                    environment["MASTER_PORT"] = port;
                } else {
                    environment["BACKPLANE_RENDEZVOUS"] = "tcp:127.0.0.1:" + port;
                    environment["MASTER_ADDR"] = "192.0.2.1"; // ignored: the variable above wins
                    environment["MASTER_PORT"] = "1";
                }
                auto rendezvous = detail::rendezvousFromEnvironment(lookupIn(environment), 10s);
                if (auto wrong = gatherSteps(*rendezvous, p, 3); !wrong.empty())
                    throw std::runtime_error(wrong);
            });
            for (const auto &failure : failures)
                CHECK_MESSAGE(failure == "", torchrun);
        }
    });
}

TEST_CASE("the rendezvous from the environment refuses what it cannot use, naming the variables") {
    const Environment two = {{"BACKPLANE_RANK", "1"}, {"BACKPLANE_WORLD_SIZE", "2"}};
    const auto with = [&](Environment extra) {
        extra.insert(two.begin(), two.end());
        return extra;
    };
    const std::vector<std::pair<Environment, std::string>> cases = {
        {two, "BACKPLANE_RANK/BACKPLANE_WORLD_SIZE gives 2 processes but no rendezvous: set "
              "BACKPLANE_RENDEZVOUS=dir:/shared/path or tcp:host:port (or MASTER_ADDR and "
              "MASTER_PORT)"},
        {with({{"BACKPLANE_RENDEZVOUS", "nfs:/x"}}),
         "BACKPLANE_RENDEZVOUS=\"nfs:/x\": expected \"dir:/shared/path\" or \"tcp:host:port\""},
        {with({{"BACKPLANE_RENDEZVOUS", "dir:"}}), "BACKPLANE_RENDEZVOUS=\"dir:\": expected"},
        {with({{"BACKPLANE_RENDEZVOUS", ""}}), "BACKPLANE_RENDEZVOUS=\"\": expected"},
        {with({{"BACKPLANE_RENDEZVOUS", "tcp:node0"}}),
         "BACKPLANE_RENDEZVOUS=\"tcp:node0\": tcp rendezvous address \"node0\": expected "
         "host:port"},
        {with({{"BACKPLANE_RENDEZVOUS", "tcp:node0:0"}}),
         "BACKPLANE_RENDEZVOUS=\"tcp:node0:0\": tcp rendezvous address \"node0:0\": port 0 is "
         "refused"},
        {with({{"MASTER_ADDR", "node0"}}),
         "MASTER_ADDR is set but MASTER_PORT is not: set both, or BACKPLANE_RENDEZVOUS"},
        {with({{"MASTER_PORT", "29500"}}),
         "MASTER_PORT is set but MASTER_ADDR is not: set both, or BACKPLANE_RENDEZVOUS"},
        {with({{"MASTER_ADDR", "node0"}, {"MASTER_PORT", "http"}}),
         "MASTER_ADDR=\"node0\" MASTER_PORT=\"http\": tcp rendezvous address \"node0:http\": the "
         "port \"http\" is not a number"},
        {with({{"BACKPLANE_RENDEZVOUS", "tcp:127.0.0.1:29500"}}),
         "BACKPLANE_RENDEZVOUS=\"tcp:127.0.0.1:29500\": tcp rendezvous at 127.0.0.1:29500: no "
         "token, so nothing would keep other programs out: set BACKPLANE_RENDEZVOUS_TOKEN"},
        {with({{"MASTER_ADDR", "127.0.0.1"},
               {"MASTER_PORT", "29500"},
               {"BACKPLANE_RENDEZVOUS_TOKEN", "secret"}}),
         "MASTER_ADDR=\"127.0.0.1\" MASTER_PORT=\"29500\": tcp rendezvous at 127.0.0.1:29500: the "
         "token has 6 bytes, fewer than 16"},
        {{{"BACKPLANE_RANK", "2"},
          {"BACKPLANE_WORLD_SIZE", "2"},
          {"BACKPLANE_RENDEZVOUS", "dir:/x"}},
         "BACKPLANE_RANK=2 is not below BACKPLANE_WORLD_SIZE=2"},
    };
    for (const auto &[environment, expected] : cases) {
        CAPTURE(expected);
        const Failure failure =
            failureOf([&] { detail::rendezvousFromEnvironment(lookupIn(environment), 1s); });
        CHECK(failure.code == ErrorCode::Config);
        CHECK_MESSAGE(contains(failure.message, expected), failure.message);
    }
    // A bare IPv6 MASTER_ADDR is put in brackets (then refused here only for its port).
    const Failure v6 = failureOf([&] {
        detail::rendezvousFromEnvironment(
            lookupIn(with({{"MASTER_ADDR", "fe80::1"}, {"MASTER_PORT", "0"}})), 1s);
    });
    CHECK_MESSAGE(contains(v6.message, "\"[fe80::1]:0\": port 0 is refused"), v6.message);
}

TEST_CASE("the public launchEnvironment and rendezvousFromEnvironment read the process "
          "environment") {
    const char *names[] = {"BACKPLANE_RANK",
                           "BACKPLANE_WORLD_SIZE",
                           "OMPI_COMM_WORLD_RANK",
                           "OMPI_COMM_WORLD_SIZE",
                           "PMI_RANK",
                           "PMI_SIZE",
                           "SLURM_PROCID",
                           "SLURM_NTASKS",
                           "BACKPLANE_RENDEZVOUS",
                           "MASTER_ADDR",
                           "MASTER_PORT"};
    std::map<std::string, std::optional<std::string>> saved;
    for (const char *name : names) {
        const char *value = std::getenv(name);
        saved[name] = value ? std::optional<std::string>(value) : std::nullopt;
        ::unsetenv(name);
    }
    ::setenv("PMI_RANK", "0", 1);
    ::setenv("PMI_SIZE", "1", 1);
    const LaunchEnvironment env = launchEnvironment();
    CHECK(env.source == "PMI_RANK/PMI_SIZE");
    CHECK(rendezvousFromEnvironment(1s)->processCount() == 1);
    ::setenv("PMI_SIZE", "x", 1);
    CHECK(failureOf([] { launchEnvironment(); }).code == ErrorCode::Config);
    for (const auto &[name, value] : saved) {
        if (value)
            ::setenv(name.c_str(), value->c_str(), 1);
        else
            ::unsetenv(name.c_str());
    }
}
