// The plugin SDK: header-only C++ over the C ABI, so a plugin is one class and one macro.
#pragma once

// How to write a plugin (plugins/host is the complete reference):
//
//   class MyDevice : public backplane::sdk::Device { ...override what the device can do... };
//   class MyPlugin : public backplane::sdk::Plugin {
//   public:
//       static constexpr const char *kName = "mine";       // equals the manifest's "name"
//       static constexpr const char *kVersion = "1.2.0";
//       explicit MyPlugin(const bp_plugin_init_args &args) : Plugin(args) {}
//       bp_probe_result probe() override;
//       bp_device_info deviceInfo(uint32_t index) override;
//       std::unique_ptr<backplane::sdk::Device> open(uint32_t index,
//                                                    const bp_device_open_args &args) override;
//   };
//   BACKPLANE_PLUGIN(MyPlugin)
//
// What the SDK does for you:
// - exports the one entry symbol and fills the versioned function table;
// - turns every exception into a status: sdk::Error keeps its code, std::bad_alloc becomes
//   BP_ERROR_OUT_OF_MEMORY, anything else BP_ERROR_INTERNAL with the exception's text;
// - normalises argument structs: a host built against an older minor passes smaller structs; the
//   SDK copies what the host set into zero-initialised full-size structs, so your code always
//   sees every field (unknown ones are zero). Output structs are written back up to the host's
//   struct_size only;
// - owns handles through the classes below: a handle the core releases is deleted, so vendor
//   objects are released in your destructors (RAII).
//
// Threading (the ABI's rules): Plugin and Device methods may be called from any thread at once;
// methods taking a Stream are never called concurrently for the same stream; Event methods may
// run concurrently. Protect shared state in your classes accordingly.

#include <backplane/abi/plugin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <memory>
#include <new>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

namespace backplane::sdk {

/// The exception plugin code throws to fail a call with a precise status. The message should name
/// the failing vendor call and say what the user can do.
class Error : public std::exception {
public:
    Error(bp_status code, std::string message, int64_t vendorCode = 0)
        : code_(code), vendorCode_(vendorCode), message_(std::move(message)) {}

    bp_status code() const noexcept { return code_; }
    int64_t vendorCode() const noexcept { return vendorCode_; }
    const char *what() const noexcept override { return message_.c_str(); }

private:
    bp_status code_;
    int64_t vendorCode_;
    std::string message_;
};

/// Throws BP_ERROR_UNSUPPORTED naming the operation; the default of every optional method.
[[noreturn]] inline void unsupported(std::string_view operation) {
    throw Error(BP_ERROR_UNSUPPORTED, std::string(operation) + " is not supported by this plugin");
}

/// Copies a string into a fixed char array of an ABI struct, truncating, always NUL-terminated.
template <size_t N> void copyString(char (&dst)[N], std::string_view src) noexcept {
    const size_t n = std::min(src.size(), N - 1);
    std::memcpy(dst, src.data(), n);
    dst[n] = '\0';
}

/// An enum field as the integer the caller stored: a C caller may store any value, and loading
/// one outside the enum's range as the enum type is undefined in C++ (plugin.h, "Enumerations").
template <class Enum> uint32_t rawValue(const Enum &field) noexcept {
    static_assert(sizeof(Enum) == sizeof(uint32_t));
    uint32_t raw;
    std::memcpy(&raw, &field, sizeof(raw));
    return raw;
}

/// "cuda", "hip", "glsl", "spirv", "host", "cpp", or "unknown dialect N" for a value that is no dialect.
inline std::string dialectName(const bp_dialect &dialect) {
    switch (const uint32_t value = rawValue(dialect)) {
    case BP_DIALECT_CUDA: return "cuda";
    case BP_DIALECT_HIP: return "hip";
    case BP_DIALECT_GLSL: return "glsl";
    case BP_DIALECT_SPIRV: return "spirv";
    case BP_DIALECT_HOST: return "host";
    case BP_DIALECT_CPP: return "cpp";
    default: return "unknown dialect " + std::to_string(value);
    }
}

/// The status for refusing a kernel dialect: BP_ERROR_UNSUPPORTED for a dialect the ABI defines
/// but this device does not take, BP_ERROR_INVALID_ARGUMENT for a value that is no dialect.
inline bp_status refusedDialectStatus(const bp_dialect &dialect) noexcept {
    return rawValue(dialect) <= BP_DIALECT_CPP ? BP_ERROR_UNSUPPORTED : BP_ERROR_INVALID_ARGUMENT;
}

/// A zero-initialised ABI struct with struct_size set: the way to build any argument struct.
template <class T> T makeStruct() noexcept {
    T value{};
    value.struct_size = sizeof(T);
    return value;
}

/// Base of the plugin's memory pages. Destroying it must free the vendor memory.
class Memory {
public:
    virtual ~Memory() = default;
};

/// Base of the plugin's streams. Destroying it must wait for its work, then release it.
class Stream {
public:
    virtual ~Stream() = default;
};

/// Base of the plugin's events. Destroying it releases the vendor event.
class Event {
public:
    virtual ~Event() = default;
};

/// Base of the plugin's loaded kernels. Destroying it unloads the module/pipeline.
class Kernel {
public:
    virtual ~Kernel() = default;
};

/// Base of the plugin's communicator memberships (ABI 1.1). Destroying it leaves the
/// communicator and frees it.
class Comm {
public:
    virtual ~Comm() = default;
    /// Makes pending and later collectives fail with BP_ERROR_REMOTE instead of waiting for peers.
    /// Called from any thread, also while a collective runs.
    virtual void abort() = 0;
};

/// Base of the plugin's recorded sequences (ABI 1.3). Destroying it frees the vendor objects; the
/// core does that only after every launch of the graph completed.
class Graph {
public:
    virtual ~Graph() = default;
};

/// One op of a graph as the SDK hands it over: its kind checked, the argument struct of that kind
/// read in full (zero-extended from an older host's), and a launch's bindings and scalars copied
/// (the host lends them for the call only). Move-only: `launch.bindings` and `launch.scalars`
/// point into the vectors, which keep their storage when moved.
struct GraphOp {
    bp_graph_op_kind kind = BP_GRAPH_OP_LAUNCH;
    bp_launch_args launch{};
    std::vector<bp_binding> bindings;
    std::vector<unsigned char> scalars;
    bp_copy_host_to_device_args toDevice{};
    bp_copy_device_to_host_args toHost{};
    bp_copy_device_to_device_args copy{};
    bp_fill_args fill{};

    GraphOp() = default;
    GraphOp(GraphOp &&) noexcept = default;
    GraphOp &operator=(GraphOp &&) noexcept = default;
    GraphOp(const GraphOp &) = delete;
    GraphOp &operator=(const GraphOp &) = delete;
};

/// A kernel compilation's outputs; `log` is passed to the host even when compile() throws.
struct CompileOutput {
    std::vector<unsigned char> binary;
    std::string log;
};

/// One opened device. Created by Plugin::open, destroyed by the core's device_close after all its
/// handles were released. Optional operations default to throwing BP_ERROR_UNSUPPORTED.
class Device {
public:
    virtual ~Device() = default;

    /// Allocates a page. Sets *mapped for host-mapped kinds (PINNED_HOST, HOST_VISIBLE).
    virtual std::unique_ptr<Memory> allocate(const bp_memory_allocate_args &args,
                                             void **mapped) = 0;
    /// Maps a DEVICE page (BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY).
    virtual void *map(Memory &) { unsupported("memory_map"); }

    virtual std::unique_ptr<Stream> createStream(const bp_stream_create_args &args) = 0;
    /// Submits recorded work; returns an event when wantEvent (else nullptr).
    virtual std::unique_ptr<Event> flush(Stream &stream, const bp_flush_args &args,
                                         bool wantEvent) = 0;
    /// Device-side wait of `stream` on `event`.
    virtual void waitEvent(Stream &stream, Event &event) = 0;
    /// Host wait; returns false when timeoutNs ran out (UINT64_MAX: wait forever).
    virtual bool eventWait(Event &event, uint64_t timeoutNs) = 0;
    /// True when the event completed; never blocks.
    virtual bool eventQuery(Event &event) = 0;
    /// Nanoseconds between two completed timing events.
    virtual uint64_t elapsedNs(Event &, Event &) { unsupported("event_elapsed_ns"); }

    virtual void copyHostToDevice(Stream &stream, const bp_copy_host_to_device_args &args) = 0;
    virtual void copyDeviceToHost(Stream &stream, const bp_copy_device_to_host_args &args) = 0;
    virtual void copyDeviceToDevice(Stream &stream,
                                    const bp_copy_device_to_device_args &args) = 0;
    virtual void fill(Stream &stream, const bp_fill_args &args) = 0;
    /// Copy from another device of this plugin (BP_CAPABILITY_PEER_COPY).
    virtual void copyPeer(Stream &, Device &, const bp_copy_device_to_device_args &) {
        unsupported("copy_peer");
    }

    /// Compiles a source; throw Error(BP_ERROR_COMPILE, ...) after filling out.log on failure.
    virtual void compile(const bp_kernel_compile_args &args, CompileOutput &out) = 0;
    virtual std::unique_ptr<Kernel> load(const bp_kernel_load_args &args) = 0;
    virtual void launch(Stream &stream, const bp_launch_args &args) = 0;

    virtual uint64_t nativeHandle(bp_native_kind, const void *) { unsupported("native_handle"); }

    // ABI 1.1 ------------------------------------------------------------------------------------
    /// Whether copyPeer from `src` into this device works, and each accepts the other's events in
    /// waitEvent. Default: no pair.
    virtual bool peerAccess(Device & /*src*/) { return false; }
    /// Joins a communicator (BP_CAPABILITY_COLLECTIVES); blocks until every rank joined.
    virtual std::unique_ptr<Comm> createComm(const bp_comm_create_args &) {
        unsupported("comm_create");
    }
    /// Records one collective on the stream.
    virtual void collective(Stream &, Comm &, const bp_collective_args &) {
        unsupported("collective");
    }

    // ABI 1.3 ------------------------------------------------------------------------------------
    /// Builds a replayable graph of `ops` (checked and normalised; yours to move from). Throw
    /// BP_ERROR_UNSUPPORTED for an op your graphs cannot hold: the core then replays the ops
    /// one by one. Default: unsupported (the core's replay).
    virtual std::unique_ptr<Graph> createGraph(std::vector<GraphOp> &ops) {
        (void)ops;
        unsupported("graph_create");
    }
    /// Records one replay of `graph` on `stream`, ordered like a launch.
    virtual void launchGraph(Stream &, Graph &) { unsupported("graph_launch"); }
    /// Replaces op `index` (the SDK checked the kind; check the index and the rest: the same
    /// kind as before, for a launch the same kernel, block and binding count). Throw
    /// BP_ERROR_UNSUPPORTED to have the core build a new graph instead.
    virtual void updateGraph(Graph &, uint32_t index, GraphOp &op) {
        (void)index;
        (void)op;
        unsupported("graph_update");
    }

    // ABI 1.3: host registration ------------------------------------------------------------------
    /// Registers host memory the application allocated (the SDK checked that `args.host` is set,
    /// `args.size` > 0 and `args.flags` 0), as a PINNED_HOST page whose mapped address is
    /// `args.host`. Destroying the returned page unregisters the range and must not free it.
    /// Default: unsupported.
    virtual std::unique_ptr<Memory> registerHost(const bp_memory_register_args &args) {
        (void)args;
        unsupported("memory_register");
    }
};

/// The plugin instance: cheap to construct (no contexts), probes and opens devices.
class Plugin {
public:
    explicit Plugin(const bp_plugin_init_args &args)
        : log_(args.log), logUser_(args.log_user),
          cacheDir_(args.cache_dir ? args.cache_dir : ""),
          optionsJson_(args.options_json ? args.options_json : "{}"),
          hostAbiMinor_(args.struct_size >= offsetof(bp_plugin_init_args, host_abi_minor) +
                                              sizeof(args.host_abi_minor)
                            ? args.host_abi_minor
                            : 0) {}
    virtual ~Plugin() = default;
    Plugin(const Plugin &) = delete;
    Plugin &operator=(const Plugin &) = delete;

    virtual bp_probe_result probe() = 0;
    virtual bp_device_info deviceInfo(uint32_t index) = 0;
    virtual std::unique_ptr<Device> open(uint32_t index, const bp_device_open_args &args) = 0;

    // ABI 1.1 ------------------------------------------------------------------------------------
    /// The id of a new communicator (at most BP_COMM_ID_MAX_BYTES bytes).
    virtual std::vector<unsigned char> createCommId() { unsupported("comm_id_create"); }
    /// Starts or ends a group of collective calls of the calling thread. Default: nothing to do.
    virtual void commGroup(bool /*begin*/) {}

    /// Logs through the core's logger (no-op when the host gave no sink).
    void log(bp_log_level level, const std::string &message) const noexcept {
        if (log_) log_(logUser_, level, message.c_str());
    }
    /// The directory the core set aside for this plugin's caches; empty when caching is off.
    const std::string &cacheDir() const noexcept { return cacheDir_; }
    /// Plugin-specific options (JSON text, "{}" when none).
    const std::string &optionsJson() const noexcept { return optionsJson_; }
    /// The ABI minor version the core speaks (what a capability may depend on: see
    /// BP_CAPABILITY_PORTABLE_BINARIES).
    uint32_t hostAbiMinor() const noexcept { return hostAbiMinor_; }

private:
    void (*log_)(void *, bp_log_level, const char *);
    void *logUser_;
    std::string cacheDir_;
    std::string optionsJson_;
    uint32_t hostAbiMinor_;
};

namespace detail {

// Handles are the SDK base-class pointers, reinterpreted as the ABI's opaque types.
template <class Handle, class Base> Handle *toHandle(Base *object) noexcept {
    return reinterpret_cast<Handle *>(object);
}
template <class Base, class Handle> Base &fromHandle(Handle *handle) {
    if (handle == nullptr) throw Error(BP_ERROR_INVALID_ARGUMENT, "null handle");
    return *reinterpret_cast<Base *>(handle);
}

/// Copies a caller's (possibly older, smaller) struct into a full zeroed one.
template <class T> T readArgs(const T *in) {
    if (in == nullptr) throw Error(BP_ERROR_INVALID_ARGUMENT, "null argument struct");
    T out{};
    std::memcpy(&out, in, std::min(in->struct_size, sizeof(T)));
    out.struct_size = sizeof(T);
    return out;
}

/// The out pointer of a function that creates something: NULL is the caller's error.
template <class T> T &outParam(T *out, const char *function) {
    if (out == nullptr)
        throw Error(BP_ERROR_INVALID_ARGUMENT, std::string(function) + ": the out pointer is NULL");
    return *out;
}

/// Writes a full struct back into the caller's, up to the caller's struct_size.
template <class T> void writeResult(T *out, const T &value) {
    if (out == nullptr) throw Error(BP_ERROR_INVALID_ARGUMENT, "null result struct");
    const size_t callerSize = out->struct_size == 0 ? sizeof(T) : out->struct_size;
    std::memcpy(out, &value, std::min(callerSize, sizeof(T)));
    out->struct_size = std::min(callerSize, sizeof(T));
}

inline bp_status fail(bp_error *error, bp_status code, const char *message,
                      int64_t vendorCode) noexcept {
    if (error != nullptr && error->struct_size >= offsetof(bp_error, message) + 1) {
        error->code = code;
        error->vendor_code = vendorCode;
        const size_t room = std::min<size_t>(error->struct_size - offsetof(bp_error, message),
                                             BP_ERROR_MESSAGE_CAPACITY);
        const size_t n = std::min(std::strlen(message), room - 1);
        std::memcpy(error->message, message, n);
        error->message[n] = '\0';
    }
    return code;
}

/// Runs `body`, turning any exception into a status and filling `error`.
template <class F> bp_status guard(bp_error *error, F &&body) noexcept {
    try {
        body();
        return BP_SUCCESS;
    } catch (const Error &e) {
        return fail(error, e.code(), e.what(), e.vendorCode());
    } catch (const std::bad_alloc &) {
        return fail(error, BP_ERROR_OUT_OF_MEMORY, "host memory allocation failed in the plugin", 0);
    } catch (const std::exception &e) {
        const std::string message = std::string("unexpected C++ exception in the plugin: ") + e.what();
        return fail(error, BP_ERROR_INTERNAL, message.c_str(), 0);
    } catch (...) {
        return fail(error, BP_ERROR_INTERNAL, "unexpected non-standard exception in the plugin", 0);
    }
}

/// For release functions, which have no status: swallow (and log) whatever a destructor threw.
template <class F> void guardRelease(F &&body) noexcept {
    try {
        body();
    } catch (...) { // NOLINT(bugprone-empty-catch): a release cannot report; nothing to do
    }
}

inline void writeSink(const bp_blob_sink &sink, const void *data, size_t size) {
    if (sink.write != nullptr && size > 0) sink.write(sink.user, data, size);
}

inline Device &device(bp_device *d) { return fromHandle<Device>(d); }

/// A caller's bp_graph_op as an owning, full-size GraphOp (see GraphOp); `what` names the call.
inline GraphOp readGraphOp(const bp_graph_op *in, const std::string &what) {
    const bp_graph_op op = readArgs(in);
    GraphOp out;
    const uint32_t kind = rawValue(op.kind);
    const auto need = [&](const void *args, const char *field) {
        if (args == nullptr)
            throw Error(BP_ERROR_INVALID_ARGUMENT, what + ": kind " + std::to_string(kind) +
                                                       " needs `" + field + "`, which is NULL");
    };
    switch (kind) {
    case BP_GRAPH_OP_LAUNCH: {
        need(op.launch, "launch");
        out.launch = readArgs(op.launch);
        if (out.launch.binding_count > 0) {
            need(out.launch.bindings, "launch->bindings");
            out.bindings.assign(out.launch.bindings,
                                out.launch.bindings + out.launch.binding_count);
        }
        if (out.launch.scalar_size > 0) {
            need(out.launch.scalars, "launch->scalars");
            const auto *bytes = static_cast<const unsigned char *>(out.launch.scalars);
            out.scalars.assign(bytes, bytes + out.launch.scalar_size);
        }
        out.launch.bindings = out.bindings.empty() ? nullptr : out.bindings.data();
        out.launch.scalars = out.scalars.empty() ? nullptr : out.scalars.data();
        break;
    }
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        need(op.to_device, "to_device");
        out.toDevice = readArgs(op.to_device);
        break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        need(op.to_host, "to_host");
        out.toHost = readArgs(op.to_host);
        break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        need(op.copy, "copy");
        out.copy = readArgs(op.copy);
        break;
    case BP_GRAPH_OP_FILL:
        need(op.fill, "fill");
        out.fill = readArgs(op.fill);
        break;
    default:
        // Unsupported, not invalid: a newer host may know kinds this plugin does not, and then
        // replays the ops itself (plugin.h, "Recorded sequences").
        throw Error(BP_ERROR_UNSUPPORTED, what + ": kind " + std::to_string(kind) +
                                              " is not a bp_graph_op_kind this plugin knows "
                                              "(ABI 1.3 defines 0 to 4)");
    }
    out.kind = static_cast<bp_graph_op_kind>(kind);
    return out;
}

/// Builds the function table of plugin class P; one static instance per plugin library.
template <class P> const bp_plugin_api *pluginApi() noexcept {
    static const bp_plugin_api api = [] {
        bp_plugin_api t{};
        t.struct_size = sizeof(bp_plugin_api);
        t.abi_major = BP_ABI_VERSION_MAJOR;
        t.abi_minor = BP_ABI_VERSION_MINOR;
        t.plugin_name = P::kName;
        t.plugin_version = P::kVersion;
        // (1.5) A plugin class with `static constexpr const char *kOptionsSchema` publishes it.
        if constexpr (requires { P::kOptionsSchema; }) t.options_schema = P::kOptionsSchema;

        t.plugin_init = [](const bp_plugin_init_args *args, bp_plugin **out, bp_error *error) {
            return guard(error, [&] {
                const auto a = readArgs(args);
                bp_plugin *&result = outParam(out, "plugin_init");
                if (a.host_abi_major != BP_ABI_VERSION_MAJOR)
                    throw Error(BP_ERROR_UNSUPPORTED,
                                "host ABI major " + std::to_string(a.host_abi_major) +
                                    " differs from the plugin's " +
                                    std::to_string(BP_ABI_VERSION_MAJOR));
                Plugin *plugin = new P(a);
                result = toHandle<bp_plugin>(plugin);
            });
        };
        t.plugin_destroy = [](bp_plugin *p) {
            guardRelease([&] { delete &fromHandle<Plugin>(p); });
        };
        t.probe = [](bp_plugin *p, bp_probe_result *out, bp_error *error) {
            return guard(error, [&] { writeResult(out, fromHandle<Plugin>(p).probe()); });
        };
        t.device_info = [](bp_plugin *p, uint32_t index, bp_device_info *out, bp_error *error) {
            return guard(error, [&] { writeResult(out, fromHandle<Plugin>(p).deviceInfo(index)); });
        };
        t.device_open = [](bp_plugin *p, uint32_t index, const bp_device_open_args *args,
                           bp_device **out, bp_error *error) {
            return guard(error, [&] {
                bp_device *&result = outParam(out, "device_open");
                const auto a = args ? readArgs(args) : makeStruct<bp_device_open_args>();
                if (a.flags != 0)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "device_open: flags " + std::to_string(a.flags) +
                                    " are not defined in this ABI (they must be 0)");
                result = toHandle<bp_device>(fromHandle<Plugin>(p).open(index, a).release());
            });
        };
        t.device_close = [](bp_device *d) { guardRelease([&] { delete &device(d); }); };

        t.memory_allocate = [](bp_device *d, const bp_memory_allocate_args *args, bp_memory **out,
                               void **mapped, bp_error *error) {
            return guard(error, [&] {
                void *m = nullptr;
                bp_memory *&result = outParam(out, "memory_allocate");
                result = toHandle<bp_memory>(device(d).allocate(readArgs(args), &m).release());
                if (mapped != nullptr) *mapped = m;
            });
        };
        t.memory_free = [](bp_device *, bp_memory *m) {
            guardRelease([&] { delete &fromHandle<Memory>(m); });
        };
        t.memory_map = [](bp_device *d, bp_memory *m, void **mapped, bp_error *error) {
            return guard(error, [&] {
                void *&result = outParam(mapped, "memory_map");
                result = device(d).map(fromHandle<Memory>(m));
            });
        };

        t.stream_create = [](bp_device *d, const bp_stream_create_args *args, bp_stream **out,
                             bp_error *error) {
            return guard(error, [&] {
                bp_stream *&result = outParam(out, "stream_create");
                result = toHandle<bp_stream>(device(d).createStream(readArgs(args)).release());
            });
        };
        t.stream_destroy = [](bp_device *, bp_stream *s) {
            guardRelease([&] { delete &fromHandle<Stream>(s); });
        };
        t.stream_flush = [](bp_device *d, bp_stream *s, const bp_flush_args *args, bp_event **out,
                            bp_error *error) {
            return guard(error, [&] {
                const bp_flush_args a = args ? readArgs(args) : makeStruct<bp_flush_args>();
                auto event = device(d).flush(fromHandle<Stream>(s), a, out != nullptr);
                if (out != nullptr) *out = toHandle<bp_event>(event.release());
            });
        };
        t.stream_wait_event = [](bp_device *d, bp_stream *s, bp_event *e, bp_error *error) {
            return guard(error, [&] {
                device(d).waitEvent(fromHandle<Stream>(s), fromHandle<Event>(e));
            });
        };
        t.event_wait = [](bp_device *d, bp_event *e, uint64_t timeoutNs, bp_error *error) {
            bool done = false;
            const bp_status status = guard(
                error, [&] { done = device(d).eventWait(fromHandle<Event>(e), timeoutNs); });
            if (status != BP_SUCCESS || done) return status;
            return fail(error, BP_ERROR_TIMEOUT, "event wait timed out; the work is still pending",
                        0);
        };
        t.event_query = [](bp_device *d, bp_event *e, bp_error *error) {
            bool done = false;
            const bp_status status =
                guard(error, [&] { done = device(d).eventQuery(fromHandle<Event>(e)); });
            if (status != BP_SUCCESS || done) return status;
            return fail(error, BP_ERROR_NOT_READY, "event pending", 0);
        };
        t.event_release = [](bp_device *, bp_event *e) {
            guardRelease([&] { delete &fromHandle<Event>(e); });
        };
        t.event_elapsed_ns = [](bp_device *d, bp_event *start, bp_event *end, uint64_t *out,
                                bp_error *error) {
            return guard(error, [&] {
                uint64_t &result = outParam(out, "event_elapsed_ns");
                result = device(d).elapsedNs(fromHandle<Event>(start), fromHandle<Event>(end));
            });
        };

        t.copy_host_to_device = [](bp_device *d, bp_stream *s,
                                   const bp_copy_host_to_device_args *args, bp_error *error) {
            return guard(error, [&] {
                device(d).copyHostToDevice(fromHandle<Stream>(s), readArgs(args));
            });
        };
        t.copy_device_to_host = [](bp_device *d, bp_stream *s,
                                   const bp_copy_device_to_host_args *args, bp_error *error) {
            return guard(error, [&] {
                device(d).copyDeviceToHost(fromHandle<Stream>(s), readArgs(args));
            });
        };
        t.copy_device_to_device = [](bp_device *d, bp_stream *s,
                                     const bp_copy_device_to_device_args *args, bp_error *error) {
            return guard(error, [&] {
                device(d).copyDeviceToDevice(fromHandle<Stream>(s), readArgs(args));
            });
        };
        t.fill = [](bp_device *d, bp_stream *s, const bp_fill_args *args, bp_error *error) {
            return guard(error, [&] { device(d).fill(fromHandle<Stream>(s), readArgs(args)); });
        };
        t.copy_peer = [](bp_device *d, bp_stream *s, bp_device *src,
                         const bp_copy_device_to_device_args *args, bp_error *error) {
            return guard(error, [&] {
                device(d).copyPeer(fromHandle<Stream>(s), device(src), readArgs(args));
            });
        };

        t.kernel_compile = [](bp_device *d, const bp_kernel_compile_args *args, bp_error *error) {
            CompileOutput output;
            const auto a = args ? readArgs(args) : makeStruct<bp_kernel_compile_args>();
            const bp_status status = guard(error, [&] { device(d).compile(a, output); });
            // The log goes out on failure too: it is what the user needs to fix the kernel.
            guard(nullptr, [&] {
                writeSink(a.log, output.log.data(), output.log.size());
                if (status == BP_SUCCESS)
                    writeSink(a.binary, output.binary.data(), output.binary.size());
            });
            return status;
        };
        t.kernel_load = [](bp_device *d, const bp_kernel_load_args *args, bp_kernel **out,
                           bp_error *error) {
            return guard(error, [&] {
                bp_kernel *&result = outParam(out, "kernel_load");
                result = toHandle<bp_kernel>(device(d).load(readArgs(args)).release());
            });
        };
        t.kernel_release = [](bp_device *, bp_kernel *k) {
            guardRelease([&] { delete &fromHandle<Kernel>(k); });
        };
        t.kernel_launch = [](bp_device *d, bp_stream *s, const bp_launch_args *args,
                             bp_error *error) {
            return guard(error, [&] { device(d).launch(fromHandle<Stream>(s), readArgs(args)); });
        };
        t.native_handle = [](bp_device *d, bp_native_kind kind, const void *object, uint64_t *out,
                             bp_error *error) {
            return guard(error, [&] {
                uint64_t &result = outParam(out, "native_handle");
                // Read as an integer first: a C caller may pass any value (plugin.h).
                if (const uint32_t raw = rawValue(kind); raw > BP_NATIVE_MEMORY)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "native_handle: kind " + std::to_string(raw) + " is not a bp_native_kind");
                result = device(d).nativeHandle(kind, object);
            });
        };

        t.device_peer_access = [](bp_device *d, bp_device *src, uint32_t *out, bp_error *error) {
            return guard(error, [&] {
                uint32_t &result = outParam(out, "device_peer_access");
                result = device(d).peerAccess(device(src)) ? 1u : 0u;
            });
        };
        t.comm_id_create = [](bp_plugin *p, void *out, size_t capacity, size_t *size,
                              bp_error *error) {
            return guard(error, [&] {
                size_t &written = outParam(size, "comm_id_create");
                if (out == nullptr)
                    throw Error(BP_ERROR_INVALID_ARGUMENT, "comm_id_create: the buffer is NULL");
                const std::vector<unsigned char> id = fromHandle<Plugin>(p).createCommId();
                if (id.size() > capacity)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "comm_id_create: the id takes " + std::to_string(id.size()) +
                                    " bytes, the buffer has " + std::to_string(capacity));
                if (!id.empty()) std::memcpy(out, id.data(), id.size());
                written = id.size();
            });
        };
        t.comm_create = [](bp_device *d, const bp_comm_create_args *args, bp_comm **out,
                           bp_error *error) {
            return guard(error, [&] {
                bp_comm *&result = outParam(out, "comm_create");
                const auto a = readArgs(args);
                if (a.size == 0 || a.rank >= a.size)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "comm_create: rank " + std::to_string(a.rank) +
                                    " is not below size " + std::to_string(a.size));
                if ((a.id == nullptr && a.id_size != 0) || a.id_size > BP_COMM_ID_MAX_BYTES)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "comm_create: the id (" + std::to_string(a.id_size) +
                                    " bytes) is NULL or longer than BP_COMM_ID_MAX_BYTES");
                result = toHandle<bp_comm>(device(d).createComm(a).release());
            });
        };
        t.comm_destroy = [](bp_device *, bp_comm *c) {
            guardRelease([&] { delete &fromHandle<Comm>(c); });
        };
        t.comm_abort = [](bp_device *, bp_comm *c) {
            guardRelease([&] { fromHandle<Comm>(c).abort(); });
        };
        t.comm_group = [](bp_plugin *p, uint32_t begin, bp_error *error) {
            return guard(error, [&] {
                if (begin > 1)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "comm_group: begin is 1 (start) or 0 (end), not " +
                                    std::to_string(begin));
                fromHandle<Plugin>(p).commGroup(begin == 1);
            });
        };
        t.collective = [](bp_device *d, bp_stream *s, bp_comm *c, const bp_collective_args *args,
                          bp_error *error) {
            return guard(error, [&] {
                const auto a = readArgs(args);
                if (rawValue(a.op) > BP_COLLECTIVE_RECV)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "collective: op " + std::to_string(rawValue(a.op)) +
                                    " is not a bp_collective");
                if (rawValue(a.type) > BP_DATA_F64)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "collective: type " + std::to_string(rawValue(a.type)) +
                                    " is not a bp_data_type");
                if (rawValue(a.reduce) > BP_REDUCE_AVG)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "collective: reduce " + std::to_string(rawValue(a.reduce)) +
                                    " is not a bp_reduce_op");
                device(d).collective(fromHandle<Stream>(s), fromHandle<Comm>(c), a);
            });
        };

        t.graph_create = [](bp_device *d, const bp_graph_create_args *args, bp_graph **out,
                            bp_error *error) {
            return guard(error, [&] {
                bp_graph *&result = outParam(out, "graph_create");
                const auto a = readArgs(args);
                if (a.op_count == 0 || a.ops == nullptr)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "graph_create: a graph needs at least one op (op_count " +
                                    std::to_string(a.op_count) + ", ops " +
                                    (a.ops ? "set" : "NULL") + ")");
                std::vector<GraphOp> ops;
                ops.reserve(a.op_count);
                for (uint32_t i = 0; i < a.op_count; ++i)
                    ops.push_back(readGraphOp(&a.ops[i], "graph_create: op " + std::to_string(i)));
                result = toHandle<bp_graph>(device(d).createGraph(ops).release());
            });
        };
        t.graph_launch = [](bp_device *d, bp_stream *s, bp_graph *g, bp_error *error) {
            return guard(error, [&] {
                device(d).launchGraph(fromHandle<Stream>(s), fromHandle<Graph>(g));
            });
        };
        t.graph_update = [](bp_device *d, bp_graph *g, uint32_t index, const bp_graph_op *op,
                            bp_error *error) {
            return guard(error, [&] {
                GraphOp normalised = readGraphOp(op, "graph_update: op " + std::to_string(index));
                device(d).updateGraph(fromHandle<Graph>(g), index, normalised);
            });
        };
        t.graph_release = [](bp_device *, bp_graph *g) {
            guardRelease([&] { delete &fromHandle<Graph>(g); });
        };

        t.memory_register = [](bp_device *d, const bp_memory_register_args *args, bp_memory **out,
                               bp_error *error) {
            return guard(error, [&] {
                bp_memory *&result = outParam(out, "memory_register");
                const auto a = readArgs(args);
                if (a.host == nullptr || a.size == 0)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "memory_register: the range needs a host address and a size > 0 "
                                "(host " + std::string(a.host ? "set" : "NULL") + ", size " +
                                    std::to_string(a.size) + ")");
                if (a.flags != 0)
                    throw Error(BP_ERROR_INVALID_ARGUMENT,
                                "memory_register: flags " + std::to_string(a.flags) +
                                    " are not defined in this ABI (they must be 0)");
                result = toHandle<bp_memory>(device(d).registerHost(a).release());
            });
        };
        return t;
    }();
    return &api;
}

} // namespace detail

/// Bytes of one element of a bp_data_type (read as an integer); 0 for a value that is none.
inline size_t dataTypeSize(const bp_data_type &type) noexcept {
    switch (rawValue(type)) {
    case BP_DATA_I8:
    case BP_DATA_U8: return 1;
    case BP_DATA_F16:
    case BP_DATA_BF16: return 2;
    case BP_DATA_I32:
    case BP_DATA_U32:
    case BP_DATA_F32: return 4;
    case BP_DATA_I64:
    case BP_DATA_U64:
    case BP_DATA_F64: return 8;
    default: return 0;
    }
}

/// Downcast helper for the handle base classes: `auto &m = sdk::as<MyMemory>(memory);`.
template <class Derived, class Base> Derived &as(Base &object) {
    return static_cast<Derived &>(object);
}
/// Same for the raw ABI handles inside argument structs (e.g. bp_binding::memory).
template <class Derived, class Handle> Derived &as(Handle *handle) {
    using Base = std::conditional_t<
        std::is_same_v<Handle, bp_memory>, Memory,
        std::conditional_t<std::is_same_v<Handle, bp_kernel>, Kernel,
                           std::conditional_t<std::is_same_v<Handle, bp_event>, Event,
                                              std::conditional_t<std::is_same_v<Handle, bp_comm>,
                                                                 Comm, Stream>>>>;
    static_assert(!std::is_same_v<Handle, bp_graph>, "use sdk::as<Derived>(Graph &)");
    return static_cast<Derived &>(detail::fromHandle<Base>(handle));
}

} // namespace backplane::sdk

/// Defines the plugin's entry symbol for plugin class PLUGIN_CLASS (see the top of this file).
#define BACKPLANE_PLUGIN(PLUGIN_CLASS)                                                             \
    extern "C" BP_PLUGIN_EXPORT const bp_plugin_api *bp_get_plugin_api(void) {                     \
        return ::backplane::sdk::detail::pluginApi<PLUGIN_CLASS>();                               \
    }
