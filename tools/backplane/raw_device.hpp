// RawDevice: one device of a RawPlugin for the raw-ABI benchmarks: checked calls, owned handles.
#pragma once

// The benchmarks' "raw" side calls the plugin's C table with nothing in between: no pools, no
// alignment, no scheduler. This wrapper only checks each status (through throwIfFailed, so a
// failure reads like the runtime's) and releases every handle once, before the device closes.

#include <backplane/abi/plugin_sdk.hpp>
#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace backplane::tool {

class RawDevice;

/// Owns one handle of a RawDevice and releases it exactly once. Move-only; the RawDevice must
/// outlive it (declare owners after the device they come from).
template <class Handle> class RawHandle {
public:
    RawHandle() = default;
    RawHandle(const RawDevice *device, Handle *handle) : device_(device), handle_(handle) {}
    ~RawHandle() { reset(); }
    RawHandle(RawHandle &&other) noexcept
        : device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {}
    RawHandle &operator=(RawHandle &&other) noexcept {
        if (this != &other) {
            reset();
            device_ = other.device_;
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    RawHandle(const RawHandle &) = delete;
    RawHandle &operator=(const RawHandle &) = delete;

    Handle *get() const noexcept { return handle_; }
    void reset() noexcept;

private:
    const RawDevice *device_ = nullptr;
    Handle *handle_ = nullptr;
};

/// One page of plugin memory and its host address (pinned and host-visible pages; NULL else).
struct RawMemory {
    RawHandle<bp_memory> memory;
    void *mapped = nullptr;
};

/// Device `index` of a plugin, opened through its table (probe, device_info, device_open) and
/// closed by the destructor. Every call throws backplane::Error when the plugin fails it.
class RawDevice {
public:
    RawDevice(RawPlugin plugin, uint32_t index) : plugin_(std::move(plugin)) {
        bp_error error = makeError();
        auto probe = sdk::makeStruct<bp_probe_result>();
        check(api().probe(plugin_.instance(), &probe, &error), error, "probe");
        if (index >= probe.device_count)
            throw Error(ErrorCode::NoDevice,
                        name() + " sees " + std::to_string(probe.device_count) +
                            " device(s); there is no device " + std::to_string(index),
                        name());
        info_ = sdk::makeStruct<bp_device_info>();
        check(api().device_info(plugin_.instance(), index, &info_, &error), error, "device_info");
        const auto args = sdk::makeStruct<bp_device_open_args>();
        check(api().device_open(plugin_.instance(), index, &args, &device_, &error), error,
              "device_open");
    }
    ~RawDevice() { api().device_close(device_); }
    RawDevice(const RawDevice &) = delete;
    RawDevice &operator=(const RawDevice &) = delete;

    const bp_plugin_api &api() const noexcept { return plugin_.api(); }
    bp_device *get() const noexcept { return device_; }
    const bp_device_info &info() const noexcept { return info_; }
    const std::string &name() const noexcept { return plugin_.manifest().name; }

    /// Throws the Error of a failed call: "<plugin> <what>: <plugin's message>".
    void check(bp_status status, const bp_error &error, const char *what) const {
        if (status != BP_SUCCESS) fail(status, error, what);
    }

    RawMemory allocate(bp_memory_kind kind, uint64_t size) const {
        auto args = sdk::makeStruct<bp_memory_allocate_args>();
        args.kind = kind;
        args.size = size;
        bp_memory *memory = nullptr;
        void *mapped = nullptr;
        bp_error error = makeError();
        check(api().memory_allocate(device_, &args, &memory, &mapped, &error), error,
              "memory_allocate");
        return {{this, memory}, mapped};
    }
    RawHandle<bp_stream> createStream() const {
        const auto args = sdk::makeStruct<bp_stream_create_args>();
        bp_stream *stream = nullptr;
        bp_error error = makeError();
        check(api().stream_create(device_, &args, &stream, &error), error, "stream_create");
        return {this, stream};
    }
    /// Submits the stream; the event completes when everything submitted so far has.
    RawHandle<bp_event> flush(bp_stream *stream) const {
        const auto args = sdk::makeStruct<bp_flush_args>();
        bp_event *event = nullptr;
        bp_error error = makeError();
        check(api().stream_flush(device_, stream, &args, &event, &error), error, "stream_flush");
        return {this, event};
    }
    /// Host wait, no time limit.
    void wait(bp_event *event) const {
        bp_error error = makeError();
        check(api().event_wait(device_, event, UINT64_MAX, &error), error, "event_wait");
    }
    /// flush + wait: the host waits for all work of `stream`.
    void sync(bp_stream *stream) const { wait(flush(stream).get()); }
    /// Later work on `stream` waits for `event` on the device.
    void waitEvent(bp_stream *stream, bp_event *event) const {
        bp_error error = makeError();
        check(api().stream_wait_event(device_, stream, event, &error), error, "stream_wait_event");
    }

    void copyHostToDevice(bp_stream *stream, const void *src, bp_memory *dst, uint64_t dstOffset,
                          uint64_t size) const {
        const bp_copy_host_to_device_args args{sizeof(args), src, dst, dstOffset, size};
        bp_error error = makeError();
        check(api().copy_host_to_device(device_, stream, &args, &error), error,
              "copy_host_to_device");
    }
    void copyDeviceToHost(bp_stream *stream, bp_memory *src, uint64_t srcOffset, void *dst,
                          uint64_t size) const {
        const bp_copy_device_to_host_args args{sizeof(args), src, srcOffset, dst, size};
        bp_error error = makeError();
        check(api().copy_device_to_host(device_, stream, &args, &error), error,
              "copy_device_to_host");
    }
    void copyDeviceToDevice(bp_stream *stream, bp_memory *src, uint64_t srcOffset, bp_memory *dst,
                            uint64_t dstOffset, uint64_t size) const {
        bp_copy_device_to_device_args args{sizeof(args), src, srcOffset, dst, dstOffset, size};
        bp_error error = makeError();
        check(api().copy_device_to_device(device_, stream, &args, &error), error,
              "copy_device_to_device");
    }

    /// Compiles `source` (text, or a bp_host_kernel_source for the host dialect) into a blob for
    /// load(); a compile error's message carries the compiler log.
    std::vector<unsigned char> compile(bp_dialect dialect, const std::string &entryPoint,
                                       const void *source, size_t sourceSize,
                                       const std::vector<std::string> &options = {}) const {
        std::vector<unsigned char> binary;
        std::string log;
        std::vector<const char *> optionPointers;
        for (const std::string &option : options)
            optionPointers.push_back(option.c_str());
        auto args = sdk::makeStruct<bp_kernel_compile_args>();
        args.dialect = dialect;
        args.entry_point = entryPoint.c_str();
        args.source = source;
        args.source_size = sourceSize;
        args.options = optionPointers.empty() ? nullptr : optionPointers.data();
        args.option_count = static_cast<uint32_t>(optionPointers.size());
        args.binary = {&binary, [](void *user, const void *data, size_t size) {
                           const auto *bytes = static_cast<const unsigned char *>(data);
                           auto *out = static_cast<std::vector<unsigned char> *>(user);
                           out->insert(out->end(), bytes, bytes + size);
                       }};
        args.log = {&log, [](void *user, const void *data, size_t size) {
                        static_cast<std::string *>(user)->append(static_cast<const char *>(data),
                                                                 size);
                    }};
        bp_error error = makeError();
        const bp_status status = api().kernel_compile(device_, &args, &error);
        if (status != BP_SUCCESS)
            fail(status, error,
                 "kernel_compile of " + entryPoint + (log.empty() ? "" : " (log: " + log + ")"));
        return binary;
    }
    RawHandle<bp_kernel> load(bp_dialect dialect, const std::string &entryPoint,
                              const std::vector<unsigned char> &binary) const {
        auto args = sdk::makeStruct<bp_kernel_load_args>();
        args.dialect = dialect;
        args.entry_point = entryPoint.c_str();
        args.binary = binary.data();
        args.binary_size = binary.size();
        bp_kernel *kernel = nullptr;
        bp_error error = makeError();
        check(api().kernel_load(device_, &args, &kernel, &error), error, "kernel_load");
        return {this, kernel};
    }
    void launch(bp_stream *stream, const bp_launch_args &args) const {
        bp_error error = makeError();
        check(api().kernel_launch(device_, stream, &args, &error), error, "kernel_launch");
    }

    void release(bp_memory *memory) const noexcept { api().memory_free(device_, memory); }
    void release(bp_stream *stream) const noexcept { api().stream_destroy(device_, stream); }
    void release(bp_event *event) const noexcept { api().event_release(device_, event); }
    void release(bp_kernel *kernel) const noexcept { api().kernel_release(device_, kernel); }

private:
    [[noreturn]] void fail(bp_status status, const bp_error &error, const std::string &what) const {
        throwIfFailed(status, error, name(), name() + " " + what);
        throw Error(ErrorCode::Internal, name() + " " + what + " failed"); // not reached
    }

    RawPlugin plugin_; // outlives device_: closed first, destroyed last
    bp_device_info info_{};
    bp_device *device_ = nullptr;
};

template <class Handle> void RawHandle<Handle>::reset() noexcept {
    if (handle_ != nullptr) device_->release(std::exchange(handle_, nullptr));
}

} // namespace backplane::tool
