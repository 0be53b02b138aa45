// Loading and probing one plugin; its outcome as JSON for the probe helper and the probe cache.
#include "plugin_probe.hpp"

#include "plugin/device_info.hpp"

#include <backplane/log.hpp>

#include <algorithm>
#include <array>

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

/// The report shows the table's ABI and version whenever the library was opened and its table
/// read, loaded or not (abiMajor 0: it was not).
void setTable(ProbeOutcome &out, const TableIdentity &table) {
    out.version = table.version;
    out.optionsSchema = table.optionsSchema;
    out.abiMajor = table.abiMajor;
    out.abiMinor = table.abiMinor;
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
        setTable(out, e.table());
        return out;
    } catch (const std::exception &e) {
        out.state = PluginState::LibraryLoadFailed;
        out.reason = "cannot load " + path.string() + ": " + e.what();
        return out;
    }
    setTable(out, {library->api().abi_major, library->abiMinor(), library->version(),
                   library->optionsSchema()});
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
    library->markProbed(out.deviceCount);
    out.library = std::move(library);
    return out;
}

namespace {

/// The kernel features as masks, and matrix shapes as [m, n, k, a, b, c].
Json featuresJson(const KernelFeatures &f) {
    Json shapes = Json::array();
    for (const MatrixShape &s : f.matrixShapes)
        shapes.push_back({s.m, s.n, s.k, static_cast<uint32_t>(s.a), static_cast<uint32_t>(s.b),
                          static_cast<uint32_t>(s.c)});
    return {{"storage", f.storage},         {"arithmetic", f.arithmetic},
            {"atomic_add", f.atomicAdd},     {"atomic_bits", f.atomicBits},
            {"vector_widths", f.vectorWidths}, {"matrix_shapes", shapes}};
}

Json deviceJson(const DeviceInfo &d) {
    Json uuid = Json::array();
    for (const uint8_t b : d.uuid) uuid.push_back(b);
    return {{"index", d.index},
            {"name", d.name},
            {"vendor", d.vendor},
            {"arch", d.arch},
            {"driver_version", d.driverVersion},
            {"pci_bus_id", d.pciBusId},
            {"uuid", uuid},
            {"has_uuid", d.hasUuid},
            {"type", static_cast<uint32_t>(d.type)},
            {"memory_bytes", d.memoryBytes},
            {"max_allocation_bytes", d.maxAllocationBytes},
            {"max_block_size", d.maxBlockSize},
            {"max_block_threads", d.maxBlockThreads},
            {"max_grid_size", d.maxGridSize},
            {"max_shared_memory_bytes", d.maxSharedMemoryBytes},
            {"subgroup_size", d.subgroupSize},
            {"binding_alignment", d.bindingAlignment},
            {"max_bindings", d.maxBindings},
            {"max_scalar_bytes", d.maxScalarBytes},
            {"max_streams", d.maxStreams},
            {"dialects", d.dialects},
            {"capabilities", d.capabilities},
            {"collectives", d.collectives},
            {"kernel_compiler", d.kernelCompiler},
            {"kernel_features", featuresJson(d.features)}};
}

/// Reads the fields of a probe answer or record, each checked; errors name the pointer.
class AnswerReader {
public:
    explicit AnswerReader(const Json &j, std::string pointer = "")
        : j_(j), pointer_(std::move(pointer)) {
        if (!j_.is_object()) fail("", "expected an object");
    }
    [[noreturn]] void fail(const std::string &key, const std::string &what) const {
        throw Error(ErrorCode::Internal, "probe answer: " + pointer_ + "/" + key + ": " + what);
    }
    const Json &at(const char *key) const {
        if (!j_.contains(key)) fail(key, "missing");
        return j_[key];
    }
    std::string text(const char *key) const {
        const Json &v = at(key);
        if (!v.is_string()) fail(key, "expected a string");
        return v.get<std::string>();
    }
    uint64_t number(const char *key, uint64_t max = UINT32_MAX) const {
        const Json &v = at(key);
        if (!v.is_number_unsigned() || v.get<uint64_t>() > max)
            fail(key, "expected an unsigned integer of at most " + std::to_string(max));
        return v.get<uint64_t>();
    }
    bool boolean(const char *key) const {
        const Json &v = at(key);
        if (!v.is_boolean()) fail(key, "expected a boolean");
        return v.get<bool>();
    }
    template <class T, size_t N> std::array<T, N> numbers(const char *key, uint64_t max) const {
        const Json &v = at(key);
        if (!v.is_array() || v.size() != N) fail(key, "expected " + std::to_string(N) + " numbers");
        std::array<T, N> out{};
        for (size_t i = 0; i < N; ++i) {
            if (!v[i].is_number_unsigned() || v[i].get<uint64_t>() > max)
                fail(key, "expected unsigned integers of at most " + std::to_string(max));
            out[i] = static_cast<T>(v[i].get<uint64_t>());
        }
        return out;
    }

private:
    const Json &j_;
    std::string pointer_;
};

KernelFeatures featuresFromJson(const Json &j, const std::string &pointer) {
    constexpr uint64_t kTypeMask = (1u << kElementTypeCount) - 1;
    const AnswerReader r(j, pointer);
    KernelFeatures f;
    f.storage = static_cast<uint32_t>(r.number("storage", kTypeMask));
    f.arithmetic = static_cast<uint32_t>(r.number("arithmetic", kTypeMask));
    f.atomicAdd = static_cast<uint32_t>(r.number("atomic_add", kTypeMask));
    f.atomicBits = static_cast<uint32_t>(r.number("atomic_bits", kTypeMask));
    f.vectorWidths = static_cast<uint32_t>(r.number("vector_widths", 0x1ff));
    const Json &shapes = r.at("matrix_shapes");
    if (!shapes.is_array() || shapes.size() > BP_MAX_MATRIX_SHAPES)
        r.fail("matrix_shapes", "expected an array of at most " +
                                    std::to_string(BP_MAX_MATRIX_SHAPES) + " shapes");
    for (const Json &shape : shapes) {
        const bool valid = shape.is_array() && shape.size() == 6 &&
                           std::all_of(shape.begin(), shape.end(), [](const Json &v) {
                               return v.is_number_unsigned() && v.get<uint64_t>() <= UINT16_MAX;
                           });
        if (!valid || shape[0] == 0 || shape[1] == 0 || shape[2] == 0 ||
            shape[3].get<uint64_t>() >= kElementTypeCount ||
            shape[4].get<uint64_t>() >= kElementTypeCount ||
            shape[5].get<uint64_t>() >= kElementTypeCount)
            r.fail("matrix_shapes", "expected [m, n, k, a, b, c] with m, n, k > 0 and known types");
        const auto at = [&](size_t i) { return shape[i].get<uint64_t>(); };
        f.matrixShapes.push_back({static_cast<uint16_t>(at(0)), static_cast<uint16_t>(at(1)),
                                  static_cast<uint16_t>(at(2)), static_cast<ElementType>(at(3)),
                                  static_cast<ElementType>(at(4)),
                                  static_cast<ElementType>(at(5))});
    }
    return f;
}

DeviceInfo deviceFromJson(const Json &j, const std::string &backend, const std::string &pointer) {
    const AnswerReader r(j, pointer);
    DeviceInfo d;
    d.backend = backend;
    d.index = static_cast<uint32_t>(r.number("index"));
    d.name = r.text("name");
    d.vendor = r.text("vendor");
    d.arch = r.text("arch");
    d.driverVersion = r.text("driver_version");
    d.pciBusId = r.text("pci_bus_id");
    d.uuid = r.numbers<uint8_t, 16>("uuid", 255);
    d.hasUuid = r.boolean("has_uuid");
    const uint64_t type = r.number("type", static_cast<uint64_t>(DeviceType::Cpu));
    d.type = static_cast<DeviceType>(type);
    d.memoryBytes = r.number("memory_bytes", UINT64_MAX);
    d.maxAllocationBytes = r.number("max_allocation_bytes", UINT64_MAX);
    d.maxBlockSize = r.numbers<uint32_t, 3>("max_block_size", UINT32_MAX);
    d.maxBlockThreads = static_cast<uint32_t>(r.number("max_block_threads"));
    d.maxGridSize = r.numbers<uint32_t, 3>("max_grid_size", UINT32_MAX);
    d.maxSharedMemoryBytes = static_cast<uint32_t>(r.number("max_shared_memory_bytes"));
    d.subgroupSize = static_cast<uint32_t>(r.number("subgroup_size"));
    d.bindingAlignment = static_cast<uint32_t>(r.number("binding_alignment", 1u << 20));
    if (d.bindingAlignment == 0 || (d.bindingAlignment & (d.bindingAlignment - 1)) != 0)
        r.fail("binding_alignment", "expected a power of two");
    d.maxBindings = static_cast<uint32_t>(r.number("max_bindings"));
    d.maxScalarBytes = static_cast<uint32_t>(r.number("max_scalar_bytes"));
    d.maxStreams = std::max<uint32_t>(1, static_cast<uint32_t>(r.number("max_streams")));
    d.dialects = static_cast<uint32_t>(r.number("dialects"));
    d.capabilities = static_cast<uint32_t>(r.number("capabilities"));
    if (j.contains("collectives")) d.collectives = r.text("collectives"); // since ABI 1.1
    if (j.contains("kernel_compiler")) d.kernelCompiler = r.text("kernel_compiler"); // since 1.5
    // An answer of a backplane-probe older than ABI 1.4 has none: what 1.3 kernels had.
    d.features = j.contains("kernel_features")
                     ? featuresFromJson(r.at("kernel_features"), pointer + "/kernel_features")
                     : kernelFeaturesBeforeAbi14();
    return d;
}

} // namespace

Json outcomeJson(const ProbeOutcome &o) {
    Json devices = Json::array();
    for (const auto &d : o.devices) devices.push_back(deviceJson(d));
    return {{"state", toString(o.state)},   {"reason", o.reason},
            {"version", o.version},         {"abi_major", o.abiMajor},
            {"abi_minor", o.abiMinor},      {"driver_version", o.driverVersion},
            {"device_count", o.deviceCount}, {"devices", devices},
            {"options_schema", o.optionsSchema}};
}

ProbeOutcome outcomeFromJson(const Json &j, const std::string &backend) {
    const AnswerReader r(j);
    ProbeOutcome o;
    const std::string state = r.text("state");
    const auto parsed = pluginStateNamed(state);
    if (!parsed) r.fail("state", "unknown state '" + state + "'");
    o.state = *parsed;
    o.reason = r.text("reason");
    o.version = r.text("version");
    o.abiMajor = static_cast<uint32_t>(r.number("abi_major"));
    o.abiMinor = static_cast<uint32_t>(r.number("abi_minor"));
    o.driverVersion = r.text("driver_version");
    // Answers of a backplane-probe older than ABI 1.5 have no schema.
    if (j.contains("options_schema")) o.optionsSchema = r.text("options_schema");
    o.deviceCount = static_cast<uint32_t>(r.number("device_count", kMaxDevicesPerPlugin));
    const Json &devices = r.at("devices");
    if (!devices.is_array() || devices.size() > o.deviceCount)
        r.fail("devices", "expected an array of at most device_count devices");
    for (size_t i = 0; i < devices.size(); ++i) {
        DeviceInfo d = deviceFromJson(devices[i], backend, "/devices/" + std::to_string(i));
        if (d.index >= o.deviceCount) r.fail("devices", "a device index beyond device_count");
        if (!o.devices.empty() && d.index <= o.devices.back().index)
            r.fail("devices", "device indices must increase");
        o.devices.push_back(std::move(d));
    }
    if (o.state == PluginState::Loaded && o.devices.empty())
        r.fail("devices", "a loaded plugin without devices");
    return o;
}

ProbeOutcome loadWithAnswer(const std::filesystem::path &path, const std::string &name,
                            const PluginInitOptions &options, ProbeOutcome answer) {
    try {
        answer.library = PluginLibrary::open(path, name, options);
    } catch (const PluginLoadError &e) {
        ProbeOutcome out;
        out.state = stateOf(e.failure());
        out.reason = e.what();
        setTable(out, e.table());
        return out;
    }
    return answer;
}

} // namespace backplane::detail
