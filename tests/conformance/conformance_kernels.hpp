// Saxpy in every dialect (HOST, GLSL, CUDA, HIP) for the C++ tests that need a kernel per plugin.
#pragma once

#include <backplane/kernel.hpp>

namespace conformance {

/// Scalars of saxpy, as every dialect sees them: {float a; uint32 n}.
struct SaxpyScalars {
    float a;
    uint32_t n;
};

inline void saxpyHost(const bp_host_kernel_context *c) {
    const auto *s = static_cast<const SaxpyScalars *>(c->scalars);
    const auto *x = static_cast<const float *>(c->buffers[0]);
    auto *y = static_cast<float *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < s->n) y[i] = s->a * x[i] + y[i];
    }
}

inline constexpr const char *kSaxpyGlsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Scalars { float a; uint n; } s;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < s.n) y[i] = s.a * x[i] + y[i];
}
)";

inline constexpr const char *kSaxpyCuda = R"(
struct SaxpyScalars { float a; unsigned int n; };
extern "C" __global__ void saxpy(const float *x, float *y, SaxpyScalars s) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < s.n) y[i] = s.a * x[i] + y[i];
}
)";

/// y = a*x + y with variants for every dialect the in-tree plugins accept.
inline backplane::KernelSource saxpyKernel() {
    using backplane::Dialect;
    using backplane::KernelVariant;
    return {"saxpy",
            {KernelVariant::host(&saxpyHost, "saxpy"),
             KernelVariant::text(Dialect::Cuda, "saxpy", kSaxpyCuda),
             KernelVariant::text(Dialect::Hip, "saxpy", kSaxpyCuda),
             KernelVariant::text(Dialect::Glsl, "main", kSaxpyGlsl)}};
}

inline backplane::Dispatch saxpyDispatch(const backplane::Buffer &x, const backplane::Buffer &y,
                                         float a, uint32_t n) {
    backplane::Dispatch d;
    d.block = {256, 1, 1};
    d.grid = {(n + 255) / 256, 1, 1};
    d.bindings = {x, y};
    d.scalar(SaxpyScalars{a, n});
    return d;
}

} // namespace conformance
