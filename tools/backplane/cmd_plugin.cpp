// `backplane plugin new NAME [--meson|--cmake] [--dir DIR]`: writes an out-of-tree plugin skeleton.
#include "commands.hpp"

#include "plugin_template/plugin_template.hpp" // generated from plugin_template/skeleton/

#include <backplane/abi/plugin.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

namespace backplane::tool {
namespace {

namespace fs = std::filesystem;

constexpr const char *kUsage =
    "usage: backplane plugin new NAME [--meson|--cmake] [--dir DIR]\n"
    "\n"
    "Writes a buildable out-of-tree plugin skeleton into DIR (default: ./NAME):\n"
    "  NAME.cpp        a complete CPU device written with the plugin SDK\n"
    "  NAME.json       its manifest (\"conformance\": {\"expected_failures\": []} included)\n"
    "  plugin.map      the export list: bp_get_plugin_api only\n"
    "  meson.build     with --meson (the default), or CMakeLists.txt with --cmake\n"
    "  README.md       how to build it, point backplane at it and run `backplane conformance`\n"
    "\n"
    "NAME is the plugin's name: a lowercase letter, then at most 63 lowercase letters, digits or\n"
    "'_'. Existing files are never overwritten.\n";

/// A usage error: the message, then the usage text; exit status 2.
int usageError(const std::string &message) {
    std::fprintf(stderr, "backplane plugin: %s\n\n%s", message.c_str(), kUsage);
    return 2;
}

/// Any other failure (nothing to do with how the command was typed); exit status 2.
int failure(const std::string &message) {
    std::fprintf(stderr, "backplane plugin new: %s\n", message.c_str());
    return 2;
}

/// [a-z][a-z0-9_]{0,63}: the manifest's name, part of a library file name and of C++
/// identifiers (the namespace NAME_plugin), so nothing else is allowed.
bool isPluginName(std::string_view name) {
    if (name.empty() || name.size() > 64 || name[0] < 'a' || name[0] > 'z') return false;
    for (const char c : name)
        if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return false;
    return true;
}

std::string_view templateText(std::string_view fileName) {
    for (const plugin_template::File &file : plugin_template::kFiles)
        if (file.name == fileName) return file.text;
    return {}; // not reached: every name used below is embedded (plugin_template/meson.build)
}

/// Replaces every "@KEY@" of `values`; a placeholder left over is a defect of the template.
std::string substitute(std::string_view text,
                       const std::vector<std::pair<std::string, std::string>> &values) {
    std::string out(text);
    for (const auto &[key, value] : values) {
        const std::string placeholder = "@" + key + "@";
        for (size_t at = out.find(placeholder); at != std::string::npos;
             at = out.find(placeholder, at + value.size()))
            out.replace(at, placeholder.size(), value);
    }
    return out;
}

/// The first "@UPPER_CASE@" left in `text`, or "".
std::string leftoverPlaceholder(const std::string &text) {
    for (size_t at = text.find('@'); at != std::string::npos; at = text.find('@', at + 1)) {
        size_t end = at + 1;
        while (end < text.size() && ((text[end] >= 'A' && text[end] <= 'Z') || text[end] == '_'))
            ++end;
        if (end > at + 1 && end < text.size() && text[end] == '@')
            return text.substr(at, end - at + 1);
    }
    return "";
}

struct Output {
    std::string name; ///< file name inside the target directory
    std::string text;
};

/// Creates `path` and writes `text`; "x" refuses a file that appeared since the check.
std::string writeNewFile(const fs::path &path, const std::string &text) {
    std::FILE *file = std::fopen(path.c_str(), "wx");
    if (file == nullptr) return path.string() + ": " + std::strerror(errno);
    const bool written = std::fwrite(text.data(), 1, text.size(), file) == text.size();
    const bool closed = std::fclose(file) == 0;
    if (!written || !closed) return path.string() + ": write failed: " + std::strerror(errno);
    return "";
}

int runNew(const Args &args) {
    std::string name, dir;
    bool meson = false, cmake = false, dirGiven = false;
    for (size_t i = 0; i < args.size(); ++i) {
        const std::string &a = args[i];
        if (a == "--meson") {
            meson = true;
        } else if (a == "--cmake") {
            cmake = true;
        } else if (a == "--dir") {
            if (i + 1 >= args.size()) return usageError("--dir needs a directory");
            if (dirGiven) return usageError("--dir given twice");
            dir = args[++i];
            dirGiven = true;
        } else if (a == "--help" || a == "-h") {
            std::fputs(kUsage, stdout);
            return 0;
        } else if (!a.empty() && a[0] == '-') {
            return usageError("unknown option '" + a + "'");
        } else if (!name.empty()) {
            return usageError("one NAME only, got '" + name + "' and '" + a + "'");
        } else {
            name = a;
        }
    }
    if (name.empty()) return usageError("NAME is missing");
    if (!isPluginName(name))
        return usageError("'" + name +
                          "' is not a plugin name: use a lowercase letter, then at most 63 "
                          "lowercase letters, digits or '_'");
    if (meson && cmake) return usageError("--meson and --cmake exclude each other");
    if (dirGiven && dir.empty()) return usageError("--dir needs a directory");
    const fs::path target = dirGiven ? fs::path(dir) : fs::path(name);

    const std::string abiVersion =
        std::to_string(BP_ABI_VERSION_MAJOR) + "." + std::to_string(BP_ABI_VERSION_MINOR);
    const std::string buildFile = cmake ? "CMakeLists.txt" : "meson.build";
    const std::vector<std::pair<std::string, std::string>> values = {
        // BUILD_STEPS first: the snippet it inserts contains the other placeholders.
        {"BUILD_STEPS",
         std::string(templateText(cmake ? "build-cmake.md.in" : "build-meson.md.in"))},
        {"BUILD_FILE", buildFile},
        {"ABI_VERSION", abiVersion},
        {"NAME", name},
    };
    const std::vector<Output> outputs = {
        {name + ".cpp", substitute(templateText("plugin.cpp.in"), values)},
        {name + ".json", substitute(templateText("manifest.json.in"), values)},
        {"plugin.map", substitute(templateText("plugin.map"), values)},
        {buildFile,
         substitute(templateText(cmake ? "CMakeLists.txt.in" : "meson.build.in"), values)},
        {"README.md", substitute(templateText("README.md.in"), values)},
    };
    for (const Output &o : outputs) {
        if (o.text.empty()) return failure("internal error: no embedded template for " + o.name);
        if (const std::string left = leftoverPlaceholder(o.text); !left.empty())
            return failure("internal error: " + o.name + " still contains " + left);
    }

    // Check everything before writing anything, so a refusal leaves no half-written skeleton.
    std::error_code ec;
    if (fs::exists(target, ec) && !fs::is_directory(target, ec))
        return failure(target.string() + " exists and is not a directory");
    std::vector<std::string> existing;
    for (const Output &o : outputs)
        if (fs::exists(target / o.name, ec) || fs::is_symlink(target / o.name, ec))
            existing.push_back((target / o.name).string());
    if (!existing.empty()) {
        std::string list;
        for (const std::string &e : existing)
            list += "\n  " + e;
        return failure("refusing to overwrite existing files:" + list +
                       "\nremove them or choose another directory with --dir");
    }
    fs::create_directories(target, ec);
    if (ec) return failure("cannot create " + target.string() + ": " + ec.message());
    for (const Output &o : outputs)
        if (const std::string error = writeNewFile(target / o.name, o.text); !error.empty())
            return failure(error);

    const std::string shown = target.string();
    std::printf("wrote the %s plugin skeleton \"%s\" (ABI %s) into %s/:\n",
                cmake ? "CMake" : "Meson", name.c_str(), abiVersion.c_str(), shown.c_str());
    for (const Output &o : outputs)
        std::printf("  %s\n", o.name.c_str());
    std::printf("\nnext:\n  cd %s\n", shown.c_str());
    if (cmake)
        std::printf("  cmake -S . -B build && cmake --build build\n");
    else
        std::printf("  meson setup build && meson compile -C build\n");
    std::printf("  backplane conformance --plugin build/%s.json\n"
                "  BACKPLANE_PLUGIN_PATH=$PWD/build/%s.json backplane devices\n"
                "(README.md says more)\n",
                name.c_str(), name.c_str());
    return 0;
}

} // namespace

int runPlugin(const Args &args) {
    if (wantsHelp(args) || (!args.empty() && args[0] == "help")) return printUsage(kUsage, true);
    if (args.empty()) return usageError("say what to do: new");
    if (args[0] == "new") return runNew(Args(args.begin() + 1, args.end()));
    return usageError("unknown subcommand '" + args[0] + "' (known: new)");
}

} // namespace backplane::tool
