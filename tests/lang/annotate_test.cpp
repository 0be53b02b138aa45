// A compile error of a generated source names the generated line (core/src/lang/kernel.cpp);
// tests internals (lang/ir.hpp), with the message formats of NVRTC, hiprtc and glslang.
#include "lang/ir.hpp"

#include <backplane/kernels.hpp>

#include <doctest/doctest.h>

#include <string>

using namespace backplane;

TEST_CASE("a compile error of generated code quotes the generated line it names") {
    const lang::Kernel saxpy = kernels::saxpy();
    const lang::detail::Module &m = saxpy.module();
    // Line 4 of the CUDA text is the bounds check; line 16 of the GLSL text is the fma.
    const std::string nvrtc = lang::detail::annotateCompileError(
        m, Dialect::Cuda, "saxpy.cu(4): error: identifier \"q\" is undefined");
    CHECK(nvrtc.find("generated cuda line 4 of kernel 'saxpy': ") != std::string::npos);
    CHECK(nvrtc.find("bool v5 = ") != std::string::npos);
    const std::string hiprtc = lang::detail::annotateCompileError(
        m, Dialect::Hip, "saxpy.hip:4:5: error: use of undeclared identifier 'q'");
    CHECK(hiprtc.find("generated hip line 4") != std::string::npos);
    const std::string glslang = lang::detail::annotateCompileError(
        m, Dialect::Glsl, "shader: ERROR: 0:16: 'fma' : no matching overloaded function found");
    CHECK(glslang.find("generated glsl line 16") != std::string::npos);
    CHECK(glslang.find("fma(s.s0, v7, v6)") != std::string::npos);
    // No usable line number: still says where the source is.
    const std::string none = lang::detail::annotateCompileError(m, Dialect::Cuda, "out of memory");
    CHECK(none.find("backplane kernels dump saxpy") != std::string::npos);
    CHECK(none.find("generated cuda line") == std::string::npos);
}
