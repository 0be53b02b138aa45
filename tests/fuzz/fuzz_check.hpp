// What every harness checks: a reader given any bytes returns or throws backplane::Error.
#pragma once

#include <backplane/error.hpp>

#include <cxxabi.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>
#include <string_view>
#include <typeinfo>

namespace backplane::fuzz {

/// The fuzzer's bytes as text (the readers take any bytes, NUL and invalid UTF-8 included).
inline std::string_view asText(const uint8_t *data, size_t size) {
    return {reinterpret_cast<const char *>(data), size};
}

/// The C++ name of `type` ("nlohmann::...::out_of_range"), or its mangled name.
inline std::string typeName(const std::type_info &type) {
    int status = 0;
    char *name = abi::__cxa_demangle(type.name(), nullptr, nullptr, &status);
    std::string out = status == 0 && name != nullptr ? name : type.name();
    std::free(name);
    return out;
}

/// Runs `read`. An Error is the documented answer to bad input; anything else that escapes
/// (another std::exception, std::bad_alloc included, or a non-standard type) is a finding: it is
/// printed and the process aborts, so libFuzzer saves the input and prints the stack.
template <typename Read> void expectReturnOrError(const char *reader, Read &&read) {
    try {
        read();
    } catch (const Error &) { // NOLINT(bugprone-empty-catch): rejecting the input is fine
    } catch (const std::exception &e) {
        std::fprintf(stderr, "FINDING: %s let %s escape: %s\n", reader, typeName(typeid(e)).c_str(),
                     e.what());
        std::abort();
    } catch (...) {
        std::fprintf(stderr, "FINDING: %s let an exception of a non-standard type escape\n",
                     reader);
        std::abort();
    }
}

/// A broken invariant of a reader's result: printed, then abort.
[[noreturn]] inline void finding(const char *reader, const char *what) {
    std::fprintf(stderr, "FINDING: %s: %s\n", reader, what);
    std::abort();
}

} // namespace backplane::fuzz
