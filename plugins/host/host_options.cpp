// Parsing of the host plugin's options JSON.
#include "host_options.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <iterator>
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

/// A file path: 1 to 4095 bytes, no NUL.
std::string readPath(const nlohmann::json &value, const std::string &key) {
    if (!value.is_string()) invalid("\"" + key + "\" must be a file path, not " + value.dump());
    auto text = value.get<std::string>();
    if (text.empty() || text.size() > 4095 || text.find('\0') != std::string::npos)
        invalid("\"" + key + "\" must be a file path of 1 to 4095 bytes, not " + value.dump());
    return text;
}

constexpr const char *kElementTypeNames[] = {"bool", "i8",  "u8",  "i16", "u16",
                                             "i32",  "u32", "i64", "u64", "f16",
                                             "bf16", "f32", "f64"};
static_assert(std::size(kElementTypeNames) == BP_ELEMENT_F64 + 1);

uint32_t readTypes(const nlohmann::json &value, const char *key) {
    std::string known;
    for (const char *name : kElementTypeNames)
        known += std::string(known.empty() ? "" : ", ") + name;
    if (!value.is_array())
        invalid(std::string("\"") + key + "\" must be an array of type names (" + known +
                "), not " + value.dump());
    uint32_t mask = 0;
    for (const auto &item : value) {
        const auto *name = std::find_if(
            std::begin(kElementTypeNames), std::end(kElementTypeNames),
            [&](const char *n) { return item.is_string() && item.get<std::string>() == n; });
        if (name == std::end(kElementTypeNames))
            invalid(std::string("\"") + key + "\" names an unknown type " + item.dump() +
                    "; the types are " + known);
        const auto type = static_cast<uint32_t>(name - std::begin(kElementTypeNames));
        // The ABI promises these on every device (plugin.h, "Kernel features").
        if (type == BP_ELEMENT_BOOL || type == BP_ELEMENT_I32 || type == BP_ELEMENT_U32 ||
            type == BP_ELEMENT_F32)
            invalid(std::string("\"") + key + "\" cannot disable " + item.dump() +
                    ": every device has bool, i32, u32 and f32");
        mask |= 1u << type;
    }
    return mask;
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
        } else if (key == "module") {
            options.collectivesModule = readPath(item, "collectives.module");
        } else {
            invalid("unknown key \"collectives." + key +
                    "\"; \"collectives\" knows \"address\", \"interface\" and \"module\"");
        }
    }
}

std::vector<InjectedFault> readFaults(const nlohmann::json &value) {
    constexpr const char *kForm =
        "[{\"device\": 0, \"operation\": \"launch\", \"nth\": 3, \"class\": \"sticky\"}]";
    if (!value.is_array() || value.size() > 64)
        invalid(std::string("\"inject_faults\" must be an array of at most 64 faults like ") +
                kForm + ", not " + value.dump());
    std::vector<InjectedFault> faults;
    for (size_t i = 0; i < value.size(); ++i) {
        const nlohmann::json &item = value[i];
        const std::string at = "inject_faults[" + std::to_string(i) + "]";
        if (!item.is_object()) invalid("\"" + at + "\" must be an object like " + kForm);
        InjectedFault fault;
        bool haveOperation = false;
        bool haveNth = false;
        for (const auto &[key, field] : item.items()) {
            if (key == "device") {
                fault.device =
                    static_cast<uint32_t>(readCount(field, (at + ".device").c_str(), 0, kMaxDevices - 1));
            } else if (key == "operation") {
                const std::string name = field.is_string() ? field.get<std::string>() : "";
                bool known = false;
                for (size_t op = 0; op < kFaultOperationCount; ++op)
                    if (name == toString(static_cast<FaultOperation>(op))) {
                        fault.operation = static_cast<FaultOperation>(op);
                        known = true;
                    }
                if (!known)
                    invalid("\"" + at + ".operation\" must be \"launch\", \"copy\", \"fill\", "
                            "\"collective\" or \"replay\", not " + field.dump());
                haveOperation = true;
            } else if (key == "nth") {
                fault.nth = readCount(field, (at + ".nth").c_str(), 1,
                                      std::numeric_limits<int64_t>::max());
                haveNth = true;
            } else if (key == "class") {
                const std::string name = field.is_string() ? field.get<std::string>() : "";
                if (name != "sticky" && name != "refused")
                    invalid("\"" + at + ".class\" must be \"sticky\" or \"refused\", not " +
                            field.dump());
                fault.faultClass = name == "sticky" ? FaultClass::Sticky : FaultClass::Refused;
            } else {
                invalid("unknown key \"" + at + "." + key +
                        "\"; a fault knows \"device\", \"operation\", \"nth\" and \"class\"");
            }
        }
        if (!haveOperation || !haveNth)
            invalid("\"" + at + "\" needs \"operation\" and \"nth\", like " + kForm);
        faults.push_back(fault);
    }
    return faults;
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
        } else if (key == "disable_types") {
            options.disabledTypes = readTypes(value, "disable_types");
        } else if (key == "matrix_units") {
            if (!value.is_boolean())
                invalid("\"matrix_units\" must be true or false, not " + value.dump());
            options.matrixUnits = value.get<bool>();
        } else if (key == "compile_kernels") {
            if (!value.is_boolean())
                invalid("\"compile_kernels\" must be true or false, not " + value.dump());
            options.compileKernels = value.get<bool>();
        } else if (key == "compiler") {
            if (!value.is_string() || value.get<std::string>().empty() ||
                value.get<std::string>().find('\0') != std::string::npos)
                invalid("\"compiler\" must be the C++ compiler's name or path, not " +
                        value.dump());
            options.compiler = value.get<std::string>();
        } else if (key == "inject_faults") {
            options.faults = readFaults(value);
        } else {
            invalid("unknown key \"" + key +
                    "\"; the host plugin knows \"collectives\", \"devices\", "
                    "\"disable_types\", \"matrix_units\", \"memory_bytes\", \"mode\" and "
                    "\"workers\" (kernels: \"compile_kernels\", \"compiler\"; tests: "
                    "\"inject_faults\")");
        }
    }
    return options;
}

} // namespace backplane::host
