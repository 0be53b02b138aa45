// Prints a recorded kernel as CUDA C, HIP C or GLSL 450, and as a readable IR listing.
#include "lang/ir.hpp"

#include <backplane/error.hpp>

#include <cmath>
#include <cstdio>
#include <cstring>
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
        for (uint32_t a = 0; a < m_.arrays.size(); ++a)
            if (m_.arrays[a].space == Space::Private)
                line(typeName(m_.arrays[a].type) + " a" + std::to_string(a) + "[" +
                     std::to_string(m_.arrays[a].length) + "];");
        if (!glsl_)
            for (uint32_t a = 0; a < m_.arrays.size(); ++a)
                if (m_.arrays[a].space == Space::Shared)
                    line("__shared__ " + typeName(m_.arrays[a].type) + " a" + std::to_string(a) +
                         "[" + std::to_string(m_.arrays[a].length) + "];");
        block(0);
        return header() + signature() + body.str() + "}\n";
    }

private:
    // -- names and literals --------------------------------------------------------------------

    std::string typeName(Type t) const {
        switch (t) {
        case Type::Bool: return "bool";
        case Type::I32: return "int";
        case Type::U32: return glsl_ ? "uint" : "unsigned";
        case Type::F32: return "float";
        }
        return "?";
    }

    std::string literal(Type t, uint32_t bits) const {
        switch (t) {
        case Type::Bool: return bits ? "true" : "false";
        case Type::I32: {
            const auto v = static_cast<int32_t>(bits);
            return v == INT32_MIN ? "(-2147483647 - 1)" : std::to_string(v);
        }
        case Type::U32: return std::to_string(bits) + "u";
        case Type::F32: {
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
            std::string s = text;
            if (s.find_first_of(".e") == std::string::npos) s += ".0";
            return s + "f";
        }
        }
        return "?";
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

    std::string cast(const Node &n) {
        const Type from = m_.nodes[n.a].type, to = n.type;
        const std::string a = ref(n.a);
        if (from == to) return a;
        if (to == Type::Bool) return a + " != " + literal(from, 0);
        if (from == Type::Bool)
            return a + " ? " + literal(to, to == Type::F32 ? 0x3f800000u : 1u) + " : " + literal(to, 0);
        if (from == Type::F32) return helper(to == Type::I32 ? "bp_f2i" : "bp_f2u", n);
        return typeName(to) + "(" + a + ")";
    }

    std::string atomic(const Node &n) {
        static const char *names[] = {"atomicAdd", "atomicMin", "atomicMax", "atomicAnd",
                                      "atomicOr",  "atomicXor", glsl_ ? "atomicExchange" : "atomicExch"};
        if (constantOutside(n.space, n.imm, n.a)) return literal(n.type, 0);
        const std::string element = indexed(n.space, n.imm, n.a);
        const std::string op = std::string(names[static_cast<int>(n.atomicOp)]) + "(" +
                               (glsl_ ? element : "&" + element) + ", " + ref(n.b) + ")";
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

    std::string expression(const Node &n) {
        const bool f = n.type == Type::F32 || (n.a != kNone && m_.nodes[n.a].type == Type::F32);
        const bool isBool = n.type == Type::Bool && (n.a == kNone || m_.nodes[n.a].type == Type::Bool);
        switch (n.op) {
        case Op::Load: {
            if (n.space != Space::Var && constantOutside(n.space, n.imm, n.a))
                return literal(n.type, 0);
            const std::string element = n.space == Space::Var ? memory(n.space, n.imm)
                                                              : indexed(n.space, n.imm, n.a);
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
            return helper(n.type == Type::I32 ? "bp_div_i32" : "bp_div_u32", n);
        case Op::Rem: return helper(n.type == Type::I32 ? "bp_rem_i32" : "bp_rem_u32", n);
        case Op::Min: return f && !glsl_ ? call("fminf", "min", {n.a, n.b}) : call("min", "min", {n.a, n.b});
        case Op::Max: return f && !glsl_ ? call("fmaxf", "max", {n.a, n.b}) : call("max", "max", {n.a, n.b});
        case Op::And: return infix(isBool ? "&&" : "&", n);
        case Op::Or: return infix(isBool ? "||" : "|", n);
        case Op::Xor: return infix(isBool ? "!=" : "^", n);
        case Op::Shl: return ref(n.a) + " << (" + ref(n.b) + " & 31" + (n.type == Type::U32 ? "u" : "") + ")";
        case Op::Shr: return ref(n.a) + " >> (" + ref(n.b) + " & 31" + (n.type == Type::U32 ? "u" : "") + ")";
        case Op::Eq: return infix("==", n);
        case Op::Ne: return infix("!=", n);
        case Op::Lt: return infix("<", n);
        case Op::Le: return infix("<=", n);
        case Op::Gt: return infix(">", n);
        case Op::Ge: return infix(">=", n);
        case Op::Select: return ref(n.a) + " ? " + ref(n.b) + " : " + ref(n.c);
        case Op::Cast: return cast(n);
        case Op::Fma: return call("fmaf", "fma", {n.a, n.b, n.c});
        case Op::Pow: return call("powf", "pow", {n.a, n.b});
        case Op::Abs: return f ? call("fabsf", "abs", {n.a}) : n.type == Type::U32 ? ref(n.a) : call("abs", "abs", {n.a});
        case Op::Sqrt: return call("sqrtf", "sqrt", {n.a});
        case Op::Rsqrt: return call("rsqrtf", "inversesqrt", {n.a});
        case Op::Exp: return call("expf", "exp", {n.a});
        case Op::Log: return call("logf", "log", {n.a});
        case Op::Sin: return call("sinf", "sin", {n.a});
        case Op::Cos: return call("cosf", "cos", {n.a});
        case Op::Tanh: return call("tanhf", "tanh", {n.a});
        case Op::Floor: return call("floorf", "floor", {n.a});
        case Op::Ceil: return call("ceilf", "ceil", {n.a});
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
        for (const Stmt &s : m_.blocks[b].stmts) statement(s);
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
            // GLSL: `precise` keeps a*b+c two roundings (SPIR-V NoContraction) and fma() fused.
            const std::string qualifier = glsl_ && n.type == Type::F32 ? "precise " : "";
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
            const std::string range = s.space == Space::Var ? "" : inRange(s.space, s.target, s.index);
            line((range.empty() ? "" : "if (" + range + ") ") + element + " = " + ref(s.value) + ";");
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
        }
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
            h += "layout(local_size_x_id = 0, local_size_y_id = 1, local_size_z_id = 2) in;\n";
            for (uint32_t b = 0; b < m_.bindings.size(); ++b) {
                const BindingDecl &d = m_.bindings[b];
                const char *access = d.access == Access::Read ? "readonly " : d.access == Access::Write ? "writeonly " : "";
                h += "layout(set = 0, binding = " + std::to_string(b) + ", std430) " + access + "buffer B" +
                     std::to_string(b) + " { " + typeName(d.type) + " b" + std::to_string(b) + "[]; };\n";
            }
            if (m_.scalarStructBytes() > 0)
                h += "layout(push_constant, std430) uniform Scalars {" + scalarStruct() + " } s;\n";
            for (uint32_t a = 0; a < m_.arrays.size(); ++a)
                if (m_.arrays[a].space == Space::Shared)
                    h += "shared " + typeName(m_.arrays[a].type) + " a" + std::to_string(a) + "[" +
                         std::to_string(m_.arrays[a].length) + "];\n";
        } else if (m_.scalarStructBytes() > 0) {
            h += "struct bp_scalars {" + scalarStruct() + " };\n";
        }
        return h + helperText();
    }

    std::string signature() const {
        if (glsl_) return "void main() {\n";
        std::string s = "extern \"C\" __global__ void " + m_.entryPoint + "(";
        for (uint32_t b = 0; b < m_.bindings.size(); ++b) {
            const BindingDecl &d = m_.bindings[b];
            s += std::string(b ? ", " : "") + (d.access == Access::Read ? "const " : "") + typeName(d.type) +
                 " *b" + std::to_string(b);
        }
        if (m_.scalarStructBytes() > 0) s += std::string(m_.bindings.empty() ? "" : ", ") + "bp_scalars s";
        return s + ") {\n";
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
};

const char *atomicName(AtomicOp op) {
    static const char *names[] = {"add", "min", "max", "and", "or", "xor", "exchange"};
    return names[static_cast<int>(op)];
}

const char *opName(Op op) {
    static const char *names[] = {
        "const", "builtin", "scalar", "length", "load", "index", "neg", "not", "bitnot", "add", "sub", "mul",
        "div", "rem", "min", "max", "and", "or", "xor", "shl", "shr", "eq", "ne", "lt", "le", "gt", "ge",
        "select", "cast", "fma", "pow", "abs", "sqrt", "rsqrt", "exp", "log", "sin", "cos", "tanh", "floor",
        "ceil", "atomic", "subgroup_sum", "subgroup_min", "subgroup_max", "shuffle_xor", "broadcast"};
    return names[static_cast<int>(op)];
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
            << toString(m.arrays[a].type) << "[" << m.arrays[a].length << "]\n";
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
            }
        }
    };
    list(0, 1);
    return out.str();
}

} // namespace backplane::lang::detail
