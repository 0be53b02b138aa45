// `backplane tune list|clear|export FILE|import FILE`: inspect and ship autotune results.
#include "commands.hpp"

#include <backplane/cache.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/tune.hpp>

#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace backplane::tool {
namespace {

constexpr const char *kBundleFormat = "backplane-tune-bundle";
constexpr int kBundleVersion = 1;
// The limits docs/config.md states for bundles. nlohmann's parser is iterative, but building and
// printing values recurse: nothing deeper than a record is built.
constexpr uintmax_t kMaxBundleBytes = 16u << 20;
constexpr size_t kMaxDepth = 32;

int usage(bool asked = false) {
    std::fprintf(asked ? stdout : stderr,
                 "usage: backplane tune list [--json] [--dir DIR]\n"
                 "       backplane tune clear [--dir DIR]\n"
                 "       backplane tune export FILE [--dir DIR]\n"
                 "       backplane tune import FILE [--force] [--dir DIR]\n"
                 "export writes every tuning result of this backplane version as one JSON "
                 "bundle;\nimport stores a bundle's results so a deployment skips cold-start "
                 "tuning (--force: accept a bundle of another backplane version).\n");
    return asked ? 0 : 2;
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

/// Serialises without ever throwing: invalid UTF-8 (from a hand-edited bundle) becomes U+FFFD.
std::string dump(const nlohmann::json &value, int indent = -1) {
    return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// Parses JSON text nobody vouches for: at most kMaxDepth levels deep, no duplicate keys. Any
/// failure is Error(`code`) "<origin>: <what>", with "(line L, column C)" for syntax errors.
nlohmann::json parseBounded(const std::string &text, const std::string &origin, ErrorCode code) {
    // nlohmann takes a NUL byte for the end of the input; JSON text never contains one.
    if (const size_t nul = text.find('\0'); nul != std::string::npos)
        throw Error(code, origin + ": a NUL byte at offset " + std::to_string(nul) +
                              ": this is not a JSON text file");
    // Per open container, the keys seen so far (none for arrays): its size is the depth.
    std::vector<std::set<std::string>> open;
    const auto bounded = [&](int, nlohmann::json::parse_event_t event, nlohmann::json &parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start || event == Event::array_start) {
            if (open.size() >= kMaxDepth)
                throw Error(code, origin + ": nesting deeper than " + std::to_string(kMaxDepth) +
                                      " levels (the limit for this file)");
            open.emplace_back();
        } else if (event == Event::object_end || event == Event::array_end) {
            open.pop_back();
        } else if (event == Event::key && !open.back().insert(parsed.get<std::string>()).second) {
            // nlohmann keeps the last one: a file with two "entries" means something else than
            // it says.
            throw Error(code, origin + ": duplicate key '" +
                                  parsed.get<std::string>().substr(0, 64) + "'");
        }
        return true;
    };
    try {
        return nlohmann::json::parse(text, bounded);
    } catch (const nlohmann::json::exception &e) {
        // "[json.exception.parse_error.101] parse error at line 2, column 14: syntax error ..."
        std::string what = e.what();
        if (const size_t id = what.find("] "); what.rfind('[', 0) == 0 && id != what.npos)
            what.erase(0, id + 2);
        constexpr std::string_view kAt = "parse error at ";
        if (const size_t colon = what.find(": "); what.rfind(kAt, 0) == 0 && colon != what.npos)
            what = "not valid JSON: " + what.substr(colon + 2) + " (" +
                   what.substr(kAt.size(), colon - kAt.size()) + ")";
        if (what.size() > 512) what = what.substr(0, 512) + "…";
        throw Error(code, origin + ": " + what);
    }
}

/// A bundle file's JSON: a regular file of at most kMaxBundleBytes, parsed as above.
nlohmann::json readBundle(const std::string &file) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::file_status status = fs::status(file, ec);
    if (ec || !fs::exists(status))
        throw Error(ErrorCode::Config, file + ": cannot open it (" +
                                           (ec ? ec.message() : std::string("no such file")) + ")");
    if (!fs::is_regular_file(status))
        throw Error(ErrorCode::Config,
                    file + ": not a regular file (" +
                        (fs::is_directory(status) ? "a directory" : "a device, pipe or socket") +
                        "); expected a JSON file");
    if (const uintmax_t size = fs::file_size(file, ec); !ec && size > kMaxBundleBytes)
        throw Error(ErrorCode::Config, file + ": " + std::to_string(size) +
                                           " bytes, more than the " +
                                           std::to_string(kMaxBundleBytes) +
                                           " bytes accepted here; is this the right file?");
    std::ifstream in(file, std::ios::binary);
    if (!in) throw Error(ErrorCode::Config, file + ": cannot open it (permission denied?)");
    std::string text(kMaxBundleBytes, '\0'); // a file that grew since is cut, so malformed
    in.read(text.data(), static_cast<std::streamsize>(text.size()));
    text.resize(static_cast<size_t>(in.gcount()));
    return parseBounded(text, file, ErrorCode::Config);
}

/// A record as a JSON value (its own serialisation, read back).
nlohmann::json recordJson(const tune::TuneRecord &record) {
    return parseBounded(tune::Tuner::toJson(record), "tuning record " + record.set,
                        ErrorCode::Internal);
}

int list(const CacheStore &store, bool json) {
    const auto all = records(store);
    if (json) {
        nlohmann::json j = nlohmann::json::array();
        for (const auto &r : all)
            j.push_back(recordJson(r));
        std::printf("%s\n", dump(j, 2).c_str());
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
    out << dump(bundle, 2) << "\n";
    if (!out)
        throw Error(ErrorCode::InvalidArgument, "cannot write " + file + "; check the path");
    std::printf("exported %zu tuning results to %s\n", all.size(), file.c_str());
    return 0;
}

/// `value` as JSON text for a message; never throws.
std::string shown(const nlohmann::json *value) {
    return value == nullptr ? std::string("missing") : dump(*value);
}

int importBundle(CacheStore &store, const std::string &file, bool force) {
    // Bounded (size, depth) and total: any malformed input is one Error naming the file and where.
    const nlohmann::json bundle = readBundle(file);
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
        const auto record = tune::Tuner::fromJson(dump((*entries)[i]),
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
    if (wantsHelp(args)) return usage(true);
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
