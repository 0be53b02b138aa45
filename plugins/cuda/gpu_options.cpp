// Parsing of the CUDA / HIP plugin's options JSON.
#include "gpu_options.hpp"

#include "gpu_library.hpp"

#include <nlohmann/json.hpp>

#include <string>

namespace backplane::gpu {
namespace {

[[noreturn]] void invalid(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                     std::string(bpv::kPluginName) + " plugin options: " + message);
}

void readCollectives(const nlohmann::json &value, GpuOptions &options) {
    const std::string name = bpv::kCollectivesName;
    if (!value.is_object())
        invalid("\"" + name + "\" must be an object like {\"library\": \"/path/" +
                bpv::kCollectivesLibrary + "\"}, not " + value.dump());
    for (const auto &[key, item] : value.items()) {
        if (key != "library")
            invalid("unknown key \"" + name + "." + key + "\"; \"" + name + "\" knows \"library\"");
        if (!item.is_string() || item.get<std::string>().empty() ||
            item.get<std::string>().find('\0') != std::string::npos)
            invalid("\"" + name + ".library\" must be a non-empty path, not " + item.dump());
        options.collectivesLibrary = item.get<std::string>();
    }
}

} // namespace

GpuOptions parseGpuOptions(std::string_view json) {
    nlohmann::json root;
    try {
        root = nlohmann::json::parse(json.empty() ? std::string_view("{}") : json);
    } catch (const nlohmann::json::exception &e) { // parse_error, out_of_range (1e999)...
        invalid(std::string("not valid JSON: ") + e.what());
    }
    if (!root.is_object()) invalid(std::string("expected a JSON object, got ") + root.type_name());
    GpuOptions options;
    for (const auto &[key, value] : root.items()) {
        if (key == bpv::kCollectivesName)
            readCollectives(value, options);
        else
            invalid("unknown key \"" + key + "\"; the " + bpv::kPluginName + " plugin knows \"" +
                    bpv::kCollectivesName + "\"");
    }
    return options;
}

} // namespace backplane::gpu
