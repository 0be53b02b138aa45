#include <cuda.h>
#include <cstdio>
__global__ void bad(unsigned *p) { p[(1ull << 38) + threadIdx.x] = 1; }
__global__ void good(unsigned *p) { p[threadIdx.x] = threadIdx.x; }
#define P(x) do { CUresult r = (x); const char *n = ""; cuGetErrorName(r, &n); std::printf("%-60s -> %d %s\n", #x, (int)r, n); } while (0)
void state(CUdevice d) { unsigned f; int a; cuDevicePrimaryCtxGetState(d, &f, &a); std::printf("   state: active=%d\n", a); }
int main() {
  CUdevice d; CUcontext c1 = nullptr, c2 = nullptr, cur = nullptr;
  P(cuInit(0)); P(cuDeviceGet(&d, 0));
  P(cuDevicePrimaryCtxRetain(&c1, d)); P(cuCtxSetCurrent(c1)); state(d);
  unsigned *p; P(cuMemAlloc((CUdeviceptr *)&p, 4096));
  bad<<<1, 32>>>(p);
  P(cuCtxSynchronize()); state(d);
  P(cuCtxSetCurrent(nullptr));
  P(cuDevicePrimaryCtxReset(d)); state(d);
  P(cuCtxSetCurrent(c1)); P(cuCtxSynchronize()); P(cuCtxSetCurrent(nullptr));
  P(cuDevicePrimaryCtxRetain(&c2, d)); std::printf("   same handle: %d\n", c1 == c2); state(d);
  P(cuCtxSetCurrent(c2)); P(cuCtxSynchronize());
  unsigned *q; P(cuMemAlloc((CUdeviceptr *)&q, 4096));
  good<<<1, 32>>>(q); P(cuCtxSynchronize());
  unsigned h[32]; P(cuMemcpyDtoH(h, (CUdeviceptr)q, sizeof h)); std::printf("   h[31]=%u\n", h[31]);
  P(cuMemFree((CUdeviceptr)p));
  P(cuDevicePrimaryCtxRelease(d)); state(d);   // the first open's retain
  P(cuCtxGetCurrent(&cur)); P(cuMemAlloc((CUdeviceptr *)&p, 4096)); good<<<1,32>>>(q); P(cuCtxSynchronize());
  P(cuDevicePrimaryCtxRelease(d)); state(d);   // the second
  P(cuDevicePrimaryCtxRelease(d)); state(d);   // one too many
  return 0;
}
