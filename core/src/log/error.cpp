// Names of backplane::ErrorCode values.
#include <backplane/error.hpp>

namespace backplane {

const char *toString(ErrorCode code) noexcept {
    switch (code) {
    case ErrorCode::InvalidArgument: return "invalid_argument";
    case ErrorCode::Unsupported: return "unsupported";
    case ErrorCode::OutOfMemory: return "out_of_memory";
    case ErrorCode::NotFound: return "not_found";
    case ErrorCode::NoDriver: return "no_driver";
    case ErrorCode::NoDevice: return "no_device";
    case ErrorCode::DeviceLost: return "device_lost";
    case ErrorCode::Compile: return "compile";
    case ErrorCode::Launch: return "launch";
    case ErrorCode::Timeout: return "timeout";
    case ErrorCode::Internal: return "internal";
    case ErrorCode::Config: return "config";
    case ErrorCode::PluginLoad: return "plugin_load";
    case ErrorCode::NoMatchingDevice: return "no_matching_device";
    case ErrorCode::Remote: return "remote";
    case ErrorCode::Poisoned: return "poisoned";
    }
    return "internal";
}

} // namespace backplane
