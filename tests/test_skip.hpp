// When a test executable may SKIP (exit 77): only when its hardware or the hardware's driver is
// absent, with the reason printed; any other error while it sets up is a failure (exit 1).
#pragma once

#include <backplane/error.hpp>

#include <cstdio>
#include <exception>
#include <string>

namespace backplane::test {

/// Meson's exit status for a skipped test.
inline constexpr int kSkipExitCode = 77;
/// The exit status of a test executable that could not set up its tests.
inline constexpr int kFailExitCode = 1;

/// Whether `e` says that the hardware under test is absent: a backplane::Error with code NoDriver
/// (the vendor runtime is not installed or does not start) or NoDevice (it reports no device).
/// Anything else (a plugin that does not load or whose init fails, a probe failing with any other
/// code, an exception that is not a backplane::Error) is not.
inline bool hardwareAbsent(const std::exception &e) {
    const auto *error = dynamic_cast<const Error *>(&e);
    return error != nullptr &&
           (error->code() == ErrorCode::NoDriver || error->code() == ErrorCode::NoDevice);
}

/// Prints "SKIP: <why>" to stdout and returns 77: for a probe that worked and found no device.
inline int skip(const std::string &why) {
    std::printf("SKIP: %s\n", why.c_str());
    std::fflush(stdout);
    return kSkipExitCode;
}

/// Prints "FAIL: <why>" to stderr and returns 1.
inline int fail(const std::string &why) {
    std::fprintf(stderr, "FAIL: %s\n", why.c_str());
    return kFailExitCode;
}

/// The exit status of a test executable after `e` was thrown while `what` ran (opening or
/// probing the plugin under test, e.g. "opening the cuda plugin"): skip() with the message when
/// hardwareAbsent(e), otherwise fail() with the message and the error code.
inline int skipOrFail(const std::exception &e, const std::string &what) {
    if (hardwareAbsent(e)) return skip(what + ": " + e.what());
    const auto *error = dynamic_cast<const Error *>(&e);
    const std::string kind = error != nullptr ? std::string("backplane::Error ") +
                                                    toString(error->code())
                                              : std::string("not a backplane::Error");
    return fail(what + ": " + e.what() + " (" + kind + "; only no_driver and no_device skip)");
}

} // namespace backplane::test
