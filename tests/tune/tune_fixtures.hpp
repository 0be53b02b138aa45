// Shared by the tune tests: temporary cache directories, log capture, sleeping candidates.
#pragma once

#include <backplane/log.hpp>
#include <backplane/tune.hpp>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace tunetest {

/// A fresh directory under the system temp dir, removed with everything in it at scope exit.
class TempDir {
public:
    TempDir() {
        std::string pattern = (std::filesystem::temp_directory_path() / "bp-tune-XXXXXX").string();
        if (::mkdtemp(pattern.data()) == nullptr) std::abort();
        path_ = pattern;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::permissions(path_, std::filesystem::perms::owner_all,
                                     std::filesystem::perm_options::add, ec);
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    const std::filesystem::path &path() const { return path_; }

private:
    std::filesystem::path path_;
};

/// Collects log messages of one subsystem at warn and above while alive.
class LogCapture {
public:
    explicit LogCapture(backplane::log::Subsystem subsystem) {
        backplane::log::setSink([this, subsystem](backplane::log::Level level,
                                                  backplane::log::Subsystem from,
                                                  std::string_view message) {
            if (from != subsystem || level < backplane::log::Level::Warn) return;
            std::lock_guard lock(mutex_);
            messages_.emplace_back(message);
        });
    }
    ~LogCapture() { backplane::log::setSink(nullptr); }
    LogCapture(const LogCapture &) = delete;
    LogCapture &operator=(const LogCapture &) = delete;
    std::vector<std::string> messages() const {
        std::lock_guard lock(mutex_);
        return messages_;
    }

private:
    mutable std::mutex mutex_;
    std::vector<std::string> messages_;
};

/// The inputs of the test sets: one size axis.
struct Problem {
    uint64_t size = 100;
};

inline std::string problemKey(const Problem &p, backplane::TuneLevel level) {
    return backplane::tune::KeyBuilder(level).axis("n", p.size).str();
}

inline void sleepMs(double ms) {
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(ms * 1000)));
}

using SleepSet = backplane::tune::TunableSet<Problem, std::string>;

/// Three candidates with clearly different costs, returning their own name: "slow" (6 ms),
/// "fast" (1 ms), "medium" (3 ms), declared in that order so the fastest is not first.
inline SleepSet sleepers(std::string name = "sleepers") {
    SleepSet set(std::move(name), problemKey);
    set.add("slow", [](const Problem &) { sleepMs(6); return std::string("slow"); });
    set.add("fast", [](const Problem &) { sleepMs(1); return std::string("fast"); });
    set.add("medium", [](const Problem &) { sleepMs(3); return std::string("medium"); });
    return set;
}

/// Few samples: the tests check decisions, not precision.
inline backplane::tune::BenchPolicy quickPolicy() {
    backplane::tune::BenchPolicy p;
    p.warmups = 1;
    p.minSamples = 3;
    p.maxSamples = 5;
    return p;
}

inline backplane::tune::Tuner::Options tunerOptions(backplane::CacheStore *store,
                                                    std::string device = "test-device") {
    backplane::tune::Tuner::Options o;
    o.store = store;
    o.device = std::move(device);
    o.policy = quickPolicy();
    o.progress = false;
    return o;
}

} // namespace tunetest
