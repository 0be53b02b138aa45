// What a compute kernel's SPIR-V asks of a launch, reflected with SPIRV-Cross at kernel_load.
#pragma once

#include <backplane/abi/plugin_sdk.hpp>

#include <cstddef>
#include <cstdint>
#include <string>

namespace backplane::vulkan {

/// The launch interface of one compute entry point, as the plugin binds it: storage buffers of
/// descriptor set 0 (launch binding i is binding i) and one push-constant block (the scalars).
/// Only what the entry point uses counts (SPIRV-Cross's active variables): the optimizer drops
/// unused buffers and blocks anyway, so a module compiled with or without -O asks the same.
struct ShaderInterface {
    std::string entryPoint;         ///< the OpEntryPoint the pipeline uses
    uint32_t bindingCount = 0;      ///< highest set-0 storage-buffer binding used, plus one
    uint32_t pushConstantBytes = 0; ///< declared size of the push-constant block; 0: none used
};

/// Reflects `spirv` (a SPIR-V module whose header was validated; `size` in bytes, a multiple of
/// 4) for the GLCompute entry point `entryPoint`. With `anyEntryPoint` (GLSL input, whose entry
/// point is always "main" whatever the kernel is called) a module with a single compute entry
/// point is taken under any name. `what` starts every message ("kernel_load of 'name'").
/// Throws sdk::Error: BP_ERROR_INVALID_ARGUMENT when SPIRV-Cross cannot parse the module,
/// BP_ERROR_NOT_FOUND when no compute entry point matches (the message lists those there are),
/// BP_ERROR_UNSUPPORTED when the entry point uses anything the plugin cannot bind (uniform
/// buffers, images, samplers, other descriptor sets, arrays of buffers).
ShaderInterface reflectComputeShader(const void *spirv, size_t size, const std::string &entryPoint,
                                     bool anyEntryPoint, const std::string &what);

} // namespace backplane::vulkan
