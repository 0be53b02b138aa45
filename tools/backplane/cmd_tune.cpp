// `backplane tune list|clear|export FILE|import FILE`: inspect and ship autotune results.
#include "commands.hpp"

#include "input/json_input.hpp"

#include <backplane/cache.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/tune.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <optional>

namespace backplane::tool {
namespace {

constexpr const char *kBundleFormat = "backplane-tune-bundle";
constexpr int kBundleVersion = 1;

int usage() {
    std::fprintf(stderr,
                 "usage: backplane tune list [--json] [--dir DIR]\n"
                 "       backplane tune clear [--dir DIR]\n"
                 "       backplane tune export FILE [--dir DIR]\n"
                 "       backplane tune import FILE [--force] [--dir DIR]\n"
                 "export writes every tuning result of this backplane version as one JSON "
                 "bundle;\nimport stores a bundle's results so a deployment skips cold-start "
                 "tuning (--force: accept a bundle of another backplane version).\n");
    return 2;
}

std::vector<tune::TuneRecord> records(const CacheStore &store) {
    std::vector<tune::TuneRecord> out;
    for (const auto &[key, payload] : store.entries(CacheKind::Tune)) {
        try {
            out.push_back(tune::Tuner::fromJson(
                std::string_view(reinterpret_cast<const char *>(payload.data()), payload.size()),
                store.entryPath(CacheKind::Tune, key).string()));
        } catch (const Error &e) {
            std::fprintf(stderr, "warning: %s; skipped\n", e.what());
        }
    }
    return out;
}

/// A record as a JSON value (its own serialisation, read back through the bounded reader).
nlohmann::json recordJson(const tune::TuneRecord &record) {
    return detail::parseJson(tune::Tuner::toJson(record), "tuning record " + record.set,
                             detail::kRecordJsonLimits, ErrorCode::Internal);
}

int list(const CacheStore &store, bool json) {
    const auto all = records(store);
    if (json) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto &r : all)
            j.push_back(recordJson(r));
        std::printf("%s\n", detail::dumpJson(j, 2).c_str());
        return 0;
    }
    std::printf("%zu tuning results in %s\n", all.size(),
                (store.directory() / toString(CacheKind::Tune)).c_str());
    for (const auto &r : all)
        std::printf("  %-24s %-28s -> %-20s (%s, %s)\n", r.set.c_str(), r.key.c_str(),
                    r.winner.c_str(), r.level.c_str(), r.device.c_str());
    return 0;
}

int exportBundle(const CacheStore &store, const std::string &file) {
    nlohmann::json bundle = {{"format", kBundleFormat},
                             {"format_version", kBundleVersion},
                             {"backplane", BACKPLANE_VERSION},
                             {"entries", nlohmann::json::array()}};
    const auto all = records(store);
    for (const auto &r : all)
        bundle["entries"].push_back(recordJson(r));
    std::ofstream out(file, std::ios::trunc);
    out << detail::dumpJson(bundle, 2) << "\n";
    if (!out)
        throw Error(ErrorCode::InvalidArgument, "cannot write " + file + "; check the path");
    std::printf("exported %zu tuning results to %s\n", all.size(), file.c_str());
    return 0;
}

/// `value` as JSON text for a message; never throws.
std::string shown(const nlohmann::json *value) {
    return value == nullptr ? std::string("missing") : detail::dumpJson(*value);
}

int importBundle(CacheStore &store, const std::string &file, bool force) {
    // Bounded (size, depth) and total: any malformed input is one Error naming file and pointer.
    const nlohmann::json bundle =
        detail::readJsonFile(file, detail::kRecordJsonLimits, ErrorCode::Config);
    const auto member = [&](const char *name) -> const nlohmann::json * {
        if (!bundle.is_object()) return nullptr;
        const auto it = bundle.find(name);
        return it == bundle.end() ? nullptr : &*it;
    };
    const nlohmann::json *format = member("format");
    const nlohmann::json *entries = member("entries");
    if (format == nullptr || !format->is_string() || *format != kBundleFormat ||
        entries == nullptr || !entries->is_array())
        throw Error(ErrorCode::Config, file + ": /format: not a " + std::string(kBundleFormat) +
                                           " (made by `backplane tune export`)");
    const nlohmann::json *formatVersion = member("format_version");
    if (formatVersion == nullptr || !formatVersion->is_number_integer() ||
        *formatVersion != kBundleVersion)
        throw Error(ErrorCode::Config, file + ": /format_version: " + shown(formatVersion) +
                                           ", this backplane reads " +
                                           std::to_string(kBundleVersion));
    const nlohmann::json *made = member("backplane");
    const std::string version =
        made != nullptr && made->is_string() ? made->get<std::string>() : shown(made);
    if (version != BACKPLANE_VERSION && !force)
        throw Error(ErrorCode::Config,
                    file + ": /backplane: made by backplane " + version + ", this is " +
                        BACKPLANE_VERSION + "; its kernels may differ. Re-tune, or pass --force");
    size_t count = 0;
    for (size_t i = 0; i < entries->size(); ++i) {
        const auto record = tune::Tuner::fromJson(detail::dumpJson((*entries)[i]),
                                                  file + ": /entries/" + std::to_string(i));
        store.store(CacheKind::Tune,
                    tune::Tuner::storeKey(record.set, record.key, record.device, record.checksum),
                    tune::Tuner::toJson(record));
        ++count;
    }
    std::printf("imported %zu tuning results into %s\n", count, store.directory().c_str());
    return 0;
}

} // namespace

int runTune(const Args &args) {
    std::vector<std::string> positional;
    std::optional<std::string> dirOverride;
    bool json = false, force = false;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--json")
            json = true;
        else if (args[i] == "--force")
            force = true;
        else if (args[i] == "--dir" && i + 1 < args.size())
            dirOverride = args[++i];
        else if (args[i].rfind("--", 0) == 0)
            return usage();
        else
            positional.push_back(args[i]);
    }
    if (positional.empty()) return usage();
    const std::string &action = positional[0];
    try {
        Config config = loadConfig();
        if (dirOverride) config.cacheDir = *dirOverride;
        const auto dir = cacheDirectory(config);
        if (dir.empty()) {
            std::fprintf(stderr, "backplane tune: the cache is disabled (cache.enabled=false or "
                                 "no HOME); tuning results are not kept\n");
            return 1;
        }
        CacheStore store(dir);
        if (action == "list" && positional.size() == 1) return list(store, json);
        if (action == "clear" && positional.size() == 1) {
            std::printf("cleared %llu tuning results\n",
                        static_cast<unsigned long long>(store.clear(CacheKind::Tune)));
            return 0;
        }
        if (action == "export" && positional.size() == 2) return exportBundle(store, positional[1]);
        if (action == "import" && positional.size() == 2)
            return importBundle(store, positional[1], force);
        return usage();
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane tune: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
