// Prints a recorded kernel as CUDA C, HIP C or GLSL 450, and as a readable IR listing.
#include "lang/ir.hpp"

#include <backplane/error.hpp>

#include <bit>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

namespace backplane::lang::detail {
namespace {

/// The three source dialects are one C-like printer; this says where they differ.
class SourcePrinter {
public:
    SourcePrinter(const Module &m, Dialect d) : m_(m), glsl_(d == Dialect::Glsl), hip_(d == Dialect::Hip) {}

    std::string print() {
        std::ostringstream body;
        out_ = &body;
        depth_ = 1;
        findRawCopies();
        for (const MatrixDecl &d : m_.matrices) halfMatrices_ = halfMatrices_ || d.type == Type::F16;
        for (uint32_t a = 0; a < m_.arrays.size(); ++a)
            if (m_.arrays[a].space == Space::Private)
                line(std::string(glsl_ ? "" : "__align__(16) ") + typeName(m_.arrays[a].type) + " a" +
                     std::to_string(a) + "[" + std::to_string(m_.arrays[a].length) + "];");
        if (!glsl_ && dynamicSharedBytes(m_) != 0) {
            // Over the static limit: the arrays live in dynamic shared memory, which every
            // launch of the kernel asks for (ComputeClient::execute adds it).
            line("extern __shared__ __align__(16) unsigned char bp_shared[];");
            uint64_t at = 0;
            for (uint32_t a = 0; a < m_.arrays.size(); ++a) {
                if (m_.arrays[a].space != Space::Shared) continue;
                at = (at + 15) / 16 * 16;
                const std::string t = arrayType(a);
                line(t + " *const a" + std::to_string(a) + " = (" + t + " *)(bp_shared + " +
                     std::to_string(at) + ");");
                at += uint64_t{t == "bool" ? 1u : reprBytes(t)} * m_.arrays[a].length;
            }
        } else if (!glsl_) {
            for (uint32_t a = 0; a < m_.arrays.size(); ++a)
                if (m_.arrays[a].space == Space::Shared)
                    line(std::string("__shared__ __align__(16) ") +
                         arrayType(a) + " a" + std::to_string(a) + "[" +
                         std::to_string(m_.arrays[a].length) + "];");
        }
        for (uint32_t f = 0; f < m_.matrices.size(); ++f) declareMatrix(f);
        block(0);
        return header() + signature() + body.str() + "}\n";
    }

private:
    // -- names and literals --------------------------------------------------------------------

    /// The type a value of `t` has in the generated code: 8- and 16-bit integers are 32-bit
    /// ints (C's promotion), f16 and bf16 are floats holding values rounded to their precision.
    std::string typeName(Type t) const {
        switch (t) {
        case Type::Bool: return "bool";
        case Type::I8:
        case Type::I16:
        case Type::I32: return "int";
        case Type::U8:
        case Type::U16:
        case Type::U32: return glsl_ ? "uint" : "unsigned";
        case Type::F16:
        case Type::BF16:
        case Type::F32: return "float";
        case Type::I64: return glsl_ ? "int64_t" : "long long";
        case Type::U64: return glsl_ ? "uint64_t" : "unsigned long long";
        case Type::F64: return "double";
        }
        return "?";
    }

    /// The element type of a buffer of `t` (its bytes in memory).
    std::string storageName(Type t) const {
        switch (t) {
        case Type::I8: return glsl_ ? "int8_t" : "signed char";
        case Type::U8: return glsl_ ? "uint8_t" : "unsigned char";
        case Type::I16: return glsl_ ? "int16_t" : "short";
        case Type::U16:
        case Type::F16:
        case Type::BF16: return glsl_ ? "uint16_t" : "unsigned short";
        default: return typeName(t);
        }
    }

    /// Loads of 16-bit floats (CUDA) whose only use is a store into 16-bit memory of the same
    /// type: the generated code moves their bits (staging a tile for the matrix units then costs
    /// no conversion to float and back).
    void findRawCopies() {
        if (glsl_) return;
        std::vector<uint32_t> uses(m_.nodes.size(), 0);
        std::vector<uint32_t> storedBy(m_.nodes.size(), kNone);
        for (const Node &n : m_.nodes)
            for (uint32_t o : {n.a, n.b, n.c})
                if (o != kNone && o < uses.size()) ++uses[o];
        for (const Block &b : m_.blocks)
            for (const Stmt &st : b.stmts) {
                const bool condition = st.kind == StmtKind::If || st.kind == StmtKind::While;
                for (uint32_t o : {condition ? st.node : kNone, st.index, st.value, st.begin, st.end, st.step})
                    if (o != kNone && o < uses.size()) ++uses[o];
                if (st.kind == StmtKind::Store && st.space != Space::Var && st.value < uses.size() &&
                    storedNarrow(st.space, st.target))
                    storedBy[st.value] = st.space == Space::Buffer ? static_cast<uint32_t>(m_.bindings[st.target].type)
                                                                   : static_cast<uint32_t>(m_.arrays[st.target].type);
            }
        for (uint32_t i = 0; i < m_.nodes.size(); ++i) {
            const Node &n = m_.nodes[i];
            if (n.op != Op::Load || (n.type != Type::F16 && n.type != Type::BF16) || n.space == Space::Var ||
                !storedNarrow(n.space, n.imm) || constantOutside(n.space, n.imm, n.a))
                continue;
            if (uses[i] == 1 && storedBy[i] == static_cast<uint32_t>(n.type)) rawCopy_.insert(i);
        }
        // Vector copies: part p of a vector load is the value of part p of a vector store, used
        // nowhere else, the two memories lay elements out alike.
        for (const Block &b : m_.blocks)
            for (size_t i = 0; i < b.stmts.size(); ++i) {
                const Stmt &st = b.stmts[i];
                if (st.kind != StmtKind::Store || st.vectorWidth == 0 || st.vectorPart != 0) continue;
                const uint32_t width = st.vectorWidth;
                if (i + width > b.stmts.size() || st.value >= m_.nodes.size()) continue;
                const uint32_t first = st.value;
                const Node &head = m_.nodes[first];
                if (head.op != Op::Load || head.vectorWidth != width || head.vectorPart != 0 ||
                    repr(head.space, head.imm) != repr(st.space, st.target) ||
                    !vectorizable(head.space, head.imm, head.a, width) ||
                    !vectorizable(st.space, st.target, st.index, width))
                    continue;
                bool copy = true;
                for (uint32_t p = 0; p < width && copy; ++p) {
                    const Stmt &part = b.stmts[i + p];
                    const uint32_t value = first + p;
                    copy = part.kind == StmtKind::Store && part.vectorWidth == width &&
                           part.vectorPart == p && part.value == value && value < m_.nodes.size() &&
                           m_.nodes[value].op == Op::Load && m_.nodes[value].vectorPart == p &&
                           m_.nodes[value].vectorWidth == width && uses[value] == 1;
                }
                if (!copy) continue;
                vectorCopy_.insert(first);
                const std::string r = repr(head.space, head.imm);
                for (uint32_t p = 0; p < width; ++p)
                    foldedPart_[first + p] = partOf("bp_v" + std::to_string(first), r, width, p);
            }
    }

    /// The element type of shared array `a`: its value type, or (matrix-backed arrays) the
    /// bits the matrix units read: 16-bit floats as 16 bits (float16_t in GLSL).
    /// Whether shared array `a` holds its elements in their storage type: arrays the matrix
    /// units or asynchronous copies use, except in GLSL without f16 matrices (float16_t
    /// arrays need the extension only those enable; the copies there are ordinary stores).
    bool narrowArray(uint32_t a) const { return m_.matrixBacked(a) && (!glsl_ || halfMatrices_); }
    std::string arrayType(uint32_t a) const {
        const Type t = m_.arrays[a].type;
        if (!narrowArray(a) || (t != Type::F16 && t != Type::BF16)) return typeName(t);
        return glsl_ ? (t == Type::F16 ? "float16_t" : "float") : "unsigned short";
    }
    /// Whether loads and stores of `space` `target` convert like a buffer's.
    bool storedNarrow(Space space, uint32_t target) const {
        if (space == Space::Buffer) return true;
        if (space != Space::Shared || !m_.matrixBacked(target)) return false;
        const Type t = m_.arrays[target].type;
        return !glsl_ && (t == Type::F16 || t == Type::BF16);
    }
    bool glslHalfArray(Space space, uint32_t a) const {
        return glsl_ && space == Space::Shared && narrowArray(a) && m_.arrays[a].type == Type::F16;
    }

    std::string literal(Type t, uint64_t bits) const {
        const auto low = static_cast<uint32_t>(bits);
        switch (t) {
        case Type::Bool: return bits ? "true" : "false";
        case Type::I8:
        case Type::I16:
        case Type::I32: {
            const auto v = static_cast<int32_t>(low);
            return v == INT32_MIN ? "(-2147483647 - 1)" : std::to_string(v);
        }
        case Type::U8:
        case Type::U16:
        case Type::U32: return std::to_string(low) + "u";
        case Type::I64: {
            const auto v = static_cast<int64_t>(bits);
            const char *suffix = glsl_ ? "l" : "ll";
            if (v == INT64_MIN) return std::string("(-9223372036854775807") + suffix + " - 1" + suffix + ")";
            return std::to_string(v) + suffix;
        }
        case Type::U64: return std::to_string(bits) + (glsl_ ? "ul" : "ull");
        case Type::F16: return floatLiteral(std::bit_cast<uint32_t>(f16::toFloat(static_cast<uint16_t>(bits))));
        case Type::BF16: return floatLiteral(std::bit_cast<uint32_t>(bf16::toFloat(static_cast<uint16_t>(bits))));
        case Type::F32: return floatLiteral(low);
        case Type::F64: {
            double d;
            std::memcpy(&d, &bits, sizeof d);
            if (!std::isfinite(d)) {
                char text[64];
                if (glsl_)
                    std::snprintf(text, sizeof text, "packDouble2x32(uvec2(0x%08xu, 0x%08xu))",
                                  static_cast<unsigned>(bits), static_cast<unsigned>(bits >> 32));
                else
                    std::snprintf(text, sizeof text, "__longlong_as_double(0x%016llxll)",
                                  static_cast<unsigned long long>(bits));
                return text;
            }
            char text[40];
            std::snprintf(text, sizeof text, "%.17g", d);
            std::string out = text;
            if (out.find_first_of(".e") == std::string::npos) out += ".0";
            return out + (glsl_ ? "lf" : "");
        }
        }
        return "?";
    }

    std::string floatLiteral(uint32_t bits) const {
        float f;
        std::memcpy(&f, &bits, sizeof f);
        if (!std::isfinite(f)) {
            char hex[16];
            std::snprintf(hex, sizeof hex, "0x%08xu", bits);
            return glsl_ ? std::string("uintBitsToFloat(") + hex + ")"
                         : std::string("__uint_as_float(") + hex + ")";
        }
        char text[32];
        std::snprintf(text, sizeof text, "%.9g", static_cast<double>(f));
        std::string out = text;
        if (out.find_first_of(".e") == std::string::npos) out += ".0";
        return out + "f";
    }

    /// `expr` (of the 32-bit type that holds `t`) brought back to `t`: 8- and 16-bit integers
    /// wrapped, f16 and bf16 rounded to nearest even. Other types unchanged.
    std::string normalized(Type t, const std::string &expr) {
        switch (t) {
        case Type::I8:
        case Type::I16: {
            const char *bits = t == Type::I8 ? "8" : "16";
            if (glsl_) return std::string("bitfieldExtract(int(") + expr + "), 0, " + bits + ")";
            return std::string("(int)(") + (t == Type::I8 ? "signed char" : "short") + ")(" + expr + ")";
        }
        case Type::U8: return "((" + expr + ") & 0xffu)";
        case Type::U16: return "((" + expr + ") & 0xffffu)";
        case Type::F16:
            helpers_.insert("bp_rh");
            return "bp_rh(" + expr + ")";
        case Type::BF16:
            helpers_.insert("bp_rb");
            return "bp_rb(" + expr + ")";
        default: return expr;
        }
    }

    /// The kernel name as it may appear in a comment: no control characters (a newline would end
    /// the comment and inject what follows).
    static std::string printable(const std::string &name) {
        std::string text;
        for (char c : name) text += (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) ? '?' : c;
        return text;
    }

    static const char *axis(uint32_t a) { return a == 0 ? "x" : a == 1 ? "y" : "z"; }

    std::string builtin(uint32_t imm) {
        const auto which = static_cast<Builtin>(imm / 4);
        const char *ax = axis(imm % 4);
        const std::string a = ax;
        switch (which) {
        case Builtin::LocalId: return glsl_ ? "gl_LocalInvocationID." + a : "threadIdx." + a;
        case Builtin::GroupId: return glsl_ ? "gl_WorkGroupID." + a : "blockIdx." + a;
        case Builtin::GlobalId:
            return glsl_ ? "gl_GlobalInvocationID." + a
                         : "(blockIdx." + a + " * blockDim." + a + " + threadIdx." + a + ")";
        case Builtin::GroupSize: return glsl_ ? "gl_WorkGroupSize." + a : "blockDim." + a;
        case Builtin::GridSize: return glsl_ ? "gl_NumWorkGroups." + a : "gridDim." + a;
        case Builtin::LocalIndex:
            return glsl_ ? "gl_LocalInvocationIndex"
                         : "((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x)";
        case Builtin::SubgroupSize: return glsl_ ? "gl_SubgroupSize" : "((unsigned)warpSize)";
        case Builtin::SubgroupLane:
            return glsl_ ? "gl_SubgroupInvocationID"
                         : "(((threadIdx.z * blockDim.y + threadIdx.y) * blockDim.x + threadIdx.x) % "
                           "(unsigned)warpSize)";
        }
        return "?";
    }

    /// How a node is referred to where it is used.
    std::string ref(uint32_t id) {
        if (const auto folded = foldedPart_.find(id); folded != foldedPart_.end()) return folded->second;
        const Node &n = m_.nodes[id];
        switch (n.op) {
        case Op::Constant: return literal(n.type, n.imm);
        case Op::Builtin: return builtin(n.imm);
        case Op::Scalar: return "s.s" + std::to_string(n.imm);
        case Op::Length: return "s.len" + std::to_string(n.imm);
        case Op::LoopIndex: return "i" + std::to_string(n.imm);
        default: return "v" + std::to_string(id);
        }
    }

    std::string memory(Space space, uint32_t target) const {
        return (space == Space::Buffer ? "b" : space == Space::Var ? "x" : "a") + std::to_string(target);
    }

    /// A constant index past a shared or private array: the access is decided here (a load
    /// reads 0, a store does nothing), since vendor compilers refuse such an index outright.
    bool constantOutside(Space space, uint32_t target, uint32_t index) const {
        const Node &n = m_.nodes[index];
        return (space == Space::Shared || space == Space::Private) && n.op == Op::Constant &&
               n.imm >= m_.arrays[target].length;
    }

    /// `memory[index]`. GLSL turns a constant buffer index into an int and refuses one of 2^31
    /// or more ("index out of range"): such a constant goes through a function that returns it.
    std::string indexed(Space space, uint32_t target, uint32_t index) {
        const Node &n = m_.nodes[index];
        if (glsl_ && space == Space::Buffer && n.op == Op::Constant && n.imm >= 0x80000000u) {
            helpers_.insert("bp_index");
            return memory(space, target) + "[bp_index(" + literal(Type::U32, n.imm) + ")]";
        }
        return memory(space, target) + "[" + ref(index) + "]";
    }

    /// The condition under which index `index` of a checked access is in range ("" unchecked,
    /// or when a constant index is known to be inside an array).
    std::string inRange(Space space, uint32_t target, uint32_t index) {
        if (!m_.options.checked || space == Space::Var) return "";
        if (space != Space::Buffer && m_.nodes[index].op == Op::Constant) return "";
        if (space == Space::Buffer) return ref(index) + " < s.len" + std::to_string(target);
        return ref(index) + " < " + std::to_string(m_.arrays[target].length) + "u";
    }

    // -- expressions -----------------------------------------------------------------------------

    std::string call(const char *cuda, const char *glsl, std::initializer_list<uint32_t> args) {
        std::string s = std::string(glsl_ ? glsl : cuda) + "(";
        bool first = true;
        for (uint32_t a : args) {
            s += (first ? "" : ", ") + ref(a);
            first = false;
        }
        return s + ")";
    }

    std::string infix(const char *op, const Node &n) { return ref(n.a) + " " + op + " " + ref(n.b); }

    std::string helper(const std::string &name, const Node &n) {
        helpers_.insert(name);
        return name + "(" + ref(n.a) + (n.b == kNone ? "" : ", " + ref(n.b)) + ")";
    }

    /// The bits of 1 in type `t` (for casts from bool).
    static uint64_t oneBits(Type t) {
        switch (t) {
        case Type::F32: return 0x3f800000u;
        case Type::F16: return 0x3c00u;
        case Type::BF16: return 0x3f80u;
        case Type::F64: return 0x3ff0000000000000ull;
        default: return 1u;
        }
    }

    std::string cast(const Node &n) {
        const Type from = m_.nodes[n.a].type, to = n.type;
        const std::string a = ref(n.a);
        if (from == to) return a;
        if (to == Type::Bool) return a + " != " + literal(from, 0);
        if (from == Type::Bool) return a + " ? " + literal(to, oneBits(to)) + " : " + literal(to, 0);
        if (isFloat(from) && isInteger(to)) {
            // Saturating, NaN gives 0: through the 32-bit helpers (then clamped to a narrow
            // type's range) or the 64-bit ones.
            const bool wide = from == Type::F64;
            if (isWide(to)) {
                const char *name = isSigned(to) ? "bp_f2l" : "bp_f2ul";
                helpers_.insert(name);
                return std::string(name) + "(" + convert(Type::F64, a) + ")";
            }
            const std::string name = std::string(wide ? "bp_d2" : "bp_f2") + (isSigned(to) ? "i" : "u");
            helpers_.insert(name);
            const std::string wide32 = name + "(" + a + ")";
            switch (to) {
            case Type::I8: return "max(min(" + wide32 + ", 127), -128)";
            case Type::I16: return "max(min(" + wide32 + ", 32767), -32768)";
            case Type::U8: return "min(" + wide32 + ", 255u)";
            case Type::U16: return "min(" + wide32 + ", 65535u)";
            default: return wide32;
            }
        }
        if (isFloat(to)) {
            // Integers and floats to a float: through float for f16 and bf16, rounded.
            if (to == Type::F16 || to == Type::BF16)
                return normalized(to, convert(Type::F32, a));
            if (from == Type::F16 || from == Type::BF16) // already a float holding the value
                return to == Type::F32 ? a : convert(to, a);
            return convert(to, a);
        }
        // Integer to integer: C's conversion (wraps to the low bits, sign-extends signed
        // sources), then a narrow target wrapped.
        return normalized(to, convert(to, a));
    }

    /// `expr` converted to the value type of `t` (C's conversion).
    std::string convert(Type t, const std::string &expr) const {
        return glsl_ ? typeName(t) + "(" + expr + ")" : "(" + typeName(t) + ")(" + expr + ")";
    }

    /// A load of a buffer element of `t` as its value type.
    std::string fromStorage(Type t, const std::string &element) {
        switch (t) {
        case Type::I8:
        case Type::I16: return glsl_ ? "int(" + element + ")" : "(int)" + element;
        case Type::U8:
        case Type::U16: return glsl_ ? "uint(" + element + ")" : "(unsigned)" + element;
        case Type::F16:
            helpers_.insert("bp_h2f");
            return glsl_ ? "bp_h2f(uint(" + element + "))" : "bp_h2f(" + element + ")";
        case Type::BF16:
            helpers_.insert("bp_b2f");
            return glsl_ ? "bp_b2f(uint(" + element + "))" : "bp_b2f(" + element + ")";
        default: return element;
        }
    }

    /// A value of `t` as a buffer element's bytes.
    std::string toStorage(Type t, const std::string &value) {
        if (t == Type::F16 || t == Type::BF16) {
            const char *name = t == Type::F16 ? "bp_f2h" : "bp_f2b";
            helpers_.insert(name);
            return glsl_ ? "uint16_t(" + std::string(name) + "(" + value + "))"
                         : "(unsigned short)" + std::string(name) + "(" + value + ")";
        }
        if (isNarrow(t)) return glsl_ ? storageName(t) + "(" + value + ")" : "(" + storageName(t) + ")(" + value + ")";
        return value;
    }

    std::string atomic(const Node &n) {
        // Not static: the exchange's name depends on the dialect of this printer.
        const char *names[] = {"atomicAdd", "atomicMin", "atomicMax", "atomicAnd",
                               "atomicOr",  "atomicXor", glsl_ ? "atomicExchange" : "atomicExch"};
        if (constantOutside(n.space, n.imm, n.a)) return literal(n.type, 0);
        const std::string element = indexed(n.space, n.imm, n.a);
        std::string target = glsl_ ? element : "&" + element;
        std::string value = ref(n.b);
        std::string op;
        if (hip_ && n.type == Type::I64 && (n.atomicOp == AtomicOp::Min || n.atomicOp == AtomicOp::Max)) {
            // HIP has no signed 64-bit atomicMin/Max: a compare-and-swap loop.
            const std::string name = n.atomicOp == AtomicOp::Min ? "bp_atomic_min_i64" : "bp_atomic_max_i64";
            helpers_.insert(name);
            op = name + "(" + target + ", " + value + ")";
        } else if (!glsl_ && n.type == Type::I64 && n.atomicOp != AtomicOp::Min && n.atomicOp != AtomicOp::Max) {
            // CUDA has these on unsigned long long only: the same two's-complement bits.
            op = "(long long)" + std::string(names[static_cast<int>(n.atomicOp)]) +
                 "((unsigned long long *)" + target + ", (unsigned long long)" + value + ")";
        } else {
            op = std::string(names[static_cast<int>(n.atomicOp)]) + "(" + target + ", " + value + ")";
        }
        const std::string range = inRange(n.space, n.imm, n.a);
        return range.empty() ? op : "(" + range + ") ? " + op + " : " + literal(n.type, 0);
    }

    std::string subgroup(const Node &n) {
        const bool f = n.type == Type::F32;
        switch (n.op) {
        case Op::SubgroupSum:
        case Op::SubgroupMin:
        case Op::SubgroupMax: {
            const char *which = n.op == Op::SubgroupSum ? "Add" : n.op == Op::SubgroupMin ? "Min" : "Max";
            if (glsl_) return std::string("subgroup") + which + "(" + ref(n.a) + ")";
            const std::string name = std::string("bp_subgroup_") + which + "_" + typeName(n.type);
            helpers_.insert(name);
            return name + "(" + ref(n.a) + ")";
        }
        case Op::ShuffleXor:
            if (glsl_) return "subgroupShuffleXor(" + ref(n.a) + ", " + ref(n.b) + ")";
            return hip_ ? "__shfl_xor(" + ref(n.a) + ", (int)" + ref(n.b) + ")"
                        : "__shfl_xor_sync(__activemask(), " + ref(n.a) + ", (int)" + ref(n.b) + ")";
        case Op::Broadcast:
            if (glsl_) return "subgroupShuffle(" + ref(n.a) + ", " + ref(n.b) + ")";
            return hip_ ? "__shfl(" + ref(n.a) + ", (int)" + ref(n.b) + ")"
                        : "__shfl_sync(__activemask(), " + ref(n.a) + ", (int)" + ref(n.b) + ")";
        default: (void)f; return "?";
        }
    }

    /// A value's expression: the operation in the value's generated type, then (8- and 16-bit
    /// types) brought back to the type.
    std::string expression(const Node &n) {
        const std::string raw = operation(n);
        return narrowsResult(n.op) ? normalized(n.type, raw) : raw;
    }

    /// A float function: CUDA's float or double name, GLSL's (which has no double versions of
    /// the transcendental functions: such a use becomes an #error naming it).
    std::string math(const Node &n, const char *cudaFloat, const char *cudaDouble, const char *glsl,
                     bool glslDouble, std::initializer_list<uint32_t> args) {
        const bool dbl = m_.nodes[n.a].type == Type::F64;
        if (glsl_ && dbl && !glslDouble)
            refusals_.insert(std::string("f64 ") + glsl + "() has no GLSL function; use f32 on "
                             "Vulkan devices");
        return call(dbl ? cudaDouble : cudaFloat, glsl, args);
    }

    std::string operation(const Node &n) {
        const Type t = n.a != kNone ? m_.nodes[n.a].type : n.type; // the operands' type
        const bool f = isFloat(t);
        const bool dbl = t == Type::F64;
        const bool isBool = n.type == Type::Bool && (n.a == kNone || m_.nodes[n.a].type == Type::Bool);
        const auto helperFor = [&](const char *op) {
            const char *kind = t == Type::I64   ? "i64"
                               : t == Type::U64 ? "u64"
                               : isSigned(t)    ? "i32"
                                                : "u32";
            return helper(std::string("bp_") + op + "_" + kind, n);
        };
        const auto shift = [&](const char *op) {
            const std::string mask = isWide(t) ? literal(t, 63) : literal(t, 31);
            return ref(n.a) + " " + op + " (" + ref(n.b) + " & " + mask + ")";
        };
        switch (n.op) {
        case Op::Load: {
            if (n.space != Space::Var && constantOutside(n.space, n.imm, n.a))
                return literal(n.type, 0);
            std::string element = n.space == Space::Var ? memory(n.space, n.imm)
                                                        : indexed(n.space, n.imm, n.a);
            if (glsl_ && halfMatrices_ && n.space == Space::Buffer && n.type == Type::F16) {
                // Through the float16_t view the matrix units read anyway: a hardware convert.
                halfAliases_.insert(n.imm);
                element.insert(1 + std::to_string(n.imm).size(), "h");
                element = "float(" + element + ")";
            } else if (storedNarrow(n.space, n.imm)) element = fromStorage(n.type, element);
            else if (glslHalfArray(n.space, n.imm)) element = "float(" + element + ")";
            const std::string range = n.space == Space::Var ? "" : inRange(n.space, n.imm, n.a);
            return range.empty() ? element : "(" + range + ") ? " + element + " : " + literal(n.type, 0);
        }
        case Op::Neg: return "-(" + ref(n.a) + ")"; // a literal may be negative: no "--3"
        case Op::Not: return "!(" + ref(n.a) + ")";
        case Op::BitNot: return "~(" + ref(n.a) + ")";
        case Op::Add: return infix("+", n);
        case Op::Sub: return infix("-", n);
        case Op::Mul: return infix("*", n);
        case Op::Div:
            if (f) return infix("/", n);
            return helperFor("div");
        case Op::Rem: return helperFor("rem");
        case Op::Min:
            if (f && !glsl_) return call(dbl ? "fmin" : "fminf", "min", {n.a, n.b});
            return call("min", "min", {n.a, n.b});
        case Op::Max:
            if (f && !glsl_) return call(dbl ? "fmax" : "fmaxf", "max", {n.a, n.b});
            return call("max", "max", {n.a, n.b});
        case Op::And: return infix(isBool ? "&&" : "&", n);
        case Op::Or: return infix(isBool ? "||" : "|", n);
        case Op::Xor: return infix(isBool ? "!=" : "^", n);
        case Op::Shl: return shift("<<");
        case Op::Shr: return shift(">>");
        case Op::Eq: return infix("==", n);
        case Op::Ne: return infix("!=", n);
        case Op::Lt: return infix("<", n);
        case Op::Le: return infix("<=", n);
        case Op::Gt: return infix(">", n);
        case Op::Ge: return infix(">=", n);
        case Op::Select: return ref(n.a) + " ? " + ref(n.b) + " : " + ref(n.c);
        case Op::Cast: return cast(n);
        case Op::Fma: return call(dbl ? "fma" : "fmaf", "fma", {n.a, n.b, n.c});
        case Op::Pow: return math(n, "powf", "pow", "pow", false, {n.a, n.b});
        case Op::Abs:
            if (f) return call(dbl ? "fabs" : "fabsf", "abs", {n.a});
            if (!isSigned(t)) return ref(n.a);
            return call(t == Type::I64 ? "llabs" : "abs", "abs", {n.a});
        case Op::Sqrt: return math(n, "sqrtf", "sqrt", "sqrt", true, {n.a});
        case Op::Rsqrt: return math(n, "rsqrtf", "rsqrt", "inversesqrt", true, {n.a});
        case Op::Exp: return math(n, "expf", "exp", "exp", false, {n.a});
        case Op::Log: return math(n, "logf", "log", "log", false, {n.a});
        case Op::Sin: return math(n, "sinf", "sin", "sin", false, {n.a});
        case Op::Cos: return math(n, "cosf", "cos", "cos", false, {n.a});
        case Op::Tanh: return math(n, "tanhf", "tanh", "tanh", false, {n.a});
        case Op::Floor: return math(n, "floorf", "floor", "floor", true, {n.a});
        case Op::Ceil: return math(n, "ceilf", "ceil", "ceil", true, {n.a});
        case Op::Atomic: return atomic(n);
        case Op::SubgroupSum:
        case Op::SubgroupMin:
        case Op::SubgroupMax:
        case Op::ShuffleXor:
        case Op::Broadcast: return subgroup(n);
        default: return ref(static_cast<uint32_t>(&n - m_.nodes.data()));
        }
    }

    // -- statements ------------------------------------------------------------------------------

    void line(const std::string &text) { *out_ << std::string(4 * depth_, ' ') << text << "\n"; }

    void block(uint32_t b) {
        const std::vector<Stmt> &stmts = m_.blocks[b].stmts;
        for (size_t i = 0; i < stmts.size(); ++i) {
            if (const size_t parts = vectorStore(stmts, i); parts > 0) {
                i += parts - 1;
                continue;
            }
            statement(stmts[i]);
        }
    }

    // -- vectors (CUDA and HIP) --------------------------------------------------------------------
    //
    // A vector load is `width` consecutive scalar Loads (Node::vectorPart 0..width-1) and a
    // vector store `width` consecutive Stores. Here part 0 moves the whole vector with one
    // access of up to 16 bytes when its address is aligned (and, checked, every part is in
    // range); otherwise each part is the scalar access it also is. GLSL prints the scalar
    // accesses (the driver's compiler may merge them).

    /// The C type of an element of `space` `target` as it lies in memory.
    std::string repr(Space space, uint32_t target) const {
        if (space == Space::Buffer) return storageName(m_.bindings[target].type);
        if (space == Space::Shared) return arrayType(target);
        return typeName(m_.arrays[target].type);
    }
    static uint32_t reprBytes(const std::string &r) {
        if (r == "signed char" || r == "unsigned char") return 1;
        if (r == "short" || r == "unsigned short") return 2;
        if (r == "double" || r == "long long" || r == "unsigned long long") return 8;
        if (r == "bool") return 0;
        return 4;
    }
    static std::string vectorType(uint32_t bytes) {
        return bytes == 16 ? "uint4" : bytes == 8 ? "uint2" : bytes == 4 ? "unsigned" : "unsigned short";
    }
    /// Word w of a raw vector variable of `bytes` bytes.
    static std::string word(const std::string &var, uint32_t bytes, uint32_t w) {
        if (bytes <= 4) return "(unsigned)" + var;
        static const char *const kLanes[] = {".x", ".y", ".z", ".w"};
        return var + kLanes[w];
    }
    /// Whether a vector of `width` elements of `space` `target` at index node `index` can move as
    /// one access here (else: scalar accesses only).
    bool vectorizable(Space space, uint32_t target, uint32_t index, uint32_t width) const {
        if (glsl_ || space == Space::Var) return false;
        const uint32_t bytes = width * reprBytes(repr(space, target));
        if (bytes != 2 && bytes != 4 && bytes != 8 && bytes != 16) return false;
        const Node &n = m_.nodes[index];
        if (space != Space::Buffer && n.op == Op::Constant && n.imm + width > m_.arrays[target].length)
            return false;
        return true;
    }
    /// The condition under which the vector at index node `index` moves as one access.
    std::string vectorFast(Space space, uint32_t target, uint32_t index, uint32_t width) {
        const uint32_t bytes = width * reprBytes(repr(space, target));
        const std::string i = ref(index);
        // The element's address is aligned when the memory's start is and the index is a
        // multiple of the width. Arrays start 16-byte aligned; a binding's start is checked, a
        // loop-invariant test the compiler hoists, unlike the address of each element.
        std::string fast = "(" + i + " & " + std::to_string(width - 1) + "u) == 0u && " + i + " <= " +
                           std::to_string(0xffffffffu - (width - 1)) + "u";
        if (space == Space::Buffer)
            fast = "((unsigned long long)" + memory(space, target) + " & " + std::to_string(bytes - 1) +
                   "ull) == 0ull && " + fast;
        if (m_.options.checked) {
            const std::string length = space == Space::Buffer ? "(unsigned long long)s.len" + std::to_string(target)
                                                              : std::to_string(m_.arrays[target].length) + "ull";
            fast += " && (unsigned long long)" + i + " + " + std::to_string(width) + "ull <= " + length;
        }
        return fast;
    }
    /// A value of C type `r` from `bits` (an unsigned or unsigned long long expression).
    static std::string fromBits(const std::string &r, const std::string &bits) {
        if (r == "float") return "__uint_as_float(" + bits + ")";
        if (r == "double") return "__longlong_as_double((long long)(" + bits + "))";
        if (r == "unsigned") return bits;
        return "(" + r + ")(" + bits + ")";
    }
    /// The bits of a value of C type `r` as an unsigned (or unsigned long long for 8 bytes).
    static std::string toBits(const std::string &r, const std::string &value) {
        if (r == "float") return "__float_as_uint(" + value + ")";
        if (r == "double") return "(unsigned long long)__double_as_longlong(" + value + ")";
        if (reprBytes(r) == 8) return "(unsigned long long)(" + value + ")";
        if (reprBytes(r) == 4) return "(unsigned)(" + value + ")";
        return "(unsigned)(" + std::string(reprBytes(r) == 2 ? "unsigned short" : "unsigned char") + ")(" + value + ")";
    }
    /// Part `part` of the raw vector `var` of elements of C type `r`, as an `r` value.
    static std::string partOf(const std::string &var, const std::string &r, uint32_t width, uint32_t part) {
        const uint32_t size = reprBytes(r), bytes = width * size;
        if (size == 8)
            return fromBits(r, "((unsigned long long)" + word(var, bytes, 2 * part + 1) + " << 32 | " +
                                   word(var, bytes, 2 * part) + ")");
        const uint32_t at = part * size;
        std::string bits = word(var, bytes, at / 4);
        if (size < 4) bits = "(" + bits + " >> " + std::to_string(8 * (at % 4)) + ")";
        return fromBits(r, bits);
    }

    /// Prints the Let of part `n` of a vector load (CUDA / HIP); false when it loads as a
    /// scalar.
    bool vectorLoad(uint32_t id, const Node &n, const std::string &type) {
        const uint32_t first = id - n.vectorPart, width = n.vectorWidth;
        const Node &head = m_.nodes[first];
        if (head.op != Op::Load || head.vectorWidth != width || head.vectorPart != 0 ||
            head.space != n.space || head.imm != n.imm || !vectorizable(n.space, n.imm, head.a, width))
            return false;
        const std::string r = repr(n.space, n.imm);
        const std::string var = "bp_v" + std::to_string(first), flag = "bp_f" + std::to_string(first);
        if (vectorCopy_.count(first)) {
            // The vector as one register; element loads (checked: zeros outside) where the
            // access cannot be one.
            if (n.vectorPart != 0) return true;
            const uint32_t bytes = width * reprBytes(r);
            const std::string vt = vectorType(bytes);
            std::vector<std::string> bits;
            for (uint32_t p = 0; p < width; ++p) {
                const Node &part = m_.nodes[first + p];
                std::string element = indexed(part.space, part.imm, part.a);
                const std::string range = inRange(part.space, part.imm, part.a);
                if (!range.empty()) element = "((" + range + ") ? " + element + " : (" + r + ")0)";
                bits.push_back(toBits(r, element));
            }
            line(vt + " " + var + ";");
            line("if (" + vectorFast(n.space, n.imm, head.a, width) + ") " + var + " = *(const " + vt +
                 " *)&" + memory(n.space, n.imm) + "[" + ref(head.a) + "];");
            line("else " + var + " = " + pack(r, width, bits) + ";");
            return true;
        }
        if (n.vectorPart == 0) {
            const std::string vt = vectorType(width * reprBytes(r));
            line("const bool " + flag + " = " + vectorFast(n.space, n.imm, head.a, width) + ";");
            line(vt + " " + var + "; if (" + flag + ") " + var + " = *(const " + vt + " *)&" +
                 memory(n.space, n.imm) + "[" + ref(head.a) + "];");
        }
        std::string part = partOf(var, r, width, n.vectorPart);
        if (!rawCopy_.count(id) && storedNarrow(n.space, n.imm)) part = fromStorage(n.type, part);
        const std::string scalar = rawCopy_.count(id) ? rawElement(n) : expression(n);
        line(type + " v" + std::to_string(id) + " = " + flag + " ? " + part + " : " + scalar + ";");
        return true;
    }

    /// A raw vector of `width` elements of C type `r` from each element's bits.
    static std::string pack(const std::string &r, uint32_t width, const std::vector<std::string> &bits) {
        const uint32_t size = reprBytes(r), bytes = width * size;
        std::vector<std::string> words;
        if (size == 8) {
            for (const std::string &b : bits) {
                words.push_back("(unsigned)(" + b + ")");
                words.push_back("(unsigned)((" + b + ") >> 32)");
            }
        } else {
            const uint32_t per = 4 / size;
            for (uint32_t w = 0; w * per < width; ++w) {
                std::string packed;
                for (uint32_t k = 0; k < per && w * per + k < width; ++k)
                    packed += std::string(k ? " | " : "") + "(" + bits[w * per + k] + ")" +
                              (k ? " << " + std::to_string(8 * size * k) : "");
                words.push_back(packed);
            }
        }
        if (bytes == 16) return "make_uint4(" + words[0] + ", " + words[1] + ", " + words[2] + ", " + words[3] + ")";
        if (bytes == 8) return "make_uint2(" + words[0] + ", " + words[1] + ")";
        if (bytes == 4) return words[0];
        return "(unsigned short)(" + words[0] + ")";
    }

    std::string rawElement(const Node &n) {
        std::string element = indexed(n.space, n.imm, n.a);
        const std::string range = inRange(n.space, n.imm, n.a);
        if (!range.empty()) element = "(" + range + ") ? " + element + " : (unsigned short)0";
        return element;
    }

    /// Prints the vector store whose part 0 is stmts[i] (CUDA / HIP) and returns how many
    /// statements it covers; 0 when stmts[i] is not one (or stores as scalars).
    size_t vectorStore(const std::vector<Stmt> &stmts, size_t i) {
        const Stmt &s = stmts[i];
        if (s.kind != StmtKind::Store || s.vectorWidth == 0 || s.vectorPart != 0) return 0;
        const uint32_t width = s.vectorWidth;
        if (i + width > stmts.size() || !vectorizable(s.space, s.target, s.index, width)) return 0;
        for (uint32_t p = 1; p < width; ++p) {
            const Stmt &t = stmts[i + p];
            if (t.kind != StmtKind::Store || t.vectorWidth != width || t.vectorPart != p ||
                t.space != s.space || t.target != s.target)
                return 0;
        }
        const std::string r = repr(s.space, s.target);
        const uint32_t size = reprBytes(r), bytes = width * size;
        const Type type = s.space == Space::Buffer ? m_.bindings[s.target].type : m_.arrays[s.target].type;
        std::vector<std::string> bits;
        for (uint32_t p = 0; p < width; ++p) {
            const uint32_t value = stmts[i + p].value;
            std::string v = rawCopy_.count(value) ? ref(value)
                            : storedNarrow(s.space, s.target) ? toStorage(type, ref(value))
                                                               : ref(value);
            bits.push_back(toBits(r, v));
        }
        (void)bytes;
        const uint32_t head = stmts[i].value;
        const std::string value = vectorCopy_.count(head) ? "bp_v" + std::to_string(head) : pack(r, width, bits);
        line("if (" + vectorFast(s.space, s.target, s.index, width) + ") {");
        ++depth_;
        line("*(" + vectorType(bytes) + " *)&" + memory(s.space, s.target) + "[" + ref(s.index) + "] = " + value + ";");
        --depth_;
        line("} else {");
        ++depth_;
        for (uint32_t p = 0; p < width; ++p) statement(stmts[i + p]);
        --depth_;
        line("}");
        return width;
    }

    void nested(uint32_t b) {
        ++depth_;
        block(b);
        --depth_;
    }

    void statement(const Stmt &s) {
        switch (s.kind) {
        case StmtKind::Let: {
            const Node &n = m_.nodes[s.node];
            if (n.op == Op::Load && n.vectorWidth > 0 && !glsl_ &&
                vectorLoad(s.node, n, rawCopy_.count(s.node) ? "unsigned short" : typeName(n.type)))
                break;
            if (rawCopy_.count(s.node)) {
                // A 16-bit float moved between 16-bit memories: its bits, no conversion.
                line("unsigned short v" + std::to_string(s.node) + " = " + rawElement(n) + ";");
                break;
            }
            // GLSL: `precise` keeps a*b+c two roundings (SPIR-V NoContraction) and fma() fused.
            const std::string qualifier = glsl_ && isFloat(n.type) ? "precise " : "";
            line(qualifier + typeName(n.type) + " v" + std::to_string(s.node) + " = " + expression(n) + ";");
            break;
        }
        case StmtKind::Store: {
            if (s.space != Space::Var && constantOutside(s.space, s.target, s.index)) {
                line("// store to a" + std::to_string(s.target) + "[" + ref(s.index) +
                     "]: past the array, does nothing");
                break;
            }
            const std::string element = s.space == Space::Var
                                            ? memory(s.space, s.target)
                                            : indexed(s.space, s.target, s.index);
            const std::string stored =
                rawCopy_.count(s.value) ? ref(s.value)
                : storedNarrow(s.space, s.target)
                    ? toStorage(s.space == Space::Buffer ? m_.bindings[s.target].type : m_.arrays[s.target].type,
                                ref(s.value))
                : glslHalfArray(s.space, s.target) ? "float16_t(" + ref(s.value) + ")"
                                                   : ref(s.value);
            const std::string range = s.space == Space::Var ? "" : inRange(s.space, s.target, s.index);
            line((range.empty() ? "" : "if (" + range + ") ") + element + " = " + stored + ";");
            break;
        }
        case StmtKind::DeclareVar:
            line(typeName(m_.vars[s.target]) + " x" + std::to_string(s.target) + " = " + ref(s.value) + ";");
            break;
        case StmtKind::If:
            line("if (" + ref(s.node) + ") {");
            nested(s.body);
            if (s.other != kNone) {
                line("} else {");
                nested(s.other);
            }
            line("}");
            break;
        case StmtKind::For: {
            const std::string i = ref(s.node), t = typeName(m_.nodes[s.node].type);
            line("for (" + t + " " + i + " = " + ref(s.begin) + "; " + i + " < " + ref(s.end) + "; " + i +
                 " += " + ref(s.step) + ") {");
            nested(s.body);
            line("}");
            break;
        }
        case StmtKind::While:
            line("for (;;) {");
            nested(s.other);
            ++depth_;
            line("if (!(" + ref(s.node) + ")) break;");
            --depth_;
            nested(s.body);
            line("}");
            break;
        case StmtKind::Jump:
            line(s.jump == Jump::Break ? "break;" : s.jump == Jump::Continue ? "continue;" : "return;");
            break;
        case StmtKind::Barrier:
            line(glsl_ ? "memoryBarrierShared();" : "__syncthreads();");
            if (glsl_) line("barrier();");
            break;
        case StmtKind::MatrixFill:
        case StmtKind::MatrixLoad:
        case StmtKind::MatrixStore:
        case StmtKind::MatrixMma: matrixStatement(s); break;
        case StmtKind::CopyAsync: copyAsync(s); break;
        case StmtKind::CopyCommit:
        case StmtKind::CopyWait:
            // Only CUDA copies asynchronously; elsewhere the copies completed when issued.
            if (glsl_ || hip_) break;
            line("#if __CUDA_ARCH__ >= 800");
            line(s.kind == StmtKind::CopyCommit
                     ? "asm volatile(\"cp.async.commit_group;\" ::: \"memory\");"
                     : "asm volatile(\"cp.async.wait_group %0;\" :: \"n\"(" +
                           std::to_string(std::min<uint32_t>(s.target, 7)) + ") : \"memory\");");
            line("#endif");
            break;
        }
    }

    /// An asynchronous copy: one cp.async (CUDA, compute capability 8.0 and up) where the
    /// condition holds and both addresses are aligned to the copy (and, checked, in range);
    /// otherwise the body, the same copy in ordinary loads and stores.
    void copyAsync(const Stmt &s) {
        const uint32_t binding = s.operands[0], width = s.vectorWidth;
        const uint32_t bytes = width * reprBytes(repr(Space::Buffer, binding));
        const bool raw = bytes == width * reprBytes(repr(Space::Shared, s.target));
        line("{");
        ++depth_;
        if (glsl_ || hip_ || !raw || (bytes != 4 && bytes != 8 && bytes != 16) ||
            !vectorizable(Space::Shared, s.target, s.index, width)) {
            block(s.body);
            --depth_;
            line("}");
            return;
        }
        helpers_.insert("bp_smem");
        const std::string done = "bp_c" + std::to_string(copies_++);
        line("bool " + done + " = false;");
        line("#if __CUDA_ARCH__ >= 800");
        // A copy whose condition is false reads nothing (source size 0: zeros), from the
        // binding's first element rather than from an index that may be out of range.
        const std::string b = memory(Space::Buffer, binding), valid = ref(s.value);
        line("if ((" + valid + " ? " + vectorFast(Space::Buffer, binding, s.node, width) +
             " : ((unsigned long long)" + b + " & " + std::to_string(bytes - 1) + "ull) == 0ull) && " +
             vectorFast(Space::Shared, s.target, s.index, width) + ") {");
        ++depth_;
        line(std::string("asm volatile(\"cp.async.") + (bytes == 16 ? "cg" : "ca") +
             ".shared.global [%0], [%1], " + std::to_string(bytes) + ", %2;\" :: \"r\"(bp_smem(&" +
             memory(Space::Shared, s.target) + "[" + ref(s.index) + "])), \"l\"(" + valid + " ? &" + b +
             "[" + ref(s.node) + "] : " + b + "), \"r\"(" + valid +
             " ? " + std::to_string(bytes) + "u : 0u));");
        line(done + " = true;");
        --depth_;
        line("}");
        line("#endif");
        line("if (!" + done + ") {");
        nested(s.body);
        line("}");
        --depth_;
        line("}");
    }

    // -- matrix units ----------------------------------------------------------------------------
    //
    // CUDA: PTX mma.sync (m16n8k16 for f16 / bf16, m16n8k8 for tf32), two per 16x16 tile, with
    // the fragment layouts of the PTX ISA ("Matrix fragments for mma.m16n8k16"): lane l holds,
    // with g = l / 4 and t = l % 4, A elements (g or g + 8, 2t + {0, 1} or + 8), B elements
    // (2t + {0, 1} or + 8, g) per 8-column half, accumulator elements (g or g + 8, 2t + {0, 1})
    // per half. Shared 16-bit tiles load with ldmatrix when offset and stride are multiples of 8.
    // No header is needed (NVRTC has none on a machine without the toolkit).
    // GLSL: GL_NV_cooperative_matrix (f16 only: the extension has no bf16 or tf32).
    // HIP: not lowered (the HIP plugin reports no matrix shapes); an #error names it.

    std::string mref(uint32_t f) const { return "m" + std::to_string(f); }

    static bool tf32(const MatrixDecl &d) { return d.type == Type::F32 && d.use != MatrixUse::Accumulator; }

    static std::string coopType(const MatrixDecl &d) {
        const std::string bits = d.use == MatrixUse::Accumulator ? "32" : "16";
        return "fcoopmatNV<" + bits + ", gl_ScopeSubgroup, " + std::to_string(d.rows()) + ", " +
               std::to_string(d.cols()) + ">";
    }

    void declareMatrix(uint32_t f) {
        const MatrixDecl &d = m_.matrices[f];
        if (glsl_) {
            if (d.type == Type::BF16)
                refusals_.insert("bf16 matrices: GL_NV_cooperative_matrix has no bf16 (the device "
                                 "reports no bf16 matrix shape); use f16 on Vulkan");
            else if (tf32(d))
                refusals_.insert("f32 (tf32) matrix inputs: GL_NV_cooperative_matrix has none; use "
                                 "f16 on Vulkan");
            else line(coopType(d) + " " + mref(f) + ";");
            return;
        }
        if (hip_) {
            refusals_.insert("matrix units are not lowered for HIP (the HIP plugin reports no "
                             "matrix shapes)");
            return;
        }
        line(std::string(d.use == MatrixUse::Accumulator ? "float " : "unsigned ") + mref(f) + "[" +
             (d.use == MatrixUse::Accumulator ? "8" : "4") + "];");
    }

    /// The memory a matrix statement reads or writes (GLSL: f16 buffers through their alias).
    static std::string matrixMemory(const Stmt &s, bool halfAlias) {
        if (s.space == Space::Buffer) return "b" + std::to_string(s.target) + (halfAlias ? "h" : "");
        return "a" + std::to_string(s.target);
    }

    void matrixStatement(const Stmt &s) {
        if (hip_) return; // refused in the header
        const MatrixDecl &d = m_.matrices[s.matrix];
        const MatrixDecl &input = s.kind == StmtKind::MatrixMma ? m_.matrices[s.operands[0]] : d;
        if (glsl_ && (input.type == Type::BF16 || tf32(input))) return; // refused in the header
        if (s.kind == StmtKind::MatrixMma) return mmaStatement(s);
        if (s.kind == StmtKind::MatrixFill) return fillStatement(s.matrix, ref(s.value));
        const bool store = s.kind == StmtKind::MatrixStore;
        const bool col = s.layout == Layout::ColMajor;
        line("{");
        ++depth_;
        const std::string u = glsl_ ? "uint" : "unsigned";
        line(u + " bp_o = " + ref(s.index) + ", bp_s = " + ref(s.value) + ";");
        bool closeCheck = false;
        if (m_.options.checked) {
            // The last element the fragment touches, in 64 bits: past the memory, a load gives
            // zeros and a store writes nothing.
            const uint32_t outer = col ? d.cols() : d.rows(), inner = col ? d.rows() : d.cols();
            const std::string length =
                s.space == Space::Buffer ? "s.len" + std::to_string(s.target)
                                         : std::to_string(m_.arrays[s.target].length) + "u";
            std::string last, limit;
            if (glsl_) {
                mentionInt64_ = true;
                last = "uint64_t(bp_o) + uint64_t(" + std::to_string(outer - 1) + "u) * uint64_t(bp_s) + " +
                       std::to_string(inner - 1) + "ul";
                limit = "uint64_t(" + length + ")";
            } else {
                last = "(unsigned long long)bp_o + " + std::to_string(outer - 1) + "ull * bp_s + " +
                       std::to_string(inner - 1) + "ull";
                limit = "(unsigned long long)" + length;
            }
            line("if (" + last + " < " + limit + ") {");
            ++depth_;
            closeCheck = true;
        }
        if (glsl_) {
            const bool alias = s.space == Space::Buffer && d.type == Type::F16;
            if (alias) halfAliases_.insert(s.target);
            line(std::string(store ? "coopMatStoreNV(" : "coopMatLoadNV(") + mref(s.matrix) + ", " +
                 matrixMemory(s, alias) + ", bp_o, bp_s, " + (col ? "true" : "false") + ");");
        } else {
            cudaMatrixMemory(s, d, store);
        }
        if (closeCheck) {
            --depth_;
            if (store) {
                line("}");
            } else {
                line("} else {");
                ++depth_;
                fillStatement(s.matrix, glsl_ ? "0.0" : "0.0f");
                --depth_;
                line("}");
            }
        }
        --depth_;
        line("}");
    }

    void fillStatement(uint32_t f, const std::string &value) {
        const MatrixDecl &d = m_.matrices[f];
        if (glsl_) {
            const std::string v = d.type == Type::F16 ? "float16_t(" + value + ")" : value;
            line(mref(f) + " = " + coopType(d) + "(" + v + ");");
            return;
        }
        if (d.use == MatrixUse::Accumulator) {
            line("#pragma unroll");
            line("for (int bp_e = 0; bp_e < 8; ++bp_e) " + mref(f) + "[bp_e] = " + value + ";");
        } else if (tf32(d)) {
            helpers_.insert("bp_tf32");
            line("#pragma unroll");
            line("for (int bp_e = 0; bp_e < 4; ++bp_e) " + mref(f) + "[bp_e] = bp_tf32(" + value + ");");
        } else {
            const std::string bits = toStorage(d.type, value);
            line("{ unsigned bp_h = (unsigned)" + bits + "; for (int bp_e = 0; bp_e < 4; ++bp_e) " + mref(f) +
                 "[bp_e] = bp_h | (bp_h << 16); }");
        }
    }

    /// Element (row r, column c) of the matrix at bp_o with stride bp_s, as an index.
    static std::string at(bool col, const std::string &r, const std::string &c) {
        return col ? "bp_o + (" + c + ") * bp_s + (" + r + ")" : "bp_o + (" + r + ") * bp_s + (" + c + ")";
    }

    void cudaMatrixMemory(const Stmt &s, const MatrixDecl &d, bool store) {
        const bool col = s.layout == Layout::ColMajor;
        const std::string p = matrixMemory(s, false), f = mref(s.matrix);
        helpers_.insert("bp_lane");
        line("unsigned bp_l = bp_lane(), bp_g = bp_l >> 2, bp_t = bp_l & 3u;");
        if (d.use == MatrixUse::Accumulator) {
            line("#pragma unroll");
            line("for (unsigned bp_e = 0; bp_e < 8u; ++bp_e) {");
            ++depth_;
            line("unsigned bp_r = bp_g + ((bp_e >> 1) & 1u) * 8u, bp_c = (bp_e >> 2) * 8u + bp_t * 2u + (bp_e & 1u);");
            if (store) line(p + "[" + at(col, "bp_r", "bp_c") + "] = " + f + "[bp_e];");
            else line(f + "[bp_e] = " + p + "[" + at(col, "bp_r", "bp_c") + "];");
            --depth_;
            line("}");
            return;
        }
        if (tf32(d)) {
            helpers_.insert("bp_tf32");
            line("#pragma unroll");
            line("for (unsigned bp_e = 0; bp_e < 4u; ++bp_e) {");
            ++depth_;
            if (d.use == MatrixUse::A)
                line("unsigned bp_r = bp_g + (bp_e & 1u) * 8u, bp_c = bp_t + (bp_e >> 1) * 4u;");
            else
                line("unsigned bp_r = bp_t + (bp_e & 1u) * 4u, bp_c = bp_g + (bp_e >> 1) * 8u;");
            line(f + "[bp_e] = bp_tf32(" + p + "[" + at(col, "bp_r", "bp_c") + "]);");
            --depth_;
            line("}");
            return;
        }
        // 16-bit inputs: ldmatrix from shared memory when every row address is 16-byte aligned.
        const bool shared = s.space == Space::Shared;
        if (shared) {
            helpers_.insert("bp_smem");
            // A row-major and B column-major lie as the fragment wants them; the other two are
            // loaded transposed.
            const bool a = d.use == MatrixUse::A;
            const bool trans = a ? col : !col;
            line("if (((bp_o | bp_s) & 7u) == 0u) {");
            ++depth_;
            line("unsigned bp_i = bp_l >> 3, bp_q = bp_l & 7u;");
            // The element (row, column of the fragment) whose stored row this lane points at:
            // one of the 8 rows of one of the four 8x8 pieces, in register order.
            std::string r, c;
            if (a && !col) { r = "bp_q + (bp_i & 1u) * 8u"; c = "(bp_i >> 1) * 8u"; }
            else if (a) { r = "(bp_i & 1u) * 8u"; c = "bp_q + (bp_i >> 1) * 8u"; }
            else if (!col) { r = "bp_q + (bp_i & 1u) * 8u"; c = "(bp_i >> 1) * 8u"; }
            else { r = "(bp_i & 1u) * 8u"; c = "bp_q + (bp_i >> 1) * 8u"; }
            line("asm volatile(\"ldmatrix.sync.aligned.m8n8.x4" + std::string(trans ? ".trans" : "") +
                 ".shared.b16 {%0, %1, %2, %3}, [%4];\" : \"=r\"(" + f + "[0]), \"=r\"(" + f + "[1]), \"=r\"(" + f +
                 "[2]), \"=r\"(" + f + "[3]) : \"r\"(bp_smem(&" + p + "[" + at(col, r, c) + "])) : \"memory\");");
            --depth_;
            line("} else {");
            ++depth_;
        }
        line("#pragma unroll");
        line("for (unsigned bp_e = 0; bp_e < 4u; ++bp_e) {");
        ++depth_;
        // The two elements of register bp_e: (r, c) and the next column (A) or row (B).
        if (d.use == MatrixUse::A) {
            line("unsigned bp_r = bp_g + (bp_e & 1u) * 8u, bp_c = bp_t * 2u + (bp_e >> 1) * 8u;");
            line("unsigned bp_lo = " + p + "[" + at(col, "bp_r", "bp_c") + "], bp_hi = " + p + "[" +
                 at(col, "bp_r", "bp_c + 1u") + "];");
        } else {
            line("unsigned bp_r = bp_t * 2u + (bp_e & 1u) * 8u, bp_c = bp_g + (bp_e >> 1) * 8u;");
            line("unsigned bp_lo = " + p + "[" + at(col, "bp_r", "bp_c") + "], bp_hi = " + p + "[" +
                 at(col, "bp_r + 1u", "bp_c") + "];");
        }
        line(f + "[bp_e] = bp_lo | (bp_hi << 16);");
        --depth_;
        line("}");
        if (shared) {
            --depth_;
            line("}");
        }
    }

    void mmaStatement(const Stmt &s) {
        const MatrixDecl &a = m_.matrices[s.operands[0]];
        const std::string d = mref(s.matrix), ma = mref(s.operands[0]), mb = mref(s.operands[1]),
                          c = mref(s.operands[2]);
        if (glsl_) {
            line(d + " = coopMatMulAddNV(" + ma + ", " + mb + ", " + c + ");");
            return;
        }
        const std::string kind = tf32(a)                 ? "m16n8k8.row.col.f32.tf32.tf32.f32"
                                 : a.type == Type::BF16 ? "m16n8k16.row.col.f32.bf16.bf16.f32"
                                                        : "m16n8k16.row.col.f32.f16.f16.f32";
        const auto e = [](const std::string &m, int i) { return m + "[" + std::to_string(i) + "]"; };
        for (int h = 0; h < 2; ++h)
            line("asm(\"mma.sync.aligned." + kind +
                 " {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\" : \"=f\"(" +
                 e(d, 4 * h) + "), \"=f\"(" + e(d, 4 * h + 1) + "), \"=f\"(" + e(d, 4 * h + 2) + "), \"=f\"(" +
                 e(d, 4 * h + 3) + ") : \"r\"(" + e(ma, 0) + "), \"r\"(" + e(ma, 1) + "), \"r\"(" + e(ma, 2) +
                 "), \"r\"(" + e(ma, 3) + "), \"r\"(" + e(mb, 2 * h) + "), \"r\"(" + e(mb, 2 * h + 1) +
                 "), \"f\"(" + e(c, 4 * h) + "), \"f\"(" + e(c, 4 * h + 1) + "), \"f\"(" + e(c, 4 * h + 2) +
                 "), \"f\"(" + e(c, 4 * h + 3) + "));");
    }

    // -- the frame around the body ---------------------------------------------------------------

    std::string scalarStruct() const {
        std::string fields;
        for (uint32_t i = 0; i < m_.scalars.size(); ++i)
            fields += " " + typeName(m_.scalars[i]) + " s" + std::to_string(i) + ";";
        for (uint32_t b : m_.lengthFields()) fields += " " + typeName(Type::U32) + " len" + std::to_string(b) + ";";
        return fields;
    }

    std::string header() {
        std::string h = "// Generated by backplane from kernel '" + printable(m_.name) + "' (" +
                        (glsl_ ? "GLSL 450" : hip_ ? "HIP" : "CUDA") + "); see docs/kernels.md.\n";
        if (glsl_) {
            h = "#version 450\n" + h;
            if (m_.usesSubgroups)
                h += "#extension GL_KHR_shader_subgroup_basic : require\n"
                     "#extension GL_KHR_shader_subgroup_arithmetic : require\n"
                     "#extension GL_KHR_shader_subgroup_shuffle : require\n";
            // The Vulkan plugin defines the macro where the device keeps signed zeros,
            // infinities and NaNs on request (0 * inf = NaN, 0 * -2 = -0, as on the other
            // targets); elsewhere the driver may fold them (docs/kernels.md).
            h += "#ifdef BP_PRESERVE_FLOAT_SPECIALS\n"
                 "#extension GL_EXT_spirv_intrinsics : require\n"
                 "spirv_execution_mode(extensions = [\"SPV_KHR_float_controls\"], "
                 "capabilities = [4466], 4461, 32);\n"
                 "#endif\n";
            h += typeExtensions();
            for (const std::string &why : refusals_) h += "#error " + why + "\n";
            h += "layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;\n";
            for (uint32_t b = 0; b < m_.bindings.size(); ++b) {
                const BindingDecl &d = m_.bindings[b];
                const char *access = d.access == Access::Read ? "readonly " : d.access == Access::Write ? "writeonly " : "";
                h += "layout(set = 0, binding = " + std::to_string(b) + ", std430) " + access + "buffer B" +
                     std::to_string(b) + " { " + storageName(d.type) + " b" + std::to_string(b) + "[]; };\n";
                // The same binding seen as float16_t, for the matrix units (aliased descriptors).
                if (halfAliases_.count(b))
                    h += "layout(set = 0, binding = " + std::to_string(b) + ", std430) " + access + "buffer B" +
                         std::to_string(b) + "h { float16_t b" + std::to_string(b) + "h[]; };\n";
            }
            if (m_.scalarStructBytes() > 0)
                h += "layout(push_constant, std430) uniform Scalars {" + scalarStruct() + " } s;\n";
            for (uint32_t a = 0; a < m_.arrays.size(); ++a)
                if (m_.arrays[a].space == Space::Shared)
                    h += "shared " + arrayType(a) + " a" + std::to_string(a) + "[" +
                         std::to_string(m_.arrays[a].length) + "];\n";
        } else {
            for (const std::string &why : refusals_) h += "#error " + why + "\n";
            if (m_.scalarStructBytes() > 0) h += "struct bp_scalars {" + scalarStruct() + " };\n";
        }
        return h + helperText();
    }

    std::string signature() const {
        if (glsl_) return "void main() {\n";
        std::string s = "extern \"C\" __global__ void " + m_.entryPoint + "(";
        for (uint32_t b = 0; b < m_.bindings.size(); ++b) {
            const BindingDecl &d = m_.bindings[b];
            s += std::string(b ? ", " : "") + (d.access == Access::Read ? "const " : "") + storageName(d.type) +
                 " *b" + std::to_string(b);
        }
        if (m_.scalarStructBytes() > 0) s += std::string(m_.bindings.empty() ? "" : ", ") + "bp_scalars s";
        return s + ") {\n";
    }

    /// The GLSL extensions the types of the kernel need (the device must have the matching
    /// features: the core refuses the kernel where DeviceInfo::features lacks them).
    std::string typeExtensions() const {
        bool storage8 = false, storage16 = false, int64 = false, atomic64 = false, atomicF = false;
        const auto note = [&](Type t) { int64 = int64 || t == Type::I64 || t == Type::U64; };
        for (const BindingDecl &d : m_.bindings) {
            storage8 = storage8 || d.type == Type::I8 || d.type == Type::U8;
            storage16 = storage16 || d.type == Type::I16 || d.type == Type::U16 ||
                        d.type == Type::F16 || d.type == Type::BF16;
            note(d.type);
        }
        for (Type t : m_.scalars) note(t);
        for (Type t : m_.vars) note(t);
        for (const ArrayDecl &a : m_.arrays) note(a.type);
        for (const Node &n : m_.nodes) {
            note(n.type);
            if (n.op == Op::Atomic) {
                atomic64 = atomic64 || isWide(n.type);
                atomicF = atomicF || n.type == Type::F32;
            }
        }
        bool matrices = false, half = false;
        for (const MatrixDecl &d : m_.matrices) {
            matrices = true;
            half = half || d.type == Type::F16;
        }
        int64 = int64 || mentionInt64_;
        storage16 = storage16 || half;
        std::string h;
        if (matrices)
            h += "#extension GL_NV_cooperative_matrix : require\n"
                 "#extension GL_KHR_memory_scope_semantics : require\n";
        if (half) h += "#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require\n";
        if (storage8) h += "#extension GL_EXT_shader_8bit_storage : require\n";
        if (storage16) h += "#extension GL_EXT_shader_16bit_storage : require\n";
        if (int64) h += "#extension GL_EXT_shader_explicit_arithmetic_types_int64 : require\n";
        if (atomic64) h += "#extension GL_EXT_shader_atomic_int64 : require\n";
        if (atomicF) h += "#extension GL_EXT_shader_atomic_float : require\n";
        return h;
    }

    /// The helper functions the body used, in a fixed order.
    std::string helperText() const {
        const std::string fn = glsl_ ? "" : "__device__ __forceinline__ ";
        const std::string u = glsl_ ? "uint" : "unsigned";
        std::string text;
        auto add = [&](const char *name, const std::string &definition) {
            if (helpers_.count(name)) text += fn + definition + "\n";
        };
        add("bp_index", u + " bp_index(" + u + " i) { return i; }");
        add("bp_lane", "unsigned bp_lane() { unsigned l; asm(\"mov.u32 %0, %%laneid;\" : \"=r\"(l)); return l; }");
        add("bp_smem", "unsigned bp_smem(const void *p) { unsigned a; asm(\"{ .reg .u64 g; cvta.to.shared.u64 g, %1; "
                       "cvt.u32.u64 %0, g; }\" : \"=r\"(a) : \"l\"(p)); return a; }");
        add("bp_tf32", "unsigned bp_tf32(float f) { unsigned t; asm(\"cvt.rna.tf32.f32 %0, %1;\" : \"=r\"(t) : \"f\"(f)); "
                       "return t; }");
        add("bp_div_i32", "int bp_div_i32(int a, int b) { return b == 0 ? 0 : b == -1 ? int(0u - " + u +
                              "(a)) : a / b; }");
        add("bp_rem_i32", "int bp_rem_i32(int a, int b) { return b == 0 || b == -1 ? 0 : a - b * (a / b); }");
        add("bp_div_u32", u + " bp_div_u32(" + u + " a, " + u + " b) { return b == 0u ? 0u : a / b; }");
        add("bp_rem_u32", u + " bp_rem_u32(" + u + " a, " + u + " b) { return b == 0u ? 0u : a % b; }");
        const std::string nan = glsl_ ? "isnan(x)" : "x != x";
        add("bp_f2i", "int bp_f2i(float x) { return " + nan + " ? 0 : x <= -2147483648.0f ? (-2147483647 - 1) : "
                      "x >= 2147483648.0f ? 2147483647 : int(x); }");
        add("bp_f2u", u + " bp_f2u(float x) { return isnan(x) || x <= 0.0f ? 0u : x >= 4294967296.0f ? "
                          "4294967295u : " + u + "(x); }");
        // 64-bit integers: the same rules as the 32-bit helpers.
        const std::string i64 = glsl_ ? "int64_t" : "long long";
        const std::string u64 = glsl_ ? "uint64_t" : "unsigned long long";
        const std::string l = glsl_ ? "l" : "ll";
        const auto cv = [&](const std::string &type, const std::string &expr) {
            return glsl_ ? type + "(" + expr + ")" : "(" + type + ")(" + expr + ")";
        };
        add("bp_div_i64", i64 + " bp_div_i64(" + i64 + " a, " + i64 + " b) { return b == 0" + l +
                              " ? 0" + l + " : b == -1" + l + " ? " + cv(i64, "0u" + l + " - " + cv(u64, "a")) +
                              " : a / b; }");
        add("bp_rem_i64", i64 + " bp_rem_i64(" + i64 + " a, " + i64 + " b) { return b == 0" + l +
                              " || b == -1" + l + " ? 0" + l + " : a - b * (a / b); }");
        add("bp_div_u64", u64 + " bp_div_u64(" + u64 + " a, " + u64 + " b) { return b == 0u" + l +
                              " ? 0u" + l + " : a / b; }");
        add("bp_rem_u64", u64 + " bp_rem_u64(" + u64 + " a, " + u64 + " b) { return b == 0u" + l +
                              " ? 0u" + l + " : a % b; }");
        const std::string dnan = glsl_ ? "isnan(x)" : "x != x";
        add("bp_d2i", "int bp_d2i(double x) { return " + dnan + " ? 0 : x <= -2147483648.0 ? (-2147483647 - 1) : "
                      "x >= 2147483648.0 ? 2147483647 : int(x); }");
        add("bp_d2u", u + " bp_d2u(double x) { return " + dnan + " || x <= 0.0 ? 0u : x >= 4294967296.0 ? "
                          "4294967295u : " + u + "(x); }");
        add("bp_f2l", i64 + " bp_f2l(double x) { return " + dnan + " ? 0" + l + " : x <= -9223372036854775808.0 ? "
                          "(-9223372036854775807" + l + " - 1" + l + ") : x >= 9223372036854775808.0 ? "
                          "9223372036854775807" + l + " : " + cv(i64, "x") + "; }");
        add("bp_f2ul", u64 + " bp_f2ul(double x) { return " + dnan + " || x <= 0.0 ? 0u" + l +
                           " : x >= 18446744073709551616.0 ? 18446744073709551615u" + l + " : " + cv(u64, "x") +
                           "; }");
        // f16 and bf16: their bits to float and back, rounding to nearest even (NaN stays a
        // quiet NaN, overflow gives infinity), as core/src/comm/host_reduce.cpp does on the host.
        const std::string f2u = glsl_ ? "floatBitsToUint" : "__float_as_uint";
        const std::string u2f = glsl_ ? "uintBitsToFloat" : "__uint_as_float";
        const bool needHalf = helpers_.count("bp_h2f") || helpers_.count("bp_f2h") || helpers_.count("bp_rh");
        const bool needBf16 = helpers_.count("bp_b2f") || helpers_.count("bp_f2b") || helpers_.count("bp_rb");
        if (needHalf && !glsl_ && !hip_) {
            // CUDA: the hardware conversions (one instruction each), with NaNs kept as the
            // other targets keep them (sign and payload in, sign | 0x7e00 out).
            text += fn + "float bp_h2f(unsigned h) { if ((h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0u) "
                    "return __uint_as_float(((h & 0x8000u) << 16) | 0x7f800000u | ((h & 0x3ffu) << 13)); "
                    "float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"((unsigned short)h)); return f; }\n";
            text += fn + "unsigned bp_f2h(float f) { unsigned x = __float_as_uint(f); "
                    "if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) & 0x8000u) | 0x7e00u; "
                    "unsigned short r; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(r) : \"f\"(f)); return r; }\n";
            text += fn + "float bp_rh(float f) { return bp_h2f(bp_f2h(f)); }\n";
        } else if (needHalf) {
            text += fn + "float bp_h2f(" + u + " h) { " + u + " sign = (h & 0x8000u) << 16; " + u +
                    " e = (h >> 10) & 0x1fu; " + u + " m = h & 0x3ffu; "
                    "if (e == 0u) return (sign != 0u ? -1.0f : 1.0f) * float(m) * 5.9604644775390625e-8f; "
                    "if (e == 31u) return " + u2f + "(sign | 0x7f800000u | (m << 13)); "
                    "return " + u2f + "(sign | ((e + 112u) << 23) | (m << 13)); }\n";
            text += fn + u + " bp_f2h(float f) { " + u + " x = " + f2u + "(f); " + u +
                    " sign = (x >> 16) & 0x8000u; " + u + " a = x & 0x7fffffffu; "
                    "if (a >= 0x7f800000u) return sign | 0x7c00u | (a > 0x7f800000u ? 0x200u : 0u); "
                    "if (a >= 0x477ff000u) return sign | 0x7c00u; "
                    "if (a < 0x38800000u) { if (a < 0x33000000u) return sign; " + u +
                    " m = (a & 0x7fffffu) | 0x800000u; " + u + " sh = 126u - (a >> 23); " + u +
                    " r = m >> sh; " + u + " rest = m & ((1u << sh) - 1u); " + u +
                    " half_ = 1u << (sh - 1u); if (rest > half_ || (rest == half_ && (r & 1u) != 0u)) r += 1u; "
                    "return sign | r; } " + u + " v = a - 0x38000000u; " + u +
                    " rest = v & 0x1fffu; v >>= 13; "
                    "if (rest > 0x1000u || (rest == 0x1000u && (v & 1u) != 0u)) v += 1u; return sign | v; }\n";
            text += fn + "float bp_rh(float f) { return bp_h2f(bp_f2h(f)); }\n";
        }
        if (needBf16) {
            text += fn + "float bp_b2f(" + u + " b) { return " + u2f + "(b << 16); }\n";
            text += fn + u + " bp_f2b(float f) { " + u + " x = " + f2u + "(f); "
                    "if ((x & 0x7fffffffu) > 0x7f800000u) return ((x >> 16) | 0x40u) & 0xffffu; "
                    "return ((x + 0x7fffu + ((x >> 16) & 1u)) >> 16) & 0xffffu; }\n";
            text += fn + "float bp_rb(float f) { return bp_b2f(bp_f2b(f)); }\n";
        }
        for (const char *which : {"min", "max"}) {
            const std::string name = std::string("bp_atomic_") + which + "_i64";
            if (!helpers_.count(name)) continue;
            const char *keep = std::string(which) == "min" ? "cur <= v" : "cur >= v";
            text += fn + "long long " + name + "(long long *p, long long v) { unsigned long long *q = "
                    "(unsigned long long *)p; unsigned long long old = *q, assumed; do { assumed = old; "
                    "long long cur = (long long)assumed; if (" + keep + ") break; old = atomicCAS(q, "
                    "assumed, (unsigned long long)v); } while (old != assumed); return (long long)old; }\n";
        }
        if (!glsl_) {
            for (const char *t : {"int", "unsigned", "float"})
                for (const char *w : {"Add", "Min", "Max"}) {
                    const std::string name = std::string("bp_subgroup_") + w + "_" + t;
                    if (!helpers_.count(name)) continue;
                    const std::string combine = std::string(w) == "Add" ? "v + o"
                                                : std::string(t) == "float" ? (std::string(w) == "Min" ? "fminf(v, o)" : "fmaxf(v, o)")
                                                                            : (std::string(w) == "Min" ? "min(v, o)" : "max(v, o)");
                    const std::string shfl = hip_ ? "__shfl_xor(v, lane)" : "__shfl_xor_sync(__activemask(), v, lane)";
                    text += fn + t + " " + name + "(" + t + " v) { for (int lane = warpSize / 2; lane > 0; lane /= 2) { " +
                            t + " o = " + shfl + "; v = " + combine + "; } return v; }\n";
                }
        }
        return text;
    }

    const Module &m_;
    bool glsl_, hip_;
    std::ostringstream *out_ = nullptr;
    int depth_ = 0;
    std::set<std::string> helpers_;
    /// What GLSL cannot express, each printed as an #error line (the Vulkan compile then fails
    /// naming it).
    std::set<std::string> refusals_;
    /// f16 bindings the matrix units read through a float16_t alias (GLSL).
    std::set<uint32_t> halfAliases_;
    std::set<uint32_t> rawCopy_;
    uint32_t copies_ = 0; ///< asynchronous copies printed (their flags' names)
    /// Vector copies (CUDA): part 0 of a vector load whose parts only feed one vector store
    /// of the same layout; the parts are never printed, the vector moves as one register.
    std::set<uint32_t> vectorCopy_;
    /// Parts of those loads: the expression that takes each from the vector register.
    std::map<uint32_t, std::string> foldedPart_;
    bool halfMatrices_ = false;
    bool mentionInt64_ = false;
};

const char *atomicName(AtomicOp op) {
    static const char *names[] = {"add", "min", "max", "and", "or", "xor", "exchange"};
    return names[static_cast<int>(op)];
}

const char *opName(Op op) {
    const OpInfo *info = opInfo(op);
    return info != nullptr ? info->name : "?";
}

} // namespace

std::string generateSource(const Module &module, Dialect dialect) {
    if (dialect != Dialect::Cuda && dialect != Dialect::Hip && dialect != Dialect::Glsl)
        throw Error(ErrorCode::Unsupported, std::string("kernel '") + module.name +
                                                "': no generator for dialect " + toString(dialect));
    return SourcePrinter(module, dialect).print();
}

std::string listModule(const Module &m) {
    std::ostringstream out;
    out << "kernel " << m.name << (m.options.checked ? " (checked)" : "") << "\n";
    for (uint32_t b = 0; b < m.bindings.size(); ++b)
        out << "  binding " << b << ": " << toString(m.bindings[b].type)
            << (m.bindings[b].access == Access::Read ? " read" : m.bindings[b].access == Access::Write ? " write" : " read-write")
            << "\n";
    for (uint32_t s = 0; s < m.scalars.size(); ++s) out << "  scalar " << s << ": " << toString(m.scalars[s]) << "\n";
    for (uint32_t a = 0; a < m.arrays.size(); ++a)
        out << "  array a" << a << ": " << (m.arrays[a].space == Space::Shared ? "shared " : "private ")
            << toString(m.arrays[a].type) << "[" << m.arrays[a].length << "]"
            << (m.matrixBacked(a) ? " (matrix)" : "") << "\n";
    for (uint32_t f = 0; f < m.matrices.size(); ++f) {
        const MatrixDecl &d = m.matrices[f];
        out << "  matrix m" << f << ": "
            << (d.use == MatrixUse::A ? "a " : d.use == MatrixUse::B ? "b " : "accumulator ")
            << toString(d.type) << " " << d.m << "x" << d.n << "x" << d.k << "\n";
    }
    std::function<void(uint32_t, int)> list = [&](uint32_t block, int depth) {
        const std::string pad(2 * depth, ' ');
        auto operand = [&](uint32_t id) {
            const Node &n = m.nodes[id];
            if (n.op == Op::Constant) return "#" + std::to_string(n.imm) + ":" + toString(n.type);
            if (n.op == Op::LoopIndex) return "i" + std::to_string(n.imm);
            if (n.op == Op::Scalar) return "s" + std::to_string(n.imm);
            if (n.op == Op::Length) return "len" + std::to_string(n.imm);
            if (n.op == Op::Builtin) return "builtin" + std::to_string(n.imm);
            return "v" + std::to_string(id);
        };
        for (const Stmt &s : m.blocks[block].stmts) {
            switch (s.kind) {
            case StmtKind::Let: {
                const Node &n = m.nodes[s.node];
                out << pad << "v" << s.node << ": " << toString(n.type) << " = " << opName(n.op);
                if (n.op == Op::Atomic) out << "_" << atomicName(n.atomicOp);
                if (n.op == Op::Load || n.op == Op::Atomic) out << " " << (n.space == Space::Buffer ? "b" : n.space == Space::Var ? "x" : n.space == Space::Shared ? "shared a" : "private a") << n.imm;
                for (uint32_t o : {n.a, n.b, n.c})
                    if (o != kNone) out << " " << operand(o);
                out << "\n";
                break;
            }
            case StmtKind::Store:
                out << pad << "store " << (s.space == Space::Buffer ? "b" : s.space == Space::Var ? "x" : s.space == Space::Shared ? "shared a" : "private a") << s.target;
                if (s.index != kNone) out << "[" << operand(s.index) << "]";
                out << " = " << operand(s.value) << "\n";
                break;
            case StmtKind::DeclareVar: out << pad << "var x" << s.target << ":" << toString(m.vars[s.target]) << " = " << operand(s.value) << "\n"; break;
            case StmtKind::If:
                out << pad << "if " << operand(s.node) << "\n";
                list(s.body, depth + 1);
                if (s.other != kNone) {
                    out << pad << "else\n";
                    list(s.other, depth + 1);
                }
                break;
            case StmtKind::For:
                out << pad << "for " << operand(s.node) << ":" << toString(m.nodes[s.node].type) << " in " << operand(s.begin) << ".." << operand(s.end)
                    << " step " << operand(s.step) << "\n";
                list(s.body, depth + 1);
                break;
            case StmtKind::While:
                out << pad << "while\n";
                list(s.other, depth + 1);
                out << pad << "  until !" << operand(s.node) << "\n";
                list(s.body, depth + 1);
                break;
            case StmtKind::Jump:
                out << pad << (s.jump == Jump::Break ? "break" : s.jump == Jump::Continue ? "continue" : "return") << "\n";
                break;
            case StmtKind::Barrier: out << pad << "barrier\n"; break;
            case StmtKind::MatrixFill: out << pad << "fill m" << s.matrix << " = " << operand(s.value) << "\n"; break;
            case StmtKind::MatrixLoad:
            case StmtKind::MatrixStore:
                out << pad << (s.kind == StmtKind::MatrixLoad ? "load m" : "store m") << s.matrix << " "
                    << (s.space == Space::Buffer ? "b" : "shared a") << s.target << " at " << operand(s.index)
                    << " stride " << operand(s.value) << (s.layout == Layout::ColMajor ? " col" : " row") << "\n";
                break;
            case StmtKind::MatrixMma:
                out << pad << "mma m" << s.matrix << " = m" << s.operands[0] << " * m" << s.operands[1] << " + m"
                    << s.operands[2] << "\n";
                break;
            case StmtKind::CopyAsync:
                out << pad << "copy_async " << unsigned(s.vectorWidth) << " shared a" << s.target << "[" << operand(s.index)
                    << "] = b" << s.operands[0] << "[" << operand(s.node) << "] if " << operand(s.value) << "\n";
                list(s.body, depth + 1);
                break;
            case StmtKind::CopyCommit: out << pad << "copy_commit\n"; break;
            case StmtKind::CopyWait: out << pad << "copy_wait " << s.target << "\n"; break;
            }
        }
    };
    list(0, 1);
    return out.str();
}

} // namespace backplane::lang::detail
