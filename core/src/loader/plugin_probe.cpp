// Loading and probing one plugin; its outcome as JSON for the probe helper and the probe cache.
#include "plugin_probe.hpp"

#include "plugin/device_info.hpp"

#include <backplane/log.hpp>

namespace backplane::detail {
namespace {

using Json = nlohmann::json;

PluginState stateOf(LoadFailure failure) {
    switch (failure) {
    case LoadFailure::LibraryLoad: return PluginState::LibraryLoadFailed;
    case LoadFailure::EntryMissing: return PluginState::EntryMissing;
    case LoadFailure::AbiMismatch: return PluginState::AbiMismatch;
    case LoadFailure::InvalidTable: return PluginState::InvalidTable;
    case LoadFailure::InitFailed: return PluginState::InitFailed;
    }
    return PluginState::LibraryLoadFailed;
}

} // namespace

std::optional<PluginState> pluginStateNamed(const std::string &name) {
    for (int i = 0; i <= static_cast<int>(PluginState::ProbeTimeout); ++i)
        if (name == toString(static_cast<PluginState>(i))) return static_cast<PluginState>(i);
    return std::nullopt;
}

ProbeOutcome probePlugin(const std::filesystem::path &path, const std::string &name,
                         const PluginInitOptions &options,
                         const std::function<void(const char *)> &onStage) {
    ProbeOutcome out;
    const auto stage = [&](const std::string &text) {
        if (onStage) onStage(text.c_str());
    };
    std::shared_ptr<PluginLibrary> library;
    try {
        library = PluginLibrary::open(path, name, options, onStage);
    } catch (const PluginLoadError &e) {
        out.state = stateOf(e.failure());
        out.reason = e.what();
        return out;
    } catch (const std::exception &e) {
        out.state = PluginState::LibraryLoadFailed;
        out.reason = "cannot load " + path.string() + ": " + e.what();
        return out;
    }
    out.version = library->version();
    out.abiMajor = library->api().abi_major;
    out.abiMinor = library->abiMinor();
    bp_probe_result probe{};
    try {
        stage("probe");
        probe = library->probe();
    } catch (const Error &e) {
        out.state = e.code() == ErrorCode::NoDevice ? PluginState::NoDevice
                                                     : PluginState::ProbeFailed;
        out.reason = e.what();
        return out;
    }
    out.driverVersion = fieldText(probe.driver_version, sizeof(probe.driver_version));
    out.deviceCount = probe.device_count;
    std::string failures;
    for (uint32_t i = 0; i < probe.device_count; ++i) {
        try {
            stage("device_info(" + std::to_string(i) + ")");
            out.devices.push_back(toDeviceInfo(name, i, library->deviceInfo(i)));
        } catch (const Error &e) {
            failures += std::string(failures.empty() ? "" : "; ") + e.what();
            log::write(log::Subsystem::Loader, log::Level::Warn,
                       std::string(e.what()) + "; that device is skipped");
        }
    }
    if (probe.device_count == 0) {
        out.state = PluginState::NoDevice;
        out.reason = "the probe reports 0 devices";
        return out;
    }
    if (out.devices.empty()) {
        out.state = PluginState::ProbeFailed;
        out.reason = failures;
        return out;
    }
    out.state = PluginState::Loaded;
    out.reason = failures;
    out.library = std::move(library);
    return out;
}

Json outcomeJson(const ProbeOutcome &o) {
    Json devices = Json::array();
    for (const auto &d : o.devices)
        devices.push_back({{"index", d.index},
                           {"name", d.name},
                           {"type", toString(d.type)},
                           {"memory_bytes", d.memoryBytes},
                           {"uuid", d.uuidString()}});
    return {{"state", toString(o.state)},   {"reason", o.reason},
            {"version", o.version},         {"abi_major", o.abiMajor},
            {"abi_minor", o.abiMinor},      {"driver_version", o.driverVersion},
            {"device_count", o.deviceCount}, {"devices", devices}};
}

ProbeOutcome outcomeFromJson(const Json &j) {
    const auto text = [&](const char *key) {
        if (!j.contains(key) || !j[key].is_string())
            throw Error(ErrorCode::Internal, std::string("probe answer: /") + key +
                                                 ": expected a string");
        return j[key].get<std::string>();
    };
    const auto number = [&](const char *key) {
        if (!j.contains(key) || !j[key].is_number_unsigned() || j[key].get<uint64_t>() > UINT32_MAX)
            throw Error(ErrorCode::Internal, std::string("probe answer: /") + key +
                                                 ": expected an unsigned 32-bit integer");
        return static_cast<uint32_t>(j[key].get<uint64_t>());
    };
    if (!j.is_object()) throw Error(ErrorCode::Internal, "probe answer: expected an object");
    ProbeOutcome o;
    const std::string state = text("state");
    const auto parsed = pluginStateNamed(state);
    if (!parsed) throw Error(ErrorCode::Internal, "probe answer: /state: unknown '" + state + "'");
    o.state = *parsed;
    o.reason = text("reason");
    o.version = text("version");
    o.abiMajor = number("abi_major");
    o.abiMinor = number("abi_minor");
    o.driverVersion = text("driver_version");
    o.deviceCount = number("device_count");
    return o;
}

} // namespace backplane::detail
