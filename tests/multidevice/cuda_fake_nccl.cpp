// A stand-in for libnccl.so.2 for the CUDA plugin's loader tests (tests/multidevice/
// cuda_nccl_loader.cpp): the entry points the plugin resolves, with the NCCL C signatures, that
// report FAKE_NCCL_VERSION and hand out a recognisable id. Built three ways by meson: a current
// NCCL, one too old (2.7.8), and one without ncclSend (FAKE_NCCL_WITHOUT_SEND).
#include <cstddef>
#include <cstring>

#ifndef FAKE_NCCL_VERSION
#error "define FAKE_NCCL_VERSION (ncclGetVersion's code)"
#endif

extern "C" {

struct FakeComm;
using FakeResult = int;
struct FakeUniqueId {
    char internal[128];
};
constexpr FakeResult kSuccess = 0;
constexpr FakeResult kInvalidUsage = 5;

#define FAKE_EXPORT __attribute__((visibility("default")))

FAKE_EXPORT FakeResult ncclGetVersion(int *version) {
    if (version == nullptr) return 4;
    *version = FAKE_NCCL_VERSION;
    return kSuccess;
}
/// Byte i of the id is (i * 7 + 3) mod 256: the test recognises it.
FAKE_EXPORT FakeResult ncclGetUniqueId(FakeUniqueId *id) {
    for (size_t i = 0; i < sizeof id->internal; ++i)
        id->internal[i] = static_cast<char>((i * 7 + 3) % 256);
    return kSuccess;
}
FAKE_EXPORT const char *ncclGetErrorString(FakeResult) { return "fake NCCL error"; }
// Nothing below is called by the loader tests (there is no device to make a communicator on).
FAKE_EXPORT FakeResult ncclCommInitRank(FakeComm **, int, FakeUniqueId, int) {
    return kInvalidUsage;
}
FAKE_EXPORT FakeResult ncclCommDestroy(FakeComm *) { return kInvalidUsage; }
FAKE_EXPORT FakeResult ncclCommAbort(FakeComm *) { return kInvalidUsage; }
FAKE_EXPORT FakeResult ncclCommGetAsyncError(FakeComm *, FakeResult *) { return kInvalidUsage; }
FAKE_EXPORT FakeResult ncclGroupStart() { return kSuccess; }
FAKE_EXPORT FakeResult ncclGroupEnd() { return kSuccess; }
FAKE_EXPORT FakeResult ncclAllReduce(const void *, void *, size_t, int, int, FakeComm *, void *) {
    return kInvalidUsage;
}
FAKE_EXPORT FakeResult ncclReduce(const void *, void *, size_t, int, int, int, FakeComm *, void *) {
    return kInvalidUsage;
}
FAKE_EXPORT FakeResult ncclBroadcast(const void *, void *, size_t, int, int, FakeComm *, void *) {
    return kInvalidUsage;
}
FAKE_EXPORT FakeResult ncclAllGather(const void *, void *, size_t, int, FakeComm *, void *) {
    return kInvalidUsage;
}
FAKE_EXPORT FakeResult ncclReduceScatter(const void *, void *, size_t, int, int, FakeComm *,
                                         void *) {
    return kInvalidUsage;
}
#ifndef FAKE_NCCL_WITHOUT_SEND
FAKE_EXPORT FakeResult ncclSend(const void *, size_t, int, int, FakeComm *, void *) {
    return kInvalidUsage;
}
#endif
FAKE_EXPORT FakeResult ncclRecv(void *, size_t, int, int, FakeComm *, void *) {
    return kInvalidUsage;
}

} // extern "C"
