// The caller's side of the plugin ABI: struct builders, move-only handle owners, status checks.
#pragma once

// plugin_sdk.hpp helps the one who writes a plugin; this header helps the one who calls one (the
// core, the backplane tool, the conformance suite, tests), so that none of them writes its own
// RAII over the C table or fills struct_size by hand:
//
//   namespace abi = backplane::abi;
//   auto args = abi::make<bp_stream_create_args>();        // zeroed, struct_size set
//   bp_error error = abi::make<bp_error>();
//   bp_stream *raw = nullptr;
//   abi::check(api.stream_create(device, &args, &raw, &error), &error, "stream_create");
//   abi::Owned<bp_stream> stream(api, device, raw);         // stream_destroy when it goes
//
// Header-only: it needs plugin.h, backplane/error.hpp (itself header-only apart from
// toString(ErrorCode), which nothing here calls) and the standard library, and links nothing.
// The status -> ErrorCode mapping and the sanitising of plugin text below are the only ones: the
// core's own checks use them too, so a failure reads the same whoever made the call.

#include <backplane/abi/plugin.h>
#include <backplane/error.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace backplane::abi {

/// A value-initialised ABI struct (every field zero) with struct_size = sizeof(T): the way to
/// build any argument, result or error struct (`make<bp_launch_args>()`, `make<bp_error>()`).
template <class T> constexpr T make() noexcept {
    T value{};
    value.struct_size = sizeof(T);
    return value;
}

/// The table entry that releases a handle of type T (plugin.h). Only these types have one, so
/// an Owned of any other type does not compile.
template <class T> struct ReleaseEntry;
template <> struct ReleaseEntry<bp_memory> {
    static constexpr auto entry = &bp_plugin_api::memory_free;
};
template <> struct ReleaseEntry<bp_stream> {
    static constexpr auto entry = &bp_plugin_api::stream_destroy;
};
template <> struct ReleaseEntry<bp_event> {
    static constexpr auto entry = &bp_plugin_api::event_release;
};
template <> struct ReleaseEntry<bp_kernel> {
    static constexpr auto entry = &bp_plugin_api::kernel_release;
};
template <> struct ReleaseEntry<bp_comm> {
    static constexpr auto entry = &bp_plugin_api::comm_destroy;
};
template <> struct ReleaseEntry<bp_graph> {
    static constexpr auto entry = &bp_plugin_api::graph_release;
};
template <> struct ReleaseEntry<bp_device> {
    static constexpr auto entry = &bp_plugin_api::device_close;
};
template <> struct ReleaseEntry<bp_plugin> {
    static constexpr auto entry = &bp_plugin_api::plugin_destroy;
};

/// Releases `handle` through its table entry: `device` is the device it belongs to, unused for
/// a bp_device or bp_plugin (their release functions take the handle alone).
template <class T> void releaseHandle(const bp_plugin_api &api, bp_device *device, T *handle) {
    const auto release = api.*ReleaseEntry<T>::entry;
    if constexpr (std::is_invocable_v<decltype(release), T *>) {
        (void)device;
        release(handle);
    } else {
        release(device, handle);
    }
}

/// Owns one plugin handle (bp_memory, bp_stream, bp_event, bp_kernel, bp_comm, bp_graph, or a
/// bp_device / bp_plugin itself) and releases it exactly once, through the table it came from,
/// when it is destroyed, reset or assigned over. Move-only; a moved-from owner is empty. An empty
/// owner (NULL handle) releases nothing.
///
/// Ownership: it borrows the table and the device; both must outlive it (declare an owner after
/// the device it comes from, so it goes first; the ABI forbids releasing after device_close). It
/// does not keep the plugin library loaded. Releasing calls the table without a status: the
/// ABI's release functions cannot fail, and one that throws breaks the ABI (std::terminate).
/// Thread-safety: none of its own; the ABI's rules for the handle apply.
template <class T> class Owned {
public:
    Owned() = default;
    /// Takes `handle`, a handle of `device` made through `api` (may be NULL: an empty owner).
    Owned(const bp_plugin_api &api, bp_device *device, T *handle) noexcept
        : api_(&api), device_(device), handle_(handle) {}
    /// Takes an opened device or a plugin instance (their release needs no parent).
    Owned(const bp_plugin_api &api, T *handle) noexcept : Owned(api, nullptr, handle) {}
    ~Owned() { reset(); }
    Owned(Owned &&other) noexcept
        : api_(other.api_), device_(other.device_), handle_(std::exchange(other.handle_, nullptr)) {
    }
    Owned &operator=(Owned &&other) noexcept {
        if (this != &other) {
            reset();
            api_ = other.api_;
            device_ = other.device_;
            handle_ = std::exchange(other.handle_, nullptr);
        }
        return *this;
    }
    Owned(const Owned &) = delete;
    Owned &operator=(const Owned &) = delete;

    /// The handle, still owned (NULL when empty).
    T *get() const noexcept { return handle_; }
    explicit operator bool() const noexcept { return handle_ != nullptr; }
    /// The device the handle belongs to (NULL for a bp_device or bp_plugin owner).
    bp_device *device() const noexcept { return device_; }
    /// Gives up ownership without releasing: the caller now releases the handle.
    T *release() noexcept { return std::exchange(handle_, nullptr); }
    /// Releases the handle now (cases that test release order); empty afterwards.
    void reset() noexcept {
        if (handle_ != nullptr) releaseHandle(*api_, device_, std::exchange(handle_, nullptr));
    }

private:
    const bp_plugin_api *api_ = nullptr;
    bp_device *device_ = nullptr;
    T *handle_ = nullptr;
};

/// The ErrorCode of a failed status: the one mapping of the C++ API (the core's checks use it).
/// A code this header does not know, and BP_ERROR_NOT_READY (not a failure), map to Internal.
constexpr ErrorCode toErrorCode(bp_status status) noexcept {
    switch (status) {
    case BP_ERROR_INVALID_ARGUMENT: return ErrorCode::InvalidArgument;
    case BP_ERROR_UNSUPPORTED: return ErrorCode::Unsupported;
    case BP_ERROR_OUT_OF_MEMORY: return ErrorCode::OutOfMemory;
    case BP_ERROR_NOT_FOUND: return ErrorCode::NotFound;
    case BP_ERROR_NO_DRIVER: return ErrorCode::NoDriver;
    case BP_ERROR_NO_DEVICE: return ErrorCode::NoDevice;
    case BP_ERROR_DEVICE_LOST: return ErrorCode::DeviceLost;
    case BP_ERROR_COMPILE: return ErrorCode::Compile;
    case BP_ERROR_LAUNCH: return ErrorCode::Launch;
    case BP_ERROR_TIMEOUT: return ErrorCode::Timeout;
    case BP_ERROR_REMOTE: return ErrorCode::Remote;
    default: return ErrorCode::Internal;
    }
}

/// Length of the valid UTF-8 sequence at `p` (at most `left` bytes), or 0 when it is invalid.
inline size_t utf8Length(const unsigned char *p, size_t left) noexcept {
    const unsigned char c = p[0];
    size_t n = 0;
    uint32_t min = 0;
    if (c < 0x80) return 1;
    if ((c & 0xe0) == 0xc0) n = 2, min = 0x80;
    else if ((c & 0xf0) == 0xe0) n = 3, min = 0x800;
    else if ((c & 0xf8) == 0xf0) n = 4, min = 0x10000;
    else return 0;
    if (n > left) return 0;
    uint32_t code = c & (0x7f >> n);
    for (size_t i = 1; i < n; ++i) {
        if ((p[i] & 0xc0) != 0x80) return 0;
        code = (code << 6) | (p[i] & 0x3f);
    }
    if (code < min || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
    return n;
}

/// A fixed-size text field a plugin filled (an error message, a device name): cut at the first
/// NUL or at `capacity`, invalid UTF-8 and control characters replaced by '?', so it is safe to
/// print and to put in JSON. Throws std::bad_alloc only.
inline std::string fieldText(const char *text, size_t capacity) {
    const auto *bytes = reinterpret_cast<const unsigned char *>(text);
    const size_t size = strnlen(text, capacity);
    std::string out;
    out.reserve(size);
    for (size_t i = 0; i < size;) {
        const size_t n = utf8Length(bytes + i, size - i);
        if (n == 0 || (n == 1 && (bytes[i] < 0x20 || bytes[i] == 0x7f))) {
            out += '?';
            ++i;
            continue;
        }
        out.append(text + i, n);
        i += n;
    }
    return out;
}

/// The message a plugin wrote into `error`, through fieldText.
inline std::string errorText(const bp_error &error) {
    return fieldText(error.message, sizeof(error.message));
}

/// Throws the Error of a failed `status`: code toErrorCode(status), message "<what>: <the
/// plugin's message>" (just `what` when the plugin wrote none or `error` is NULL), the given
/// backend (the plugin's name, "" when not known) and error->vendor_code.
[[noreturn]] inline void throwStatus(bp_status status, const bp_error *error, std::string what,
                                     std::string backend = {}) {
    if (error != nullptr) {
        if (const std::string text = errorText(*error); !text.empty()) what += ": " + text;
    }
    throw Error(toErrorCode(status), what, std::move(backend),
                error != nullptr ? error->vendor_code : 0);
}

/// Does nothing for BP_SUCCESS; otherwise throws as throwStatus does. `error` is the bp_error
/// passed to the failed call (may be NULL); `what` names the call ("stream_create").
inline void check(bp_status status, const bp_error *error, std::string_view what,
                  std::string_view backend = {}) {
    if (status != BP_SUCCESS) throwStatus(status, error, std::string(what), std::string(backend));
}

} // namespace backplane::abi
