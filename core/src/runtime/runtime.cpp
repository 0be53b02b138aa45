// Runtime: loads plugins through the loader, keeps the device list, selects, reports as JSON.
#include "runtime_impl.hpp"

#include "input/json_input.hpp"
#include "loader/plugin_loader.hpp"
#include "runtime/device_list.hpp"
#include "config/device_selector.hpp"

#include <backplane/error.hpp>
#include <backplane/log.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>

#ifndef BACKPLANE_VERSION
#define BACKPLANE_VERSION "unknown"
#endif

namespace backplane {
namespace {

using Json = nlohmann::json;

std::string describe(const DeviceInfo &d) {
    return d.id() + " (" + d.name + ", " + toString(d.type) + ")";
}

/// One line per plugin that did not load: what the user reads in a NoMatchingDevice error.
std::string reportSummary(const Runtime::Impl &impl) {
    std::string out;
    for (const auto &r : impl.reports)
        out += "\n  " + (r.name.empty() ? r.manifest.string() : r.name) + ": " +
               toString(r.state) + (r.reason.empty() ? "" : " - " + r.reason);
    if (impl.reports.empty()) {
        out += "\n  no plugin manifest found; searched:";
        for (const auto &p : impl.searchPath) out += " " + p.string();
    }
    return out;
}

/// Why selector `s` matched nothing, from the plugin reports.
std::string whyNoMatch(const Runtime::Impl &impl, const detail::DeviceSelector &s) {
    if (s.namesBackend()) {
        const auto report = std::find_if(impl.reports.begin(), impl.reports.end(),
                                         [&](const PluginReport &r) { return r.name == s.backend; });
        if (report == impl.reports.end())
            return "no plugin named '" + s.backend + "' was found in the plugin search path";
        if (report->state != PluginState::Loaded)
            return "plugin " + s.backend + " is " + toString(report->state) +
                   (report->reason.empty() ? "" : ": " + report->reason);
        std::string ids;
        for (const auto &d : impl.devices)
            for (const auto &route : d.routes)
                if (route.backend == s.backend) ids += (ids.empty() ? "" : ", ") + route.id();
        return "plugin " + s.backend + " has " + ids + " but none matches";
    }
    std::string failed;
    for (const auto &r : impl.reports)
        if (r.state != PluginState::Loaded && r.state != PluginState::Shadowed)
            failed += (failed.empty() ? "" : ", ") + (r.name.empty() ? r.manifest.string() : r.name) +
                      " (" + toString(r.state) + ")";
    return "no such device among " + std::to_string(impl.devices.size()) + " device(s)" +
           (failed.empty() ? "" : "; plugins not loaded: " + failed);
}

/// The route of `device` that `s` selects: the preferred one if it matches, else the first.
const DeviceInfo *matchingRoute(const PhysicalDevice &device, const detail::DeviceSelector &s) {
    if (s.matches(device.info())) return &device.info();
    for (const auto &route : device.routes)
        if (s.matches(route)) return &route;
    return nullptr;
}

Selection selectFrom(const Runtime::Impl &impl, const std::vector<std::string> &preference,
                     bool required, const std::string &origin, bool logChoice) {
    Selection selection;
    for (size_t i = 0; i < preference.size(); ++i) {
        detail::DeviceSelector s;
        try {
            s = detail::parseSelector(preference[i]);
        } catch (const Error &e) {
            throw Error(ErrorCode::Config, origin + ": " + e.what());
        }
        std::vector<const DeviceInfo *> matches;
        for (const auto &device : impl.devices)
            if (const DeviceInfo *route = matchingRoute(device, s)) matches.push_back(route);
        if (s.kind == detail::DeviceSelector::Kind::BackendUuid && matches.size() > 1) {
            std::string ids;
            for (const auto *m : matches) ids += (ids.empty() ? "" : ", ") + m->id();
            selection.rejected.push_back("'" + s.text + "': UUID prefix is ambiguous (" + ids +
                                         "); give more digits");
            continue;
        }
        if (matches.empty()) {
            selection.rejected.push_back("'" + s.text + "': " + whyNoMatch(impl, s));
            continue;
        }
        selection.device = *matches.front();
        selection.reason = "'" + s.text + "' (" + origin + ", entry " + std::to_string(i + 1) +
                           " of " + std::to_string(preference.size()) + ") matched " +
                           describe(selection.device);
        if (logChoice)
            log::write(log::Subsystem::Loader,
                       selection.rejected.empty() ? log::Level::Info : log::Level::Warn,
                       "selected " + selection.reason +
                           (selection.rejected.empty()
                                ? ""
                                : "; earlier entries failed: " + [&] {
                                      std::string text;
                                      for (const auto &r : selection.rejected)
                                          text += (text.empty() ? "" : "; ") + r;
                                      return text;
                                  }()));
        return selection;
    }

    std::string failures;
    for (const auto &r : selection.rejected) failures += "\n  " + r;
    if (!preference.empty() && required)
        throw Error(ErrorCode::NoMatchingDevice,
                    "no device matches the required selection (" + origin + "):" + failures +
                        "\nplugins:" + reportSummary(impl));
    if (impl.devices.empty())
        throw Error(ErrorCode::NoDevice,
                    "no usable device: no plugin reported a device. Plugins:" +
                        reportSummary(impl));
    selection.device = impl.devices.front().info();
    selection.reason =
        (preference.empty() ? std::string("no preference given")
                            : "nothing in " + origin + " matched") +
        "; took the best device by the default order (discrete GPU, integrated GPU, other, CPU; "
        "then memory; then backend priority): " +
        describe(selection.device);
    if (logChoice)
        log::write(log::Subsystem::Loader,
                   preference.empty() ? log::Level::Info : log::Level::Warn,
                   "selected " + selection.device.id() + ": " + selection.reason +
                       (failures.empty() ? "" : ". Why not the preferred ones:" + failures));
    return selection;
}

/// The type names of a KernelFeatures mask, in ElementType order.
Json typeNames(uint32_t mask) {
    Json names = Json::array();
    for (int t = 0; t < kElementTypeCount; ++t)
        if ((mask >> t) & 1u) names.push_back(toString(static_cast<ElementType>(t)));
    return names;
}

/// "kernel_features" of one route (docs/devices-json.md).
Json kernelFeaturesJson(const KernelFeatures &f) {
    Json widths = Json::array();
    for (const uint32_t n : {2u, 4u, 8u})
        if (f.loadsVectorsOf(n)) widths.push_back(n);
    Json shapes = Json::array();
    for (const MatrixShape &s : f.matrixShapes)
        shapes.push_back({{"m", s.m}, {"n", s.n}, {"k", s.k}, {"a", toString(s.a)},
                          {"b", toString(s.b)}, {"c", toString(s.c)}});
    return {{"storage", typeNames(f.storage)},       {"arithmetic", typeNames(f.arithmetic)},
            {"atomic_add", typeNames(f.atomicAdd)},   {"atomic_bits", typeNames(f.atomicBits)},
            {"vector_widths", widths},                {"matrix_shapes", shapes}};
}

Json deviceJson(const PhysicalDevice &device) {
    const DeviceInfo &d = device.info();
    Json routes = Json::array();
    Json collectives = Json::object();
    Json features = Json::object();
    for (const auto &r : device.routes) {
        routes.push_back(r.id());
        collectives[r.id()] = {{"available", (r.capabilities & BP_CAPABILITY_COLLECTIVES) != 0},
                               {"engine", r.collectives}};
        features[r.id()] = kernelFeaturesJson(r.features);
    }
    return {
        {"id", d.id()},
        {"name", d.name},
        {"vendor", d.vendor},
        {"type", toString(d.type)},
        {"arch", d.arch},
        {"driver_version", d.driverVersion},
        {"memory_bytes", d.memoryBytes},
        {"uuid", d.hasUuid ? Json(d.uuidString()) : Json(nullptr)},
        {"pci_bus_id", d.pciBusId.empty() ? Json(nullptr) : Json(d.pciBusId)},
        {"routes", routes},
        {"preferred_route", d.id()},
        {"collectives", collectives},
        {"kernel_features", features},
    };
}

Json pluginJson(const PluginReport &r) {
    return {
        {"name", r.name},
        {"backend", r.backend},
        {"description", r.description},
        {"version", r.version},
        {"manifest", r.manifest.string()},
        {"library", r.library.string()},
        {"state", toString(r.state)},
        {"reason", r.reason},
        {"abi_version", std::to_string(r.abiMajor) + "." + std::to_string(r.abiMinor)},
        {"driver_version", r.driverVersion},
        {"device_count", r.deviceCount},
        {"probe", r.probe},
    };
}

} // namespace

const char *toString(PluginState state) noexcept {
    switch (state) {
    case PluginState::Loaded: return "loaded";
    case PluginState::FilteredOut: return "filtered_out";
    case PluginState::Shadowed: return "shadowed";
    case PluginState::ManifestInvalid: return "manifest_invalid";
    case PluginState::AbiMismatch: return "abi_mismatch";
    case PluginState::EntryMissing: return "entry_missing";
    case PluginState::InvalidTable: return "invalid_table";
    case PluginState::LibraryLoadFailed: return "library_load_failed";
    case PluginState::InitFailed: return "init_failed";
    case PluginState::ProbeFailed: return "probe_failed";
    case PluginState::NoDevice: return "no_device";
    case PluginState::ProbeCrashed: return "probe_crashed";
    case PluginState::ProbeTimeout: return "probe_timeout";
    }
    return "unknown";
}

Runtime::Runtime(Config config) : impl_(std::make_unique<Impl>()) {
    if (!config.logSpec.empty()) log::configure(config.logSpec);
    impl_->config = std::move(config);
    detail::LoadedPlugins loaded = detail::loadPlugins(impl_->config);
    impl_->searchPath = std::move(loaded.searchPath);
    impl_->reports = std::move(loaded.reports);
    impl_->libraries = std::move(loaded.libraries);
    impl_->devices =
        detail::buildDeviceList(loaded.devices, impl_->config.backendPriority, impl_->reports);
    log::write(log::Subsystem::Loader, log::Level::Debug,
               std::to_string(impl_->reports.size()) + " plugin manifest(s), " +
                   std::to_string(impl_->libraries.size()) + " loaded, " +
                   std::to_string(impl_->devices.size()) + " device(s)");
    // Last: a Runtime that failed to construct never owns the trace.
    impl_->environmentTrace = detail::startEnvironmentTrace();
}

Runtime::Runtime() : Runtime(loadConfig()) {}
Runtime::~Runtime() = default;
Runtime::Runtime(Runtime &&) noexcept = default;
Runtime &Runtime::operator=(Runtime &&) noexcept = default;

const Config &Runtime::config() const { return impl_->config; }
const std::vector<PluginReport> &Runtime::plugins() const { return impl_->reports; }
const std::vector<PhysicalDevice> &Runtime::devices() const { return impl_->devices; }
const std::vector<std::filesystem::path> &Runtime::searchPath() const {
    return impl_->searchPath;
}

Selection Runtime::select(const std::string &selector) const {
    if (selector.empty())
        return selectFrom(*impl_, impl_->config.devicePreference, impl_->config.deviceRequired,
                          detail::preferenceOrigin(impl_->config), true);
    std::vector<std::string> list;
    size_t start = 0;
    while (start <= selector.size()) {
        const size_t comma = selector.find(',', start);
        list.push_back(selector.substr(start, comma - start));
        if (comma == std::string::npos) break;
        start = comma + 1;
    }
    return selectFrom(*impl_, list, true, "selector '" + selector + "'", true);
}

std::string Runtime::reportJson(int indent) const {
    Json plugins = Json::array();
    for (const auto &r : impl_->reports) plugins.push_back(pluginJson(r));
    Json devices = Json::array();
    for (const auto &d : impl_->devices) devices.push_back(deviceJson(d));
    Json searchPath = Json::array();
    for (const auto &p : impl_->searchPath) searchPath.push_back(p.string());
    Json selection;
    try {
        const Selection s =
            selectFrom(*impl_, impl_->config.devicePreference, impl_->config.deviceRequired,
                       detail::preferenceOrigin(impl_->config), false);
        selection = {{"device", s.device.id()}, {"reason", s.reason}, {"rejected", s.rejected}};
    } catch (const Error &e) {
        selection = {{"device", nullptr},
                     {"error", {{"code", toString(e.code())}, {"message", e.what()}}}};
    }
    const Json root = {
        {"schema_version", 1},
        {"backplane_version", BACKPLANE_VERSION},
        {"abi_version", std::to_string(BP_ABI_VERSION_MAJOR) + "." +
                            std::to_string(BP_ABI_VERSION_MINOR)},
        {"config", impl_->config.source.empty() ? Json(nullptr)
                                                : Json(impl_->config.source.string())},
        {"search_path", searchPath},
        {"plugins", plugins},
        {"devices", devices},
        {"selection", selection},
    };
    return detail::dumpJson(root, indent);
}

} // namespace backplane
