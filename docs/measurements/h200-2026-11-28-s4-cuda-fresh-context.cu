#include <cuda.h>
#include <cstdio>
__global__ void bad(unsigned *p) { p[(1ull << 38) + threadIdx.x] = 1; }
__global__ void good(unsigned *p) { p[threadIdx.x] = threadIdx.x; }
#define P(x) do { CUresult r = (x); const char *n = ""; cuGetErrorName(r, &n); std::printf("%-60s -> %d %s\n", #x, (int)r, n); } while (0)
int main() {
  CUdevice d; CUcontext c1 = nullptr, c3 = nullptr;
  P(cuInit(0)); P(cuDeviceGet(&d, 0));
  P(cuDevicePrimaryCtxRetain(&c1, d)); P(cuCtxSetCurrent(c1));
  unsigned *p; P(cuMemAlloc((CUdeviceptr *)&p, 4096));
  bad<<<1, 32>>>(p);
  P(cuCtxSynchronize());
  P(cuCtxSetCurrent(nullptr));
  P(cuCtxCreate(&c3, nullptr, 0, d));
  P(cuCtxSetCurrent(c3)); P(cuCtxSynchronize());
  unsigned *q; P(cuMemAlloc((CUdeviceptr *)&q, 4096));
  good<<<1, 32>>>(q); P(cuCtxSynchronize());
  unsigned h[32] = {}; P(cuMemcpyDtoH(h, (CUdeviceptr)q, sizeof h)); std::printf("   h[31]=%u\n", h[31]);
  P(cuCtxDestroy(c3));
  P(cuDevicePrimaryCtxRelease(d));
  P(cuDevicePrimaryCtxReset(d));
  CUcontext c4; P(cuDevicePrimaryCtxRetain(&c4, d)); P(cuCtxSetCurrent(c4)); P(cuCtxSynchronize());
  return 0;
}
