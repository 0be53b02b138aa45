// RAII over the plugin's C table for conformance cases: each handle is released exactly once,
// through the table, in the order the case's scopes end (memory, streams, kernels before the
// device closes). Checked helpers fail the case with the plugin's message.
#pragma once

#include "suite.hpp"

#include <backplane/abi/caller.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace backplane::conformance {

/// A handle released exactly once through the table entry of its type (abi/caller.hpp).
using abi::Owned;

using Event = Owned<bp_event>;
using Stream = Owned<bp_stream>;
using Kernel = Owned<bp_kernel>;
/// A graph (ABI 1.3). Release it only after every launch of it completed, and before the pages
/// and kernels its ops name.
using Graph = Owned<bp_graph>;

/// One page with its size and host address (when mapped).
struct Page {
    Owned<bp_memory> memory;
    void *mapped = nullptr;
    uint64_t size = 0;
    bp_memory *get() const noexcept { return memory.get(); }
};

/// A kernel the suite ships in every dialect: y[i] = a * x[i] + y[i] for i < n.
struct SaxpyScalars {
    float a;
    uint32_t n;
};

/// The device under test, opened through device_open and closed through device_close.
class OpenDevice {
public:
    explicit OpenDevice(CaseContext &ctx);
    OpenDevice(const OpenDevice &) = delete;
    OpenDevice &operator=(const OpenDevice &) = delete;

    bp_device *get() const noexcept { return device_.get(); }
    const bp_plugin_api &api() const noexcept { return ctx_.api(); }

    /// Allocates a page of `kind`; fails the case when the plugin refuses.
    Page allocate(bp_memory_kind kind, uint64_t size);
    /// Allocates, or returns an empty Page when the plugin answers BP_ERROR_UNSUPPORTED for
    /// this kind (any other failure fails the case).
    Page allocateIfSupported(bp_memory_kind kind, uint64_t size);
    Stream createStream();
    /// stream_flush with an event (flags BP_FLUSH_*).
    Event flush(const Stream &stream, uint32_t flags = 0);
    /// Flushes and waits for everything recorded on `stream`.
    void finish(const Stream &stream);
    void wait(const Event &event);

    /// The transfers as the plugin answers them (for cases that expect a refusal).
    bp_status tryUpload(const Stream &stream, const Page &page, uint64_t offset, const void *data,
                        uint64_t size, bp_error &error);
    bp_status tryDownload(const Stream &stream, const Page &page, uint64_t offset, void *into,
                          uint64_t size, bp_error &error);
    bp_status tryCopy(const Stream &stream, const Page &src, uint64_t srcOffset, const Page &dst,
                      uint64_t dstOffset, uint64_t size, bp_error &error);
    bp_status tryFill(const Stream &stream, const Page &page, uint64_t offset, uint64_t size,
                      uint32_t pattern, bp_error &error);

    /// The same, failing the case when the plugin refuses.
    void upload(const Stream &stream, const Page &page, uint64_t offset, const void *data,
                uint64_t size);
    void download(const Stream &stream, const Page &page, uint64_t offset, void *into,
                  uint64_t size);
    void fill(const Stream &stream, const Page &page, uint64_t offset, uint64_t size,
              uint32_t pattern);
    /// Uploads `bytes` into a fresh DEVICE page and waits.
    Page pageWith(const Stream &stream, const std::vector<uint8_t> &bytes);
    /// Reads a whole page back (waits).
    std::vector<uint8_t> readAll(const Stream &stream, const Page &page);

    /// Compiles and loads saxpy in `dialect` (which the device must accept).
    Kernel saxpy(bp_dialect dialect);
    /// saxpy in the first dialect the device accepts that the suite has a kernel for;
    /// NotApplicable when there is none.
    Kernel saxpy();
    /// The dialect saxpy() uses.
    bp_dialect saxpyDialect() const;
    /// Records saxpy over n floats (x, y bound at the given offsets) with block size `block`.
    bp_status launchSaxpy(const Stream &stream, const Kernel &kernel, const Page &x, const Page &y,
                          float a, uint32_t n, bp_error &error, uint64_t xOffset = 0,
                          uint32_t block = 64);

private:
    CaseContext &ctx_;
    Owned<bp_device> device_; // device_close when the case ends
};

/// Launch arguments of saxpy over n floats (x bound at xOffset, y at 0, block `block`);
/// `bindings` and `scalars` are the storage the result points into.
bp_launch_args saxpyArgs(const Kernel &kernel, const Page &x, const Page &y, float a, uint32_t n,
                         uint32_t block, uint64_t xOffset, bp_binding (&bindings)[2],
                         SaxpyScalars &scalars);

/// Floats as bytes and back.
std::vector<uint8_t> floatBytes(const std::vector<float> &values);
std::vector<float> bytesToFloats(const std::vector<uint8_t> &bytes);
/// Deterministic bytes: byte i is a function of i and `seed`.
std::vector<uint8_t> patternBytes(size_t size, uint32_t seed);

/// Source of saxpy in `dialect` (text or, for HOST, a bp_host_kernel_source), its entry point.
struct KernelText {
    const void *source = nullptr;
    size_t size = 0;
    const char *entry = "";
};
KernelText saxpySource(bp_dialect dialect);

/// A host-dialect source (ABI 1.2 struct) for `function`, with no user data.
constexpr bp_host_kernel_source hostKernelSource(bp_host_kernel_fn function) {
    auto source = abi::make<bp_host_kernel_source>();
    source.function = function;
    return source;
}

/// Compiles `source`: returns the status; `binary` and `log` receive the sinks' output.
bp_status compileKernel(const OpenDevice &device, bp_dialect dialect, const KernelText &source,
                        std::vector<uint8_t> &binary, std::string &log, bp_error &error);

} // namespace backplane::conformance
