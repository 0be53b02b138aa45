// CacheStore: entry files with a checked header, atomic publish, degrade-to-memory on I/O errors.
#include <backplane/cache.hpp>
#include <backplane/error.hpp>
#include <backplane/log.hpp>

#include "cache/cache_entry.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <sys/stat.h>
#include <thread>
#include <unistd.h>

namespace backplane {
namespace fs = std::filesystem;

namespace {

constexpr char kMagic[8] = {'B', 'P', 'C', 'A', 'C', 'H', 'E', '\0'};
/// Bumped whenever the header layout changes; older files are then ignored (and rewritten).
constexpr uint32_t kFormatVersion = 1;
/// magic, format version, key size, payload size, checksum.
constexpr size_t kHeaderSize = 8 + 4 + 4 + 8 + 8;
constexpr const char *kTempPrefix = ".tmp-";
/// How often store() re-creates a directory that vanished under it before giving up this once.
constexpr int kPublishAttempts = 8;

constexpr const char *kKindNames[kCacheKindCount] = {"kernels", "tune", "pipelines", "probes"};
constexpr const char *kKindExtensions[kCacheKindCount] = {".bin", ".json", "", ".json"};

void putU32(std::vector<unsigned char> &out, uint32_t v) {
    for (int i = 0; i < 4; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
void putU64(std::vector<unsigned char> &out, uint64_t v) {
    for (int i = 0; i < 8; ++i) out.push_back(static_cast<unsigned char>(v >> (8 * i)));
}
uint64_t getLe(const unsigned char *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    return v;
}

std::string hex64(uint64_t v) {
    char text[17];
    std::snprintf(text, sizeof text, "%016llx", static_cast<unsigned long long>(v));
    return text;
}

void warn(const std::string &message) {
    log::write(log::Subsystem::Cache, log::Level::Warn, message);
}

std::optional<std::string> environment(const char *name) {
    const char *value = std::getenv(name);
    if (value == nullptr || *value == '\0') return std::nullopt;
    return std::string(value);
}

/// Reads a whole file; nothing when it does not exist or cannot be read.
/// The largest entry file read (a kernel binary is megabytes; anything bigger is not ours).
constexpr uint64_t kMaxEntryBytes = 1ull << 30;

/// Reads an entry file: only a regular file (a FIFO or a link to /dev/zero planted in the cache
/// would hang or exhaust memory), opened without blocking, at most kMaxEntryBytes.
std::optional<std::vector<unsigned char>> readFile(const fs::path &path) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return std::nullopt;
    struct stat st {};
    if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) > kMaxEntryBytes) {
        ::close(fd);
        return std::nullopt;
    }
    std::vector<unsigned char> data;
    data.reserve(static_cast<size_t>(st.st_size));
    unsigned char buffer[65536];
    for (;;) {
        const ssize_t n = ::read(fd, buffer, sizeof buffer);
        if (n < 0) {
            if (errno == EINTR) continue;
            ::close(fd);
            return std::nullopt;
        }
        if (n == 0) break;
        if (data.size() + static_cast<size_t>(n) > kMaxEntryBytes) { // grew while being read
            ::close(fd);
            return std::nullopt;
        }
        data.insert(data.end(), buffer, buffer + n);
    }
    ::close(fd);
    return data;
}

/// Writes `bytes` to a fresh temporary file next to `target`, fsyncs, closes and size-checks it,
/// and renames it over `target`. rename() within one directory is atomic on POSIX file systems, so
/// a concurrent reader sees either the old file or the new one. Returns "" or the failure (errno
/// text); `error` is the errno (ENOENT: the directory vanished, e.g. under `cache clear`). Any
/// failure removes the temporary file.
std::string publishFile(const fs::path &target, const std::vector<unsigned char> &bytes,
                        int &error) {
    static std::atomic<uint64_t> counter{0};
    const fs::path temp =
        target.parent_path() /
        (std::string(kTempPrefix) + std::to_string(::getpid()) + "-" +
         std::to_string(std::hash<std::thread::id>{}(std::this_thread::get_id()) % 1000000) +
         "-" + std::to_string(counter.fetch_add(1)) + "-" + target.filename().string());
    const auto failed = [&](const char *step, int code) {
        ::unlink(temp.c_str());
        error = code;
        return std::string(step) + " " + temp.string() + ": " + std::strerror(code);
    };
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
        error = errno;
        return "cannot create " + temp.string() + ": " + std::strerror(error);
    }
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int code = n < 0 ? errno : ENOSPC;
            ::close(fd);
            return failed("cannot write", code);
        }
        done += static_cast<size_t>(n);
    }
    struct stat written {};
    if (::fsync(fd) != 0 || ::fstat(fd, &written) != 0) {
        const int code = errno;
        ::close(fd);
        return failed("cannot flush", code);
    }
    if (::close(fd) != 0) return failed("cannot close", errno);
    if (static_cast<uint64_t>(written.st_size) != bytes.size())
        return failed("incomplete write of", ENOSPC);
    if (::rename(temp.c_str(), target.c_str()) != 0) {
        const int code = errno;
        const std::string reason = failed("cannot rename", code);
        return reason + " (to " + target.string() + ")";
    }
    error = 0;
    return {};
}

/// Removes `dir` and everything in it while other threads and processes may be writing into it
/// or clearing it too. A file or directory that vanished was removed by someone else: success. A
/// directory that a writer refilled meanwhile is walked again a few times; entries written after
/// that stay (they were stored during the clear). Returns the number of files this call removed;
/// throws Error(Internal) naming the path on any other failure (permission, I/O).
uint64_t removeTree(const fs::path &dir) {
    const auto fail = [](const fs::path &path, int code) {
        throw Error(ErrorCode::Internal, "cannot clear cache directory: cannot remove " +
                                             path.string() + ": " + std::strerror(code) +
                                             "; remove it by hand");
    };
    uint64_t files = 0;
    for (int pass = 0; pass < 4; ++pass) {
        std::vector<fs::path> dirs;
        std::vector<fs::path> pending{dir};
        while (!pending.empty()) {
            const fs::path current = std::move(pending.back());
            pending.pop_back();
            std::error_code ec;
            fs::directory_iterator it(current, ec);
            if (ec) {
                if (ec.value() == ENOENT) continue;
                if (ec.value() == ENOTDIR) { // a file where a directory was expected
                    if (::unlink(current.c_str()) == 0)
                        ++files;
                    else if (errno != ENOENT)
                        fail(current, errno);
                    continue;
                }
                fail(current, ec.value());
            }
            dirs.push_back(current);
            for (; it != fs::directory_iterator(); it.increment(ec)) {
                std::error_code typeError;
                if (it->symlink_status(typeError).type() == fs::file_type::directory) {
                    pending.push_back(it->path());
                    continue;
                }
                if (::unlink(it->path().c_str()) == 0)
                    ++files;
                else if (errno == EISDIR)
                    pending.push_back(it->path()); // replaced meanwhile
                else if (errno != ENOENT)
                    fail(it->path(), errno);
            }
            if (ec && ec.value() != ENOENT) fail(current, ec.value());
        }
        bool refilled = false;
        for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) {
            if (::rmdir(it->c_str()) == 0 || errno == ENOENT) continue;
            if (errno == ENOTEMPTY || errno == EEXIST)
                refilled = true;
            else
                fail(*it, errno);
        }
        if (!refilled) break;
    }
    return files;
}

enum class Parse { Ok, Corrupt, OtherFormat, OtherKey };

/// Checks an entry file's bytes against `fullKey` (empty: accept any key) and extracts its key
/// and payload. `why` says what is wrong for the warning.
Parse parseEntry(const std::vector<unsigned char> &file, std::string_view fullKey,
                 std::string &key, std::vector<unsigned char> &payload, std::string &why) {
    if (file.size() < kHeaderSize || std::memcmp(file.data(), kMagic, sizeof kMagic) != 0) {
        why = file.size() < kHeaderSize ? "shorter than its header" : "bad magic";
        return Parse::Corrupt;
    }
    const uint64_t format = getLe(file.data() + 8, 4);
    if (format != kFormatVersion) {
        why = "format version " + std::to_string(format) + ", expected " +
              std::to_string(kFormatVersion);
        return Parse::OtherFormat;
    }
    const uint64_t keySize = getLe(file.data() + 12, 4);
    const uint64_t payloadSize = getLe(file.data() + 16, 8);
    const uint64_t checksum = getLe(file.data() + 24, 8);
    if (file.size() - kHeaderSize != keySize + payloadSize || keySize + payloadSize < keySize) {
        why = "size " + std::to_string(file.size()) + " does not match its header (truncated?)";
        return Parse::Corrupt;
    }
    const std::span<const unsigned char> body(file.data() + kHeaderSize, keySize + payloadSize);
    if (fnv1a64(body) != checksum) {
        why = "checksum mismatch";
        return Parse::Corrupt;
    }
    key.assign(reinterpret_cast<const char *>(body.data()), keySize);
    if (!fullKey.empty() && key != fullKey) return Parse::OtherKey;
    payload.assign(body.begin() + static_cast<ptrdiff_t>(keySize), body.end());
    return Parse::Ok;
}

std::vector<unsigned char> encodeEntry(std::string_view fullKey,
                                       std::span<const unsigned char> payload) {
    // Starts from the magic (not reserve + insert: GCC 12 warns about that falsely when inlined).
    std::vector<unsigned char> out(kMagic, kMagic + sizeof kMagic);
    out.reserve(kHeaderSize + fullKey.size() + payload.size());
    putU32(out, kFormatVersion);
    putU32(out, static_cast<uint32_t>(fullKey.size()));
    putU64(out, payload.size());
    const uint64_t checksum = fnv1a64(
        payload, fnv1a64(std::span(reinterpret_cast<const unsigned char *>(fullKey.data()),
                                   fullKey.size())));
    putU64(out, checksum);
    out.insert(out.end(), fullKey.begin(), fullKey.end());
    out.insert(out.end(), payload.begin(), payload.end());
    return out;
}

/// Every key is prefixed with this, so entries of another backplane version never match.
std::string versionPrefix() { return std::string("backplane ") + BACKPLANE_VERSION + "\n"; }

} // namespace

detail::CacheEntryView detail::parseCacheEntry(std::span<const unsigned char> file) {
    CacheEntryView view;
    view.ok = parseEntry(std::vector<unsigned char>(file.begin(), file.end()), {}, view.key,
                         view.payload, view.problem) == Parse::Ok;
    return view;
}

const char *toString(CacheKind kind) noexcept { return kKindNames[static_cast<int>(kind)]; }

uint64_t fnv1a64(std::span<const unsigned char> bytes, uint64_t seed) {
    uint64_t h = seed;
    for (const unsigned char b : bytes) {
        h ^= b;
        h *= 0x100000001b3ull;
    }
    return h;
}

uint64_t fnv1a64(std::string_view text, uint64_t seed) {
    return fnv1a64(std::span(reinterpret_cast<const unsigned char *>(text.data()), text.size()),
                   seed);
}

fs::path cacheDirectory(const Config &config) {
    if (!config.cacheEnabled) return {};
    if (!config.cacheDir.empty()) return config.cacheDir;
    if (const auto dir = environment("BACKPLANE_CACHE_DIR")) return fs::path(*dir);
    if (const auto xdg = environment("XDG_CACHE_HOME")) return fs::path(*xdg) / "backplane";
    if (const auto home = environment("HOME")) return fs::path(*home) / ".cache" / "backplane";
    return {};
}

std::string deviceFingerprint(const DeviceInfo &device) {
    std::string text = device.backend + "|" + device.name + "|" + device.arch + "|" +
                       device.driverVersion;
    if (device.hasUuid) text += "|" + device.uuidString();
    // What kernels may use on it (types, vectors, matrix units): a device that lost one (a
    // plugin option, a driver without an extension) ranks candidates anew.
    text += "|" + device.features.describe();
    return text;
}

CacheStore::CacheStore(fs::path directory) : directory_(std::move(directory)) {}

CacheStore &CacheStore::forConfig(const Config &config) {
    // Leaked on purpose: the engine may still touch the cache while static destructors run.
    static std::mutex mutex;
    static auto &stores = *new std::map<fs::path, std::unique_ptr<CacheStore>>();
    const fs::path dir = cacheDirectory(config);
    std::lock_guard lock(mutex);
    auto &slot = stores[dir];
    if (!slot) slot = std::make_unique<CacheStore>(dir);
    return *slot;
}

bool CacheStore::persistent() const noexcept {
    std::lock_guard lock(mutex_);
    return !directory_.empty() && !degraded_;
}

std::string CacheStore::fullKey(std::string_view key) const {
    return versionPrefix() + std::string(key);
}

fs::path CacheStore::entryPath(CacheKind kind, std::string_view key) const {
    if (directory_.empty()) return {};
    const int k = static_cast<int>(kind);
    return directory_ / kKindNames[k] / (hex64(fnv1a64(fullKey(key))) + kKindExtensions[k]);
}

void CacheStore::degrade(const std::string &reason) const {
    // Called with mutex_ held.
    if (degraded_) return;
    degraded_ = true;
    warn("cache directory " + directory_.string() + " is not writable (" + reason +
         "); keeping cache entries in memory for this process. Set cache.dir or "
         "BACKPLANE_CACHE_DIR to a writable directory, or cache.enabled=false.");
}

std::optional<std::vector<unsigned char>> CacheStore::load(CacheKind kind,
                                                           std::string_view key) const {
    const std::string full = fullKey(key);
    {
        std::lock_guard lock(mutex_);
        if (auto it = memory_.find({kind, full}); it != memory_.end()) return it->second;
    }
    if (directory_.empty()) return std::nullopt;
    const fs::path path = entryPath(kind, key);
    auto file = readFile(path);
    if (!file) return std::nullopt;
    std::string storedKey, why;
    std::vector<unsigned char> payload;
    switch (parseEntry(*file, full, storedKey, payload, why)) {
    case Parse::Ok:
        return payload;
    case Parse::OtherKey:
        return std::nullopt;
    case Parse::OtherFormat:
        warn("ignoring cache entry " + path.string() + ": " + why + "; it will be rebuilt");
        return std::nullopt;
    case Parse::Corrupt:
        warn("ignoring corrupt cache entry " + path.string() + " (" + why +
             "); it will be rebuilt");
        return std::nullopt;
    }
    return std::nullopt;
}

bool CacheStore::store(CacheKind kind, std::string_view key, std::string_view payload) {
    return store(kind, key,
                 std::span(reinterpret_cast<const unsigned char *>(payload.data()),
                           payload.size()));
}

bool CacheStore::store(CacheKind kind, std::string_view key,
                       std::span<const unsigned char> payload) {
    const std::string full = fullKey(key);
    {
        std::lock_guard lock(mutex_);
        if (directory_.empty() || degraded_) {
            memory_[{kind, full}].assign(payload.begin(), payload.end());
            return false;
        }
    }
    const fs::path path = entryPath(kind, key);
    std::string reason;
    int error = 0;
    // `cache clear` (another process, or this one) may remove the directory at any moment, even
    // between creating it and renaming into it: a vanished directory is created again and the
    // write retried, and never degrades the store.
    for (int attempt = 0; attempt < kPublishAttempts; ++attempt) {
        std::error_code ec;
        fs::create_directories(path.parent_path(), ec);
        if (ec) {
            error = ec.value();
            reason = "cannot create " + path.parent_path().string() + ": " + ec.message();
        } else {
            reason = publishFile(path, encodeEntry(full, payload), error);
        }
        if (reason.empty()) return true;
        if (error != ENOENT) break;
    }
    if (error == ENOENT) {
        // Cleared again at every attempt: this one entry is skipped, the next store tries anew.
        log::write(log::Subsystem::Cache, log::Level::Debug,
                   "cache entry " + path.string() + " not stored: " + reason);
        return false;
    }
    std::lock_guard lock(mutex_);
    degrade(reason);
    memory_[{kind, full}].assign(payload.begin(), payload.end());
    return false;
}

void CacheStore::remove(CacheKind kind, std::string_view key) {
    const std::string full = fullKey(key);
    {
        std::lock_guard lock(mutex_);
        memory_.erase({kind, full});
    }
    if (directory_.empty()) return;
    const fs::path path = entryPath(kind, key);
    // Only remove the file if it holds this key: another key may own the same hash.
    auto file = readFile(path);
    if (!file) return;
    std::string storedKey, why;
    std::vector<unsigned char> payload;
    if (parseEntry(*file, full, storedKey, payload, why) == Parse::OtherKey) return;
    std::error_code ec;
    fs::remove(path, ec);
}

std::vector<std::pair<std::string, std::vector<unsigned char>>>
CacheStore::entries(CacheKind kind) const {
    std::vector<std::pair<std::string, std::vector<unsigned char>>> out;
    const std::string prefix = versionPrefix();
    {
        std::lock_guard lock(mutex_);
        for (const auto &[id, payload] : memory_)
            if (id.first == kind) out.emplace_back(id.second.substr(prefix.size()), payload);
    }
    if (directory_.empty()) return out;
    const fs::path dir = directory_ / kKindNames[static_cast<int>(kind)];
    std::error_code ec;
    std::vector<fs::path> files;
    for (const auto &item : fs::directory_iterator(dir, ec)) {
        const std::string name = item.path().filename().string();
        if (item.is_regular_file(ec) && name.rfind(kTempPrefix, 0) != 0)
            files.push_back(item.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path &path : files) {
        auto file = readFile(path);
        if (!file) continue;
        std::string storedKey, why;
        std::vector<unsigned char> payload;
        const Parse result = parseEntry(*file, {}, storedKey, payload, why);
        if (result == Parse::Corrupt || result == Parse::OtherFormat) {
            warn("ignoring cache entry " + path.string() + ": " + why);
            continue;
        }
        if (storedKey.rfind(prefix, 0) != 0) continue; // another backplane version
        out.emplace_back(storedKey.substr(prefix.size()), std::move(payload));
    }
    return out;
}

std::vector<CacheUsage> CacheStore::usage() const {
    std::vector<CacheUsage> out;
    for (int k = 0; k < kCacheKindCount; ++k) {
        CacheUsage u;
        u.kind = static_cast<CacheKind>(k);
        if (!directory_.empty()) {
            std::error_code ec;
            for (auto it = fs::recursive_directory_iterator(directory_ / kKindNames[k], ec);
                 !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
                std::error_code sizeError;
                if (!it->is_regular_file(sizeError)) continue;
                const auto size = it->file_size(sizeError);
                if (sizeError) continue;
                ++u.files;
                u.bytes += size;
            }
        }
        out.push_back(u);
    }
    return out;
}

uint64_t CacheStore::clear(CacheKind kind) {
    {
        std::lock_guard lock(mutex_);
        std::erase_if(memory_, [kind](const auto &item) { return item.first.first == kind; });
    }
    if (directory_.empty()) return 0;
    return removeTree(directory_ / kKindNames[static_cast<int>(kind)]);
}

} // namespace backplane
