// Conformance cases "kernel.*": kernel_compile, kernel_load, kernel_launch and kernel_release
// through the raw table, in every dialect the device declares, on the happy path and the error
// paths (a rejected launch returns a status, runs nothing and leaves the stream usable).
#include "handles.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

namespace backplane::conformance {
namespace {


constexpr uint32_t kSpirvMagic = 0x07230203u;
constexpr bp_dialect kAllDialects[] = {BP_DIALECT_CUDA, BP_DIALECT_HIP,  BP_DIALECT_GLSL,
                                       BP_DIALECT_SPIRV, BP_DIALECT_HOST, BP_DIALECT_CPP};

std::string dims(const uint32_t v[3]) {
    return std::to_string(v[0]) + "x" + std::to_string(v[1]) + "x" + std::to_string(v[2]);
}


/// The dialects the device declares, in enum order.
std::vector<bp_dialect> declaredDialects(const CaseContext &ctx) {
    std::vector<bp_dialect> out;
    for (const bp_dialect d : kAllDialects)
        if (ctx.accepts(d)) out.push_back(d);
    return out;
}

/// Text dialects (compiled from source by the plugin) the suite has kernels in.
bool isText(bp_dialect d) {
    return d == BP_DIALECT_GLSL || d == BP_DIALECT_CUDA || d == BP_DIALECT_HIP;
}

/// A kernel source that owns its bytes (SPIR-V is produced at run time). Move-only: `text`
/// points into `bytes`.
struct Source {
    KernelText text;
    std::vector<uint8_t> bytes;
    Source() = default;
    Source(Source &&) = default;
    Source(const Source &) = delete;
};

/// Compiles with the sinks the suite uses; `log` may be NULL to pass a sink without `write`.
bp_status compile(const OpenDevice &device, bp_dialect dialect, const KernelText &text,
                  std::vector<uint8_t> &binary, std::string *log, bp_error &error) {
    if (log != nullptr) return compileKernel(device, dialect, text, binary, *log, error);
    auto args = abi::make<bp_kernel_compile_args>();
    args.dialect = dialect;
    args.entry_point = text.entry;
    args.source = text.source;
    args.source_size = text.size;
    args.binary = {&binary, [](void *user, const void *data, size_t size) {
                       auto *out = static_cast<std::vector<uint8_t> *>(user);
                       out->insert(out->end(), static_cast<const uint8_t *>(data),
                                   static_cast<const uint8_t *>(data) + size);
                   }};
    args.log = {nullptr, nullptr};
    return device.api().kernel_compile(device.get(), &args, &error);
}

/// Compiles `text` and returns the blob; fails the case (with the log) when compile fails.
std::vector<uint8_t> compileOrFail(const OpenDevice &device, bp_dialect dialect,
                                   const KernelText &text) {
    std::vector<uint8_t> binary;
    std::string log;
    bp_error error = makeError();
    const bp_status status = compileKernel(device, dialect, text, binary, log, error);
    if (status != BP_SUCCESS)
        succeed(status, error,
                "kernel_compile('" + std::string(text.entry) + "', " + sdk::dialectName(dialect) + ")" +
                    (log.empty() ? "" : " log: " + fieldText(log.data(), std::min<size_t>(log.size(), 2000))));
    require(!binary.empty(), "kernel_compile('" + std::string(text.entry) + "', " +
                                 sdk::dialectName(dialect) + ") succeeded but wrote no binary");
    return binary;
}

/// saxpy in `dialect`. SPIR-V is the suite's GLSL kernel compiled by the device itself: not
/// applicable when the device does not compile GLSL, or its GLSL blob is not SPIR-V.
Source saxpyIn(CaseContext &ctx, bp_dialect dialect) {
    Source s;
    if (dialect != BP_DIALECT_SPIRV) {
        s.text = saxpySource(dialect);
        return s;
    }
    if (!ctx.accepts(BP_DIALECT_GLSL))
        throw NotApplicable("the suite's SPIR-V kernel is its GLSL kernel compiled by the device, "
                            "and the device does not declare the glsl dialect");
    s.bytes = compileOrFail(ctx.device(), BP_DIALECT_GLSL, saxpySource(BP_DIALECT_GLSL));
    uint32_t magic = 0;
    if (s.bytes.size() >= 4) std::memcpy(&magic, s.bytes.data(), 4);
    if (magic != kSpirvMagic)
        throw NotApplicable("the device's GLSL blob is not SPIR-V (it does not start with "
                            "0x07230203), so the suite has no SPIR-V kernel for it");
    s.text = {s.bytes.data(), s.bytes.size(), "main"};
    return s;
}

bp_status load(const OpenDevice &device, bp_dialect dialect, const char *entry, const void *blob,
               size_t size, Kernel &out, bp_error &error) {
    auto args = abi::make<bp_kernel_load_args>();
    args.dialect = dialect;
    args.entry_point = entry;
    args.binary = blob;
    args.binary_size = size;
    bp_kernel *kernel = nullptr;
    const bp_status status = device.api().kernel_load(device.get(), &args, &kernel, &error);
    // Whatever came back is released, even from a call that should have failed.
    if (kernel != nullptr) out = Kernel(device.api(), device.get(), kernel);
    return status;
}

/// Compiles and loads `source`; fails the case when either fails.
Kernel compileAndLoad(CaseContext &ctx, bp_dialect dialect, const KernelText &text) {
    OpenDevice &device = ctx.device();
    const std::vector<uint8_t> blob = compileOrFail(device, dialect, text);
    Kernel kernel;
    bp_error error = makeError();
    succeed(load(device, dialect, text.entry, blob.data(), blob.size(), kernel, error), error,
            "kernel_load('" + std::string(text.entry) + "', " + sdk::dialectName(dialect) + ", " +
                std::to_string(blob.size()) + "-byte blob from kernel_compile)");
    require(kernel.get() != nullptr, "kernel_load succeeded but returned a NULL kernel");
    return kernel;
}

/// Checks that compiling, or else loading what compile produced, fails with one of `allowed`.
void expectCompileOrLoadFails(CaseContext &ctx, bp_dialect dialect, const KernelText &text,
                              std::initializer_list<bp_status> allowed, const std::string &what) {
    OpenDevice &device = ctx.device();
    std::vector<uint8_t> blob;
    std::string log;
    bp_error error = makeError();
    const bp_status status = compileKernel(device, dialect, text, blob, log, error);
    if (status != BP_SUCCESS) {
        expectFailure(status, error, allowed, "kernel_compile of " + what);
        return;
    }
    Kernel kernel;
    error = makeError();
    expectFailure(load(device, dialect, text.entry, blob.data(), blob.size(), kernel, error), error,
                  allowed, "kernel_compile of " + what + " succeeded, so kernel_load of its blob");
}

/// Deterministic, exactly representable inputs: x[i] in [-48, 48], y[i] in [0, 12].
std::vector<float> xValues(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<float>(static_cast<int>(i % 97) - 48);
    return v;
}
std::vector<float> yValues(size_t n) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; ++i)
        v[i] = static_cast<float>(i % 13);
    return v;
}

/// Compares every element; the message names the first wrong one.
void checkElements(const std::vector<float> &got, const std::vector<float> &expected,
                   const std::string &what) {
    require(got.size() == expected.size(), what + ": read back " + std::to_string(got.size()) +
                                               " floats, expected " +
                                               std::to_string(expected.size()));
    size_t wrong = 0, first = 0;
    for (size_t i = 0; i < got.size(); ++i)
        if (got[i] != expected[i] && wrong++ == 0) first = i;
    if (wrong > 0)
        throw CaseFailure(what + ": " + std::to_string(wrong) + " of " +
                          std::to_string(got.size()) + " elements wrong; first at index " +
                          std::to_string(first) + ": got " + std::to_string(got[first]) +
                          ", expected " + std::to_string(expected[first]));
}

constexpr float kA = 2.0f;

/// A loaded saxpy with its inputs on one stream: y = kA * x[xOffset/4 + i] + y for i < n.
/// x's page has slack past n floats so that bindings at an offset stay inside it. Not copyable
/// or movable: launch arguments point into it. Its destructor waits for the stream first, so
/// that a case failing with work in flight frees no page that work still uses.
class SaxpyRun {
public:
    explicit SaxpyRun(CaseContext &ctx, uint32_t count = 1000)
        : SaxpyRun(ctx, ctx.device().saxpyDialect(), count) {}

    SaxpyRun(CaseContext &ctx, bp_dialect dialect, uint32_t count)
        : device_(ctx.device()), n(count), stream(device_.createStream()) {
        const Source source = saxpyIn(ctx, dialect);
        kernel = compileAndLoad(ctx, dialect, source.text);
        const bp_device_info &info = ctx.info();
        block =
            std::max<uint32_t>(1, std::min({64u, info.max_block_size[0], info.max_block_threads}));
        const uint64_t align = std::max<uint32_t>(info.binding_alignment, 1);
        const uint64_t slack = (4096 + 2 * align + 3) / 4 * 4;
        xAll = xValues(n + slack / 4);
        y0 = yValues(n);
        x = device_.pageWith(stream, floatBytes(xAll));
        y = device_.pageWith(stream, floatBytes(y0));
    }
    ~SaxpyRun() {
        try {
            device_.finish(stream);
        } catch (const std::exception &) {
            // The case already failed; its reason matters more than this one.
        }
    }
    SaxpyRun(const SaxpyRun &) = delete;
    SaxpyRun &operator=(const SaxpyRun &) = delete;

    /// Correct arguments for the whole array; the result points into this object.
    bp_launch_args args(uint64_t xOffset = 0) {
        return saxpyArgs(kernel, x, y, kA, n, block, xOffset, bindings_, scalars_);
    }

    bp_status launch(const bp_launch_args &a, bp_error &error) {
        return device_.api().kernel_launch(device_.get(), stream.get(), &a, &error);
    }

    std::vector<float> readY() { return bytesToFloats(device_.readAll(stream, y)); }

    /// y after one correct launch over y0 with x bound at xOffset.
    std::vector<float> expected(uint64_t xOffset = 0) const {
        std::vector<float> out(y0);
        for (uint32_t i = 0; i < n; ++i)
            out[i] = kA * xAll[xOffset / 4 + i] + y0[i];
        return out;
    }

    /// Launches `a` (which must succeed), checks every element, then restores y.
    void runAndCheck(const bp_launch_args &a, const std::string &what, uint64_t xOffset = 0) {
        bp_error error = makeError();
        succeed(launch(a, error), error, what);
        device_.finish(stream);
        checkElements(readY(), expected(xOffset), what);
        device_.upload(stream, y, 0, y0.data(), y.size);
        device_.finish(stream);
    }

    /// Checks that `bad` fails with one of `allowed`, that nothing ran, and that a correct
    /// launch on the same stream still works afterwards.
    void expectRejected(const bp_launch_args &bad, std::initializer_list<bp_status> allowed,
                        const std::string &what) {
        bp_error error = makeError();
        expectFailure(launch(bad, error), error, allowed, what);
        checkNothingRan("after " + what + " was rejected");
        checkStillWorks("after " + what + " was rejected");
    }

    void checkNothingRan(const std::string &when) {
        device_.finish(stream);
        checkElements(readY(), y0, "y changed " + when + " (nothing may run)");
    }

    void checkStillWorks(const std::string &when) {
        runAndCheck(args(), "a correct saxpy launch " + when);
    }

private:
    OpenDevice &device_;
    bp_binding bindings_[2] = {};
    SaxpyScalars scalars_{};

public:
    uint32_t n;
    uint32_t block = 64;
    std::vector<float> xAll, y0;
    // Destroyed in reverse: the stream (after the destructor's wait), the kernel, the pages.
    Page x, y;
    Kernel kernel;
    Stream stream;
};

/// One case per dialect: compile, load and launch saxpy, check every element.
void saxpyCase(CaseContext &ctx, bp_dialect dialect) {
    if (!ctx.accepts(dialect))
        throw NotApplicable("the device does not declare the " + sdk::dialectName(dialect) + " dialect");
    SaxpyRun run(ctx, dialect, 100003);
    run.runAndCheck(run.args(), "kernel_launch(saxpy in " + sdk::dialectName(dialect) + ", " +
                                    std::to_string(run.n) + " elements)");
}

/// Source text with a syntax error, for the text dialects.
KernelText brokenSource(bp_dialect dialect) {
    static constexpr char kGlsl[] = "#version 450\nlayout(local_size_x = 1) in;\n"
                                    "void main() { this is not glsl; }\n";
    static constexpr char kCuda[] = "extern \"C\" __global__ void saxpy(float *y) {\n"
                                    "    this is not cuda;\n}\n";
    if (dialect == BP_DIALECT_GLSL) return {kGlsl, sizeof(kGlsl) - 1, "main"};
    return {kCuda, sizeof(kCuda) - 1, "saxpy"};
}

/// A host kernel that blocks its stream until the gate opens (or 30 s passed, so that a case
/// that fails cannot hang its worker).
std::atomic<bool> gGateOpen{false};
void gateHost(const bp_host_kernel_context *) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!gGateOpen.load() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
}
const bp_host_kernel_source kGateHost = hostKernelSource(&gateHost);

/// Opens the gate when the scope ends, whatever happened.
struct GateOpener {
    ~GateOpener() { gGateOpen.store(true); }
};

} // namespace

// Saxpy in each dialect --------------------------------------------------------------------------

CONFORMANCE_CASE("kernel.saxpy_host", "A host-dialect saxpy compiles, loads and computes every "
                                      "element right.") {
    saxpyCase(ctx, BP_DIALECT_HOST);
}

CONFORMANCE_CASE("kernel.saxpy_glsl", "A GLSL saxpy compiles, loads and computes every element "
                                      "right.") {
    saxpyCase(ctx, BP_DIALECT_GLSL);
}

CONFORMANCE_CASE("kernel.saxpy_spirv",
                 "A SPIR-V saxpy (the GLSL kernel's blob passed as SPIR-V "
                 "source) compiles, loads and computes every element right.") {
    saxpyCase(ctx, BP_DIALECT_SPIRV);
}

CONFORMANCE_CASE("kernel.saxpy_cuda", "A CUDA saxpy compiles, loads and computes every element "
                                      "right.") {
    saxpyCase(ctx, BP_DIALECT_CUDA);
}

CONFORMANCE_CASE("kernel.saxpy_hip", "A HIP saxpy compiles, loads and computes every element "
                                     "right.") {
    saxpyCase(ctx, BP_DIALECT_HIP);
}

// Compile and load errors -------------------------------------------------------------------------

CONFORMANCE_CASE("kernel.compile_error_log", "A source with a syntax error fails with "
                                             "BP_ERROR_COMPILE and writes the compiler's log to "
                                             "the log sink.") {
    bool any = false;
    for (const bp_dialect d : declaredDialects(ctx)) {
        if (!isText(d)) continue;
        any = true;
        std::vector<uint8_t> binary;
        std::string log;
        bp_error error = makeError();
        const std::string what = "kernel_compile of a " + sdk::dialectName(d) + " syntax error";
        expectFailure(compileKernel(ctx.device(), d, brokenSource(d), binary, log, error), error,
                      {BP_ERROR_COMPILE}, what);
        require(!log.empty(), what + " failed as it should but wrote nothing to the log sink "
                                     "(the compiler's log is what the user needs)");
    }
    if (!any) throw NotApplicable("the device declares no text dialect (glsl, cuda, hip)");
}

CONFORMANCE_CASE("kernel.compile_null_log_sink", "Compiling with a log sink whose write is NULL "
                                                 "works, and a syntax error then still fails "
                                                 "with BP_ERROR_COMPILE.") {
    for (const bp_dialect d : declaredDialects(ctx)) {
        const Source source = saxpyIn(ctx, d);
        std::vector<uint8_t> binary;
        bp_error error = makeError();
        succeed(compile(ctx.device(), d, source.text, binary, nullptr, error), error,
                "kernel_compile(saxpy, " + sdk::dialectName(d) + ") with log.write NULL");
        require(!binary.empty(), "kernel_compile(saxpy, " + sdk::dialectName(d) +
                                     ") with log.write NULL succeeded but wrote no binary");
        if (!isText(d)) continue;
        binary.clear();
        error = makeError();
        expectFailure(compile(ctx.device(), d, brokenSource(d), binary, nullptr, error), error,
                      {BP_ERROR_COMPILE},
                      "kernel_compile of a " + sdk::dialectName(d) +
                          " syntax error with log.write NULL");
    }
}

CONFORMANCE_CASE("kernel.compile_host_bad_source", "A host-dialect source with a NULL function, "
                                                   "a wrong source_size or a too small "
                                                   "struct_size is refused.") {
    if (!ctx.accepts(BP_DIALECT_HOST))
        throw NotApplicable("the device does not declare the host dialect");
    const bp_host_kernel_source nullFunction = hostKernelSource(nullptr);
    bp_host_kernel_source zeroStructSize = hostKernelSource(kGateHost.function);
    zeroStructSize.struct_size = 0;
    const struct {
        const void *source;
        size_t size;
        const char *what;
    } bad[] = {
        {&nullFunction, sizeof(nullFunction), "a NULL function"},
        {&kGateHost, 0, "source_size 0"},
        {&kGateHost, 1, "source_size 1"},
        {&kGateHost, sizeof(size_t), "source_size sizeof(size_t) (no function pointer)"},
        {nullptr, sizeof(kGateHost), "a NULL source"},
        {&zeroStructSize, sizeof(zeroStructSize), "bp_host_kernel_source::struct_size 0"},
    };
    for (const auto &b : bad) {
        std::vector<uint8_t> binary;
        std::string log;
        bp_error error = makeError();
        expectFailure(compileKernel(ctx.device(), BP_DIALECT_HOST, {b.source, b.size, "bad"},
                                    binary, log, error),
                      error, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_COMPILE},
                      std::string("kernel_compile(host) of ") + b.what);
    }
}

CONFORMANCE_CASE("kernel.compile_bad_spirv", "SPIR-V that is not a multiple of 4 bytes, has no "
                                             "magic number or is empty fails at compile or "
                                             "load, cleanly.") {
    if (!ctx.accepts(BP_DIALECT_SPIRV))
        throw NotApplicable("the device does not declare the spirv dialect");
    const std::vector<uint8_t> garbage = patternBytes(64, 3);
    const uint32_t headerOnly[5] = {kSpirvMagic, 0x00010000, 0, 1, 0};
    const struct {
        const void *source;
        size_t size;
        const char *what;
    } bad[] = {
        {garbage.data(), 7, "7 bytes (not a multiple of 4)"},
        {garbage.data(), garbage.size(), "64 bytes without the SPIR-V magic number"},
        {headerOnly, 18, "a SPIR-V header cut to 18 bytes"},
        {headerOnly, sizeof(headerOnly), "a SPIR-V header without instructions"},
        {garbage.data(), 0, "0 bytes"},
        {nullptr, 64, "a NULL source of 64 bytes"},
    };
    for (const auto &b : bad)
        expectCompileOrLoadFails(ctx, BP_DIALECT_SPIRV, {b.source, b.size, "main"},
                                 {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_COMPILE},
                                 std::string("SPIR-V of ") + b.what);
}

CONFORMANCE_CASE("kernel.undeclared_dialect", "kernel_compile and kernel_load in a dialect the "
                                              "device does not declare fail cleanly.") {
    bool any = false;
    const uint32_t spirvHeader[5] = {kSpirvMagic, 0x00010000, 0, 1, 0};
    for (const bp_dialect d : kAllDialects) {
        if (ctx.accepts(d)) continue;
        any = true;
        const KernelText text = d == BP_DIALECT_SPIRV
                                    ? KernelText{spirvHeader, sizeof(spirvHeader), "main"}
                                    : saxpySource(d);
        std::vector<uint8_t> binary;
        std::string log;
        bp_error error = makeError();
        expectFailure(compileKernel(ctx.device(), d, text, binary, log, error), error,
                      {BP_ERROR_UNSUPPORTED, BP_ERROR_COMPILE, BP_ERROR_INVALID_ARGUMENT},
                      "kernel_compile in the undeclared dialect " + sdk::dialectName(d));
        Kernel kernel;
        error = makeError();
        expectFailure(load(ctx.device(), d, text.entry, text.source, text.size, kernel, error),
                      error, {BP_ERROR_UNSUPPORTED, BP_ERROR_COMPILE, BP_ERROR_INVALID_ARGUMENT},
                      "kernel_load in the undeclared dialect " + sdk::dialectName(d));
    }
    if (!any) throw NotApplicable("the device declares every dialect of the ABI");
}

CONFORMANCE_CASE("kernel.unknown_dialect", "kernel_compile and kernel_load with a dialect value "
                                           "outside the ABI's enum fail with "
                                           "BP_ERROR_INVALID_ARGUMENT.") {
    const KernelText text = saxpySource(BP_DIALECT_HOST); // any bytes will do
    for (const uint32_t value : {6u, 77u, 0xffffffffu}) {
        auto args = abi::make<bp_kernel_compile_args>();
        args.dialect = rawEnum<bp_dialect>(static_cast<int>(value));
        args.entry_point = "saxpy";
        args.source = text.source;
        args.source_size = text.size;
        bp_error error = makeError();
        expectFailure(ctx.api().kernel_compile(ctx.device().get(), &args, &error), error,
                      {BP_ERROR_INVALID_ARGUMENT},
                      "kernel_compile with dialect " + std::to_string(value));
        auto loadArgs = abi::make<bp_kernel_load_args>();
        loadArgs.dialect = rawEnum<bp_dialect>(static_cast<int>(value));
        loadArgs.entry_point = "saxpy";
        loadArgs.binary = text.source;
        loadArgs.binary_size = text.size;
        bp_kernel *kernel = nullptr;
        error = makeError();
        const bp_status status =
            ctx.api().kernel_load(ctx.device().get(), &loadArgs, &kernel, &error);
        const Kernel owned(ctx.api(), ctx.device().get(), kernel);
        expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT},
                      "kernel_load with dialect " + std::to_string(value));
    }
}

CONFORMANCE_CASE("kernel.load_garbage", "kernel_load of garbage, empty or NULL blobs fails "
                                        "cleanly in every declared dialect.") {
    const std::vector<uint8_t> garbage = patternBytes(4096, 11);
    for (const bp_dialect d : declaredDialects(ctx)) {
        // A host blob of the right size is a function pointer by definition: only wrong sizes.
        const std::vector<std::pair<const void *, size_t>> blobs =
            d == BP_DIALECT_HOST
                ? std::vector<std::pair<const void *, size_t>>{{garbage.data(), 1},
                                                               {garbage.data(), sizeof(size_t)},
                                                               {garbage.data(), 0},
                                                               {nullptr, sizeof(kGateHost)}}
                : std::vector<std::pair<const void *, size_t>>{{garbage.data(), 1},
                                                               {garbage.data(), 64},
                                                               {garbage.data(), garbage.size()},
                                                               {garbage.data(), 0},
                                                               {nullptr, 64}};
        for (const auto &[blob, size] : blobs) {
            Kernel kernel;
            bp_error error = makeError();
            expectFailure(load(ctx.device(), d, "saxpy", blob, size, kernel, error), error,
                          {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_COMPILE},
                          "kernel_load(" + sdk::dialectName(d) + ") of " +
                              (blob == nullptr ? "a NULL blob of " : "garbage of ") +
                              std::to_string(size) + " bytes");
        }
    }
}

CONFORMANCE_CASE("kernel.load_truncated", "kernel_load of a blob from kernel_compile cut short "
                                          "fails cleanly in every declared dialect.") {
    for (const bp_dialect d : declaredDialects(ctx)) {
        const Source source = saxpyIn(ctx, d);
        const std::vector<uint8_t> blob = compileOrFail(ctx.device(), d, source.text);
        std::vector<size_t> sizes = {blob.size() / 2 / 4 * 4, blob.size() / 2 + 1};
        if (blob.size() > 8) sizes.push_back(blob.size() - (blob.size() % 4 == 0 ? 4 : 1));
        for (const size_t size : sizes) {
            if (size == 0 || size >= blob.size()) continue;
            const std::vector<uint8_t> cut(blob.begin(), blob.begin() + static_cast<long>(size));
            Kernel kernel;
            bp_error error = makeError();
            expectFailure(
                load(ctx.device(), d, source.text.entry, cut.data(), cut.size(), kernel, error),
                error, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_COMPILE},
                "kernel_load(" + sdk::dialectName(d) + ") of its " + std::to_string(blob.size()) +
                    "-byte saxpy blob cut to " + std::to_string(size) + " bytes");
        }
    }
}

CONFORMANCE_CASE("kernel.missing_entry_point", "An entry point the source does not define fails "
                                               "at compile or load with BP_ERROR_NOT_FOUND or "
                                               "BP_ERROR_COMPILE (cuda, hip, spirv).") {
    bool any = false;
    for (const bp_dialect d : {BP_DIALECT_CUDA, BP_DIALECT_HIP, BP_DIALECT_SPIRV}) {
        if (!ctx.accepts(d)) continue;
        any = true;
        const Source source = saxpyIn(ctx, d);
        KernelText text = source.text;
        text.entry = "no_such_entry_point";
        expectCompileOrLoadFails(ctx, d, text, {BP_ERROR_NOT_FOUND, BP_ERROR_COMPILE},
                                 "saxpy (" + sdk::dialectName(d) + ") as 'no_such_entry_point'");
    }
    // GLSL's entry point is always main (docs/plugin-abi.md); a host kernel is a function.
    if (!any)
        throw NotApplicable("the device declares none of the dialects with named entry points "
                            "(cuda, hip, spirv)");
}

// Launch errors: each must return a status, run nothing and leave the stream usable ------------

CONFORMANCE_CASE("kernel.launch_block_too_large", "A block dimension above max_block_size is "
                                                  "rejected and nothing runs.") {
    SaxpyRun run(ctx);
    const bp_device_info &info = ctx.info();
    bool any = false;
    for (int d = 0; d < 3; ++d) {
        if (info.max_block_size[d] == UINT32_MAX) continue;
        any = true;
        bp_launch_args a = run.args();
        a.block[d] = info.max_block_size[d] + 1;
        if (d == 0) a.grid[0] = 1;
        run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                           "kernel_launch with block " + dims(a.block) + " (max_block_size " +
                               dims(info.max_block_size) + ")");
    }
    if (!any) throw NotApplicable("max_block_size is UINT32_MAX in every dimension");
}

CONFORMANCE_CASE("kernel.launch_block_too_many_threads", "A block within max_block_size but "
                                                         "with more than max_block_threads "
                                                         "threads is rejected and nothing runs.") {
    SaxpyRun run(ctx);
    const bp_device_info &info = ctx.info();
    bp_launch_args a = run.args();
    uint64_t threads = 1;
    for (int d = 0; d < 3; ++d) {
        // Grow each dimension just enough to pass max_block_threads, within max_block_size.
        const uint64_t want = uint64_t{info.max_block_threads} / threads + 1;
        a.block[d] = static_cast<uint32_t>(std::min<uint64_t>(want, info.max_block_size[d]));
        threads *= a.block[d];
        if (threads > info.max_block_threads) break;
    }
    if (threads <= info.max_block_threads)
        throw NotApplicable("max_block_size " + dims(info.max_block_size) +
                            " allows no block of more than max_block_threads " +
                            std::to_string(info.max_block_threads) + " threads");
    a.grid[0] = 1;
    run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with block " + dims(a.block) + " (" +
                           std::to_string(threads) + " threads, max_block_threads " +
                           std::to_string(info.max_block_threads) + ")");
}

CONFORMANCE_CASE("kernel.launch_block_zero", "A block with a zero dimension is rejected and "
                                             "nothing runs.") {
    SaxpyRun run(ctx);
    for (int d = 0; d < 3; ++d) {
        bp_launch_args a = run.args();
        a.block[d] = 0;
        run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                           "kernel_launch with block " + dims(a.block));
    }
}

CONFORMANCE_CASE("kernel.launch_grid_too_large", "A grid dimension above max_grid_size is "
                                                 "rejected and nothing runs.") {
    SaxpyRun run(ctx);
    const bp_device_info &info = ctx.info();
    bool any = false;
    for (int d = 0; d < 3; ++d) {
        if (info.max_grid_size[d] == UINT32_MAX) continue;
        any = true;
        bp_launch_args a = run.args();
        a.grid[0] = 1;
        a.grid[d] = info.max_grid_size[d] + 1;
        run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                           "kernel_launch with grid " + dims(a.grid) + " (max_grid_size " +
                               dims(info.max_grid_size) + ")");
    }
    if (!any) throw NotApplicable("max_grid_size is UINT32_MAX in every dimension");
}

CONFORMANCE_CASE("kernel.launch_too_many_bindings", "A launch with more than max_bindings "
                                                    "bindings is rejected and nothing runs.") {
    const uint32_t max = ctx.info().max_bindings;
    if (max >= (1u << 16))
        throw NotApplicable("max_bindings is " + std::to_string(max) +
                            "; the suite tries at most "
                            "65536 bindings");
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    std::vector<bp_binding> bindings(max + 1, a.bindings[1]);
    bindings[0] = a.bindings[0];
    a.bindings = bindings.data();
    a.binding_count = max + 1;
    run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with " + std::to_string(max + 1) +
                           " bindings (max_bindings " + std::to_string(max) + ")");
}

CONFORMANCE_CASE("kernel.launch_binding_misaligned", "A binding offset that is not a multiple of "
                                                     "binding_alignment is rejected with "
                                                     "BP_ERROR_INVALID_ARGUMENT.") {
    const uint32_t align = ctx.info().binding_alignment;
    if (align <= 1) throw NotApplicable("binding_alignment is 1: every offset is aligned");
    SaxpyRun run(ctx);
    const uint64_t offset = align % 2 == 0 ? align / 2 : 1;
    run.expectRejected(run.args(offset), {BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with binding 0 at offset " + std::to_string(offset) +
                           " (binding_alignment " + std::to_string(align) + ")");
}

CONFORMANCE_CASE("kernel.launch_binding_out_of_range", "A binding whose offset + size lies past "
                                                       "its page (or overflows) is rejected with "
                                                       "BP_ERROR_INVALID_ARGUMENT.") {
    SaxpyRun run(ctx);
    const uint64_t align = std::max<uint32_t>(ctx.info().binding_alignment, 1);
    const uint64_t page = run.y.size;
    const uint64_t step = align % 4 == 0 ? align : align * 4; // aligned, and a whole float
    const struct {
        uint64_t offset, size;
    } bad[] = {
        {0, page + 4},                 // too long
        {step, page},                  // shifted past the end
        {(page / step + 1) * step, 4}, // starts past the end
        {UINT64_MAX / step * step, 8}, // offset + size overflows
    };
    for (const auto &b : bad) {
        bp_launch_args a = run.args();
        bp_binding bindings[2] = {a.bindings[0], {run.y.get(), b.offset, b.size}};
        a.bindings = bindings;
        run.expectRejected(a, {BP_ERROR_INVALID_ARGUMENT},
                           "kernel_launch with binding 1 at offset " + std::to_string(b.offset) +
                               ", size " + std::to_string(b.size) + " (its page has " +
                               std::to_string(page) + " bytes)");
    }
}

CONFORMANCE_CASE("kernel.launch_scalars_too_large", "A launch with more than max_scalar_bytes "
                                                    "scalar bytes is rejected and nothing runs.") {
    const uint32_t max = ctx.info().max_scalar_bytes;
    if (max >= (1u << 24))
        throw NotApplicable("max_scalar_bytes is " + std::to_string(max) +
                            "; the suite tries at most 16 MiB of scalars");
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    std::vector<uint8_t> scalars(size_t{max} + 1, 0);
    std::memcpy(scalars.data(), a.scalars, std::min(scalars.size(), a.scalar_size));
    a.scalars = scalars.data();
    a.scalar_size = scalars.size();
    run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with " + std::to_string(scalars.size()) +
                           " scalar bytes (max_scalar_bytes " + std::to_string(max) + ")");
}

CONFORMANCE_CASE("kernel.launch_null_scalars", "scalar_size > 0 with scalars NULL is rejected "
                                               "with BP_ERROR_INVALID_ARGUMENT.") {
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    a.scalars = nullptr;
    run.expectRejected(a, {BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with scalar_size " + std::to_string(a.scalar_size) +
                           " and scalars NULL");
}

CONFORMANCE_CASE("kernel.launch_shared_memory_too_large", "A launch asking for more than "
                                                          "max_shared_memory_bytes of shared "
                                                          "memory is rejected and nothing runs.") {
    const uint32_t max = ctx.info().max_shared_memory_bytes;
    if (max == UINT32_MAX) throw NotApplicable("max_shared_memory_bytes is UINT32_MAX");
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    a.shared_memory_bytes = max + 1;
    run.expectRejected(a, {BP_ERROR_LAUNCH, BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with shared_memory_bytes " + std::to_string(max + 1) +
                           " (max_shared_memory_bytes " + std::to_string(max) + ")");
}

CONFORMANCE_CASE("kernel.launch_null_kernel", "A launch with a NULL kernel is rejected with "
                                              "BP_ERROR_INVALID_ARGUMENT.") {
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    a.kernel = nullptr;
    run.expectRejected(a, {BP_ERROR_INVALID_ARGUMENT}, "kernel_launch with kernel NULL");
}

CONFORMANCE_CASE("kernel.launch_null_bindings", "binding_count > 0 with bindings NULL is "
                                                "rejected with BP_ERROR_INVALID_ARGUMENT.") {
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    a.bindings = nullptr;
    run.expectRejected(a, {BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with binding_count 2 and bindings NULL");
}

CONFORMANCE_CASE("kernel.launch_zero_grid", "A grid with a zero dimension is a no-op (or "
                                            "BP_ERROR_INVALID_ARGUMENT): nothing runs.") {
    SaxpyRun run(ctx);
    for (int d = 0; d < 3; ++d) {
        bp_launch_args a = run.args();
        a.grid[d] = 0;
        const std::string what = "kernel_launch with grid " + dims(a.grid);
        bp_error error = makeError();
        const bp_status status = run.launch(a, error);
        if (status != BP_SUCCESS) expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT}, what);
        run.checkNothingRan("after " + what);
    }
    run.checkStillWorks("after launches with a zero grid");
}

// Launches that must work -------------------------------------------------------------------------

CONFORMANCE_CASE("kernel.binding_offset", "A binding at a non-zero aligned offset shows the "
                                          "kernel the page from that offset on.") {
    SaxpyRun run(ctx);
    const uint64_t align = std::max<uint32_t>(ctx.info().binding_alignment, 1);
    // A multiple of both the alignment and a float, at least 256 bytes in.
    uint64_t offset = (256 + align - 1) / align * align;
    if (offset % 4 != 0) offset *= 4;
    run.runAndCheck(run.args(offset),
                    "kernel_launch(saxpy) with x bound at offset " + std::to_string(offset),
                    offset);
}

CONFORMANCE_CASE("kernel.block_size_max", "A block of min(max_block_size[0], "
                                          "max_block_threads, 1024) threads runs every "
                                          "thread.") {
    const bp_device_info &info = ctx.info();
    const uint32_t block =
        std::max<uint32_t>(1, std::min({info.max_block_size[0], info.max_block_threads, 1024u}));
    SaxpyRun run(ctx, 3 * block + 5);
    bp_launch_args a = run.args();
    a.block[0] = block;
    a.grid[0] = (run.n + block - 1) / block;
    run.runAndCheck(a, "kernel_launch(saxpy) with block " + dims(a.block));
}

CONFORMANCE_CASE("kernel.large_grid", "A launch of min(max_grid_size[0], 65537) workgroups runs "
                                      "every workgroup.") {
    const uint32_t groups = std::min<uint32_t>(ctx.info().max_grid_size[0], 65537);
    require(groups > 0, "max_grid_size[0] is 0");
    const uint32_t block = std::max<uint32_t>(
        1, std::min({64u, ctx.info().max_block_size[0], ctx.info().max_block_threads}));
    // The last workgroup is partial: n is not a multiple of the block.
    SaxpyRun run(ctx, (groups - 1) * block + 1);
    bp_launch_args a = run.args();
    a.block[0] = block;
    a.grid[0] = groups;
    run.runAndCheck(a,
                    "kernel_launch(saxpy) with grid " + dims(a.grid) + ", block " + dims(a.block));
}

CONFORMANCE_CASE("kernel.release_while_pending", "kernel_release while launches of the kernel are "
                                                 "still pending leaves those launches to run "
                                                 "correctly.") {
    SaxpyRun run(ctx);
    OpenDevice &device = ctx.device();
    // With the host dialect and async streams, a gate kernel holds the stream so the launches
    // are certainly pending when the kernel is released.
    const bool gated = ctx.accepts(BP_DIALECT_HOST) && ctx.declares(BP_CAPABILITY_ASYNC_STREAMS);
    GateOpener opener;
    gGateOpen.store(false);
    Kernel gate;
    if (gated) {
        gate = compileAndLoad(ctx, BP_DIALECT_HOST, {&kGateHost, sizeof(kGateHost), "gate"});
        auto g = abi::make<bp_launch_args>();
        g.kernel = gate.get();
        g.grid[0] = g.grid[1] = g.grid[2] = 1;
        g.block[0] = g.block[1] = g.block[2] = 1;
        bp_error error = makeError();
        succeed(run.launch(g, error), error, "kernel_launch(gate host kernel)");
    }
    // One launch submitted, one only recorded: both pending when the kernel goes.
    bp_error error = makeError();
    succeed(run.launch(run.args(), error), error, "kernel_launch(saxpy) #1");
    Event first = device.flush(run.stream);
    error = makeError();
    succeed(run.launch(run.args(), error), error, "kernel_launch(saxpy) #2");
    if (gated) {
        error = makeError();
        const bp_status status = ctx.api().event_query(device.get(), first.get(), &error);
        require(status == BP_ERROR_NOT_READY,
                std::string("event_query of a flush behind a blocked gate kernel returned ") +
                    toString(status) + ", expected not_ready");
    }
    run.kernel.reset();
    gGateOpen.store(true);
    device.finish(run.stream);
    std::vector<float> expected = run.y0;
    for (uint32_t i = 0; i < run.n; ++i)
        expected[i] = kA * run.xAll[i] * 2 + run.y0[i];
    checkElements(run.readY(), expected,
                  "two saxpy launches whose kernel was released before they completed");
}

CONFORMANCE_CASE("kernel.concurrent_streams", "One kernel launched from 4 threads on 4 streams at "
                                              "once gives every thread the right result.") {
    OpenDevice &device = ctx.device();
    const bp_dialect dialect = device.saxpyDialect();
    const Source source = saxpyIn(ctx, dialect);
    const Kernel kernel = compileAndLoad(ctx, dialect, source.text);
    constexpr int kThreads = 4, kRounds = 10;
    std::mutex mutex;
    std::string failure;
    std::vector<std::thread> threads;
    for (int t = 0; t < kThreads; ++t)
        threads.emplace_back([&, t] {
            try {
                Page px, py; // destroyed after the stream, which waits for its work
                const Stream stream = device.createStream();
                const uint32_t n = 4096 + 17 * static_cast<uint32_t>(t);
                std::vector<float> x = xValues(n), y = yValues(n);
                for (float &v : x)
                    v += static_cast<float>(t);
                px = device.pageWith(stream, floatBytes(x));
                py = device.pageWith(stream, floatBytes(y));
                for (int r = 0; r < kRounds; ++r) {
                    bp_error error = makeError();
                    succeed(device.launchSaxpy(stream, kernel, px, py, kA, n, error), error,
                            "kernel_launch(saxpy)");
                    device.finish(stream);
                    for (uint32_t i = 0; i < n; ++i)
                        y[i] = kA * x[i] + y[i];
                    checkElements(bytesToFloats(device.readAll(stream, py)), y,
                                  "round " + std::to_string(r));
                }
            } catch (const std::exception &e) {
                std::lock_guard lock(mutex);
                if (failure.empty())
                    failure = "thread " + std::to_string(t) + " (its own stream): " + e.what();
            }
        });
    for (std::thread &t : threads)
        t.join();
    require(failure.empty(), failure);
}

CONFORMANCE_CASE("kernel.indirect_dispatch", "With BP_CAPABILITY_INDIRECT_DISPATCH, a launch "
                                             "reads its grid from grid_memory at execution "
                                             "time.") {
    if (!ctx.declares(BP_CAPABILITY_INDIRECT_DISPATCH))
        throw NotApplicable("the device does not declare BP_CAPABILITY_INDIRECT_DISPATCH");
    OpenDevice &device = ctx.device();
    Page grid; // declared first: freed after run's destructor waited for the stream
    SaxpyRun run(ctx, 5000);
    // The page holds zeros until a copy ordered before the launch writes the grid at offset 4:
    // a plugin that reads the grid when the launch is recorded sees zeros.
    grid = device.pageWith(run.stream, std::vector<uint8_t>(32, 0));
    bp_launch_args a = run.args();
    const uint32_t words[3] = {a.grid[0], 1, 1};
    device.upload(run.stream, grid, 4, words, sizeof(words));
    a.grid_memory = grid.get();
    a.grid_offset = 4;
    a.grid[0] = a.grid[1] = a.grid[2] = 1; // ignored: a plugin that uses it updates one block
    run.runAndCheck(a, "kernel_launch(saxpy) with grid_memory holding grid " + dims(words) +
                           " at offset 4 (and a static grid of 1x1x1, which must be ignored)");
}

CONFORMANCE_CASE("kernel.indirect_dispatch_undeclared", "Without "
                                                        "BP_CAPABILITY_INDIRECT_DISPATCH, a launch "
                                                        "with grid_memory fails cleanly and "
                                                        "nothing runs.") {
    if (ctx.declares(BP_CAPABILITY_INDIRECT_DISPATCH))
        throw NotApplicable("the device declares BP_CAPABILITY_INDIRECT_DISPATCH "
                            "(kernel.indirect_dispatch tests it)");
    OpenDevice &device = ctx.device();
    Page grid; // declared first: freed after run's destructor waited for the stream
    SaxpyRun run(ctx);
    bp_launch_args a = run.args();
    const uint32_t words[4] = {a.grid[0], 1, 1, 0};
    grid = device.pageWith(
        run.stream, std::vector<uint8_t>(reinterpret_cast<const uint8_t *>(words),
                                         reinterpret_cast<const uint8_t *>(words) + sizeof(words)));
    a.grid_memory = grid.get();
    run.expectRejected(a, {BP_ERROR_UNSUPPORTED, BP_ERROR_INVALID_ARGUMENT},
                       "kernel_launch with grid_memory on a device without "
                       "BP_CAPABILITY_INDIRECT_DISPATCH");
}

} // namespace backplane::conformance
