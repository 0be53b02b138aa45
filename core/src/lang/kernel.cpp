// lang::kernel(): records a body, generates every dialect's variant; Kernel's accessors.
#include "lang/ir.hpp"

#include "comm/host_reduce.hpp"

#include <backplane/client.hpp>
#include <backplane/error.hpp>

#include <algorithm>
#include <optional>
#include <regex>

namespace backplane::lang {
namespace detail {
std::shared_ptr<Module> record(std::string name, const std::function<void(Builder &)> &body,
                               KernelOptions options);
} // namespace detail

namespace {

/// The portable variants, in the order the core should prefer them. CUDA and HIP turn off
/// contraction so that a*b+c rounds twice on every target (fma() is the fused one); GLSL does the
/// same with `precise`.
KernelSource variantsOf(const std::shared_ptr<const detail::Module> &module) {
    const detail::Module &m = *module;
    KernelSource source;
    source.name = m.name;
    for (const detail::BindingDecl &b : m.bindings)
        source.access.push_back(b.access == detail::Access::Read    ? BindingAccess::Read
                                : b.access == detail::Access::Write ? BindingAccess::Write
                                                                    : BindingAccess::ReadWrite);
    source.variants.push_back(KernelVariant::text(
        Dialect::Cuda, m.entryPoint, detail::generateSource(m, Dialect::Cuda), {"--fmad=false"}));
    source.variants.push_back(KernelVariant::text(
        Dialect::Hip, m.entryPoint, detail::generateSource(m, Dialect::Hip), {"-ffp-contract=off"}));
    source.variants.push_back(
        KernelVariant::text(Dialect::Glsl, "main", detail::generateSource(m, Dialect::Glsl)));
    // The host plugin compiles the C++ variant with the system's compiler where it has one
    // (DeviceInfo::kernelCompiler); a kernel the generator cannot print has none and is
    // interpreted (Kernel::hostNote says why).
    if (const detail::HostSource host = detail::generateHostSource(m); host.reason.empty())
        source.variants.push_back(
            KernelVariant::text(Dialect::Cpp, detail::hostEntryPoint(m), host.source));
    // The host variant's key is the IR listing: two kernels with the same listing are the same
    // program, so the core may share one loaded kernel between them.
    source.variants.push_back(KernelVariant::host(&detail::interpretWorkgroup, m.entryPoint,
                                                  std::shared_ptr<const void>(module, &m),
                                                  "backplane-lang\n" + detail::listModule(m)));
    return source;
}

} // namespace

Kernel kernel(std::string name, const std::function<void(Builder &)> &body, KernelOptions options) {
    if (!body) throw Error(ErrorCode::InvalidArgument, "kernel '" + name + "': no body");
    Kernel k;
    k.module_ = detail::record(std::move(name), body, options);
    k.source_ = variantsOf(k.module_);
    return k;
}

const detail::Module &Kernel::module() const {
    if (!module_) throw Error(ErrorCode::InvalidArgument, "an empty lang::Kernel (default-constructed)");
    return *module_;
}

std::string Kernel::text(Dialect dialect) const {
    const detail::Module &m = module();
    if (dialect == Dialect::Host) return detail::listModule(m);
    if (dialect == Dialect::Cpp) {
        detail::HostSource host = detail::generateHostSource(m);
        if (!host.reason.empty())
            throw Error(ErrorCode::Unsupported, "kernel '" + m.name + "' has no C++ for the host: " +
                                                    host.reason + " (it is interpreted there)");
        return std::move(host.source);
    }
    return detail::generateSource(m, dialect);
}

std::string Kernel::hostNote(const DeviceInfo &device) const {
    const detail::Module &m = module();
    for (const KernelVariant &v : source_.variants) {
        if (!device.accepts(v.dialect)) continue;
        if (v.dialect == Dialect::Cpp) return "compiled by " + device.kernelCompiler;
        if (v.dialect == Dialect::Host) break;
        return {}; // a GPU dialect
    }
    if (!device.accepts(Dialect::Host)) return {};
    if (device.accepts(Dialect::Cpp))
        return "interpreted: the host generator cannot compile " +
               detail::generateHostSource(m).reason + " yet";
    return "interpreted: " +
           (device.kernelCompiler.empty() ? std::string("the device compiles no C++")
                                          : device.kernelCompiler);
}

uint32_t Kernel::bindingCount() const noexcept {
    return module_ ? static_cast<uint32_t>(module_->bindings.size()) : 0;
}

uint32_t Kernel::scalarBytes() const noexcept {
    return module_ ? module_->scalarOffset(module_->scalars.size()) : 0;
}

namespace {

ElementType elementOf(Type t) {
    switch (t) {
    case Type::Bool: return ElementType::Bool;
    case Type::I8: return ElementType::I8;
    case Type::U8: return ElementType::U8;
    case Type::I16: return ElementType::I16;
    case Type::U16: return ElementType::U16;
    case Type::I32: return ElementType::I32;
    case Type::U32: return ElementType::U32;
    case Type::I64: return ElementType::I64;
    case Type::U64: return ElementType::U64;
    case Type::F16: return ElementType::F16;
    case Type::BF16: return ElementType::BF16;
    case Type::F32: return ElementType::F32;
    case Type::F64: return ElementType::F64;
    }
    return ElementType::Bool;
}

} // namespace

std::string Kernel::missingOn(const KernelFeatures &features) const {
    const detail::Module &m = module();
    // Buffers need the type's storage; 64-bit values need native arithmetic (8- and 16-bit ones
    // compute in 32 bits, f16 and bf16 in f32, on every device); atomics their own bits.
    for (const detail::BindingDecl &b : m.bindings)
        if (!features.stores(elementOf(b.type)))
            return std::string(toString(b.type)) + " buffers";
    const auto arithmetic = [&](Type t) -> std::string {
        if (detail::isWide(t) && !features.computes(elementOf(t)))
            return std::string(toString(t)) + " arithmetic";
        return {};
    };
    for (Type t : m.scalars)
        if (auto why = arithmetic(t); !why.empty()) return why;
    for (Type t : m.vars)
        if (auto why = arithmetic(t); !why.empty()) return why;
    for (const detail::ArrayDecl &a : m.arrays)
        if (auto why = arithmetic(a.type); !why.empty()) return why;
    for (const detail::Node &n : m.nodes) {
        if (auto why = arithmetic(n.type); !why.empty()) return why;
        // A float to a 64-bit integer converts through double in the generated code.
        if (n.op == detail::Op::Cast && detail::isWide(n.type) && detail::isInteger(n.type) &&
            detail::isFloat(m.nodes[n.a].type) && !features.computes(ElementType::F64))
            return "a cast from " + std::string(toString(m.nodes[n.a].type)) + " to " +
                   toString(n.type) + " (it converts through f64 arithmetic)";
        if (n.op != detail::Op::Atomic) continue;
        const ElementType t = elementOf(n.type);
        const bool add = n.atomicOp == detail::AtomicOp::Add;
        if (add ? !features.addsAtomically(t) : !features.atomicBitsOn(t))
            return std::string(toString(n.type)) + (add ? " atomicAdd" : " atomic min/max/bits");
    }
    for (uint32_t n : {2u, 4u, 8u})
        if ((m.vectorWidths >> n) & 1u && !features.loadsVectorsOf(n))
            return "vectors of " + std::to_string(n) + " elements";
    // Matrix units: every fragment's tile with its input type (A, B) or any input type with an
    // f32 accumulator (accumulators).
    std::vector<detail::MatrixDecl> decls = m.matrices; // inputs first: they name the type
    std::stable_partition(decls.begin(), decls.end(), [](const detail::MatrixDecl &d) {
        return d.use != MatrixUse::Accumulator;
    });
    for (const detail::MatrixDecl &d : decls) {
        const bool accumulator = d.use == MatrixUse::Accumulator;
        const bool found = std::any_of(
            features.matrixShapes.begin(), features.matrixShapes.end(), [&](const MatrixShape &s) {
                return s.m == d.m && s.n == d.n && s.k == d.k && s.c == ElementType::F32 &&
                       (accumulator || (s.a == elementOf(d.type) && s.b == elementOf(d.type)));
            });
        if (found) continue;
        const std::string tile = std::to_string(d.m) + "x" + std::to_string(d.n) + "x" + std::to_string(d.k);
        if (accumulator) return "matrix units of " + tile + " (an f32 accumulator)";
        return "matrix units of " + tile + " " + toString(d.type) + "*" + toString(d.type) + "+f32" +
               (d.type == Type::F32 ? " (tf32)" : "");
    }
    return {};
}

uint16_t f16::fromFloat(float value) { return backplane::detail::floatToHalf(value); }
float f16::toFloat(uint16_t bits) { return backplane::detail::halfToFloat(bits); }
uint16_t bf16::fromFloat(float value) { return backplane::detail::floatToBf16(value); }
float bf16::toFloat(uint16_t bits) { return backplane::detail::bf16ToFloat(bits); }

Dispatch Kernel::prepare(const Dispatch &dispatch) const {
    const detail::Module &m = module();
    auto fail = [&](const std::string &what) {
        throw Error(ErrorCode::InvalidArgument, "kernel '" + m.name + "': " + what);
    };
    if (dispatch.bindings.size() != m.bindings.size())
        fail("the dispatch has " + std::to_string(dispatch.bindings.size()) +
             " bindings, the kernel declares " + std::to_string(m.bindings.size()));
    if (dispatch.scalars.size() != scalarBytes())
        fail("the dispatch has " + std::to_string(dispatch.scalars.size()) +
             " scalar bytes, the kernel declares " + std::to_string(m.scalars.size()) +
             " scalars (" + std::to_string(scalarBytes()) + " bytes; append them with "
             "Dispatch::scalar in declaration order)");
    const std::vector<uint32_t> lengths = m.lengthFields();
    const uint32_t structBytes = m.scalarStructBytes();
    if (lengths.empty() && structBytes == dispatch.scalars.size()) return dispatch;
    Dispatch prepared = dispatch;
    for (uint32_t b : lengths) {
        const uint64_t bytes = dispatch.bindings[b].size();
        const uint32_t element = detail::sizeOf(m.bindings[b].type);
        if (bytes % element != 0 || bytes / element > UINT32_MAX)
            fail("binding " + std::to_string(b) + " is " + std::to_string(bytes) +
                 " bytes: not a whole number of " + std::to_string(element) +
                 "-byte elements, or over 2^32 of them");
        prepared.scalar(static_cast<uint32_t>(bytes / element));
    }
    // The tail padding of the struct the generated code declares (a double makes it a multiple
    // of 8): CUDA takes the struct by value and checks its size.
    prepared.scalars.resize(structBytes);
    return prepared;
}

} // namespace backplane::lang

namespace backplane::lang::detail {

std::string annotateCompileError(const Module &module, Dialect dialect, const std::string &message) {
    if (dialect == Dialect::Host || dialect == Dialect::Spirv) return message;
    const std::string source =
        dialect == Dialect::Cpp ? generateHostSource(module).source : generateSource(module, dialect);
    std::vector<std::string> lines(1);
    for (char c : source) {
        if (c == '\n') lines.emplace_back();
        else lines.back() += c;
    }
    // NVRTC and hiprtc say "name(12): error" or "name:12:5: error"; glslang "ERROR: 0:12: ...".
    static const std::regex kLine(R"(\((\d+)\)|:(\d+):)");
    for (auto it = std::sregex_iterator(message.begin(), message.end(), kLine);
         it != std::sregex_iterator(); ++it) {
        const std::string digits = (*it)[1].matched ? (*it)[1].str() : (*it)[2].str();
        if (digits.size() > 7) continue;
        const size_t line = std::stoul(digits);
        if (line == 0 || line > lines.size()) continue;
        return message + "\n  generated " + toString(dialect) + " line " + std::to_string(line) +
               " of kernel '" + module.name + "': " + lines[line - 1] +
               "\n  (the whole source: `backplane kernels dump " + module.name +
               "` or lang::Kernel::text)";
    }
    return message + "\n  (the generated source: `backplane kernels dump " + module.name +
           "` or lang::Kernel::text)";
}

} // namespace backplane::lang::detail

namespace backplane {

namespace lang::detail {

std::optional<Dialect> dialectOn(const KernelSource &source, const DeviceInfo &device) {
    for (const KernelVariant &v : source.variants)
        if (device.accepts(v.dialect)) return v.dialect;
    return std::nullopt;
}

Dispatch withDynamicShared(const Module &module, Dialect dialect, Dispatch dispatch) {
    if (dialect != Dialect::Cuda && dialect != Dialect::Hip) return dispatch;
    const uint32_t dynamic = dynamicSharedBytes(module);
    if (dynamic == 0) return dispatch;
    if (dispatch.sharedMemoryBytes > UINT32_MAX - dynamic)
        throw Error(ErrorCode::InvalidArgument,
                    "kernel '" + module.name + "': Dispatch::sharedMemoryBytes " +
                        std::to_string(dispatch.sharedMemoryBytes) + " plus the " +
                        std::to_string(dynamic) + " bytes of its shared arrays overflow 32 bits");
    dispatch.sharedMemoryBytes += dynamic;
    return dispatch;
}

} // namespace lang::detail

void ComputeClient::execute(const lang::Kernel &kernel, const Dispatch &dispatch) {
    Dispatch prepared = kernel.prepare(dispatch);
    const lang::detail::Module &module = kernel.module();
    // The variant this device is given: the first one whose dialect it accepts.
    const std::optional<Dialect> dialect = lang::detail::dialectOn(kernel.source(), device());
    // What the device cannot do is refused here, before any compile: never a driver error or a
    // silent wrong result (DeviceInfo::features, from the plugin).
    if (const std::string missing = kernel.missingOn(device().features); !missing.empty())
        throw Error(ErrorCode::Unsupported,
                    "kernel '" + module.name + "' uses " + missing + ", which " + device().id() +
                        " (" + device().name + ") does not have (its kernel features: " +
                        device().features.describe() + "); pick a device that has it, or write "
                        "the kernel without it",
                    device().backend);
    if (!module.matrices.empty()) {
        // The matrix units work on whole subgroups (PTX mma.sync and ldmatrix are .aligned).
        const uint64_t lanes = uint64_t{dispatch.block[0]} * dispatch.block[1] * dispatch.block[2];
        const uint32_t width = std::max<uint32_t>(1, device().subgroupSize);
        if (lanes % width != 0)
            throw Error(ErrorCode::InvalidArgument,
                        "kernel '" + module.name + "' uses matrix units, which work on whole " +
                            "subgroups: a workgroup of " + std::to_string(lanes) + " threads is not " +
                            "a multiple of " + device().id() + "'s subgroup of " + std::to_string(width) +
                            " (DeviceInfo::subgroupSize)");
    }
    if (dialect == Dialect::Cuda || dialect == Dialect::Hip || dialect == Dialect::Glsl) {
        // Shared memory past the device's limit would fail in the driver, after the compile.
        const uint64_t shared = lang::detail::sharedBytesOnGpu(module, *dialect == Dialect::Glsl);
        const uint64_t limit = device().maxSharedMemoryBytes;
        if (limit != 0 && shared > limit)
            throw Error(ErrorCode::Unsupported,
                        "kernel '" + module.name + "' declares " + std::to_string(shared) +
                            " bytes of shared memory; " + device().id() + " (" + device().name +
                            ") has " + std::to_string(limit) + " per workgroup "
                            "(DeviceInfo::maxSharedMemoryBytes): use smaller tiles",
                        device().backend);
        // Past CUDA's static 48 KiB the generated source declares its arrays in dynamic shared
        // memory, which the launch must ask for.
        prepared = lang::detail::withDynamicShared(module, *dialect, std::move(prepared));
    }
    if (device().accepts(Dialect::Host) && !device().accepts(Dialect::Cuda) &&
        !device().accepts(Dialect::Hip) && !device().accepts(Dialect::Glsl)) {
        // The interpreter cannot report an error from inside a workgroup: refuse here what it
        // would have to skip.
        const uint64_t lanes = uint64_t{dispatch.block[0]} * dispatch.block[1] * dispatch.block[2];
        const uint64_t words = lang::detail::interpreterScratchBound(module, lanes);
        if (lanes > lang::detail::kInterpreterMaxLanes ||
            words > lang::detail::kInterpreterMaxScratchWords)
            throw Error(ErrorCode::InvalidArgument,
                        "kernel '" + module.name + "': a workgroup of " + std::to_string(lanes) +
                            " threads needs up to " + std::to_string(words * 4 >> 20) +
                            " MiB of interpreter scratch on " + device().id() + " (limits: " +
                            std::to_string(lang::detail::kInterpreterMaxLanes) + " threads, " +
                            std::to_string(lang::detail::kInterpreterMaxScratchWords * 4 >> 20) +
                            " MiB); use smaller workgroups or smaller private arrays");
    }
    try {
        execute(kernel.source(), prepared);
    } catch (const Error &e) {
        if (e.code() != ErrorCode::Compile) throw;
        throw Error(e.code(),
                    lang::detail::annotateCompileError(module, dialect.value_or(Dialect::Host), e.what()),
                    e.backend(), e.vendorCode());
    }
}

} // namespace backplane
