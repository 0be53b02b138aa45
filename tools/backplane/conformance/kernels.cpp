// The suite's kernels: saxpy in every dialect the in-tree plugins accept, each following its
// plugin family's launch convention (docs/plugin-abi.md, "Kernels"): bindings in order, then the
// scalar bytes (a CUDA/HIP struct parameter, GLSL push constants, the host context's scalars).
// CUDA, HIP and GLSL are the portable kernel's generated sources; the host dialect keeps a native
// function on purpose: it is what the raw host dialect is (a function pointer, no interpreter).
#include "handles.hpp"

#include <backplane/kernels.hpp>

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

const bp_host_kernel_source kSaxpyHost = hostKernelSource(&saxpyHost);

/// The portable saxpy (backplane/kernels.hpp): its generated CUDA, HIP and GLSL take the same
/// launch as the native host function above (x, y, then {float a; uint n}).
const lang::Kernel &portableSaxpy() {
    static const lang::Kernel kernel = kernels::saxpy();
    return kernel;
}

KernelText portableText(Dialect dialect) {
    for (const KernelVariant &v : portableSaxpy().source().variants)
        if (v.dialect == dialect) return {v.source.data(), v.source.size(), v.entryPoint.c_str()};
    throw NotApplicable(std::string("the portable saxpy has no ") + toString(dialect) + " variant");
}

} // namespace

KernelText saxpySource(bp_dialect dialect) {
    switch (dialect) {
    case BP_DIALECT_HOST: return {&kSaxpyHost, sizeof(kSaxpyHost), "saxpy"};
    case BP_DIALECT_GLSL: return portableText(Dialect::Glsl);
    case BP_DIALECT_CUDA: return portableText(Dialect::Cuda);
    case BP_DIALECT_HIP: return portableText(Dialect::Hip);
    case BP_DIALECT_CPP: return portableText(Dialect::Cpp);
    default: throw NotApplicable("the suite has no saxpy in dialect " + std::to_string(dialect));
    }
}

} // namespace backplane::conformance
