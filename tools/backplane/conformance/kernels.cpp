// The suite's kernels: saxpy in every dialect the in-tree plugins accept, each following its
// plugin family's launch convention (docs/plugin-abi.md, "Kernels"): bindings in order, then the
// scalar bytes (a CUDA/HIP struct parameter, GLSL push constants, the host context's scalars).
#include "handles.hpp"

#include <cstring>

namespace backplane::conformance {
namespace {

void saxpyHost(const bp_host_kernel_context *c) {
    SaxpyScalars s;
    std::memcpy(&s, c->scalars, sizeof(s));
    const auto *x = static_cast<const float *>(c->buffers[0]);
    auto *y = static_cast<float *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < s.n) y[i] = s.a * x[i] + y[i];
    }
}

const bp_host_kernel_source kSaxpyHost = {sizeof(bp_host_kernel_source), &saxpyHost};

constexpr const char kSaxpyGlsl[] = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Scalars { float a; uint n; } s;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < s.n) y[i] = s.a * x[i] + y[i];
}
)";

constexpr const char kSaxpyCuda[] = R"(
struct SaxpyScalars { float a; unsigned int n; };
extern "C" __global__ void saxpy(const float *x, float *y, SaxpyScalars s) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < s.n) y[i] = s.a * x[i] + y[i];
}
)";

} // namespace

KernelText saxpySource(bp_dialect dialect) {
    switch (dialect) {
    case BP_DIALECT_HOST: return {&kSaxpyHost, sizeof(kSaxpyHost), "saxpy"};
    case BP_DIALECT_GLSL: return {kSaxpyGlsl, sizeof(kSaxpyGlsl) - 1, "main"};
    case BP_DIALECT_CUDA:
    case BP_DIALECT_HIP: return {kSaxpyCuda, sizeof(kSaxpyCuda) - 1, "saxpy"};
    default: throw NotApplicable("the suite has no saxpy in dialect " + std::to_string(dialect));
    }
}

} // namespace backplane::conformance
