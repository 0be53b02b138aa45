// `backplane cache [info|clear [KIND]] [--dir DIR] [--json]`: the cache directory, its sizes, clearing.
#include "commands.hpp"

#include <backplane/cache.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <optional>

namespace backplane::tool {
namespace {

std::string humanBytes(uint64_t bytes) {
    char text[32];
    if (bytes >= (1ull << 30))
        std::snprintf(text, sizeof text, "%.1f GiB", static_cast<double>(bytes) / (1ull << 30));
    else if (bytes >= (1ull << 20))
        std::snprintf(text, sizeof text, "%.1f MiB", static_cast<double>(bytes) / (1ull << 20));
    else if (bytes >= 1024)
        std::snprintf(text, sizeof text, "%.1f KiB", static_cast<double>(bytes) / 1024);
    else
        std::snprintf(text, sizeof text, "%llu B", static_cast<unsigned long long>(bytes));
    return text;
}

std::optional<CacheKind> parseKind(const std::string &text) {
    for (int k = 0; k < kCacheKindCount; ++k)
        if (text == toString(static_cast<CacheKind>(k))) return static_cast<CacheKind>(k);
    return std::nullopt;
}

int usage(bool asked = false) {
    std::fprintf(asked ? stdout : stderr, "usage: backplane cache [info] [--dir DIR] [--json]\n"
                         "       backplane cache clear [kernels|tune|pipelines|probes] [--dir DIR]\n");
    return asked ? 0 : 2;
}

} // namespace

int runCache(const Args &args) {
    if (wantsHelp(args)) return usage(true);
    std::string action = "info";
    std::optional<std::string> dirOverride;
    std::optional<CacheKind> kind;
    bool json = false;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--json") {
            json = true;
        } else if (a == "--dir" && i + 1 < args.size()) {
            dirOverride = args[++i];
        } else if (a == "info" || a == "clear") {
            action = a;
        } else if (action == "clear" && parseKind(a)) {
            kind = parseKind(a);
        } else {
            std::fprintf(stderr, "backplane cache: unknown argument '%s'\n", a.c_str());
            return usage();
        }
    }
    try {
        Config config = loadConfig();
        if (dirOverride) config.cacheDir = *dirOverride;
        const auto dir = cacheDirectory(config);
        if (dir.empty()) {
            std::printf("cache: disabled (cache.enabled=false or no HOME): everything stays in "
                        "memory\n");
            return 0;
        }
        CacheStore store(dir);
        if (action == "clear") {
            uint64_t removed = 0;
            for (int k = 0; k < kCacheKindCount; ++k)
                if (!kind || *kind == static_cast<CacheKind>(k))
                    removed += store.clear(static_cast<CacheKind>(k));
            std::printf("cleared %llu files from %s\n", static_cast<unsigned long long>(removed),
                        dir.c_str());
            return 0;
        }
        const auto sizes = store.usage();
        if (json) {
            nlohmann::json j = {{"dir", dir.string()}, {"kinds", nlohmann::json::object()}};
            for (const auto &u : sizes)
                j["kinds"][toString(u.kind)] = {{"files", u.files}, {"bytes", u.bytes}};
            std::printf("%s\n", j.dump(2).c_str());
            return 0;
        }
        std::printf("cache directory: %s\n", dir.c_str());
        uint64_t files = 0, bytes = 0;
        for (const auto &u : sizes) {
            std::printf("  %-10s %6llu files  %10s\n", toString(u.kind),
                        static_cast<unsigned long long>(u.files), humanBytes(u.bytes).c_str());
            files += u.files;
            bytes += u.bytes;
        }
        std::printf("  %-10s %6llu files  %10s\n", "total", static_cast<unsigned long long>(files),
                    humanBytes(bytes).c_str());
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane cache: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
