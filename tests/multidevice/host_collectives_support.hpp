// Shared by the host plugin's collective tests: the plugin opened straight through its C ABI, and
// the table of cases (every op x type x reduction) with its exact reference.
#pragma once

// Used by host_collectives_test (ranks as threads of one process) and host_collectives_worker (one
// rank per process). No doctest here: the worker reports on stderr and through its exit status.

#include <backplane/abi/plugin.h>

#include <dlfcn.h>

#include <atomic>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace hostcoll {

/// A failed ABI call: its status and the plugin's message.
class CallFailed : public std::runtime_error {
public:
    CallFailed(bp_status status, const std::string &what)
        : std::runtime_error(what), status_(status) {}
    bp_status status() const noexcept { return status_; }

private:
    bp_status status_;
};

inline bp_error makeError() {
    bp_error error{};
    error.struct_size = sizeof(error);
    return error;
}

inline std::string messageOf(const bp_error &error) {
    return std::string(error.message, strnlen(error.message, sizeof(error.message)));
}

/// Throws CallFailed("<what>: <status>: <message>") when status is not BP_SUCCESS.
inline void check(bp_status status, const bp_error &error, const std::string &what) {
    if (status != BP_SUCCESS)
        throw CallFailed(status, what + " failed with status " + std::to_string(status) + ": " +
                                     messageOf(error));
}

template <class T> T makeArgs() {
    T value{};
    value.struct_size = sizeof(T);
    return value;
}

/// The host plugin library (HOST_PLUGIN_PATH), opened with dlopen, and one instance of it. The
/// library stays loaded: plugin threads may outlive a test's last call by a moment.
class Plugin {
public:
    explicit Plugin(const std::string &optionsJson) {
        void *library = dlopen(HOST_PLUGIN_PATH, RTLD_NOW | RTLD_LOCAL);
        if (library == nullptr) throw std::runtime_error(std::string("dlopen: ") + dlerror());
        auto entry = reinterpret_cast<bp_get_plugin_api_fn>(dlsym(library, BP_PLUGIN_ENTRY_SYMBOL));
        if (entry == nullptr) throw std::runtime_error("the host plugin has no entry symbol");
        api_ = entry();
        auto args = makeArgs<bp_plugin_init_args>();
        args.host_abi_major = BP_ABI_VERSION_MAJOR;
        args.host_abi_minor = BP_ABI_VERSION_MINOR;
        args.options_json = optionsJson.c_str();
        bp_error error = makeError();
        check(api_->plugin_init(&args, &instance_, &error), error, "plugin_init");
    }
    ~Plugin() { api_->plugin_destroy(instance_); }
    Plugin(const Plugin &) = delete;
    Plugin &operator=(const Plugin &) = delete;

    const bp_plugin_api &api() const noexcept { return *api_; }
    bp_plugin *instance() const noexcept { return instance_; }

    bp_device_info info(uint32_t index) const {
        auto info = makeArgs<bp_device_info>();
        bp_error error = makeError();
        check(api_->device_info(instance_, index, &info, &error), error, "device_info");
        return info;
    }

    std::vector<unsigned char> commId() const {
        std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
        size_t size = 0;
        bp_error error = makeError();
        check(api_->comm_id_create(instance_, id.data(), id.size(), &size, &error), error,
              "comm_id_create");
        id.resize(size);
        return id;
    }

private:
    const bp_plugin_api *api_ = nullptr;
    bp_plugin *instance_ = nullptr;
};

/// One opened device with one stream and one page of `pageBytes`.
class Device {
public:
    Device(const Plugin &plugin, uint32_t index, uint64_t pageBytes) : api_(plugin.api()) {
        auto open = makeArgs<bp_device_open_args>();
        bp_error error = makeError();
        check(api_.device_open(plugin.instance(), index, &open, &device_, &error), error,
              "device_open");
        auto stream = makeArgs<bp_stream_create_args>();
        check(api_.stream_create(device_, &stream, &stream_, &error), error, "stream_create");
        auto allocate = makeArgs<bp_memory_allocate_args>();
        allocate.kind = BP_MEMORY_DEVICE;
        allocate.size = pageBytes;
        void *mapped = nullptr;
        check(api_.memory_allocate(device_, &allocate, &page_, &mapped, &error), error,
              "memory_allocate");
    }
    ~Device() {
        if (comm_ != nullptr) api_.comm_destroy(device_, comm_);
        api_.stream_destroy(device_, stream_); // waits for the stream's work
        api_.memory_free(device_, page_);
        api_.device_close(device_);
    }
    Device(const Device &) = delete;
    Device &operator=(const Device &) = delete;

    const bp_plugin_api &api() const noexcept { return api_; }
    bp_device *device() const noexcept { return device_; }
    bp_stream *stream() const noexcept { return stream_; }
    bp_memory *page() const noexcept { return page_; }
    bp_comm *comm() const noexcept { return comm_; }

    /// comm_create; returns its status (the comm is kept on success) and fills `message`.
    bp_status join(const std::vector<unsigned char> &id, uint32_t rank, uint32_t size,
                   uint64_t timeoutMs, std::string *message = nullptr) {
        auto args = makeArgs<bp_comm_create_args>();
        args.id = id.data();
        args.id_size = id.size();
        args.rank = rank;
        args.size = size;
        args.timeout_ms = timeoutMs;
        bp_error error = makeError();
        const bp_status status = api_.comm_create(device_, &args, &comm_, &error);
        if (status != BP_SUCCESS) comm_ = nullptr;
        if (message != nullptr) *message = messageOf(error);
        return status;
    }

    void upload(uint64_t offset, const void *data, uint64_t size) {
        auto args = makeArgs<bp_copy_host_to_device_args>();
        args.src = data;
        args.dst = page_;
        args.dst_offset = offset;
        args.size = size;
        bp_error error = makeError();
        check(api_.copy_host_to_device(device_, stream_, &args, &error), error, "upload");
    }
    void download(uint64_t offset, void *data, uint64_t size) {
        auto args = makeArgs<bp_copy_device_to_host_args>();
        args.src = page_;
        args.src_offset = offset;
        args.dst = data;
        args.size = size;
        bp_error error = makeError();
        check(api_.copy_device_to_host(device_, stream_, &args, &error), error, "download");
    }
    /// Records a collective; returns its status and fills `message`.
    bp_status collective(const bp_collective_args &args, std::string *message = nullptr) {
        bp_error error = makeError();
        const bp_status status = api_.collective(device_, stream_, comm_, &args, &error);
        if (message != nullptr) *message = messageOf(error);
        return status;
    }
    /// An event after everything recorded so far (the caller releases it with release()).
    bp_event *flush() {
        bp_event *event = nullptr;
        bp_error error = makeError();
        check(api_.stream_flush(device_, stream_, nullptr, &event, &error), error, "stream_flush");
        return event;
    }
    bp_status wait(bp_event *event, uint64_t timeoutNs, std::string *message = nullptr) {
        bp_error error = makeError();
        const bp_status status = api_.event_wait(device_, event, timeoutNs, &error);
        if (message != nullptr) *message = messageOf(error);
        return status;
    }
    void release(bp_event *event) { api_.event_release(device_, event); }
    /// Flushes and waits; returns the event's status.
    bp_status finish(uint64_t timeoutNs, std::string *message = nullptr) {
        bp_event *event = flush();
        const bp_status status = wait(event, timeoutNs, message);
        release(event);
        return status;
    }

private:
    const bp_plugin_api &api_;
    bp_device *device_ = nullptr;
    bp_stream *stream_ = nullptr;
    bp_memory *page_ = nullptr;
    bp_comm *comm_ = nullptr;
};

inline std::string toHex(const std::vector<unsigned char> &bytes) {
    static constexpr char kDigits[] = "0123456789abcdef";
    std::string text;
    for (const unsigned char b : bytes) {
        text += kDigits[b >> 4];
        text += kDigits[b & 15];
    }
    return text;
}

inline std::vector<unsigned char> fromHex(const std::string &text) {
    std::vector<unsigned char> bytes;
    for (size_t i = 0; i + 1 < text.size(); i += 2)
        bytes.push_back(static_cast<unsigned char>(std::stoi(text.substr(i, 2), nullptr, 16)));
    return bytes;
}

// ---- values and reference ----------------------------------------------------------------------

inline constexpr uint32_t kTypes[] = {BP_DATA_I8,  BP_DATA_U8,  BP_DATA_I32, BP_DATA_U32,
                                      BP_DATA_I64, BP_DATA_U64, BP_DATA_F16, BP_DATA_BF16,
                                      BP_DATA_F32, BP_DATA_F64};
inline constexpr uint32_t kReductions[] = {BP_REDUCE_SUM, BP_REDUCE_PROD, BP_REDUCE_MIN,
                                           BP_REDUCE_MAX, BP_REDUCE_AVG};

inline size_t typeSize(uint32_t type) {
    switch (type) {
    case BP_DATA_I8:
    case BP_DATA_U8:
        return 1;
    case BP_DATA_F16:
    case BP_DATA_BF16:
        return 2;
    case BP_DATA_I32:
    case BP_DATA_U32:
    case BP_DATA_F32:
        return 4;
    default:
        return 8;
    }
}

inline bool isSigned(uint32_t type) {
    return type != BP_DATA_U8 && type != BP_DATA_U32 && type != BP_DATA_U64;
}
inline bool isFloat(uint32_t type) {
    return type == BP_DATA_F16 || type == BP_DATA_BF16 || type == BP_DATA_F32 ||
           type == BP_DATA_F64;
}

/// The input of `rank` for element `i` of case `seed`: small integers (|x| <= 3, a quarter of
/// them negative for signed types), so every sum (|s| <= 12) and product (|p| <= 81) of up to 4
/// ranks is exact in every type, bf16's 8 significant bits included. Mixed so that the sums
/// take many values: averages over 3 ranks then need rounding both ways (5/3 rounds up, 4/3
/// down in every float format).
inline double inputValue(uint32_t type, uint32_t rank, uint32_t seed, uint64_t i) {
    uint32_t h = static_cast<uint32_t>(i) * 2654435761u ^ (rank + 1) * 40503u ^ seed * 97u;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    const double magnitude = 1.0 + static_cast<double>(h % 3);
    const bool negative = isSigned(type) && (h >> 8) % 4 == 1;
    return negative ? -magnitude : magnitude;
}

/// bfloat16 of a double, rounded to nearest even: the reference, written independently of the
/// plugin's bit trick (pick the nearer of the two neighbours).
inline uint16_t referenceBfloat16(double value) {
    // double -> float -> bfloat16 rounds twice, harmlessly: float's 24 bits >= 2 * 8 + 2.
    const float f = static_cast<float>(value);
    const uint32_t bits = std::bit_cast<uint32_t>(f);
    const uint32_t down = bits & 0xffff0000u;
    const uint32_t up = down + 0x10000u;
    const double below = std::bit_cast<float>(down);
    const double above = std::bit_cast<float>(up);
    const double toBelow = std::fabs(static_cast<double>(f) - below);
    const double toAbove = std::fabs(above - static_cast<double>(f));
    if (toBelow < toAbove) return static_cast<uint16_t>(down >> 16);
    if (toAbove < toBelow) return static_cast<uint16_t>(up >> 16);
    return static_cast<uint16_t>(((down >> 16) & 1u) == 0 ? down >> 16 : up >> 16);
}

/// Stores `value` as one element of `type` at `out` (integers: the value is in range).
inline void storeValue(uint32_t type, double value, unsigned char *out) {
    switch (type) {
    case BP_DATA_I8: {
        const auto v = static_cast<int8_t>(value);
        std::memcpy(out, &v, 1);
        return;
    }
    case BP_DATA_U8: {
        const auto v = static_cast<uint8_t>(value);
        std::memcpy(out, &v, 1);
        return;
    }
    case BP_DATA_I32: {
        const auto v = static_cast<int32_t>(value);
        std::memcpy(out, &v, 4);
        return;
    }
    case BP_DATA_U32: {
        const auto v = static_cast<uint32_t>(value);
        std::memcpy(out, &v, 4);
        return;
    }
    case BP_DATA_I64: {
        const auto v = static_cast<int64_t>(value);
        std::memcpy(out, &v, 8);
        return;
    }
    case BP_DATA_U64: {
        const auto v = static_cast<uint64_t>(value);
        std::memcpy(out, &v, 8);
        return;
    }
    case BP_DATA_F16: {
        const auto v = static_cast<_Float16>(value); // the compiler's correctly rounded conversion
        std::memcpy(out, &v, 2);
        return;
    }
    case BP_DATA_BF16: {
        const uint16_t v = referenceBfloat16(value);
        std::memcpy(out, &v, 2);
        return;
    }
    case BP_DATA_F32: {
        const auto v = static_cast<float>(value);
        std::memcpy(out, &v, 4);
        return;
    }
    default: {
        const double v = value;
        std::memcpy(out, &v, 8);
        return;
    }
    }
}

/// The reduction of the ranks' inputs of one element, computed in double (exact for these values).
inline double referenceReduce(uint32_t type, uint32_t reduce, uint32_t size, uint32_t seed,
                              uint64_t i) {
    double result = inputValue(type, 0, seed, i);
    for (uint32_t r = 1; r < size; ++r) {
        const double x = inputValue(type, r, seed, i);
        switch (reduce) {
        case BP_REDUCE_PROD:
            result *= x;
            break;
        case BP_REDUCE_MIN:
            result = std::min(result, x);
            break;
        case BP_REDUCE_MAX:
            result = std::max(result, x);
            break;
        default:
            result += x;
            break;
        }
    }
    if (reduce == BP_REDUCE_AVG) {
        result /= size;
        if (!isFloat(type)) result = std::trunc(result); // integers truncate toward zero
    }
    return result;
}

/// One collective of the table, the same on every rank.
struct Case {
    uint32_t op = 0;
    uint32_t type = 0;
    uint32_t reduce = 0;
    uint32_t peer = 0; ///< root; for SEND/RECV filled in per rank
    uint64_t count = 0;
    bool inPlace = false;
    uint32_t seed = 0;
    std::string name;
};

inline const char *opName(uint32_t op) {
    static const char *const kNames[] = {"all_reduce",     "reduce", "broadcast", "all_gather",
                                         "reduce_scatter", "send",   "recv"};
    return op < 7 ? kNames[op] : "?";
}

/// Every op x type x reduction (reductions only where the op reduces), each out of place and
/// some in place, with counts that do not divide evenly by the rank count, and one large
/// all-reduce that Gloo splits into many segments. SEND/RECV run as a ring exchange.
inline std::vector<Case> caseTable(uint32_t size) {
    std::vector<Case> cases;
    uint32_t seed = 0;
    auto add = [&](uint32_t op, uint32_t type, uint32_t reduce, uint64_t count, bool inPlace) {
        Case c;
        c.op = op;
        c.type = type;
        c.reduce = reduce;
        c.count = count;
        c.inPlace = inPlace;
        c.seed = seed++;
        c.peer = c.seed % size;
        c.name = std::string(opName(op)) + " type " + std::to_string(type) + " reduce " +
                 std::to_string(reduce) + (inPlace ? " in place" : "") + " count " +
                 std::to_string(count) + " root " + std::to_string(c.peer);
        cases.push_back(c);
    };
    for (const uint32_t type : kTypes) {
        for (const uint32_t reduce : kReductions) {
            add(BP_COLLECTIVE_ALL_REDUCE, type, reduce, 1031, false);
            add(BP_COLLECTIVE_REDUCE, type, reduce, 517, false);
            add(BP_COLLECTIVE_REDUCE_SCATTER, type, reduce, 259, false);
        }
        add(BP_COLLECTIVE_ALL_REDUCE, type, BP_REDUCE_SUM, 77, true);
        add(BP_COLLECTIVE_REDUCE, type, BP_REDUCE_MAX, 77, true);
        add(BP_COLLECTIVE_REDUCE_SCATTER, type, BP_REDUCE_MIN, 33, true);
        add(BP_COLLECTIVE_BROADCAST, type, 0, 1027, false);
        add(BP_COLLECTIVE_BROADCAST, type, 0, 65, true);
        add(BP_COLLECTIVE_ALL_GATHER, type, 0, 513, false);
        add(BP_COLLECTIVE_ALL_GATHER, type, 0, 31, true);
        if (size > 1) add(BP_COLLECTIVE_SEND, type, 0, 263, false); // with the matching RECV
    }
    add(BP_COLLECTIVE_ALL_REDUCE, BP_DATA_F32, BP_REDUCE_SUM, 700001, false); // ~2.7 MiB
    add(BP_COLLECTIVE_ALL_REDUCE, BP_DATA_I8, BP_REDUCE_SUM, 1, false);
    return cases;
}

/// Runs the whole case table as `rank` of `size` on `device` (joined already): uploads inputs,
/// records every collective on the device's one stream, downloads, waits (bounded), compares.
/// Returns a description of every mismatch or failure; empty when everything matched.
inline std::vector<std::string> runCaseTable(Device &device, uint32_t rank, uint32_t size) {
    std::vector<std::string> failures;
    const std::vector<Case> cases = caseTable(size);
    struct Layout {
        uint64_t send = 0;
        uint64_t recv = 0;
        uint64_t sendBytes = 0;
        uint64_t recvBytes = 0;
        std::vector<unsigned char> input;
        std::vector<unsigned char> before; ///< recv's content before (REDUCE: non-roots keep it)
        std::vector<unsigned char> result;
    };
    std::vector<Layout> layouts(cases.size());
    uint64_t next = 0;
    constexpr unsigned kSentinel = 0x5a; // recv's bytes before: a result must replace them
    for (size_t k = 0; k < cases.size(); ++k) {
        const Case &c = cases[k];
        Layout &l = layouts[k];
        const uint64_t part = c.count * typeSize(c.type);
        l.sendBytes = c.op == BP_COLLECTIVE_REDUCE_SCATTER ? part * size : part;
        l.recvBytes = c.op == BP_COLLECTIVE_ALL_GATHER ? part * size : part;
        // Odd offsets: the plugin must not assume aligned elements.
        l.send = next + 3;
        l.recv = l.send + l.sendBytes + 5;
        if (c.inPlace) {
            if (c.op == BP_COLLECTIVE_ALL_GATHER) {
                l.recv = next + 3;
                l.send = l.recv + rank * part;
            } else if (c.op == BP_COLLECTIVE_REDUCE_SCATTER) {
                l.recv = l.send + rank * part;
            } else {
                l.recv = l.send;
            }
        }
        next = std::max(l.send + l.sendBytes, l.recv + l.recvBytes) + 64;
    }

    for (size_t k = 0; k < cases.size(); ++k) {
        const Case &c = cases[k];
        Layout &l = layouts[k];
        const size_t es = typeSize(c.type);
        const uint64_t elements = l.sendBytes / es;
        l.before.assign(l.recvBytes, static_cast<unsigned char>(kSentinel + k));
        if (!(c.inPlace && l.recv == l.send)) device.upload(l.recv, l.before.data(), l.recvBytes);
        l.input.resize(l.sendBytes);
        for (uint64_t i = 0; i < elements; ++i)
            storeValue(c.type, inputValue(c.type, rank, c.seed, i), l.input.data() + i * es);
        device.upload(l.send, l.input.data(), l.sendBytes);
        if (c.inPlace && l.recv == l.send) l.before = l.input;

        auto args = makeArgs<bp_collective_args>();
        args.type = static_cast<bp_data_type>(c.type);
        args.reduce = static_cast<bp_reduce_op>(c.reduce);
        args.send = device.page();
        args.send_offset = l.send;
        args.recv = device.page();
        args.recv_offset = l.recv;
        args.count = c.count;
        std::string message;
        if (c.op == BP_COLLECTIVE_SEND) {
            // Ring: to rank + 1, from rank - 1. Even ranks send first, odd ranks receive first,
            // so one in-order stream per rank never waits on itself.
            const uint32_t to = (rank + 1) % size;
            const uint32_t from = (rank + size - 1) % size;
            for (int phase = 0; phase < 2; ++phase) {
                const bool sending = (phase == 0) == (rank % 2 == 0);
                args.op = sending ? BP_COLLECTIVE_SEND : BP_COLLECTIVE_RECV;
                args.peer = sending ? to : from;
                if (device.collective(args, &message) != BP_SUCCESS)
                    failures.push_back(c.name + ": collective failed: " + message);
            }
        } else {
            args.op = static_cast<bp_collective>(c.op);
            args.peer = c.peer;
            if (device.collective(args, &message) != BP_SUCCESS)
                failures.push_back(c.name + ": collective failed: " + message);
        }
        l.result.resize(l.recvBytes);
        device.download(l.recv, l.result.data(), l.recvBytes);
    }
    std::string message;
    const bp_status status = device.finish(uint64_t{120} * 1000 * 1000 * 1000, &message);
    if (status != BP_SUCCESS) {
        failures.push_back("the stream failed with status " + std::to_string(status) + ": " +
                           message);
        return failures;
    }

    for (size_t k = 0; k < cases.size(); ++k) {
        const Case &c = cases[k];
        const Layout &l = layouts[k];
        const size_t es = typeSize(c.type);
        std::vector<unsigned char> expected(l.recvBytes);
        const uint64_t part = c.count;
        switch (c.op) {
        case BP_COLLECTIVE_ALL_REDUCE:
            for (uint64_t i = 0; i < part; ++i)
                storeValue(c.type, referenceReduce(c.type, c.reduce, size, c.seed, i),
                           expected.data() + i * es);
            break;
        case BP_COLLECTIVE_REDUCE:
            if (rank != c.peer) {
                expected = l.before; // untouched off the root
                break;
            }
            for (uint64_t i = 0; i < part; ++i)
                storeValue(c.type, referenceReduce(c.type, c.reduce, size, c.seed, i),
                           expected.data() + i * es);
            break;
        case BP_COLLECTIVE_REDUCE_SCATTER:
            for (uint64_t i = 0; i < part; ++i)
                storeValue(c.type, referenceReduce(c.type, c.reduce, size, c.seed, rank * part + i),
                           expected.data() + i * es);
            break;
        case BP_COLLECTIVE_BROADCAST:
            for (uint64_t i = 0; i < part; ++i)
                storeValue(c.type, inputValue(c.type, c.peer, c.seed, i), expected.data() + i * es);
            break;
        case BP_COLLECTIVE_ALL_GATHER:
            for (uint32_t r = 0; r < size; ++r)
                for (uint64_t i = 0; i < part; ++i)
                    storeValue(c.type, inputValue(c.type, r, c.seed, i),
                               expected.data() + (r * part + i) * es);
            break;
        case BP_COLLECTIVE_SEND: {
            const uint32_t from = (rank + size - 1) % size;
            for (uint64_t i = 0; i < part; ++i)
                storeValue(c.type, inputValue(c.type, from, c.seed, i), expected.data() + i * es);
            break;
        }
        default:
            break;
        }
        if (l.result != expected) {
            size_t first = 0;
            while (first < expected.size() && l.result[first] == expected[first])
                ++first;
            failures.push_back(c.name + " on rank " + std::to_string(rank) + " of " +
                               std::to_string(size) + ": wrong result from byte " +
                               std::to_string(first) + " (element " + std::to_string(first / es) +
                               ")");
        }
    }
    return failures;
}

/// Bytes of page runCaseTable needs for `size` ranks.
inline uint64_t caseTableBytes(uint32_t size) {
    uint64_t total = 0;
    for (const Case &c : caseTable(size)) {
        const uint64_t part = c.count * typeSize(c.type);
        total += part * (size + 1) + part + 128;
    }
    return total;
}

} // namespace hostcoll
