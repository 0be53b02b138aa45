// Driver: one opened device behind the plugin's C table, with move-only owners for its handles.
#pragma once

#include "plugin/plugin_library.hpp"

#include <backplane/device.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace backplane::detail {

class Driver;

/// Owns one handle of a Driver and releases it exactly once. Move-only; keeps the Driver (and so
/// the plugin library) alive while it lives.
template <class Handle, void (*Release)(Driver &, Handle *)> class DriverHandle {
public:
    DriverHandle() = default;
    DriverHandle(std::shared_ptr<Driver> driver, Handle *handle)
        : driver_(std::move(driver)), handle_(handle) {}
    ~DriverHandle() { reset(); }
    DriverHandle(DriverHandle &&other) noexcept
        : driver_(std::move(other.driver_)), handle_(std::exchange(other.handle_, nullptr)) {}
    DriverHandle &operator=(DriverHandle &&other) noexcept {
        if (this != &other) {
            reset();
            driver_ = std::move(other.driver_);
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    DriverHandle(const DriverHandle &) = delete;
    DriverHandle &operator=(const DriverHandle &) = delete;

    Handle *get() const noexcept { return handle_; }
    /// Gives up ownership: the caller now releases the handle.
    Handle *release() noexcept {
        driver_.reset();
        return std::exchange(handle_, nullptr);
    }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    void reset() {
        if (handle_ != nullptr) Release(*driver_, handle_);
        handle_ = nullptr;
        driver_.reset();
    }

private:
    std::shared_ptr<Driver> driver_;
    Handle *handle_ = nullptr;
};

void releaseMemory(Driver &driver, bp_memory *memory);
void releaseStream(Driver &driver, bp_stream *stream);
void releaseEvent(Driver &driver, bp_event *event);
void releaseKernel(Driver &driver, bp_kernel *kernel);
void releaseComm(Driver &driver, bp_comm *comm);
void releaseGraph(Driver &driver, bp_graph *graph);

using StreamOwner = DriverHandle<bp_stream, &releaseStream>;
using EventOwner = DriverHandle<bp_event, &releaseEvent>;
using KernelOwner = DriverHandle<bp_kernel, &releaseKernel>;
using CommOwner = DriverHandle<bp_comm, &releaseComm>;
using GraphOwner = DriverHandle<bp_graph, &releaseGraph>;

/// One page of plugin memory and its host address (pinned / host-visible pages).
struct MemoryPage {
    DriverHandle<bp_memory, &releaseMemory> memory;
    void *mapped = nullptr;
    uint64_t size = 0;
    bp_memory_kind kind = BP_MEMORY_DEVICE;
};

/// Result of a kernel compile: the blob and the compiler log.
struct CompiledKernel {
    std::vector<unsigned char> binary;
    std::string log;
};

/// One opened device. Every call checks its status and throws backplane::Error through
/// detail::throwStatus; optional functions are checked with PluginLibrary::has() so an older
/// plugin without them works (Unsupported is thrown only when the feature is actually used).
/// Thread-safety: as the ABI says (device calls from any thread; one thread per stream).
class Driver : public std::enable_shared_from_this<Driver> {
public:
    /// Opens device `info.index` of `plugin`. Throws Error.
    static std::shared_ptr<Driver> open(std::shared_ptr<PluginLibrary> plugin,
                                        const DeviceInfo &info);
    ~Driver();
    Driver(const Driver &) = delete;
    Driver &operator=(const Driver &) = delete;

    const DeviceInfo &info() const noexcept { return info_; }
    const PluginLibrary &plugin() const noexcept { return *plugin_; }
    const std::shared_ptr<PluginLibrary> &pluginShared() const noexcept { return plugin_; }
    const bp_plugin_api &api() const noexcept { return plugin_->api(); }
    bp_device *device() const noexcept { return device_; }
    bool hasCapability(uint32_t bit) const noexcept { return (info_.capabilities & bit) != 0; }

    MemoryPage allocate(bp_memory_kind kind, uint64_t size);
    StreamOwner createStream();
    /// Submits the stream; returns an event when `wantEvent`.
    EventOwner flush(bp_stream *stream, bool wantEvent, bool timing = false);
    void waitEvent(bp_stream *stream, bp_event *event);
    void eventWait(bp_event *event);
    /// Waits at most `timeoutNs`; false when it ran out (the work is still pending).
    bool eventWaitFor(bp_event *event, uint64_t timeoutNs);
    bool eventQuery(bp_event *event);
    uint64_t elapsedNs(bp_event *start, bp_event *end);

    void copyHostToDevice(bp_stream *stream, const void *src, bp_memory *dst, uint64_t dstOffset,
                          uint64_t size);
    void copyDeviceToHost(bp_stream *stream, bp_memory *src, uint64_t srcOffset, void *dst,
                          uint64_t size);
    void copyDeviceToDevice(bp_stream *stream, bp_memory *src, uint64_t srcOffset, bp_memory *dst,
                            uint64_t dstOffset, uint64_t size);
    void fill(bp_stream *stream, bp_memory *dst, uint64_t offset, uint64_t size, uint32_t pattern);
    /// Copies from `source`'s memory (a device of the same plugin instance) on `stream` of this one.
    void copyPeer(bp_stream *stream, const Driver &source, bp_memory *src, uint64_t srcOffset,
                  bp_memory *dst, uint64_t dstOffset, uint64_t size);
    /// Whether copyPeer from `source` works and the two accept each other's events (ABI 1.1;
    /// false for another plugin instance or a plugin without device_peer_access).
    bool peerAccess(const Driver &source);

    // collectives (ABI 1.1)
    bool hasCollectives() const noexcept;
    /// A new communicator id (plugin-level).
    std::vector<std::byte> commIdCreate();
    CommOwner commCreate(std::span<const std::byte> id, uint32_t rank, uint32_t size,
                         uint64_t timeoutMs);
    void commAbort(bp_comm *comm);
    void commGroup(bool begin);
    void collective(bp_stream *stream, bp_comm *comm, const bp_collective_args &args);

    /// Compiles; on failure throws Error(Compile) naming `kernelName` with the compiler log.
    CompiledKernel compile(const std::string &kernelName, bp_dialect dialect,
                           const std::string &entryPoint, const void *source, size_t sourceSize,
                           const std::vector<std::string> &options);
    KernelOwner load(const std::string &kernelName, bp_dialect dialect,
                     const std::string &entryPoint, const void *binary, size_t size);
    void launch(bp_stream *stream, const bp_launch_args &args, const std::string &kernelName);

    uint64_t nativeHandle(bp_native_kind kind, const void *object);

    // recorded sequences (ABI 1.3)
    /// The plugin's graph of `ops`, or an empty owner when the plugin has none for them
    /// (no graph_create, or BP_ERROR_UNSUPPORTED: `why` then says which). Other failures throw.
    GraphOwner graphCreate(std::span<const bp_graph_op> ops, std::string &why);
    void graphLaunch(bp_stream *stream, bp_graph *graph);
    /// Replaces op `index`; false when the plugin cannot change the graph in place.
    bool graphUpdate(bp_graph *graph, uint32_t index, const bp_graph_op &op);

    // host registration (ABI 1.3)
    /// Registers the application's [host, host + size) as a pinned page mapped at `host`; freeing
    /// the page unregisters it. Error(Unsupported) naming the plugin when it has no
    /// memory_register or cannot register; the plugin's other errors as usual.
    MemoryPage registerHost(void *host, uint64_t size);

    /// Whether a call reported BP_ERROR_DEVICE_LOST (the plugin's sticky failure), and the
    /// first such message. One load while nothing failed.
    bool lost() const noexcept { return lost_.load(std::memory_order_acquire); }
    std::string lostReason() const;

private:
    Driver() = default;
    /// Throws the status as Error; BP_ERROR_DEVICE_LOST also marks the driver lost.
    [[noreturn]] void fail(bp_status status, const bp_error &error, const std::string &what) const;

    std::shared_ptr<PluginLibrary> plugin_;
    DeviceInfo info_;
    bp_device *device_ = nullptr;
    mutable std::atomic<bool> lost_{false};
    mutable std::mutex lostMutex_;
    mutable std::string lostReason_;
};

} // namespace backplane::detail
