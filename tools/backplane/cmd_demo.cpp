// `backplane demo`: select a device, say why, run saxpy + a reduction, check against the CPU.
#include "commands.hpp"

#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <vector>

namespace backplane::tool {
namespace {

struct SaxpyScalars {
    float a;
    uint32_t n;
};
struct SumScalars {
    uint32_t n;
    uint32_t perGroup;
};

void saxpyHost(const bp_host_kernel_context *c) {
    const auto *s = static_cast<const SaxpyScalars *>(c->scalars);
    const auto *x = static_cast<const float *>(c->buffers[0]);
    auto *y = static_cast<float *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < s->n) y[i] = s->a * x[i] + y[i];
    }
}

// Partial sums: workgroup g adds elements [g*perGroup, (g+1)*perGroup) into partial[g].
void partialSumHost(const bp_host_kernel_context *c) {
    const auto *s = static_cast<const SumScalars *>(c->scalars);
    const auto *y = static_cast<const float *>(c->buffers[0]);
    auto *partial = static_cast<float *>(c->buffers[1]);
    const uint32_t begin = c->workgroup[0] * s->perGroup;
    double sum = 0;
    for (uint32_t i = begin; i < begin + s->perGroup && i < s->n; ++i) sum += y[i];
    partial[c->workgroup[0]] = static_cast<float>(sum);
}

constexpr const char *kSaxpyGlsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer X { float x[]; };
layout(set = 0, binding = 1) buffer Y { float y[]; };
layout(push_constant) uniform Scalars { float a; uint n; } s;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < s.n) y[i] = s.a * x[i] + y[i];
}
)";

constexpr const char *kSaxpyCuda = R"(
struct SaxpyScalars { float a; unsigned int n; };
extern "C" __global__ void saxpy(const float *x, float *y, SaxpyScalars s) {
    unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < s.n) y[i] = s.a * x[i] + y[i];
}
)";

// One thread per workgroup walks its range: simple and the same in every dialect.
constexpr const char *kSumGlsl = R"(#version 450
layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;
layout(set = 0, binding = 0) readonly buffer Y { float y[]; };
layout(set = 0, binding = 1) buffer P { float partial[]; };
layout(push_constant) uniform Scalars { uint n; uint perGroup; } s;
void main() {
    if (gl_LocalInvocationID.x != 0) return;
    uint begin = gl_WorkGroupID.x * s.perGroup;
    float sum = 0.0;
    for (uint i = begin; i < begin + s.perGroup && i < s.n; ++i) sum += y[i];
    partial[gl_WorkGroupID.x] = sum;
}
)";

constexpr const char *kSumCuda = R"(
struct SumScalars { unsigned int n; unsigned int perGroup; };
extern "C" __global__ void partial_sum(const float *y, float *partial, SumScalars s) {
    if (threadIdx.x != 0) return;
    unsigned int begin = blockIdx.x * s.perGroup;
    float sum = 0.0f;
    for (unsigned int i = begin; i < begin + s.perGroup && i < s.n; ++i) sum += y[i];
    partial[blockIdx.x] = sum;
}
)";

KernelSource saxpyKernel() {
    return {"saxpy",
            {KernelVariant::host(&saxpyHost, "saxpy"),
             KernelVariant::text(Dialect::Cuda, "saxpy", kSaxpyCuda),
             KernelVariant::text(Dialect::Hip, "saxpy", kSaxpyCuda),
             KernelVariant::text(Dialect::Glsl, "main", kSaxpyGlsl)}};
}

KernelSource sumKernel() {
    return {"partial_sum",
            {KernelVariant::host(&partialSumHost, "partial_sum"),
             KernelVariant::text(Dialect::Cuda, "partial_sum", kSumCuda),
             KernelVariant::text(Dialect::Hip, "partial_sum", kSumCuda),
             KernelVariant::text(Dialect::Glsl, "main", kSumGlsl)}};
}

double msSince(std::chrono::steady_clock::time_point start) {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
        .count();
}

} // namespace

int runDemo(const Args &args) {
    std::string selector;
    for (size_t i = 0; i < args.size(); ++i) {
        if (args[i] == "--device" && i + 1 < args.size()) {
            selector = args[++i];
        } else {
            std::fprintf(stderr, "usage: backplane demo [--device SELECTOR]\n");
            return 2;
        }
    }
    try {
        Runtime runtime;
        const Selection selection = runtime.select(selector);
        for (const std::string &r : selection.rejected) std::printf("not used: %s\n", r.c_str());
        std::printf("device: %s %s\nwhy:    %s\n", selection.device.id().c_str(),
                    selection.device.name.c_str(), selection.reason.c_str());
        ComputeClient client = runtime.open(selection);

        const uint32_t n = 1u << 20;
        const float a = 2.5f;
        std::vector<float> x(n), y(n);
        for (uint32_t i = 0; i < n; ++i) {
            x[i] = static_cast<float>(i % 1024) * 0.25f;
            y[i] = static_cast<float>(i % 7) - 3.0f;
        }
        const auto start = std::chrono::steady_clock::now();
        Buffer bx = client.createFrom<float>(x), by = client.createFrom<float>(y);
        Dispatch saxpy;
        saxpy.block = {256, 1, 1};
        saxpy.grid = {(n + 255) / 256, 1, 1};
        saxpy.bindings = {bx, by};
        saxpy.scalar(SaxpyScalars{a, n});
        client.execute(saxpyKernel(), saxpy);

        const uint32_t groups = 256, perGroup = (n + groups - 1) / groups;
        Buffer partial = client.empty(groups * sizeof(float));
        Dispatch sum;
        sum.block = {64, 1, 1};
        sum.grid = {groups, 1, 1};
        sum.bindings = {by, partial};
        sum.scalar(SumScalars{n, perGroup});
        client.execute(sumKernel(), sum);

        const std::vector<float> result = client.readAs<float>(by);
        const std::vector<float> partials = client.readAs<float>(partial);
        const double elapsed = msSince(start);

        size_t wrong = 0;
        double cpuSum = 0, gpuSum = 0;
        for (uint32_t i = 0; i < n; ++i) {
            const float expected = a * x[i] + y[i];
            if (std::fabs(result[i] - expected) > 1e-5f * std::fabs(expected) + 1e-6f) ++wrong;
            cpuSum += expected;
        }
        for (float p : partials) gpuSum += p;
        const bool sumOk = std::fabs(gpuSum - cpuSum) <= 1e-4 * std::fabs(cpuSum) + 1.0;
        std::printf("saxpy over %u floats: %zu mismatches\n", n, wrong);
        std::printf("sum: device %.3f, cpu %.3f\n", gpuSum, cpuSum);
        const bool pass = wrong == 0 && sumOk;
        std::printf("%s in %.2f ms (upload, 2 kernels, download; first run includes compile)\n",
                    pass ? "PASS" : "FAIL", elapsed);
        return pass ? 0 : 1;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane demo: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
