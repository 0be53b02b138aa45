// `backplane tune list|clear|export FILE|import FILE`: inspect and ship autotune results.
#include "commands.hpp"

#include <backplane/cache.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/tune.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>

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

int list(const CacheStore &store, bool json) {
    const auto all = records(store);
    if (json) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto &r : all) j.push_back(nlohmann::json::parse(tune::Tuner::toJson(r)));
        std::printf("%s\n", j.dump(2).c_str());
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
        bundle["entries"].push_back(nlohmann::json::parse(tune::Tuner::toJson(r)));
    std::ofstream out(file, std::ios::trunc);
    out << bundle.dump(2) << "\n";
    if (!out)
        throw Error(ErrorCode::InvalidArgument, "cannot write " + file + "; check the path");
    std::printf("exported %zu tuning results to %s\n", all.size(), file.c_str());
    return 0;
}

int importBundle(CacheStore &store, const std::string &file, bool force) {
    std::ifstream in(file);
    if (!in) throw Error(ErrorCode::NotFound, "cannot read " + file);
    std::stringstream text;
    text << in.rdbuf();
    nlohmann::json bundle;
    try {
        bundle = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception &e) {
        throw Error(ErrorCode::Config, file + ": not JSON (" + e.what() + ")");
    }
    if (!bundle.is_object() || bundle.value("format", "") != kBundleFormat ||
        !bundle.contains("entries") || !bundle["entries"].is_array())
        throw Error(ErrorCode::Config, file + ": /format: not a " + std::string(kBundleFormat) +
                                           " (made by `backplane tune export`)");
    if (bundle.value("format_version", 0) != kBundleVersion)
        throw Error(ErrorCode::Config, file + ": /format_version: " +
                                           bundle.value("format_version", nlohmann::json()).dump() +
                                           ", this backplane reads " +
                                           std::to_string(kBundleVersion));
    const std::string version = bundle.value("backplane", "");
    if (version != BACKPLANE_VERSION && !force)
        throw Error(ErrorCode::Config,
                    file + ": /backplane: made by backplane " + version + ", this is " +
                        BACKPLANE_VERSION + "; its kernels may differ. Re-tune, or pass --force");
    size_t count = 0;
    for (size_t i = 0; i < bundle["entries"].size(); ++i) {
        const auto record = tune::Tuner::fromJson(bundle["entries"][i].dump(),
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
