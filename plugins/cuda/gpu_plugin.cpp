// The CUDA / HIP plugin class: probe, device descriptions, open, NCCL ids and groups. Entry point.
#include "gpu_collectives.hpp"
#include "gpu_device.hpp"
#include "gpu_options.hpp"

#include <algorithm>
#include <cctype>
#include <mutex>
#include <utility>

namespace backplane::gpu {
namespace {

int attribute(const bpv::Driver &d, bpv::Attribute a, bpv::DeviceId dev) {
    int value = 0;
    check(d, bpv::deviceAttribute(d, &value, a, dev));
    return value;
}

constexpr uint32_t bit(bp_element_type t) { return 1u << t; }

void addShape(bp_device_info &info, uint16_t m, uint16_t n, uint16_t k, bp_element_type in,
              bp_element_type accumulator) {
    if (info.matrix_shape_count == BP_MAX_MATRIX_SHAPES) return;
    bp_matrix_shape &shape = info.matrix_shapes[info.matrix_shape_count++];
    shape = bp_matrix_shape{};
    shape.m = m;
    shape.n = n;
    shape.k = k;
    shape.a = shape.b = static_cast<uint8_t>(in);
    shape.c = static_cast<uint8_t>(accumulator);
}

/// What kernels may use on a device of compute capability major.minor (ABI 1.4). The rules are
/// NVIDIA's. HIP reports AMD's own numbers through the same attributes (gfx90a: 9.0, gfx1100:
/// 11.0), so on AMD every rule passes: HIP's headers offer the same types and atomics there,
/// but whether a chip computes bf16 in hardware is not told apart.
void describeKernelFeatures(int major, int minor, bp_device_info &info) {
    const int cc = major * 10 + minor;
    const uint32_t ints = bit(BP_ELEMENT_I8) | bit(BP_ELEMENT_U8) | bit(BP_ELEMENT_I16) |
                          bit(BP_ELEMENT_U16) | bit(BP_ELEMENT_I32) | bit(BP_ELEMENT_U32) |
                          bit(BP_ELEMENT_I64) | bit(BP_ELEMENT_U64);
    info.element_storage = bit(BP_ELEMENT_BOOL) | ints | bit(BP_ELEMENT_F16) |
                           bit(BP_ELEMENT_BF16) | bit(BP_ELEMENT_F32) | bit(BP_ELEMENT_F64);
    info.element_arithmetic = bit(BP_ELEMENT_BOOL) | ints | bit(BP_ELEMENT_F32) |
                              bit(BP_ELEMENT_F64);
    if (cc >= 53) info.element_arithmetic |= bit(BP_ELEMENT_F16);  // __half arithmetic
    if (cc >= 80) info.element_arithmetic |= bit(BP_ELEMENT_BF16); // __nv_bfloat16 arithmetic
    // atomicAdd exists for unsigned long long; the kernel language adds a signed i64 through it
    // (the same two's-complement bits), so i64 counts too.
    info.element_atomic_add = bit(BP_ELEMENT_I32) | bit(BP_ELEMENT_U32) | bit(BP_ELEMENT_F32) |
                              bit(BP_ELEMENT_I64) | bit(BP_ELEMENT_U64);
    if (cc >= 60) info.element_atomic_add |= bit(BP_ELEMENT_F64);
    if (cc >= 70) info.element_atomic_add |= bit(BP_ELEMENT_F16);
    if (cc >= 80) info.element_atomic_add |= bit(BP_ELEMENT_BF16);
    info.element_atomic_bits = bit(BP_ELEMENT_I32) | bit(BP_ELEMENT_U32) | bit(BP_ELEMENT_I64) |
                               bit(BP_ELEMENT_U64);
    info.vector_widths = (1u << 2) | (1u << 4) | (1u << 8);
    info.matrix_shape_count = 0;
    if (!bpv::kWmmaShapes) return;
    // The kernel language's two tiles, lowered to PTX mma.sync m16n8k16 (f16, bf16) and
    // m16n8k8 (tf32, listed as f32 inputs), which need sm_80. Other shapes of the hardware
    // (f16 accumulators, 8-bit integers, f64) are not lowered by the language.
    if (cc >= 80) {
        addShape(info, 16, 16, 16, BP_ELEMENT_F16, BP_ELEMENT_F32);
        addShape(info, 16, 16, 16, BP_ELEMENT_BF16, BP_ELEMENT_F32);
        addShape(info, 16, 16, 8, BP_ELEMENT_F32, BP_ELEMENT_F32);
    }
}

class GpuPlugin : public sdk::Plugin {
public:
    static constexpr const char *kName = bpv::kPluginName;
    static constexpr const char *kVersion = bpv::kPluginVersion;
    static constexpr const char *kOptionsSchema = bpv::kOptionsSchema;

    // Cheap: parses the options; the driver is loaded by the first probe, NCCL by the first
    // device_info or collective call.
    explicit GpuPlugin(const bp_plugin_init_args &args)
        : Plugin(args), options_(parseGpuOptions(optionsJson())),
          nccl_(std::make_shared<NcclLoader>(options_.collectivesLibrary)) {}

    bp_probe_result probe() override {
        initialised();
        auto result = sdk::makeStruct<bp_probe_result>();
        result.device_count = static_cast<uint32_t>(devices_.size());
        sdk::copyString(result.driver_version, driverVersion_);
        return result;
    }

    bp_device_info deviceInfo(uint32_t index) override {
        initialised();
        bp_device_info info = description(index).info;
        // A missing or too old NCCL only turns the capability off; the reason is what
        // `backplane devices` shows.
        if (nccl_->library() != nullptr) info.capabilities |= BP_CAPABILITY_COLLECTIVES;
        sdk::copyString(info.collectives, nccl_->status());
        return info;
    }

    std::unique_ptr<sdk::Device> open(uint32_t index, const bp_device_open_args &) override {
        initialised();
        return std::make_unique<GpuDevice>(description(index), nccl_);
    }

    // Needs no device: NCCL's id is the address of a bootstrap socket on this host.
    std::vector<unsigned char> createCommId() override {
        const NcclLibrary &library = nccl_->require("comm_id_create");
        nccl::UniqueId id{};
        if (const nccl::Result r = library.fn.getUniqueId(&id); r != nccl::Success)
            throw library.error("ncclGetUniqueId", r, nullptr, false);
        return {id.internal, id.internal + sizeof id.internal};
    }

    void commGroup(bool begin) override {
        groupCollectives(nccl_->require(begin ? "comm_group(begin)" : "comm_group(end)"), begin);
    }

private:
    // Loads the driver, initialises it and describes every device, once. None of this creates a
    // context. A failure is remembered and reported again by every later call.
    const bpv::Driver &initialised() {
        std::call_once(once_, [this] {
            try {
                describeDevices();
            } catch (const sdk::Error &e) {
                failure_ = std::make_unique<sdk::Error>(e);
            }
        });
        if (failure_) throw *failure_;
        return gpu::driver();
    }

    void describeDevices() {
        const auto &d = gpu::driver();
        const bpv::Call init = bpv::init(d);
        if (!init.ok()) {
            const std::string text = bpv::errorName(d, init.result) + ": " +
                                     bpv::errorString(d, init.result);
            if (bpv::isNoDevice(init.result))
                throw sdk::Error(BP_ERROR_NO_DEVICE,
                                 std::string("no ") + bpv::kApiName + " device (" + init.name +
                                     ": " + text + ")",
                                 init.result);
            throw sdk::Error(BP_ERROR_NO_DRIVER,
                             std::string("the ") + bpv::kDriverDescription +
                                 " failed to initialise (" + init.name + ": " + text +
                                 "); check the driver installation",
                             init.result);
        }
        int version = 0;
        check(d, bpv::driverVersion(d, &version));
        driverVersion_ = bpv::versionString(version);

        int count = 0;
        const bpv::Call counted = bpv::deviceCount(d, &count);
        if (!counted.ok() || count == 0)
            throw sdk::Error(BP_ERROR_NO_DEVICE,
                             std::string("no ") + bpv::kApiName + " device (" + counted.name +
                                 ": " + bpv::errorName(d, counted.result) + ": " +
                                 bpv::errorString(d, counted.result) + ")",
                             counted.result);
        for (int i = 0; i < count; ++i) devices_.push_back(describe(d, i));

        // PEER_COPY where this device can access at least one other device; device_peer_access
        // answers per pair.
        for (auto &a : devices_)
            for (const auto &b : devices_) {
                int can = 0;
                if (&a != &b && bpv::canAccessPeer(d, &can, a.id, b.id).ok() && can)
                    a.info.capabilities |= BP_CAPABILITY_PEER_COPY;
            }
    }

    GpuDeviceDescription describe(const bpv::Driver &d, int ordinal) {
        GpuDeviceDescription out;
        out.ordinal = static_cast<uint32_t>(ordinal);
        check(d, bpv::deviceGet(d, &out.id, ordinal));
        check(d, bpv::deviceArch(d, &out.arch, out.id));
        auto &info = out.info;
        info = sdk::makeStruct<bp_device_info>();
        char name[256] = {};
        check(d, bpv::deviceName(d, name, sizeof name, out.id));
        sdk::copyString(info.name, name);
        sdk::copyString(info.vendor, bpv::kVendorName);
        sdk::copyString(info.arch, out.arch);
        sdk::copyString(info.driver_version, driverVersion_);
        char pci[32] = {};
        if (bpv::devicePciBusId(d, pci, sizeof pci, out.id).ok()) {
            std::string id = pci;
            std::transform(id.begin(), id.end(), id.begin(),
                           [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
            sdk::copyString(info.pci_bus_id, id);
        }
        info.has_uuid = bpv::deviceUuid(d, info.uuid, out.id).ok() ? 1 : 0;
        info.type = attribute(d, bpv::Attribute::Integrated, out.id)
                        ? BP_DEVICE_TYPE_INTEGRATED_GPU
                        : BP_DEVICE_TYPE_DISCRETE_GPU;
        size_t memory = 0;
        check(d, bpv::deviceTotalMem(d, &memory, out.id));
        info.memory_bytes = memory;
        info.max_allocation_bytes = memory;
        info.max_block_size[0] = attribute(d, bpv::Attribute::MaxBlockDimX, out.id);
        info.max_block_size[1] = attribute(d, bpv::Attribute::MaxBlockDimY, out.id);
        info.max_block_size[2] = attribute(d, bpv::Attribute::MaxBlockDimZ, out.id);
        info.max_block_threads = attribute(d, bpv::Attribute::MaxThreadsPerBlock, out.id);
        info.max_grid_size[0] = attribute(d, bpv::Attribute::MaxGridDimX, out.id);
        info.max_grid_size[1] = attribute(d, bpv::Attribute::MaxGridDimY, out.id);
        info.max_grid_size[2] = attribute(d, bpv::Attribute::MaxGridDimZ, out.id);
        info.max_shared_memory_bytes =
            attribute(d, bpv::Attribute::MaxSharedMemoryPerBlock, out.id);
        info.subgroup_size = attribute(d, bpv::Attribute::WarpSize, out.id);
        info.binding_alignment = 256;
        info.max_bindings = GpuDevice::kMaxBindings;
        info.max_scalar_bytes = GpuDevice::kMaxScalarBytes;
        info.max_streams = 32;
        info.dialects = bpv::kDialects;
        // No INDIRECT_DISPATCH: neither CUDA nor HIP can launch with a grid read on the device,
        // and reading it back to the host would stall the stream (docs/cuda.md).
        info.capabilities = BP_CAPABILITY_ASYNC_STREAMS | BP_CAPABILITY_TIMESTAMPS |
                            BP_CAPABILITY_PORTABLE_BINARIES | BP_CAPABILITY_ADDRESSABLE_MEMORY;
        describeKernelFeatures(attribute(d, bpv::Attribute::ComputeCapabilityMajor, out.id),
                               attribute(d, bpv::Attribute::ComputeCapabilityMinor, out.id),
                               info);
        return out;
    }

    const GpuDeviceDescription &description(uint32_t index) const {
        if (index >= devices_.size())
            throw sdk::Error(BP_ERROR_NOT_FOUND,
                             std::string(bpv::kApiName) + " device " + std::to_string(index) +
                                 " does not exist (" + std::to_string(devices_.size()) +
                                 " found)");
        return devices_[index];
    }

    GpuOptions options_;
    std::shared_ptr<NcclLoader> nccl_;
    std::once_flag once_;
    std::unique_ptr<sdk::Error> failure_;
    std::string driverVersion_;
    std::vector<GpuDeviceDescription> devices_;
};

} // namespace
} // namespace backplane::gpu

BACKPLANE_PLUGIN(backplane::gpu::GpuPlugin)
