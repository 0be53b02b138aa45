// Run-time loading of the vendor driver and compiler libraries, and vendor error translation.
#pragma once

// The vendor header comes from the include path, not from this directory: the HIP build puts
// plugins/hip first so the same sources compile against the HIP mapping. Quoted includes would
// find plugins/cuda/vendor.hpp next to this file first, hence the angle brackets.
#include <vendor.hpp>

#include <backplane/abi/plugin_sdk.hpp>

namespace backplane::gpu {

/// The driver's function table, loaded on first use and kept for the life of the process (vendor
/// libraries start threads that an unload would pull out from under them). Throws sdk::Error
/// BP_ERROR_NO_DRIVER naming the library and the loader's message. Thread-safe.
const bpv::Driver &driver();

/// The runtime compiler's function table (NVRTC / hiprtc), same rules. Throws BP_ERROR_NO_DRIVER
/// "NVRTC not found (...)" when it is missing: devices work, only kernel_compile fails.
const bpv::Rtc &rtc();

/// THE translation of a failed vendor call into the SDK's error: names the call, the vendor's
/// error name and text, and keeps the vendor code. Out of memory -> BP_ERROR_OUT_OF_MEMORY,
/// sticky errors -> BP_ERROR_DEVICE_LOST, "no device" -> BP_ERROR_NO_DEVICE, a rejected launch
/// configuration -> BP_ERROR_LAUNCH when `fallback` is BP_ERROR_LAUNCH, else `fallback`.
sdk::Error toError(const bpv::Driver &d, const bpv::Call &call,
                   bp_status fallback = BP_ERROR_INTERNAL);

/// Throws toError(...) when the call failed.
inline void check(const bpv::Driver &d, const bpv::Call &call,
                  bp_status fallback = BP_ERROR_INTERNAL) {
    if (!call.ok()) throw toError(d, call, fallback);
}

} // namespace backplane::gpu
