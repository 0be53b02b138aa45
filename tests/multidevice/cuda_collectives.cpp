// The CUDA plugin's collectives (NCCL) and peer access on every GPU of the machine, in one
// process, through the public RawPlugin and the C table. Exits 77 (SKIP) with the reason when
// there is no CUDA driver or device, fewer than 2 GPUs, or no usable NCCL (point
// BACKPLANE_NCCL_LIBRARY at libnccl.so.2 when it is not on the loader's path); fails otherwise.
#define DOCTEST_CONFIG_IMPLEMENT
#include "../test_skip.hpp"

#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

using backplane::RawPlugin;

namespace {

std::string manifestPath() {
    const char *env = std::getenv("BACKPLANE_TEST_CUDA_MANIFEST");
    return env != nullptr && *env != '\0' ? env : CUDA_PLUGIN_MANIFEST;
}

bool isPowerOfTwo(uint32_t n) { return n != 0 && (n & (n - 1)) == 0; }

// --- element types ------------------------------------------------------------------------------

struct TypeInfo {
    bp_data_type type;
    const char *name;
    size_t size;
    bool floating;
};

const TypeInfo kI8{BP_DATA_I8, "i8", 1, false};
const TypeInfo kU8{BP_DATA_U8, "u8", 1, false};
const TypeInfo kI32{BP_DATA_I32, "i32", 4, false};
const TypeInfo kU32{BP_DATA_U32, "u32", 4, false};
const TypeInfo kI64{BP_DATA_I64, "i64", 8, false};
const TypeInfo kU64{BP_DATA_U64, "u64", 8, false};
const TypeInfo kF16{BP_DATA_F16, "f16", 2, true};
const TypeInfo kBF16{BP_DATA_BF16, "bf16", 2, true};
const TypeInfo kF32{BP_DATA_F32, "f32", 4, true};
const TypeInfo kF64{BP_DATA_F64, "f64", 8, true};
const TypeInfo kAllTypes[] = {kI8, kU8, kI32, kU32, kI64, kU64, kF16, kBF16, kF32, kF64};

// IEEE half from a float, round to nearest even; the values used here are normal numbers.
uint16_t toHalf(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint32_t sign = (bits >> 16) & 0x8000u;
    if ((bits & 0x7fffffffu) == 0) return static_cast<uint16_t>(sign);
    const int exponent = static_cast<int>((bits >> 23) & 0xffu) - 127 + 15;
    REQUIRE(exponent > 0);
    REQUIRE(exponent < 31);
    const uint32_t mantissa = bits & 0x7fffffu;
    uint32_t half = sign | (static_cast<uint32_t>(exponent) << 10) | (mantissa >> 13);
    const uint32_t rest = mantissa & 0x1fffu;
    if (rest > 0x1000u || (rest == 0x1000u && (half & 1u) != 0)) ++half;
    return static_cast<uint16_t>(half);
}

double fromHalf(uint16_t half) {
    const double sign = (half & 0x8000u) != 0 ? -1.0 : 1.0;
    const int exponent = (half >> 10) & 0x1f;
    const double mantissa = half & 0x3ffu;
    if (exponent == 0) return sign * std::ldexp(mantissa, -24);
    if (exponent == 31) return mantissa == 0 ? sign * INFINITY : NAN;
    return sign * std::ldexp(1024.0 + mantissa, exponent - 25);
}

uint16_t toBfloat(float value) {
    uint32_t bits;
    std::memcpy(&bits, &value, 4);
    const uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
    return static_cast<uint16_t>((bits + rounding) >> 16);
}

double fromBfloat(uint16_t value) {
    const uint32_t bits = static_cast<uint32_t>(value) << 16;
    float f;
    std::memcpy(&f, &bits, 4);
    return f;
}

template <class T> void store(unsigned char *out, T value) {
    std::memcpy(out, &value, sizeof value);
}
template <class T> T load(const unsigned char *in) {
    T value;
    std::memcpy(&value, in, sizeof value);
    return value;
}

void encode(const TypeInfo &t, double value, unsigned char *out) {
    switch (t.type) {
    case BP_DATA_I8:
        store(out, static_cast<int8_t>(value));
        break;
    case BP_DATA_U8:
        store(out, static_cast<uint8_t>(value));
        break;
    case BP_DATA_I32:
        store(out, static_cast<int32_t>(value));
        break;
    case BP_DATA_U32:
        store(out, static_cast<uint32_t>(value));
        break;
    case BP_DATA_I64:
        store(out, static_cast<int64_t>(value));
        break;
    case BP_DATA_U64:
        store(out, static_cast<uint64_t>(value));
        break;
    case BP_DATA_F16:
        store(out, toHalf(static_cast<float>(value)));
        break;
    case BP_DATA_BF16:
        store(out, toBfloat(static_cast<float>(value)));
        break;
    case BP_DATA_F32:
        store(out, static_cast<float>(value));
        break;
    case BP_DATA_F64:
        store(out, value);
        break;
    }
}

double decode(const TypeInfo &t, const unsigned char *in) {
    switch (t.type) {
    case BP_DATA_I8:
        return load<int8_t>(in);
    case BP_DATA_U8:
        return load<uint8_t>(in);
    case BP_DATA_I32:
        return load<int32_t>(in);
    case BP_DATA_U32:
        return load<uint32_t>(in);
    case BP_DATA_I64:
        return static_cast<double>(load<int64_t>(in));
    case BP_DATA_U64:
        return static_cast<double>(load<uint64_t>(in));
    case BP_DATA_F16:
        return fromHalf(load<uint16_t>(in));
    case BP_DATA_BF16:
        return fromBfloat(load<uint16_t>(in));
    case BP_DATA_F32:
        return load<float>(in);
    case BP_DATA_F64:
        return load<double>(in);
    }
    return NAN;
}

std::vector<unsigned char> encodeAll(const TypeInfo &t, const std::vector<double> &values) {
    std::vector<unsigned char> bytes(values.size() * t.size);
    for (size_t i = 0; i < values.size(); ++i)
        encode(t, values[i], bytes.data() + i * t.size);
    return bytes;
}

// --- the machine
// ----------------------------------------------------------------------------------

std::string statusText(bp_status status, const bp_error &error) {
    return std::string(backplane::toString(status)) + ": " + backplane::errorMessage(error);
}

#define REQUIRE_OK(call)                                                                           \
    do {                                                                                           \
        bp_error error_ = backplane::makeError();                                                  \
        bp_error *error = &error_;                                                                 \
        const bp_status status_ = (call);                                                          \
        INFO(#call << " -> " << statusText(status_, error_));                                      \
        REQUIRE(status_ == BP_SUCCESS);                                                            \
        (void)error;                                                                               \
    } while (false)

/// The plugin and every GPU opened, one stream each.
class Machine {
public:
    explicit Machine(RawPlugin plugin, uint32_t count) : plugin_(std::move(plugin)) {
        const auto &t = api();
        for (uint32_t i = 0; i < count; ++i) {
            bp_device_open_args open{};
            open.struct_size = sizeof open;
            bp_device *device = nullptr;
            bp_error error = backplane::makeError();
            if (t.device_open(plugin_.instance(), i, &open, &device, &error) != BP_SUCCESS)
                throw backplane::Error(backplane::ErrorCode::Internal,
                                       "device_open(" + std::to_string(i) +
                                           "): " + backplane::errorMessage(error));
            devices_.push_back(device);
            bp_stream_create_args streamArgs{};
            streamArgs.struct_size = sizeof streamArgs;
            bp_stream *stream = nullptr;
            if (t.stream_create(device, &streamArgs, &stream, &error) != BP_SUCCESS)
                throw backplane::Error(backplane::ErrorCode::Internal,
                                       "stream_create: " + backplane::errorMessage(error));
            streams_.push_back(stream);
        }
    }
    ~Machine() {
        for (size_t i = 0; i < devices_.size(); ++i) {
            if (i < streams_.size()) api().stream_destroy(devices_[i], streams_[i]);
            api().device_close(devices_[i]);
        }
    }
    Machine(const Machine &) = delete;
    Machine &operator=(const Machine &) = delete;

    const RawPlugin &plugin() const { return plugin_; }
    const bp_plugin_api &api() const { return plugin_.api(); }
    bp_plugin *instance() const { return plugin_.instance(); }
    uint32_t size() const { return static_cast<uint32_t>(devices_.size()); }
    bp_device *device(uint32_t rank) const { return devices_[rank]; }
    bp_stream *stream(uint32_t rank) const { return streams_[rank]; }

    bp_memory *allocate(uint32_t rank, uint64_t bytes) {
        bp_memory_allocate_args args{};
        args.struct_size = sizeof args;
        args.kind = BP_MEMORY_DEVICE;
        args.size = bytes;
        bp_memory *memory = nullptr;
        void *mapped = nullptr;
        REQUIRE_OK(api().memory_allocate(device(rank), &args, &memory, &mapped, error));
        return memory;
    }
    void free(uint32_t rank, bp_memory *memory) { api().memory_free(device(rank), memory); }
    void write(uint32_t rank, bp_memory *dst, uint64_t offset,
               const std::vector<unsigned char> &bytes) {
        bp_copy_host_to_device_args args{};
        args.struct_size = sizeof args;
        args.src = bytes.data();
        args.dst = dst;
        args.dst_offset = offset;
        args.size = bytes.size();
        REQUIRE_OK(api().copy_host_to_device(device(rank), stream(rank), &args, error));
    }
    std::vector<unsigned char> read(uint32_t rank, bp_memory *src, uint64_t offset,
                                    uint64_t bytes) {
        std::vector<unsigned char> out(bytes);
        bp_copy_device_to_host_args args{};
        args.struct_size = sizeof args;
        args.src = src;
        args.src_offset = offset;
        args.dst = out.data();
        args.size = bytes;
        REQUIRE_OK(api().copy_device_to_host(device(rank), stream(rank), &args, error));
        REQUIRE(finish(rank) == BP_SUCCESS);
        return out;
    }
    /// Flushes with an event and waits at most `timeout` for it; returns the wait's status.
    bp_status finish(uint32_t rank, std::string *message = nullptr,
                     std::chrono::seconds timeout = std::chrono::seconds(120)) {
        bp_flush_args args{};
        args.struct_size = sizeof args;
        bp_event *event = nullptr;
        REQUIRE_OK(api().stream_flush(device(rank), stream(rank), &args, &event, error));
        bp_error error = backplane::makeError();
        const bp_status status = api().event_wait(
            device(rank), event, static_cast<uint64_t>(std::chrono::nanoseconds(timeout).count()),
            &error);
        if (message != nullptr) *message = backplane::errorMessage(error);
        api().event_release(device(rank), event);
        return status;
    }

private:
    RawPlugin plugin_;
    std::vector<bp_device *> devices_;
    std::vector<bp_stream *> streams_;
};

Machine *machine = nullptr;

/// The communicator of `ranks` ranks (rank r on GPU r), created with one thread per rank as the
/// core does; destroyed (after an abort when asked) at scope exit.
class Comms {
public:
    explicit Comms(Machine &m, uint64_t timeoutMs = 0) : m_(m) {
        std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
        size_t size = 0;
        REQUIRE_OK(m.api().comm_id_create(m.instance(), id.data(), id.size(), &size, error));
        REQUIRE(size == 128);
        const uint32_t n = m.size();
        comms_.assign(n, nullptr);
        std::vector<bp_status> statuses(n, BP_ERROR_INTERNAL);
        std::vector<std::string> messages(n);
        std::vector<std::thread> threads;
        for (uint32_t rank = 0; rank < n; ++rank)
            threads.emplace_back([&, rank] {
                bp_comm_create_args args{};
                args.struct_size = sizeof args;
                args.id = id.data();
                args.id_size = size;
                args.rank = rank;
                args.size = n;
                args.timeout_ms = timeoutMs;
                bp_error error = backplane::makeError();
                statuses[rank] = m.api().comm_create(m.device(rank), &args, &comms_[rank], &error);
                messages[rank] = backplane::errorMessage(error);
            });
        for (auto &thread : threads)
            thread.join();
        for (uint32_t rank = 0; rank < n; ++rank) {
            INFO("comm_create rank " << rank << ": " << messages[rank]);
            REQUIRE(statuses[rank] == BP_SUCCESS);
        }
    }
    ~Comms() {
        for (uint32_t rank = 0; rank < comms_.size(); ++rank)
            if (comms_[rank] != nullptr) {
                if (abortFirst_) m_.api().comm_abort(m_.device(rank), comms_[rank]);
                m_.api().comm_destroy(m_.device(rank), comms_[rank]);
            }
    }
    Comms(const Comms &) = delete;
    Comms &operator=(const Comms &) = delete;

    bp_comm *operator[](uint32_t rank) const { return comms_[rank]; }
    /// Abort every rank before destroying (after a failure, destroy alone may wait for peers).
    void abortOnExit() { abortFirst_ = true; }

private:
    Machine &m_;
    std::vector<bp_comm *> comms_;
    bool abortFirst_ = false;
};

bp_collective_args collectiveArgs(bp_collective op, const TypeInfo &t, uint64_t count) {
    bp_collective_args args{};
    args.struct_size = sizeof args;
    args.op = op;
    args.type = t.type;
    args.count = count;
    return args;
}

/// Issues one collective per rank inside comm_group, from this thread (as the core does when
/// one process holds several ranks), then waits for every stream.
void runGrouped(Machine &m, const Comms &comms,
                const std::function<bp_collective_args(uint32_t rank)> &argsOf) {
    REQUIRE_OK(m.api().comm_group(m.instance(), 1, error));
    std::vector<bp_status> statuses(m.size());
    std::vector<std::string> messages(m.size());
    for (uint32_t rank = 0; rank < m.size(); ++rank) {
        const bp_collective_args args = argsOf(rank);
        bp_error error = backplane::makeError();
        statuses[rank] =
            m.api().collective(m.device(rank), m.stream(rank), comms[rank], &args, &error);
        messages[rank] = backplane::errorMessage(error);
    }
    REQUIRE_OK(m.api().comm_group(m.instance(), 0, error));
    for (uint32_t rank = 0; rank < m.size(); ++rank) {
        INFO("collective on rank " << rank << ": " << messages[rank]);
        REQUIRE(statuses[rank] == BP_SUCCESS);
        std::string message;
        const bp_status status = m.finish(rank, &message);
        INFO("waiting for rank " << rank << ": " << message);
        REQUIRE(status == BP_SUCCESS);
    }
}

/// Element i of rank r's input: small positive integers, exact in every type, whose sum over
/// up to 40 ranks fits i8.
double inputValue(uint32_t rank, uint64_t i) { return 1.0 + static_cast<double>((rank + i) % 3); }
/// For min / max: a pattern where different ranks win at different elements.
double spreadValue(uint32_t rank, uint64_t i) { return static_cast<double>((rank * 7 + i) % 11); }

double reduceReference(bp_reduce_op op, const TypeInfo &t, uint32_t ranks,
                       const std::function<double(uint32_t)> &valueOf) {
    double result = valueOf(0);
    for (uint32_t r = 1; r < ranks; ++r) {
        const double v = valueOf(r);
        switch (op) {
        case BP_REDUCE_SUM:
        case BP_REDUCE_AVG:
            result += v;
            break;
        case BP_REDUCE_PROD:
            result *= v;
            break;
        case BP_REDUCE_MIN:
            result = std::min(result, v);
            break;
        case BP_REDUCE_MAX:
            result = std::max(result, v);
            break;
        }
    }
    if (op == BP_REDUCE_AVG)
        result = t.floating ? result / ranks : std::floor(result / ranks); // non-negative inputs
    return result;
}

/// Exact, except an average of floats over a rank count that is not a power of two: NCCL
/// multiplies each input by 1/ranks, which is not exact in binary.
void checkValue(const TypeInfo &t, bp_reduce_op op, uint32_t ranks, double expected, double got) {
    if (op == BP_REDUCE_AVG && t.floating && !isPowerOfTwo(ranks)) {
        const double tolerance = t.size == 2 ? 1e-2 : t.size == 4 ? 1e-6 : 1e-12;
        CHECK(std::abs(got - expected) <= tolerance * std::max(1.0, std::abs(expected)));
    } else {
        CHECK(got == expected);
    }
}

const char *opName(bp_reduce_op op) {
    switch (op) {
    case BP_REDUCE_SUM:
        return "sum";
    case BP_REDUCE_PROD:
        return "prod";
    case BP_REDUCE_MIN:
        return "min";
    case BP_REDUCE_MAX:
        return "max";
    case BP_REDUCE_AVG:
        return "avg";
    }
    return "?";
}

double valueFor(bp_reduce_op op, uint32_t rank, uint64_t i) {
    return op == BP_REDUCE_MIN || op == BP_REDUCE_MAX ? spreadValue(rank, i)
           : op == BP_REDUCE_PROD                     ? 1.0 + static_cast<double>((rank + i) % 2)
                                                      : inputValue(rank, i);
}

constexpr uint64_t kCount = 1000;
constexpr uint64_t kOffset = 256; // every range starts inside its page

/// all_reduce (in place or not) of `t` with `op` on every rank, checked element by element.
void checkAllReduce(Machine &m, const Comms &comms, const TypeInfo &t, bp_reduce_op op,
                    bool inPlace) {
    CAPTURE(t.name);
    CAPTURE(opName(op));
    CAPTURE(inPlace);
    const uint32_t n = m.size();
    const uint64_t bytes = kCount * t.size;
    std::vector<bp_memory *> send(n), recv(n);
    for (uint32_t r = 0; r < n; ++r) {
        send[r] = m.allocate(r, kOffset + bytes);
        recv[r] = inPlace ? send[r] : m.allocate(r, kOffset + bytes);
        std::vector<double> values(kCount);
        for (uint64_t i = 0; i < kCount; ++i)
            values[i] = valueFor(op, r, i);
        m.write(r, send[r], kOffset, encodeAll(t, values));
    }
    runGrouped(m, comms, [&](uint32_t r) {
        auto args = collectiveArgs(BP_COLLECTIVE_ALL_REDUCE, t, kCount);
        args.reduce = op;
        args.send = send[r];
        args.send_offset = kOffset;
        args.recv = recv[r];
        args.recv_offset = kOffset;
        return args;
    });
    for (uint32_t r = 0; r < n; ++r) {
        CAPTURE(r);
        const auto out = m.read(r, recv[r], kOffset, bytes);
        for (uint64_t i = 0; i < kCount; ++i)
            checkValue(t, op, n,
                       reduceReference(op, t, n, [&](uint32_t q) { return valueFor(op, q, i); }),
                       decode(t, out.data() + i * t.size));
    }
    for (uint32_t r = 0; r < n; ++r) {
        m.free(r, send[r]);
        if (!inPlace) m.free(r, recv[r]);
    }
}

} // namespace

TEST_CASE("all_reduce sums every type exactly on every GPU") {
    Comms comms(*machine);
    for (const TypeInfo &t : kAllTypes)
        checkAllReduce(*machine, comms, t, BP_REDUCE_SUM, false);
}

TEST_CASE("all_reduce applies prod, min, max and avg, also in place") {
    Comms comms(*machine);
    for (const TypeInfo &t : {kI32, kF32, kI64, kBF16})
        for (const bp_reduce_op op : {BP_REDUCE_PROD, BP_REDUCE_MIN, BP_REDUCE_MAX, BP_REDUCE_AVG})
            checkAllReduce(*machine, comms, t, op, false);
    checkAllReduce(*machine, comms, kF32, BP_REDUCE_SUM, true);
    checkAllReduce(*machine, comms, kU8, BP_REDUCE_MAX, true);
}

TEST_CASE("reduce puts the result on the root, and broadcast copies the root's data") {
    Machine &m = *machine;
    Comms comms(m);
    const uint32_t n = m.size();
    const uint32_t root = n - 1;
    for (const TypeInfo &t : {kF32, kI64, kF16}) {
        CAPTURE(t.name);
        const uint64_t bytes = kCount * t.size;
        std::vector<bp_memory *> send(n), recv(n);
        for (uint32_t r = 0; r < n; ++r) {
            send[r] = m.allocate(r, kOffset + bytes);
            recv[r] = m.allocate(r, kOffset + bytes);
            std::vector<double> values(kCount);
            for (uint64_t i = 0; i < kCount; ++i)
                values[i] = inputValue(r, i);
            m.write(r, send[r], kOffset, encodeAll(t, values));
        }
        runGrouped(m, comms, [&](uint32_t r) {
            auto args = collectiveArgs(BP_COLLECTIVE_REDUCE, t, kCount);
            args.reduce = BP_REDUCE_SUM;
            args.peer = root;
            args.send = send[r];
            args.send_offset = kOffset;
            args.recv = r == root ? recv[r] : nullptr; // only the root's recv is written
            args.recv_offset = kOffset;
            return args;
        });
        {
            const auto out = m.read(root, recv[root], kOffset, bytes);
            for (uint64_t i = 0; i < kCount; ++i)
                CHECK(decode(t, out.data() + i * t.size) ==
                      reduceReference(BP_REDUCE_SUM, t, n,
                                      [&](uint32_t q) { return inputValue(q, i); }));
        }

        // Broadcast from rank 1 into every recv (the root's send is its input).
        runGrouped(m, comms, [&](uint32_t r) {
            auto args = collectiveArgs(BP_COLLECTIVE_BROADCAST, t, kCount);
            args.peer = 1;
            args.send = r == 1 ? send[r] : nullptr; // non-roots pass no send at all
            args.send_offset = kOffset;
            args.recv = recv[r];
            args.recv_offset = kOffset;
            return args;
        });
        for (uint32_t r = 0; r < n; ++r) {
            CAPTURE(r);
            const auto out = m.read(r, recv[r], kOffset, bytes);
            for (uint64_t i = 0; i < kCount; ++i)
                CHECK(decode(t, out.data() + i * t.size) == inputValue(1, i));
        }
        for (uint32_t r = 0; r < n; ++r) {
            m.free(r, send[r]);
            m.free(r, recv[r]);
        }
    }
}

TEST_CASE("all_gather places rank r's part at r * count, also in place") {
    Machine &m = *machine;
    Comms comms(m);
    const uint32_t n = m.size();
    for (const TypeInfo &t : {kI32, kBF16, kU8}) {
        for (const bool inPlace : {false, true}) {
            CAPTURE(t.name);
            CAPTURE(inPlace);
            const uint64_t part = kCount * t.size;
            std::vector<bp_memory *> send(n), recv(n);
            for (uint32_t r = 0; r < n; ++r) {
                recv[r] = m.allocate(r, kOffset + part * n);
                send[r] = inPlace ? recv[r] : m.allocate(r, kOffset + part);
                std::vector<double> values(kCount);
                for (uint64_t i = 0; i < kCount; ++i)
                    values[i] = spreadValue(r, i);
                m.write(r, send[r], inPlace ? kOffset + r * part : kOffset, encodeAll(t, values));
            }
            runGrouped(m, comms, [&](uint32_t r) {
                auto args = collectiveArgs(BP_COLLECTIVE_ALL_GATHER, t, kCount);
                args.send = send[r];
                args.send_offset = inPlace ? kOffset + r * part : kOffset;
                args.recv = recv[r];
                args.recv_offset = kOffset;
                return args;
            });
            for (uint32_t r = 0; r < n; ++r) {
                CAPTURE(r);
                const auto out = m.read(r, recv[r], kOffset, part * n);
                for (uint32_t q = 0; q < n; ++q)
                    for (uint64_t i = 0; i < kCount; ++i)
                        CHECK(decode(t, out.data() + (q * kCount + i) * t.size) ==
                              spreadValue(q, i));
            }
            for (uint32_t r = 0; r < n; ++r) {
                m.free(r, recv[r]);
                if (!inPlace) m.free(r, send[r]);
            }
        }
    }
}

TEST_CASE("reduce_scatter gives rank r the reduction of part r") {
    Machine &m = *machine;
    Comms comms(m);
    const uint32_t n = m.size();
    for (const TypeInfo &t : {kF16, kU32, kF64}) {
        for (const bp_reduce_op op : {BP_REDUCE_SUM, BP_REDUCE_MAX}) {
            CAPTURE(t.name);
            CAPTURE(opName(op));
            const uint64_t part = kCount * t.size;
            std::vector<bp_memory *> send(n), recv(n);
            // Element j of the whole send buffer of rank r is valueFor(op, r, j).
            for (uint32_t r = 0; r < n; ++r) {
                send[r] = m.allocate(r, kOffset + part * n);
                recv[r] = m.allocate(r, kOffset + part);
                std::vector<double> values(kCount * n);
                for (uint64_t j = 0; j < values.size(); ++j)
                    values[j] = valueFor(op, r, j);
                m.write(r, send[r], kOffset, encodeAll(t, values));
            }
            runGrouped(m, comms, [&](uint32_t r) {
                auto args = collectiveArgs(BP_COLLECTIVE_REDUCE_SCATTER, t, kCount);
                args.reduce = op;
                args.send = send[r];
                args.send_offset = kOffset;
                args.recv = recv[r];
                args.recv_offset = kOffset;
                return args;
            });
            for (uint32_t r = 0; r < n; ++r) {
                CAPTURE(r);
                const auto out = m.read(r, recv[r], kOffset, part);
                for (uint64_t i = 0; i < kCount; ++i)
                    CHECK(decode(t, out.data() + i * t.size) ==
                          reduceReference(op, t, n, [&](uint32_t q) {
                              return valueFor(op, q, r * kCount + i);
                          }));
            }
            for (uint32_t r = 0; r < n; ++r) {
                m.free(r, send[r]);
                m.free(r, recv[r]);
            }
        }
    }
}

TEST_CASE("send and recv pass data around a ring of every GPU") {
    Machine &m = *machine;
    Comms comms(m);
    const uint32_t n = m.size();
    for (const TypeInfo &t : {kF32, kI8}) {
        CAPTURE(t.name);
        const uint64_t bytes = kCount * t.size;
        std::vector<bp_memory *> send(n), recv(n);
        for (uint32_t r = 0; r < n; ++r) {
            send[r] = m.allocate(r, kOffset + bytes);
            recv[r] = m.allocate(r, kOffset + bytes);
            std::vector<double> values(kCount);
            for (uint64_t i = 0; i < kCount; ++i)
                values[i] = spreadValue(r, i);
            m.write(r, send[r], kOffset, encodeAll(t, values));
        }
        // One group holds both halves of every pair: each rank sends to its right neighbour
        // and receives from its left one.
        REQUIRE_OK(m.api().comm_group(m.instance(), 1, error));
        for (uint32_t r = 0; r < n; ++r) {
            auto sendArgs = collectiveArgs(BP_COLLECTIVE_SEND, t, kCount);
            sendArgs.peer = (r + 1) % n;
            sendArgs.send = send[r];
            sendArgs.send_offset = kOffset;
            REQUIRE_OK(m.api().collective(m.device(r), m.stream(r), comms[r], &sendArgs, error));
            auto recvArgs = collectiveArgs(BP_COLLECTIVE_RECV, t, kCount);
            recvArgs.peer = (r + n - 1) % n;
            recvArgs.recv = recv[r];
            recvArgs.recv_offset = kOffset;
            REQUIRE_OK(m.api().collective(m.device(r), m.stream(r), comms[r], &recvArgs, error));
        }
        REQUIRE_OK(m.api().comm_group(m.instance(), 0, error));
        for (uint32_t r = 0; r < n; ++r) {
            CAPTURE(r);
            const auto out = m.read(r, recv[r], kOffset, bytes);
            for (uint64_t i = 0; i < kCount; ++i)
                CHECK(decode(t, out.data() + i * t.size) == spreadValue((r + n - 1) % n, i));
        }
        for (uint32_t r = 0; r < n; ++r) {
            m.free(r, send[r]);
            m.free(r, recv[r]);
        }
    }
}

TEST_CASE("collective refuses arguments NCCL would not check, before calling it") {
    Machine &m = *machine;
    Comms comms(m);
    const uint32_t n = m.size();
    bp_memory *mine = m.allocate(0, 4096);
    bp_memory *other = m.allocate(1, 4096);
    auto expectInvalid = [&](bp_collective_args args, const char *needle) {
        bp_error error = backplane::makeError();
        const bp_status status =
            m.api().collective(m.device(0), m.stream(0), comms[0], &args, &error);
        const std::string message = backplane::errorMessage(error);
        INFO(message);
        CHECK(status == BP_ERROR_INVALID_ARGUMENT);
        CHECK(message.find(needle) != std::string::npos);
    };
    auto base = collectiveArgs(BP_COLLECTIVE_ALL_REDUCE, kF32, 16);
    base.send = mine;
    base.recv = mine;
    base.recv_offset = 1024;

    auto args = base;
    args.recv = other;
    expectInvalid(args, "the recv memory belongs to CUDA device 1");
    args = base;
    args.op = BP_COLLECTIVE_BROADCAST;
    args.peer = n;
    expectInvalid(args, "is not a rank of the communicator");
    args = base;
    args.recv_offset = 4096 - 32; // 16 floats do not fit
    expectInvalid(args, "exceeds the page");
    args = base;
    args.recv_offset = 8; // overlaps send without being in place
    expectInvalid(args, "overlap");
    args = base;
    args.op = BP_COLLECTIVE_ALL_GATHER;
    args.count = UINT64_MAX / 2;
    expectInvalid(args, "overflows 64 bits");
    args = base;
    args.send = nullptr;
    expectInvalid(args, "the send memory is NULL");

    // The communicator is still usable.
    checkAllReduce(m, comms, kI32, BP_REDUCE_SUM, false);
    m.free(0, mine);
    m.free(1, other);
}

TEST_CASE("after comm_abort every collective of the communicator fails with BP_ERROR_REMOTE") {
    Machine &m = *machine;
    Comms comms(m);
    bp_memory *buffer = m.allocate(0, 4096);
    m.api().comm_abort(m.device(0), comms[0]);
    auto args = collectiveArgs(BP_COLLECTIVE_ALL_REDUCE, kF32, 16);
    args.send = buffer;
    args.recv = buffer;
    bp_error error = backplane::makeError();
    const bp_status status = m.api().collective(m.device(0), m.stream(0), comms[0], &args, &error);
    INFO(backplane::errorMessage(error));
    CHECK(status == BP_ERROR_REMOTE);
    CHECK(backplane::errorMessage(error).find("aborted") != std::string::npos);
    m.api().comm_abort(m.device(0), comms[0]); // a second abort is harmless
    comms.abortOnExit();
    m.free(0, buffer);
}

TEST_CASE("comm_create times out when a rank never joins") {
    Machine &m = *machine;
    std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
    size_t size = 0;
    REQUIRE_OK(m.api().comm_id_create(m.instance(), id.data(), id.size(), &size, error));
    bp_comm_create_args args{};
    args.struct_size = sizeof args;
    args.id = id.data();
    args.id_size = size;
    args.rank = 0;
    args.size = 2; // rank 1 never comes
    args.timeout_ms = 1500;
    bp_comm *comm = nullptr;
    bp_error error = backplane::makeError();
    const auto start = std::chrono::steady_clock::now();
    const bp_status status = m.api().comm_create(m.device(0), &args, &comm, &error);
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
    INFO(backplane::errorMessage(error));
    CHECK(status == BP_ERROR_TIMEOUT);
    CHECK(seconds.count() >= 1.4);
    CHECK(seconds.count() < 30.0);
    if (status == BP_SUCCESS) m.api().comm_destroy(m.device(0), comm);
}

TEST_CASE("a collective whose peer never joins it fails with BP_ERROR_REMOTE within the timeout") {
    Machine &m = *machine;
    auto comms = std::make_unique<Comms>(m, 2000);
    comms->abortOnExit();
    // Connected first: every rank runs one all_reduce, so NCCL has set up its channels.
    checkAllReduce(m, *comms, kF32, BP_REDUCE_SUM, false);

    // Now only rank 0 issues one: its kernel waits for the others forever, unless the watchdog
    // aborts the communicator once the collective ran for longer than the 2 s timeout.
    bp_memory *buffer = m.allocate(0, 4096);
    auto args = collectiveArgs(BP_COLLECTIVE_ALL_REDUCE, kF32, 256);
    args.send = buffer;
    args.recv = buffer;
    const auto start = std::chrono::steady_clock::now();
    bp_error error = backplane::makeError();
    bp_status status = m.api().collective(m.device(0), m.stream(0), (*comms)[0], &args, &error);
    std::string message = backplane::errorMessage(error);
    // Enqueued (the usual case once connected): the failure shows on the stream's next event.
    const bool enqueued = status == BP_SUCCESS;
    if (enqueued) status = m.finish(0, &message, std::chrono::seconds(60));
    const auto seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start);
    INFO(message);
    CHECK(status == BP_ERROR_REMOTE);
    CHECK(seconds.count() < 30.0);
    // Every event after the cut-short collective reports it while the communicator lives...
    if (enqueued) CHECK(m.finish(0) == BP_ERROR_REMOTE);
    // ...and once it is destroyed, the stream is as good as new.
    comms.reset();
    CHECK(m.finish(0) == BP_SUCCESS);
    m.free(0, buffer);
}

TEST_CASE("peer access is answered per pair, and copy_peer and cross-device waits follow it") {
    Machine &m = *machine;
    const auto &api = m.api();
    REQUIRE(m.plugin().has(&bp_plugin_api::device_peer_access));
    for (uint32_t dst = 0; dst < m.size(); ++dst)
        for (uint32_t src = 0; src < m.size(); ++src) {
            if (src == dst) continue;
            CAPTURE(dst);
            CAPTURE(src);
            uint32_t access = 2;
            REQUIRE_OK(api.device_peer_access(m.device(dst), m.device(src), &access, error));
            REQUIRE(access <= 1);
            bp_memory *from = m.allocate(src, 1 << 20);
            bp_memory *to = m.allocate(dst, 1 << 20);
            std::vector<unsigned char> data(1 << 20);
            for (size_t i = 0; i < data.size(); ++i)
                data[i] = static_cast<unsigned char>(i * 31);
            m.write(src, from, 0, data);
            // The destination's stream waits for the write on the source's stream (an event of
            // another device), then copies.
            bp_flush_args flush{};
            flush.struct_size = sizeof flush;
            bp_event *written = nullptr;
            REQUIRE_OK(api.stream_flush(m.device(src), m.stream(src), &flush, &written, error));
            REQUIRE_OK(api.stream_wait_event(m.device(dst), m.stream(dst), written, error));
            bp_copy_device_to_device_args copy{};
            copy.struct_size = sizeof copy;
            copy.src = from;
            copy.dst = to;
            copy.size = data.size();
            bp_error copyError = backplane::makeError();
            const bp_status copied =
                api.copy_peer(m.device(dst), m.stream(dst), m.device(src), &copy, &copyError);
            INFO(backplane::errorMessage(copyError));
            if (access == 1) {
                REQUIRE(copied == BP_SUCCESS);
                CHECK(m.read(dst, to, 0, data.size()) == data);
            } else {
                CHECK(copied == BP_ERROR_UNSUPPORTED);
                CHECK(backplane::errorMessage(copyError).find("cannot access") !=
                      std::string::npos);
            }
            REQUIRE(m.finish(dst) == BP_SUCCESS);
            api.event_release(m.device(src), written);
            m.free(src, from);
            m.free(dst, to);
        }
}

int main(int argc, char **argv) {
    // NVLink multicast must stay off on the shared GPU machines (../shared/DEVICE.md); a caller's
    // own setting wins.
    ::setenv("NCCL_NVLS_ENABLE", "0", 0);
    std::unique_ptr<Machine> opened;
    try {
        RawPlugin plugin = RawPlugin::open(backplane::readPluginManifest(manifestPath()));
        bp_probe_result probe{};
        probe.struct_size = sizeof probe;
        bp_error error = backplane::makeError();
        const bp_status probed = plugin.api().probe(plugin.instance(), &probe, &error);
        backplane::throwIfFailed(probed, error, "cuda", "probe");
        if (probe.device_count < 2)
            return backplane::test::skip("collectives need 2 or more GPUs; the CUDA driver "
                                         "reports " +
                                         std::to_string(probe.device_count));
        bp_device_info info{};
        info.struct_size = sizeof info;
        backplane::throwIfFailed(plugin.api().device_info(plugin.instance(), 0, &info, &error),
                                 error, "cuda", "device_info");
        const std::string collectives =
            backplane::fieldText(info.collectives, sizeof info.collectives);
        if ((info.capabilities & BP_CAPABILITY_COLLECTIVES) == 0)
            return backplane::test::skip("the CUDA plugin has no collectives here: " + collectives);
        std::printf("%u GPUs, %s\n", probe.device_count, collectives.c_str());
        opened = std::make_unique<Machine>(std::move(plugin), probe.device_count);
    } catch (const std::exception &e) {
        return backplane::test::skipOrFail(e, "opening and probing the CUDA plugin");
    }
    machine = opened.get();
    doctest::Context context(argc, argv);
    const int result = context.run();
    opened.reset();
    return result;
}
