// Probe records: JSON in the cache store, keyed by the library file's identity and its options.
#include "probe_cache.hpp"

#include "input/json_input.hpp"

#include <backplane/log.hpp>

#include <sys/stat.h>

#include <chrono>

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

std::optional<std::string> probeCacheKey(const fs::path &library,
                                         const PluginInitOptions &options) {
    std::error_code ec;
    const fs::path canonical = fs::canonical(library, ec);
    struct stat st {};
    if (ec || ::stat(canonical.c_str(), &st) != 0) return std::nullopt;
    const uint64_t optionsHash = fnv1a64(options.optionsJson, fnv1a64(options.cacheDir));
    return "probe v1\n" + canonical.string() + "\nsize " + std::to_string(st.st_size) +
           "\nmtime " + std::to_string(st.st_mtim.tv_sec) + "." +
           std::to_string(st.st_mtim.tv_nsec) + "\ninode " + std::to_string(st.st_ino) +
           "\ndevice " + std::to_string(st.st_dev) + "\noptions " + std::to_string(optionsHash);
}

std::optional<ProbeRecord> loadProbeRecord(const CacheStore &store, const std::string &key) {
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
            r.outcome = outcomeFromJson(j["outcome"]);
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
    if (record.kind == ProbeRecord::Kind::Answered) j["outcome"] = outcomeJson(record.outcome);
    else j["reason"] = record.reason;
    store.store(CacheKind::Probes, key, dumpJson(j));
}

} // namespace backplane::detail
