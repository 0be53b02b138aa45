// backplane::Error: the one error type of the public C++ API.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace backplane {

/// What went wrong, independent of the backend. Plugin statuses map one to one onto the first
/// group; the rest come from the core.
enum class ErrorCode {
    InvalidArgument,  ///< a caller broke a documented precondition
    Unsupported,      ///< the device or plugin does not offer the operation
    OutOfMemory,      ///< an allocation failed after the core released cached memory and retried
    NotFound,         ///< no such device, kernel entry point, cache entry...
    NoDriver,         ///< a plugin's vendor runtime is missing
    NoDevice,         ///< a plugin's vendor runtime reports no device
    DeviceLost,       ///< the device hit a sticky error; open it again or use another one
    Compile,          ///< a kernel failed to compile; the message carries the compiler log
    Launch,           ///< a launch was rejected (resources, block size, bindings)
    Timeout,          ///< a wait ran out of time
    Internal,         ///< a bug in backplane or a plugin
    Config,           ///< a config file or environment value is invalid (message: file + JSON path)
    PluginLoad,       ///< a plugin could not be loaded (message: file and loader text)
    NoMatchingDevice, ///< device selection found nothing and `required` was set
    Remote,           ///< a peer of a collective failed, left or timed out (communicator unusable)
    Poisoned,         ///< the bytes read were to be written by an operation that failed (the
                      ///< message names it); write them again before reading them
};

/// Stable lower-case name of a code ("out_of_memory"), as used in JSON output.
const char *toString(ErrorCode code) noexcept;

/// Thrown by every public backplane function that fails; nothing else escapes the API except
/// std::bad_alloc. `backend()` names the plugin involved ("" for core errors); `vendorCode()` is
/// the raw vendor status (CUresult, VkResult...) or 0.
class Error : public std::runtime_error {
public:
    Error(ErrorCode code, const std::string &message, std::string backend = {},
          int64_t vendorCode = 0)
        : std::runtime_error(message), code_(code), backend_(std::move(backend)),
          vendorCode_(vendorCode) {}

    ErrorCode code() const noexcept { return code_; }
    const std::string &backend() const noexcept { return backend_; }
    int64_t vendorCode() const noexcept { return vendorCode_; }

private:
    ErrorCode code_;
    std::string backend_;
    int64_t vendorCode_;
};

} // namespace backplane
