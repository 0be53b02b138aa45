// The kernel language without a device: the recorder's rules, the generated text of every
// generator against golden files, and Kernel::prepare's checks. Public API only.
#include "every_type.hpp"

#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/lang.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <fstream>
#include <functional>
#include <optional>
#include <sstream>
#include <string>
#include <type_traits>

using namespace backplane;
using lang::Value;

// What must not compile: a device bool in a C++ `if`, reassigning an immutable Value.
static_assert(!std::is_convertible_v<Value<bool>, bool>);
static_assert(!std::is_constructible_v<bool, Value<bool>>);
static_assert(!std::is_copy_assignable_v<Value<float>>);
static_assert(!std::is_convertible_v<Value<uint32_t>, Value<float>>);

namespace {

std::string readFile(const std::string &path) {
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
}

/// Compares `text` with golden file `name`; with BACKPLANE_UPDATE_GOLDEN=1 rewrites it instead.
void checkGolden(const std::string &text, const std::string &name) {
    const std::string path = std::string(GOLDEN_DIR) + "/" + name;
    if (const char *update = std::getenv("BACKPLANE_UPDATE_GOLDEN"); update && *update == '1') {
        std::ofstream(path) << text;
        return;
    }
    const std::string want = readFile(path);
    INFO("golden file " << path << " (BACKPLANE_UPDATE_GOLDEN=1 rewrites it)");
    CHECK(text == want);
}

std::string errorOf(const std::function<void()> &record) {
    try {
        record();
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::InvalidArgument));
        return e.what();
    }
    return "";
}

} // namespace

TEST_CASE("every generator prints saxpy and the tiled matmul as the golden files say") {
    const lang::Kernel saxpy = kernels::saxpy();
    checkGolden(saxpy.text(Dialect::Cuda), "saxpy.cu");
    checkGolden(saxpy.text(Dialect::Hip), "saxpy.hip");
    checkGolden(saxpy.text(Dialect::Glsl), "saxpy.comp");
    checkGolden(saxpy.text(Dialect::Host), "saxpy.ir");
    const lang::Kernel reduce = kernels::reduceSum<float>(64);
    checkGolden(reduce.text(Dialect::Cuda), "reduce_sum_f32_64.cu");
    checkGolden(reduce.text(Dialect::Glsl), "reduce_sum_f32_64.comp");
    const lang::Kernel matmul = kernels::matmul({32, 2, 8});
    checkGolden(matmul.text(Dialect::Cuda), "matmul_t32_w2_k8.cu");
    checkGolden(matmul.text(Dialect::Glsl), "matmul_t32_w2_k8.comp");
    // Every element type (issue 25): the CUDA and GLSL printers and the IR listing.
    const lang::Kernel types = test::everyType();
    checkGolden(types.text(Dialect::Cuda), "every_type.cu");
    checkGolden(types.text(Dialect::Glsl), "every_type.comp");
    checkGolden(types.text(Dialect::Host), "every_type.ir");
    // Matrix units and vectors: CUDA's mma.sync / ldmatrix / 16-byte accesses, GLSL's
    // cooperative matrices, the IR; bf16 and tf32 tiles are CUDA's alone.
    const lang::Kernel matrix = test::matrixAndVectors();
    checkGolden(matrix.text(Dialect::Cuda), "matrix_and_vectors.cu");
    checkGolden(matrix.text(Dialect::Glsl), "matrix_and_vectors.comp");
    checkGolden(matrix.text(Dialect::Host), "matrix_and_vectors.ir");
    checkGolden(test::matrixBf16Tf32().text(Dialect::Cuda), "matrix_bf16_tf32.cu");
    // Asynchronous copies: cp.async and dynamic shared memory (CUDA), plain copies (HIP, GLSL).
    const lang::Kernel copies = test::asyncCopies();
    checkGolden(copies.text(Dialect::Cuda), "async_copies.cu");
    checkGolden(copies.text(Dialect::Hip), "async_copies.hip");
    checkGolden(copies.text(Dialect::Glsl), "async_copies.comp");
    checkGolden(copies.text(Dialect::Host), "async_copies.ir");
    // What GLSL and HIP cannot express is an #error naming it (the compile fails with it).
    CHECK(test::matrixBf16Tf32().text(Dialect::Glsl).find("#error bf16 matrices") != std::string::npos);
    CHECK(matrix.text(Dialect::Hip).find("#error matrix units are not lowered for HIP") != std::string::npos);
}

TEST_CASE("a kernel carries its variants in preference order and plain C++ values as literals") {
    const lang::Kernel a = kernels::matmul({16, 1, 16}), b = kernels::matmul({32, 2, 16});
    REQUIRE(a.source().variants.size() == 5);
    CHECK((a.source().variants[0].dialect == Dialect::Cuda));
    CHECK((a.source().variants[1].dialect == Dialect::Hip));
    CHECK((a.source().variants[2].dialect == Dialect::Glsl));
    CHECK((a.source().variants[3].dialect == Dialect::Cpp)); // compiled by the host plugin
    CHECK(a.source().variants[3].entryPoint == "bp_host_matmul_t16_w1_k16");
    CHECK((a.source().variants[4].dialect == Dialect::Host)); // the interpreter
    CHECK(a.source().variants[4].hostData != nullptr);
    // Tile sizes are constants: different sizes are different sources, i.e. cache keys.
    CHECK(a.source().variants[0].source != b.source().variants[0].source);
    CHECK(a.text(Dialect::Cuda).find("a0[256]") != std::string::npos); // 16 x 16 shared tile
    CHECK(a.bindingCount() == 3);
    CHECK(a.scalarBytes() == 12);
    // Recording twice gives the same text.
    CHECK(kernels::matmul({16, 1, 16}).text(Dialect::Glsl) == a.text(Dialect::Glsl));
}

TEST_CASE("a barrier under thread-dependent control flow is refused while recording") {
    CHECK(errorOf([] {
              lang::kernel("divergent_if", [](lang::Builder &k) {
                  k.If(k.localId().x < 4u, [&] { k.barrier(); });
              });
          }).find("thread-dependent control flow") != std::string::npos);
    // After a thread-dependent return, the rest of the kernel is divergent.
    CHECK(errorOf([] {
              lang::kernel("divergent_return", [](lang::Builder &k) {
                  k.If(k.globalId().x >= 100u, [&] { k.Return(); });
                  k.barrier();
              });
          }) != "");
    // A loop some threads leave early, barrier before or after the break.
    CHECK(errorOf([] {
              lang::kernel("divergent_break", [](lang::Builder &k) {
                  auto n = k.scalar<uint32_t>();
                  k.For(0u, n, [&](Value<uint32_t> i) {
                      k.barrier();
                      k.If(i == k.localId().x, [&] { k.Break(); });
                  });
              });
          }) != "");
    // A variable that decides a loop holding a barrier and is later assigned a thread id.
    CHECK(errorOf([] {
              lang::kernel("divergent_var", [](lang::Builder &k) {
                  auto n = k.scalar<uint32_t>();
                  auto i = k.var<uint32_t>(0u);
                  k.While([&] { return i < n; }, [&] {
                      k.barrier();
                      i = i + k.localId().x;
                  });
              });
          }).find("variable v0") != std::string::npos);
    // A thread-dependent value loaded from memory decides nothing uniform either.
    CHECK(errorOf([] {
              lang::kernel("divergent_load", [](lang::Builder &k) {
                  auto x = k.input<uint32_t>();
                  k.If(x[0u] == 1u, [&] { k.barrier(); });
              });
          }) != "");
    // Uniform conditions are fine: scalars, group ids, constants, loop indices over them.
    CHECK_NOTHROW(lang::kernel("uniform", [](lang::Builder &k) {
        auto n = k.scalar<uint32_t>();
        k.If(k.groupId().x < n, [&] { k.barrier(); });
        k.For(0u, n, 2u, [&](Value<uint32_t>) { k.barrier(); });
        auto i = k.var<uint32_t>(0u);
        k.While([&] { return i < n; }, [&] {
            k.barrier();
            i = i + 1u;
        });
    }));
}

TEST_CASE("values cannot leave the block that computed them, nor cross kernels") {
    CHECK(errorOf([] {
              lang::kernel("escape", [](lang::Builder &k) {
                  auto y = k.output<float>();
                  std::optional<Value<float>> inside;
                  k.If(k.globalId().x < 4u, [&] { inside.emplace(Value<float>(2.0f) * 3.0f); });
                  y[0u] = *inside;
              });
          }).find("declare a k.var") != std::string::npos);
    std::optional<Value<uint32_t>> stolen;
    lang::kernel("first", [&](lang::Builder &k) { stolen.emplace(k.globalId().x); });
    CHECK(errorOf([&] {
              lang::kernel("second", [&](lang::Builder &k) {
                  auto y = k.output<uint32_t>();
                  y[0u] = *stolen;
              });
          }).find("another kernel") != std::string::npos);
    // Outside any kernel.
    CHECK_THROWS_AS(Value<float>(1.0f), Error);
}

TEST_CASE("memory access rules: read-only inputs, write-only outputs, typed stores") {
    CHECK(errorOf([] {
              lang::kernel("store_input", [](lang::Builder &k) {
                  auto x = k.input<float>();
                  x[0u] = 1.0f;
              });
          }).find("read-only") != std::string::npos);
    CHECK(errorOf([] {
              lang::kernel("load_output", [](lang::Builder &k) {
                  auto y = k.output<float>();
                  auto z = k.output<float>();
                  z[0u] = y[0u];
              });
          }).find("write-only") != std::string::npos);
    CHECK(errorOf([] {
              lang::kernel("atomic_input", [](lang::Builder &k) {
                  auto x = k.input<uint32_t>();
                  atomicAdd(x[0u], 1u);
              });
          }) != "");
    CHECK(errorOf([] {
              lang::kernel("break_outside", [](lang::Builder &k) { k.Break(); });
          }).find("outside a k.For") != std::string::npos);
}

TEST_CASE("prepare checks the dispatch against the signature and appends lengths") {
    const lang::Kernel k = lang::kernel("lengths", [](lang::Builder &b) {
        auto x = b.input<float>();
        auto y = b.output<float>();
        auto a = b.scalar<float>();
        auto i = b.globalId().x;
        b.If(i < x.length(), [&] { y[i] = x[i] * a; });
    });
    Dispatch d;
    d.scalar(2.0f);
    std::string message;
    try {
        k.prepare(d);
    } catch (const Error &e) {
        message = e.what();
    }
    CHECK(message.find("kernel 'lengths'") != std::string::npos);
    CHECK(message.find("0 bindings, the kernel declares 2") != std::string::npos);
    CHECK(k.text(Dialect::Cuda).find("unsigned len0;") != std::string::npos);
    CHECK(k.text(Dialect::Glsl).find("uint len0;") != std::string::npos);
    CHECK(k.text(Dialect::Cuda).find("len1") == std::string::npos); // y's length is not read
}

// Found by review: holes the recorder closed.
TEST_CASE("uniformity follows copies between variables and early loop exits") {
    // A copy of a variable that turns thread-dependent later in the loop decides the barrier.
    CHECK(errorOf([] {
              lang::kernel("via_copy", [](lang::Builder &k) {
                  auto n = k.scalar<uint32_t>();
                  auto v = k.var<uint32_t>(0u);
                  k.For(0u, n, [&](Value<uint32_t>) {
                      auto w = k.var<uint32_t>(0u);
                      w = v;
                      k.If(w < 2u, [&] { k.barrier(); });
                      v = k.localId().x;
                  });
              });
          }).find("becomes thread-dependent") != std::string::npos);
    // After a loop some threads left early (break or continue), what it counted differs.
    for (bool useBreak : {true, false}) {
        CAPTURE(useBreak);
        CHECK(errorOf([&] {
                  lang::kernel("after_exit", [&](lang::Builder &k) {
                      auto v = k.var<uint32_t>(0u);
                      k.For(0u, 8u, [&](Value<uint32_t> i) {
                          k.If(i == k.localId().x, [&] { useBreak ? k.Break() : k.Continue(); });
                          v += 1u;
                      });
                      k.If(v == 4u, [&] { k.barrier(); });
                  });
              }) != "");
    }
}

TEST_CASE("a refusal the body catches still fails the kernel; nesting and handles are checked") {
    CHECK(errorOf([] {
              lang::kernel("caught", [](lang::Builder &k) {
                  auto y = k.output<uint32_t>();
                  try {
                      k.While([&] { return y[0u] == 1u; }, [] {});
                  } catch (const Error &) {
                  }
                  y[0u] = 1u;
              });
          }).find("caught this error") != std::string::npos);
    CHECK(errorOf([] {
              lang::kernel("deep", [](lang::Builder &k) {
                  std::function<void(int)> nest = [&](int depth) {
                      if (depth > 0) k.If(k.localId().x < 1000u, [&] { nest(depth - 1); });
                  };
                  nest(300);
              });
          }).find("nested deeper") != std::string::npos);
    std::optional<lang::Binding<uint32_t>> binding;
    std::optional<lang::Array<uint32_t>> array;
    lang::kernel("first", [&](lang::Builder &k) {
        binding.emplace(k.inout<uint32_t>());
        array.emplace(k.shared<uint32_t>(4));
    });
    CHECK(errorOf([&] {
              lang::kernel("second", [&](lang::Builder &k) {
                  auto own = k.inout<uint32_t>();
                  (*binding)[0u] = 1u;
                  own[0u] = 2u;
              });
          }).find("another kernel") != std::string::npos);
    CHECK(errorOf([&] {
              lang::kernel("third", [&](lang::Builder &k) {
                  auto y = k.output<uint32_t>();
                  y[0u] = (*array)[0u];
              });
          }).find("another kernel") != std::string::npos);
    CHECK(errorOf([] {
              lang::kernel("bool_order", [](lang::Builder &k) {
                  auto y = k.output<uint32_t>();
                  Value<bool> a = k.localId().x < 1u, b = k.localId().y < 1u;
                  y[0u] = lang::cast<uint32_t>(lang::select(a, b, a));
                  (void)lang::min(a, b);
              });
          }).find("on bool values") != std::string::npos);
}

TEST_CASE("names cannot inject code, and keywords get a prefix") {
    const lang::Kernel injected = lang::kernel("scale\n#error injected", [](lang::Builder &k) {
        auto y = k.output<float>();
        y[0u] = -Value<float>(-0.5f);
    });
    for (Dialect d : {Dialect::Cuda, Dialect::Glsl}) {
        CHECK(injected.text(d).find("\n#error") == std::string::npos);
        CHECK(injected.text(d).find("-(-0.5f)") != std::string::npos);
    }
    CHECK(lang::kernel("new", [](lang::Builder &) {}).source().variants[0].entryPoint == "k_new");
    CHECK(lang::kernel("main", [](lang::Builder &) {}).source().variants[0].entryPoint == "k_main");
}

TEST_CASE("the host key tells apart kernels that differ only in an atomic or a loop's signedness") {
    auto withAtomic = [](bool max) {
        return lang::kernel("atomic", [max](lang::Builder &k) {
            auto y = k.inout<uint32_t>();
            if (max) atomicMax(y[0u], 3u);
            else atomicAdd(y[0u], 3u);
        });
    };
    CHECK(withAtomic(true).source().variants[3].source != withAtomic(false).source().variants[3].source);
    const lang::Kernel u = lang::kernel("loop", [](lang::Builder &k) {
        auto y = k.inout<uint32_t>();
        k.For(0xfffffffdu, 3u, [&](Value<uint32_t>) { y[0u] = 1u; });
    });
    const lang::Kernel s = lang::kernel("loop", [](lang::Builder &k) {
        auto y = k.inout<uint32_t>();
        k.For<int32_t>(-3, 3, [&](Value<int32_t>) { y[0u] = 1u; });
    });
    CHECK(u.source().variants[3].source != s.source().variants[3].source);
}

TEST_CASE("missingOn names what a device's features lack, including a float cast through f64") {
    KernelFeatures all;
    all.storage = all.arithmetic = all.atomicAdd = all.atomicBits = (1u << kElementTypeCount) - 1;
    CHECK(test::everyType().missingOn(all).empty());
    const lang::Kernel toI64 = lang::kernel("float_to_i64", [](lang::Builder &b) {
        auto f = b.input<float>();
        auto o = b.output<int64_t>();
        auto i = b.globalId().x;
        o[i] = lang::cast<int64_t>(f[i]);
    });
    CHECK(toI64.missingOn(all).empty());
    KernelFeatures noF64 = all;
    noF64.arithmetic &= ~(1u << static_cast<int>(ElementType::F64));
    CHECK(toI64.missingOn(noF64).find("through f64") != std::string::npos);
    KernelFeatures noF16 = all;
    noF16.storage &= ~(1u << static_cast<int>(ElementType::F16));
    CHECK(test::everyType().missingOn(noF16) == "f16 buffers");
    KernelFeatures noAtomic = all;
    noAtomic.atomicAdd &= ~(1u << static_cast<int>(ElementType::I64));
    CHECK(test::everyType().missingOn(noAtomic) == "i64 atomicAdd");
}
