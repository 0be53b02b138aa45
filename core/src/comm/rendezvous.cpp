// The built-in rendezvous for one process and for a shared directory, their common checks, and
// the launcher environment. TCP is in rendezvous_tcp.cpp.
#include "comm/rendezvous_detail.hpp"

#include <backplane/log.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dirent.h>
#include <filesystem>
#include <random>
#include <thread>

namespace backplane::detail {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

std::string formatDuration(std::chrono::milliseconds duration) {
    const auto ms = duration.count();
    if (ms < 1000) return std::to_string(ms) + " ms";
    if (ms % 1000 == 0) return std::to_string(ms / 1000) + " s";
    std::string text = std::to_string(ms / 1000) + "." + std::to_string(ms % 1000 + 1000).substr(1);
    while (text.back() == '0')
        text.pop_back();
    return text + " s";
}

std::string formatProcesses(const std::vector<uint32_t> &processes, uint32_t processCount) {
    constexpr size_t kNamed = 16;
    std::string text = processes.size() == 1 ? "process " : "processes ";
    const size_t named = std::min(processes.size(), kNamed);
    for (size_t i = 0; i < named; ++i) {
        if (i > 0) text += (i + 1 == named && named == processes.size()) ? " and " : ", ";
        text += std::to_string(processes[i]);
    }
    if (processes.size() > named)
        text += " and " + std::to_string(processes.size() - named) + " more";
    return text + " of " + std::to_string(processCount);
}

CheckedRendezvous::CheckedRendezvous(uint32_t process, uint32_t processCount, std::string what)
    : process_(process), processCount_(processCount), what_(std::move(what)) {
    if (processCount == 0) throw Error(ErrorCode::InvalidArgument, what_ + ": processCount is 0");
    if (process >= processCount)
        throw Error(ErrorCode::InvalidArgument, what_ + ": process " + std::to_string(process) +
                                                    " is out of range for " +
                                                    std::to_string(processCount) + " processes");
}

std::vector<std::vector<std::byte>>
CheckedRendezvous::allGather(std::span<const std::byte> mine, std::chrono::milliseconds timeout) {
    if (failure_)
        throw Error(ErrorCode::InvalidArgument, what_ + ": unusable after an earlier failure (" +
                                                    *failure_ + "); make a new rendezvous");
    if (timeout.count() <= 0)
        throw Error(ErrorCode::InvalidArgument, what_ + ": timeout must be positive, got " +
                                                    std::to_string(timeout.count()) + " ms");
    if (mine.size() > kMaxContributionBytes)
        throw Error(ErrorCode::InvalidArgument,
                    what_ + ": a contribution of " + std::to_string(mine.size()) +
                        " bytes exceeds the limit of " + std::to_string(kMaxContributionBytes));
    try {
        auto all = gather(mine, timeout, step_);
        ++step_;
        return all;
    } catch (const std::exception &e) {
        failure_ = e.what();
        throw;
    }
}

namespace {

class LocalRendezvous final : public CheckedRendezvous {
public:
    LocalRendezvous() : CheckedRendezvous(0, 1, "local rendezvous") {}

protected:
    std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine,
                                               std::chrono::milliseconds, uint64_t) override {
        return {std::vector<std::byte>(mine.begin(), mine.end())};
    }
};

/// One file per process and step, "step<S>.process<P>": written under a temporary name and
/// renamed, so a reader sees all of it or nothing. A process deletes its file of step S-1 once it
/// has read every file of step S: every other process wrote step S only after reading step S-1.
class DirectoryRendezvous final : public CheckedRendezvous {
public:
    DirectoryRendezvous(const std::string &directory, uint32_t process, uint32_t processCount)
        : CheckedRendezvous(process, processCount, "directory rendezvous in " + directory),
          directory_(normalized(directory)) {
        if (directory.empty())
            throw Error(ErrorCode::InvalidArgument, "directory rendezvous: the directory is empty");
        std::error_code ec;
        if (directory_.has_parent_path()) fs::create_directories(directory_.parent_path(), ec);
        // The last part with mkdir's own mode, so no other process of the job ever sees it
        // writable by others between a create and a chmod.
        if (!ec && ::mkdir(directory_.c_str(), 0700) != 0 && errno != EEXIST)
            ec = std::error_code(errno, std::generic_category());
        if (ec || !fs::is_directory(directory_, ec))
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": cannot create the directory" +
                            (ec ? ": " + ec.message() : std::string(": not a directory")));
        refuseForeignDirectory();
        refuseEarlierJob();
    }

protected:
    std::vector<std::vector<std::byte>> gather(std::span<const std::byte> mine,
                                               std::chrono::milliseconds timeout,
                                               uint64_t step) override {
        const auto deadline = Clock::now() + timeout;
        writeOwnFile(mine, step);

        std::vector<std::vector<std::byte>> all(processCount());
        all[process()].assign(mine.begin(), mine.end());
        std::vector<uint32_t> missing;
        for (uint32_t p = 0; p < processCount(); ++p)
            if (p != process()) missing.push_back(p);

        // Backoff from 1 ms to 50 ms: quick when everyone is there, light on an NFS server when
        // a thousand processes wait for a slow one.
        auto pause = std::chrono::milliseconds(1);
        while (true) {
            // Listing the directory makes an NFS client revalidate it, so that a file another
            // node created is not hidden behind a cached negative lookup.
            if (DIR *dir = ::opendir(directory_.c_str())) ::closedir(dir);
            std::erase_if(missing, [&](uint32_t p) { return readFile(p, step, all[p]); });
            if (missing.empty()) break;
            const auto now = Clock::now();
            if (now >= deadline) {
                std::string files;
                for (size_t i = 0; i < std::min<size_t>(missing.size(), 4); ++i)
                    files += (i ? ", " : "") + fileName(step, missing[i]);
                throw Error(ErrorCode::Timeout, what() + ": step " + std::to_string(step) + ": " +
                                                    formatProcesses(missing, processCount()) +
                                                    " did not arrive within " +
                                                    formatDuration(timeout) + " (no " + files +
                                                    (missing.size() > 4 ? ", ..." : "") + ")");
            }
            std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
            pause = std::min(pause * 2, std::chrono::milliseconds(50));
        }

        if (step > 0) {
            std::error_code ignored;
            fs::remove(directory_ / fileName(step - 1, process()), ignored);
        }
        return all;
    }

private:
    static constexpr uint32_t kFileMagic = 0x46525042; // "BPRF"
    static constexpr uint32_t kFileVersion = 1;
    /// magic u32, version u32, process u32, processCount u32, step u64, size u64.
    static constexpr size_t kFileHeaderBytes = 32;

    static std::string fileName(uint64_t step, uint32_t process) {
        return "step" + std::to_string(step) + ".process" + std::to_string(process);
    }

    /// Absolute, without "." or ".." parts and without a trailing separator: "dir/" and
    /// "dir/." would make lstat() follow a link that "dir" is.
    static fs::path normalized(const std::string &directory) {
        if (directory.empty()) return {};
        std::error_code ec;
        fs::path path = fs::absolute(directory, ec).lexically_normal();
        if (ec) path = fs::path(directory).lexically_normal();
        if (!path.has_filename() && path.has_parent_path() && path != path.root_path())
            path = path.parent_path();
        return path;
    }

    /// Whoever can write the directory can take a process's place (or read the contributions: a
    /// collective engine's unique id is one): it must be this user's and closed to the others.
    void refuseForeignDirectory() const {
        struct stat info {};
        if (::lstat(directory_.c_str(), &info) != 0)
            throw fileError("cannot inspect the directory", errno);
        // A link could be pointed elsewhere between this check and the files' use.
        if (S_ISLNK(info.st_mode))
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": the path is a symbolic link; give the directory itself");
        if (info.st_uid != ::geteuid())
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": the directory belongs to user " + std::to_string(info.st_uid) +
                            ", not to this user (" + std::to_string(::geteuid()) +
                            "), who could take a process's place: use a directory of your own");
        if ((info.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
            char mode[8];
            std::snprintf(mode, sizeof mode, "%04o", static_cast<unsigned>(info.st_mode & 07777));
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": the directory is writable by " +
                            ((info.st_mode & S_IWOTH) != 0 ? "every user" : "its group") +
                            " (mode " + mode +
                            "), who could take a process's place: `chmod go-w` it, or use a new "
                            "directory (backplane creates it with mode 0700)");
        }
        // A parent that others may write (and that is not sticky, as /tmp is) lets them rename
        // the directory away and put their own in its place after this check: said, not
        // refused, since shared project directories are often like that.
        for (fs::path parent = directory_.parent_path();
             !parent.empty() && parent != parent.root_path(); parent = parent.parent_path()) {
            struct stat above {};
            if (::lstat(parent.c_str(), &above) != 0) break;
            // A link on the way could be pointed elsewhere by whoever may write where it is.
            if (S_ISLNK(above.st_mode)) {
                struct stat holder {};
                if (::stat(parent.parent_path().c_str(), &holder) == 0 &&
                    (holder.st_mode & (S_IWGRP | S_IWOTH)) != 0 &&
                    (holder.st_mode & S_ISVTX) == 0)
                    throw Error(ErrorCode::InvalidArgument,
                                what() + ": its path goes through the symbolic link " +
                                    parent.string() + " in a directory others may write: give "
                                    "a path without it");
                if (::stat(parent.c_str(), &above) != 0) break;
            }
            if ((above.st_mode & (S_IWGRP | S_IWOTH)) != 0 && (above.st_mode & S_ISVTX) == 0) {
                log::write(log::Subsystem::Comm, log::Level::Warn,
                           what() + ": its parent " + parent.string() +
                               " may be written by other users and is not sticky: they could "
                               "replace the directory while the job runs; prefer a directory "
                               "under a parent only you can write");
                break;
            }
        }
    }

    /// This process has written nothing yet, and no process can get past step 0 without it: a
    /// file of this process, or of a later step, was left by an earlier job.
    void refuseEarlierJob() const {
        std::error_code ec;
        for (const auto &entry : fs::directory_iterator(directory_, ec)) {
            const std::string name = entry.path().filename().string();
            unsigned long long step = 0;
            unsigned long owner = 0;
            char rest = 0;
            if (std::sscanf(name.c_str(), "step%llu.process%lu%c", &step, &owner, &rest) != 2)
                continue;
            if (owner == process() || step > 0)
                throw Error(ErrorCode::InvalidArgument,
                            what() + ": holds " + name +
                                " from an earlier job; give each job or communicator an empty "
                                "or new directory");
        }
        if (ec)
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": cannot list the directory: " + ec.message());
    }

    void writeOwnFile(std::span<const std::byte> mine, uint64_t step) const {
        std::vector<std::byte> data;
        data.reserve(kFileHeaderBytes + mine.size());
        wire::appendU32(data, kFileMagic);
        wire::appendU32(data, kFileVersion);
        wire::appendU32(data, process());
        wire::appendU32(data, processCount());
        wire::appendU64(data, step);
        wire::appendU64(data, mine.size());
        data.insert(data.end(), mine.begin(), mine.end());

        const fs::path target = directory_ / fileName(step, process());
        const fs::path temporary =
            directory_ / ("." + fileName(step, process()) + "." + std::to_string(::getpid()) + "." +
                          std::to_string(std::random_device{}()) + ".tmp");
        const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0) throw fileError("cannot create " + temporary.string(), errno);
        size_t written = 0;
        while (written < data.size()) {
            const ssize_t n = ::write(fd, data.data() + written, data.size() - written);
            if (n < 0 && errno == EINTR) continue;
            if (n <= 0) {
                const int error = n < 0 ? errno : EIO;
                ::close(fd);
                ::unlink(temporary.c_str());
                throw fileError("cannot write " + temporary.string(), error);
            }
            written += static_cast<size_t>(n);
        }
        // close() is where NFS reports a failed write-back.
        if (::close(fd) != 0) {
            const int error = errno;
            ::unlink(temporary.c_str());
            throw fileError("cannot write " + temporary.string(), error);
        }
        if (::rename(temporary.c_str(), target.c_str()) != 0) {
            const int error = errno;
            ::unlink(temporary.c_str());
            throw fileError("cannot rename " + temporary.string() + " to " + target.string(),
                            error);
        }
    }

    /// Reads process `p`'s file of `step` into `out`; false when it is not there yet.
    bool readFile(uint32_t p, uint64_t step, std::vector<std::byte> &out) const {
        const fs::path path = directory_ / fileName(step, p);
        const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0) {
            if (errno == ENOENT) return false;
            throw fileError("cannot open " + path.string(), errno);
        }
        struct Closer {
            int fd;
            ~Closer() { ::close(fd); }
        } closer{fd};
        struct stat info {};
        if (::fstat(fd, &info) != 0) throw fileError("cannot stat " + path.string(), errno);
        const auto size = static_cast<uint64_t>(info.st_size);
        if (size < kFileHeaderBytes || size > kFileHeaderBytes + kMaxContributionBytes)
            throw malformed(path, p, "its size, " + std::to_string(size) + " bytes, is impossible");
        std::vector<std::byte> data(size);
        size_t got = 0;
        while (got < size) {
            const ssize_t n = ::read(fd, data.data() + got, size - got);
            if (n < 0 && errno == EINTR) continue;
            if (n < 0) throw fileError("cannot read " + path.string(), errno);
            if (n == 0) throw malformed(path, p, "it is shorter than its size said");
            got += static_cast<size_t>(n);
        }
        const std::byte *h = data.data();
        if (wire::readU32(h) != kFileMagic || wire::readU32(h + 4) != kFileVersion)
            throw malformed(path, p, "it is not a backplane rendezvous file of this version");
        if (wire::readU32(h + 8) != p || wire::readU64(h + 16) != step)
            throw malformed(path, p, "its header names another process or step");
        if (wire::readU32(h + 12) != processCount())
            throw Error(ErrorCode::InvalidArgument,
                        what() + ": process " + std::to_string(p) + " uses " +
                            std::to_string(wire::readU32(h + 12)) + " processes, this one (" +
                            std::to_string(process()) + ") " + std::to_string(processCount()) +
                            " (" + path.filename().string() + ")");
        if (wire::readU64(h + 24) != size - kFileHeaderBytes)
            throw malformed(path, p, "its header gives another size");
        out.assign(data.begin() + kFileHeaderBytes, data.end());
        return true;
    }

    Error fileError(const std::string &action, int error) const {
        return Error(ErrorCode::InvalidArgument,
                     what() + ": " + action + ": " + std::strerror(error));
    }
    Error malformed(const fs::path &path, uint32_t p, const std::string &why) const {
        return Error(kPeerFailed, what() + ": the file of process " + std::to_string(p) + ", " +
                                      path.filename().string() + ", is malformed: " + why);
    }

    fs::path directory_;
};

/// Strict decimal: digits only, no sign or spaces, fits in uint32_t.
uint32_t parseCount(const char *name, const char *value) {
    const std::string text = value;
    uint32_t number = 0;
    const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), number);
    if (text.empty() || text.front() == '-' || ec != std::errc() ||
        end != text.data() + text.size())
        throw Error(ErrorCode::Config,
                    std::string(name) + "=\"" + text + "\" is not a number from 0 to 4294967295");
    return number;
}

struct LauncherVariables {
    const char *rank;
    const char *size;
    /// Whether the size alone selects this launcher: only for backplane's own variables. A
    /// launcher's job-wide size (SLURM_NTASKS in an salloc shell) is also set around processes
    /// it did not start, which carry no rank.
    bool sizeSelects;
};

constexpr LauncherVariables kLaunchers[] = {
    {"BACKPLANE_RANK", "BACKPLANE_WORLD_SIZE", true},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", false},
    {"PMI_RANK", "PMI_SIZE", false},
    {"SLURM_PROCID", "SLURM_NTASKS", false},
};

std::unique_ptr<Rendezvous> tcpFromSpec(const std::string &variable, const std::string &address,
                                        const LaunchEnvironment &env,
                                        const EnvironmentLookup &lookup,
                                        std::chrono::milliseconds connectTimeout) {
    const char *bind = lookup("BACKPLANE_RENDEZVOUS_BIND");
    std::string token;
    std::string source;
    try {
        parseTcpAddress(address);
        if (env.processCount > 1) {
            token = defaultToken(lookup, source);
            checkToken("tcp rendezvous at " + address, token);
        }
    } catch (const Error &e) {
        throw Error(ErrorCode::Config, variable + ": " + e.what());
    }
    return tcpRendezvous(address, env.process, env.processCount, connectTimeout, token,
                         bind != nullptr ? bind : "", source);
}

} // namespace

LaunchEnvironment launchEnvironment(const EnvironmentLookup &lookup) {
    for (const auto &launcher : kLaunchers) {
        const char *rank = lookup(launcher.rank);
        const char *size = lookup(launcher.size);
        if (rank == nullptr && (size == nullptr || !launcher.sizeSelects)) continue;
        const std::string pair = std::string(launcher.rank) + "/" + launcher.size;
        if (rank == nullptr)
            throw Error(ErrorCode::Config, std::string(launcher.size) + " is set but " +
                                               launcher.rank + " is not: set both or neither");
        if (size == nullptr)
            throw Error(ErrorCode::Config, std::string(launcher.rank) + " is set but " +
                                               launcher.size + " is not: set both");
        LaunchEnvironment env;
        env.process = parseCount(launcher.rank, rank);
        env.processCount = parseCount(launcher.size, size);
        env.source = pair;
        if (env.processCount == 0)
            throw Error(ErrorCode::Config, std::string(launcher.size) + "=0: there must be at "
                                                                        "least one process");
        if (env.process >= env.processCount)
            throw Error(ErrorCode::Config, std::string(launcher.rank) + "=" + rank +
                                               " is not below " + launcher.size + "=" + size);
        return env;
    }
    return {};
}

std::unique_ptr<Rendezvous> rendezvousFromEnvironment(const EnvironmentLookup &lookup,
                                                      std::chrono::milliseconds connectTimeout) {
    const LaunchEnvironment env = launchEnvironment(lookup);
    if (const char *spec = lookup("BACKPLANE_RENDEZVOUS")) {
        const std::string text = spec;
        const std::string variable = "BACKPLANE_RENDEZVOUS=\"" + text + "\"";
        if (text.starts_with("dir:") && text.size() > 4)
            return directoryRendezvous(text.substr(4), env.process, env.processCount);
        if (text.starts_with("tcp:"))
            return tcpFromSpec(variable, text.substr(4), env, lookup, connectTimeout);
        throw Error(ErrorCode::Config,
                    variable + ": expected \"dir:/shared/path\" or \"tcp:host:port\"");
    }
    const char *masterAddress = lookup("MASTER_ADDR");
    const char *masterPort = lookup("MASTER_PORT");
    if (masterAddress != nullptr || masterPort != nullptr) {
        if (masterAddress == nullptr || masterPort == nullptr)
            throw Error(ErrorCode::Config,
                        std::string(masterAddress ? "MASTER_ADDR" : "MASTER_PORT") +
                            " is set but " + (masterAddress ? "MASTER_PORT" : "MASTER_ADDR") +
                            " is not: set both, or BACKPLANE_RENDEZVOUS");
        std::string host = masterAddress;
        // torchrun's MASTER_ADDR may be a bare IPv6 address.
        if (host.find(':') != std::string::npos && !host.starts_with("[")) host = "[" + host + "]";
        const std::string variable =
            std::string("MASTER_ADDR=\"") + masterAddress + "\" MASTER_PORT=\"" + masterPort + "\"";
        return tcpFromSpec(variable, host + ":" + masterPort, env, lookup, connectTimeout);
    }
    if (env.processCount == 1) return localRendezvous();
    throw Error(ErrorCode::Config,
                env.source + " gives " + std::to_string(env.processCount) +
                    " processes but no rendezvous: set BACKPLANE_RENDEZVOUS=dir:/shared/path or "
                    "tcp:host:port (or MASTER_ADDR and MASTER_PORT)");
}

} // namespace backplane::detail

namespace backplane {

std::unique_ptr<Rendezvous> localRendezvous() {
    return std::make_unique<detail::LocalRendezvous>();
}

std::unique_ptr<Rendezvous> directoryRendezvous(const std::string &directory, uint32_t process,
                                                uint32_t processCount) {
    return std::make_unique<detail::DirectoryRendezvous>(directory, process, processCount);
}

LaunchEnvironment launchEnvironment() { return detail::launchEnvironment(::getenv); }

std::unique_ptr<Rendezvous> rendezvousFromEnvironment(std::chrono::milliseconds connectTimeout) {
    return detail::rendezvousFromEnvironment(::getenv, connectTimeout);
}

} // namespace backplane
