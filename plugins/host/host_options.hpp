// Options of the host plugin, parsed from bp_plugin_init_args::options_json.
#pragma once

#include "fault_injection.hpp"

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

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
    /// "inject_faults": [{"device": 0, "operation": "launch", "nth": 3, "class": "sticky"}]:
    /// operations that fail on purpose, for tests of the failure paths (fault_injection.hpp).
    std::vector<InjectedFault> faults;
};

/// The schema of these options that the plugin publishes (bp_plugin_api::options_schema, ABI 1.5):
/// `backplane config check` validates a config against it, `backplane devices --options host`
/// prints it. Keep it in step with parseHostOptions (tests/host: every key it lists parses).
inline constexpr const char kHostOptionsSchema[] =
    R"schema({"type": "object", "additionalProperties": false, "properties": {"devices": {"type": "integer", "minimum": 1, "maximum": 64, "default": 1, "description": "number of identical host devices (host:0, host:1, ...), for peer copies and collectives on one machine"},"memory_bytes": {"type": "integer", "minimum": 1, "maximum": 9223372036854775807, "description": "cap on the bytes allocated per device (default: the physical RAM)"},"mode": {"type": "string", "enum": ["async", "sync"], "default": "async", "description": "async: a worker thread per stream; sync: every operation runs inline on the calling thread"},"workers": {"type": "integer", "minimum": 1, "maximum": 1024, "description": "threads that run the workgroups of one launch (default: min(hardware threads, 4))"},"disable_types": {"type": "array", "items": {"type": "string", "enum": ["i8", "u8", "i16", "u16", "i64", "u64", "f16", "bf16", "f64"]}, "default": [], "description": "element types removed from the kernel features, to fake a smaller device"},"matrix_units": {"type": "boolean", "default": true, "description": "false: report no matrix-unit shapes (a device without them)"},"compile_kernels": {"type": "boolean", "default": true, "description": "false: run portable kernels in the interpreter instead of compiling them with the system's C++ compiler"},"compiler": {"type": "string", "maxLength": 4095, "description": "the C++ compiler's name (looked up on PATH) or path (default: BACKPLANE_HOST_CXX, else c++, g++ or clang++ on PATH)"},"inject_faults": {"type": "array", "maxItems": 64, "default": [], "description": "operations that fail on purpose, for tests of failure handling: the nth launch, copy, fill, collective or replay on a device index fails once, sticky (the opened device is lost) or refused (only that call fails)", "items": {"type": "object", "additionalProperties": false, "required": ["operation", "nth"], "properties": {  "device": {"type": "integer", "minimum": 0, "maximum": 63, "default": 0},  "operation": {"type": "string", "enum": ["launch", "copy", "fill", "collective", "replay"]},  "nth": {"type": "integer", "minimum": 1, "maximum": 9223372036854775807},  "class": {"type": "string", "enum": ["sticky", "refused"], "default": "sticky"}}}},"collectives": {"type": "object", "additionalProperties": false, "description": "where the Gloo communicators connect", "properties": {  "address": {"type": "string", "maxLength": 255, "description": "address the rendezvous store and Gloo bind (BACKPLANE_GLOO_ADDRESS overrides it)"},  "interface": {"type": "string", "maxLength": 255, "description": "network interface Gloo's TCP device binds to (BACKPLANE_GLOO_INTERFACE overrides it)"},  "module": {"type": "string", "maxLength": 4095, "description": "the Gloo module's file (default: libbackplane_host_gloo.so next to the plugin; BACKPLANE_GLOO_MODULE overrides it)"}}}}})schema";

/// Parses the options JSON text. Throws sdk::Error(BP_ERROR_INVALID_ARGUMENT) whose message names
/// the offending key and the values it accepts.
HostOptions parseHostOptions(std::string_view json);

} // namespace backplane::host
