// Test helpers over the plugin C ABI for the CUDA tests (internals: uses detail::PluginLibrary).
#pragma once

#include "plugin/plugin_library.hpp"

#include <doctest/doctest.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace backplane::test {

/// The built plugin: $BACKPLANE_TEST_PLUGIN when set (copied build on the GPU machine), else the
/// build-tree path given by meson.
inline std::string pluginPath(const char *buildPath) {
    const char *env = std::getenv("BACKPLANE_TEST_PLUGIN");
    return env != nullptr && *env != '\0' ? env : buildPath;
}

/// Appends a sink's chunks to a std::string / byte vector.
template <class Buffer> bp_blob_sink sinkInto(Buffer &buffer) {
    return bp_blob_sink{&buffer, [](void *user, const void *data, size_t size) {
                            auto *b = static_cast<Buffer *>(user);
                            const auto *p = static_cast<const char *>(data);
                            b->insert(b->end(), p, p + size);
                        }};
}

/// One opened device of a plugin, through the C ABI. Failing calls fail the test with the
/// plugin's message.
class AbiDevice {
public:
    AbiDevice(std::shared_ptr<detail::PluginLibrary> plugin, uint32_t index)
        : plugin_(std::move(plugin)), api_(plugin_->api()) {
        auto args = makeArgs<bp_device_open_args>();
        expectOk(api_.device_open(plugin_->instance(), index, &args, &device_, &error_),
                 "device_open");
    }
    ~AbiDevice() {
        if (device_ != nullptr) api_.device_close(device_);
    }
    AbiDevice(const AbiDevice &) = delete;
    AbiDevice &operator=(const AbiDevice &) = delete;

    template <class T> static T makeArgs() {
        T t{};
        t.struct_size = sizeof(T);
        return t;
    }
    void expectOk(bp_status status, const char *what) {
        const std::string context = std::string(what) + ": " + error_.message;
        INFO(context);
        REQUIRE(status == BP_SUCCESS);
    }

    const bp_plugin_api &api() const { return api_; }
    bp_device *get() const { return device_; }
    bp_error &error() { return error_; }

    bp_memory *allocate(uint64_t size, bp_memory_kind kind = BP_MEMORY_DEVICE,
                        void **mapped = nullptr) {
        auto args = makeArgs<bp_memory_allocate_args>();
        args.kind = kind;
        args.size = size;
        bp_memory *memory = nullptr;
        void *host = nullptr;
        expectOk(api_.memory_allocate(device_, &args, &memory, &host, &error_), "memory_allocate");
        if (mapped != nullptr) *mapped = host;
        return memory;
    }
    bp_stream *stream() {
        auto args = makeArgs<bp_stream_create_args>();
        bp_stream *s = nullptr;
        expectOk(api_.stream_create(device_, &args, &s, &error_), "stream_create");
        return s;
    }
    bp_event *flush(bp_stream *s, uint32_t flags = 0) {
        auto args = makeArgs<bp_flush_args>();
        args.flags = flags;
        bp_event *e = nullptr;
        expectOk(api_.stream_flush(device_, s, &args, &e, &error_), "stream_flush");
        return e;
    }
    /// Flushes and waits for everything on `s`; returns the wait's status.
    bp_status finish(bp_stream *s) {
        bp_event *e = flush(s);
        const bp_status status = api_.event_wait(device_, e, UINT64_MAX, &error_);
        api_.event_release(device_, e);
        return status;
    }
    void write(bp_stream *s, bp_memory *dst, uint64_t offset, const void *src, uint64_t size) {
        auto args = makeArgs<bp_copy_host_to_device_args>();
        args.src = src;
        args.dst = dst;
        args.dst_offset = offset;
        args.size = size;
        expectOk(api_.copy_host_to_device(device_, s, &args, &error_), "copy_host_to_device");
    }
    void read(bp_stream *s, bp_memory *src, uint64_t offset, void *dst, uint64_t size) {
        auto args = makeArgs<bp_copy_device_to_host_args>();
        args.src = src;
        args.src_offset = offset;
        args.dst = dst;
        args.size = size;
        expectOk(api_.copy_device_to_host(device_, s, &args, &error_), "copy_device_to_host");
    }
    /// Compiles a CUDA source; returns the status and fills binary and log.
    bp_status compile(const std::string &source, const char *entry, std::vector<char> &binary,
                      std::string &log) {
        auto args = makeArgs<bp_kernel_compile_args>();
        args.dialect = BP_DIALECT_CUDA;
        args.entry_point = entry;
        args.source = source.data();
        args.source_size = source.size();
        args.binary = sinkInto(binary);
        args.log = sinkInto(log);
        return api_.kernel_compile(device_, &args, &error_);
    }
    bp_kernel *load(const std::vector<char> &binary, const char *entry) {
        auto args = makeArgs<bp_kernel_load_args>();
        args.dialect = BP_DIALECT_CUDA;
        args.entry_point = entry;
        args.binary = binary.data();
        args.binary_size = binary.size();
        bp_kernel *k = nullptr;
        expectOk(api_.kernel_load(device_, &args, &k, &error_), "kernel_load");
        return k;
    }

private:
    std::shared_ptr<detail::PluginLibrary> plugin_;
    const bp_plugin_api &api_;
    bp_device *device_ = nullptr;
    bp_error error_ = detail::makeError();
};

} // namespace backplane::test
