// Reading plugin manifests: bounded JSON, every failure one Error naming the file and pointer.
#include "plugin_manifest.hpp"

#include "input/json_input.hpp"

#include <cstdio>

namespace backplane::detail {
namespace {

using Json = nlohmann::json;

[[noreturn]] void fail(const std::filesystem::path &file, const std::string &pointer,
                       const std::string &what) {
    throw ManifestError(file.string() + ": " + pointer + ": " + what);
}

std::string requiredString(const Json &root, const std::filesystem::path &file, const char *key,
                           bool allowEmpty) {
    const std::string pointer = std::string("/") + key;
    if (!root.contains(key)) fail(file, pointer, "missing (a manifest needs name, library, "
                                                 "abi_version, backend, description)");
    const Json &value = root[key];
    if (!value.is_string())
        fail(file, pointer, std::string("expected a string, got ") + value.type_name());
    std::string text = value.get<std::string>();
    if (!allowEmpty && text.empty()) fail(file, pointer, "must not be empty");
    if (text.size() > 4096) fail(file, pointer, "longer than 4096 bytes");
    for (const char c : text)
        if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
            fail(file, pointer, "contains a control character");
    return text;
}

/// "conformance": {"expected_failures": ["case name", ...]}; absent means none.
std::vector<std::string> expectedFailures(const Json &root, const std::filesystem::path &file) {
    std::vector<std::string> names;
    const auto conformance = root.find("conformance");
    if (conformance == root.end()) return names;
    if (!conformance->is_object())
        fail(file, "/conformance",
             std::string("expected an object such as {\"expected_failures\": []}, got ") +
                 conformance->type_name());
    const auto list = conformance->find("expected_failures");
    if (list == conformance->end()) return names;
    if (!list->is_array())
        fail(file, "/conformance/expected_failures",
             std::string("expected an array of case names, got ") + list->type_name());
    constexpr size_t kMaxNames = 1000, kMaxName = 200;
    if (list->size() > kMaxNames)
        fail(file, "/conformance/expected_failures",
             "more than " + std::to_string(kMaxNames) + " entries");
    for (size_t i = 0; i < list->size(); ++i) {
        const std::string pointer = "/conformance/expected_failures/" + std::to_string(i);
        const Json &entry = (*list)[i];
        if (!entry.is_string())
            fail(file, pointer, std::string("expected a case name (string), got ") +
                                    entry.type_name());
        const std::string name = entry.get<std::string>();
        if (name.empty() || name.size() > kMaxName)
            fail(file, pointer, "a case name has 1 to " + std::to_string(kMaxName) + " bytes");
        for (const char c : name)
            if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f)
                fail(file, pointer, "contains a control character");
        names.push_back(name);
    }
    return names;
}

PluginManifest fromJson(const Json &root, const std::filesystem::path &file) {
    if (!root.is_object())
        fail(file, "/", std::string("expected an object, got ") + root.type_name());

    PluginManifest m;
    m.file = file;
    m.name = requiredString(root, file, "name", false);
    // The name becomes a directory name (the plugin's cache) and a selector: keep it plain.
    const bool plain = m.name.size() <= 64 && m.name.front() != '.' && m.name.front() != '-' &&
                       m.name.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                                "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") ==
                           std::string::npos;
    if (!plain)
        fail(file, "/name", "\"" + m.name.substr(0, 64) +
                               "\" is not a plugin name: use at most 64 letters, digits, '_', '.' "
                               "and '-', not starting with '.' or '-'");
    const std::filesystem::path library = requiredString(root, file, "library", false);
    m.library = library.is_absolute() ? library : (file.parent_path() / library).lexically_normal();
    const std::string abi = requiredString(root, file, "abi_version", false);
    unsigned major = 0, minor = 0;
    char extra = 0;
    if (std::sscanf(abi.c_str(), "%u.%u%c", &major, &minor, &extra) != 2)
        fail(file, "/abi_version", "expected \"MAJOR.MINOR\" (e.g. \"1.0\"), got \"" + abi + "\"");
    m.abiMajor = major;
    m.abiMinor = minor;
    m.backend = requiredString(root, file, "backend", false);
    m.description = requiredString(root, file, "description", true);
    m.expectedFailures = expectedFailures(root, file);
    return m;
}

} // namespace

PluginManifest parseManifest(std::string_view text, const std::filesystem::path &file) {
    Json root;
    try {
        root = parseJson(text, file.string(), kManifestJsonLimits, ErrorCode::PluginLoad);
    } catch (const Error &e) {
        throw ManifestError(e.what());
    }
    return fromJson(root, file);
}

PluginManifest readManifest(const std::filesystem::path &file) {
    Json root;
    try {
        root = readJsonFile(file, kManifestJsonLimits, ErrorCode::PluginLoad);
    } catch (const Error &e) {
        throw ManifestError(e.what());
    }
    return fromJson(root, file);
}

} // namespace backplane::detail
