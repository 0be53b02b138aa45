// Tests across processes: a warm cache in a second process, two processes writing one cache.
#include "tune_fixtures.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>

extern char **environ;

using namespace backplane;
using namespace tunetest;

namespace {

/// Starts tune_helper with `args`; stdout goes to `output` when given.
pid_t spawnHelper(const std::vector<std::string> &args, const std::filesystem::path &output = {}) {
    std::vector<std::string> all = {TUNE_HELPER};
    all.insert(all.end(), args.begin(), args.end());
    std::vector<char *> argv;
    for (auto &a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (!output.empty())
        posix_spawn_file_actions_addopen(&actions, 1, output.c_str(), O_WRONLY | O_CREAT | O_TRUNC,
                                         0644);
    pid_t pid = -1;
    const int rc = posix_spawn(&pid, TUNE_HELPER, &actions, nullptr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    REQUIRE(rc == 0);
    return pid;
}

int waitFor(pid_t pid) {
    int status = 0;
    REQUIRE(::waitpid(pid, &status, 0) == pid);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string runHelper(const std::vector<std::string> &args, const std::filesystem::path &out) {
    CHECK(waitFor(spawnHelper(args, out)) == 0);
    std::FILE *f = std::fopen(out.c_str(), "r");
    REQUIRE(f != nullptr);
    char line[256] = {};
    std::fgets(line, sizeof line, f);
    std::fclose(f);
    return line;
}

} // namespace

TEST_CASE("a second process with the same cache directory runs no benchmark") {
    TempDir dir;
    const auto cache = (dir.path() / "cache").string();
    const auto out = dir.path() / "out.txt";
    const std::string first = runHelper({"tune", cache, "dev-a", "base"}, out);
    CHECK(first.find("tunings=1 ") != std::string::npos);
    CHECK(first.find("winner=fast") != std::string::npos);
    const std::string second = runHelper({"tune", cache, "dev-a", "base"}, out);
    CHECK(second.find("tunings=0 runs=0 persistent=1 winner=fast") != std::string::npos);
    // Another candidate set or device in a third process tunes again.
    CHECK(runHelper({"tune", cache, "dev-a", "extra"}, out).find("tunings=1 ") !=
          std::string::npos);
    CHECK(runHelper({"tune", cache, "dev-b", "base"}, out).find("tunings=1 ") !=
          std::string::npos);
}

TEST_CASE("two processes tuning and compiling into one cache leave only valid entries") {
    TempDir dir;
    const auto cache = (dir.path() / "cache").string();
    const pid_t a = spawnHelper({"stress", cache, "200"});
    const pid_t b = spawnHelper({"stress", cache, "200"});
    CHECK(waitFor(a) == 0);
    CHECK(waitFor(b) == 0);

    LogCapture logs(log::Subsystem::Cache);
    CacheStore store(cache);
    CHECK(store.entries(CacheKind::Kernels).size() == 8);
    const auto tuned = store.entries(CacheKind::Tune);
    CHECK(tuned.size() == 8);
    for (const auto &[key, payload] : tuned)
        CHECK_NOTHROW(tune::Tuner::fromJson(
            std::string_view(reinterpret_cast<const char *>(payload.data()), payload.size()), key));
    CHECK(logs.messages().empty()); // nothing corrupt
    for (const auto &kind : {"kernels", "tune"})
        for (const auto &item : std::filesystem::directory_iterator(dir.path() / "cache" / kind))
            CHECK(item.path().filename().string().rfind(".tmp-", 0) != 0); // no temp file left
}
