// backplane::Trace, BACKPLANE_TRACE and renderTraceSvg on the host plugin (public API): a known
// two-stream program gives the expected events on the expected lanes in order; nothing is
// recorded or written while no trace records; bad trace files give errors naming file and path.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>
#include <backplane/trace.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

using namespace backplane;
namespace fs = std::filesystem;

namespace {

constexpr uint32_t kCount = 4096;
constexpr uint32_t kMemoryLane = 1u << 20; // trace_recorder.hpp's kTraceMemoryLane

std::atomic<bool> gate{true};

/// Opens the gate when it goes, so a failed check never leaves a worker spinning.
struct GateOpener {
    ~GateOpener() { gate.store(true); }
};

/// x[i] += 1 once the gate is open (one workgroup; bindings x; scalars {uint32 n}).
void produceHost(const bp_host_kernel_context *c) {
    while (!gate.load()) {
    }
    const uint32_t n = *static_cast<const uint32_t *>(c->scalars);
    auto *x = static_cast<uint32_t *>(c->buffers[0]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) x[i] += 1;
    }
}

/// y[i] = 2 * x[i] (bindings x, y; scalars {uint32 n}).
void consumeHost(const bp_host_kernel_context *c) {
    const uint32_t n = *static_cast<const uint32_t *>(c->scalars);
    const auto *x = static_cast<const uint32_t *>(c->buffers[0]);
    auto *y = static_cast<uint32_t *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) y[i] = 2 * x[i];
    }
}

Config hostConfig(const std::string &mode) {
    Config config;
    config.pluginPathOverride = {HOST_MANIFEST};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    config.pluginOptions["host"] = R"({"workers":2,"mode":")" + mode + "\"}";
    return config;
}

fs::path scratch(const std::string &name) {
    const fs::path dir = fs::path(TEST_OUT_DIR) / "trace";
    fs::create_directories(dir);
    fs::remove(dir / name);
    return dir / name;
}

/// The program: x written and incremented on stream 1 (a gated kernel, so stream 2's launch must
/// wait for it on the device), y = 2x on stream 2, y read back on stream 2. Scheduler streams run
/// stream 1's work in the caller when stream 2 needs it: there the gate stays open.
std::vector<uint32_t> runProgram(ComputeClient &client, bool gated = true) {
    GateOpener opener;
    std::vector<uint32_t> values(kCount);
    for (uint32_t i = 0; i < kCount; ++i) values[i] = i;
    const KernelSource produce{"produce", {KernelVariant::host(&produceHost, "produce")}};
    const KernelSource consume{"consume", {KernelVariant::host(&consumeHost, "consume")}};
    Buffer x, y;
    {
        StreamGuard one(1);
        x = client.createFrom<uint32_t>(values);
        gate.store(!gated);
        Dispatch d;
        d.block = {256, 1, 1};
        d.grid = {kCount / 256, 1, 1};
        d.bindings = {x};
        d.scalar(kCount);
        client.execute(produce, d);
    }
    StreamGuard two(2);
    y = client.empty(kCount * sizeof(uint32_t));
    Dispatch d;
    d.block = {256, 1, 1};
    d.grid = {kCount / 256, 1, 1};
    d.bindings = {x, y};
    d.scalar(kCount);
    client.execute(consume, d);
    gate.store(true);
    return client.readAs<uint32_t>(y);
}

nlohmann::json readTrace(const fs::path &file) {
    std::ifstream in(file);
    REQUIRE(in.good());
    return nlohmann::json::parse(in);
}

std::vector<nlohmann::json> completeEvents(const nlohmann::json &trace) {
    std::vector<nlohmann::json> out;
    for (const auto &e : trace.at("traceEvents"))
        if (e.at("ph") == "X") out.push_back(e);
    return out;
}

/// The first X event of device `pid` whose name starts with `name`, on lane `tid` (null when
/// none).
const nlohmann::json *find(const std::vector<nlohmann::json> &events, uint64_t pid, uint64_t tid,
                           const std::string &name) {
    for (const auto &e : events)
        if (e.at("pid") == pid && e.at("tid") == tid &&
            e.at("name").get<std::string>().rfind(name, 0) == 0)
            return &e;
    return nullptr;
}

std::string errorOf(const fs::path &file) {
    try {
        renderTraceSvg(file);
    } catch (const Error &e) {
        CHECK(std::string(toString(e.code())) == "invalid_argument");
        return e.what();
    }
    FAIL("renderTraceSvg accepted " << file);
    return {};
}

} // namespace

TEST_CASE("a trace has a two-stream program's events on their lanes, in order") {
    const fs::path file = scratch("two_streams.json");
    const Runtime runtime(hostConfig("async"));
    ComputeClient client = runtime.open(runtime.select("host"));
    Trace trace(file);
    CHECK(Trace::recording());
    const std::vector<uint32_t> y = runProgram(client);
    for (uint32_t i = 0; i < kCount; ++i) REQUIRE(y[i] == 2 * (i + 1));
    const size_t written = trace.stop();
    CHECK_FALSE(Trace::recording());
    CHECK(trace.stop() == 0); // idempotent

    const nlohmann::json json = readTrace(file);
    const std::vector<nlohmann::json> events = completeEvents(json);
    CHECK(events.size() == written);
    for (const auto &e : events) {
        INFO(e.dump());
        CHECK(e.at("ts").get<double>() >= 0);
        CHECK(e.at("dur").get<double>() >= 0);
    }
    const nlohmann::json *produce = nullptr;
    for (const auto &e : events)
        if (e.at("name") == "produce") produce = &e;
    REQUIRE(produce != nullptr);
    const uint64_t pid = produce->at("pid");

    // Each operation on the lane (tid) of its stream's slot: streams 1 and 2 are slots 1 and 2.
    const auto lane = [&](const std::string &name, uint64_t tid) {
        const nlohmann::json *e = find(events, pid, tid, name);
        INFO(name << " on lane " << tid);
        REQUIRE(e != nullptr);
        return *e;
    };
    const nlohmann::json write = lane("write", 1);
    const nlohmann::json chunk = lane("write chunk", 1);
    const nlohmann::json launch1 = lane("produce", 1);
    const nlohmann::json launch2 = lane("consume", 2);
    const nlohmann::json wait = lane("wait for slot 1", 2);
    const nlohmann::json read = lane("read (async)", 2);
    const nlohmann::json readWait = lane("read (wait)", 2);
    CHECK(lane("alloc", 2).at("args").at("bytes") == kCount * 4);
    CHECK(write.at("args").at("bytes") == kCount * 4);
    CHECK(read.at("args").at("bytes") == kCount * 4);
    CHECK(write.at("cat") == "transfer");
    CHECK(chunk.at("cat") == "staging");
    CHECK(launch1.at("cat") == "launch");
    CHECK(wait.at("cat") == "wait");
    CHECK(wait.at("args").at("origin_slot") == 1);
    CHECK(lane("new page", kMemoryLane).at("cat") == "memory");
    CHECK(find(events, pid, 1, "consume") == nullptr); // each launch on its own stream's lane
    CHECK(find(events, pid, 2, "produce") == nullptr);
    CHECK(find(events, pid, 1, "wait for slot") == nullptr); // slot 1 waited for nothing

    // Program order, and the cross-stream wait inside the launch that needed it.
    const auto ts = [](const nlohmann::json &e) { return e.at("ts").get<double>(); };
    const auto end = [&](const nlohmann::json &e) { return ts(e) + e.at("dur").get<double>(); };
    CHECK(ts(write) <= ts(chunk));
    CHECK(end(chunk) <= end(write) + 0.002);
    CHECK(end(write) <= ts(launch1) + 0.002);
    CHECK(end(launch1) <= ts(launch2) + 0.002);
    CHECK(ts(launch2) <= ts(wait));
    CHECK(end(wait) <= end(launch2) + 0.002);
    CHECK(end(launch2) <= ts(read) + 0.002);
    CHECK(end(read) <= ts(readWait) + 0.002);

    // Metadata names the device and both lanes.
    bool device = false, slot1 = false, slot2 = false;
    for (const auto &e : json.at("traceEvents")) {
        if (e.at("ph") != "M" || e.at("pid") != pid) continue;
        const std::string name = e.at("args").value("name", "");
        device = device || (e.at("name") == "process_name" && name.find("host:0") == 0);
        slot1 = slot1 || (e.at("name") == "thread_name" && e.at("tid") == 1 &&
                          name == "stream slot 1");
        slot2 = slot2 || (e.at("name") == "thread_name" && e.at("tid") == 2 &&
                          name == "stream slot 2");
    }
    CHECK(device);
    CHECK(slot1);
    CHECK(slot2);

    // And the trace draws: one lane per (device, slot), the kernels' names in boxes.
    const std::string svg = renderTraceSvg(file);
    CHECK(svg.find("<svg") != std::string::npos);
    CHECK(svg.find("stream slot 1") != std::string::npos);
    CHECK(svg.find("stream slot 2") != std::string::npos);
    CHECK(svg.find("<title>produce (launch)") != std::string::npos);
    CHECK(svg.find("<title>wait for slot 1 (wait)") != std::string::npos);
}

TEST_CASE("scheduler streams trace their launches on their slots' lanes too") {
    const fs::path file = scratch("sync_mode.json");
    const Runtime runtime(hostConfig("sync"));
    ComputeClient client = runtime.open(runtime.select("host"));
    Trace trace(file);
    const std::vector<uint32_t> y = runProgram(client, false);
    REQUIRE(y[kCount - 1] == 2 * kCount);
    trace.stop();
    const std::vector<nlohmann::json> events = completeEvents(readTrace(file));
    bool produce = false, consume = false;
    for (const auto &e : events) {
        produce = produce || (e.at("name") == "produce" && e.at("tid") == 1);
        consume = consume || (e.at("name") == "consume" && e.at("tid") == 2);
    }
    CHECK(produce);
    CHECK(consume);
}

TEST_CASE("while no trace records, nothing is recorded and no file is written") {
    const fs::path never = scratch("never.json");
    const fs::path later = scratch("later.json");
    {
        const Runtime runtime(hostConfig("async"));
        ComputeClient client = runtime.open(runtime.select("host"));
        CHECK_FALSE(Trace::recording());
        runProgram(client);
    } // the device closes: no GC thread of it records into the trace below
    CHECK_FALSE(fs::exists(never));
    // A trace started afterwards holds none of that work.
    Trace trace(later);
    CHECK(trace.stop() == 0);
    CHECK(completeEvents(readTrace(later)).empty());
}

TEST_CASE("one trace records at a time, and a file that cannot be written is an error") {
    const fs::path file = scratch("first.json");
    {
        Trace first(file);
        CHECK_THROWS_WITH_AS(Trace(scratch("second.json")),
                             doctest::Contains(file.c_str()), Error);
    }
    CHECK(fs::exists(file));
    CHECK_THROWS_AS(Trace(""), Error);

    // Said when the trace starts, not after the run it was to record.
    const fs::path bad = fs::path(TEST_OUT_DIR) / "no such directory" / "trace.json";
    CHECK_THROWS_WITH_AS(Trace{bad}, doctest::Contains(bad.c_str()), Error);
    CHECK_FALSE(Trace::recording());
    // A file that goes away while recording: stop() says so; the destructor logs it instead.
    const fs::path dir = fs::path(TEST_OUT_DIR) / "trace" / "vanishing";
    fs::create_directories(dir);
    Trace unwritable(dir / "trace.json");
    fs::remove_all(dir);
    CHECK_THROWS_WITH_AS(unwritable.stop(), doctest::Contains((dir / "trace.json").c_str()), Error);
    CHECK_FALSE(Trace::recording());
    fs::create_directories(dir);
    CHECK_NOTHROW([&] {
        Trace dropped(dir / "trace.json");
        fs::remove_all(dir);
    }());
    CHECK_FALSE(Trace::recording());
}

TEST_CASE("BACKPLANE_TRACE records from the first Runtime's creation until it goes, once") {
    const fs::path file = scratch("environment.json");
    ::setenv("BACKPLANE_TRACE", file.c_str(), 1);
    {
        const Runtime runtime(hostConfig("async"));
        CHECK(Trace::recording());
        ComputeClient client = runtime.open(runtime.select("host"));
        runProgram(client);
    }
    CHECK_FALSE(Trace::recording());
    REQUIRE(fs::exists(file));
    const std::vector<nlohmann::json> events = completeEvents(readTrace(file));
    bool consume = false;
    for (const auto &e : events) consume = consume || e.at("name") == "consume";
    CHECK(consume);
    // Read once: a later Runtime does not start it again (it would overwrite the file).
    fs::remove(file);
    {
        const Runtime again(hostConfig("async"));
        CHECK_FALSE(Trace::recording());
    }
    CHECK_FALSE(fs::exists(file));
    ::unsetenv("BACKPLANE_TRACE");
}

TEST_CASE("trace render draws a small trace with lanes, names and an axis") {
    const std::string svg = renderTraceSvg(fs::path(TRACE_DATA_DIR) / "small.json");
    CHECK(svg.find("<svg") != std::string::npos);
    CHECK(svg.find("host:0 test device / stream slot 1") != std::string::npos);
    CHECK(svg.find("host:0 test device / stream slot 2") != std::string::npos);
    CHECK(svg.find(">produce<") != std::string::npos);
    CHECK(svg.find("consume &lt;&amp;&gt;") != std::string::npos); // names are escaped
    CHECK(svg.find("4 events") != std::string::npos);             // the instant is not drawn
    CHECK(svg.find(">100 us<") != std::string::npos);             // an axis tick
    CHECK(svg.find("</svg>") != std::string::npos);
}

TEST_CASE("trace render refuses hostile and malformed files, naming the file and JSON path") {
    const fs::path data = TRACE_DATA_DIR;
    const std::string deep = errorOf(data / "hostile_deep.json");
    CHECK(deep.find("hostile_deep.json") != std::string::npos);
    CHECK(deep.find("/traceEvents/0/args") != std::string::npos);

    const std::string types = errorOf(data / "hostile_types.json");
    CHECK(types.find("hostile_types.json") != std::string::npos);
    CHECK(types.find("/traceEvents/1/ts: expected a number, found string") != std::string::npos);

    const auto write = [](const std::string &name, const std::string &text) {
        const fs::path file = scratch(name);
        std::ofstream(file) << text;
        return file;
    };
    const auto refused = [&](const std::string &text, const std::string &path) {
        const fs::path file = write("bad.json", text);
        const std::string message = errorOf(file);
        INFO(message);
        CHECK(message.find(file.string() + ": " + path) != std::string::npos);
    };
    refused("42", "/: expected an array of events");
    refused(R"({"events":[]})", "/: no \"traceEvents\"");
    refused(R"({"traceEvents":{}})", "/traceEvents: expected an array");
    refused(R"({"traceEvents":[1]})", "/traceEvents/0: expected an event object");
    refused(R"({"traceEvents":[{"ts":1}]})", "/traceEvents/0: the event has no \"ph\"");
    refused(R"({"traceEvents":[{"ph":"X","ts":1}]})", "/traceEvents/0: the event has no \"dur\"");
    refused(R"({"traceEvents":[{"ph":"X","ts":1,"dur":-2}]})", "/traceEvents/0/dur: a negative");
    refused(R"({"traceEvents":[{"ph":"X","ts":1,"dur":2,"pid":"a"}]})",
            "/traceEvents/0/pid: expected an integer");
    refused(R"({"traceEvents":[{"ph":"X","ts":1,"dur":2,"name":7}]})",
            "/traceEvents/0/name: expected a string");
    refused(R"({"traceEvents":[{"ph":"M","name":"thread_name"}]})",
            "/traceEvents/0/args: a \"thread_name\" event needs");
    refused(R"({"traceEvents":[{"ph":"X","ts":1e999,"dur":2}]})", "/traceEvents/0/ts");
    // Finite times whose span or end overflows a double (review): refused, not an endless axis.
    refused(R"({"traceEvents":[{"ph":"X","ts":-1e308,"dur":0},{"ph":"X","ts":1e308,"dur":0}]})",
            "/traceEvents: the events span more than a double holds");
    refused(R"({"traceEvents":[{"ph":"X","ts":1e308,"dur":1e308}]})",
            "/traceEvents: the events span more than a double holds");
    refused(R"({"traceEvents":[)", "");
    const std::string missing = errorOf(scratch("missing.json"));
    CHECK(missing.find("missing.json") != std::string::npos);
}

namespace {

constexpr uint32_t kDeviceLane = 1u << 21; // trace_recorder.hpp's kTraceDeviceLane

/// Spins 20 ms (one workgroup; bindings x, which it leaves alone).
void spinHost(const bp_host_kernel_context *) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(20);
    while (std::chrono::steady_clock::now() < until) {
    }
}

/// On stream 1: x written, a 20 ms kernel, x read back (the read draws the device spans).
void runSpin(ComputeClient &client) {
    StreamGuard one(1);
    Buffer x = client.createFrom<uint32_t>(std::vector<uint32_t>(kCount, 7));
    Dispatch d;
    d.bindings = {x};
    client.execute(KernelSource{"spin", {KernelVariant::host(&spinHost, "spin")}}, d);
    CHECK(client.readAs<uint32_t>(x)[0] == 7);
}

} // namespace

TEST_CASE("device times: each operation's device execution is drawn on its slot's device lane, "
          "inside its host span; without the option there is no device lane") {
    const fs::path file = scratch("device_times.json");
    const Runtime runtime(hostConfig("async"));
    ComputeClient client = runtime.open(runtime.select("host"));
    REQUIRE((client.device().capabilities & BP_CAPABILITY_TIMESTAMPS) != 0);
    {
        TraceOptions options;
        options.deviceTimes = true;
        Trace trace(file, options);
        runSpin(client);
        trace.stop();
    }
    const std::vector<nlohmann::json> events = completeEvents(readTrace(file));
    const auto pidOf = [&] {
        for (const auto &e : events)
            if (e.at("name") == "spin") return e.at("pid").get<uint64_t>();
        return uint64_t{0};
    };
    const uint64_t pid = pidOf();
    const nlohmann::json *host = find(events, pid, 1, "spin");
    const nlohmann::json *device = find(events, pid, kDeviceLane + 1, "spin");
    const nlohmann::json *read = find(events, pid, 1, "read (wait)");
    REQUIRE(host != nullptr);
    REQUIRE(device != nullptr);
    REQUIRE(read != nullptr);
    // The kernel ran 20 ms on the device; the host only submitted it.
    CHECK(device->at("dur").get<double>() >= 19000);
    CHECK(device->at("cat") == "launch");
    // It ran after its submission began and before the read that waited for it returned (the
    // anchor's wake-up may place it a little late: 2 ms of slack).
    const double deviceStart = device->at("ts").get<double>();
    const double deviceEnd = deviceStart + device->at("dur").get<double>();
    CHECK(deviceStart >= host->at("ts").get<double>() - 2000);
    CHECK(deviceEnd <= read->at("ts").get<double>() + read->at("dur").get<double>() + 2000);
    // The write of x went through staging: its chunk is on the device lane too.
    CHECK(find(events, pid, kDeviceLane + 1, "write chunk") != nullptr);

    // Without the option: no device lane.
    const fs::path plain = scratch("no_device_times.json");
    {
        Trace trace(plain);
        runSpin(client);
        trace.stop();
    }
    for (const auto &e : completeEvents(readTrace(plain))) CHECK(e.at("tid").get<uint64_t>() < kDeviceLane);
}

TEST_CASE("device times on scheduler streams: nothing on a device lane (the host runs the work "
          "when it is flushed; its boxes are already on the host lanes)") {
    const fs::path file = scratch("device_times_sync.json");
    const Runtime runtime(hostConfig("sync"));
    ComputeClient client = runtime.open(runtime.select("host"));
    TraceOptions options;
    options.deviceTimes = true;
    Trace trace(file, options);
    runSpin(client);
    trace.stop();
    const std::vector<nlohmann::json> events = completeEvents(readTrace(file));
    CHECK(!events.empty());
    for (const auto &e : events) CHECK(e.at("tid").get<uint64_t>() < kDeviceLane);
}

TEST_CASE("device times never hold work back nor fail a call: a read returns while later work "
          "on its stream waits; thousands of spans without a sync; finished work is drawn at "
          "stop() (review findings)") {
    const fs::path file = scratch("device_times_review.json");
    const Runtime runtime(hostConfig("async"));
    ComputeClient client = runtime.open(runtime.select("host"));
    TraceOptions options;
    options.deviceTimes = true;
    Trace trace(file, options);
    {
        StreamGuard one(1);
        GateOpener opener;
        Buffer x = client.createFrom<uint32_t>(std::vector<uint32_t>(kCount, 1));
        client.sync();
        ReadFuture pending = client.read(x);
        gate.store(false); // the kernel below waits for the gate, after the read on the stream
        Dispatch d;
        d.block = {256, 1, 1};
        d.grid = {kCount / 256, 1, 1};
        d.bindings = {x};
        d.scalar(kCount);
        client.execute(KernelSource{"produce", {KernelVariant::host(&produceHost, "produce")}}, d);
        std::atomic<bool> waited{false};
        std::thread watchdog([&waited] { // opens the gate after 5 s if the wait hangs
            const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
            while (!waited.load() && std::chrono::steady_clock::now() < until)
                std::this_thread::sleep_for(std::chrono::milliseconds(5));
            gate.store(true);
        });
        const auto before = std::chrono::steady_clock::now();
        CHECK(pending.wait().size() == kCount * 4);
        // The wait's drawing anchored on a stream of its own, not behind the gated kernel.
        CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(2));
        CHECK_FALSE(gate.load());
        waited.store(true);
        watchdog.join();
        // 3000 fills and no sync: every call succeeds (spans beyond the bound go untimed).
        for (int i = 0; i < 3000; ++i) client.fill(x, static_cast<uint32_t>(i));
        CHECK(client.readAs<uint32_t>(x)[0] == 2999u);
        // A last 20 ms kernel, finished before stop() with no sync or read after it.
        Dispatch spin;
        spin.bindings = {x};
        client.execute(KernelSource{"spin_last", {KernelVariant::host(&spinHost, "spin")}}, spin);
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    trace.stop();
    const std::vector<nlohmann::json> events = completeEvents(readTrace(file));
    bool last = false;
    size_t fills = 0;
    for (const auto &e : events) {
        if (e.at("tid").get<uint64_t>() != kDeviceLane + 1) continue;
        last = last || e.at("name") == "spin_last";
        fills += e.at("name") == "fill";
    }
    CHECK(last);
    CHECK(fills > 0);
}
