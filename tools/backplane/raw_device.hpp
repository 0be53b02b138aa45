// RawDevice: one device of a RawPlugin for the raw-ABI benchmarks: checked calls, owned handles.
#pragma once

// The benchmarks' "raw" side calls the plugin's C table with nothing in between: no pools, no
// alignment, no scheduler. This wrapper only checks each status (abi::throwStatus, so a failure
// reads like the runtime's) and hands out abi::Owned handles, each released once. Declare them
// after the RawDevice they come from, so they go before the device closes.

#include <backplane/abi/caller.hpp>
#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace backplane::tool {

/// One page of plugin memory and its host address (pinned and host-visible pages; NULL else).
struct RawMemory {
    abi::Owned<bp_memory> memory;
    void *mapped = nullptr;
};

/// Device `index` of a plugin, opened through its table (probe, device_info, device_open) and
/// closed by the destructor. Every call throws backplane::Error when the plugin fails it.
class RawDevice {
public:
    RawDevice(RawPlugin plugin, uint32_t index) : plugin_(std::move(plugin)) {
        auto error = abi::make<bp_error>();
        auto probe = abi::make<bp_probe_result>();
        check(api().probe(plugin_.instance(), &probe, &error), error, "probe");
        if (index >= probe.device_count)
            throw Error(ErrorCode::NoDevice,
                        name() + " sees " + std::to_string(probe.device_count) +
                            " device(s); there is no device " + std::to_string(index),
                        name());
        info_ = abi::make<bp_device_info>();
        check(api().device_info(plugin_.instance(), index, &info_, &error), error, "device_info");
        const auto args = abi::make<bp_device_open_args>();
        bp_device *device = nullptr;
        check(api().device_open(plugin_.instance(), index, &args, &device, &error), error,
              "device_open");
        device_ = abi::Owned<bp_device>(api(), device);
    }
    RawDevice(const RawDevice &) = delete;
    RawDevice &operator=(const RawDevice &) = delete;

    const bp_plugin_api &api() const noexcept { return plugin_.api(); }
    bp_device *get() const noexcept { return device_.get(); }
    const bp_device_info &info() const noexcept { return info_; }
    const std::string &name() const noexcept { return plugin_.manifest().name; }

    /// Throws the Error of a failed call: "<plugin> <what>: <plugin's message>".
    void check(bp_status status, const bp_error &error, std::string_view what) const {
        if (status != BP_SUCCESS) fail(status, error, std::string(what));
    }

    RawMemory allocate(bp_memory_kind kind, uint64_t size) const {
        auto args = abi::make<bp_memory_allocate_args>();
        args.kind = kind;
        args.size = size;
        bp_memory *memory = nullptr;
        void *mapped = nullptr;
        auto error = abi::make<bp_error>();
        check(api().memory_allocate(get(), &args, &memory, &mapped, &error), error,
              "memory_allocate");
        return {{api(), get(), memory}, mapped};
    }
    abi::Owned<bp_stream> createStream() const {
        const auto args = abi::make<bp_stream_create_args>();
        bp_stream *stream = nullptr;
        auto error = abi::make<bp_error>();
        check(api().stream_create(get(), &args, &stream, &error), error, "stream_create");
        return {api(), get(), stream};
    }
    /// Submits the stream; the event completes when everything submitted so far has.
    abi::Owned<bp_event> flush(bp_stream *stream) const {
        const auto args = abi::make<bp_flush_args>();
        bp_event *event = nullptr;
        auto error = abi::make<bp_error>();
        check(api().stream_flush(get(), stream, &args, &event, &error), error, "stream_flush");
        return {api(), get(), event};
    }
    /// Host wait, no time limit.
    void wait(bp_event *event) const {
        auto error = abi::make<bp_error>();
        check(api().event_wait(get(), event, UINT64_MAX, &error), error, "event_wait");
    }
    /// flush + wait: the host waits for all work of `stream`.
    void sync(bp_stream *stream) const { wait(flush(stream).get()); }
    /// Later work on `stream` waits for `event` on the device.
    void waitEvent(bp_stream *stream, bp_event *event) const {
        auto error = abi::make<bp_error>();
        check(api().stream_wait_event(get(), stream, event, &error), error, "stream_wait_event");
    }

    void copyHostToDevice(bp_stream *stream, const void *src, bp_memory *dst, uint64_t dstOffset,
                          uint64_t size) const {
        auto args = abi::make<bp_copy_host_to_device_args>();
        args.src = src;
        args.dst = dst;
        args.dst_offset = dstOffset;
        args.size = size;
        auto error = abi::make<bp_error>();
        check(api().copy_host_to_device(get(), stream, &args, &error), error,
              "copy_host_to_device");
    }
    void copyDeviceToHost(bp_stream *stream, bp_memory *src, uint64_t srcOffset, void *dst,
                          uint64_t size) const {
        auto args = abi::make<bp_copy_device_to_host_args>();
        args.src = src;
        args.src_offset = srcOffset;
        args.dst = dst;
        args.size = size;
        auto error = abi::make<bp_error>();
        check(api().copy_device_to_host(get(), stream, &args, &error), error,
              "copy_device_to_host");
    }
    void copyDeviceToDevice(bp_stream *stream, bp_memory *src, uint64_t srcOffset, bp_memory *dst,
                            uint64_t dstOffset, uint64_t size) const {
        auto args = abi::make<bp_copy_device_to_device_args>();
        args.src = src;
        args.src_offset = srcOffset;
        args.dst = dst;
        args.dst_offset = dstOffset;
        args.size = size;
        auto error = abi::make<bp_error>();
        check(api().copy_device_to_device(get(), stream, &args, &error), error,
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
        auto args = abi::make<bp_kernel_compile_args>();
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
        auto error = abi::make<bp_error>();
        const bp_status status = api().kernel_compile(get(), &args, &error);
        if (status != BP_SUCCESS)
            fail(status, error,
                 "kernel_compile of " + entryPoint + (log.empty() ? "" : " (log: " + log + ")"));
        return binary;
    }
    abi::Owned<bp_kernel> load(bp_dialect dialect, const std::string &entryPoint,
                              const std::vector<unsigned char> &binary) const {
        auto args = abi::make<bp_kernel_load_args>();
        args.dialect = dialect;
        args.entry_point = entryPoint.c_str();
        args.binary = binary.data();
        args.binary_size = binary.size();
        bp_kernel *kernel = nullptr;
        auto error = abi::make<bp_error>();
        check(api().kernel_load(get(), &args, &kernel, &error), error, "kernel_load");
        return {api(), get(), kernel};
    }
    void launch(bp_stream *stream, const bp_launch_args &args) const {
        auto error = abi::make<bp_error>();
        check(api().kernel_launch(get(), stream, &args, &error), error, "kernel_launch");
    }

private:
    [[noreturn]] void fail(bp_status status, const bp_error &error, const std::string &what) const {
        abi::throwStatus(status, &error, name() + " " + what, name());
    }

    RawPlugin plugin_; // outlives device_: closed first, destroyed last
    bp_device_info info_{};
    abi::Owned<bp_device> device_; // device_close, before plugin_ goes
};

} // namespace backplane::tool
