// The kernel language: a kernel written once in C++, recorded to IR, generated for every dialect.
#pragma once

#include <backplane/error.hpp>
#include <backplane/kernel.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

/// A kernel is a C++ function of a Builder. Calling lang::kernel() runs it once: every device
/// operation it performs (arithmetic on Value, stores through Element, k.If, k.For...) is recorded
/// into a small structured IR instead of being computed, and the IR is printed as CUDA C, HIP C and
/// GLSL 450, plus a program the host plugin interprets. docs/kernels.md has the whole language.
///
/// Two kinds of values meet in a kernel body:
/// - plain C++ values (int, float, a std::array of them) are compile-time constants: a C++ `for`
///   over them unrolls, a C++ `if` on them picks what is recorded, and their values end up as
///   literals in the generated source, so they are part of the compiled kernel's cache key;
/// - device values (Value<T>, Var<T>, Element<T>) exist only on the device. They do not convert
///   to bool, so a C++ `if` or `while` on one does not compile: use k.If, k.While and select().
///
/// Element types of buffers, scalars and arrays: int8_t to int64_t, uint8_t to uint64_t, f16,
/// bf16, float and double (docs/kernels.md, "Types and capabilities"). Values may also be bool.
/// Mixing types needs an explicit cast<T>(v); C++ literals convert to the other operand's type.
/// 8- and 16-bit integers compute like C: promoted to 32 bits, the result wrapped to the type.
/// f16 and bf16 compute in f32 and round to nearest even after every operation, on every target
/// (what native half arithmetic gives for + - * / and sqrt). What a device cannot do with a type
/// (DeviceInfo::features) is refused at execute() naming the kernel, the type and the device.
namespace backplane::lang {

/// An IEEE binary16 value in host code: its bits, converted to and from float with rounding to
/// nearest even (buffers of f16 hold these bits).
struct f16 {
    uint16_t bits = 0;
    f16() = default;
    explicit f16(float value) : bits(fromFloat(value)) {}
    explicit operator float() const { return toFloat(bits); }
    static f16 fromBits(uint16_t b) {
        f16 h;
        h.bits = b;
        return h;
    }
    static uint16_t fromFloat(float value);
    static float toFloat(uint16_t bits);
};
/// A bfloat16 value in host code (the upper half of a float, rounded to nearest even).
struct bf16 {
    uint16_t bits = 0;
    bf16() = default;
    explicit bf16(float value) : bits(fromFloat(value)) {}
    explicit operator float() const { return toFloat(bits); }
    static bf16 fromBits(uint16_t b) {
        bf16 h;
        h.bits = b;
        return h;
    }
    static uint16_t fromFloat(float value);
    static float toFloat(uint16_t bits);
};

/// The value types of the language. The first four keep their numbers (IR listings, caches).
enum class Type : uint8_t { Bool, I32, U32, F32, I8, U8, I16, U16, I64, U64, F16, BF16, F64 };
const char *toString(Type type) noexcept;

template <class T>
inline constexpr bool isFloatType = std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                    std::is_same_v<T, f16> || std::is_same_v<T, bf16>;
template <class T>
inline constexpr bool isIntegerType =
    std::is_same_v<T, int8_t> || std::is_same_v<T, uint8_t> || std::is_same_v<T, int16_t> ||
    std::is_same_v<T, uint16_t> || std::is_same_v<T, int32_t> || std::is_same_v<T, uint32_t> ||
    std::is_same_v<T, int64_t> || std::is_same_v<T, uint64_t>;
template <class T> inline constexpr bool isElementType = isFloatType<T> || isIntegerType<T>;
template <class T>
inline constexpr bool isValueType = isElementType<T> || std::is_same_v<T, bool>;

template <class T> constexpr Type typeOf() {
    static_assert(isValueType<T>, "kernel values are bool, 8- to 64-bit integers, f16, bf16, "
                                  "float or double");
    if constexpr (std::is_same_v<T, bool>) return Type::Bool;
    else if constexpr (std::is_same_v<T, int32_t>) return Type::I32;
    else if constexpr (std::is_same_v<T, uint32_t>) return Type::U32;
    else if constexpr (std::is_same_v<T, float>) return Type::F32;
    else if constexpr (std::is_same_v<T, int8_t>) return Type::I8;
    else if constexpr (std::is_same_v<T, uint8_t>) return Type::U8;
    else if constexpr (std::is_same_v<T, int16_t>) return Type::I16;
    else if constexpr (std::is_same_v<T, uint16_t>) return Type::U16;
    else if constexpr (std::is_same_v<T, int64_t>) return Type::I64;
    else if constexpr (std::is_same_v<T, uint64_t>) return Type::U64;
    else if constexpr (std::is_same_v<T, f16>) return Type::F16;
    else if constexpr (std::is_same_v<T, bf16>) return Type::BF16;
    else return Type::F64;
}

/// How a kernel is generated.
struct KernelOptions {
    /// Bounds-checked memory on every target: a buffer, shared or private access whose index is
    /// out of range reads 0, writes nothing and an atomic returns 0. Off: GPU targets do whatever
    /// the device does (undefined); the host interpreter checks either way.
    bool checked = false;
};

enum class MatrixUse : uint8_t; // defined with Matrix below
enum class Layout : uint8_t;

namespace detail {

/// Operations of the IR (core/src/lang/ir.hpp documents each).
// Every IR operation, once, in enum order: X(enum name, name in IR listings, operands read
// (a, b, c in that order; a Load of a variable reads none), family). The builder, the generators
// and the interpreter take what they share from it (core/src/lang/ir.hpp: opInfo) instead of
// keeping their own lists. Families: Leaf (no operand nodes), Unary, Binary (arithmetic, bitwise,
// logic), Compare (gives bool), Ternary, Cast, Function (float functions), CrossLane (atomics and
// subgroup operations).
#define BACKPLANE_LANG_OPS(X)                                                                     \
    X(Constant, "const", 0, Leaf)                                                                  \
    X(Builtin, "builtin", 0, Leaf)                                                                 \
    X(Scalar, "scalar", 0, Leaf)                                                                   \
    X(Length, "length", 0, Leaf)                                                                   \
    X(Load, "load", 1, Memory)                                                                     \
    X(LoopIndex, "index", 0, Leaf)                                                                 \
    X(Neg, "neg", 1, Unary)                                                                        \
    X(Not, "not", 1, Unary)                                                                        \
    X(BitNot, "bitnot", 1, Unary)                                                                  \
    X(Add, "add", 2, Binary)                                                                       \
    X(Sub, "sub", 2, Binary)                                                                       \
    X(Mul, "mul", 2, Binary)                                                                       \
    X(Div, "div", 2, Binary)                                                                       \
    X(Rem, "rem", 2, Binary)                                                                       \
    X(Min, "min", 2, Binary)                                                                       \
    X(Max, "max", 2, Binary)                                                                       \
    X(And, "and", 2, Binary)                                                                       \
    X(Or, "or", 2, Binary)                                                                         \
    X(Xor, "xor", 2, Binary)                                                                       \
    X(Shl, "shl", 2, Binary)                                                                       \
    X(Shr, "shr", 2, Binary)                                                                       \
    X(Eq, "eq", 2, Compare)                                                                        \
    X(Ne, "ne", 2, Compare)                                                                        \
    X(Lt, "lt", 2, Compare)                                                                        \
    X(Le, "le", 2, Compare)                                                                        \
    X(Gt, "gt", 2, Compare)                                                                        \
    X(Ge, "ge", 2, Compare)                                                                        \
    X(Select, "select", 3, Ternary)                                                                \
    X(Cast, "cast", 1, Cast)                                                                       \
    X(Fma, "fma", 3, Ternary)                                                                      \
    X(Pow, "pow", 2, Function)                                                                     \
    X(Abs, "abs", 1, Function)                                                                     \
    X(Sqrt, "sqrt", 1, Function)                                                                   \
    X(Rsqrt, "rsqrt", 1, Function)                                                                 \
    X(Exp, "exp", 1, Function)                                                                     \
    X(Log, "log", 1, Function)                                                                     \
    X(Sin, "sin", 1, Function)                                                                     \
    X(Cos, "cos", 1, Function)                                                                     \
    X(Tanh, "tanh", 1, Function)                                                                   \
    X(Floor, "floor", 1, Function)                                                                 \
    X(Ceil, "ceil", 1, Function)                                                                   \
    X(Atomic, "atomic", 2, CrossLane)                                                              \
    X(SubgroupSum, "subgroup_sum", 1, CrossLane)                                                   \
    X(SubgroupMin, "subgroup_min", 1, CrossLane)                                                   \
    X(SubgroupMax, "subgroup_max", 1, CrossLane)                                                   \
    X(ShuffleXor, "shuffle_xor", 2, CrossLane)                                                     \
    X(Broadcast, "broadcast", 2, CrossLane)

enum class Op : uint8_t {
#define BACKPLANE_LANG_OP_ENUM(name, text, operands, family) name,
    BACKPLANE_LANG_OPS(BACKPLANE_LANG_OP_ENUM)
#undef BACKPLANE_LANG_OP_ENUM
};

/// Where a load, store or atomic goes.
enum class Space : uint8_t { Buffer, Shared, Private, Var };

/// Built-in ids, per axis (imm = builtin * 4 + axis).
enum class Builtin : uint8_t {
    LocalId, GroupId, GlobalId, GroupSize, GridSize, LocalIndex, SubgroupSize, SubgroupLane
};

enum class AtomicOp : uint8_t { Add, Min, Max, And, Or, Xor, Exchange };
enum class Access : uint8_t { Read, Write, ReadWrite };
enum class Jump : uint8_t { Break, Continue, Return };

/// One value recorded in the kernel being built: its index and the kernel it belongs to.
struct Handle {
    uint32_t id = 0;
    uint32_t kernel = 0;
};

// The recorder of the kernel being built on this thread. Each function throws
// Error(InvalidArgument) naming the kernel when called outside lang::kernel(), with a handle of
// another kernel, or against a rule of the language (a value used outside the block that made
// it, a barrier in divergent control flow...).
Handle constant(Type type, uint64_t bits);
Handle operation(Op op, Type result, Handle a, Handle b = {}, Handle c = {}, uint32_t imm = 0);
Handle unary(Op op, Handle a);                      ///< same type as a
Handle binary(Op op, Handle a, Handle b);           ///< same types; comparisons give bool
Handle builtin(Builtin which, uint32_t axis);
Handle declareScalar(Type type);
// Bindings, arrays and variables are named by a Handle too: its id indexes their own table.
Handle declareBinding(Type type, Access access);
Handle declareArray(Space space, Type type, uint32_t length);
Handle declareVar(Type type, Handle init);
Handle length(Handle binding);
Handle load(Space space, Handle target, Handle index); ///< index ignored for Space::Var
void store(Space space, Handle target, Handle index, Handle value);
Handle atomic(AtomicOp op, Space space, Handle target, Handle index, Handle value);
Handle subgroup(Op op, Handle value, Handle arg = {});
Type typeOf(Handle value);
/// Where an If statement was recorded (so that .Else finds it).
struct IfSite {
    uint32_t block = 0;
    uint32_t index = 0;
    uint32_t kernel = 0;
};
IfSite recordIf(Handle condition, const std::function<void()> &then);
/// Records the else branch of the last If of an if / else-if chain: path[0] is the chain's first
/// If, path[i + 1] the If recorded as the else branch of path[i].
void recordElse(const std::vector<IfSite> &path, const std::function<void()> &otherwise);
void recordFor(Type type, Handle begin, Handle end, Handle step,
               const std::function<void(Handle)> &body);
void recordWhile(const std::function<Handle()> &condition, const std::function<void()> &body);
void recordJump(Jump jump);
void recordBarrier();

/// Vectors (Vector below): `width` consecutive elements from `index` on, loaded as `width` Let
/// statements in a row (the parts, returned in order) or stored as `width` stores in a row.
std::vector<Handle> loadVector(Space space, Handle target, Handle index, uint32_t width);
void storeVector(Space space, Handle target, Handle index, const std::vector<Handle> &parts);
/// Asynchronous copies (copyAsync below): shared `array`[at ..] = `binding`[index ..], `width`
/// elements, zeros where `valid` is false; and the commit (wait = false) / wait of a group.
void copyAsync(Space space, Handle array, Handle at, Handle binding, Handle index, Handle valid,
               uint32_t width);
void copyFence(bool wait, uint32_t pending);

/// Matrix units (Matrix below): declare a fragment, and the statements that use one.
Handle declareMatrix(MatrixUse use, Type type, uint32_t m, uint32_t n, uint32_t k);
void matrixFill(Handle matrix, Handle value);
/// Loads (store = false) or stores a fragment from / to `space` `target` (a binding or a shared
/// array) at element `offset` with `stride` elements between rows (columns when column-major).
void matrixMemory(bool store, Handle matrix, Space space, Handle target, Handle offset,
                  Handle stride, Layout layout);
void matrixMma(Handle d, Handle a, Handle b, Handle c);

struct Module; // the recorded IR, core/src/lang/ir.hpp

} // namespace detail

template <class T> class Value;
template <class T> class Var;
template <class T> class Element;

/// Operators shared by Value, Var and Element (found by argument-dependent lookup through this
/// base; each converts its operands to Value<T>, so `x[i] * 2.0f + acc` works).
/// Value<bool>, spelled so that it depends on T (Operand<bool> is instantiated while Value<bool> is
/// still incomplete).
template <class T> using BoolOf = std::conditional_t<sizeof(T) == 0, T, Value<bool>>;

template <class T> struct Operand {
    friend Value<T> operator+(const Value<T> &a, const Value<T> &b) { return bin(detail::Op::Add, a, b); }
    friend Value<T> operator-(const Value<T> &a, const Value<T> &b) { return bin(detail::Op::Sub, a, b); }
    friend Value<T> operator*(const Value<T> &a, const Value<T> &b) { return bin(detail::Op::Mul, a, b); }
    /// Integers: truncating; x / 0 is 0 and INT_MIN / -1 is INT_MIN on every target.
    friend Value<T> operator/(const Value<T> &a, const Value<T> &b) { return bin(detail::Op::Div, a, b); }
    /// Integers only: the sign of a (C's rule); x % 0 is 0 on every target.
    friend Value<T> operator%(const Value<T> &a, const Value<T> &b) {
        static_assert(isIntegerType<T>, "% is for integers");
        return bin(detail::Op::Rem, a, b);
    }
    friend Value<T> operator&(const Value<T> &a, const Value<T> &b) { return bits(detail::Op::And, a, b); }
    friend Value<T> operator|(const Value<T> &a, const Value<T> &b) { return bits(detail::Op::Or, a, b); }
    friend Value<T> operator^(const Value<T> &a, const Value<T> &b) { return bits(detail::Op::Xor, a, b); }
    /// Shift counts are taken modulo 32 on every target.
    friend Value<T> operator<<(const Value<T> &a, const Value<T> &b) { return ints(detail::Op::Shl, a, b); }
    friend Value<T> operator>>(const Value<T> &a, const Value<T> &b) { return ints(detail::Op::Shr, a, b); }
    friend BoolOf<T> operator==(const Value<T> &a, const Value<T> &b) { return cmp(detail::Op::Eq, a, b); }
    friend BoolOf<T> operator!=(const Value<T> &a, const Value<T> &b) { return cmp(detail::Op::Ne, a, b); }
    friend BoolOf<T> operator<(const Value<T> &a, const Value<T> &b) { return cmp(detail::Op::Lt, a, b); }
    friend BoolOf<T> operator<=(const Value<T> &a, const Value<T> &b) { return cmp(detail::Op::Le, a, b); }
    friend BoolOf<T> operator>(const Value<T> &a, const Value<T> &b) { return cmp(detail::Op::Gt, a, b); }
    friend BoolOf<T> operator>=(const Value<T> &a, const Value<T> &b) { return cmp(detail::Op::Ge, a, b); }
    /// Both sides are always evaluated (the recorded code has no short circuit).
    friend Value<T> operator&&(const Value<T> &a, const Value<T> &b) { return logic(detail::Op::And, a, b); }
    friend Value<T> operator||(const Value<T> &a, const Value<T> &b) { return logic(detail::Op::Or, a, b); }
    friend Value<T> operator!(const Value<T> &a) { return logic1(detail::Op::Not, a); }
    friend Value<T> operator~(const Value<T> &a) {
        static_assert(isIntegerType<T>, "~ is for integers");
        return Value<T>::wrap(detail::unary(detail::Op::BitNot, a.handle()));
    }
    friend Value<T> operator-(const Value<T> &a) {
        static_assert(!std::is_same_v<T, bool>, "unary - is for numbers");
        return Value<T>::wrap(detail::unary(detail::Op::Neg, a.handle()));
    }

private:
    static Value<T> bin(detail::Op op, const Value<T> &a, const Value<T> &b) {
        static_assert(!std::is_same_v<T, bool>, "arithmetic is for numbers");
        return Value<T>::wrap(detail::binary(op, a.handle(), b.handle()));
    }
    static Value<T> bits(detail::Op op, const Value<T> &a, const Value<T> &b) {
        static_assert(isIntegerType<T>, "& | ^ are for integers; use && || on bool");
        return Value<T>::wrap(detail::binary(op, a.handle(), b.handle()));
    }
    static Value<T> ints(detail::Op op, const Value<T> &a, const Value<T> &b) {
        static_assert(isIntegerType<T>, "shifts are for integers");
        return Value<T>::wrap(detail::binary(op, a.handle(), b.handle()));
    }
    static Value<T> logic(detail::Op op, const Value<T> &a, const Value<T> &b) {
        static_assert(std::is_same_v<T, bool>, "&& || are for bool values");
        return Value<T>::wrap(detail::binary(op, a.handle(), b.handle()));
    }
    static Value<T> logic1(detail::Op op, const Value<T> &a) {
        static_assert(std::is_same_v<T, bool>, "! is for bool values");
        return Value<T>::wrap(detail::unary(op, a.handle()));
    }
    static BoolOf<T> cmp(detail::Op op, const Value<T> &a, const Value<T> &b) {
        return BoolOf<T>::wrap(detail::binary(op, a.handle(), b.handle()));
    }
};

/// An immutable device value of type T: the result of one recorded operation. Copying a Value
/// copies the handle, not the computation; a Value cannot be reassigned (use Var for that), so
/// `v = v + 1` inside a k.For does not compile instead of silently not accumulating.
template <class T> class Value : public Operand<T> {
    static_assert(isValueType<T>, "kernel values are bool, 8- to 64-bit integers, f16, bf16, "
                                  "float or double");

public:
    /// A constant: recorded as a literal.
    Value(T constant) : handle_(detail::constant(typeOf<T>(), bitsOf(constant))) {}
    Value(const Var<T> &var);         ///< the variable's value at this point
    Value(const Element<T> &element); ///< a load, at this point
    Value(const Value &) = default;
    Value &operator=(const Value &) = delete;

    detail::Handle handle() const noexcept { return handle_; }
    static Value wrap(detail::Handle h) { return Value(h, 0); }

private:
    Value(detail::Handle h, int) : handle_(h) {}
    static uint64_t bitsOf(T c) {
        if constexpr (std::is_same_v<T, bool>) return c ? 1u : 0u;
        else if constexpr (std::is_same_v<T, f16> || std::is_same_v<T, bf16>) return c.bits;
        else if constexpr (sizeof(T) == 8) {
            uint64_t bits;
            std::memcpy(&bits, &c, sizeof(bits));
            return bits;
        } else {
            // Integers keep their value's bits in the low sizeof(T) bytes (sign-extended to 32
            // for signed types, as the IR keeps narrow values); float its own 32 bits.
            if constexpr (std::is_integral_v<T>)
                return static_cast<uint32_t>(static_cast<std::conditional_t<
                                                 std::is_signed_v<T>, int32_t, uint32_t>>(c));
            uint32_t bits;
            std::memcpy(&bits, &c, sizeof(bits));
            return bits;
        }
    }
    detail::Handle handle_;
};

/// A mutable device variable, one per thread. Assigning records a store; reading (conversion to
/// Value) records a load at that point. `Var b = a` copies the handle (both name one variable);
/// use k.var(a) for a new variable.
template <class T> class Var : public Operand<T> {
public:
    const Var &operator=(const Value<T> &v) const {
        detail::store(detail::Space::Var, id_, {}, v.handle());
        return *this;
    }
    const Var &operator=(const Var &other) const { return *this = Value<T>(other); }
    Var(const Var &) = default;
    const Var &operator+=(const Value<T> &v) const { return *this = *this + v; }
    const Var &operator-=(const Value<T> &v) const { return *this = *this - v; }
    const Var &operator*=(const Value<T> &v) const { return *this = *this * v; }
    const Var &operator/=(const Value<T> &v) const { return *this = *this / v; }
    detail::Handle id() const noexcept { return id_; }
    static Var wrap(detail::Handle id) { return Var(id); }

private:
    explicit Var(detail::Handle id) : id_(id) {}
    detail::Handle id_;
};

/// One element of a buffer, shared array or private array: an lvalue. Reading records a load,
/// assigning a store.
template <class T> class Element : public Operand<T> {
public:
    Element(detail::Space space, detail::Handle target, Value<uint32_t> index)
        : space_(space), target_(target), index_(index.handle()) {}
    const Element &operator=(const Value<T> &v) const {
        detail::store(space_, target_, index_, v.handle());
        return *this;
    }
    const Element &operator=(const Element &other) const { return *this = Value<T>(other); }
    Element(const Element &) = default;
    const Element &operator+=(const Value<T> &v) const { return *this = *this + v; }
    const Element &operator-=(const Value<T> &v) const { return *this = *this - v; }
    const Element &operator*=(const Value<T> &v) const { return *this = *this * v; }

    detail::Space space() const noexcept { return space_; }
    detail::Handle target() const noexcept { return target_; }
    detail::Handle index() const noexcept { return index_; }

private:
    detail::Space space_;
    detail::Handle target_;
    detail::Handle index_;
};

template <class T>
Value<T>::Value(const Var<T> &var)
    : handle_(detail::load(detail::Space::Var, var.id(), {})) {}
template <class T>
Value<T>::Value(const Element<T> &e) : handle_(detail::load(e.space(), e.target(), e.index())) {}

/// A buffer binding (binding i is the kernel's i-th declared buffer, Dispatch::bindings[i]).
template <class T> class Binding {
    static_assert(isElementType<T>, "buffers hold 8- to 64-bit integers, f16, bf16, float or "
                                    "double");

public:
    Element<T> operator[](const Value<uint32_t> &index) const {
        return Element<T>(detail::Space::Buffer, id_, index);
    }
    /// Elements in the bound buffer (or view): its size in bytes / sizeof(T).
    Value<uint32_t> length() const { return Value<uint32_t>::wrap(detail::length(id_)); }
    detail::Handle id() const noexcept { return id_; }
    static Binding wrap(detail::Handle id) { return Binding(id); }

private:
    explicit Binding(detail::Handle id) : id_(id) {}
    detail::Handle id_;
};

/// A fixed-size array in workgroup-shared or per-thread memory. Its contents start undefined.
template <class T> class Array {
    static_assert(isElementType<T>, "arrays hold 8- to 64-bit integers, f16, bf16, float or "
                                    "double");

public:
    Element<T> operator[](const Value<uint32_t> &index) const { return Element<T>(space_, id_, index); }
    uint32_t size() const noexcept { return size_; }
    detail::Space space() const noexcept { return space_; }
    detail::Handle id() const noexcept { return id_; }
    static Array wrap(detail::Space space, detail::Handle id, uint32_t size) { return Array(space, id, size); }

private:
    Array(detail::Space space, detail::Handle id, uint32_t size) : space_(space), id_(id), size_(size) {}
    detail::Space space_;
    detail::Handle id_;
    uint32_t size_;
};

/// N consecutive elements of a buffer or array as one value: loadVector / storeVector move
/// them with one memory operation where the target has them (CUDA and HIP: up to 16 bytes, e.g.
/// 8 bf16 or 4 float), which is what makes a kernel reach the memory bandwidth. N is 2, 4 or 8
/// and N * sizeof(T) at most 16. The first element's index must be a multiple of N: a constant
/// one that is not is refused at recording; one known only at run time, or a binding that is a
/// view at an unaligned offset, makes the access element by element (defined, slower). Checked
/// kernels check each element. Arithmetic is element-wise. DeviceInfo::features.vectorWidths
/// says which N a device takes; execute() refuses the others.
template <class T, uint32_t N> class Vector {
    static_assert(N == 2 || N == 4 || N == 8, "vectors have 2, 4 or 8 elements");
    static_assert(isElementType<T> && N * sizeof(T) <= 16, "vectors are at most 16 bytes");

public:
    /// Throws Error(InvalidArgument) unless there are N parts.
    explicit Vector(std::vector<Value<T>> parts) : parts_(std::move(parts)) {
        if (parts_.size() != N)
            throw Error(ErrorCode::InvalidArgument,
                        "a lang::Vector of " + std::to_string(N) + " elements built from " +
                            std::to_string(parts_.size()) + " values");
    }
    /// N copies of one value.
    explicit Vector(const Value<T> &all) : parts_(N, all) {}
    static constexpr uint32_t size() { return N; }
    const Value<T> &operator[](uint32_t i) const { return parts_.at(i); }
    const std::vector<Value<T>> &parts() const noexcept { return parts_; }

    friend Vector operator+(const Vector &a, const Vector &b) { return zip(a, b, [](auto x, auto y) { return x + y; }); }
    friend Vector operator-(const Vector &a, const Vector &b) { return zip(a, b, [](auto x, auto y) { return x - y; }); }
    friend Vector operator*(const Vector &a, const Vector &b) { return zip(a, b, [](auto x, auto y) { return x * y; }); }
    friend Vector operator/(const Vector &a, const Vector &b) { return zip(a, b, [](auto x, auto y) { return x / y; }); }
    friend Vector operator*(const Vector &a, const Value<T> &s) { return a * Vector(s); }
    friend Vector operator*(const Value<T> &s, const Vector &a) { return Vector(s) * a; }
    friend Vector operator+(const Vector &a, const Value<T> &s) { return a + Vector(s); }

private:
    template <class F> static Vector zip(const Vector &a, const Vector &b, F f) {
        std::vector<Value<T>> out;
        for (uint32_t i = 0; i < N; ++i) out.push_back(f(a.parts_[i], b.parts_[i]));
        return Vector(std::move(out));
    }
    std::vector<Value<T>> parts_;
};

namespace detail {
template <class T, uint32_t N>
Vector<T, N> wrapVector(const std::vector<Handle> &handles) {
    std::vector<Value<T>> parts;
    for (Handle h : handles) parts.push_back(Value<T>::wrap(h));
    return Vector<T, N>(std::move(parts));
}
template <class T, uint32_t N> std::vector<Handle> handlesOf(const Vector<T, N> &v) {
    std::vector<Handle> handles;
    for (const Value<T> &p : v.parts()) handles.push_back(p.handle());
    return handles;
}
} // namespace detail

/// Elements index .. index + N - 1 of a buffer or shared / private array.
template <uint32_t N, class T> Vector<T, N> loadVector(const Binding<T> &from, const Value<uint32_t> &index) {
    return detail::wrapVector<T, N>(detail::loadVector(detail::Space::Buffer, from.id(), index.handle(), N));
}
template <uint32_t N, class T> Vector<T, N> loadVector(const Array<T> &from, const Value<uint32_t> &index) {
    return detail::wrapVector<T, N>(detail::loadVector(from.space(), from.id(), index.handle(), N));
}
template <class T, uint32_t N>
void storeVector(const Binding<T> &to, const Value<uint32_t> &index, const Vector<T, N> &v) {
    detail::storeVector(detail::Space::Buffer, to.id(), index.handle(), detail::handlesOf(v));
}
template <class T, uint32_t N>
void storeVector(const Array<T> &to, const Value<uint32_t> &index, const Vector<T, N> &v) {
    detail::storeVector(to.space(), to.id(), index.handle(), detail::handlesOf(v));
}

/// Starts copying elements index .. index + N - 1 of `from` into elements at .. at + N - 1 of the
/// shared array `to` (zeros instead where `valid` is false), the way a pipelined kernel stages
/// the next tiles while it computes on the current ones. The copy is done for this thread after
/// k.commitCopies() and k.waitCopies(n) have let its group complete, and for the workgroup after
/// the barrier that follows; reading or writing those elements of `to` before then is a race.
/// On CUDA (compute capability 8.0 and up) a copy of 4, 8 or 16 bytes is one cp.async that
/// bypasses the registers; elsewhere, and where an address is not aligned to the copy's size or
/// the kernel is checked, it is an ordinary vector load and store that completes at once (the
/// same result). N and the index rules are those of loadVector / storeVector.
template <uint32_t N, class T>
void copyAsync(const Array<T> &to, const Value<uint32_t> &at, const Binding<T> &from,
               const Value<uint32_t> &index, const Value<bool> &valid = Value<bool>(true)) {
    detail::copyAsync(to.space(), to.id(), at.handle(), from.id(), index.handle(), valid.handle(), N);
}

/// The part a matrix fragment plays in D = A * B + C on the matrix units.
enum class MatrixUse : uint8_t { A, B, Accumulator };

/// How a matrix lies in memory: element (row, col) at offset + row * stride + col (RowMajor) or
/// at offset + col * stride + row (ColMajor).
enum class Layout : uint8_t { RowMajor, ColMajor };

/// The shape of one multiply-accumulate of the matrix units: D (m x n) = A (m x k) * B (k x n) + C.
/// The language has two: {16, 16, 16} with f16 or bf16 inputs and {16, 16, 8} with f32 inputs
/// (rounded to tf32, 10 mantissa bits, nearest with ties away from zero), both with f32
/// accumulators. Which a device runs is in DeviceInfo::features.matrixShapes.
struct MatrixTile {
    uint32_t m = 16, n = 16, k = 16;
    friend bool operator==(const MatrixTile &, const MatrixTile &) = default;
};

/// A fragment of a matrix held by the matrix units: an A or B input or an accumulator, of one
/// MatrixTile shape. A fragment belongs to a subgroup (a warp on CUDA; on the host, where a
/// subgroup is one thread, to each thread): every thread of the subgroup runs each operation on
/// it together with the same arguments, so the operations are only allowed in uniform control
/// flow (like barrier()), and threads of one subgroup must pass the same offsets and strides.
/// Split the work of a workgroup by subgroup: k.localIndex() / k.subgroupSize().
///
/// load and store move rows x cols elements (A: m x k, B: k x n, accumulator: m x n) between
/// the fragment and a buffer or a shared array. Offsets and strides are in elements; multiples
/// of 8 are fastest (CUDA loads shared memory with ldmatrix) and Vulkan requires them (others are
/// refused when constant and undefined otherwise). Checked kernels (KernelOptions::checked): a
/// load that reaches past the buffer or array loads zeros, a store writes nothing.
template <class T, MatrixUse U> class Matrix {
public:
    /// Every element := value.
    void fill(const Value<T> &value) const { detail::matrixFill(id_, value.handle()); }
    void load(const Binding<T> &source, const Value<uint32_t> &offset, const Value<uint32_t> &stride,
              Layout layout = Layout::RowMajor) const {
        detail::matrixMemory(false, id_, detail::Space::Buffer, source.id(), offset.handle(), stride.handle(), layout);
    }
    void load(const Array<T> &source, const Value<uint32_t> &offset, const Value<uint32_t> &stride,
              Layout layout = Layout::RowMajor) const {
        detail::matrixMemory(false, id_, source.space(), source.id(), offset.handle(), stride.handle(), layout);
    }
    /// Accumulators only.
    void store(const Binding<T> &target, const Value<uint32_t> &offset, const Value<uint32_t> &stride,
               Layout layout = Layout::RowMajor) const {
        static_assert(U == MatrixUse::Accumulator, "only accumulators are stored");
        detail::matrixMemory(true, id_, detail::Space::Buffer, target.id(), offset.handle(), stride.handle(), layout);
    }
    void store(const Array<T> &target, const Value<uint32_t> &offset, const Value<uint32_t> &stride,
               Layout layout = Layout::RowMajor) const {
        static_assert(U == MatrixUse::Accumulator, "only accumulators are stored");
        detail::matrixMemory(true, id_, target.space(), target.id(), offset.handle(), stride.handle(), layout);
    }
    MatrixTile tile() const noexcept { return tile_; }
    detail::Handle id() const noexcept { return id_; }
    static Matrix wrap(detail::Handle id, MatrixTile tile) { return Matrix(id, tile); }

private:
    Matrix(detail::Handle id, MatrixTile tile) : id_(id), tile_(tile) {}
    detail::Handle id_;
    MatrixTile tile_;
};

/// d = a * b + c on the matrix units (d may be c). The products of the rounded inputs are exact
/// and summed in f32: the host sums them in double and rounds once (exact unless the terms
/// span more exponents than a double holds); GPUs may round partial sums.
template <class In, class Acc>
void mma(const Matrix<Acc, MatrixUse::Accumulator> &d, const Matrix<In, MatrixUse::A> &a,
         const Matrix<In, MatrixUse::B> &b, const Matrix<Acc, MatrixUse::Accumulator> &c) {
    detail::matrixMma(d.id(), a.id(), b.id(), c.id());
}

/// Three u32 device values (an id or a size per axis).
struct Dim3 {
    Value<uint32_t> x, y, z;
};

/// What a kernel body records with. Only valid inside the lang::kernel() call that passed it.
class Builder {
public:
    // -- signature, in declaration order ---------------------------------------------------------
    template <class T> Binding<T> input() { return Binding<T>::wrap(detail::declareBinding(typeOf<T>(), detail::Access::Read)); }
    template <class T> Binding<T> output() { return Binding<T>::wrap(detail::declareBinding(typeOf<T>(), detail::Access::Write)); }
    template <class T> Binding<T> inout() { return Binding<T>::wrap(detail::declareBinding(typeOf<T>(), detail::Access::ReadWrite)); }
    /// The next field of the scalar struct (packed like Dispatch::scalar: natural alignment).
    template <class T> Value<T> scalar() {
        static_assert(isElementType<T>, "scalars are numbers");
        return Value<T>::wrap(detail::declareScalar(typeOf<T>()));
    }

    // -- ids and sizes ---------------------------------------------------------------------------
    Dim3 localId() { return dim(detail::Builtin::LocalId); }
    Dim3 groupId() { return dim(detail::Builtin::GroupId); }
    Dim3 globalId() { return dim(detail::Builtin::GlobalId); }
    Dim3 groupSize() { return dim(detail::Builtin::GroupSize); } ///< Dispatch::block
    Dim3 gridSize() { return dim(detail::Builtin::GridSize); }   ///< Dispatch::grid
    /// The thread's index within its workgroup, x fastest.
    Value<uint32_t> localIndex() { return one(detail::Builtin::LocalIndex); }
    /// The device's subgroup width (DeviceInfo::subgroupSize: 32 on NVIDIA, 1 on the host).
    Value<uint32_t> subgroupSize() { return one(detail::Builtin::SubgroupSize); }
    Value<uint32_t> subgroupLane() { return one(detail::Builtin::SubgroupLane); }

    // -- memory ----------------------------------------------------------------------------------
    /// A new variable initialised to `init`.
    template <class T> Var<T> var(const Value<T> &init) {
        return Var<T>::wrap(detail::declareVar(typeOf<T>(), init.handle()));
    }
    template <class T>
        requires isValueType<T>
    Var<T> var(T init) {
        return var(Value<T>(init));
    }
    /// `length` elements shared by the workgroup (length is a compile-time constant).
    template <class T> Array<T> shared(uint32_t length) {
        return Array<T>::wrap(detail::Space::Shared, detail::declareArray(detail::Space::Shared, typeOf<T>(), length), length);
    }
    /// `length` elements private to each thread.
    template <class T> Array<T> array(uint32_t length) {
        return Array<T>::wrap(detail::Space::Private, detail::declareArray(detail::Space::Private, typeOf<T>(), length), length);
    }

    /// A matrix-unit fragment (see Matrix): its contents start undefined.
    template <class T> Matrix<T, MatrixUse::A> matrixA(MatrixTile tile = {}) { return matrix<T, MatrixUse::A>(tile); }
    template <class T> Matrix<T, MatrixUse::B> matrixB(MatrixTile tile = {}) { return matrix<T, MatrixUse::B>(tile); }
    template <class T> Matrix<T, MatrixUse::Accumulator> accumulator(MatrixTile tile = {}) {
        return matrix<T, MatrixUse::Accumulator>(tile);
    }
    template <class T, MatrixUse U> Matrix<T, U> matrix(MatrixTile tile) {
        static_assert(isFloatType<T>, "matrix fragments hold f16, bf16 or float");
        return Matrix<T, U>::wrap(detail::declareMatrix(U, typeOf<T>(),
                                                        tile.m, tile.n, tile.k),
                                  tile);
    }

    // -- control flow ----------------------------------------------------------------------------
    /// Records `then` under `condition`; chain .Else / .ElseIf right after.
    class IfChain {
    public:
        explicit IfChain(detail::IfSite site) : path_{site} {}
        /// The branch taken when no condition of the chain held. Must follow directly.
        IfChain &Else(const std::function<void()> &otherwise) {
            detail::recordElse(path_, otherwise);
            return *this;
        }
        /// `condition` is a function so that it is recorded inside the else branch (a Value
        /// argument would be computed after the If it belongs to).
        IfChain &ElseIf(const std::function<Value<bool>()> &condition, const std::function<void()> &then) {
            detail::IfSite inner;
            detail::recordElse(path_, [&] { inner = detail::recordIf(condition().handle(), then); });
            path_.push_back(inner);
            return *this;
        }

    private:
        std::vector<detail::IfSite> path_;
    };
    IfChain If(const Value<bool> &condition, const std::function<void()> &then) {
        return IfChain(detail::recordIf(condition.handle(), then));
    }
    /// for (i = begin; i < end; i += step) body(i). T is uint32_t or int32_t.
    template <class T = uint32_t>
    void For(const std::type_identity_t<Value<T>> &begin, const std::type_identity_t<Value<T>> &end,
             const std::type_identity_t<Value<T>> &step,
             const std::type_identity_t<std::function<void(Value<T>)>> &body) {
        static_assert(std::is_same_v<T, uint32_t> || std::is_same_v<T, int32_t>, "loop indices are integers");
        detail::recordFor(typeOf<T>(), begin.handle(), end.handle(), step.handle(),
                          [&](detail::Handle i) { body(Value<T>::wrap(i)); });
    }
    template <class T = uint32_t>
    void For(const std::type_identity_t<Value<T>> &begin, const std::type_identity_t<Value<T>> &end,
             const std::type_identity_t<std::function<void(Value<T>)>> &body) {
        For<T>(begin, end, Value<T>(T(1)), body);
    }
    /// while (condition()) body(); `condition` is recorded once and evaluated before each pass.
    void While(const std::function<Value<bool>()> &condition, const std::function<void()> &body) {
        detail::recordWhile([&] { return condition().handle(); }, body);
    }
    void Break() { detail::recordJump(detail::Jump::Break); }
    void Continue() { detail::recordJump(detail::Jump::Continue); }
    /// Ends this thread's kernel.
    void Return() { detail::recordJump(detail::Jump::Return); }
    /// Workgroup barrier with shared-memory ordering. Only in uniform control flow: under
    /// conditions and loops whose values are the same for every thread of the workgroup (built
    /// from constants, scalars, group ids and sizes); anything else is refused at recording.
    void barrier() { detail::recordBarrier(); }
    /// Closes this thread's group of copyAsync() copies issued since the last commit (an empty
    /// group is fine: pipelines commit once per step, copies or not).
    void commitCopies() { detail::copyFence(false, 0); }
    /// Waits until at most `pending` of this thread's committed groups are still in flight: the
    /// older groups' copies are then in shared memory for this thread, and for the whole
    /// workgroup after the barrier() that must follow.
    void waitCopies(uint32_t pending = 0) { detail::copyFence(true, pending); }

private:
    static Dim3 dim(detail::Builtin b) {
        return {Value<uint32_t>::wrap(detail::builtin(b, 0)), Value<uint32_t>::wrap(detail::builtin(b, 1)),
                Value<uint32_t>::wrap(detail::builtin(b, 2))};
    }
    static Value<uint32_t> one(detail::Builtin b) { return Value<uint32_t>::wrap(detail::builtin(b, 0)); }
};

// -- functions --------------------------------------------------------------------------------

/// The value type of a Value, Var or Element (no type for anything else, so these functions
/// never capture plain C++ arguments).
template <class X> struct OperandType {};
template <class T> struct OperandType<Value<T>> { using type = T; };
template <class T> struct OperandType<Var<T>> { using type = T; };
template <class T> struct OperandType<Element<T>> { using type = T; };
template <class X> using OperandOf = typename OperandType<X>::type;

/// Converts between value types: float to integer truncates toward zero and saturates (NaN gives
/// 0), integer to integer wraps (keeps the low bits, like C), float to a narrower float rounds
/// to nearest even, bool gives 0 or 1, to bool compares with 0.
template <class To, class X, class From = OperandOf<X>> Value<To> cast(const X &v) {
    return Value<To>::wrap(detail::operation(detail::Op::Cast, typeOf<To>(), Value<From>(v).handle()));
}

/// condition ? a : b (both evaluated).
template <class X, class T = OperandOf<X>>
Value<T> select(const Value<bool> &condition, const X &a, const std::type_identity_t<Value<T>> &b) {
    return Value<T>::wrap(detail::operation(detail::Op::Select, typeOf<T>(), condition.handle(),
                                            Value<T>(a).handle(), b.handle()));
}

namespace detail {
template <class T> Value<T> apply(Op op, const Value<T> &a) { return Value<T>::wrap(unary(op, a.handle())); }
template <class T> Value<T> apply(Op op, const Value<T> &a, const Value<T> &b) {
    return Value<T>::wrap(binary(op, a.handle(), b.handle()));
}
} // namespace detail

/// min / max: on floats a NaN operand is ignored (fminf) on CUDA, HIP and the host; GLSL leaves
/// it undefined.
template <class X, class T = OperandOf<X>> Value<T> min(const X &a, const std::type_identity_t<Value<T>> &b) { return detail::apply<T>(detail::Op::Min, a, b); }
template <class X, class T = OperandOf<X>> Value<T> max(const X &a, const std::type_identity_t<Value<T>> &b) { return detail::apply<T>(detail::Op::Max, a, b); }
template <class X, class T = OperandOf<X>> Value<T> pow(const X &a, const std::type_identity_t<Value<T>> &b) { return detail::apply<T>(detail::Op::Pow, a, b); }
template <class X, class T = OperandOf<X>> Value<T> clamp(const X &v, const std::type_identity_t<Value<T>> &lo, const std::type_identity_t<Value<T>> &hi) {
    return min(max(v, lo), hi);
}
template <class X, class T = OperandOf<X>> Value<T> abs(const X &a) { return detail::apply<T>(detail::Op::Abs, a); }
/// Float functions; precision is each target's (CUDA's libdevice, GLSL's precision table).
template <class X, class T = OperandOf<X>> Value<T> sqrt(const X &a) { return detail::apply<T>(detail::Op::Sqrt, a); }
template <class X, class T = OperandOf<X>> Value<T> rsqrt(const X &a) { return detail::apply<T>(detail::Op::Rsqrt, a); }
template <class X, class T = OperandOf<X>> Value<T> exp(const X &a) { return detail::apply<T>(detail::Op::Exp, a); }
template <class X, class T = OperandOf<X>> Value<T> log(const X &a) { return detail::apply<T>(detail::Op::Log, a); }
template <class X, class T = OperandOf<X>> Value<T> sin(const X &a) { return detail::apply<T>(detail::Op::Sin, a); }
template <class X, class T = OperandOf<X>> Value<T> cos(const X &a) { return detail::apply<T>(detail::Op::Cos, a); }
template <class X, class T = OperandOf<X>> Value<T> tanh(const X &a) { return detail::apply<T>(detail::Op::Tanh, a); }
template <class X, class T = OperandOf<X>> Value<T> floor(const X &a) { return detail::apply<T>(detail::Op::Floor, a); }
template <class X, class T = OperandOf<X>> Value<T> ceil(const X &a) { return detail::apply<T>(detail::Op::Ceil, a); }
/// Subgroup operations: every thread of the workgroup must reach them (uniform control flow, like
/// barrier()), and the workgroup should be a whole number of subgroups (Builder::subgroupSize()).
template <class X, class T = OperandOf<X>> Value<T> subgroupSum(const X &a) { return detail::apply<T>(detail::Op::SubgroupSum, a); }
template <class X, class T = OperandOf<X>> Value<T> subgroupMin(const X &a) { return detail::apply<T>(detail::Op::SubgroupMin, a); }
template <class X, class T = OperandOf<X>> Value<T> subgroupMax(const X &a) { return detail::apply<T>(detail::Op::SubgroupMax, a); }

/// a * b + c rounded once on CUDA, HIP and the host; Vulkan only promises the precision of a
/// multiply and an add. (a * b + c written out is two roundings on every target.)
inline Value<float> fma(const Value<float> &a, const Value<float> &b, const Value<float> &c) {
    return Value<float>::wrap(detail::operation(detail::Op::Fma, Type::F32, a.handle(), b.handle(), c.handle()));
}
inline Value<double> fma(const Value<double> &a, const Value<double> &b, const Value<double> &c) {
    return Value<double>::wrap(detail::operation(detail::Op::Fma, Type::F64, a.handle(), b.handle(), c.handle()));
}
/// The value of the lane whose index is this lane's XOR `mask`.
template <class X, class T = OperandOf<X>> Value<T> shuffleXor(const X &v, const Value<uint32_t> &mask) {
    return Value<T>::wrap(detail::subgroup(detail::Op::ShuffleXor, Value<T>(v).handle(), mask.handle()));
}
/// The value of lane `lane` (uniform across the subgroup) in every lane.
template <class X, class T = OperandOf<X>> Value<T> broadcast(const X &v, const Value<uint32_t> &lane) {
    return Value<T>::wrap(detail::subgroup(detail::Op::Broadcast, Value<T>(v).handle(), lane.handle()));
}

#define BACKPLANE_LANG_ATOMIC(name, op)                                                                   \
    /** Atomically combines `value` into the element; returns the element's previous value. */          \
    template <class T> Value<T> name(const Element<T> &e, const std::type_identity_t<Value<T>> &value) {  \
        static_assert(isIntegerType<T> || std::is_same_v<T, float>, "atomics are on integers (add: float too)"); \
        return Value<T>::wrap(detail::atomic(detail::AtomicOp::op, e.space(), e.target(), e.index(), value.handle())); \
    }
BACKPLANE_LANG_ATOMIC(atomicAdd, Add)
BACKPLANE_LANG_ATOMIC(atomicMin, Min)
BACKPLANE_LANG_ATOMIC(atomicMax, Max)
BACKPLANE_LANG_ATOMIC(atomicAnd, And)
BACKPLANE_LANG_ATOMIC(atomicOr, Or)
BACKPLANE_LANG_ATOMIC(atomicXor, Xor)
BACKPLANE_LANG_ATOMIC(atomicExchange, Exchange)
#undef BACKPLANE_LANG_ATOMIC

// -- the kernel -------------------------------------------------------------------------------

/// A recorded kernel and its generated variants. Plain value; copies share the IR.
class Kernel {
public:
    Kernel() = default;
    const std::string &name() const noexcept { return source_.name; }
    /// The variants: CUDA, HIP, GLSL text, C++ for the host's compiler (when the host generator
    /// can print the kernel) and the host interpreter (KernelVariant::hostData), in that order;
    /// ComputeClient::execute hands each device the first one it accepts.
    const KernelSource &source() const noexcept { return source_; }
    /// The generated text of one dialect; for Dialect::Host a listing of the IR the interpreter
    /// runs. Throws Error(Unsupported) for SPIR-V, and for C++ when the kernel has none.
    std::string text(Dialect dialect) const;
    /// Buffer bindings the kernel declares, and the size of its scalar struct as the caller packs
    /// it (Dispatch::scalar in declaration order).
    uint32_t bindingCount() const noexcept;
    uint32_t scalarBytes() const noexcept;
    /// The scalar bytes the generated code reads: `dispatch`'s scalars followed by the element
    /// count of every buffer the kernel asks for length() of (or of all when checked). Throws
    /// Error(InvalidArgument) naming the kernel when the dispatch's bindings or scalar size do not
    /// match the signature, or a buffer is not a whole number of elements.
    Dispatch prepare(const Dispatch &dispatch) const;
    /// What the kernel uses that `features` (a device's DeviceInfo::features) lacks, as "f64
    /// arithmetic", "f16 buffers", "u64 atomicAdd"...; "" when the device can run it.
    /// ComputeClient::execute refuses such a kernel with Error(Unsupported) naming it.
    std::string missingOn(const KernelFeatures &features) const;
    /// How `device` (a host device) runs the kernel: "compiled by <compiler>", or "interpreted:
    /// <why>" (no compiler found, the compiler switched off, or what the host generator cannot
    /// compile yet); "" on devices that take a GPU dialect.
    std::string hostNote(const DeviceInfo &device) const;
    const detail::Module &module() const;

private:
    friend Kernel kernel(std::string name, const std::function<void(Builder &)> &body,
                         KernelOptions options);
    std::shared_ptr<const detail::Module> module_;
    KernelSource source_;
};

/// Records `body` and generates the kernel's variants. `name` names the kernel in errors, logs and
/// caches and, made an identifier, the CUDA/HIP entry point. Throws Error(InvalidArgument) naming
/// the kernel when the body breaks a rule of the language.
Kernel kernel(std::string name, const std::function<void(Builder &)> &body, KernelOptions options = {});

} // namespace backplane::lang
