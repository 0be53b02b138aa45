// The kernel language's IR: value nodes, structured statements in blocks, and the signature.
#pragma once

#include <backplane/lang.hpp>

#include <algorithm>
#include <optional>
#include <cstdint>
#include <string>
#include <vector>

/// The IR is what lang::kernel() records (core/src/lang/builder.cpp) and what the generators
/// (source_gen.cpp) and the host interpreter (interpreter.cpp) read. It is structured like the
/// source languages it is printed as: blocks of statements, with if / for / while / break /
/// continue / return, so generating CUDA or GLSL is printing, not control-flow reconstruction.
///
/// Values are nodes in SSA form. A node that reads memory or has an effect is evaluated where it
/// was recorded (its Let statement), so `Value v = x[i]; x[i] = 0;` keeps the old value in v on
/// every target. Leaves (constants, scalars, ids, lengths, loop indices) have no statement and may
/// be printed wherever they are used.
namespace backplane::lang::detail {

inline constexpr uint32_t kNone = UINT32_MAX;

/// One value. Operands a, b, c are node indices (kNone when unused).
struct Node {
    Op op = Op::Constant;
    Type type = Type::U32;
    /// Same for every thread of a workgroup (see builder.cpp for the rules).
    bool uniform = false;
    /// The block whose statement defines it (0 for leaves usable anywhere).
    uint32_t block = 0;
    uint32_t a = kNone, b = kNone, c = kNone;
    /// Constant: the value's bits (8- and 16-bit integers sign- or zero-extended to 32 bits, f16
    /// and bf16 their 16 bits, 64-bit types all 64). Builtin: builtin * 4 + axis. Scalar: field index. Length:
    /// binding. LoopIndex: the For statement's loop id. Load / Atomic: target (binding, array or
    /// var). Atomic: also atomicOp. Cast: nothing (the operand's type is nodes[a].type).
    uint64_t imm = 0;
    Space space = Space::Buffer; ///< Load / Atomic
    AtomicOp atomicOp = AtomicOp::Add;
    /// Load: part `vectorPart` of a vector load of `vectorWidth` elements (0: a scalar load).
    /// The parts are consecutive Let statements, part 0 first; its index is the vector's first
    /// element. Targets that have vector loads (CUDA, HIP) load the vector at part 0 and take
    /// each part from it; the others (and a misaligned or, checked, partly out-of-range vector)
    /// load each part as the scalar load it also is.
    uint8_t vectorWidth = 0, vectorPart = 0;
    /// Variables this (uniform) value was computed from: if one of them later becomes
    /// thread-dependent, control flow decided by this value may diverge.
    std::vector<uint32_t> vars;
};

enum class StmtKind : uint8_t {
    Let, Store, DeclareVar, If, For, While, Jump, Barrier,
    MatrixFill, MatrixLoad, MatrixStore, MatrixMma,
    CopyAsync, CopyCommit, CopyWait
};

/// One statement.
/// - Let: evaluates `node`.
/// - Store: space/target[index] = value (index unused for Var).
/// - DeclareVar: var `target` = value.
/// - If: if (node) body else other (other may be kNone).
/// - For: for (node = begin; node < end; node += step) body; node is the LoopIndex node.
/// - While: loop { other (the condition block); if (!node) break; body } (body's parent is other).
/// - Jump: break / continue / return.
/// - Barrier: workgroup barrier, shared memory ordered.
/// - MatrixFill: every element of matrix `matrix` = value.
/// - MatrixLoad / MatrixStore: matrix `matrix` from / to space/target (a binding or shared
///   array), element offset `index`, stride `value` (nodes), `layout`.
/// - MatrixMma: matrix `matrix` = operands[0] * operands[1] + operands[2] (matrix ids).
/// - CopyAsync: shared array `target`[index ..] = binding operands[0][node ..], `vectorWidth`
///   elements, zeros where `value` (a bool node) is false. `body` is the same copy written with
///   ordinary vector loads and stores: a target without asynchronous copies (or a copy it cannot
///   issue: misaligned, checked) runs the body in its place, which completes at once.
/// - CopyCommit: closes this thread's group of copies issued since the last commit.
/// - CopyWait: waits until at most `target` of this thread's committed groups are in flight.
struct Stmt {
    StmtKind kind = StmtKind::Let;
    uint32_t node = kNone;
    Space space = Space::Buffer;
    uint32_t target = 0;
    uint32_t index = kNone;
    uint32_t value = kNone;
    uint32_t body = kNone, other = kNone;
    uint32_t begin = kNone, end = kNone, step = kNone;
    Jump jump = Jump::Break;
    uint32_t matrix = kNone;
    uint32_t operands[3] = {kNone, kNone, kNone};
    /// Store: part `vectorPart` of a vector store of `vectorWidth` elements (0: scalar), the
    /// parts consecutive statements of one block, as for Node::vectorWidth.
    uint8_t vectorWidth = 0, vectorPart = 0;
    Layout layout = Layout::RowMajor;
};

struct Block {
    std::vector<Stmt> stmts;
    uint32_t parent = kNone;
};

struct BindingDecl {
    Type type = Type::F32;
    Access access = Access::ReadWrite;
    bool lengthUsed = false;
};

struct ArrayDecl {
    Space space = Space::Shared;
    Type type = Type::F32;
    uint32_t length = 0;
};

/// A matrix-unit fragment (lang::Matrix): D (m x n) = A (m x k) * B (k x n) + C.
struct MatrixDecl {
    MatrixUse use = MatrixUse::A;
    Type type = Type::F16;
    uint32_t m = 16, n = 16, k = 16;
    uint32_t rows() const { return use == MatrixUse::B ? k : m; }
    uint32_t cols() const { return use == MatrixUse::A ? k : n; }
};

/// A recorded kernel.
struct Module {
    std::string name;
    /// The CUDA/HIP function name: name made an identifier.
    std::string entryPoint;
    KernelOptions options;
    std::vector<Node> nodes;
    std::vector<Block> blocks; ///< blocks[0] is the kernel body
    std::vector<BindingDecl> bindings;
    std::vector<Type> scalars; ///< the caller's scalar struct, in order (32 or 64 bits each)
    std::vector<ArrayDecl> arrays;
    std::vector<Type> vars;
    std::vector<MatrixDecl> matrices;
    /// Shared arrays that matrices load from or store to: kept in their storage type (16-bit
    /// floats as 16 bits) instead of the value type, so the matrix units can read them.
    std::vector<bool> matrixArrays;
    uint32_t loops = 0; ///< For statements (LoopIndex ids)
    bool usesSubgroups = false;
    uint32_t vectorWidths = 0; ///< bit n: the kernel loads or stores vectors of n elements
    bool usesBarrier = false;
    bool usesAsyncCopies = false;

    bool matrixBacked(uint32_t array) const {
        return array < matrixArrays.size() && matrixArrays[array];
    }

    /// Bindings whose element count follows the caller's scalars, in order.
    std::vector<uint32_t> lengthFields() const {
        std::vector<uint32_t> fields;
        for (uint32_t b = 0; b < bindings.size(); ++b)
            if (bindings[b].lengthUsed || options.checked) fields.push_back(b);
        return fields;
    }
    /// Byte offset of the caller's scalar `i` in the struct (natural alignment, like
    /// Dispatch::scalar and a C struct); i == scalars.size() gives the caller's packed size.
    uint32_t scalarOffset(size_t i) const;
    /// Size in bytes of the scalar struct the generated code reads (caller's + lengths, then the
    /// tail padding a C compiler gives the struct).
    uint32_t scalarStructBytes() const;
};

/// Element size in bytes of a type in buffers (bool: 4, as a u32).
inline uint32_t sizeOf(Type t) {
    switch (t) {
    case Type::I8:
    case Type::U8: return 1;
    case Type::I16:
    case Type::U16:
    case Type::F16:
    case Type::BF16: return 2;
    case Type::I64:
    case Type::U64:
    case Type::F64: return 8;
    default: return 4;
    }
}
inline bool isFloat(Type t) {
    return t == Type::F32 || t == Type::F64 || t == Type::F16 || t == Type::BF16;
}
inline bool isInteger(Type t) { return t != Type::Bool && !isFloat(t); }
inline bool isSigned(Type t) {
    return t == Type::I8 || t == Type::I16 || t == Type::I32 || t == Type::I64;
}
/// 8- and 16-bit types: kept widened to 32 bits in registers (floats as f32).
inline bool isNarrow(Type t) { return sizeOf(t) < 4 && t != Type::Bool; }
inline bool isWide(Type t) { return sizeOf(t) == 8; }

/// What the generators and the interpreter share about an operation (lang.hpp,
/// BACKPLANE_LANG_OPS: the one list).
enum class OpFamily : uint8_t { Leaf, Memory, Unary, Binary, Compare, Ternary, Cast, Function, CrossLane };
struct OpInfo {
    const char *name;  ///< in IR listings
    uint8_t operands;  ///< operand nodes read (a, b, c in order); a Load of a variable reads none
    OpFamily family;
};
inline constexpr OpInfo kOpInfo[] = {
#define BACKPLANE_LANG_OP_INFO(name, text, operands, family) {text, operands, OpFamily::family},
    BACKPLANE_LANG_OPS(BACKPLANE_LANG_OP_INFO)
#undef BACKPLANE_LANG_OP_INFO
};
inline constexpr size_t kOpCount = sizeof(kOpInfo) / sizeof(kOpInfo[0]);
/// The table's entry of `op`; nullptr for a value past the table (a malformed module).
inline const OpInfo *opInfo(Op op) noexcept {
    const auto i = static_cast<size_t>(op);
    return i < kOpCount ? &kOpInfo[i] : nullptr;
}
/// Operand nodes `n` reads (a, b, c in that order), or -1 for a value that is no operation.
inline int operandCount(const Node &n) noexcept {
    const OpInfo *info = opInfo(n.op);
    if (info == nullptr) return -1;
    if (n.op == Op::Load && n.space == Space::Var) return 0;
    return info->operands;
}
/// Integer or float arithmetic whose result an 8- or 16-bit type wraps or rounds: what
/// a narrow result must be brought back to its type after.
inline bool narrowsResult(Op op) noexcept {
    const OpInfo *info = opInfo(op);
    if (info == nullptr) return false;
    switch (info->family) {
    case OpFamily::Unary: return op != Op::Not;
    case OpFamily::Binary:
        return op != Op::Min && op != Op::Max && op != Op::And && op != Op::Or && op != Op::Xor;
    case OpFamily::Function: return op != Op::Floor && op != Op::Ceil;
    case OpFamily::CrossLane: return op == Op::SubgroupSum;
    default: return false;
    }
}

inline uint32_t Module::scalarOffset(size_t i) const {
    uint32_t at = 0;
    for (size_t f = 0; f < i && f < scalars.size(); ++f) {
        const uint32_t size = sizeOf(scalars[f]);
        at = (at + size - 1) / size * size + size;
    }
    if (i < scalars.size()) {
        const uint32_t size = sizeOf(scalars[i]);
        at = (at + size - 1) / size * size;
    }
    return at;
}

inline uint32_t Module::scalarStructBytes() const {
    uint32_t at = scalarOffset(scalars.size());
    const size_t lengths = lengthFields().size();
    if (at == 0 && lengths == 0) return 0;
    at = (at + 3) / 4 * 4 + static_cast<uint32_t>(4 * lengths);
    uint32_t align = 4;
    for (Type t : scalars) align = std::max(align, sizeOf(t));
    return (at + align - 1) / align * align;
}

/// Bytes of shared memory the CUDA / HIP source declares for `module` (each array 16-byte
/// aligned; 8- and 16-bit integers held as 32-bit ints, 16-bit floats as floats unless stored
/// narrow for the matrix units or asynchronous copies).
/// `glsl`: as GLSL declares it (f16 stored narrow as float16_t, bf16 as float, bool as 4 bytes,
/// no padding between arrays).
inline uint64_t sharedBytesOnGpu(const Module &module, bool glsl = false) {
    uint64_t total = 0;
    bool halfMatrices = false;
    for (const MatrixDecl &d : module.matrices) halfMatrices = halfMatrices || d.type == Type::F16;
    for (uint32_t a = 0; a < module.arrays.size(); ++a) {
        const ArrayDecl &d = module.arrays[a];
        if (d.space != Space::Shared) continue;
        uint64_t element = sizeOf(d.type);
        if (d.type == Type::Bool) element = glsl ? 4 : 1;
        else if (d.type == Type::F16) element = module.matrixBacked(a) && (!glsl || halfMatrices) ? 2 : 4;
        else if (d.type == Type::BF16) element = module.matrixBacked(a) && !glsl ? 2 : 4;
        else if (isNarrow(d.type)) element = 4;
        if (!glsl) total = (total + 15) / 16 * 16;
        total += element * d.length;
    }
    return total;
}
/// CUDA's static shared memory per block. A kernel that declares more gets its shared arrays in
/// dynamic shared memory instead, and each launch asks for that many bytes (the CUDA plugin
/// raises the function's limit to what the launch asks, up to the device's opt-in maximum).
inline constexpr uint64_t kStaticSharedBytes = 48 * 1024;
inline uint32_t dynamicSharedBytes(const Module &module) {
    const uint64_t bytes = sharedBytesOnGpu(module);
    return bytes > kStaticSharedBytes ? static_cast<uint32_t>(std::min<uint64_t>(bytes, UINT32_MAX)) : 0;
}

/// The dialect `device` runs `source` in: its first variant the device accepts.
std::optional<Dialect> dialectOn(const KernelSource &source, const DeviceInfo &device);
/// `dispatch` with the dynamic shared memory `module` needs in `dialect` added (CUDA and HIP
/// past 48 KiB; kernel.cpp). Throws Error(InvalidArgument) when the sum overflows.
Dispatch withDynamicShared(const Module &module, Dialect dialect, Dispatch dispatch);

/// Generated sources (source_gen.cpp). `dialect` is Cuda, Hip or Glsl.
std::string generateSource(const Module &module, Dialect dialect);
/// The C++ the host plugin compiles for `module` (host_gen.cpp): a function
/// `extern "C" void <hostEntryPoint(module)>(const bp_host_kernel_context *)` that runs one
/// workgroup, its lanes as loops split at barriers. `source` is empty when the module uses what
/// the generator does not compile yet; `reason` then says what (the kernel is interpreted).
struct HostSource {
    std::string source;
    std::string reason;
};
HostSource generateHostSource(const Module &module);
/// The symbol of the generated host function.
inline std::string hostEntryPoint(const Module &module) { return "bp_host_" + module.entryPoint; }

/// A readable listing of the IR (what `backplane kernels dump --dialect host` prints).
std::string listModule(const Module &module);

/// `message` (a compile error of the generated `dialect` source) with the generated line it
/// names, and where to see the whole source.
std::string annotateCompileError(const Module &module, Dialect dialect, const std::string &message);

/// The interpreter's limits: threads per workgroup, and 32-bit words of scratch per worker thread
/// (registers, variables and private arrays per lane, shared arrays, masks).
inline constexpr uint64_t kInterpreterMaxLanes = uint64_t{1} << 16;
inline constexpr uint64_t kInterpreterMaxScratchWords = uint64_t{1} << 29;

/// An upper bound of the scratch words the interpreter needs for `module` at `lanes` threads per
/// workgroup (it reuses registers, so it usually needs less).
inline uint64_t interpreterScratchBound(const Module &module, uint64_t lanes) {
    uint64_t perLane = module.nodes.size() + module.vars.size() + 2 * (module.blocks.size() + 1);
    uint64_t shared = 0;
    for (const ArrayDecl &a : module.arrays) (a.space == Space::Private ? perLane : shared) += a.length;
    for (const MatrixDecl &d : module.matrices) perLane += uint64_t{d.rows()} * d.cols();
    return perLane * lanes + shared;
}

/// The host interpreter (interpreter.cpp): the function of every portable host variant; its
/// user data is the Module.
void interpretWorkgroup(const bp_host_kernel_context *context);

} // namespace backplane::lang::detail
