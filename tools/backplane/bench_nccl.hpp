// The raw NCCL all-reduce that `backplane bench` compares the CUDA plugin's collectives with.
#pragma once

#include <cstdint>
#include <string>

namespace backplane::tool {

/// One raw NCCL all-reduce measurement.
struct RawNcclAllReduce {
    std::string library;     ///< what was passed to dlopen
    std::string version;     ///< ncclGetVersion, "2.28.9"
    uint32_t devices = 0;    ///< ranks: every CUDA device of the machine, one rank each
    uint64_t bytes = 0;      ///< reduced per rank
    uint32_t iterations = 0; ///< timed all-reduces (after the warm-up ones)
    double seconds = 0;      ///< wall time per all-reduce, every rank's stream finished
    double busBandwidth = 0; ///< GB/s: bytes * 2 * (devices - 1) / devices / seconds / 1e9
};

/// Raw NCCL all-reduce (f32 sum, out of place) over every CUDA device of the machine in this
/// process: ncclCommInitAll, then per iteration one ncclGroupStart / ncclAllReduce per device /
/// ncclGroupEnd from this thread, on one non-blocking stream per device in its primary context
/// (the context the CUDA plugin uses). No backplane code in between: libcuda.so.1 and NCCL are
/// opened with dlopen, so the tool links neither. `ncclLibrary`: a path or soname; "" means
/// $BACKPLANE_NCCL_LIBRARY, else "libnccl.so.2". `bytes` must be a multiple of 4. Sets
/// NCCL_NVLS_ENABLE=0 unless the environment already sets it. Throws std::runtime_error saying
/// what is missing (CUDA driver, a second GPU, NCCL) or which call failed.
RawNcclAllReduce runRawNcclAllReduce(const std::string &ncclLibrary = "",
                                     uint64_t bytes = uint64_t{256} << 20, uint32_t iterations = 20,
                                     uint32_t warmup = 5);

} // namespace backplane::tool
