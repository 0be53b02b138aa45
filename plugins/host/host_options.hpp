// Options of the host plugin, parsed from bp_plugin_init_args::options_json.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace backplane::host {

/// The settings a config file may give the host plugin under `plugins.options.host`.
struct HostOptions {
    /// Number of identical host devices to expose ("devices"); > 1 is useful for peer copies.
    uint32_t devices = 1;
    /// Cap on the bytes allocated per device ("memory_bytes"); 0 means the physical RAM.
    uint64_t memoryBytes = 0;
    /// "async" (default): each stream is a worker thread. "sync": every operation runs inline on
    /// the calling thread and the device does not declare BP_CAPABILITY_ASYNC_STREAMS.
    bool async = true;
    /// Threads that run the workgroups of one launch ("workers"); 0 means min(hardware, 4).
    uint32_t workers = 0;
    /// "collectives": {"address": "..."}: the address the rendezvous store binds and advertises
    /// in communicator ids, and Gloo's TCP device binds; "" picks one (see host_comm.hpp).
    std::string collectivesAddress;
    /// "collectives": {"interface": "..."}: the network interface Gloo's TCP device binds to
    /// (overrides the address for Gloo's own connections); "" for none.
    std::string collectivesInterface;
    /// "collectives": {"module": "..."}: the Gloo module's file (gloo_loader.hpp); "" for the
    /// one next to the plugin. BACKPLANE_GLOO_MODULE overrides it.
    std::string collectivesModule;
    /// "disable_types": ["f64", "i64", ...]: element types (bp_element_type's names: "bool",
    /// "i8", "u8", "i16", "u16", "i32", "u32", "i64", "u64", "f16", "bf16", "f32", "f64") cleared
    /// from every kernel-feature mask, to fake a smaller device; bool, i32, u32 and f32 cannot
    /// be disabled (every device has them). Mask of (1u << bp_element_type).
    uint32_t disabledTypes = 0;
    /// "matrix_units": false reports no matrix-unit shapes (a device without them); default true.
    bool matrixUnits = true;
    /// "compile_kernels": false runs portable kernels in the core's interpreter instead of
    /// compiling them with the system's C++ compiler (host_compiler.hpp); default true.
    bool compileKernels = true;
    /// "compiler": the C++ compiler's name (looked up on PATH) or path; "" for
    /// BACKPLANE_HOST_CXX, else the first of c++, g++, clang++ on PATH.
    std::string compiler;
};

/// Parses the options JSON text. Throws sdk::Error(BP_ERROR_INVALID_ARGUMENT) whose message names
/// the offending key and the values it accepts.
HostOptions parseHostOptions(std::string_view json);

} // namespace backplane::host
