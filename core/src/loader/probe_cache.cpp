// Probe records: JSON in the cache store, keyed by the library file's identity and its options.
#include "probe_cache.hpp"

#include "input/json_input.hpp"

#include <backplane/log.hpp>

#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <string_view>
#include <vector>

extern char **environ;

namespace backplane::detail {
namespace {

using Json = nlohmann::json;
namespace fs = std::filesystem;

int64_t nowUnix() {
    return std::chrono::duration_cast<std::chrono::seconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

const char *kindName(ProbeRecord::Kind kind) {
    switch (kind) {
    case ProbeRecord::Kind::Answered: return "answered";
    case ProbeRecord::Kind::Crashed: return "crashed";
    case ProbeRecord::Kind::TimedOut: return "timeout";
    }
    return "answered";
}

} // namespace

std::string fileIdentity(const struct stat &st) {
    return "size " + std::to_string(st.st_size) + " mtime " + std::to_string(st.st_mtim.tv_sec) +
           "." + std::to_string(st.st_mtim.tv_nsec) + " ctime " +
           std::to_string(st.st_ctim.tv_sec) + "." + std::to_string(st.st_ctim.tv_nsec) +
           " inode " + std::to_string(st.st_ino) + " device " + std::to_string(st.st_dev);
}

std::string driverEnvironment() {
    // What steers drivers without showing in any file: device visibility, ICD lists, library
    // search paths. A change in any of these may change a probe's answer.
    static constexpr const char *kPrefixes[] = {"CUDA_", "HIP_", "ROCR_", "HSA_", "GPU_DEVICE_",
                                                "VK_", "MESA_", "LP_", "GALLIUM_", "NVIDIA_",
                                                "__NV", "ZE_", "LD_LIBRARY_PATH=", "LD_PRELOAD=",
                                                // the plugins' own pointers at a vendor library
                                                "BACKPLANE_GLOO_MODULE=", "BACKPLANE_NCCL_LIBRARY=",
                                                // the host plugin's C++ compiler (found on PATH)
                                                "BACKPLANE_HOST_CXX=", "PATH="};
    std::vector<std::string> relevant;
    for (char **e = environ; e != nullptr && *e != nullptr; ++e) {
        const std::string_view entry = *e;
        for (const char *prefix : kPrefixes)
            if (entry.rfind(prefix, 0) == 0) {
                relevant.emplace_back(entry);
                break;
            }
    }
    std::sort(relevant.begin(), relevant.end());
    std::string out;
    for (const auto &entry : relevant) out += entry + '\n';
    return out;
}

std::optional<std::string> probeCacheKey(const fs::path &library,
                                         const PluginInitOptions &options) {
    std::error_code ec;
    const fs::path canonical = fs::canonical(library, ec);
    struct stat st {};
    if (ec || ::stat(canonical.c_str(), &st) != 0) return std::nullopt;
    const uint64_t optionsHash = fnv1a64(options.optionsJson, fnv1a64(options.cacheDir));
    // v5: answers carry the options schema and the devices' kernel_compiler (ABI 1.5).
    return "probe v5\n" + canonical.string() + "\n" + fileIdentity(st) + "\noptions " +
           std::to_string(optionsHash) + "\nenvironment " +
           std::to_string(fnv1a64(driverEnvironment()));
}

std::optional<ProbeRecord> loadProbeRecord(const CacheStore &store, const std::string &key,
                                           const std::string &plugin) {
    const auto payload = store.load(CacheKind::Probes, key);
    if (!payload) return std::nullopt;
    const std::string origin = store.entryPath(CacheKind::Probes, key).string();
    try {
        const Json j = parseJson(
            std::string_view(reinterpret_cast<const char *>(payload->data()), payload->size()),
            origin, kRecordJsonLimits, ErrorCode::Internal);
        if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string() ||
            !j.contains("recorded_unix") || !j["recorded_unix"].is_number_integer())
            throw Error(ErrorCode::Internal, origin + ": not a probe record");
        ProbeRecord r;
        const std::string kind = j["kind"].get<std::string>();
        r.recordedUnix = j["recorded_unix"].get<int64_t>();
        if (kind == "answered") {
            r.kind = ProbeRecord::Kind::Answered;
            if (!j.contains("outcome")) throw Error(ErrorCode::Internal, origin + ": no /outcome");
            r.outcome = outcomeFromJson(j["outcome"], plugin);
            if (!j.contains("libraries") || !j["libraries"].is_array())
                throw Error(ErrorCode::Internal, origin + ": /libraries: expected an array");
            for (const auto &entry : j["libraries"]) {
                if (!entry.is_array() || entry.size() != 2 || !entry[0].is_string() ||
                    !entry[1].is_string())
                    throw Error(ErrorCode::Internal, origin + ": /libraries: malformed entry");
                const std::string path = entry[0].get<std::string>();
                struct stat st {};
                if (::stat(path.c_str(), &st) != 0 || fileIdentity(st) != entry[1].get<std::string>()) {
                    log::write(log::Subsystem::Loader, log::Level::Info,
                               path + " changed since the plugin was last probed (a driver "
                                      "update?); probing it again");
                    return std::nullopt;
                }
                r.libraries.emplace_back(path, entry[1].get<std::string>());
            }
        } else if (kind == "crashed" || kind == "timeout") {
            r.kind = kind == "crashed" ? ProbeRecord::Kind::Crashed : ProbeRecord::Kind::TimedOut;
            if (!j.contains("reason") || !j["reason"].is_string())
                throw Error(ErrorCode::Internal, origin + ": /reason: expected a string");
            r.reason = j["reason"].get<std::string>();
        } else {
            throw Error(ErrorCode::Internal, origin + ": /kind: unknown '" + kind + "'");
        }
        if (r.kind == ProbeRecord::Kind::TimedOut &&
            nowUnix() - r.recordedUnix > kTimeoutRecordSeconds)
            return std::nullopt;
        return r;
    } catch (const Error &e) {
        log::write(log::Subsystem::Cache, log::Level::Warn,
                   std::string("ignoring a malformed probe record: ") + e.what() +
                       " (the plugin is probed again)");
        return std::nullopt;
    }
}

void storeProbeRecord(CacheStore &store, const std::string &key, ProbeRecord record) {
    Json j = {{"kind", kindName(record.kind)}, {"recorded_unix", nowUnix()}};
    if (record.kind == ProbeRecord::Kind::Answered) {
        j["outcome"] = outcomeJson(record.outcome);
        Json libraries = Json::array();
        for (const auto &[path, identity] : record.libraries) libraries.push_back({path, identity});
        j["libraries"] = libraries;
    } else {
        j["reason"] = record.reason;
    }
    store.store(CacheKind::Probes, key, dumpJson(j));
}

} // namespace backplane::detail
