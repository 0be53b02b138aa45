// backplane::Communicator on host-plugin devices: every operation x type x reduction checked
// exactly against a reference, in one process (4 devices: Gloo, and the staged path) and across
// forked processes on loopback (Gloo and staged), plus a rendezvous timeout and a rank that dies
// before a collective (the survivor gets a clear error, no hang). Both engines refuse the same
// calls before any rank's part goes out (a bad last rank leaves no other rank waiting), apply
// one pairing rule to sends and recvs between ranks of this process, and nest groups.
#include "client/open_client.hpp"
#include "comm/host_reduce.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace backplane;
using namespace std::chrono_literals;

namespace {

std::vector<ComputeClient> openHostDevices(uint32_t count, const std::string &mode = "async") {
    const std::string options = R"({"mode":")" + mode + R"(","devices":)" + std::to_string(count) +
                                R"(,"collectives":{"address":"127.0.0.1"}})";
    auto plugin = detail::PluginLibrary::open(HOST_PLUGIN_PATH, "host",
                                              {.cacheDir = "", .optionsJson = options});
    Config config;
    config.cacheEnabled = false;
    std::vector<ComputeClient> clients;
    for (uint32_t i = 0; i < count; ++i)
        clients.push_back(detail::openComputeClient(
            plugin, detail::toDeviceInfo("host", i, plugin->deviceInfo(i)), config));
    return clients;
}

constexpr DataType kTypes[] = {DataType::I8,  DataType::U8,   DataType::I32, DataType::U32,
                               DataType::I64, DataType::U64,  DataType::F16, DataType::BF16,
                               DataType::F32, DataType::F64};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Prod, ReduceOp::Min, ReduceOp::Max,
                             ReduceOp::Avg};

/// Element i of rank r: small integers, so every sum, product and average is exact in every type.
double valueOf(uint32_t rank, uint64_t i) { return 1.0 + static_cast<double>((i + rank) % 3); }

std::vector<std::byte> encode(DataType type, const std::vector<double> &values) {
    const size_t es = sizeOf(type);
    std::vector<std::byte> out(values.size() * es);
    for (size_t i = 0; i < values.size(); ++i) {
        std::byte *at = out.data() + i * es;
        const double v = values[i];
        const auto put = [&](auto x) { std::memcpy(at, &x, sizeof(x)); };
        switch (type) {
        case DataType::I8: put(static_cast<int8_t>(v)); break;
        case DataType::U8: put(static_cast<uint8_t>(v)); break;
        case DataType::I32: put(static_cast<int32_t>(v)); break;
        case DataType::U32: put(static_cast<uint32_t>(v)); break;
        case DataType::I64: put(static_cast<int64_t>(v)); break;
        case DataType::U64: put(static_cast<uint64_t>(v)); break;
        case DataType::F16: put(detail::floatToHalf(static_cast<float>(v))); break;
        case DataType::BF16: put(detail::floatToBf16(static_cast<float>(v))); break;
        case DataType::F32: put(static_cast<float>(v)); break;
        case DataType::F64: put(v); break;
        }
    }
    return out;
}

bool isInteger(DataType type) {
    return type != DataType::F16 && type != DataType::BF16 && type != DataType::F32 &&
           type != DataType::F64;
}

double reduceRef(ReduceOp op, DataType type, uint32_t ranks, uint64_t i, uint32_t firstRank = 0) {
    double acc = valueOf(firstRank, i);
    for (uint32_t r = firstRank + 1; r < firstRank + ranks; ++r) {
        const double v = valueOf(r, i);
        switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Avg: acc += v; break;
        case ReduceOp::Prod: acc *= v; break;
        case ReduceOp::Min: acc = std::min(acc, v); break;
        case ReduceOp::Max: acc = std::max(acc, v); break;
        }
    }
    if (op == ReduceOp::Avg) acc = isInteger(type) ? std::trunc(acc / ranks) : acc / ranks;
    return acc;
}

std::vector<double> rankValues(uint32_t rank, uint64_t count) {
    std::vector<double> v(count);
    for (uint64_t i = 0; i < count; ++i) v[i] = valueOf(rank, i);
    return v;
}

std::string label(DataType type, ReduceOp op) {
    return std::string(toString(type)) + " " + toString(op);
}

/// Runs every operation on this process's ranks of `comm` (devices in rank order) and checks
/// each result exactly. Returns the number of failed checks (also reported through doctest).
int checkEveryOperation(Communicator &comm, std::vector<ComputeClient> &devices) {
    int failures = 0;
    const auto expect = [&](bool ok, const std::string &what) {
        if (!ok) {
            ++failures;
            std::fprintf(stderr, "rank %u: %s is wrong\n", comm.rank(0), what.c_str());
        }
        CHECK_MESSAGE(ok, what);
    };
    const uint32_t size = comm.size();
    const size_t local = devices.size();
    const uint64_t count = 37; // odd: no algorithm's chunking lines up with it
    const auto readBytes = [&](size_t l, const Buffer &b) { return devices[l].read(b).wait(); };
    std::vector<Buffer> send(local), recv(local);
    for (DataType type : kTypes) {
        const size_t es = sizeOf(type);
        for (size_t l = 0; l < local; ++l)
            send[l] = devices[l].create(encode(type, rankValues(comm.rank(l), count)).data(),
                                        count * es);
        for (ReduceOp op : kOps) {
            for (size_t l = 0; l < local; ++l) recv[l] = devices[l].empty(count * es);
            comm.allReduce(send, recv, count, type, op);
            std::vector<double> ref(count);
            for (uint64_t i = 0; i < count; ++i) ref[i] = reduceRef(op, type, size, i);
            for (size_t l = 0; l < local; ++l)
                expect(readBytes(l, recv[l]) == encode(type, ref), "allReduce " + label(type, op));
        }
        // reduce to the last rank, in place on the root's side
        const uint32_t root = size - 1;
        for (size_t l = 0; l < local; ++l) recv[l] = devices[l].empty(count * es);
        comm.reduce(send, recv, count, type, ReduceOp::Max, root);
        for (size_t l = 0; l < local; ++l)
            if (comm.rank(l) == root) {
                std::vector<double> ref(count);
                for (uint64_t i = 0; i < count; ++i)
                    ref[i] = reduceRef(ReduceOp::Max, type, size, i);
                expect(readBytes(l, recv[l]) == encode(type, ref), "reduce " + label(type, ReduceOp::Max));
            }
        // broadcast from rank 1 (or 0)
        const uint32_t from = size > 1 ? 1 : 0;
        for (size_t l = 0; l < local; ++l) recv[l] = devices[l].empty(count * es);
        comm.broadcast(send, recv, count, type, from);
        for (size_t l = 0; l < local; ++l)
            expect(readBytes(l, recv[l]) == encode(type, rankValues(from, count)),
                   std::string("broadcast ") + toString(type));
        // all-gather
        for (size_t l = 0; l < local; ++l) recv[l] = devices[l].empty(count * es * size);
        comm.allGather(send, recv, count, type);
        std::vector<double> gathered;
        for (uint32_t r = 0; r < size; ++r) {
            const auto part = rankValues(r, count);
            gathered.insert(gathered.end(), part.begin(), part.end());
        }
        for (size_t l = 0; l < local; ++l)
            expect(readBytes(l, recv[l]) == encode(type, gathered),
                   std::string("allGather ") + toString(type));
        // reduce-scatter of count * size elements
        std::vector<Buffer> big(local);
        for (size_t l = 0; l < local; ++l) {
            big[l] = devices[l].create(encode(type, rankValues(comm.rank(l), count * size)).data(),
                                       count * size * es);
            recv[l] = devices[l].empty(count * es);
        }
        comm.reduceScatter(big, recv, count, type, ReduceOp::Sum);
        for (size_t l = 0; l < local; ++l) {
            std::vector<double> ref(count);
            for (uint64_t i = 0; i < count; ++i)
                ref[i] = reduceRef(ReduceOp::Sum, type, size, comm.rank(l) * count + i);
            expect(readBytes(l, recv[l]) == encode(type, ref),
                   std::string("reduceScatter ") + toString(type));
        }
    }
    // send/recv around the ring, in one group (ranks of one process drive each other)
    std::vector<Buffer> out(local), in(local);
    comm.groupStart();
    for (size_t l = 0; l < local; ++l) {
        const uint32_t me = comm.rank(l);
        out[l] = devices[l].create(encode(DataType::I32, rankValues(me, count)).data(), count * 4);
        in[l] = devices[l].empty(count * 4);
        if (size > 1) comm.send(out[l], count, DataType::I32, (me + 1) % size, l);
    }
    for (size_t l = 0; l < local; ++l) {
        const uint32_t me = comm.rank(l);
        if (size > 1) comm.recv(in[l], count, DataType::I32, (me + size - 1) % size, l);
    }
    comm.groupEnd();
    for (size_t l = 0; l < local && size > 1; ++l)
        expect(readBytes(l, in[l]) ==
                   encode(DataType::I32, rankValues((comm.rank(l) + size - 1) % size, count)),
               "send/recv around the ring");
    return failures;
}

/// Runs `body(process)` in `processes` forked children and returns their exit statuses (a
/// child still running after `limit` is killed and reported as -1).
std::vector<int> runProcesses(uint32_t processes, std::chrono::seconds limit,
                              const std::function<int(uint32_t)> &body) {
    std::vector<pid_t> children;
    for (uint32_t p = 0; p < processes; ++p) {
        const pid_t pid = fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            int code = 99;
            try {
                code = body(p);
            } catch (const std::exception &e) {
                std::fprintf(stderr, "process %u: %s\n", p, e.what());
                code = 98;
            }
            std::fflush(stderr);
            _exit(code);
        }
        children.push_back(pid);
    }
    std::vector<int> statuses(processes, -1);
    const auto deadline = std::chrono::steady_clock::now() + limit;
    size_t left = processes;
    while (left > 0 && std::chrono::steady_clock::now() < deadline) {
        for (uint32_t p = 0; p < processes; ++p) {
            if (children[p] == 0) continue;
            int status = 0;
            if (waitpid(children[p], &status, WNOHANG) == children[p]) {
                statuses[p] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                children[p] = 0;
                --left;
            }
        }
        std::this_thread::sleep_for(10ms);
    }
    for (pid_t pid : children)
        if (pid != 0) {
            kill(pid, SIGKILL);
            waitpid(pid, nullptr, 0);
        }
    return statuses;
}

std::string freshDirectory(const std::string &name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("backplane-comm-" + name + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    return dir.string();
}

} // namespace

TEST_CASE("four host devices in one process all-reduce every type and reduction exactly on gloo") {
    std::vector<ComputeClient> devices = openHostDevices(4);
    if ((devices[0].device().capabilities & BP_CAPABILITY_COLLECTIVES) == 0) {
        FAIL("the host plugin has no collectives here: " << devices[0].device().collectives);
        return;
    }
    auto rendezvous = localRendezvous();
    Communicator comm = Communicator::create(devices, *rendezvous);
    CHECK(comm.size() == 4);
    CHECK(!comm.staged());
    CHECK(comm.engine().find("gloo") != std::string::npos);
    checkEveryOperation(comm, devices);
}

TEST_CASE("on sync-mode host devices the reported collectives engine is the one that runs") {
    // The core runs plugin collectives only on asynchronous streams: what a device reports
    // (DeviceInfo, and so `backplane devices`) must say so instead of naming Gloo.
    std::vector<ComputeClient> devices = openHostDevices(2, "sync");
    const DeviceInfo &info = devices[0].device();
    REQUIRE((info.capabilities & BP_CAPABILITY_ASYNC_STREAMS) == 0);
    auto rendezvous = localRendezvous();
    Communicator comm = Communicator::create(devices, *rendezvous);
    INFO("reported: " << info.collectives << "; runs: " << comm.engine());
    if ((info.capabilities & BP_CAPABILITY_COLLECTIVES) != 0) {
        CHECK_FALSE(comm.staged());
        CHECK(comm.engine() == info.collectives);
    } else {
        CHECK(comm.staged());
        CHECK(info.collectives.find("staged") != std::string::npos);
        CHECK(info.collectives.find("synchronous") != std::string::npos);
    }
    checkEveryOperation(comm, devices);
}

TEST_CASE("the staged path gives the same results in one process") {
    std::vector<ComputeClient> devices = openHostDevices(3);
    auto rendezvous = localRendezvous();
    CommunicatorOptions options;
    options.forceStaged = true;
    Communicator comm = Communicator::create(devices, *rendezvous, options);
    CHECK(comm.staged());
    CHECK(comm.size() == 3);
    checkEveryOperation(comm, devices);
}

TEST_CASE("processes on loopback run every operation through gloo and through the staged path") {
    for (const bool staged : {false, true})
        for (const uint32_t processes : {2u, 3u}) {
            CAPTURE(staged);
            CAPTURE(processes);
            const std::string dir =
                freshDirectory(std::string(staged ? "staged" : "gloo") + std::to_string(processes));
            const std::vector<int> codes = runProcesses(processes, 90s, [&](uint32_t p) {
                // Process 1 holds two devices, the others one: ranks of unequal processes.
                std::vector<ComputeClient> devices = openHostDevices(p == 1 ? 2 : 1);
                auto rendezvous = directoryRendezvous(dir, p, processes);
                CommunicatorOptions options;
                options.forceStaged = staged;
                options.timeout = 30s;
                options.hostClient = devices[0];
                Communicator comm = Communicator::create(devices, *rendezvous, options);
                if (comm.staged() != staged || comm.size() != processes + 1) return 3;
                return checkEveryOperation(comm, devices) == 0 ? 0 : 1;
            });
            for (uint32_t p = 0; p < processes; ++p) {
                CAPTURE(p);
                CHECK(codes[p] == 0);
            }
            std::filesystem::remove_all(dir);
        }
}

namespace {

/// Two processes, this one process 0: every step returns `theirs` as process 1's bytes.
class ScriptedPeer final : public Rendezvous {
public:
    explicit ScriptedPeer(std::string theirs) : theirs_(std::move(theirs)) {}
    uint32_t process() const override { return 0; }
    uint32_t processCount() const override { return 2; }
    std::vector<std::vector<std::byte>> allGather(std::span<const std::byte> mine,
                                                  std::chrono::milliseconds) override {
        const auto *theirs = reinterpret_cast<const std::byte *>(theirs_.data());
        return {std::vector<std::byte>(mine.begin(), mine.end()),
                std::vector<std::byte>(theirs, theirs + theirs_.size())};
    }

private:
    std::string theirs_;
};

/// A description of one rank on the host plugin, with `ranks`, `plugins`, `collectives` and
/// `forceStaged` as JSON text.
std::string describedAs(const std::string &ranks, const std::string &plugins = R"(["host"])",
                        const std::string &collectives = "[true]",
                        const std::string &forceStaged = "false") {
    return R"({"ranks":)" + ranks + R"(,"plugins":)" + plugins + R"(,"collectives":)" +
           collectives + R"(,"force_staged":)" + forceStaged + "}";
}

} // namespace

TEST_CASE("a peer's malformed description of its ranks is refused with an error naming it") {
    std::vector<ComputeClient> devices = openHostDevices(1);
    struct Hostile {
        const char *what;
        std::string text;
        const char *expected; ///< in the message, besides "process 1"
    };
    const Hostile cases[] = {
        {"nested 100000 levels deep", std::string(100000, '[') + std::string(100000, ']'),
         "nesting"},
        {"a 10 MB plugin name", describedAs("1", "[\"" + std::string(10u << 20, 'a') + "\"]"),
         "bytes"},
        {"rank count 2^40", describedAs("1099511627776"), "/ranks"},
        {"rank count 2^32 + 1 (1 when cut to 32 bits)", describedAs("4294967297"), "/ranks"},
        {"rank count -1", describedAs("-1", R"(["host"])"), "/ranks"},
        {"rank count 0", describedAs("0", "[]", "[]"), "/ranks"},
        {"rank count true", describedAs("true"), "/ranks"},
        {"rank count 1.5", describedAs("1.5"), "/ranks"},
        {"rank count 1e999", describedAs("1e999"), "/ranks"},
        {"rank count as a string", describedAs("\"1\""), "/ranks"},
        {"a plugin name that is a number", describedAs("1", "[7]"), "/plugins/0"},
        {"an empty plugin name", describedAs("1", R"([""])"), "/plugins/0"},
        {"more plugins than ranks", describedAs("1", R"(["host","host"])"), "/plugins"},
        {"plugins an object", describedAs("1", R"({"0":"host"})"), "/plugins"},
        {"collectives as numbers", describedAs("1", R"(["host"])", "[1]"), "/collectives/0"},
        {"force_staged a string", describedAs("1", R"(["host"])", "[true]", "\"no\""),
         "/force_staged"},
        {"the rank count twice", R"({"ranks":1,"ranks":2})", "duplicate key 'ranks'"},
        {"no rank count",
         R"({"plugins":["host"],"collectives":[true],"force_staged":false})", "ranks"},
        {"an unknown key", R"({"ranks":1,"plugins":["host"],"collectives":[true],)"
                           R"("force_staged":false,"extra":1})",
         "/extra"},
        {"an array", "[1,2,3]", "object"},
        {"not JSON", R"({"ranks":)", "JSON"},
        {"nothing", "", "JSON"},
        {"a NUL byte", std::string("{\"ranks\":1\0}", 12), "NUL"},
    };
    CommunicatorOptions options;
    options.timeout = 500ms; // an accepted description would wait this long for process 1
    for (const Hostile &c : cases) {
        const std::string what = c.what;
        CAPTURE(what);
        ScriptedPeer peer(c.text);
        try {
            (void)Communicator::create(devices, peer, options);
            FAIL("accepted");
        } catch (const Error &e) {
            const std::string message = e.what();
            CAPTURE(message.substr(0, 400));
            CHECK((e.code() == ErrorCode::Remote));
            CHECK(message.find("process 1") != std::string::npos);
            CHECK(message.find(c.expected) != std::string::npos);
            CHECK(message.size() < 2000);
        }
    }
}

TEST_CASE("between processes the staged path finds a CPU device with collectives in the runtime") {
    // The given devices are sync-mode host devices, whose collectives are off: create(runtime,
    // ...) must find a device that carries the processes among the runtime's by what it can do.
    Config config;
    config.pluginPathOverride = {
        (std::filesystem::path(HOST_PLUGIN_PATH).parent_path() / "host.json").string()};
    config.pluginOptions["host"] = R"({"devices":2,"collectives":{"address":"127.0.0.1"}})";
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    Runtime runtime(config);
    const std::string dir = freshDirectory("carrier");
    auto join = [&](uint32_t process) -> std::pair<bool, std::vector<float>> {
        std::vector<ComputeClient> mine = openHostDevices(1, "sync");
        auto rendezvous = directoryRendezvous(dir, process, 2);
        CommunicatorOptions options;
        options.timeout = 20s;
        Communicator comm = Communicator::create(runtime, mine, *rendezvous, options);
        std::vector<float> values(16, static_cast<float>(process + 1));
        const Buffer buffer = mine[0].create(values.data(), values.size() * sizeof(float));
        comm.allReduce(std::span(&buffer, 1), std::span(&buffer, 1), 16, DataType::F32,
                       ReduceOp::Sum);
        return {comm.staged(), mine[0].readAs<float>(buffer)};
    };
    auto other = std::async(std::launch::async, join, 1u);
    const auto mine = join(0);
    const auto theirs = other.get();
    CHECK(mine.first);
    CHECK(theirs.first);
    CHECK(mine.second == std::vector<float>(16, 3.0f));
    CHECK(theirs.second == std::vector<float>(16, 3.0f));
    std::filesystem::remove_all(dir);
}

TEST_CASE("a communicator whose other process never comes fails with a timeout naming it") {
    std::vector<ComputeClient> devices = openHostDevices(1);
    const std::string dir = freshDirectory("timeout");
    auto rendezvous = directoryRendezvous(dir, 0, 2);
    CommunicatorOptions options;
    options.timeout = 500ms;
    const auto start = std::chrono::steady_clock::now();
    try {
        (void)Communicator::create(devices, *rendezvous, options);
        FAIL("expected a timeout");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::Timeout));
        CHECK(std::string(e.what()).find("1") != std::string::npos);
    }
    CHECK(std::chrono::steady_clock::now() - start < 10s);
    std::filesystem::remove_all(dir);
}

TEST_CASE("a rank that dies before a collective gives the survivor a clear error, not a hang") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        const std::string dir = freshDirectory(std::string("death") + (staged ? "s" : "g"));
        const std::vector<int> codes = runProcesses(2, 60s, [&](uint32_t p) {
            std::vector<ComputeClient> devices = openHostDevices(1);
            auto rendezvous = directoryRendezvous(dir, p, 2);
            CommunicatorOptions options;
            options.forceStaged = staged;
            options.timeout = 20s;
            options.hostClient = devices[0];
            Communicator comm = Communicator::create(devices, *rendezvous, options);
            // Both have joined (else process 1 could exit while process 0 still connects, and
            // the error would come from create): one more rendezvous step, then process 1 dies.
            (void)rendezvous->allGather({}, 10s);
            if (p == 1) _exit(0); // dies without a word, its sockets closed by the kernel
            const std::vector<float> ones(1 << 20, 1.0f);
            Buffer b = devices[0].createFrom<float>(ones);
            try {
                comm.allReduce(b, b, ones.size(), DataType::F32, ReduceOp::Sum);
                devices[0].sync();
            } catch (const Error &e) {
                const std::string text = e.what();
                std::fprintf(stderr, "survivor: %s\n", text.c_str());
                const bool remote = e.code() == ErrorCode::Remote ||
                                    text.find("remote") != std::string::npos ||
                                    text.find("peer") != std::string::npos;
                return remote ? 0 : 2;
            }
            return 1; // the collective "succeeded" without its peer
        });
        CHECK(codes[0] == 0);
        CHECK(codes[1] == 0);
        std::filesystem::remove_all(dir);
    }
}

TEST_CASE("a refused collective records nothing on any rank, and the communicator stays usable") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        std::vector<ComputeClient> devices = openHostDevices(2);
        auto rendezvous = localRendezvous();
        CommunicatorOptions options;
        options.forceStaged = staged;
        options.timeout = 5s;
        Communicator comm = Communicator::create(devices, *rendezvous, options);
        std::vector<Buffer> send, recv;
        for (uint32_t r = 0; r < 2; ++r) {
            const std::vector<float> mine(4, 10.0f * static_cast<float>(r + 1));
            send.push_back(devices[r].createFrom<float>(mine));
            recv.push_back(devices[r].empty(16));
        }
        const std::vector<Buffer> tooSmall = {recv[0], devices[1].empty(8)};
        CHECK_THROWS_WITH_AS(comm.allReduce(send, tooSmall, 4, DataType::F32, ReduceOp::Sum),
                             doctest::Contains("overruns"), Error);
        CHECK_THROWS_WITH_AS(
            comm.allReduce(send, recv, 4, DataType::F32, static_cast<ReduceOp>(42)),
            doctest::Contains("is not a ReduceOp"), Error);
        CHECK_THROWS_WITH_AS(comm.allReduce(send, recv, 4, static_cast<DataType>(77), ReduceOp::Sum),
                             doctest::Contains("is not a DataType"), Error);
        // Had rank 0's part of the refused call gone out, this one would pair with it.
        comm.allReduce(send, recv, 4, DataType::F32, ReduceOp::Sum);
        for (uint32_t r = 0; r < 2; ++r)
            CHECK(devices[r].readAs<float>(recv[r]) == std::vector<float>(4, 30.0f));
    }
}

TEST_CASE("send and recv between ranks of one process outside a group, or unmatched, are refused") {
    std::vector<ComputeClient> devices = openHostDevices(2);
    auto rendezvous = localRendezvous();
    CommunicatorOptions options;
    options.timeout = 5s;
    Communicator comm = Communicator::create(devices, *rendezvous, options);
    REQUIRE(!comm.staged());
    Buffer in = devices[1].empty(16);
    Buffer out = devices[0].createFrom<int32_t>(std::vector<int32_t>{1, 2, 3, 4});
    CHECK_THROWS_WITH_AS(comm.recv(in, 4, DataType::I32, 0, 1), doctest::Contains("one group"),
                         Error);
    comm.groupStart();
    comm.recv(in, 4, DataType::I32, 0, 1); // no matching send
    CHECK_THROWS_WITH_AS(comm.groupEnd(), doctest::Contains("receives 1"), Error);
    comm.groupStart();
    comm.send(out, 4, DataType::I32, 1, 0);
    comm.recv(in, 4, DataType::I32, 0, 1);
    comm.groupEnd();
    CHECK(devices[1].readAs<int32_t>(in) == std::vector<int32_t>{1, 2, 3, 4});
    // Nothing refused was left behind to pair with this.
    Buffer a = devices[0].createFrom<int32_t>(std::vector<int32_t>{5});
    Buffer b = devices[1].createFrom<int32_t>(std::vector<int32_t>{6});
    comm.allReduce(std::vector<Buffer>{a, b}, std::vector<Buffer>{a, b}, 1, DataType::I32,
                   ReduceOp::Sum);
    CHECK(devices[0].readAs<int32_t>(a) == std::vector<int32_t>{11});
    CHECK(devices[1].readAs<int32_t>(b) == std::vector<int32_t>{11});
}

TEST_CASE("processes that disagree on a collective's count get an error, and none is terminated") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        const std::string dir = freshDirectory(std::string("mismatch") + (staged ? "s" : "g"));
        const std::vector<int> codes = runProcesses(2, 60s, [&](uint32_t p) {
            std::vector<ComputeClient> devices = openHostDevices(1);
            auto rendezvous = directoryRendezvous(dir, p, 2);
            CommunicatorOptions options;
            options.forceStaged = staged;
            options.timeout = 10s;
            options.hostClient = devices[0];
            Communicator comm = Communicator::create(devices, *rendezvous, options);
            const uint64_t count = p == 0 ? 16 : 32; // the bug under test: counts differ
            Buffer b = devices[0].createFrom<float>(std::vector<float>(count, 1.0f));
            try {
                comm.allReduce(b, b, count, DataType::F32, ReduceOp::Sum);
                devices[0].sync();
            } catch (const Error &e) {
                std::fprintf(stderr, "process %u: %s\n", p, e.what());
                return 0;
            }
            return 1; // mismatched counts "succeeded"
        });
        CHECK(codes[0] == 0); // 134 (SIGABRT) before the signature check
        CHECK(codes[1] == 0);
        std::filesystem::remove_all(dir);
    }
}

TEST_CASE("two sends to another process in one staged group each deliver their own bytes") {
    // The host plugin runs a group's collectives together at its end: a send buffer the staged
    // path freed after its post was handed to the group's next post and overwritten before it
    // was sent ("received 22 then 22").
    const std::string dir = freshDirectory("twosends");
    const std::vector<int> codes = runProcesses(2, 60s, [&](uint32_t p) {
        std::vector<ComputeClient> devices = openHostDevices(1);
        auto rendezvous = directoryRendezvous(dir, p, 2);
        CommunicatorOptions options;
        options.forceStaged = true;
        options.timeout = 30s;
        options.hostClient = devices[0];
        Communicator comm = Communicator::create(devices, *rendezvous, options);
        const uint64_t count = 37;
        const std::vector<int32_t> first(count, 11), second(count, 22);
        Buffer a = devices[0].create(first.data(), count * 4);
        Buffer b = devices[0].create(second.data(), count * 4);
        Buffer x = devices[0].empty(count * 4);
        Buffer y = devices[0].empty(count * 4);
        comm.groupStart();
        if (p == 0) {
            comm.send(a, count, DataType::I32, 1);
            comm.send(b, count, DataType::I32, 1);
        } else {
            comm.recv(x, count, DataType::I32, 0);
            comm.recv(y, count, DataType::I32, 0);
        }
        comm.groupEnd();
        if (p == 0) return 0;
        const std::vector<int32_t> gx = devices[0].readAs<int32_t>(x);
        const std::vector<int32_t> gy = devices[0].readAs<int32_t>(y);
        if (gx == first && gy == second) return 0;
        std::fprintf(stderr, "process 1 received %d then %d (want 11 then 22)\n", gx[0], gy[0]);
        return 1;
    });
    CHECK(codes[0] == 0);
    CHECK(codes[1] == 0);
    std::filesystem::remove_all(dir);
}

// ----- refusals on one rank, and groups ---------------------------------------------------------

namespace {

constexpr uint32_t kRanks = 4;
constexpr uint64_t kCount = 8;
constexpr float kUnwritten = -1.0f;
/// Every element of the sends of a refused call: a result that contains it came from a leftover.
constexpr float kRefusedValue = 50.0f;

/// Four host-plugin devices of one process and a communicator over them, on Gloo or staged. The
/// engine timeout (20 s) lies far above the watchdogs (5 s): ranks that were issued a call the
/// last rank refused wait for it until that timeout, so the follow-up would miss its watchdog.
struct FourRanks {
    std::vector<ComputeClient> devices = openHostDevices(kRanks);
    std::unique_ptr<Rendezvous> rendezvous = localRendezvous();
    Communicator comm;

    explicit FourRanks(bool staged) {
        CommunicatorOptions options;
        options.forceStaged = staged;
        options.timeout = 20s;
        comm = Communicator::create(devices, *rendezvous, options);
        REQUIRE(comm.staged() == staged);
    }
    std::vector<Buffer> filled(float value, uint64_t elements) {
        std::vector<Buffer> out;
        for (ComputeClient &d : devices)
            out.push_back(d.createFrom<float>(std::vector<float>(elements, value)));
        return out;
    }
    std::vector<std::vector<float>> read(const std::vector<Buffer> &buffers) {
        std::vector<std::vector<float>> out;
        for (uint32_t r = 0; r < kRanks; ++r) out.push_back(devices[r].readAs<float>(buffers[r]));
        return out;
    }
};

/// Runs `body` on another thread and returns its result, or nothing when it threw (a failed
/// check). A body still running after `limit` fails the test; it is waited for all the same (the
/// engine timeout ends it).
template <class F>
auto withinLimit(std::chrono::seconds limit, const std::string &what, F body)
    -> std::optional<decltype(body())> {
    auto outcome = std::async(std::launch::async, std::move(body));
    const bool inTime = outcome.wait_for(limit) == std::future_status::ready;
    CHECK_MESSAGE(inTime, what << " took longer than " << limit.count() << " s");
    try {
        return outcome.get();
    } catch (const std::exception &e) {
        FAIL_CHECK(what << " failed: " << std::string(e.what()));
        return std::nullopt;
    }
}

enum class Op { AllReduce, Reduce, Broadcast, AllGather, ReduceScatter, SendRecv };
constexpr Op kAllOps[] = {Op::AllReduce, Op::Reduce,        Op::Broadcast,
                          Op::AllGather, Op::ReduceScatter, Op::SendRecv};

const char *nameOf(Op op) {
    switch (op) {
    case Op::AllReduce: return "allReduce";
    case Op::Reduce: return "reduce";
    case Op::Broadcast: return "broadcast";
    case Op::AllGather: return "allGather";
    case Op::ReduceScatter: return "reduceScatter";
    case Op::SendRecv: return "send/recv";
    }
    return "?";
}

/// `op` over every rank, f32, kCount elements a part: reduce and broadcast rooted at the last
/// rank (the host plugin checks a reduce's recv and a broadcast's send on the root only);
/// send/recv around the ring in one group that is always ended, the first failure rethrown.
void issue(Communicator &comm, Op op, std::span<const Buffer> send, std::span<const Buffer> recv) {
    switch (op) {
    case Op::AllReduce: comm.allReduce(send, recv, kCount, DataType::F32, ReduceOp::Sum); return;
    case Op::Reduce:
        comm.reduce(send, recv, kCount, DataType::F32, ReduceOp::Sum, kRanks - 1);
        return;
    case Op::Broadcast: comm.broadcast(send, recv, kCount, DataType::F32, kRanks - 1); return;
    case Op::AllGather: comm.allGather(send, recv, kCount, DataType::F32); return;
    case Op::ReduceScatter:
        comm.reduceScatter(send, recv, kCount, DataType::F32, ReduceOp::Sum);
        return;
    case Op::SendRecv: break;
    }
    std::exception_ptr failure;
    const auto attempt = [&](const std::function<void()> &call) {
        try {
            call();
        } catch (...) {
            if (!failure) failure = std::current_exception();
        }
    };
    comm.groupStart();
    for (uint32_t r = 0; r < kRanks; ++r)
        attempt([&] { comm.send(send[r], kCount, DataType::F32, (r + 1) % kRanks, r); });
    for (uint32_t r = 0; r < kRanks; ++r)
        attempt([&] { comm.recv(recv[r], kCount, DataType::F32, (r + kRanks - 1) % kRanks, r); });
    attempt([&] { comm.groupEnd(); });
    if (failure) std::rethrow_exception(failure);
}

/// What recv[r] holds after a valid `op` whose rank q sent valueOf(q, i) (kCount * kRanks
/// elements, the rest of recv unwritten).
std::vector<float> expected(Op op, uint32_t r) {
    std::vector<float> out(kCount * kRanks, kUnwritten);
    const auto sum = [](uint64_t i) {
        float acc = 0;
        for (uint32_t q = 0; q < kRanks; ++q) acc += static_cast<float>(valueOf(q, i));
        return acc;
    };
    for (uint64_t i = 0; i < kCount; ++i) {
        switch (op) {
        case Op::AllReduce: out[i] = sum(i); break;
        case Op::Reduce:
            if (r == kRanks - 1) out[i] = sum(i);
            break;
        case Op::Broadcast: out[i] = static_cast<float>(valueOf(kRanks - 1, i)); break;
        case Op::AllGather:
            for (uint32_t q = 0; q < kRanks; ++q)
                out[q * kCount + i] = static_cast<float>(valueOf(q, i));
            break;
        case Op::ReduceScatter: out[i] = sum(r * kCount + i); break;
        case Op::SendRecv:
            out[i] = static_cast<float>(valueOf((r + kRanks - 1) % kRanks, i));
            break;
        }
    }
    return out;
}

/// What is wrong with the last rank's part of the refused call.
enum class Fault { Overlap, Recording };

/// Issues `op` with the last rank's part bad in `fault`: it must be refused before anything of
/// it reached any rank. Then, under a watchdog, nothing of it was written anywhere, and the same
/// operation with valid buffers completes with its own result.
void checkRefusedOnLastRank(bool staged, Op op, Fault fault) {
    FourRanks f(staged);
    const uint64_t elements = kCount * kRanks;
    std::vector<Buffer> send = f.filled(kRefusedValue, elements);
    std::vector<Buffer> recv = f.filled(kUnwritten, elements);
    Buffer both = f.devices[kRanks - 1].createFrom<float>(
        std::vector<float>(2 * elements, kUnwritten));
    std::vector<Buffer> badSend = send, badRecv = recv;
    if (fault == Fault::Overlap) {
        // One element apart: not in place for any operation (the in-place layouts: the same
        // range; all_gather's send at recv + rank * count; reduce_scatter's recv at send + rank
        // * count).
        badSend[kRanks - 1] = both.view(0);
        badRecv[kRanks - 1] = both.view(sizeof(float));
        CHECK_THROWS_WITH_AS(issue(f.comm, op, badSend, badRecv), doctest::Contains("overlap"),
                             Error);
    } else {
        f.devices[kRanks - 1].beginRecording();
        CHECK_THROWS_WITH_AS(issue(f.comm, op, badSend, badRecv),
                             doctest::Contains("a collective cannot be recorded"), Error);
        (void)f.devices[kRanks - 1].endRecording();
    }
    std::vector<Buffer> good;
    for (uint32_t r = 0; r < kRanks; ++r) {
        std::vector<float> mine(elements);
        for (uint64_t i = 0; i < elements; ++i) mine[i] = static_cast<float>(valueOf(r, i));
        good.push_back(f.devices[r].createFrom<float>(mine));
    }
    const auto outcome = withinLimit(5s, "the follow-up", [&] {
        std::vector<std::vector<float>> before = f.read(recv);
        before.push_back(f.devices[kRanks - 1].readAs<float>(both));
        issue(f.comm, op, good, recv);
        return std::pair(before, f.read(recv));
    });
    if (!outcome) return;
    const auto &[untouched, results] = *outcome;
    for (uint32_t r = 0; r < kRanks; ++r) {
        CAPTURE(r);
        CHECK(untouched[r] == std::vector<float>(elements, kUnwritten));
        CHECK(results[r] == expected(op, r));
    }
    CHECK(untouched[kRanks] == std::vector<float>(2 * elements, kUnwritten));
}

/// Sends rank 0 -> rank 1 in a group that must pass: rank 1 gets `value`s.
void checkGroupDelivers(FourRanks &f, float value) {
    const auto results = withinLimit(5s, "a correct group", [&] {
        Buffer out = f.devices[0].createFrom<float>(std::vector<float>(kCount, value));
        Buffer in = f.devices[1].createFrom<float>(std::vector<float>(kCount, kUnwritten));
        f.comm.groupStart();
        f.comm.send(out, kCount, DataType::F32, 1, 0);
        f.comm.recv(in, kCount, DataType::F32, 0, 1);
        f.comm.groupEnd();
        return f.devices[1].readAs<float>(in);
    });
    CHECK(results == std::vector<float>(kCount, value));
}

} // namespace

TEST_CASE("overlapping ranges on the last local rank are refused before any rank is issued") {
    for (const bool staged : {false, true})
        for (const Op op : kAllOps) {
            if (op == Op::SendRecv) continue; // one buffer: nothing can overlap
            CAPTURE(staged);
            const std::string name = nameOf(op);
            CAPTURE(name);
            checkRefusedOnLastRank(staged, op, Fault::Overlap);
        }
}

TEST_CASE("a recording stream on the last local rank refuses the call before any rank is issued") {
    for (const bool staged : {false, true})
        for (const Op op : kAllOps) {
            CAPTURE(staged);
            const std::string name = nameOf(op);
            CAPTURE(name);
            checkRefusedOnLastRank(staged, op, Fault::Recording);
        }
}

TEST_CASE("the staged engine refuses the buffers the native one refuses, before writing any") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        FourRanks f(staged);
        std::vector<Buffer> send = f.filled(1.0f, kCount);
        std::vector<Buffer> recv = f.filled(kUnwritten, kCount);
        std::vector<Buffer> small = recv, zero = recv;
        small[kRanks - 1] = f.devices[kRanks - 1].empty(sizeof(float));
        zero[kRanks - 1] = f.devices[kRanks - 1].empty(0);
        // A reduce's recv and a broadcast's send off the root must fit too.
        CHECK_THROWS_WITH_AS(f.comm.reduce(send, small, kCount, DataType::F32, ReduceOp::Sum, 0),
                             doctest::Contains("overruns"), Error);
        CHECK_THROWS_WITH_AS(f.comm.broadcast(small, recv, kCount, DataType::F32, 0),
                             doctest::Contains("overruns"), Error);
        // A zero-byte Buffer, even for a count of 0.
        CHECK_THROWS_WITH_AS(f.comm.allReduce(send, zero, 0, DataType::F32, ReduceOp::Sum),
                             doctest::Contains("zero-byte"), Error);
        const auto results = withinLimit(5s, "the follow-up", [&] {
            std::vector<std::vector<float>> before = f.read(recv);
            f.comm.allReduce(send, recv, kCount, DataType::F32, ReduceOp::Sum);
            return std::pair(before, f.read(recv));
        });
        if (!results) continue;
        for (uint32_t r = 0; r < kRanks; ++r) {
            CAPTURE(r);
            CHECK(results->first[r] == std::vector<float>(kCount, kUnwritten));
            CHECK(results->second[r] == std::vector<float>(kCount, 4.0f));
        }
    }
}

TEST_CASE("the in-place layouts are accepted on every engine") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        FourRanks f(staged);
        std::vector<Buffer> send, recv;
        // all_gather: send at recv + rank * count; reduce_scatter: recv at send + rank * count.
        for (uint32_t r = 0; r < kRanks; ++r) {
            std::vector<float> whole(kCount * kRanks, kUnwritten);
            for (uint64_t i = 0; i < kCount * kRanks; ++i)
                whole[i] = static_cast<float>(valueOf(r, i));
            recv.push_back(f.devices[r].createFrom<float>(whole));
            send.push_back(recv[r].view(r * kCount * sizeof(float), kCount * sizeof(float)));
        }
        std::vector<Buffer> parts;
        for (uint32_t r = 0; r < kRanks; ++r)
            parts.push_back(recv[r].view(r * kCount * sizeof(float), kCount * sizeof(float)));
        f.comm.reduceScatter(recv, parts, kCount, DataType::F32, ReduceOp::Sum);
        for (uint32_t r = 0; r < kRanks; ++r) {
            std::vector<float> part = f.devices[r].readAs<float>(parts[r]);
            std::vector<float> want = expected(Op::ReduceScatter, r);
            want.resize(kCount);
            CHECK(part == want);
        }
        // Now each rank's own part is the reduced one; gather them in place.
        f.comm.allGather(send, recv, kCount, DataType::F32);
        for (uint32_t r = 0; r < kRanks; ++r) {
            std::vector<float> want;
            for (uint32_t q = 0; q < kRanks; ++q) {
                std::vector<float> part = expected(Op::ReduceScatter, q);
                want.insert(want.end(), part.begin(), part.begin() + kCount);
            }
            CHECK(f.devices[r].readAs<float>(recv[r]) == want);
        }
    }
}

TEST_CASE("a group whose local sends and recvs do not pair up is refused whole on every engine") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        FourRanks f(staged);
        Buffer old = f.devices[0].createFrom<float>(std::vector<float>(kCount, kRefusedValue));
        Buffer toRank3 = f.devices[2].createFrom<float>(std::vector<float>(kCount, 7.0f));
        Buffer atRank3 = f.devices[3].createFrom<float>(std::vector<float>(kCount, kUnwritten));
        Buffer in = f.devices[1].createFrom<float>(std::vector<float>(kCount, kUnwritten));
        SUBCASE("a send without its recv, beside a pair that matches") {
            f.comm.groupStart();
            f.comm.send(old, kCount, DataType::F32, 1, 0);
            f.comm.send(toRank3, kCount, DataType::F32, 3, 2);
            f.comm.recv(atRank3, kCount, DataType::F32, 2, 3);
            CHECK_THROWS_WITH_AS(f.comm.groupEnd(), doctest::Contains("receives 0"), Error);
            // Nothing of the group's local point-to-point operations ran, not even the pair.
            CHECK(f.devices[3].readAs<float>(atRank3) == std::vector<float>(kCount, kUnwritten));
        }
        SUBCASE("a recv without its send") {
            f.comm.groupStart();
            f.comm.recv(in, kCount, DataType::F32, 0, 1);
            CHECK_THROWS_WITH_AS(f.comm.groupEnd(), doctest::Contains("receives 1"), Error);
        }
        SUBCASE("a send and a recv of different sizes") {
            f.comm.groupStart();
            f.comm.send(old, kCount, DataType::F32, 1, 0);
            f.comm.recv(in, kCount / 2, DataType::F32, 0, 1);
            CHECK_THROWS_WITH_AS(f.comm.groupEnd(), doctest::Contains("counts or types differ"),
                                 Error);
        }
        SUBCASE("a send and a recv of the same bytes in another type") {
            // Gloo refuses the pair at run time and loses the communicator: every engine
            // refuses it at groupEnd instead, before anything is issued.
            f.comm.groupStart();
            f.comm.send(old, kCount, DataType::F32, 1, 0);
            f.comm.recv(in, kCount, DataType::I32, 0, 1);
            CHECK_THROWS_WITH_AS(f.comm.groupEnd(), doctest::Contains("counts or types differ"),
                                 Error);
        }
        SUBCASE("a send or a recv outside a group") {
            CHECK_THROWS_WITH_AS(f.comm.send(old, kCount, DataType::F32, 1, 0),
                                 doctest::Contains("one group"), Error);
            CHECK_THROWS_WITH_AS(f.comm.recv(in, kCount, DataType::F32, 0, 1),
                                 doctest::Contains("one group"), Error);
        }
        CHECK_THROWS_WITH_AS(f.comm.groupEnd(), doctest::Contains("no group is open"), Error);
        CHECK(f.devices[1].readAs<float>(in) == std::vector<float>(kCount, kUnwritten));
        // A later group starts clean: its recv gets its own send, not the refused one's.
        checkGroupDelivers(f, 3.0f);
        checkGroupDelivers(f, 4.0f);
    }
}

TEST_CASE("nested groups issue their operations at the outermost groupEnd on every engine") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        FourRanks f(staged);
        std::vector<Buffer> out, in = f.filled(kUnwritten, kCount);
        for (uint32_t r = 0; r < kRanks; ++r) {
            std::vector<float> mine(kCount);
            for (uint64_t i = 0; i < kCount; ++i) mine[i] = static_cast<float>(valueOf(r, i));
            out.push_back(f.devices[r].createFrom<float>(mine));
        }
        const auto results = withinLimit(5s, "the nested groups", [&] {
            f.comm.groupStart();
            f.comm.groupStart(); // the sends alone: an inner groupEnd checks nothing
            for (uint32_t r = 0; r < kRanks; ++r)
                f.comm.send(out[r], kCount, DataType::F32, (r + 1) % kRanks, r);
            f.comm.groupEnd();
            f.comm.groupStart();
            f.comm.groupStart();
            for (uint32_t r = 0; r < kRanks; ++r)
                f.comm.recv(in[r], kCount, DataType::F32, (r + kRanks - 1) % kRanks, r);
            f.comm.groupEnd();
            f.comm.groupEnd();
            f.comm.groupEnd();
            return f.read(in);
        });
        if (!results) continue;
        for (uint32_t r = 0; r < kRanks; ++r) {
            CAPTURE(r);
            std::vector<float> want = expected(Op::SendRecv, r);
            want.resize(kCount);
            CHECK((*results)[r] == want);
        }
        CHECK_THROWS_WITH_AS(f.comm.groupEnd(), doctest::Contains("no group is open"), Error);
        // The smallest nesting, one pair.
        Buffer a = f.devices[2].createFrom<float>(std::vector<float>(kCount, 9.0f));
        Buffer b = f.devices[0].createFrom<float>(std::vector<float>(kCount, kUnwritten));
        f.comm.groupStart();
        f.comm.groupStart();
        f.comm.send(a, kCount, DataType::F32, 0, 2);
        f.comm.recv(b, kCount, DataType::F32, 2, 0);
        f.comm.groupEnd();
        f.comm.groupEnd();
        CHECK(f.devices[0].readAs<float>(b) == std::vector<float>(kCount, 9.0f));
    }
}
