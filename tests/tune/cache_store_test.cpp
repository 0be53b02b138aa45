// Tests of the cache store and the kernel cache (internal: core/src/cache/kernel_cache.hpp).
#include "tune_fixtures.hpp"

#include "cache/kernel_cache.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <thread>

#include <sys/stat.h>

using namespace backplane;
using namespace tunetest;

namespace {

std::vector<unsigned char> bytesOf(std::string_view text) {
    return {text.begin(), text.end()};
}

std::vector<unsigned char> readAll(const std::filesystem::path &path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void writeAll(const std::filesystem::path &path, const std::vector<unsigned char> &bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char *>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
}

void putLe(std::vector<unsigned char> &out, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}

/// An entry file as docs/cache.md describes it, built by hand.
std::vector<unsigned char> handMadeEntry(uint32_t format, const std::string &fullKey,
                                         const std::string &payload) {
    std::vector<unsigned char> out = bytesOf(std::string_view("BPCACHE\0", 8));
    putLe(out, format, 4);
    putLe(out, fullKey.size(), 4);
    putLe(out, payload.size(), 8);
    putLe(out, fnv1a64(payload, fnv1a64(fullKey)), 8);
    out.insert(out.end(), fullKey.begin(), fullKey.end());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

} // namespace

TEST_CASE("a stored entry reads back and the key inside the file is compared") {
    TempDir dir;
    CacheStore store(dir.path());
    CHECK(!store.load(CacheKind::Kernels, "k1"));
    CHECK(store.store(CacheKind::Kernels, "k1", "payload one"));
    CHECK(store.persistent());
    CHECK(store.load(CacheKind::Kernels, "k1") == bytesOf("payload one"));
    CHECK(store.entryPath(CacheKind::Kernels, "k1").extension() == ".bin");
    CHECK(store.entryPath(CacheKind::Tune, "k1").extension() == ".json");

    // Another key's file under k2's name (as a hash collision would put it): a miss.
    std::filesystem::copy_file(store.entryPath(CacheKind::Kernels, "k1"),
                               store.entryPath(CacheKind::Kernels, "k2"));
    CHECK(!store.load(CacheKind::Kernels, "k2"));

    // Re-storing replaces.
    CHECK(store.store(CacheKind::Kernels, "k1", "payload two"));
    CHECK(store.load(CacheKind::Kernels, "k1") == bytesOf("payload two"));
    store.remove(CacheKind::Kernels, "k1");
    CHECK(!store.load(CacheKind::Kernels, "k1"));
}

TEST_CASE("an entry that is a FIFO or a device is ignored without blocking or reading it") {
    TempDir dir;
    CacheStore store(dir.path());
    CHECK(store.store(CacheKind::Probes, "k", "payload"));
    const std::filesystem::path path = store.entryPath(CacheKind::Probes, "k");
    std::filesystem::remove(path);
    REQUIRE(::mkfifo(path.c_str(), 0600) == 0);
    // Before the check, open() blocked here for ever waiting for a writer.
    CHECK(!store.load(CacheKind::Probes, "k"));
    std::filesystem::remove(path);
    std::filesystem::create_symlink("/dev/zero", path); // was read until memory ran out
    CHECK(!store.load(CacheKind::Probes, "k"));
    CHECK(store.store(CacheKind::Probes, "k", "payload")); // and a store replaces it
    CHECK(store.load(CacheKind::Probes, "k") == bytesOf("payload"));
}

TEST_CASE("a truncated entry is ignored with a warning and rebuilt") {
    TempDir dir;
    CacheStore store(dir.path());
    store.store(CacheKind::Kernels, "k", std::string(1000, 'x'));
    const auto path = store.entryPath(CacheKind::Kernels, "k");
    auto bytes = readAll(path);
    bytes.resize(bytes.size() - 10);
    writeAll(path, bytes);
    {
        LogCapture logs(log::Subsystem::Cache);
        CHECK(!store.load(CacheKind::Kernels, "k"));
        REQUIRE(logs.messages().size() == 1);
        CHECK(logs.messages()[0].find("truncated") != std::string::npos);
        CHECK(logs.messages()[0].find(path.string()) != std::string::npos);
    }
    CHECK(store.store(CacheKind::Kernels, "k", std::string(1000, 'y')));
    CHECK(store.load(CacheKind::Kernels, "k") == bytesOf(std::string(1000, 'y')));
}

TEST_CASE("an entry with a corrupt payload byte or a garbage header is ignored") {
    TempDir dir;
    CacheStore store(dir.path());
    store.store(CacheKind::Tune, "k", "{\"a\": 1}");
    const auto path = store.entryPath(CacheKind::Tune, "k");
    auto bytes = readAll(path);
    bytes.back() ^= 0x20;
    writeAll(path, bytes);
    LogCapture logs(log::Subsystem::Cache);
    CHECK(!store.load(CacheKind::Tune, "k"));
    writeAll(path, bytesOf("not a cache entry at all, just text that is long enough"));
    CHECK(!store.load(CacheKind::Tune, "k"));
    writeAll(path, {});
    CHECK(!store.load(CacheKind::Tune, "k"));
    const auto messages = logs.messages();
    REQUIRE(messages.size() == 3);
    CHECK(messages[0].find("checksum") != std::string::npos);
    CHECK(messages[1].find("magic") != std::string::npos);
    CHECK(store.entries(CacheKind::Tune).empty());
}

TEST_CASE("entries of another format or backplane version are not used") {
    TempDir dir;
    CacheStore store(dir.path());
    const auto path = store.entryPath(CacheKind::Kernels, "k");
    std::filesystem::create_directories(path.parent_path());
    const std::string current = std::string("backplane ") + BACKPLANE_VERSION + "\nk";

    writeAll(path, handMadeEntry(1, current, "good"));
    CHECK(store.load(CacheKind::Kernels, "k") == bytesOf("good")); // the documented format

    writeAll(path, handMadeEntry(99, current, "future"));
    {
        LogCapture logs(log::Subsystem::Cache);
        CHECK(!store.load(CacheKind::Kernels, "k"));
        REQUIRE(logs.messages().size() == 1);
        CHECK(logs.messages()[0].find("format version 99") != std::string::npos);
    }
    writeAll(path, handMadeEntry(1, "backplane 0.0.0-old\nk", "old"));
    CHECK(!store.load(CacheKind::Kernels, "k"));
    CHECK(store.entries(CacheKind::Kernels).empty());
}

TEST_CASE("a cache directory that cannot be created degrades to memory with one warning") {
    TempDir dir;
    // A regular file where the directory should be: fails even for root.
    const auto blocker = dir.path() / "blocker";
    writeAll(blocker, bytesOf("x"));
    CacheStore store(blocker / "cache");
    LogCapture logs(log::Subsystem::Cache);
    CHECK(!store.store(CacheKind::Kernels, "a", "one"));
    CHECK(!store.store(CacheKind::Kernels, "b", "two"));
    CHECK(!store.persistent());
    CHECK(store.load(CacheKind::Kernels, "a") == bytesOf("one"));
    CHECK(store.load(CacheKind::Kernels, "b") == bytesOf("two"));
    REQUIRE(logs.messages().size() == 1);
    CHECK(logs.messages()[0].find("in memory") != std::string::npos);
}

TEST_CASE("usage counts files per kind and clear removes one kind") {
    TempDir dir;
    CacheStore store(dir.path());
    store.store(CacheKind::Kernels, "a", std::string(100, 'a'));
    store.store(CacheKind::Kernels, "b", std::string(100, 'b'));
    store.store(CacheKind::Tune, "t", "{}");
    const auto usage = store.usage();
    REQUIRE(usage.size() == kCacheKindCount);
    CHECK(std::string(toString(usage[0].kind)) == "kernels");
    CHECK(usage[0].files == 2);
    CHECK(usage[0].bytes > 200);
    CHECK(usage[1].files == 1);
    CHECK(usage[2].files == 0);
    CHECK(store.entries(CacheKind::Kernels).size() == 2);
    CHECK(store.clear(CacheKind::Kernels) == 2);
    CHECK(store.usage()[0].files == 0);
    CHECK(store.load(CacheKind::Tune, "t").has_value());
}

TEST_CASE("the cache directory follows config, then the environment") {
    const char *saved[] = {std::getenv("BACKPLANE_CACHE_DIR"), std::getenv("XDG_CACHE_HOME"),
                           std::getenv("HOME")};
    const std::string savedText[] = {saved[0] ? saved[0] : "", saved[1] ? saved[1] : "",
                                     saved[2] ? saved[2] : ""};
    Config config;
    ::setenv("BACKPLANE_CACHE_DIR", "/env/bp", 1);
    ::setenv("XDG_CACHE_HOME", "/xdg", 1);
    ::setenv("HOME", "/home/u", 1);
    CHECK(cacheDirectory(config) == "/env/bp");
    ::unsetenv("BACKPLANE_CACHE_DIR");
    CHECK(cacheDirectory(config) == "/xdg/backplane");
    ::unsetenv("XDG_CACHE_HOME");
    CHECK(cacheDirectory(config) == "/home/u/.cache/backplane");
    config.cacheDir = "/explicit";
    CHECK(cacheDirectory(config) == "/explicit");
    config.cacheEnabled = false;
    CHECK(cacheDirectory(config).empty());
    const char *names[] = {"BACKPLANE_CACHE_DIR", "XDG_CACHE_HOME", "HOME"};
    for (int i = 0; i < 3; ++i) {
        if (saved[i])
            ::setenv(names[i], savedText[i].c_str(), 1);
        else
            ::unsetenv(names[i]);
    }
}

TEST_CASE("the kernel cache round-trips blobs, and keeps them in memory when disabled") {
    TempDir dir;
    Config config;
    config.cacheDir = dir.path();
    const std::vector<unsigned char> blob = {0, 1, 2, 255, 254};
    CHECK(!detail::loadCachedKernel(config, "cuda|sm_90|hash"));
    detail::storeCachedKernel(config, "cuda|sm_90|hash", blob);
    CHECK(detail::loadCachedKernel(config, "cuda|sm_90|hash") == blob);
    CHECK(CacheStore(dir.path()).usage()[0].files == 1);

    Config memoryOnly;
    memoryOnly.cacheEnabled = false;
    detail::storeCachedKernel(memoryOnly, "k", blob);
    CHECK(detail::loadCachedKernel(memoryOnly, "k") == blob);
    CHECK(CacheStore::forConfig(memoryOnly).directory().empty());
}

TEST_CASE("a writer racing cache clear keeps persisting, and clear never fails meanwhile") {
    TempDir dir;
    // Two stores on one directory, as a program and `backplane cache clear` in another process.
    CacheStore writer(dir.path());
    CacheStore clearer(dir.path());
    LogCapture logs(log::Subsystem::Cache);
    std::atomic<bool> writing{true};
    std::atomic<int> clears{0};
    std::string clearError;
    std::thread clearing([&] {
        while (writing.load()) {
            try {
                clearer.clear(CacheKind::Kernels);
                clears.fetch_add(1);
            } catch (const std::exception &e) {
                clearError = e.what();
                return;
            }
        }
    });
    // Until both sides did enough rounds for the clears to hit every step of a store.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (int i = 0; (i < 200 || clears.load() < 200) && std::chrono::steady_clock::now() < deadline;
         ++i)
        writer.store(CacheKind::Kernels, "key " + std::to_string(i % 16), std::string(512, 'w'));
    writing.store(false);
    clearing.join();
    INFO("clears: " << clears.load() << "; clear threw: " << clearError);
    CHECK(clearError.empty());
    CHECK(clears.load() > 0);
    // The directory vanished under the writer many times; it still writes to disk.
    CHECK(writer.persistent());
    CHECK(logs.messages().empty());
    CHECK(writer.store(CacheKind::Kernels, "final", "persisted"));
    CHECK(CacheStore(dir.path()).load(CacheKind::Kernels, "final") == bytesOf("persisted"));
}

TEST_CASE("clears racing each other never fail on files the other removed") {
    TempDir dir;
    constexpr int kFiles = 1000;
    constexpr int kClearers = 4;
    for (int round = 0; round < 3; ++round) {
        // Files of any content: clear removes whatever is in the kind's directory.
        const auto tuneDir = dir.path() / "tune";
        std::filesystem::create_directories(tuneDir / "nested");
        for (int i = 0; i < kFiles; ++i)
            writeAll(tuneDir / (i % 10 == 0 ? "nested" : "") / ("t" + std::to_string(i) + ".json"),
                     bytesOf("{}"));
        std::atomic<int> ready{0};
        std::vector<uint64_t> removed(kClearers, 0);
        std::vector<std::string> errors(kClearers);
        std::vector<std::thread> threads;
        for (int c = 0; c < kClearers; ++c)
            threads.emplace_back([&, c] {
                CacheStore mine(dir.path());
                ready.fetch_add(1);
                while (ready.load() < kClearers)
                    std::this_thread::yield();
                try {
                    removed[c] = mine.clear(CacheKind::Tune);
                } catch (const std::exception &e) {
                    errors[c] = e.what();
                }
            });
        for (std::thread &t : threads)
            t.join();
        uint64_t total = 0;
        for (int c = 0; c < kClearers; ++c) {
            INFO("round " << round << ", clearer " << c << ": " << errors[c]);
            CHECK(errors[c].empty());
            total += removed[c];
        }
        CHECK(total == kFiles); // each file counted by the one clear that removed it
        CHECK(!std::filesystem::exists(dir.path() / "tune"));
    }
}
