// Parsing of the host plugin's options JSON.
#include "host_options.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <nlohmann/json.hpp>

#include <limits>
#include <string>

namespace backplane::host {
namespace {

constexpr uint32_t kMaxDevices = 64;
constexpr uint32_t kMaxWorkers = 1024;

[[noreturn]] void invalid(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "host plugin options: " + message);
}

uint64_t readCount(const nlohmann::json &value, const char *key, uint64_t min, uint64_t max) {
    // nlohmann parses every non-negative integer literal as unsigned.
    if (!value.is_number_unsigned())
        invalid(std::string("\"") + key + "\" must be a non-negative integer, not " + value.dump());
    const auto n = value.get<uint64_t>();
    if (n < min || n > max)
        invalid(std::string("\"") + key + "\" must lie in [" + std::to_string(min) + ", " +
                std::to_string(max) + "], not " + std::to_string(n));
    return n;
}

/// A short text option: printable ASCII, no spaces (a host name, an address, an interface name).
std::string readName(const nlohmann::json &value, const std::string &key) {
    if (!value.is_string()) invalid("\"" + key + "\" must be a string, not " + value.dump());
    auto text = value.get<std::string>();
    if (text.empty() || text.size() > 255)
        invalid("\"" + key + "\" must hold 1 to 255 characters, not " + value.dump());
    for (const char c : text)
        if (c <= ' ' || c > '~')
            invalid("\"" + key + "\" must be printable ASCII without spaces, not " + value.dump());
    return text;
}

void readCollectives(const nlohmann::json &value, HostOptions &options) {
    if (!value.is_object())
        invalid("\"collectives\" must be an object like {\"address\": \"10.0.0.1\"}, not " +
                value.dump());
    for (const auto &[key, item] : value.items()) {
        if (key == "address") {
            options.collectivesAddress = readName(item, "collectives.address");
        } else if (key == "interface") {
            options.collectivesInterface = readName(item, "collectives.interface");
        } else {
            invalid("unknown key \"collectives." + key +
                    "\"; \"collectives\" knows \"address\" and \"interface\"");
        }
    }
}

} // namespace

HostOptions parseHostOptions(std::string_view json) {
    nlohmann::json root;
    try {
        root = nlohmann::json::parse(json.empty() ? std::string_view("{}") : json);
    } catch (const nlohmann::json::exception &e) { // parse_error, out_of_range (1e999)...
        invalid(std::string("not valid JSON: ") + e.what());
    }
    if (!root.is_object()) invalid(std::string("expected a JSON object, got ") + root.type_name());

    HostOptions options;
    for (const auto &[key, value] : root.items()) {
        if (key == "devices") {
            options.devices = static_cast<uint32_t>(readCount(value, "devices", 1, kMaxDevices));
        } else if (key == "memory_bytes") {
            options.memoryBytes =
                readCount(value, "memory_bytes", 1, std::numeric_limits<int64_t>::max());
        } else if (key == "mode") {
            const std::string mode = value.is_string() ? value.get<std::string>() : "";
            if (mode != "async" && mode != "sync")
                invalid("\"mode\" must be \"async\" or \"sync\", not " + value.dump());
            options.async = mode == "async";
        } else if (key == "workers") {
            options.workers = static_cast<uint32_t>(readCount(value, "workers", 1, kMaxWorkers));
        } else if (key == "collectives") {
            readCollectives(value, options);
        } else {
            invalid("unknown key \"" + key +
                    "\"; the host plugin knows \"collectives\", \"devices\", \"memory_bytes\", "
                    "\"mode\" and \"workers\"");
        }
    }
    return options;
}

} // namespace backplane::host
