// Runtime compilation of kernel sources (NVRTC / hiprtc) to a binary for one exact target.
#pragma once

#include "gpu_library.hpp"

#include <string>
#include <string_view>
#include <vector>

namespace backplane::gpu {

/// What to compile. `arch` is the exact target ("sm_90", "gfx90a"): the result is a CUBIN or an
/// AMD code object for that target only, never PTX.
struct CompileRequest {
    std::string_view source;
    std::string entryPoint;
    std::string arch;
    std::vector<std::string> options;
};

/// Compiles with the vendor's runtime compiler; needs no device, so the HIP tests call it for
/// AMD targets on machines without one. Fills out.log (also on failure) and out.binary. Throws
/// BP_ERROR_COMPILE naming the kernel and target with the head of the log, BP_ERROR_NO_DRIVER
/// when the compiler library is missing.
void compileSource(const bpv::Rtc &compiler, const CompileRequest &request,
                   sdk::CompileOutput &out);

} // namespace backplane::gpu
