// The recorder behind lang::Builder: appends IR nodes and statements, enforces the language rules.
#include "lang/ir.hpp"

#include <backplane/error.hpp>

#include <algorithm>
#include <atomic>

namespace backplane::lang::detail {
namespace {

/// One open control construct while recording.
struct Frame {
    uint32_t block = 0;
    /// Every thread of the workgroup reaches this block together.
    bool uniform = true;
    bool loop = false;
    /// Loops: a thread may leave an iteration early while others go on (break / continue /
    /// return under a thread-dependent condition somewhere inside).
    bool divergentExit = false;
    /// Loops: a barrier or subgroup operation was recorded inside.
    bool hasCollective = false;
    /// The condition deciding this frame (kNone for the kernel body and else-less parts).
    uint32_t condition = kNone;
    /// Loops: variables stored inside (any depth). After a thread-dependent exit they differ
    /// between threads once the loop ends.
    std::vector<uint32_t> stored;
};

/// Per-variable uniformity: a variable is uniform while it was declared and only ever assigned
/// uniform values in uniform control flow.
struct VarState {
    uint32_t block = 0;
    bool uniform = true;
    /// A barrier or subgroup operation is under control flow decided by this variable.
    bool decides = false;
    /// Variables whose values were stored into this one: when one of them turns
    /// thread-dependent, so does this one.
    std::vector<uint32_t> from;
};

/// Deeper nesting of k.If / k.For / k.While than this is refused (the generated code and the
/// interpreter both recurse over it).
constexpr size_t kMaxNesting = 256;

class Recorder {
public:
    Recorder(std::string name, KernelOptions options, uint32_t serial) : serial_(serial) {
        module_.name = std::move(name);
        module_.options = options;
        module_.entryPoint = identifier(module_.name);
        module_.blocks.push_back({});
        frames_.push_back({});
    }

    Module &module() { return module_; }
    uint32_t serial() const { return serial_; }

    /// Throws, and remembers it: a body that catches the error still gets no kernel.
    [[noreturn]] void fail(const std::string &what) {
        failure_ = "kernel '" + module_.name + "': " + what;
        throw Error(ErrorCode::InvalidArgument, failure_);
    }

    /// Checks a handle of this kernel, usable in the current block; returns its node.
    uint32_t use(Handle h, const char *what) {
        if (h.kernel != serial_ || h.id >= module_.nodes.size())
            fail(std::string(what) +
                 " is a value of another kernel (or a default-constructed handle); values "
                 "cannot cross lang::kernel() calls");
        const uint32_t defined = module_.nodes[h.id].block;
        if (!inScope(defined))
            fail(std::string(what) +
                 " was computed inside a k.If / k.For / k.While body and is used after it; "
                 "declare a k.var before the block and assign it inside instead");
        return h.id;
    }

    Handle add(Node node, bool statement) {
        node.block = statement ? frames_.back().block : 0;
        module_.nodes.push_back(std::move(node));
        const auto id = static_cast<uint32_t>(module_.nodes.size() - 1);
        if (statement) {
            Stmt s;
            s.kind = StmtKind::Let;
            s.node = id;
            append(s);
        }
        return {id, serial_};
    }

    /// A node computed from operands: uniform when they all are; vars merged.
    Handle compute(Node node) {
        node.uniform = true;
        for (uint32_t o : {node.a, node.b, node.c}) {
            if (o == kNone) continue;
            const Node &operand = module_.nodes[o];
            node.uniform = node.uniform && operand.uniform;
            for (uint32_t v : operand.vars)
                if (std::find(node.vars.begin(), node.vars.end(), v) == node.vars.end())
                    node.vars.push_back(v);
        }
        if (!node.uniform) node.vars.clear();
        return add(std::move(node), true);
    }

    void append(const Stmt &s) { module_.blocks[frames_.back().block].stmts.push_back(s); }

    uint32_t newBlock() {
        Block b;
        b.parent = frames_.back().block;
        module_.blocks.push_back(b);
        return static_cast<uint32_t>(module_.blocks.size() - 1);
    }

    /// Runs `body` recording into `block` as a new frame.
    void within(uint32_t block, bool uniform, bool loop, uint32_t condition,
                const std::function<void()> &body) {
        Frame f;
        f.block = block;
        f.uniform = uniform && frames_.back().uniform && !returnedDivergent_;
        f.loop = loop;
        f.condition = condition;
        push(std::move(f));
        try {
            body();
        } catch (...) {
            frames_.pop_back();
            throw;
        }
        popLoopAware();
    }

    void push(Frame f) {
        if (frames_.size() > kMaxNesting)
            fail("k.If / k.For / k.While nested deeper than " + std::to_string(kMaxNesting) +
                 " levels");
        frames_.push_back(std::move(f));
    }

    /// Pops a frame; a loop some threads may have left early leaves the variables it stored
    /// thread-dependent.
    void popLoopAware() {
        Frame done = std::move(frames_.back());
        frames_.pop_back();
        if (done.loop && done.divergentExit)
            for (uint32_t v : done.stored) divergeVar(v, "a loop left early by some threads");
    }

    /// Marks a variable (and every variable computed from it) thread-dependent; refuses when one
    /// of them decides a barrier or subgroup operation recorded earlier.
    void divergeVar(uint32_t var, const char *why) {
        std::vector<uint32_t> work = {var};
        while (!work.empty()) {
            const uint32_t v = work.back();
            work.pop_back();
            VarState &state = vars_[v];
            if (!state.uniform) continue;
            if (state.decides)
                fail("variable v" + std::to_string(v) + " decides a barrier or subgroup "
                     "operation recorded earlier, and becomes thread-dependent (" + why +
                     "); every thread of the workgroup must reach it");
            state.uniform = false;
            for (uint32_t other = 0; other < vars_.size(); ++other)
                if (vars_[other].uniform &&
                    std::find(vars_[other].from.begin(), vars_[other].from.end(), v) !=
                        vars_[other].from.end())
                    work.push_back(other);
        }
    }

    const std::string &failure() const { return failure_; }

    bool controlUniform() const { return frames_.back().uniform && !returnedDivergent_; }

    /// A barrier or subgroup operation is being recorded here.
    void collective(const char *what) {
        if (!controlUniform())
            fail(std::string(what) +
                 " is under thread-dependent control flow (a condition or loop bound computed "
                 "from a thread id, a loaded value or a variable assigned one, or after a "
                 "thread-dependent break / continue / return); every thread of the workgroup "
                 "must reach it");
        for (const Frame &f : frames_) {
            if (f.loop && f.divergentExit)
                fail(std::string(what) +
                     " is inside a loop that some threads may leave early (a break, continue or "
                     "return under a thread-dependent condition); every thread must reach it in "
                     "every iteration");
            if (f.condition == kNone) continue;
            for (uint32_t v : module_.nodes[f.condition].vars) {
                if (!vars_[v].uniform) fail(varDiverged(v, what));
                vars_[v].decides = true;
            }
        }
        markCollective();
    }

    void markCollective() {
        for (Frame &f : frames_)
            if (f.loop) f.hasCollective = true;
    }

    std::string varDiverged(uint32_t var, const char *what) const {
        return std::string(what) + " is under control flow decided by variable v" +
               std::to_string(var) +
               ", which is assigned a thread-dependent value (or in thread-dependent control "
               "flow); every thread of the workgroup must reach it";
    }

    void jump(Jump j) {
        const bool divergent = !controlUniform();
        if (j != Jump::Return) {
            auto loop = std::find_if(frames_.rbegin(), frames_.rend(),
                                     [](const Frame &f) { return f.loop; });
            if (loop == frames_.rend())
                fail(std::string(j == Jump::Break ? "k.Break()" : "k.Continue()") +
                     " outside a k.For / k.While");
            if (divergent) {
                if (loop->hasCollective)
                    fail("a thread-dependent break / continue leaves a loop that contains a "
                         "barrier or subgroup operation; every thread must reach it in every "
                         "iteration");
                loop->divergentExit = true;
            }
        } else if (divergent) {
            for (Frame &f : frames_) {
                if (!f.loop) continue;
                if (f.hasCollective)
                    fail("a thread-dependent return inside a loop that contains a barrier or "
                         "subgroup operation; every thread must reach it in every iteration");
                f.divergentExit = true;
            }
            returnedDivergent_ = true;
        }
        Stmt s;
        s.kind = StmtKind::Jump;
        s.jump = j;
        append(s);
    }

    void storeVar(uint32_t var, uint32_t value) {
        for (Frame &f : frames_)
            if (f.loop) f.stored.push_back(var);
        const bool uniform = module_.nodes[value].uniform && controlUniform();
        if (!uniform) {
            divergeVar(var, "a thread-dependent value is stored into it");
            return;
        }
        VarState &state = vars_[var];
        for (uint32_t v : module_.nodes[value].vars)
            if (v != var && std::find(state.from.begin(), state.from.end(), v) == state.from.end())
                state.from.push_back(v);
    }

    std::vector<VarState> vars_;
    std::vector<Frame> frames_;

private:
    bool inScope(uint32_t block) const {
        for (uint32_t b = frames_.back().block; b != kNone; b = module_.blocks[b].parent)
            if (b == block) return true;
        return false;
    }

    /// Names a CUDA/HIP entry point cannot have: C++ keywords, main, and reserved spellings.
    static bool reserved(const std::string &id) {
        static const char *const kWords[] = {
            "alignas", "alignof", "and", "and_eq", "asm", "auto", "bitand", "bitor", "bool",
            "break", "case", "catch", "char", "char8_t", "char16_t", "char32_t", "class", "compl",
            "concept", "const", "consteval", "constexpr", "constinit", "const_cast", "continue",
            "co_await", "co_return", "co_yield", "decltype", "default", "delete", "do", "double",
            "dynamic_cast", "else", "enum", "explicit", "export", "extern", "false", "float",
            "for", "friend", "goto", "if", "inline", "int", "long", "main", "mutable",
            "namespace", "new", "noexcept", "not", "not_eq", "nullptr", "operator", "or",
            "or_eq", "private", "protected", "public", "register", "reinterpret_cast",
            "requires", "return", "short", "signed", "sizeof", "static", "static_assert",
            "static_cast", "struct", "switch", "template", "this", "thread_local", "throw",
            "true", "try", "typedef", "typeid", "typename", "union", "unsigned", "using",
            "virtual", "void", "volatile", "wchar_t", "while", "xor", "xor_eq"};
        for (const char *w : kWords)
            if (id == w) return true;
        // Leading underscore + capital, or a double underscore: reserved to the implementation.
        return (id.size() > 1 && id[0] == '_' && (id[1] == '_' || (id[1] >= 'A' && id[1] <= 'Z'))) ||
               id.find("__") != std::string::npos;
    }

    static std::string identifier(const std::string &name) {
        std::string id;
        for (char c : name) {
            const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
                            (c >= '0' && c <= '9') || c == '_';
            id += ok ? c : '_';
        }
        if (id.empty() || (id[0] >= '0' && id[0] <= '9') || reserved(id)) id = "k_" + id;
        return id;
    }

    Module module_;
    uint32_t serial_;
    bool returnedDivergent_ = false;
    std::string failure_;
};

thread_local Recorder *gCurrent = nullptr;
std::atomic<uint32_t> gSerial{1};

Recorder &current() {
    if (gCurrent == nullptr)
        throw Error(ErrorCode::InvalidArgument,
                    "a kernel-language value or statement was used outside lang::kernel(); "
                    "device values exist only while a kernel body is being recorded");
    return *gCurrent;
}

bool isComparison(Op op) {
    const OpInfo *info = opInfo(op);
    return info != nullptr && info->family == OpFamily::Compare;
}

} // namespace

Handle constant(Type type, uint64_t bits) {
    Recorder &r = current();
    Node n;
    n.op = Op::Constant;
    n.type = type;
    n.imm = bits;
    n.uniform = true;
    return r.add(n, false);
}

Type typeOf(Handle value) {
    Recorder &r = current();
    return r.module().nodes[r.use(value, "a value")].type;
}

Handle operation(Op op, Type result, Handle a, Handle b, Handle c, uint32_t imm) {
    Recorder &r = current();
    Node n;
    n.op = op;
    n.type = result;
    n.imm = imm;
    n.a = r.use(a, "an operand");
    if (const OpInfo *info = opInfo(op); info != nullptr && info->operands == 3) {
        n.b = r.use(b, "an operand");
        n.c = r.use(c, "an operand");
        const auto &nodes = r.module().nodes;
        if (op == Op::Select && (nodes[n.a].type != Type::Bool || nodes[n.b].type != result ||
                                 nodes[n.c].type != result))
            r.fail("select(condition, a, b) needs a bool condition and two values of one type");
    }
    return r.compute(n);
}

Handle unary(Op op, Handle a) {
    Recorder &r = current();
    Node n;
    n.op = op;
    n.a = r.use(a, "an operand");
    n.type = r.module().nodes[n.a].type;
    const OpInfo *info = opInfo(op);
    // Float functions, except abs() (which takes every number type).
    const bool floatOnly =
        info != nullptr && info->family == OpFamily::Function && op != Op::Abs;
    if (floatOnly && !isFloat(n.type))
        r.fail("a float function was applied to a " + std::string(toString(n.type)) + " value");
    if ((op == Op::Not) != (n.type == Type::Bool) &&
        (op == Op::Not || op == Op::Neg || op == Op::BitNot || op == Op::Abs))
        r.fail(std::string(op == Op::Not ? "! needs a bool value" : "-, ~ and abs() need numbers"));
    if (op == Op::BitNot && !isInteger(n.type)) r.fail("~ needs an integer value");
    if (op == Op::SubgroupSum || op == Op::SubgroupMin || op == Op::SubgroupMax)
        return subgroup(op, a);
    return r.compute(n);
}

Handle binary(Op op, Handle a, Handle b) {
    Recorder &r = current();
    Node n;
    n.op = op;
    n.a = r.use(a, "an operand");
    n.b = r.use(b, "an operand");
    const Type ta = r.module().nodes[n.a].type, tb = r.module().nodes[n.b].type;
    if (ta != tb)
        r.fail(std::string("an operation mixes ") + toString(ta) + " and " + toString(tb) +
               "; convert one with cast<T>()");
    if ((op == Op::Rem || op == Op::Shl || op == Op::Shr) && !isInteger(ta))
        r.fail("% and shifts need integer operands");
    const bool onBool = op == Op::Lt || op == Op::Le || op == Op::Gt || op == Op::Ge ||
                        op == Op::Min || op == Op::Max || op == Op::Add || op == Op::Sub ||
                        op == Op::Mul || op == Op::Div || op == Op::Pow;
    if (ta == Type::Bool && onBool)
        r.fail("an ordering comparison or arithmetic on bool values; cast<uint32_t>() them first");
    if (op == Op::Pow && !isFloat(ta)) r.fail("pow() needs float operands");
    n.type = isComparison(op) ? Type::Bool : ta;
    return r.compute(n);
}

Handle builtin(Builtin which, uint32_t axis) {
    Recorder &r = current();
    Node n;
    n.op = Op::Builtin;
    n.type = Type::U32;
    n.imm = static_cast<uint32_t>(which) * 4 + axis;
    n.uniform = which == Builtin::GroupId || which == Builtin::GroupSize ||
                which == Builtin::GridSize || which == Builtin::SubgroupSize;
    if (which == Builtin::SubgroupSize || which == Builtin::SubgroupLane)
        r.module().usesSubgroups = true;
    return r.add(n, false);
}

Handle declareScalar(Type type) {
    Recorder &r = current();
    if (type == Type::Bool || isNarrow(type))
        r.fail(std::string("a scalar of type ") + toString(type) +
               "; scalars are 32- or 64-bit numbers: pass a 32-bit one and cast<T>() it");
    r.module().scalars.push_back(type);
    Node n;
    n.op = Op::Scalar;
    n.type = type;
    n.imm = static_cast<uint32_t>(r.module().scalars.size() - 1);
    n.uniform = true;
    return r.add(n, false);
}

Handle declareBinding(Type type, Access access) {
    Recorder &r = current();
    if (type == Type::Bool) r.fail("buffers hold numbers, not bool");
    r.module().bindings.push_back({type, access, false});
    return {static_cast<uint32_t>(r.module().bindings.size() - 1), r.serial()};
}

Handle declareArray(Space space, Type type, uint32_t length) {
    Recorder &r = current();
    if (space != Space::Shared && space != Space::Private) r.fail("arrays are shared or private");
    if (type == Type::Bool) r.fail("arrays hold numbers, not bool");
    if (length == 0) r.fail("an array of length 0");
    if (uint64_t(length) * sizeOf(type) > (64u << 20))
        r.fail("an array of " + std::to_string(length) + " elements (over 64 MiB)");
    r.module().arrays.push_back({space, type, length});
    return {static_cast<uint32_t>(r.module().arrays.size() - 1), r.serial()};
}

Handle declareVar(Type type, Handle init) {
    Recorder &r = current();
    const uint32_t value = r.use(init, "a variable's initial value");
    if (r.module().nodes[value].type != type) r.fail("a variable's initial value has another type");
    r.module().vars.push_back(type);
    const auto id = static_cast<uint32_t>(r.module().vars.size() - 1);
    VarState state;
    state.block = r.frames_.back().block;
    state.uniform = r.module().nodes[value].uniform && r.controlUniform();
    if (state.uniform) state.from = r.module().nodes[value].vars;
    r.vars_.push_back(state);
    Stmt s;
    s.kind = StmtKind::DeclareVar;
    s.target = id;
    s.value = value;
    r.append(s);
    return {id, r.serial()};
}

namespace {

/// Checks that `target` names a binding, array or variable of this kernel in `space`, visible
/// here; returns its element type.
Type targetType(Recorder &r, Space space, Handle target) {
    const Module &m = r.module();
    if (target.kernel != r.serial())
        r.fail("a buffer, array or variable of another kernel (or a default-constructed one) is "
               "used; they cannot cross lang::kernel() calls");
    const uint32_t id = target.id;
    switch (space) {
    case Space::Buffer:
        if (id >= m.bindings.size()) r.fail("an access to an unknown binding");
        return m.bindings[id].type;
    case Space::Shared:
    case Space::Private:
        if (id >= m.arrays.size() || m.arrays[id].space != space)
            r.fail("an access to an unknown array");
        return m.arrays[id].type;
    case Space::Var: {
        if (id >= m.vars.size()) r.fail("an access to an unknown variable");
        const uint32_t declared = r.vars_[id].block;
        bool visible = false;
        for (uint32_t b = r.frames_.back().block; b != kNone; b = m.blocks[b].parent)
            visible = visible || b == declared;
        if (!visible)
            r.fail("variable v" + std::to_string(id) +
                   " is used outside the block that declared it");
        return m.vars[id];
    }
    }
    r.fail("an access to an unknown memory space");
}

uint32_t indexOf(Recorder &r, Handle index) {
    const uint32_t i = r.use(index, "an index");
    if (r.module().nodes[i].type != Type::U32) r.fail("indices are uint32_t values");
    return i;
}

} // namespace

Handle length(Handle binding) {
    Recorder &r = current();
    targetType(r, Space::Buffer, binding);
    r.module().bindings[binding.id].lengthUsed = true;
    Node n;
    n.op = Op::Length;
    n.type = Type::U32;
    n.imm = binding.id;
    n.uniform = true;
    return r.add(n, false);
}

Handle load(Space space, Handle target, Handle index) {
    Recorder &r = current();
    Node n;
    n.op = Op::Load;
    n.space = space;
    n.type = targetType(r, space, target);
    n.imm = target.id;
    if (space == Space::Buffer && r.module().bindings[target.id].access == Access::Write)
        r.fail("binding " + std::to_string(target.id) + " is an output (write-only); declare it "
               "with k.inout<T>() to read it");
    if (space == Space::Var) {
        n.uniform = r.vars_[target.id].uniform;
        if (n.uniform) n.vars = {target.id};
        return r.add(n, true);
    }
    n.a = indexOf(r, index);
    n.uniform = false;
    return r.add(n, true);
}

void store(Space space, Handle target, Handle index, Handle value) {
    Recorder &r = current();
    const Type type = targetType(r, space, target);
    const uint32_t v = r.use(value, "a stored value");
    if (r.module().nodes[v].type != type)
        r.fail(std::string("a store of a ") + toString(r.module().nodes[v].type) + " value into " +
               toString(type) + " memory");
    if (space == Space::Buffer && r.module().bindings[target.id].access == Access::Read)
        r.fail("binding " + std::to_string(target.id) + " is an input (read-only); declare it "
               "with k.inout<T>() or k.output<T>() to write it");
    Stmt s;
    s.kind = StmtKind::Store;
    s.space = space;
    s.target = target.id;
    s.value = v;
    if (space == Space::Var) r.storeVar(target.id, v);
    else s.index = indexOf(r, index);
    r.append(s);
}

Handle atomic(AtomicOp op, Space space, Handle target, Handle index, Handle value) {
    Recorder &r = current();
    if (space != Space::Buffer && space != Space::Shared)
        r.fail("atomics work on buffer and shared-array elements");
    const Type type = targetType(r, space, target);
    if (!(type == Type::I32 || type == Type::U32 || isWide(type) ||
          (type == Type::F32 && op == AtomicOp::Add)))
        r.fail(std::string("an atomic on ") + toString(type) +
               " elements; atomics work on 32- and 64-bit integers, and atomicAdd on float too");
    if (type == Type::F64)
        r.fail("an atomic on f64 elements; atomics work on 32- and 64-bit integers, and "
               "atomicAdd on float too");
    if (space == Space::Buffer && r.module().bindings[target.id].access != Access::ReadWrite)
        r.fail("an atomic on binding " + std::to_string(target.id) +
               ", which is not declared k.inout<T>()");
    Node n;
    n.op = Op::Atomic;
    n.space = space;
    n.imm = target.id;
    n.atomicOp = op;
    n.type = type;
    n.a = indexOf(r, index);
    n.b = r.use(value, "an atomic's value");
    if (r.module().nodes[n.b].type != type) r.fail("an atomic's value has another type");
    n.uniform = false;
    return r.add(n, true);
}

Handle subgroup(Op op, Handle value, Handle arg) {
    Recorder &r = current();
    r.collective("a subgroup operation");
    Node n;
    n.op = op;
    n.a = r.use(value, "a subgroup operand");
    n.type = r.module().nodes[n.a].type;
    if (n.type == Type::Bool) r.fail("subgroup operations take numbers");
    if (isWide(n.type))
        r.fail(std::string("a subgroup operation on ") + toString(n.type) +
               " values; subgroup operations take 8- to 32-bit numbers");
    if (op == Op::ShuffleXor || op == Op::Broadcast) {
        n.b = r.use(arg, "a lane");
        if (r.module().nodes[n.b].type != Type::U32) r.fail("lanes are uint32_t values");
    }
    r.module().usesSubgroups = true;
    n.uniform = false;
    return r.add(n, true);
}

IfSite recordIf(Handle condition, const std::function<void()> &then) {
    Recorder &r = current();
    const uint32_t c = r.use(condition, "an If condition");
    if (r.module().nodes[c].type != Type::Bool) r.fail("k.If needs a bool condition");
    Stmt s;
    s.kind = StmtKind::If;
    s.node = c;
    s.body = r.newBlock();
    r.append(s);
    const uint32_t block = r.frames_.back().block;
    const IfSite site{block, static_cast<uint32_t>(r.module().blocks[block].stmts.size() - 1),
                      r.serial()};
    r.within(s.body, r.module().nodes[c].uniform, false, c, then);
    return site;
}

void recordElse(const std::vector<IfSite> &path, const std::function<void()> &otherwise) {
    Recorder &r = current();
    auto lastIf = [&](const IfSite &site, uint32_t block) {
        const auto &stmts = r.module().blocks[block].stmts;
        return site.kernel == r.serial() && site.block == block && site.index + 1 == stmts.size() &&
               stmts[site.index].kind == StmtKind::If;
    };
    // Walks down the chain: each further If is the only thing its parent's else branch ends with.
    std::function<void(size_t)> descend = [&](size_t level) {
        const uint32_t here = r.frames_.back().block;
        if (!lastIf(path[level], here) ||
            (level + 1 == path.size()) != (r.module().blocks[here].stmts[path[level].index].other == kNone))
            r.fail(".Else() / .ElseIf() must directly follow its k.If(...) with nothing recorded "
                   "between");
        const uint32_t c = r.module().blocks[here].stmts[path[level].index].node;
        const bool uniform = r.module().nodes[c].uniform;
        if (level + 1 < path.size()) {
            const uint32_t elseBlock = r.module().blocks[here].stmts[path[level].index].other;
            r.within(elseBlock, uniform, false, c, [&] { descend(level + 1); });
            return;
        }
        const uint32_t block = r.newBlock(); // may reallocate blocks: index again
        r.module().blocks[here].stmts[path[level].index].other = block;
        r.within(block, uniform, false, c, otherwise);
    };
    if (path.empty()) r.fail(".Else() without a k.If");
    descend(0);
}

void recordFor(Type type, Handle begin, Handle end, Handle step,
               const std::function<void(Handle)> &body) {
    Recorder &r = current();
    Stmt s;
    s.kind = StmtKind::For;
    s.begin = r.use(begin, "a loop start");
    s.end = r.use(end, "a loop end");
    s.step = r.use(step, "a loop step");
    const auto &nodes = r.module().nodes;
    for (uint32_t o : {s.begin, s.end, s.step})
        if (nodes[o].type != type) r.fail("a k.For's start, end and step have another type");
    s.body = r.newBlock();
    // The index: a leaf defined in the body block.
    Node index;
    index.op = Op::LoopIndex;
    index.type = type;
    index.imm = r.module().loops++;
    index.uniform = nodes[s.begin].uniform && nodes[s.end].uniform && nodes[s.step].uniform;
    for (uint32_t o : {s.begin, s.end, s.step})
        for (uint32_t v : nodes[o].vars) index.vars.push_back(v);
    if (!index.uniform) index.vars.clear();
    r.module().nodes.push_back(index);
    s.node = static_cast<uint32_t>(r.module().nodes.size() - 1);
    r.module().nodes.back().block = s.body;
    r.append(s);
    const Handle i{s.node, r.serial()};
    r.within(s.body, index.uniform, true, s.node, [&] { body(i); });
}

void recordWhile(const std::function<Handle()> &condition, const std::function<void()> &body) {
    Recorder &r = current();
    Stmt s;
    s.kind = StmtKind::While;
    s.other = r.newBlock();
    r.append(s);
    const size_t at = r.module().blocks[r.frames_.back().block].stmts.size() - 1;
    const uint32_t parentBlock = r.frames_.back().block;
    uint32_t c = kNone;
    // The condition block is part of the loop: a thread-dependent condition is a divergent exit.
    Frame f;
    f.block = s.other;
    f.uniform = r.controlUniform();
    f.loop = true;
    r.push(std::move(f));
    try {
        c = r.use(condition(), "a While condition");
        if (r.module().nodes[c].type != Type::Bool) r.fail("k.While needs a bool condition");
        const bool uniform = r.module().nodes[c].uniform;
        r.frames_.back().condition = c;
        if (!uniform) {
            r.frames_.back().uniform = false;
            r.frames_.back().divergentExit = true; // threads leave at different passes
        }
        const uint32_t bodyBlock = r.newBlock(); // parent: the condition block
        r.module().blocks[parentBlock].stmts[at].node = c;
        r.module().blocks[parentBlock].stmts[at].body = bodyBlock;
        r.within(bodyBlock, uniform, false, c, body);
        if (r.frames_.back().hasCollective && !uniform)
            r.fail("a barrier or subgroup operation in a k.While whose condition is "
                   "thread-dependent");
    } catch (...) {
        r.frames_.pop_back();
        throw;
    }
    r.popLoopAware();
}

void recordJump(Jump j) { current().jump(j); }

void recordBarrier() {
    Recorder &r = current();
    r.collective("barrier()");
    r.module().usesBarrier = true;
    Stmt s;
    s.kind = StmtKind::Barrier;
    r.append(s);
}

namespace {

/// index + i for each part, saturating at UINT32_MAX instead of wrapping: a part past the last
/// u32 index is out of range (checked kernels skip it), never element 0.
std::vector<Handle> partIndices(Handle index, uint32_t width) {
    std::vector<Handle> indices = {index};
    for (uint32_t i = 1; i < width; ++i) {
        const Handle fits = binary(Op::Le, index, constant(Type::U32, UINT32_MAX - i));
        const Handle sum = binary(Op::Add, index, constant(Type::U32, i));
        indices.push_back(operation(Op::Select, Type::U32, fits, sum, constant(Type::U32, UINT32_MAX)));
    }
    return indices;
}

/// The rules every vector access follows (width, memory, size, a constant index's alignment).
void checkVector(Recorder &r, Space space, Handle target, Handle index, uint32_t width) {
    if (width != 2 && width != 4 && width != 8) r.fail("vectors have 2, 4 or 8 elements");
    if (space == Space::Var) r.fail("vectors are in buffers and arrays, not variables");
    const Type type = targetType(r, space, target);
    if (width * sizeOf(type) > 16)
        r.fail("a vector of " + std::to_string(width) + " " + toString(type) + " is over 16 bytes");
    const uint32_t first = indexOf(r, index);
    if (const Node &n = r.module().nodes[first]; n.op == Op::Constant && n.imm % width != 0)
        r.fail("a vector of " + std::to_string(width) + " at index " + std::to_string(n.imm) +
               ", not a multiple of " + std::to_string(width));
}

} // namespace

std::vector<Handle> loadVector(Space space, Handle target, Handle index, uint32_t width) {
    Recorder &r = current();
    checkVector(r, space, target, index, width);
    // The parts' indices first, then the parts: consecutive statements, part 0 first.
    const std::vector<Handle> indices = partIndices(index, width);
    std::vector<Handle> parts;
    for (uint32_t i = 0; i < width; ++i) {
        const Handle h = load(space, target, indices[i]);
        Node &n = r.module().nodes[h.id];
        n.vectorWidth = static_cast<uint8_t>(width);
        n.vectorPart = static_cast<uint8_t>(i);
        parts.push_back(h);
    }
    r.module().vectorWidths |= 1u << width;
    return parts;
}

void storeVector(Space space, Handle target, Handle index, const std::vector<Handle> &parts) {
    Recorder &r = current();
    const auto width = static_cast<uint32_t>(parts.size());
    checkVector(r, space, target, index, width);
    const std::vector<Handle> indices = partIndices(index, width);
    for (uint32_t i = 0; i < width; ++i) {
        store(space, target, indices[i], parts[i]);
        Stmt &s = r.module().blocks[r.frames_.back().block].stmts.back();
        s.vectorWidth = static_cast<uint8_t>(width);
        s.vectorPart = static_cast<uint8_t>(i);
    }
    r.module().vectorWidths |= 1u << width;
}

void copyAsync(Space space, Handle array, Handle at, Handle binding, Handle index, Handle valid,
               uint32_t width) {
    Recorder &r = current();
    if (space != Space::Shared)
        r.fail("copyAsync into a private array; asynchronous copies fill shared arrays "
               "(k.shared<T>(n))");
    checkVector(r, Space::Shared, array, at, width);
    checkVector(r, Space::Buffer, binding, index, width);
    const Type type = targetType(r, Space::Shared, array);
    if (targetType(r, Space::Buffer, binding) != type)
        r.fail(std::string("copyAsync into a ") + toString(type) + " array from a " +
               toString(targetType(r, Space::Buffer, binding)) + " binding");
    if (r.module().bindings[binding.id].access == Access::Write)
        r.fail("binding " + std::to_string(binding.id) + " is an output (write-only); copyAsync "
               "reads it: declare it with k.input<T>() or k.inout<T>()");
    const uint32_t condition = r.use(valid, "a copy's condition");
    if (r.module().nodes[condition].type != Type::Bool) r.fail("copyAsync needs a bool condition");
    // The array holds its elements in their storage type (16-bit floats as 16 bits): the copy
    // moves bytes.
    auto &backed = r.module().matrixArrays;
    if (backed.size() < r.module().arrays.size()) backed.resize(r.module().arrays.size());
    backed[array.id] = true;
    r.module().usesAsyncCopies = true;
    Stmt s;
    s.kind = StmtKind::CopyAsync;
    s.space = Space::Shared;
    s.target = array.id;
    s.index = indexOf(r, at);
    s.node = indexOf(r, index);
    s.operands[0] = binding.id;
    s.value = condition;
    s.vectorWidth = static_cast<uint8_t>(width);
    s.body = r.newBlock();
    r.append(s);
    // The same copy in ordinary loads and stores, for targets that run it synchronously.
    r.within(s.body, true, false, kNone, [&] {
        const IfSite site = recordIf(valid, [&] {
            storeVector(Space::Shared, array, at, loadVector(Space::Buffer, binding, index, width));
        });
        recordElse({site}, [&] {
            storeVector(Space::Shared, array, at,
                        std::vector<Handle>(width, constant(type, 0)));
        });
    });
}

void copyFence(bool wait, uint32_t pending) {
    Recorder &r = current();
    Stmt s;
    s.kind = wait ? StmtKind::CopyWait : StmtKind::CopyCommit;
    s.target = pending;
    r.append(s);
}

namespace {

const char *useName(MatrixUse use) {
    return use == MatrixUse::A ? "A" : use == MatrixUse::B ? "B" : "accumulator";
}

uint32_t matrixOf(Recorder &r, Handle matrix) {
    if (matrix.kernel != r.serial() || matrix.id >= r.module().matrices.size())
        r.fail("a matrix of another kernel (or a default-constructed one) is used; matrices "
               "cannot cross lang::kernel() calls");
    return matrix.id;
}

} // namespace

Handle declareMatrix(MatrixUse use, Type type, uint32_t m, uint32_t n, uint32_t k) {
    Recorder &r = current();
    const std::string shape = std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k);
    const bool half = type == Type::F16 || type == Type::BF16;
    if (use == MatrixUse::Accumulator) {
        if (type != Type::F32)
            r.fail(std::string("a matrix accumulator of ") + toString(type) +
                   "; accumulators are f32");
        if (!((m == 16 && n == 16 && k == 16) || (m == 16 && n == 16 && k == 8)))
            r.fail("a matrix tile of " + shape + "; the matrix units take 16x16x16 (f16 or bf16 "
                   "inputs) and 16x16x8 (f32 inputs, rounded to tf32)");
    } else if (!((half && m == 16 && n == 16 && k == 16) ||
                 (type == Type::F32 && m == 16 && n == 16 && k == 8))) {
        r.fail(std::string("a matrix ") + useName(use) + " of " + toString(type) + " in a " +
               shape + " tile; the matrix units take f16 or bf16 inputs in 16x16x16 and f32 "
               "inputs (rounded to tf32) in 16x16x8");
    }
    r.module().matrices.push_back({use, type, m, n, k});
    return {static_cast<uint32_t>(r.module().matrices.size() - 1), r.serial()};
}

void matrixFill(Handle matrix, Handle value) {
    Recorder &r = current();
    const uint32_t id = matrixOf(r, matrix);
    const uint32_t v = r.use(value, "a matrix fill value");
    if (r.module().nodes[v].type != r.module().matrices[id].type)
        r.fail("a matrix fill value of another type than the matrix");
    r.collective("a matrix fill");
    Stmt s;
    s.kind = StmtKind::MatrixFill;
    s.matrix = id;
    s.value = v;
    r.append(s);
}

void matrixMemory(bool store, Handle matrix, Space space, Handle target, Handle offset,
                  Handle stride, Layout layout) {
    Recorder &r = current();
    const uint32_t id = matrixOf(r, matrix);
    const MatrixDecl decl = r.module().matrices[id];
    const char *what = store ? "a matrix store" : "a matrix load";
    if (space != Space::Buffer && space != Space::Shared)
        r.fail(std::string(what) + " from a private array; matrices load from and store to "
               "buffers and shared arrays");
    if (store && decl.use != MatrixUse::Accumulator)
        r.fail(std::string("a store of a matrix ") + useName(decl.use) + "; only accumulators "
               "are stored");
    const Type type = targetType(r, space, target);
    if (type != decl.type)
        r.fail(std::string(what) + " of a " + toString(decl.type) + " matrix " +
               (store ? "into " : "from ") + toString(type) + " memory");
    if (space == Space::Buffer) {
        const Access access = r.module().bindings[target.id].access;
        if (store && access == Access::Read)
            r.fail("binding " + std::to_string(target.id) + " is an input (read-only); a matrix "
                   "store needs k.inout<T>() or k.output<T>()");
        if (!store && access == Access::Write)
            r.fail("binding " + std::to_string(target.id) + " is an output (write-only); a "
                   "matrix load needs k.input<T>() or k.inout<T>()");
    }
    const uint32_t at = indexOf(r, offset);
    const uint32_t step = indexOf(r, stride);
    for (uint32_t node : {at, step}) {
        const Node &n = r.module().nodes[node];
        if (n.op == Op::Constant && n.imm % 8 != 0)
            r.fail(std::string(what) + " with " + (node == at ? "offset " : "stride ") +
                   std::to_string(n.imm) + "; matrix offsets and strides are multiples of 8 "
                   "elements");
    }
    const uint32_t inner = layout == Layout::RowMajor ? decl.cols() : decl.rows();
    if (const Node &n = r.module().nodes[step]; n.op == Op::Constant && n.imm < inner)
        r.fail(std::string(what) + " with stride " + std::to_string(n.imm) + ", less than the " +
               std::to_string(inner) + " elements of a " +
               (layout == Layout::RowMajor ? "row" : "column"));
    r.collective(what);
    if (space == Space::Shared) {
        auto &backed = r.module().matrixArrays;
        if (backed.size() < r.module().arrays.size()) backed.resize(r.module().arrays.size());
        backed[target.id] = true;
    }
    Stmt s;
    s.kind = store ? StmtKind::MatrixStore : StmtKind::MatrixLoad;
    s.matrix = id;
    s.space = space;
    s.target = target.id;
    s.index = at;
    s.value = step;
    s.layout = layout;
    r.append(s);
}

void matrixMma(Handle d, Handle a, Handle b, Handle c) {
    Recorder &r = current();
    const uint32_t ids[4] = {matrixOf(r, d), matrixOf(r, a), matrixOf(r, b), matrixOf(r, c)};
    const auto &decls = r.module().matrices;
    const MatrixDecl &md = decls[ids[0]], &ma = decls[ids[1]], &mb = decls[ids[2]], &mc = decls[ids[3]];
    if (md.use != MatrixUse::Accumulator || ma.use != MatrixUse::A || mb.use != MatrixUse::B ||
        mc.use != MatrixUse::Accumulator)
        r.fail("mma(d, a, b, c) takes an accumulator, an A, a B and an accumulator");
    const auto same = [](const MatrixDecl &x, const MatrixDecl &y) {
        return x.m == y.m && x.n == y.n && x.k == y.k;
    };
    if (!same(md, ma) || !same(md, mb) || !same(md, mc) || ma.type != mb.type)
        r.fail("mma(d, a, b, c) on matrices of different tiles or input types");
    r.collective("mma()");
    Stmt s;
    s.kind = StmtKind::MatrixMma;
    s.matrix = ids[0];
    s.operands[0] = ids[1];
    s.operands[1] = ids[2];
    s.operands[2] = ids[3];
    r.append(s);
}

/// Records `body` into a fresh module (used by lang::kernel()).
std::shared_ptr<Module> record(std::string name, const std::function<void(Builder &)> &body,
                               KernelOptions options) {
    Recorder recorder(std::move(name), options, gSerial.fetch_add(1));
    Recorder *outer = gCurrent;
    gCurrent = &recorder;
    try {
        Builder builder;
        body(builder);
    } catch (...) {
        gCurrent = outer;
        throw;
    }
    gCurrent = outer;
    // The body caught a refusal and went on: what it recorded is incomplete.
    if (!recorder.failure().empty())
        throw Error(ErrorCode::InvalidArgument,
                    recorder.failure() + " (the kernel body caught this error and continued; "
                                         "a kernel with a refused operation is not built)");
    Module &m = recorder.module();
    m.matrixArrays.resize(m.arrays.size());
    return std::make_shared<Module>(std::move(m));
}

} // namespace backplane::lang::detail

namespace backplane::lang {

const char *toString(Type type) noexcept {
    switch (type) {
    case Type::Bool: return "bool";
    case Type::I32: return "i32";
    case Type::U32: return "u32";
    case Type::F32: return "f32";
    case Type::I8: return "i8";
    case Type::U8: return "u8";
    case Type::I16: return "i16";
    case Type::U16: return "u16";
    case Type::I64: return "i64";
    case Type::U64: return "u64";
    case Type::F16: return "f16";
    case Type::BF16: return "bf16";
    case Type::F64: return "f64";
    }
    return "?";
}

} // namespace backplane::lang
