// The host path of the kernel language: runs a recorded Module for one workgroup, in lock-step.
#include "lang/ir.hpp"

#include "comm/host_reduce.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <new>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

// The lane loops are compiled twice, for baseline x86-64 and for x86-64-v3 (AVX2, FMA), and the
// dynamic loader picks one for the CPU (glibc ifunc): 8-wide vectors and a hardware fma() are
// much of the interpreter's speed, and a distribution's baseline build has neither. Not under
// ThreadSanitizer: it instruments the ifunc resolver, which the loader runs before TSan's runtime
// is initialised, and every program linking the core would crash at load.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && defined(__ELF__) &&         \
    defined(__GLIBC__) && !defined(__SANITIZE_THREAD__)
#define BACKPLANE_LANE_LOOPS __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define BACKPLANE_LANE_LOOPS
#endif
// GCC vectorises at -O2 only loops of a known trip count that need no alias check ("very cheap"
// cost model); the lane loops have neither, so this file asks for the -O3 model. Short copy loops
// stay loops instead of becoming memcpy calls.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("tree-vectorize", "vect-cost-model=dynamic",                                  \
                     "no-tree-loop-distribute-patterns")
#endif

namespace backplane::lang::detail {
namespace {

// Every thread ("lane") of the workgroup runs each statement before any lane runs the next, so a
// barrier is a no-op and a statement is one loop over the lanes that the compiler can vectorise.
// Values live in registers of one uint32 per lane; control flow is a mask per construct. A lane
// that jumps (break, continue, return) is marked in `dead_` and leaves every mask up to the
// construct that absorbs the jump (its loop; nothing for return).
//
// Registers are planned from the Module (plan()), linear in the IR's size plus a sort. A thread
// keeps its last plan and reuses it while the IR it runs is the same, word for word (a Module may
// be freed and another recorded at the same address: never recognised by address). Comparing is
// a few times cheaper than planning, which matters for small workgroups.
// A value gets a register from its statement to its last use (or to the end of the last loop
// that reads it and began after it was computed), so the working set stays small. Two kinds
// of statement never run: integer identities (x + 0, x * 1, casts between i32 and u32) share
// their operand's register, and a load of a variable, or of a private array at a constant index,
// reads that memory in place when nothing stores to it while the value is live.

enum LaneState : uint8_t { kAlive = 0, kBroke = 1, kContinued = 2, kReturned = 3 };

/// Limits that keep a malformed or enormous kernel from exhausting the stack or memory. The
/// function has no way to report an error: such a workgroup is left undone.
constexpr uint64_t kMaxLanes = kInterpreterMaxLanes;
constexpr uint32_t kMaxLevel = 4096;                     // two mask levels per nesting level
constexpr uint64_t kMaxScratchWords = kInterpreterMaxScratchWords; // 2 GiB

float asFloat(uint32_t bits) { return std::bit_cast<float>(bits); }
uint32_t bitsOf(float value) { return std::bit_cast<uint32_t>(value); }
int32_t asInt(uint32_t bits) { return static_cast<int32_t>(bits); }

bool isLeaf(Op op) {
    return op == Op::Constant || op == Op::Builtin || op == Op::Scalar || op == Op::Length;
}

/// Operands (a, b, c in that order) an operation reads; -1 for an unknown operation.
int arity(const Node &n) { return operandCount(n); }

/// Same value in every active lane wherever it is used: computed from constants, scalars, lengths,
/// group ids and sizes, and the indices of loops bounded by such values. Node::uniform is not
/// enough here: a variable it was computed from may become thread-dependent later in a loop.
bool uniformBuiltin(uint32_t imm) {
    switch (static_cast<Builtin>(imm / 4)) {
    case Builtin::GroupId:
    case Builtin::GroupSize:
    case Builtin::GridSize:
    case Builtin::SubgroupSize:
    case Builtin::SubgroupLane:
        return true; // 1 and 0 on the host
    default:
        return false;
    }
}

uint32_t combine(AtomicOp op, bool isSigned, uint32_t old, uint32_t value, bool isFloat = false) {
    switch (op) {
    case AtomicOp::Add:
        return isFloat ? bitsOf(asFloat(old) + asFloat(value)) : old + value;
    case AtomicOp::Min:
        return isSigned ? (asInt(value) < asInt(old) ? value : old) : std::min(old, value);
    case AtomicOp::Max:
        return isSigned ? (asInt(value) > asInt(old) ? value : old) : std::max(old, value);
    case AtomicOp::And:
        return old & value;
    case AtomicOp::Or:
        return old | value;
    case AtomicOp::Xor:
        return old ^ value;
    case AtomicOp::Exchange:
        return value;
    }
    return old;
}

/// An atomic on buffer memory that other workgroups may update at the same time.
uint32_t atomicOnBuffer(unsigned char *at, bool aligned, AtomicOp op, bool isSigned,
                        uint32_t value, bool isFloat = false) {
    if (!aligned) {
        // atomic_ref needs 4-byte alignment; a misaligned binding (the host plugin aligns its
        // bindings, a foreign caller might not) is updated without atomicity.
        uint32_t old;
        std::memcpy(&old, at, sizeof old);
        const uint32_t next = combine(op, isSigned, old, value, isFloat);
        std::memcpy(at, &next, sizeof next);
        return old;
    }
    std::atomic_ref<uint32_t> ref(*reinterpret_cast<uint32_t *>(at));
    if (isFloat) { // float add: compare and swap
        uint32_t old = ref.load(std::memory_order_relaxed);
        while (!ref.compare_exchange_weak(old, combine(op, isSigned, old, value, true))) {
        }
        return old;
    }
    switch (op) {
    case AtomicOp::Add:
        return ref.fetch_add(value);
    case AtomicOp::And:
        return ref.fetch_and(value);
    case AtomicOp::Or:
        return ref.fetch_or(value);
    case AtomicOp::Xor:
        return ref.fetch_xor(value);
    case AtomicOp::Exchange:
        return ref.exchange(value);
    case AtomicOp::Min:
    case AtomicOp::Max:
        break;
    }
    uint32_t old = ref.load(std::memory_order_relaxed);
    for (;;) {
        const uint32_t next = combine(op, isSigned, old, value);
        if (next == old || ref.compare_exchange_weak(old, next)) return old;
    }
}

uint32_t floatToI32(uint32_t bits) {
    const float f = asFloat(bits);
    if (!(f == f)) return 0;
    if (f <= -2147483648.0f) return 0x80000000u;
    if (f >= 2147483648.0f) return 0x7fffffffu;
    return static_cast<uint32_t>(static_cast<int32_t>(f));
}

uint32_t floatToU32(uint32_t bits) {
    const float f = asFloat(bits);
    if (!(f > 0.0f)) return 0; // NaN, negatives and (-1, 0) all give 0
    if (f >= 4294967296.0f) return 0xffffffffu;
    return static_cast<uint32_t>(f);
}

/// Unsigned division by a divisor the lanes share, as a multiply and shifts (Granlund and
/// Montgomery, "Division by invariant integers using multiplication"): vectorises where a
/// division instruction per lane does not. `d` is not 0.
struct Divisor {
    uint32_t multiplier = 0;
    int shift = 0;
    bool power = false;

    explicit Divisor(uint32_t d) {
        if ((d & (d - 1)) == 0) {
            power = true;
            shift = std::countr_zero(d);
            return;
        }
        const int log = 32 - std::countl_zero(d - 1); // ceil(log2(d)), 2..32
        multiplier =
            static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << log) - d)) / d + 1);
        shift = log - 1;
    }
};

/// Copies `count` 32-bit words between memory that may be unaligned (buffers). A loop, not
/// memcpy: rows are short, and the library call's set-up costs more than the vectorised loop.
inline void copyRow(void *to, const void *from, uint32_t count) {
    auto *out = static_cast<unsigned char *>(to);
    const auto *in = static_cast<const unsigned char *>(from);
    for (uint32_t i = 0; i < count; ++i) {
        uint32_t word;
        std::memcpy(&word, in + size_t{i} * 4, sizeof word);
        std::memcpy(out + size_t{i} * 4, &word, sizeof word);
    }
}

/// One active set of lanes: `on[l]` per lane, and the active lanes in order in `lanes` (valid
/// when count < the lane count; a full mask loops over every lane).
struct Mask {
    uint8_t *on = nullptr;
    uint32_t *lanes = nullptr;
    uint32_t count = 0;
};

/// A binding as the kernel sees it: its memory and its element count (0 when absent).
struct BufferView {
    unsigned char *data = nullptr;
    uint64_t length = 0;
    bool aligned = false;
    Type type = Type::U32; ///< the binding's element type (8- and 16-bit ones take the slow path)
};

/// A narrow buffer element as the 32-bit value registers hold: integers sign- or zero-extended,
/// f16 and bf16 as the float they are.
uint32_t widen(Type t, const unsigned char *at) {
    uint16_t h = 0;
    switch (t) {
    case Type::I8: return static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(*at)));
    case Type::U8: return *at;
    case Type::I16:
        std::memcpy(&h, at, 2);
        return static_cast<uint32_t>(static_cast<int32_t>(static_cast<int16_t>(h)));
    case Type::U16:
        std::memcpy(&h, at, 2);
        return h;
    case Type::F16:
        std::memcpy(&h, at, 2);
        return std::bit_cast<uint32_t>(backplane::detail::halfToFloat(h));
    case Type::BF16:
        std::memcpy(&h, at, 2);
        return std::bit_cast<uint32_t>(backplane::detail::bf16ToFloat(h));
    default: {
        uint32_t w;
        std::memcpy(&w, at, 4);
        return w;
    }
    }
}

/// The register value `v` stored as a narrow element at `at`.
void narrow(Type t, uint32_t v, unsigned char *at) {
    uint16_t h = 0;
    switch (t) {
    case Type::I8:
    case Type::U8: *at = static_cast<unsigned char>(v); return;
    case Type::I16:
    case Type::U16: h = static_cast<uint16_t>(v); break;
    case Type::F16: h = backplane::detail::floatToHalf(std::bit_cast<float>(v)); break;
    case Type::BF16: h = backplane::detail::floatToBf16(std::bit_cast<float>(v)); break;
    default: std::memcpy(at, &v, 4); return;
    }
    std::memcpy(at, &h, 2);
}

/// A 32-bit result brought back to `t`: 8- and 16-bit integers wrapped and extended, f16 and
/// bf16 rounded to nearest even (kept as float).
uint32_t normalize(Type t, uint32_t v) {
    switch (t) {
    case Type::I8: return static_cast<uint32_t>(static_cast<int32_t>(static_cast<int8_t>(v)));
    case Type::U8: return v & 0xffu;
    case Type::I16: return static_cast<uint32_t>(static_cast<int32_t>(static_cast<int16_t>(v)));
    case Type::U16: return v & 0xffffu;
    case Type::F16:
        return std::bit_cast<uint32_t>(
            backplane::detail::halfToFloat(backplane::detail::floatToHalf(std::bit_cast<float>(v))));
    case Type::BF16:
        return std::bit_cast<uint32_t>(
            backplane::detail::bf16ToFloat(backplane::detail::floatToBf16(std::bit_cast<float>(v))));
    default: return v;
    }
}

/// Types whose registers hold a float (f16 and bf16 rounded to their precision).
bool floatRegister(Type t) { return t == Type::F32 || t == Type::F16 || t == Type::BF16; }

/// The interpreter of one thread: its scratch (registers, variables, arrays, masks) and the plan
/// of the Module it runs, reused from call to call so that a call allocates only while its
/// scratch grows.
class Interpreter {
public:
    void run(const Module &module, const bp_host_kernel_context &context);
    /// Bytes of per-lane and shared scratch this thread keeps between calls.
    size_t scratchBytes() const {
        return 4 * (regs_.capacity() + vars_.capacity() + private_.capacity() + shared_.capacity() +
                    matrices_.capacity());
    }

private:
    // -- planning
    // ----------------------------------------------------------------------------------
    void sign(const Module &module);
    bool plan();
    bool walk(uint32_t block, uint32_t freeLevel);
    bool use(uint32_t node, uint32_t pos);
    bool define(uint32_t node, uint32_t pos);
    bool checkLet(uint32_t node, uint32_t pos);
    uint32_t identityOperand(const Node &n) const;
    uint32_t resolve(uint32_t node) const {
        return forward_[node] == kNone ? node : forward_[node];
    }
    bool storedBetween(uint32_t key, uint32_t after, uint32_t upTo) const;
    bool checkTarget(Space space, uint32_t target, bool atomic) const;
    void planUniform();
    void planRow(uint32_t node);
    void allocate();
    bool prepare(const bp_host_kernel_context &context);
    void fillLeaves(const bp_host_kernel_context &context);

    // -- running
    // -----------------------------------------------------------------------------------
    uint32_t *reg(uint32_t node) const { return regPtr_[node]; }
    uint32_t *var(uint32_t id) { return vars_.data() + size_t{id} * n_; }
    uint32_t first(const Mask &m) const { return m.count == n_ ? 0 : m.lanes[0]; }
    /// Whether an access at `index` under `m` moves whole rows: every lane is active and the
    /// index is row-contiguous (step 1) or row-constant (step 0).
    bool byRows(const Mask &m, uint32_t index) const {
        return m.count == n_ && rowAffine_[index] && xStep_[index] <= 1;
    }
    /// Calls f(first lane, first lane's index) for every row, in lane order.
    template <class F> void eachRow(const uint32_t *index, F f) const {
        const uint32_t width = block_[0];
        for (uint32_t start = 0; start < n_; start += width)
            f(start, index[start]);
    }

    /// Calls f(lane) for every active lane in lane order: a plain loop over all lanes when every
    /// lane is active (the loop the compiler vectorises), the lane list otherwise.
    template <class F> void each(const Mask &m, F f) const {
        const uint32_t n = n_, count = m.count;
        if (count == n) {
            for (uint32_t l = 0; l < n; ++l)
                f(l);
        } else {
            const uint32_t *lanes = m.lanes;
            for (uint32_t i = 0; i < count; ++i)
                f(lanes[i]);
        }
    }
    template <class F> void map1(const Mask &m, uint32_t *out, const uint32_t *a, F f) const {
        each(m, [=](uint32_t l) { out[l] = f(a[l]); });
    }
    template <class F>
    void map2(const Mask &m, uint32_t *out, const uint32_t *a, const uint32_t *b, F f) const {
        each(m, [=](uint32_t l) { out[l] = f(a[l], b[l]); });
    }

    BACKPLANE_LANE_LOOPS void recount(Mask &m) const;
    void copyMask(const Mask &from, Mask &to) const;
    BACKPLANE_LANE_LOOPS void refresh(Mask &m) const;
    void settle(Mask &loop);

    void runBlock(uint32_t block, Mask &m, uint32_t freeLevel);
    void runIf(const Stmt &s, Mask &m, uint32_t freeLevel);
    void runFor(const Stmt &s, Mask &m, uint32_t freeLevel);
    void runWhile(const Stmt &s, Mask &m, uint32_t freeLevel);
    void jump(Jump kind, Mask &m);
    void let(uint32_t node, const Mask &m);
    BACKPLANE_LANE_LOOPS void arithmetic(const Node &node, uint32_t *out, const Mask &m);
    BACKPLANE_LANE_LOOPS void cast(const Node &node, uint32_t *out, const Mask &m);
    BACKPLANE_LANE_LOOPS void divideByUniform(bool remainder, uint32_t *out, const uint32_t *a,
                                              uint32_t d, const Mask &m);
    BACKPLANE_LANE_LOOPS void load(const Node &node, uint32_t *out, const Mask &m);
    BACKPLANE_LANE_LOOPS void store(const Stmt &s, const Mask &m);
    void atomic(const Node &node, uint32_t *out, const Mask &m);
    void matrix(const Stmt &s, const Mask &m);
    float *fragment(uint32_t matrix, uint32_t lane) {
        const MatrixDecl &d = m_->matrices[matrix];
        return matrices_.data() + size_t{matrixOffset_[matrix]} * n_ +
               size_t{lane} * d.rows() * d.cols();
    }

    const Module *m_ = nullptr;
    /// What plan() reads of the Module, as words: this call's, and the one of the plan below
    /// (empty: no plan).
    std::vector<uint32_t> signature_, plannedSignature_;
    uint32_t n_ = 0; ///< lanes
    uint32_t block_[3] = {1, 1, 1};

    // plan, per node
    enum Kind : uint8_t { kRegister, kForwarded, kInVar, kInPrivate };
    std::vector<uint8_t> kind_;
    std::vector<uint32_t> forward_;  ///< kForwarded: the node whose register it shares
    std::vector<uint32_t> slot_;     ///< kRegister: register slot; kInVar / kInPrivate: row
    std::vector<uint32_t *> regPtr_; ///< where each node's lanes are, for this call
    std::vector<uint32_t> defPos_;
    std::vector<uint32_t> lastUse_;
    std::vector<uint32_t> outerLoop_; ///< the last loop that began after the def and reads it
    std::vector<uint8_t> uniform_;
    std::vector<uint8_t> rowAffine_; ///< along a row, the index is its first value + xStep_ * x
    std::vector<uint32_t> xStep_;
    std::vector<const Stmt *> forOf_; ///< LoopIndex node: its For statement
    // plan, per block
    std::vector<uint8_t> visited_;
    std::vector<uint8_t> hasJump_;   ///< a jump anywhere inside (nested blocks included)
    std::vector<uint8_t> hasReturn_; ///< a return anywhere inside
    // plan, positions and loops
    std::vector<uint32_t> posDef_; ///< node defined at each position, or kNone
    std::vector<uint32_t> loopStart_, loopEnd_;
    std::vector<uint32_t> openLoops_;
    /// (memory, position) of every store to a variable (memory = var) or private array (memory =
    /// vars + array), in position order per memory.
    std::vector<std::pair<uint32_t, uint32_t>> stores_;
    /// Leaves by (kind and type, value bits), then node: equal keys share one slot. The type is
    /// part of the key: an f16 2.0 (bits 0x4000) holds another register value than a u32 16384.
    std::vector<std::tuple<uint32_t, uint64_t, uint32_t>> leaves_;
    std::vector<uint32_t> endStart_, endNodes_, freeSlots_;
    std::vector<uint32_t> privOffset_, sharedOffset_;
    std::vector<uint32_t> matrixOffset_; ///< per matrix, its words per lane before it
    uint64_t matrixWords_ = 0;           ///< words of every matrix, per lane
    uint32_t positions_ = 0;
    uint32_t maxLevel_ = 0;
    uint32_t slots_ = 0;
    uint32_t leafSlots_ = 0; ///< slots [0, leafSlots_) hold the leaves
    uint64_t privWords_ = 0, sharedWords_ = 0;

    // scratch
    std::vector<uint32_t> regs_;
    std::vector<uint32_t> vars_;
    std::vector<uint32_t> private_;
    std::vector<uint32_t> shared_;
    std::vector<float> matrices_; ///< [matrix][lane][row * cols + col]
    std::vector<uint8_t> dead_;
    std::vector<uint8_t> maskOn_;
    std::vector<uint32_t> maskLanes_;
    std::vector<Mask> masks_;
    std::vector<BufferView> buffers_;
    /// Per leaf slot, the value all its lanes hold (bit 32 set), or 0 when unknown or per lane,
    /// for lane count filledLanes_: a workgroup of the same kernel refills only what changed.
    std::vector<uint64_t> filled_;
    uint32_t filledLanes_ = 0;
    /// Each lane's local id along x, then y, then z, for the block shape localIdsBlock_.
    std::vector<uint32_t> localIds_;
    uint32_t localIdsBlock_[3] = {0, 0, 0};
};

// -- planning ------------------------------------------------------------------------------------

bool Interpreter::checkTarget(Space space, uint32_t target, bool atomic) const {
    const Module &m = *m_;
    switch (space) {
    case Space::Buffer:
        return target < m.bindings.size();
    case Space::Shared:
    case Space::Private:
        return target < m.arrays.size() && m.arrays[target].space == space &&
               !(atomic && space == Space::Private);
    case Space::Var:
        return !atomic && target < m.vars.size();
    }
    return false;
}

bool Interpreter::use(uint32_t node, uint32_t pos) {
    if (node >= m_->nodes.size()) return false;
    node = resolve(node);
    if (isLeaf(m_->nodes[node].op)) return true;
    const uint32_t def = defPos_[node];
    if (def == kNone) return false; // used before (or without) its statement
    lastUse_[node] = std::max(lastUse_[node], pos);
    // A value from before a loop is read in every iteration: it lives to the loop's end.
    for (uint32_t loop : openLoops_) {
        if (loopStart_[loop] <= def) continue;
        // Loops found this way for different uses are disjoint: the last one ends last.
        if (outerLoop_[node] == kNone || loopStart_[loop] > loopStart_[outerLoop_[node]])
            outerLoop_[node] = loop;
        break;
    }
    return true;
}

bool Interpreter::define(uint32_t node, uint32_t pos) {
    if (node >= m_->nodes.size() || defPos_[node] != kNone) return false;
    defPos_[node] = pos;
    lastUse_[node] = pos;
    posDef_[pos] = node;
    return true;
}

bool Interpreter::checkLet(uint32_t node, uint32_t pos) {
    if (node >= m_->nodes.size()) return false;
    const Node &n = m_->nodes[node];
    if (isLeaf(n.op)) return true; // evaluated once per workgroup: the Let is redundant
    if (n.op == Op::LoopIndex) return false;
    const int operands = arity(n);
    if (operands < 0) return false;
    const uint32_t ids[3] = {n.a, n.b, n.c};
    for (int i = 0; i < operands; ++i)
        if (!use(ids[i], pos)) return false;
    if (n.op == Op::Load && !checkTarget(n.space, n.imm, false)) return false;
    if (n.op == Op::Atomic && !checkTarget(n.space, n.imm, true)) return false;
    if (const uint32_t same = identityOperand(n); same != kNone) {
        forward_[node] = resolve(same);
        kind_[node] = kForwarded;
        return true;
    }
    return define(node, pos);
}

/// The operand an integer operation returns unchanged (x + 0, x * 1...), or kNone. Operands are
/// valid node indices (checked by the caller).
uint32_t Interpreter::identityOperand(const Node &n) const {
    const auto &nodes = m_->nodes;
    auto isInteger = [](Type t) { return t == Type::I32 || t == Type::U32; };
    auto constant = [&](uint32_t id, uint32_t bits) {
        const Node &c = nodes[resolve(id)];
        return c.op == Op::Constant && c.imm == bits;
    };
    if (n.op == Op::Cast) {
        const Type from = nodes[n.a].type;
        return from == n.type || (isInteger(from) && isInteger(n.type)) ? n.a : kNone;
    }
    if (!isInteger(n.type) || arity(n) != 2 || n.op == Op::Atomic || !isInteger(nodes[n.a].type))
        return kNone;
    switch (n.op) {
    case Op::Add:
    case Op::Or:
    case Op::Xor:
        if (constant(n.b, 0)) return n.a;
        if (constant(n.a, 0)) return n.b;
        return kNone;
    case Op::Sub:
    case Op::Shl:
    case Op::Shr:
        return constant(n.b, 0) ? n.a : kNone;
    case Op::Mul:
        if (constant(n.b, 1)) return n.a;
        if (constant(n.a, 1)) return n.b;
        return kNone;
    case Op::Div:
        return constant(n.b, 1) ? n.a : kNone;
    default:
        return kNone;
    }
}

bool Interpreter::storedBetween(uint32_t key, uint32_t after, uint32_t upTo) const {
    const auto at =
        std::lower_bound(stores_.begin(), stores_.end(), std::make_pair(key, after + 1));
    return at != stores_.end() && at->first == key && at->second <= upTo;
}

bool Interpreter::walk(uint32_t block, uint32_t freeLevel) {
    const Module &m = *m_;
    if (block >= m.blocks.size() || visited_[block] || freeLevel > kMaxLevel) return false;
    visited_[block] = 1;
    bool jumps = false, returns = false;
    // A loop absorbs the breaks and continues of its blocks; a return goes through.
    auto nested = [&](uint32_t child, bool loop) {
        if (!walk(child, freeLevel + 2)) return false;
        jumps = jumps || (loop ? hasReturn_[child] : hasJump_[child]);
        returns = returns || hasReturn_[child];
        return true;
    };
    const auto &stmts = m.blocks[block].stmts;
    for (uint32_t i = 0; i < stmts.size(); ++i) {
        const Stmt &s = stmts[i];
        const uint32_t pos = positions_++;
        if (posDef_.size() < positions_ + 2) posDef_.resize(2 * positions_ + 16, kNone);
        switch (s.kind) {
        case StmtKind::Let:
            if (!checkLet(s.node, pos)) return false;
            break;
        case StmtKind::Store:
            if (!checkTarget(s.space, s.target, false) || !use(s.value, pos)) return false;
            if (s.space != Space::Var && !use(s.index, pos)) return false;
            if (s.space == Space::Var) stores_.push_back({s.target, pos});
            if (s.space == Space::Private)
                stores_.push_back({static_cast<uint32_t>(m.vars.size()) + s.target, pos});
            break;
        case StmtKind::DeclareVar:
            if (!checkTarget(Space::Var, s.target, false) || !use(s.value, pos)) return false;
            stores_.push_back({s.target, pos});
            break;
        case StmtKind::If:
            maxLevel_ = std::max(maxLevel_, freeLevel + 1);
            if (!use(s.node, pos) || !nested(s.body, false)) return false;
            if (s.other != kNone && !nested(s.other, false)) return false;
            break;
        case StmtKind::For: {
            maxLevel_ = std::max(maxLevel_, freeLevel + 1);
            if (s.node >= m.nodes.size() || m.nodes[s.node].op != Op::LoopIndex) return false;
            if (!use(s.begin, pos) || !use(s.end, pos) || !use(s.step, pos)) return false;
            if (!define(s.node, pos)) return false;
            forOf_[s.node] = &s;
            const auto loop = static_cast<uint32_t>(loopStart_.size());
            loopStart_.push_back(pos);
            loopEnd_.push_back(kNone);
            openLoops_.push_back(loop);
            if (!nested(s.body, true)) return false;
            const uint32_t end = positions_++;
            if (!use(s.end, end) || !use(s.step, end) || !use(s.node, end)) return false;
            openLoops_.pop_back();
            loopEnd_[loop] = end;
            break;
        }
        case StmtKind::While: {
            maxLevel_ = std::max(maxLevel_, freeLevel + 1);
            const auto loop = static_cast<uint32_t>(loopStart_.size());
            loopStart_.push_back(pos);
            loopEnd_.push_back(kNone);
            openLoops_.push_back(loop);
            if (!nested(s.other, true)) return false;
            const uint32_t test = positions_++;
            if (!use(s.node, test) || !nested(s.body, true)) return false;
            const uint32_t end = positions_++;
            openLoops_.pop_back();
            loopEnd_[loop] = end;
            break;
        }
        case StmtKind::Jump:
            jumps = true;
            returns = returns || s.jump == Jump::Return;
            break;
        case StmtKind::Barrier:
            break;
        case StmtKind::MatrixFill:
            if (s.matrix >= m.matrices.size() || !use(s.value, pos)) return false;
            break;
        case StmtKind::MatrixLoad:
        case StmtKind::MatrixStore:
            if (s.matrix >= m.matrices.size() || (s.space != Space::Buffer && s.space != Space::Shared) ||
                !checkTarget(s.space, s.target, false) || !use(s.index, pos) || !use(s.value, pos))
                return false;
            break;
        case StmtKind::MatrixMma:
            for (uint32_t f : {s.matrix, s.operands[0], s.operands[1], s.operands[2]})
                if (f >= m.matrices.size()) return false;
            break;
        case StmtKind::CopyAsync:
            // Runs as its body: the same copy in ordinary loads and stores, complete at once.
            maxLevel_ = std::max(maxLevel_, freeLevel + 1);
            if (!checkTarget(Space::Shared, s.target, false) || !checkTarget(Space::Buffer, s.operands[0], false) ||
                !use(s.index, pos) || !use(s.node, pos) || !use(s.value, pos) || !nested(s.body, false) ||
                hasJump_[s.body])
                return false;
            break;
        case StmtKind::CopyCommit:
        case StmtKind::CopyWait:
            break;
        default:
            return false;
        }
        if (posDef_.size() < positions_ + 2) posDef_.resize(2 * positions_ + 16, kNone);
    }
    hasJump_[block] = jumps;
    hasReturn_[block] = returns;
    return true;
}

void Interpreter::planUniform() {
    const auto &nodes = m_->nodes;
    for (uint32_t i = 0; i < nodes.size(); ++i) {
        const Node &n = nodes[i];
        bool u = false;
        switch (n.op) {
        case Op::Constant:
        case Op::Scalar:
        case Op::Length:
            u = true;
            break;
        case Op::Builtin:
            u = uniformBuiltin(n.imm);
            break;
        case Op::LoopIndex: {
            // Every lane in the loop has run the same iterations when its bounds are uniform.
            const Stmt *s = forOf_[i];
            u = s != nullptr;
            if (u)
                for (uint32_t o : {s->begin, s->end, s->step})
                    u = u && o < i && uniform_[o];
            break;
        }
        case Op::Load:
        case Op::Atomic:
        case Op::SubgroupSum:
        case Op::SubgroupMin:
        case Op::SubgroupMax:
        case Op::ShuffleXor:
        case Op::Broadcast:
            u = false;
            break;
        default: {
            // Operands recorded before the node (SSA order); a later one counts as varying.
            u = true;
            for (uint32_t o : {n.a, n.b, n.c})
                if (o != kNone) u = u && o < i && uniform_[o];
        }
        }
        uniform_[i] = u;
        planRow(i);
    }
}

// Within a row of the block (the lanes of one local y and z), an index is often the row's first
// value plus a constant times the local x id: 1 for x-contiguous accesses (x[globalId.x]), 0 for
// values that depend on y, z and uniforms only (tile[ty * 16 + k]). Such accesses under a full
// mask move whole rows (a copy, or one element broadcast) instead of an element per lane.
void Interpreter::planRow(uint32_t i) {
    const Node &n = m_->nodes[i];
    rowAffine_[i] = 0;
    xStep_[i] = 0;
    if (uniform_[i]) {
        rowAffine_[i] = 1;
        return;
    }
    auto affine = [&](uint32_t o) { return o != kNone && o < i && rowAffine_[o]; };
    auto constant = [&](uint32_t o) {
        return o != kNone && m_->nodes[resolve(o)].op == Op::Constant;
    };
    auto set = [&](uint32_t step) {
        rowAffine_[i] = 1;
        xStep_[i] = step;
    };
    const bool integer = n.type == Type::I32 || n.type == Type::U32;
    switch (n.op) {
    case Op::Builtin: {
        const auto which = static_cast<Builtin>(n.imm / 4);
        const uint32_t axis = n.imm % 4;
        if (which == Builtin::LocalIndex)
            set(1);
        else if (which == Builtin::LocalId || which == Builtin::GlobalId)
            set(axis == 0 ? 1 : 0);
        return;
    }
    case Op::Add:
    case Op::Sub:
        if (integer && affine(n.a) && affine(n.b))
            set(n.op == Op::Add ? xStep_[n.a] + xStep_[n.b] : xStep_[n.a] - xStep_[n.b]);
        else
            break;
        return;
    case Op::Mul:
        if (!integer || !affine(n.a) || !affine(n.b)) break;
        if (constant(n.b))
            set(xStep_[n.a] * m_->nodes[resolve(n.b)].imm);
        else if (constant(n.a))
            set(xStep_[n.b] * m_->nodes[resolve(n.a)].imm);
        else if (xStep_[n.a] == 0 && xStep_[n.b] == 0)
            set(0);
        return;
    case Op::Shl:
        if (!integer || !affine(n.a) || !affine(n.b)) break;
        if (constant(n.b))
            set(xStep_[n.a] << (m_->nodes[resolve(n.b)].imm & 31));
        else if (xStep_[n.a] == 0 && xStep_[n.b] == 0)
            set(0);
        return;
    case Op::Cast:
        if (integer && affine(n.a) &&
            (m_->nodes[n.a].type == Type::I32 || m_->nodes[n.a].type == Type::U32))
            set(xStep_[n.a]); // the bits are kept
        else
            break;
        return;
    case Op::Load:
    case Op::Atomic:
    case Op::LoopIndex:
    case Op::SubgroupSum:
    case Op::SubgroupMin:
    case Op::SubgroupMax:
    case Op::ShuffleXor:
    case Op::Broadcast:
    case Op::Constant:
    case Op::Scalar:
    case Op::Length:
        return;
    default:
        break;
    }
    // Any other operation of values that are constant along a row is constant along it.
    if (arity(n) < 1) return;
    const uint32_t ids[3] = {n.a, n.b, n.c};
    for (int k = 0; k < arity(n); ++k)
        if (!affine(ids[k]) || xStep_[ids[k]] != 0) return;
    set(0);
}

void Interpreter::allocate() {
    const Module &m = *m_;
    const auto count = static_cast<uint32_t>(m.nodes.size());

    // Leaves: one slot per distinct value, in the first slots.
    leaves_.clear();
    for (uint32_t i = 0; i < count; ++i) {
        const Node &n = m.nodes[i];
        if (!isLeaf(n.op)) continue;
        const uint64_t kind = n.op == Op::Constant  ? 0
                              : n.op == Op::Builtin ? 1
                              : n.op == Op::Scalar  ? 2
                                                    : 3;
        leaves_.emplace_back(static_cast<uint32_t>(kind << 8 | static_cast<uint32_t>(n.type)),
                             n.imm, i);
    }
    std::sort(leaves_.begin(), leaves_.end());
    uint32_t next = 0;
    for (size_t i = 0; i < leaves_.size(); ++i) {
        const auto &[kind, bits, node] = leaves_[i];
        if (i > 0 && (kind != std::get<0>(leaves_[i - 1]) || bits != std::get<1>(leaves_[i - 1])))
            ++next;
        slot_[node] = next;
    }
    if (!leaves_.empty()) ++next;
    leafSlots_ = next;

    // Statement values: linear scan over positions, a slot freed after the value's last use
    // (extended to the end of the last loop that reads it and began after it was computed).
    const uint32_t positions = positions_;
    endStart_.assign(positions + 2, 0);
    std::sort(stores_.begin(), stores_.end());
    for (uint32_t i = 0; i < count; ++i) {
        if (defPos_[i] == kNone) continue;
        uint32_t end = lastUse_[i];
        if (outerLoop_[i] != kNone) end = std::max(end, loopEnd_[outerLoop_[i]]);
        lastUse_[i] = end;
        ++endStart_[end + 1];
        // Loads that can read their memory in place: nothing stores to it while they live.
        const Node &n = m.nodes[i];
        if (n.op != Op::Load) continue;
        if (n.space == Space::Var && !storedBetween(n.imm, defPos_[i], end)) {
            kind_[i] = kInVar;
            slot_[i] = n.imm;
        } else if (n.space == Space::Private) {
            const Node &index = m.nodes[resolve(n.a)];
            const uint32_t key = static_cast<uint32_t>(m.vars.size()) + n.imm;
            if (index.op == Op::Constant && index.imm < m.arrays[n.imm].length &&
                !storedBetween(key, defPos_[i], end)) {
                kind_[i] = kInPrivate;
                slot_[i] = privOffset_[n.imm] + index.imm;
            }
        }
    }
    for (uint32_t p = 0; p + 1 < endStart_.size(); ++p)
        endStart_[p + 1] += endStart_[p];
    endNodes_.assign(endStart_.back(), 0);
    {
        std::vector<uint32_t> &fill = freeSlots_; // reused as the per-position cursor here
        fill.assign(endStart_.begin(), endStart_.end());
        for (uint32_t i = 0; i < count; ++i)
            if (defPos_[i] != kNone) endNodes_[fill[lastUse_[i]]++] = i;
    }
    freeSlots_.clear();
    for (uint32_t p = 0; p < positions; ++p) {
        const uint32_t def = posDef_[p];
        if (def != kNone && kind_[def] == kRegister) {
            // Allocated before this position's dying values are freed: a result never shares
            // a register with its operands, so the lane loops see no aliasing.
            if (freeSlots_.empty()) {
                slot_[def] = next++;
            } else {
                slot_[def] = freeSlots_.back();
                freeSlots_.pop_back();
            }
        }
        for (uint32_t k = endStart_[p]; k < endStart_[p + 1]; ++k)
            if (kind_[endNodes_[k]] == kRegister) freeSlots_.push_back(slot_[endNodes_[k]]);
    }
    slots_ = std::max(next, 1u);
}

void Interpreter::sign(const Module &module) {
    size_t words = 5 + 5 * module.nodes.size() + 2 * module.arrays.size() + 4 * module.matrices.size();
    for (const Block &b : module.blocks)
        words += 1 + 15 * b.stmts.size();
    signature_.resize(words);
    uint32_t *out = signature_.data();
    auto put = [&](size_t value) { *out++ = static_cast<uint32_t>(value); };
    put(module.nodes.size());
    put(module.blocks.size());
    put(module.bindings.size());
    put(module.vars.size());
    put(module.matrices.size());
    for (const MatrixDecl &d : module.matrices) {
        put(uint32_t{static_cast<uint8_t>(d.use)} | uint32_t{static_cast<uint8_t>(d.type)} << 8);
        put(d.m);
        put(d.n);
        put(d.k);
    }
    for (const Node &n : module.nodes) {
        put(uint32_t{static_cast<uint8_t>(n.op)} | uint32_t{static_cast<uint8_t>(n.type)} << 8 |
            uint32_t{static_cast<uint8_t>(n.space)} << 16 |
            uint32_t{static_cast<uint8_t>(n.atomicOp)} << 24);
        put(n.a);
        put(n.b);
        put(n.c);
        put(n.imm);
    }
    for (const ArrayDecl &a : module.arrays) {
        put(static_cast<uint8_t>(a.space));
        put(a.length);
    }
    for (const Block &b : module.blocks) {
        put(b.stmts.size());
        for (const Stmt &st : b.stmts) {
            put(uint32_t{static_cast<uint8_t>(st.kind)} |
                uint32_t{static_cast<uint8_t>(st.space)} << 8 |
                uint32_t{static_cast<uint8_t>(st.jump)} << 16);
            for (uint32_t v : {st.node, st.target, st.index, st.value, st.body, st.other, st.begin,
                               st.end, st.step, st.matrix, st.operands[0], st.operands[1],
                               st.operands[2], static_cast<uint32_t>(st.layout)})
                put(v);
        }
    }
}

bool Interpreter::plan() {
    const Module &m = *m_;
    const size_t count = m.nodes.size();
    if (m.blocks.empty() || count >= kNone / 2 || m.blocks.size() >= kNone / 2) return false;
    slot_.assign(count, 0);
    kind_.assign(count, kRegister);
    forward_.assign(count, kNone);
    stores_.clear();
    defPos_.assign(count, kNone);
    lastUse_.assign(count, 0);
    outerLoop_.assign(count, kNone);
    uniform_.assign(count, 0);
    rowAffine_.assign(count, 0);
    xStep_.assign(count, 0);
    forOf_.assign(count, nullptr);
    visited_.assign(m.blocks.size(), 0);
    hasJump_.assign(m.blocks.size(), 0);
    hasReturn_.assign(m.blocks.size(), 0);
    posDef_.assign(64, kNone);
    loopStart_.clear();
    loopEnd_.clear();
    openLoops_.clear();
    positions_ = 0;
    maxLevel_ = 0;
    for (const Node &n : m.nodes)
        if (n.op == Op::Builtin && n.imm / 4 > static_cast<uint32_t>(Builtin::SubgroupLane))
            return false;
    if (!walk(0, 1)) return false;
    planUniform();
    privOffset_.assign(m.arrays.size(), 0);
    sharedOffset_.assign(m.arrays.size(), 0);
    privWords_ = 0;
    sharedWords_ = 0;
    for (uint32_t a = 0; a < m.arrays.size(); ++a) {
        const ArrayDecl &array = m.arrays[a];
        if (array.length == 0) return false;
        if (array.space == Space::Private) {
            privOffset_[a] = static_cast<uint32_t>(privWords_);
            privWords_ += array.length;
        } else {
            sharedOffset_[a] = static_cast<uint32_t>(sharedWords_);
            sharedWords_ += array.length;
        }
        if (privWords_ >= kNone || sharedWords_ >= kNone) return false;
    }
    matrixOffset_.assign(m.matrices.size(), 0);
    matrixWords_ = 0;
    for (uint32_t f = 0; f < m.matrices.size(); ++f) {
        matrixOffset_[f] = static_cast<uint32_t>(matrixWords_);
        matrixWords_ += uint64_t{m.matrices[f].rows()} * m.matrices[f].cols();
        if (matrixWords_ >= kNone) return false;
    }
    allocate();
    return true;
}

// -- scratch -------------------------------------------------------------------------------------

template <class T> void growTo(std::vector<T> &v, size_t size) {
    if (v.size() < size) v.resize(size);
}

bool Interpreter::prepare(const bp_host_kernel_context &context) {
    const Module &m = *m_;
    const uint64_t n = n_;
    const uint64_t levels = uint64_t{maxLevel_} + 1;
    const uint64_t words =
        uint64_t{slots_} * n + m.vars.size() * n + privWords_ * n + sharedWords_ + levels * n * 2 +
        matrixWords_ * n;
    if (words > kMaxScratchWords) return false;

    // Registers keep their contents when they grow, so what filled_ says of them stays true.
    growTo(regs_, size_t{slots_} * n);
    vars_.assign(m.vars.size() * n, 0);
    private_.assign(privWords_ * n, 0);
    matrices_.assign(matrixWords_ * n, 0.0f);
    shared_.assign(sharedWords_, 0);
    dead_.assign(n, kAlive);
    growTo(maskOn_, levels * n);
    growTo(maskLanes_, levels * n);
    masks_.resize(levels);
    for (uint64_t l = 0; l < levels; ++l) {
        masks_[l].on = maskOn_.data() + l * n;
        masks_[l].lanes = maskLanes_.data() + l * n;
        masks_[l].count = 0;
    }

    regPtr_.resize(m.nodes.size());
    for (uint32_t i = 0; i < m.nodes.size(); ++i) {
        switch (kind_[i]) {
        case kRegister:
            regPtr_[i] = regs_.data() + size_t{slot_[i]} * n;
            break;
        case kInVar:
            regPtr_[i] = vars_.data() + size_t{slot_[i]} * n;
            break;
        case kInPrivate:
            regPtr_[i] = private_.data() + size_t{slot_[i]} * n;
            break;
        case kForwarded:
            break;
        }
    }
    for (uint32_t i = 0; i < m.nodes.size(); ++i)
        if (kind_[i] == kForwarded) regPtr_[i] = regPtr_[forward_[i]];

    buffers_.assign(m.bindings.size(), BufferView{});
    if (context.buffers != nullptr && context.buffer_sizes != nullptr) {
        for (uint32_t b = 0; b < m.bindings.size() && b < context.buffer_count; ++b) {
            auto *data = static_cast<unsigned char *>(context.buffers[b]);
            if (data == nullptr) continue;
            buffers_[b].data = data;
            buffers_[b].type = m.bindings[b].type;
            buffers_[b].length = context.buffer_sizes[b] / sizeOf(m.bindings[b].type);
            buffers_[b].aligned = reinterpret_cast<uintptr_t>(data) % alignof(uint32_t) == 0;
        }
    }
    fillLeaves(context);
    return true;
}

void Interpreter::fillLeaves(const bp_host_kernel_context &context) {
    const Module &m = *m_;
    const uint32_t n = n_;
    // Slots [0, leafSlots_) hold leaves in every plan; what a slot was last filled with stays
    // valid across calls while the lane count does.
    if (filledLanes_ != n) filled_.clear();
    filledLanes_ = n;
    filled_.resize(leafSlots_, 0);
    if (!std::equal(block_, block_ + 3, localIdsBlock_)) {
        // Lane ids per axis for this block shape (lanes are x fastest, then y, then z).
        localIds_.resize(size_t{3} * n);
        uint32_t l = 0;
        for (uint32_t z = 0; z < block_[2]; ++z)
            for (uint32_t y = 0; y < block_[1]; ++y)
                for (uint32_t x = 0; x < block_[0]; ++x, ++l) {
                    localIds_[l] = x;
                    localIds_[n + l] = y;
                    localIds_[2 * size_t{n} + l] = z;
                }
        std::copy(block_, block_ + 3, localIdsBlock_);
    }

    uint32_t lastSlot = kNone;
    for (const auto &[kind, bits, node] : leaves_) {
        const uint32_t s = slot_[node];
        if (s == lastSlot) continue;
        lastSlot = s;
        uint32_t *out = regs_.data() + size_t{s} * n;
        const Node &leaf = m.nodes[node];
        auto fill = [&](uint32_t value) {
            const uint64_t tag = uint64_t{1} << 32 | value;
            if (filled_[s] == tag) return;
            std::fill(out, out + n, value);
            filled_[s] = tag;
        };
        filled_[s] = leaf.op == Op::Builtin && !uniformBuiltin(leaf.imm) ? 0 : filled_[s];
        switch (leaf.op) {
        case Op::Constant:
            if (leaf.type == Type::F16 || leaf.type == Type::BF16)
                fill(widen(leaf.type, reinterpret_cast<const unsigned char *>(&leaf.imm)));
            else
                fill(static_cast<uint32_t>(leaf.imm));
            break;
        case Op::Scalar: {
            uint32_t value = 0;
            const uint64_t at = m.scalarOffset(static_cast<size_t>(leaf.imm));
            if (context.scalars != nullptr && at < context.scalar_size)
                std::memcpy(&value, static_cast<const unsigned char *>(context.scalars) + at,
                            std::min<uint64_t>(4, context.scalar_size - at));
            fill(value);
            break;
        }
        case Op::Length: {
            const uint64_t length = leaf.imm < buffers_.size() ? buffers_[leaf.imm].length : 0;
            fill(static_cast<uint32_t>(std::min<uint64_t>(length, UINT32_MAX)));
            break;
        }
        case Op::Builtin: {
            const auto which = static_cast<Builtin>(leaf.imm / 4);
            const uint32_t axis = leaf.imm % 4;
            const bool inAxis = axis < 3;
            // offset + the lane's id along `axis`.
            auto localIds = [&](uint32_t offset) {
                const uint32_t *ids = localIds_.data() + size_t{axis} * n;
                for (uint32_t l = 0; l < n; ++l)
                    out[l] = offset + ids[l];
            };
            switch (which) {
            case Builtin::LocalId:
                if (inAxis)
                    localIds(0);
                else
                    fill(0);
                break;
            case Builtin::GroupId:
                fill(inAxis ? context.workgroup[axis] : 0);
                break;
            case Builtin::GlobalId:
                if (inAxis)
                    localIds(context.workgroup[axis] * block_[axis]);
                else
                    fill(0);
                break;
            case Builtin::GroupSize:
                fill(inAxis ? block_[axis] : 0);
                break;
            case Builtin::GridSize:
                fill(inAxis ? context.grid[axis] : 0);
                break;
            case Builtin::LocalIndex:
                for (uint32_t l = 0; l < n; ++l)
                    out[l] = l;
                break;
            case Builtin::SubgroupSize:
                fill(1);
                break;
            case Builtin::SubgroupLane:
                fill(0);
                break;
            }
            break;
        }
        default:
            break;
        }
    }
}

// -- masks ---------------------------------------------------------------------------------------

void Interpreter::recount(Mask &m) const {
    const uint32_t n = n_;
    const uint8_t *on = m.on;
    uint32_t count = 0;
    for (uint32_t l = 0; l < n; ++l)
        count += on[l];
    m.count = count;
    if (count == n) return; // a full mask loops over all lanes, without the list
    uint32_t *lanes = m.lanes;
    count = 0;
    for (uint32_t l = 0; l < n; ++l) {
        lanes[count] = l;
        count += on[l];
    }
}

void Interpreter::copyMask(const Mask &from, Mask &to) const {
    std::memcpy(to.on, from.on, n_);
    if (from.count < n_) std::memcpy(to.lanes, from.lanes, size_t{from.count} * sizeof(uint32_t));
    to.count = from.count;
}

/// Drops the lanes that jumped from `m`.
void Interpreter::refresh(Mask &m) const {
    const uint32_t n = n_;
    const uint8_t *dead = dead_.data();
    uint8_t *on = m.on;
    for (uint32_t l = 0; l < n; ++l)
        on[l] = on[l] & (dead[l] == kAlive ? 1 : 0);
    recount(m);
}

/// After one iteration of a loop: a lane that continued goes on, one that broke leaves the loop
/// (and is alive after it), one that returned leaves for good.
void Interpreter::settle(Mask &loop) {
    const uint32_t n = n_;
    uint8_t *dead = dead_.data();
    uint8_t *on = loop.on;
    for (uint32_t l = 0; l < n; ++l) {
        if (!on[l]) continue;
        const uint8_t d = dead[l];
        if (d == kBroke || d == kReturned) on[l] = 0;
        if (d == kBroke || d == kContinued) dead[l] = kAlive;
    }
    recount(loop);
}

// -- control flow --------------------------------------------------------------------------------

void Interpreter::runBlock(uint32_t block, Mask &m, uint32_t freeLevel) {
    for (const Stmt &s : m_->blocks[block].stmts) {
        if (m.count == 0) return;
        switch (s.kind) {
        case StmtKind::Let:
            let(s.node, m);
            break;
        case StmtKind::Store:
            store(s, m);
            break;
        case StmtKind::DeclareVar: {
            uint32_t *out = var(s.target);
            const uint32_t *value = reg(s.value);
            each(m, [=](uint32_t l) { out[l] = value[l]; });
            break;
        }
        case StmtKind::If:
            runIf(s, m, freeLevel);
            break;
        case StmtKind::For:
            runFor(s, m, freeLevel);
            break;
        case StmtKind::While:
            runWhile(s, m, freeLevel);
            break;
        case StmtKind::Jump:
            jump(s.jump, m);
            return;
        case StmtKind::Barrier:
            break; // every lane finished the statements before it
        case StmtKind::MatrixFill:
        case StmtKind::MatrixLoad:
        case StmtKind::MatrixStore:
        case StmtKind::MatrixMma:
            matrix(s, m);
            break;
        case StmtKind::CopyAsync:
            runBlock(s.body, m, freeLevel); // no jump inside: the block leaves m as it is
            break;
        case StmtKind::CopyCommit:
        case StmtKind::CopyWait:
            break; // every copy completed when it was issued
        }
    }
}

void Interpreter::jump(Jump kind, Mask &m) {
    const uint8_t state = kind == Jump::Break      ? kBroke
                          : kind == Jump::Continue ? kContinued
                                                   : kReturned;
    uint8_t *dead = dead_.data();
    each(m, [=](uint32_t l) { dead[l] = state; });
    std::memset(m.on, 0, n_);
    m.count = 0;
}

void Interpreter::runIf(const Stmt &s, Mask &m, uint32_t freeLevel) {
    const uint32_t *condition = reg(s.node);
    if (uniform_[s.node]) {
        const uint32_t taken = condition[first(m)] != 0 ? s.body : s.other;
        if (taken == kNone) return;
        if (!hasJump_[taken]) {
            runBlock(taken, m, freeLevel); // no jump inside: the block leaves m as it is
            return;
        }
        Mask &t = masks_[freeLevel];
        copyMask(m, t);
        runBlock(taken, t, freeLevel + 2);
        refresh(m);
        return;
    }
    Mask &t = masks_[freeLevel], &e = masks_[freeLevel + 1];
    const uint32_t n = n_;
    const uint8_t *on = m.on;
    uint8_t *thenOn = t.on, *elseOn = e.on;
    for (uint32_t l = 0; l < n; ++l)
        thenOn[l] = on[l] & (condition[l] != 0 ? 1 : 0);
    recount(t);
    if (s.other != kNone) {
        for (uint32_t l = 0; l < n; ++l)
            elseOn[l] = on[l] & (thenOn[l] ^ 1);
        recount(e);
    }
    if (t.count != 0) runBlock(s.body, t, freeLevel + 2);
    if (s.other != kNone && e.count != 0) runBlock(s.other, e, freeLevel + 2);
    if (hasJump_[s.body] || (s.other != kNone && hasJump_[s.other])) refresh(m);
}

template <bool Signed> bool indexBelow(uint32_t i, uint32_t end) {
    if constexpr (Signed)
        return asInt(i) < asInt(end);
    else
        return i < end;
}

template <bool Signed>
void narrowLoop(uint8_t *on, const uint32_t *counter, const uint32_t *end, uint32_t n) {
    for (uint32_t l = 0; l < n; ++l)
        on[l] = on[l] & (indexBelow<Signed>(counter[l], end[l]) ? 1 : 0);
}

void Interpreter::runFor(const Stmt &s, Mask &m, uint32_t freeLevel) {
    const uint32_t n = n_;
    uint32_t *counter = reg(s.node);
    const uint32_t *begin = reg(s.begin), *end = reg(s.end), *step = reg(s.step);
    const bool isSigned = m_->nodes[s.node].type == Type::I32;
    const bool jumps = hasJump_[s.body];
    std::memcpy(counter, begin, size_t{n} * sizeof(uint32_t));
    auto advance = [=] {
        for (uint32_t l = 0; l < n; ++l)
            counter[l] += step[l]; // wraps like the GPU code
    };
    if (uniform_[s.node] && !jumps) {
        // Every lane runs every iteration: the body runs under m itself.
        const uint32_t l0 = first(m);
        while (isSigned ? indexBelow<true>(counter[l0], end[l0])
                        : indexBelow<false>(counter[l0], end[l0])) {
            runBlock(s.body, m, freeLevel);
            advance();
        }
        return;
    }
    Mask &loop = masks_[freeLevel], &iteration = masks_[freeLevel + 1];
    copyMask(m, loop);
    for (;;) {
        if (isSigned)
            narrowLoop<true>(loop.on, counter, end, n);
        else
            narrowLoop<false>(loop.on, counter, end, n);
        recount(loop);
        if (loop.count == 0) break;
        if (jumps) {
            copyMask(loop, iteration);
            runBlock(s.body, iteration, freeLevel + 2);
            settle(loop);
        } else {
            runBlock(s.body, loop, freeLevel + 2);
        }
        advance(); // continued lanes too: `continue` still runs the increment
    }
    if (hasReturn_[s.body]) refresh(m);
}

void Interpreter::runWhile(const Stmt &s, Mask &m, uint32_t freeLevel) {
    const uint32_t n = n_;
    const bool jumps = hasJump_[s.other] || hasJump_[s.body];
    Mask &loop = masks_[freeLevel], &iteration = masks_[freeLevel + 1];
    copyMask(m, loop);
    for (;;) {
        copyMask(loop, iteration);
        runBlock(s.other, iteration, freeLevel + 2);
        // Lanes whose condition is false leave the loop.
        const uint32_t *condition = reg(s.node);
        uint8_t *loopOn = loop.on, *on = iteration.on;
        for (uint32_t l = 0; l < n; ++l) {
            if (on[l] && condition[l] == 0) {
                on[l] = 0;
                loopOn[l] = 0;
            }
        }
        recount(iteration);
        if (iteration.count != 0) runBlock(s.body, iteration, freeLevel + 2);
        if (jumps)
            settle(loop);
        else
            recount(loop);
        if (loop.count == 0) break;
    }
    if (hasReturn_[s.other] || hasReturn_[s.body]) refresh(m);
}

// -- values --------------------------------------------------------------------------------------

void Interpreter::let(uint32_t node, const Mask &m) {
    if (kind_[node] != kRegister) return; // shares a register or reads memory in place
    const Node &n = m_->nodes[node];
    uint32_t *out = reg(node);
    switch (n.op) {
    case Op::Constant:
    case Op::Builtin:
    case Op::Scalar:
    case Op::Length:
    case Op::LoopIndex:
        return; // filled once per workgroup (loop indices by their For)
    case Op::Load:
        load(n, out, m);
        return;
    case Op::Atomic:
        atomic(n, out, m);
        return;
    case Op::SubgroupSum:
    case Op::SubgroupMin:
    case Op::SubgroupMax:
    case Op::ShuffleXor:
    case Op::Broadcast: {
        // Subgroups of one lane: a reduction is the value, a shuffle the lane's own value.
        const uint32_t *a = reg(n.a);
        each(m, [=](uint32_t l) { out[l] = a[l]; });
        return;
    }
    case Op::Cast:
        cast(n, out, m);
        return;
    default:
        arithmetic(n, out, m);
        // 8- and 16-bit results: computed in 32 bits, then wrapped or rounded to the type.
        if (isNarrow(n.type)) {
            const Type t = n.type;
            map1(m, out, out, [t](uint32_t x) { return normalize(t, x); });
        }
        return;
    }
}

void Interpreter::divideByUniform(bool remainder, uint32_t *out, const uint32_t *a, uint32_t d,
                                  const Mask &m) {
    if (d == 0) {
        each(m, [=](uint32_t l) { out[l] = 0; });
        return;
    }
    const Divisor divisor(d);
    const uint32_t multiplier = divisor.multiplier;
    const int shift = divisor.shift;
    if (divisor.power) {
        if (remainder)
            map1(m, out, a, [=](uint32_t x) { return x & (d - 1); });
        else
            map1(m, out, a, [=](uint32_t x) { return x >> shift; });
        return;
    }
    auto quotient = [=](uint32_t x) {
        const auto t = static_cast<uint32_t>((uint64_t{multiplier} * x) >> 32);
        return (t + ((x - t) >> 1)) >> shift;
    };
    if (remainder)
        map1(m, out, a, [=](uint32_t x) { return x - quotient(x) * d; });
    else
        map1(m, out, a, quotient);
}

void Interpreter::cast(const Node &node, uint32_t *out, const Mask &m) {
    const uint32_t *a = reg(node.a);
    const Type from = m_->nodes[node.a].type, to = node.type;
    const bool fromFloat = floatRegister(from), toFloat = floatRegister(to);
    if (from == to ||
        (!fromFloat && !toFloat && from != Type::Bool && to != Type::Bool && !isNarrow(to))) {
        map1(m, out, a, [](uint32_t x) { return x; }); // to a 32-bit int: the bits are kept
    } else if (to == Type::Bool) {
        if (fromFloat)
            map1(m, out, a, [](uint32_t x) { return asFloat(x) != 0.0f ? 1u : 0u; });
        else
            map1(m, out, a, [](uint32_t x) { return x != 0 ? 1u : 0u; });
    } else if (from == Type::Bool) {
        if (toFloat)
            map1(m, out, a, [](uint32_t x) { return x != 0 ? 0x3f800000u : 0u; });
        else
            map1(m, out, a, [](uint32_t x) { return x != 0 ? 1u : 0u; });
    } else if (fromFloat && toFloat) {
        map1(m, out, a, [to](uint32_t x) { return normalize(to, x); });
    } else if (fromFloat) {
        // Truncates toward zero and saturates to the target's range; NaN gives 0.
        switch (to) {
        case Type::I32: map1(m, out, a, [](uint32_t x) { return floatToI32(x); }); break;
        case Type::U32: map1(m, out, a, [](uint32_t x) { return floatToU32(x); }); break;
        case Type::I8:
        case Type::I16: {
            const int32_t hi = to == Type::I8 ? 127 : 32767;
            map1(m, out, a, [hi](uint32_t x) {
                return static_cast<uint32_t>(std::clamp(asInt(floatToI32(x)), -hi - 1, hi));
            });
            break;
        }
        default: {
            const uint32_t hi = to == Type::U8 ? 255u : 65535u;
            map1(m, out, a, [hi](uint32_t x) { return std::min(floatToU32(x), hi); });
            break;
        }
        }
    } else if (toFloat) {
        // Integers (narrow ones already extended) through float, rounded to f16 or bf16.
        if (isSigned(from))
            map1(m, out, a,
                 [to](uint32_t x) { return normalize(to, bitsOf(static_cast<float>(asInt(x)))); });
        else
            map1(m, out, a, [to](uint32_t x) { return normalize(to, bitsOf(static_cast<float>(x))); });
    } else {
        map1(m, out, a, [to](uint32_t x) { return normalize(to, x); }); // wraps to a narrow int
    }
}

void Interpreter::arithmetic(const Node &node, uint32_t *out, const Mask &m) {
    const Type t = m_->nodes[node.a].type; // the operands' type (comparisons give bool)
    const bool f = floatRegister(t), s = isSigned(t);
    const uint32_t *a = reg(node.a);
    const uint32_t *b = node.b != kNone ? reg(node.b) : nullptr;
    const uint32_t *c = node.c != kNone ? reg(node.c) : nullptr;
    auto fmap1 = [&](auto fn) {
        map1(m, out, a, [=](uint32_t x) { return bitsOf(fn(asFloat(x))); });
    };
    auto fmap2 = [&](auto fn) {
        map2(m, out, a, b,
             [=](uint32_t x, uint32_t y) { return bitsOf(fn(asFloat(x), asFloat(y))); });
    };
    auto compare = [&](auto fn) {
        if (f)
            map2(m, out, a, b,
                 [=](uint32_t x, uint32_t y) { return fn(asFloat(x), asFloat(y)) ? 1u : 0u; });
        else if (s)
            map2(m, out, a, b,
                 [=](uint32_t x, uint32_t y) { return fn(asInt(x), asInt(y)) ? 1u : 0u; });
        else
            map2(m, out, a, b, [=](uint32_t x, uint32_t y) { return fn(x, y) ? 1u : 0u; });
    };
    switch (node.op) {
    case Op::Neg:
        if (f)
            fmap1([](float x) { return -x; });
        else
            map1(m, out, a, [](uint32_t x) { return 0u - x; });
        return;
    case Op::Not:
        map1(m, out, a, [](uint32_t x) { return x == 0 ? 1u : 0u; });
        return;
    case Op::BitNot:
        map1(m, out, a, [](uint32_t x) { return ~x; });
        return;
    case Op::Add:
        if (f)
            fmap2([](float x, float y) { return x + y; });
        else
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x + y; });
        return;
    case Op::Sub:
        if (f)
            fmap2([](float x, float y) { return x - y; });
        else
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x - y; });
        return;
    case Op::Mul:
        if (f)
            fmap2([](float x, float y) { return x * y; });
        else
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x * y; });
        return;
    case Op::Div:
    case Op::Rem:
        if (t == Type::U32 && uniform_[node.b]) {
            divideByUniform(node.op == Op::Rem, out, a, b[first(m)], m);
            return;
        }
        break;
    default:
        break;
    }
    switch (node.op) {
    case Op::Div:
        if (f) {
            fmap2([](float x, float y) { return x / y; });
        } else if (s) {
            // x / 0 = 0; INT_MIN / -1 = INT_MIN (the negation wraps), never SIGFPE.
            map2(m, out, a, b, [](uint32_t x, uint32_t y) {
                if (y == 0) return 0u;
                if (asInt(y) == -1) return 0u - x;
                return static_cast<uint32_t>(asInt(x) / asInt(y));
            });
        } else {
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return y == 0 ? 0u : x / y; });
        }
        return;
    case Op::Rem:
        if (s) {
            map2(m, out, a, b, [](uint32_t x, uint32_t y) {
                if (y == 0 || asInt(y) == -1) return 0u;
                return static_cast<uint32_t>(asInt(x) % asInt(y));
            });
        } else {
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return y == 0 ? 0u : x % y; });
        }
        return;
    case Op::Min:
        if (f)
            fmap2([](float x, float y) { return std::fmin(x, y); });
        else if (s)
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return asInt(x) < asInt(y) ? x : y; });
        else
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return std::min(x, y); });
        return;
    case Op::Max:
        if (f)
            fmap2([](float x, float y) { return std::fmax(x, y); });
        else if (s)
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return asInt(x) > asInt(y) ? x : y; });
        else
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return std::max(x, y); });
        return;
    case Op::And:
        map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x & y; });
        return;
    case Op::Or:
        map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x | y; });
        return;
    case Op::Xor:
        map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x ^ y; });
        return;
    case Op::Shl:
        map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x << (y & 31); });
        return;
    case Op::Shr:
        if (s)
            map2(m, out, a, b, [](uint32_t x, uint32_t y) {
                return static_cast<uint32_t>(asInt(x) >> (y & 31));
            });
        else
            map2(m, out, a, b, [](uint32_t x, uint32_t y) { return x >> (y & 31); });
        return;
    case Op::Eq:
        compare([](auto x, auto y) { return x == y; });
        return;
    case Op::Ne:
        compare([](auto x, auto y) { return x != y; });
        return;
    case Op::Lt:
        compare([](auto x, auto y) { return x < y; });
        return;
    case Op::Le:
        compare([](auto x, auto y) { return x <= y; });
        return;
    case Op::Gt:
        compare([](auto x, auto y) { return x > y; });
        return;
    case Op::Ge:
        compare([](auto x, auto y) { return x >= y; });
        return;
    case Op::Select:
        each(m, [=](uint32_t l) { out[l] = a[l] != 0 ? b[l] : c[l]; });
        return;
    case Op::Fma:
        each(m, [=](uint32_t l) {
            out[l] = bitsOf(std::fma(asFloat(a[l]), asFloat(b[l]), asFloat(c[l])));
        });
        return;
    case Op::Pow:
        fmap2([](float x, float y) { return std::pow(x, y); });
        return;
    case Op::Abs:
        if (f)
            fmap1([](float x) { return std::fabs(x); });
        else if (s)
            map1(m, out, a, [](uint32_t x) { return asInt(x) < 0 ? 0u - x : x; });
        else
            map1(m, out, a, [](uint32_t x) { return x; });
        return;
    case Op::Sqrt:
        fmap1([](float x) { return std::sqrt(x); });
        return;
    case Op::Rsqrt:
        fmap1([](float x) { return 1.0f / std::sqrt(x); });
        return;
    case Op::Exp:
        fmap1([](float x) { return std::exp(x); });
        return;
    case Op::Log:
        fmap1([](float x) { return std::log(x); });
        return;
    case Op::Sin:
        fmap1([](float x) { return std::sin(x); });
        return;
    case Op::Cos:
        fmap1([](float x) { return std::cos(x); });
        return;
    case Op::Tanh:
        fmap1([](float x) { return std::tanh(x); });
        return;
    case Op::Floor:
        fmap1([](float x) { return std::floor(x); });
        return;
    case Op::Ceil:
        fmap1([](float x) { return std::ceil(x); });
        return;
    default:
        return; // plan() admits no other operation here
    }
}

// -- memory --------------------------------------------------------------------------------------
// Every access is bounds-checked on the host, whatever KernelOptions::checked says: an index out
// of range loads 0, stores nothing, and an atomic returns 0.

/// f32 rounded to tf32 (10 mantissa bits), nearest with ties away from zero, as CUDA's
/// cvt.rna.tf32.f32; infinities and NaNs unchanged.
float roundTf32(float f) {
    uint32_t bits = std::bit_cast<uint32_t>(f);
    if ((bits & 0x7f800000u) == 0x7f800000u) return f;
    bits = (bits + 0x1000u) & 0xffffe000u;
    return std::bit_cast<float>(bits);
}

// -- matrix units --------------------------------------------------------------------------------

/// The reference of the matrix units: on the host a subgroup is one thread, so each lane holds
/// whole fragments. Products of the rounded inputs are exact; the sums of a multiply-accumulate
/// are exact and rounded to f32 once.
void Interpreter::matrix(const Stmt &s, const Mask &m) {
    const Module &mod = *m_;
    const MatrixDecl &d = mod.matrices[s.matrix];
    const uint32_t rows = d.rows(), cols = d.cols();
    const bool tf32 = d.type == Type::F32 && d.use != MatrixUse::Accumulator;
    switch (s.kind) {
    case StmtKind::MatrixFill: {
        const uint32_t *value = reg(s.value);
        each(m, [&](uint32_t l) {
            float v = std::bit_cast<float>(value[l]);
            if (tf32) v = roundTf32(v);
            std::fill_n(fragment(s.matrix, l), rows * cols, v);
        });
        return;
    }
    case StmtKind::MatrixMma: {
        const MatrixDecl &a = mod.matrices[s.operands[0]];
        const uint32_t mm = a.m, nn = a.n, kk = a.k;
        std::vector<float> result(size_t{mm} * nn);
        each(m, [&](uint32_t l) {
            const float *fa = fragment(s.operands[0], l), *fb = fragment(s.operands[1], l),
                        *fc = fragment(s.operands[2], l);
            for (uint32_t i = 0; i < mm; ++i)
                for (uint32_t j = 0; j < nn; ++j) {
                    double sum = fc[i * nn + j];
                    for (uint32_t p = 0; p < kk; ++p)
                        sum += double(fa[i * kk + p]) * double(fb[p * nn + j]);
                    result[size_t{i} * nn + j] = static_cast<float>(sum);
                }
            std::copy(result.begin(), result.end(), fragment(s.matrix, l));
        });
        return;
    }
    default: break;
    }
    const bool store = s.kind == StmtKind::MatrixStore;
    const bool col = s.layout == Layout::ColMajor;
    const uint32_t *offset = reg(s.index), *stride = reg(s.value);
    const BufferView view = s.space == Space::Buffer ? buffers_[s.target] : BufferView{};
    uint32_t *shared = s.space == Space::Shared ? shared_.data() + sharedOffset_[s.target] : nullptr;
    const uint64_t length = s.space == Space::Buffer ? (view.data ? view.length : 0)
                                                     : mod.arrays[s.target].length;
    const uint32_t size = s.space == Space::Buffer ? sizeOf(view.type) : 4;
    const uint32_t outer = col ? cols : rows, inner = col ? rows : cols;
    each(m, [&](uint32_t l) {
        float *f = fragment(s.matrix, l);
        const uint64_t o = offset[l], st = stride[l];
        // Checked kernels: all or nothing, as on the GPU targets. Otherwise each element is
        // checked (the GPUs leave an access past the memory undefined).
        const bool fits = o + (outer - 1) * st + (inner - 1) < length;
        if (mod.options.checked && !fits) {
            if (!store) std::fill_n(f, rows * cols, 0.0f);
            return;
        }
        for (uint32_t r = 0; r < rows; ++r)
            for (uint32_t c = 0; c < cols; ++c) {
                const uint64_t i = col ? o + c * st + r : o + r * st + c;
                float &e = f[r * cols + c];
                if (store) {
                    if (i >= length) continue;
                    const uint32_t bits = std::bit_cast<uint32_t>(e);
                    if (shared) shared[i] = bits;
                    else narrow(view.type, bits, view.data + i * size);
                } else {
                    const uint32_t bits = i >= length ? 0u
                                          : shared ? shared[i]
                                                   : widen(view.type, view.data + i * size);
                    e = tf32 ? roundTf32(std::bit_cast<float>(bits)) : std::bit_cast<float>(bits);
                }
            }
    });
}

void Interpreter::load(const Node &node, uint32_t *out, const Mask &m) {
    const uint32_t n = n_;
    if (node.space == Space::Var) {
        const uint32_t *v = var(node.imm);
        each(m, [=](uint32_t l) { out[l] = v[l]; });
        return;
    }
    const uint32_t *index = reg(node.a);
    switch (node.space) {
    case Space::Private: {
        const uint32_t *base = private_.data() + size_t{privOffset_[node.imm]} * n;
        const uint32_t length = m_->arrays[node.imm].length;
        if (uniform_[node.a]) {
            const uint32_t i = index[first(m)];
            if (i >= length) {
                each(m, [=](uint32_t l) { out[l] = 0; });
                return;
            }
            const uint32_t *row = base + size_t{i} * n;
            each(m, [=](uint32_t l) { out[l] = row[l]; });
            return;
        }
        // Branch-free (an out-of-range lane reads element 0, then gets 0): the loop becomes
        // gathers. Arrays have at least one element (plan()).
        each(m, [=](uint32_t l) {
            const uint32_t i = index[l];
            const uint32_t value = base[(i < length ? i : 0) * n + l];
            out[l] = i < length ? value : 0;
        });
        return;
    }
    case Space::Shared: {
        const uint32_t *base = shared_.data() + sharedOffset_[node.imm];
        const uint32_t length = m_->arrays[node.imm].length;
        if (byRows(m, node.a)) {
            const uint32_t width = block_[0];
            const bool contiguous = xStep_[node.a] == 1;
            eachRow(index, [=](uint32_t start, uint32_t i) {
                if (!contiguous) {
                    std::fill_n(out + start, width, i < length ? base[i] : 0);
                } else if (i < length && length - i >= width) {
                    copyRow(out + start, base + i, width);
                } else {
                    for (uint32_t x = 0; x < width; ++x)
                        out[start + x] = i + x < length ? base[i + x] : 0;
                }
            });
            return;
        }
        each(m, [=](uint32_t l) {
            const uint32_t i = index[l];
            const uint32_t value = base[i < length ? i : 0];
            out[l] = i < length ? value : 0;
        });
        return;
    }
    case Space::Buffer: {
        const BufferView view = buffers_[node.imm];
        if (view.length == 0) {
            each(m, [=](uint32_t l) { out[l] = 0; });
            return;
        }
        if (isNarrow(view.type)) {
            const unsigned char *data = view.data;
            const uint64_t length = view.length;
            const Type type = view.type;
            const uint32_t size = sizeOf(type);
            each(m, [=](uint32_t l) {
                const uint32_t i = index[l];
                out[l] = i < length ? widen(type, data + size_t{i} * size) : 0;
            });
            return;
        }
        // The last valid index: a buffer of 2^32 elements or more takes every u32 index.
        const auto last = static_cast<uint32_t>(std::min<uint64_t>(view.length - 1, UINT32_MAX));
        if (byRows(m, node.a)) {
            const unsigned char *data = view.data;
            const uint32_t width = block_[0];
            const bool contiguous = xStep_[node.a] == 1;
            eachRow(index, [=](uint32_t start, uint32_t i) {
                if (!contiguous) {
                    uint32_t value = 0;
                    if (i <= last) std::memcpy(&value, data + size_t{i} * 4, sizeof value);
                    std::fill_n(out + start, width, value);
                } else if (i <= last && last - i >= width - 1) {
                    copyRow(out + start, data + size_t{i} * 4, width);
                } else {
                    // u32 indices wrap: lane x reads element i + x mod 2^32 (0 - 1 + 1 is 0).
                    for (uint32_t x = 0; x < width; ++x) {
                        const uint32_t j = i + x;
                        uint32_t value = 0;
                        if (j <= last) std::memcpy(&value, data + size_t{j} * 4, sizeof value);
                        out[start + x] = value;
                    }
                }
            });
            return;
        }
        if (view.aligned) {
            const auto *words = reinterpret_cast<const uint32_t *>(view.data);
            each(m, [=](uint32_t l) {
                const uint32_t i = index[l];
                const uint32_t value = words[i <= last ? i : 0];
                out[l] = i <= last ? value : 0;
            });
            return;
        }
        const unsigned char *data = view.data;
        each(m, [=](uint32_t l) {
            const uint32_t i = index[l];
            uint32_t value = 0;
            if (i <= last) std::memcpy(&value, data + size_t{i} * 4, sizeof value);
            out[l] = value;
        });
        return;
    }
    case Space::Var:
        return;
    }
}

void Interpreter::store(const Stmt &s, const Mask &m) {
    const uint32_t n = n_;
    const uint32_t *value = reg(s.value);
    if (s.space == Space::Var) {
        uint32_t *v = var(s.target);
        each(m, [=](uint32_t l) { v[l] = value[l]; });
        return;
    }
    const uint32_t *index = reg(s.index);
    switch (s.space) {
    case Space::Private: {
        uint32_t *base = private_.data() + size_t{privOffset_[s.target]} * n;
        const uint32_t length = m_->arrays[s.target].length;
        if (uniform_[s.index]) {
            const uint32_t i = index[first(m)];
            if (i >= length) return;
            uint32_t *row = base + size_t{i} * n;
            each(m, [=](uint32_t l) { row[l] = value[l]; });
            return;
        }
        each(m, [=](uint32_t l) {
            const uint32_t i = index[l];
            if (i < length) base[size_t{i} * n + l] = value[l];
        });
        return;
    }
    case Space::Shared: {
        // Lanes store in order: where several write one element, the highest lane's value stays.
        uint32_t *base = shared_.data() + sharedOffset_[s.target];
        const uint32_t length = m_->arrays[s.target].length;
        if (byRows(m, s.index) && xStep_[s.index] == 1) {
            const uint32_t width = block_[0];
            eachRow(index, [=](uint32_t start, uint32_t i) {
                if (i < length && length - i >= width) {
                    copyRow(base + i, value + start, width);
                } else {
                    for (uint32_t x = 0; x < width; ++x)
                        if (i + x < length) base[i + x] = value[start + x];
                }
            });
            return;
        }
        each(m, [=](uint32_t l) {
            const uint32_t i = index[l];
            if (i < length) base[i] = value[l];
        });
        return;
    }
    case Space::Buffer: {
        const BufferView view = buffers_[s.target];
        unsigned char *data = view.data;
        const uint64_t length = view.length;
        if (isNarrow(view.type)) {
            const Type type = view.type;
            const uint32_t size = sizeOf(type);
            each(m, [=](uint32_t l) {
                const uint32_t i = index[l];
                if (i < length) narrow(type, value[l], data + size_t{i} * size);
            });
            return;
        }
        if (length != 0 && byRows(m, s.index) && xStep_[s.index] == 1) {
            const auto last = static_cast<uint32_t>(std::min<uint64_t>(length - 1, UINT32_MAX));
            const uint32_t width = block_[0];
            eachRow(index, [=](uint32_t start, uint32_t i) {
                if (i <= last && last - i >= width - 1) {
                    copyRow(data + size_t{i} * 4, value + start, width);
                } else {
                    for (uint32_t x = 0; x < width; ++x) {
                        const uint32_t j = i + x; // wraps like the lanes' own u32 indices
                        if (j <= last) std::memcpy(data + size_t{j} * 4, &value[start + x], 4);
                    }
                }
            });
            return;
        }
        each(m, [=](uint32_t l) {
            const uint32_t i = index[l];
            if (i < length) std::memcpy(data + size_t{i} * 4, &value[l], sizeof(uint32_t));
        });
        return;
    }
    case Space::Var:
        return;
    }
}

void Interpreter::atomic(const Node &node, uint32_t *out, const Mask &m) {
    const uint32_t *index = reg(node.a), *value = reg(node.b);
    const bool isSigned = node.type == Type::I32;
    const bool isFloat = node.type == Type::F32;
    const AtomicOp op = node.atomicOp;
    if (node.space == Space::Buffer) {
        const BufferView view = buffers_[node.imm];
        each(m, [&](uint32_t l) {
            const uint32_t i = index[l];
            out[l] = i < view.length ? atomicOnBuffer(view.data + size_t{i} * 4, view.aligned, op,
                                                      isSigned, value[l], isFloat)
                                     : 0;
        });
        return;
    }
    // Shared memory: this call owns the workgroup, so lanes apply in order without atomics.
    uint32_t *base = shared_.data() + sharedOffset_[node.imm];
    const uint32_t length = m_->arrays[node.imm].length;
    each(m, [=](uint32_t l) {
        const uint32_t i = index[l];
        if (i >= length) {
            out[l] = 0;
            return;
        }
        const uint32_t old = base[i];
        base[i] = combine(op, isSigned, old, value[l], isFloat);
        out[l] = old;
    });
}

// -- entry ---------------------------------------------------------------------------------------

void Interpreter::run(const Module &module, const bp_host_kernel_context &context) {
    m_ = &module;
    for (int d = 0; d < 3; ++d)
        block_[d] = context.block[d];
    const uint64_t lanes = uint64_t{block_[0]} * block_[1] * block_[2];
    if (lanes == 0 || lanes > kMaxLanes) return;
    n_ = static_cast<uint32_t>(lanes);
    sign(module);
    if (signature_ != plannedSignature_) {
        plannedSignature_.clear();
        if (!plan()) return;
        std::swap(signature_, plannedSignature_);
    }
    if (!prepare(context)) return;
    Mask &all = masks_[0];
    std::memset(all.on, 1, n_);
    recount(all);
    runBlock(0, all, 1);
}

} // namespace

/// Tells the plugin that the workgroup was not computed (ABI 1.6 bp_host_kernel_context::fail),
/// so the launch fails instead of completing with the workgroup left undone.
static void failWorkgroup(const bp_host_kernel_context *context, const std::exception &e) noexcept {
    constexpr size_t kNeeded = offsetof(bp_host_kernel_context, fail_state) + sizeof(void *);
    if (context == nullptr || context->struct_size < kNeeded || context->fail == nullptr) return;
    const bool memory = dynamic_cast<const std::bad_alloc *>(&e) != nullptr;
    const auto *module = static_cast<const Module *>(context->user_data);
    char message[512];
    std::snprintf(message, sizeof(message), "kernel '%s' (interpreted): %s%s",
                  module != nullptr ? module->entryPoint.c_str() : "?",
                  memory ? "no memory for its workgroup scratch: " : "", e.what());
    context->fail(context, memory ? BP_ERROR_OUT_OF_MEMORY : BP_ERROR_INTERNAL, message);
}

void interpretWorkgroup(const bp_host_kernel_context *context) {
    // Called through a C function pointer by the host plugin: nothing may escape.
    try {
        constexpr size_t kNeeded = offsetof(bp_host_kernel_context, user_data) + sizeof(void *);
        if (context == nullptr || context->struct_size < kNeeded || context->user_data == nullptr)
            return;
        thread_local Interpreter interpreter;
        interpreter.run(*static_cast<const Module *>(context->user_data), *context);
        // A worker keeps its scratch for the next workgroup, but not an unusually large one.
        constexpr size_t kKeptScratchBytes = size_t{64} << 20;
        if (interpreter.scratchBytes() > kKeptScratchBytes) interpreter = Interpreter();
    } catch (const std::exception &e) {
        failWorkgroup(context, e);
    } catch (...) {
        failWorkgroup(context, std::runtime_error("a non-standard exception"));
    }
}

} // namespace backplane::lang::detail
