// The host plugin: CPU threads as streams, counters as events, host memory, native kernels.
#include "gloo/comm_group.hpp"
#include "gloo/gloo_loader.hpp"
#include "gloo/host_comm.hpp"
#include "host_device.hpp"
#include "host_options.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace backplane::host {
namespace {

// Host device UUIDs: this namespace with the device index in the last four bytes (RFC 4122
// version-5 and variant bits set), so device i has the same UUID in every process.
constexpr uint8_t kUuidNamespace[16] = {0x62, 0x70, 0x2d, 0x68, 0x6f, 0x73, 0x74, 0x2d,
                                        0x8a, 0x4e, 0x1c, 0x37, 0x00, 0x00, 0x00, 0x00};

std::string cpuModelName() {
    std::ifstream cpuinfo("/proc/cpuinfo");
    std::string line;
    while (std::getline(cpuinfo, line)) {
        if (line.rfind("model name", 0) != 0) continue;
        const size_t colon = line.find(':');
        if (colon == std::string::npos) break;
        const size_t start = line.find_first_not_of(" \t", colon + 1);
        if (start != std::string::npos) return line.substr(start);
    }
    return "host CPU";
}

std::string cpuArchitecture() {
    utsname names{};
    if (uname(&names) == 0 && names.machine[0] != '\0') return names.machine;
    return "unknown";
}

uint64_t physicalMemoryBytes() {
    const long pages = sysconf(_SC_PHYS_PAGES);
    const long pageSize = sysconf(_SC_PAGE_SIZE);
    if (pages <= 0 || pageSize <= 0) return uint64_t{1} << 32; // unknown: assume 4 GiB
    return static_cast<uint64_t>(pages) * static_cast<uint64_t>(pageSize);
}

} // namespace

/// The plugin instance. Construction parses the options and describes the devices (cheap: reads
/// /proc/cpuinfo once); threads start only when a device is opened.
class HostPlugin final : public sdk::Plugin {
public:
    static constexpr const char *kName = "host";
    static constexpr const char *kVersion = "1.0.0";
    static constexpr const char *kOptionsSchema = kHostOptionsSchema;

    // Cheap: parses the options and reads /proc/cpuinfo; the Gloo module is loaded by the first
    // device_info or collective call (gloo_loader.hpp).
    explicit HostPlugin(const bp_plugin_init_args &args)
        : Plugin(args), options_(parseHostOptions(optionsJson())),
          gloo_(std::make_shared<GlooLoader>(options_.collectivesModule)),
          compiler_(std::make_shared<HostCompiler>(options_)) {
        for (uint32_t i = 0; i < options_.devices; ++i) {
            allocated_.push_back(std::make_shared<std::atomic<uint64_t>>(0));
            faults_.push_back(std::make_shared<FaultPlan>(i, options_.faults));
        }
        for (const InjectedFault &fault : options_.faults)
            log(BP_LOG_WARN, std::string("injecting a ") + toString(fault.faultClass) +
                                 " fault into " + toString(fault.operation) + " #" +
                                 std::to_string(fault.nth) + " of host device " +
                                 std::to_string(fault.device) + " (option inject_faults)");
        if (options_.workers == 0)
            options_.workers = std::clamp(std::thread::hardware_concurrency(), 1u, 4u);
        info_ = describeDevice();
        log(BP_LOG_DEBUG, std::to_string(options_.devices) + " host device(s), " +
                              (options_.async ? "async" : "sync") + " streams, " +
                              std::to_string(options_.workers) + " workgroup worker(s)");
    }

    bp_probe_result probe() override {
        auto result = sdk::makeStruct<bp_probe_result>();
        result.device_count = options_.devices;
        sdk::copyString(result.driver_version, kVersion);
        return result;
    }

    bp_device_info deviceInfo(uint32_t index) override {
        checkIndex(index, "device_info");
        bp_device_info info = info_;
        // Collectives need the Gloo module and libgloo; without them only the capability is
        // off, and the reason is what `backplane devices` shows.
        if (gloo_->api() != nullptr) info.capabilities |= BP_CAPABILITY_COLLECTIVES;
        sdk::copyString(info.collectives, gloo_->status());
        // Portable kernels compile with the system's C++ compiler when there is one (found
        // the first time a device is described); the core interprets them otherwise.
        const HostCompiler::Identity &compiler = compiler_->identity();
        sdk::copyString(info.kernel_compiler, compiler.description);
        if (compiler.available) {
            info.dialects |= 1u << BP_DIALECT_CPP;
            // The compiler and CPU key every cached kernel (the device fingerprint).
            sdk::copyString(info.driver_version,
                            std::string(kVersion) + "+cxx." + compiler.fingerprint);
            // Compiled objects outlive the process; host functions (BP_DIALECT_HOST) are left
            // out of the disk cache only by a core of ABI 1.5 or newer.
            if (hostAbiMinor() >= 5) info.capabilities |= BP_CAPABILITY_PORTABLE_BINARIES;
        }
        std::copy(std::begin(kUuidNamespace), std::end(kUuidNamespace), info.uuid);
        for (int b = 0; b < 4; ++b)
            info.uuid[12 + b] = static_cast<uint8_t>(index >> (24 - 8 * b));
        info.uuid[6] = static_cast<uint8_t>((info.uuid[6] & 0x0f) | 0x50); // version 5
        info.uuid[8] = static_cast<uint8_t>((info.uuid[8] & 0x3f) | 0x80); // RFC 4122 variant
        return info;
    }

    std::unique_ptr<sdk::Device> open(uint32_t index, const bp_device_open_args &args) override {
        checkIndex(index, "device_open");
        if (args.flags != 0)
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             "device_open: flags must be 0 in ABI 1.0, got " +
                                 std::to_string(args.flags));
        // Every open is an independent client of the device (as on Vulkan and CUDA); the
        // memory budget is the device's, shared by its opens.
        return std::make_unique<HostDevice>(deviceInfo(index), this, options_, gloo_,
                                            allocated_[index], compiler_, faults_[index]);
    }

    std::vector<unsigned char> createCommId() override { return commIds_.make(); }

    void commGroup(bool begin) override {
        gloo_->require(begin ? "comm_group(begin)" : "comm_group(end)");
        if (begin)
            beginCommGroup();
        else
            endCommGroup();
    }

private:
    void checkIndex(uint32_t index, const char *operation) const {
        if (index >= options_.devices)
            throw sdk::Error(BP_ERROR_NOT_FOUND, std::string(operation) + ": no host device " +
                                                     std::to_string(index) + "; there are " +
                                                     std::to_string(options_.devices) +
                                                     " (raise the \"devices\" option for more)");
    }

    bp_device_info describeDevice() const {
        auto info = sdk::makeStruct<bp_device_info>();
        sdk::copyString(info.name, cpuModelName());
        sdk::copyString(info.vendor, "backplane");
        sdk::copyString(info.arch, cpuArchitecture());
        sdk::copyString(info.driver_version, kVersion);
        info.has_uuid = 1;
        info.type = BP_DEVICE_TYPE_CPU;
        info.memory_bytes =
            options_.memoryBytes != 0 ? options_.memoryBytes : physicalMemoryBytes();
        info.max_allocation_bytes = info.memory_bytes;
        info.max_block_size[0] = info.max_block_size[1] = info.max_block_size[2] = 1024;
        info.max_block_threads = 1024;
        info.max_grid_size[0] = 0x7fffffffu;
        info.max_grid_size[1] = info.max_grid_size[2] = 65535;
        info.max_shared_memory_bytes = 0; // a host kernel uses its own stack
        info.subgroup_size = 1;
        info.binding_alignment = 64;
        info.max_bindings = 64;
        info.max_scalar_bytes = 4096;
        info.max_streams = 16;
        info.dialects = 1u << BP_DIALECT_HOST;
        // Not PORTABLE_BINARIES for host functions (a blob is a pointer of this process);
        // deviceInfo() adds it with the C++ compiler.
        info.capabilities = BP_CAPABILITY_TIMESTAMPS | BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY |
                            BP_CAPABILITY_INDIRECT_DISPATCH | BP_CAPABILITY_PEER_COPY |
                            BP_CAPABILITY_ADDRESSABLE_MEMORY;
        if (options_.async) info.capabilities |= BP_CAPABILITY_ASYNC_STREAMS;
        describeKernelFeatures(info);
        return info;
    }

    /// What kernels may use: what the host's kernel-language path (the core's interpreter) runs,
    /// less the option "disable_types".
    void describeKernelFeatures(bp_device_info &info) const {
        constexpr auto bit = [](bp_element_type t) { return 1u << t; };
        const uint32_t narrowInts = bit(BP_ELEMENT_I8) | bit(BP_ELEMENT_U8) |
                                    bit(BP_ELEMENT_I16) | bit(BP_ELEMENT_U16);
        const uint32_t ints32 = bit(BP_ELEMENT_I32) | bit(BP_ELEMENT_U32);
        const uint32_t wide = bit(BP_ELEMENT_I64) | bit(BP_ELEMENT_U64) | bit(BP_ELEMENT_F64);
        const uint32_t halves = bit(BP_ELEMENT_F16) | bit(BP_ELEMENT_BF16);
        info.element_storage = bit(BP_ELEMENT_BOOL) | narrowInts | ints32 | wide | halves |
                               bit(BP_ELEMENT_F32);
        // f16 and bf16 are computed in f32 and rounded after every operation: the results a
        // native unit gives, so they count as arithmetic. Not i64, u64 or f64: the interpreter
        // keeps values in 32-bit registers and cannot run 64-bit types yet.
        info.element_arithmetic = info.element_storage & ~wide;
        info.element_atomic_add = ints32 | bit(BP_ELEMENT_F32);
        info.element_atomic_bits = ints32;
        info.vector_widths = (1u << 2) | (1u << 4) | (1u << 8);
        // The interpreter is the reference of the matrix units: the language's two tiles.
        info.matrix_shape_count = 0;
        const uint32_t keep = ~options_.disabledTypes;
        const auto shape = [&](uint16_t k, bp_element_type in) {
            if (!options_.matrixUnits || (keep & bit(in)) == 0) return;
            bp_matrix_shape &s = info.matrix_shapes[info.matrix_shape_count++];
            s = bp_matrix_shape{};
            s.m = s.n = 16;
            s.k = k;
            s.a = s.b = static_cast<uint8_t>(in);
            s.c = static_cast<uint8_t>(BP_ELEMENT_F32);
        };
        shape(16, BP_ELEMENT_F16);
        shape(16, BP_ELEMENT_BF16);
        shape(8, BP_ELEMENT_F32);
        info.element_storage &= keep;
        info.element_arithmetic &= keep;
        info.element_atomic_add &= keep;
        info.element_atomic_bits &= keep;
    }

    HostOptions options_;
    std::shared_ptr<GlooLoader> gloo_;
    std::shared_ptr<const HostCompiler> compiler_;
    bp_device_info info_{};
    /// Bytes allocated per device index, shared by every open of it (immutable list).
    std::vector<std::shared_ptr<std::atomic<uint64_t>>> allocated_;
    /// Injected faults and their counters per device index, shared by every open of it.
    std::vector<std::shared_ptr<FaultPlan>> faults_;
    CommIdMaker commIds_{options_, *gloo_, [this](bp_log_level level, const std::string &message) {
                             log(level, message);
                         }};
};

} // namespace backplane::host

BACKPLANE_PLUGIN(backplane::host::HostPlugin)
