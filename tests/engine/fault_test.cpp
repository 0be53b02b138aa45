// Faults a long-running application survives (issue 30), on the host plugin with injected faults
// ("inject_faults"): a sticky fault in each kind of operation loses only its device (every later
// call and every pending future fails with DeviceLost naming the first failure, a second device
// keeps computing); a refused operation fails only itself; after a sticky fault the device
// reopens in the same process while the dead client's futures, pinned buffers, buffers and
// recordings fail cleanly. Both stream kinds (async worker threads, sync inline). Public API.
#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/lang.hpp>
#include <backplane/log.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

using namespace backplane;

namespace {

/// The built host plugin alone, with two devices, `workers` threads per launch and the given
/// injected faults.
Config hostConfig(const std::string &mode, const std::string &faults,
                  uint32_t reopenAfterFault = 0, uint32_t workers = 2) {
    Config config;
    config.pluginPathOverride = {HOST_MANIFEST};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    config.reopenAfterFault = reopenAfterFault;
    config.pluginOptions["host"] = R"({"devices": 2, "workers": )" + std::to_string(workers) +
                                   R"(, "mode": ")" + mode + R"(", "inject_faults": )" + faults +
                                   "}";
    return config;
}

std::unique_ptr<Runtime> runtimeWith(const std::string &mode, const std::string &faults) {
    return std::make_unique<Runtime>(hostConfig(mode, faults));
}

std::atomic<bool> gateOpen{true};

/// y[i] = a * x[i] + y[i]; bindings x, y; scalars {float a, uint32 n}.
void saxpy(const bp_host_kernel_context *c) {
    const auto *scalars = static_cast<const unsigned char *>(c->scalars);
    float a = 0;
    uint32_t n = 0;
    std::memcpy(&a, scalars, 4);
    std::memcpy(&n, scalars + 4, 4);
    const auto *x = static_cast<const float *>(c->buffers[0]);
    auto *y = static_cast<float *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) y[i] = a * x[i] + y[i];
    }
}

std::atomic<bool> gateEntered{false};
std::atomic<bool> gatePassed{false};

/// Spins until gateOpen: holds its stream's later work back.
void gate(const bp_host_kernel_context *) {
    gateEntered = true;
    while (!gateOpen.load()) {
    }
    gatePassed = true;
}

/// x is only read, y read and written (KernelSource::access).
KernelSource saxpyKernel() {
    return {"saxpy", {KernelVariant::host(&saxpy, "saxpy")},
            {BindingAccess::Read, BindingAccess::ReadWrite}};
}
KernelSource gateKernel() { return {"gate", {KernelVariant::host(&gate, "gate")}}; }

Dispatch saxpyDispatch(const Buffer &x, const Buffer &y, float a, uint32_t n) {
    Dispatch d;
    d.block = {64, 1, 1};
    d.grid = {(n + 63) / 64, 1, 1};
    d.bindings = {x, y};
    d.scalar(a).scalar(n);
    return d;
}

Dispatch gateDispatch(const Buffer &any) {
    Dispatch d;
    d.block = {1, 1, 1};
    d.grid = {1, 1, 1};
    d.bindings = {any};
    return d;
}

/// What a call threw: the code's name and the message; "" when it returned.
struct Outcome {
    std::string code;
    std::string message;
};

Outcome outcomeOf(const std::function<void()> &call) {
    try {
        call();
    } catch (const Error &e) {
        return {toString(e.code()), e.what()};
    } catch (const std::exception &e) {
        return {"std::exception", e.what()};
    }
    return {};
}

bool contains(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

/// saxpy on `client` with a = 2 over 256 elements of x = 1, y = 3: every y is 5.
bool computes(ComputeClient &client) {
    const std::vector<float> ones(256, 1.0f), threes(256, 3.0f);
    Buffer x = client.createFrom<float>(ones);
    Buffer y = client.createFrom<float>(threes);
    client.execute(saxpyKernel(), saxpyDispatch(x, y, 2.0f, 256));
    return client.readAs<float>(y) == std::vector<float>(256, 5.0f);
}

/// The steps of a small program on one device, in order; the fault cases make one of them fail.
/// Counted per device: writes (copy), fills, launches, replays.
struct Program {
    ComputeClient &client;
    Buffer x, y;
    Recording recording;

    explicit Program(ComputeClient &c) : client(c) {}
    /// copy #1, copy #2, fill #1, launch #1, a recording of a launch (nothing runs).
    void setUp() {
        x = client.createFrom<float>(std::vector<float>(256, 1.0f));
        y = client.createFrom<float>(std::vector<float>(256, 3.0f));
        client.fill(y, 0x40400000u); // 3.0f
        client.execute(saxpyKernel(), saxpyDispatch(x, y, 2.0f, 256));
        client.beginRecording();
        client.execute(saxpyKernel(), saxpyDispatch(x, y, 1.0f, 256));
        recording = client.endRecording();
    }
    /// The step that the case's fault hits (the second of its kind).
    void faultingStep(const std::string &operation) {
        if (operation == "launch") client.execute(saxpyKernel(), saxpyDispatch(x, y, 2.0f, 256));
        if (operation == "fill") client.fill(y, 0u);
        if (operation == "copy") client.write(y, 0, std::vector<float>(4, 9.0f).data(), 16);
        if (operation == "replay") client.replay(recording);
    }
};

} // namespace

TEST_CASE("a sticky fault in each kind of operation loses only its device, and every later call "
          "and pending future fails naming it") {
    for (const std::string mode : {"async", "sync"})
        for (const auto &[operation, nth] : std::vector<std::pair<std::string, int>>{
                 {"launch", 2}, {"fill", 2}, {"copy", 0}, {"replay", 1}}) {
            // Sync mode replays a recording call by call (no plugin graph): no replay there.
            if (mode == "sync" && operation == "replay") continue;
            CAPTURE(mode);
            CAPTURE(operation);
            // Copies: two creates, the read below, and in async mode the pending read come
            // first; launches: in async mode the gate's.
            int at = nth;
            if (operation == "copy") at = mode == "async" ? 5 : 4;
            if (operation == "launch" && mode == "async") at = 3;
            const auto runtime = runtimeWith(
                mode, R"([{"device": 0, "operation": ")" + operation +
                          R"(", "nth": )" + std::to_string(at) + R"(, "class": "sticky"}])");
            ComputeClient zero = runtime->open(runtime->select("host:0"));
            ComputeClient one = runtime->open(runtime->select("host:1"));
            Program program(zero);
            program.setUp();
            REQUIRE(zero.readAs<float>(program.y) == std::vector<float>(256, 5.0f));

            // Work pending on another stream when the fault happens (async: held by a gate).
            // Its buffer is its own, so the faulting step is not ordered after it.
            std::optional<ReadFuture> pending;
            Buffer aside = zero.empty(64);
            if (mode == "async") {
                gateOpen = false;
                ComputeClient::setStream(7);
                zero.execute(gateKernel(), gateDispatch(aside));
                pending.emplace(zero.read(aside));
                ComputeClient::setStream(0);
            }
            const Outcome atCall = outcomeOf([&] { program.faultingStep(operation); });
            const Outcome atSync = outcomeOf([&] { zero.sync(); });
            gateOpen = true;
            // The call is accepted and the fault shows at the next wait (or at the call, when
            // an async worker was quicker than the rest of the call; sync mode runs the call's
            // plugin work in a batch at that wait).
            if (atCall.code == "") CHECK(atSync.code == "device_lost");
            CHECK((atCall.code == "device_lost" || atCall.code == ""));
            const std::string first = atCall.code != "" ? atCall.message : atSync.message;
            CHECK_MESSAGE(contains(first, "injected sticky fault (inject_faults)"), first);

            // Every later call of the device fails, naming the first failure and when.
            for (const auto &[what, call] :
                 std::vector<std::pair<std::string, std::function<void()>>>{
                     {"create", [&] { (void)zero.createFrom<float>(std::vector<float>(4, 1)); }},
                     {"read", [&] { (void)zero.readAs<float>(program.x); }},
                     {"execute", [&] {
                          zero.execute(saxpyKernel(), saxpyDispatch(program.x, program.y, 1, 256));
                      }},
                     {"fill", [&] { zero.fill(program.y, 0u); }},
                     {"replay", [&] { zero.replay(program.recording); }},
                     {"sync", [&] { zero.syncAll(); }}}) {
                CAPTURE(what);
                const Outcome later = outcomeOf(call);
                CHECK(later.code == "device_lost");
                CHECK_MESSAGE(contains(later.message, "host:0 is lost: "), later.message);
                CHECK_MESSAGE(contains(later.message, "injected sticky fault (inject_faults)"),
                              later.message);
                CHECK_MESSAGE(contains(later.message, " UTC"), later.message);
                CHECK_MESSAGE(contains(later.message, "Close every client of it"), later.message);
            }
            if (pending) {
                const Outcome waited = outcomeOf([&] { (void)pending->wait(); });
                CHECK_MESSAGE(waited.code == "device_lost", waited.message);
            }
            // The other device never noticed.
            CHECK(computes(one));
        }
}

TEST_CASE("a refused operation fails only itself; the device and its data go on") {
    // Async streams only: a device without them (sync mode) runs its calls later in batches,
    // where a refusal is a failure of work already accepted (next case).
    for (const std::string mode : {"async"})
        for (const auto &[operation, nth, code] : std::vector<std::tuple<std::string, int, std::string>>{
                 {"launch", 2, "launch"}, {"fill", 2, "internal"}, {"copy", 3, "internal"},
                 {"replay", 1, "internal"}}) {
            CAPTURE(mode);
            CAPTURE(operation);
            const auto runtime = runtimeWith(
                mode, R"([{"device": 0, "operation": ")" + operation +
                          R"(", "nth": )" + std::to_string(nth) + R"(, "class": "refused"}])");
            ComputeClient zero = runtime->open(runtime->select("host:0"));
            Program program(zero);
            program.setUp();
            const Outcome refused = outcomeOf([&] { program.faultingStep(operation); });
            CHECK(refused.code == code);
            CHECK_MESSAGE(contains(refused.message, "injected refused fault (inject_faults)"),
                          refused.message);
            // What the operation was to write is poisoned: reading it names the failure instead
            // of returning bytes the program never wrote (they stay 5.0, not what it asked for).
            const Outcome poisoned = outcomeOf([&] { (void)zero.readAs<float>(program.y); });
            CHECK(poisoned.code == "poisoned");
            CHECK_MESSAGE(contains(poisoned.message, "injected refused fault (inject_faults)"),
                          poisoned.message);
            CHECK_MESSAGE(contains(poisoned.message, "host:0"), poisoned.message);
            // So does work that reads it: a launch that reads y is not issued.
            const Outcome dependent = outcomeOf([&] {
                zero.execute(saxpyKernel(), saxpyDispatch(program.x, program.y, 1.0f, 256));
            });
            CHECK(dependent.code == "poisoned");
            CHECK_MESSAGE(contains(dependent.message, "kernel 'saxpy' (not launched)"),
                          dependent.message);
            // What it only read keeps its data, and the device computes on.
            CHECK(zero.readAs<float>(program.x) == std::vector<float>(256, 1.0f));
            CHECK(computes(zero));
            // Written again, y is valid again.
            zero.write(program.y, 0, std::vector<float>(256, 5.0f).data(), 256 * 4);
            zero.execute(saxpyKernel(), saxpyDispatch(program.x, program.y, 1.0f, 256));
            CHECK(zero.readAs<float>(program.y) == std::vector<float>(256, 6.0f));
        }
}

// ----- what failed work leaves behind: poisoned ranges ------------------------------------------

namespace {

/// out[i] = 2 * in[i] (in is only read, out only written: lang declares it).
const lang::Kernel &doubleKernel() {
    static const lang::Kernel k = lang::kernel("double_it", [](lang::Builder &b) {
        auto in = b.input<float>();
        auto out = b.output<float>();
        const auto i = b.globalId().x;
        out[i] = in[i] * 2.0f;
    });
    return k;
}

Dispatch doubleDispatch(const Buffer &in, const Buffer &out) {
    Dispatch d;
    d.grid = {4};
    d.block = {64};
    d.bindings = {in, out};
    return d;
}

std::vector<float> floats(size_t n, float value) { return std::vector<float>(n, value); }

} // namespace

TEST_CASE("a refused write poisons only its bytes; a fill or a write over them makes them valid "
          "again; views see the poison of their range") {
    // Copies on host:0: the first is createFrom, the second the write that fails.
    const auto runtime =
        runtimeWith("async", R"([{"device": 0, "operation": "copy", "nth": 2, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    Buffer y = zero.createFrom<float>(floats(256, 3.0f));
    const std::vector<float> nines = floats(4, 9.0f);
    CHECK(outcomeOf([&] { zero.write(y, 64, nines.data(), 16); }).code == "internal");
    const Outcome whole = outcomeOf([&] { (void)zero.readAs<float>(y); });
    CHECK(whole.code == "poisoned");
    CHECK_MESSAGE(contains(whole.message, "bytes 64 to 80"), whole.message);
    CHECK_MESSAGE(contains(whole.message, "write on host:0"), whole.message);
    // The bytes around it are valid.
    CHECK(zero.read(y, 0, 64).wait().size() == 64);
    CHECK(zero.read(y, 80).wait().size() == 256 * 4 - 80);
    CHECK(zero.readAs<float>(y.view(128)) == floats(224, 3.0f));
    CHECK(outcomeOf([&] { (void)zero.readAs<float>(y.view(60, 8)); }).code == "poisoned");
    std::vector<float> into(2);
    CHECK(outcomeOf([&] { zero.readInto(y, 72, into.data(), 8); }).code == "poisoned");
    // A fill over half of it: that half is valid, the other half not yet.
    zero.fill(y, 0x3f800000u, 64, 8); // 1.0f
    std::vector<float> half(2);
    zero.readInto(y, 64, half.data(), 8);
    CHECK(half == floats(2, 1.0f));
    CHECK(outcomeOf([&] { (void)zero.read(y, 72, 8).wait(); }).code == "poisoned");
    // A write over the rest: the whole buffer reads again.
    zero.write(y, 72, nines.data(), 8);
    std::vector<float> expected = floats(256, 3.0f);
    expected[16] = expected[17] = 1.0f;
    expected[18] = expected[19] = 9.0f;
    CHECK(zero.readAs<float>(y) == expected);
}

TEST_CASE("a failure spreads to the work that reads what it left unwritten, named by its first "
          "cause; a launch that writes the range makes it valid again") {
    const auto runtime = runtimeWith(
        "async", R"([{"device": 0, "operation": "launch", "nth": 1, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    Buffer a = zero.createFrom<float>(floats(256, 1.0f));
    Buffer b = zero.createFrom<float>(floats(256, 7.0f));
    Buffer c = zero.createFrom<float>(floats(256, 7.0f));
    Buffer d = zero.createFrom<float>(floats(256, 7.0f));
    const Outcome first = outcomeOf([&] { zero.execute(doubleKernel(), doubleDispatch(a, b)); });
    CHECK(first.code == "launch");
    // The input stays readable (lang declared it read-only); the output is poisoned.
    CHECK(zero.readAs<float>(a) == floats(256, 1.0f));
    const Outcome readB = outcomeOf([&] { (void)zero.readAs<float>(b); });
    CHECK(readB.code == "poisoned");
    CHECK_MESSAGE(contains(readB.message, "kernel 'double_it' on host:0"), readB.message);
    CHECK_MESSAGE(contains(readB.message, "injected refused fault"), readB.message);
    // A launch reading b is not issued, and what it writes takes b's poison (its first cause).
    const Outcome second = outcomeOf([&] { zero.execute(doubleKernel(), doubleDispatch(b, c)); });
    CHECK(second.code == "poisoned");
    CHECK_MESSAGE(contains(second.message, "kernel 'double_it' (not launched)"), second.message);
    const Outcome readC = outcomeOf([&] { (void)zero.readAs<float>(c); });
    CHECK(readC.code == "poisoned");
    CHECK_MESSAGE(contains(readC.message, "injected refused fault"), readC.message);
    // So does a copy from it.
    CHECK(outcomeOf([&] { zero.copy(b, 0, d, 0, 256 * 4); }).code == "poisoned");
    CHECK(outcomeOf([&] { (void)zero.readAs<float>(d); }).code == "poisoned");
    // Run again (the fault fired once), the launch writes b: valid, and the chain goes on.
    zero.execute(doubleKernel(), doubleDispatch(a, b));
    CHECK(zero.readAs<float>(b) == floats(256, 2.0f));
    zero.execute(doubleKernel(), doubleDispatch(b, c));
    CHECK(zero.readAs<float>(c) == floats(256, 4.0f));
    zero.copy(c, 0, d, 0, 256 * 4);
    CHECK(zero.readAs<float>(d) == floats(256, 4.0f));
}

TEST_CASE("a kernel that does not say what its bindings do: a failed launch poisons every "
          "binding") {
    const auto runtime = runtimeWith(
        "async", R"([{"device": 0, "operation": "launch", "nth": 1, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    Buffer x = zero.createFrom<float>(floats(256, 1.0f));
    Buffer y = zero.createFrom<float>(floats(256, 3.0f));
    const KernelSource undescribed{"saxpy", {KernelVariant::host(&saxpy, "saxpy")}};
    CHECK(outcomeOf([&] { zero.execute(undescribed, saxpyDispatch(x, y, 2.0f, 256)); }).code ==
          "launch");
    CHECK(outcomeOf([&] { (void)zero.readAs<float>(x); }).code == "poisoned");
    CHECK(outcomeOf([&] { (void)zero.readAs<float>(y); }).code == "poisoned");
}

TEST_CASE("a failed copy to another device poisons the destination there; neither device is "
          "otherwise touched") {
    // host:1's first copy is the copy from host:0 (its buffer is created empty).
    const auto runtime = runtimeWith(
        "async", R"([{"device": 1, "operation": "copy", "nth": 1, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    ComputeClient one = runtime->open(runtime->select("host:1"));
    Buffer src = zero.createFrom<float>(floats(256, 5.0f));
    Buffer dst = one.empty(256 * 4);
    CHECK(outcomeOf([&] { zero.copy(src, 0, one, dst, 0, 256 * 4); }).code == "internal");
    const Outcome read = outcomeOf([&] { (void)one.readAs<float>(dst); });
    CHECK(read.code == "poisoned");
    CHECK_MESSAGE(contains(read.message, "copy from host:0 on host:1"), read.message);
    CHECK(zero.readAs<float>(src) == floats(256, 5.0f));
    CHECK(computes(zero));
    CHECK(computes(one));
    zero.copy(src, 0, one, dst, 0, 256 * 4);
    CHECK(one.readAs<float>(dst) == floats(256, 5.0f));
}

TEST_CASE("a replay that would read poisoned data is not issued and poisons what it writes") {
    // Fills on host:0: the second fails.
    const auto runtime =
        runtimeWith("async", R"([{"device": 0, "operation": "fill", "nth": 2, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    Buffer x = zero.createFrom<float>(floats(256, 1.0f));
    Buffer y = zero.createFrom<float>(floats(256, 3.0f));
    Buffer z = zero.createFrom<float>(floats(256, 0.0f));
    zero.fill(z, 0u); // fill #1
    zero.beginRecording();
    zero.execute(doubleKernel(), doubleDispatch(y, z)); // reads y, writes z
    const Recording recording = zero.endRecording();
    CHECK(outcomeOf([&] { zero.fill(y, 0u); }).code == "internal"); // fill #2: y poisoned
    const Outcome replayed = outcomeOf([&] { zero.replay(recording); });
    CHECK(replayed.code == "poisoned");
    CHECK_MESSAGE(contains(replayed.message, "replay (not issued)"), replayed.message);
    CHECK_MESSAGE(contains(replayed.message, "fill on host:0"), replayed.message);
    CHECK(outcomeOf([&] { (void)zero.readAs<float>(z); }).code == "poisoned");
    CHECK(zero.readAs<float>(x) == floats(256, 1.0f));
    // y written again: the replay runs and z is valid.
    zero.write(y, 0, floats(256, 3.0f).data(), 256 * 4);
    zero.replay(recording);
    CHECK(zero.readAs<float>(z) == floats(256, 6.0f));
}

TEST_CASE("memory a poisoned buffer gave back starts clean for its next owner") {
    const auto runtime =
        runtimeWith("async", R"([{"device": 0, "operation": "copy", "nth": 1, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    const void *first = nullptr;
    {
        Buffer y = zero.empty(4096);
        first = y.id();
        CHECK(outcomeOf([&] { zero.write(y, 0, floats(1024, 1.0f).data(), 4096); }).code ==
              "internal");
        CHECK(outcomeOf([&] { (void)zero.readAs<float>(y); }).code == "poisoned");
    }
    Buffer next = zero.empty(4096);
    // The same allocation came back (the slice cache keeps it for the next owner of its size),
    // else the case would check nothing.
    REQUIRE(next.id() == first);
    CHECK(zero.readAs<float>(next).size() == 1024);
}

TEST_CASE("on a device without async streams a refused call fails at the next wait and loses "
          "the device, since the work after it in its batch was accepted") {
    const auto runtime = runtimeWith("sync", R"([{"operation": "launch", "nth": 2, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    Program program(zero);
    program.setUp();
    CHECK(outcomeOf([&] { program.faultingStep("launch"); }).code == "");
    const Outcome waited = outcomeOf([&] { (void)zero.readAs<float>(program.y); });
    CHECK(waited.code == "launch");
    CHECK_MESSAGE(contains(waited.message, "injected refused fault (inject_faults)"),
                  waited.message);
    const Outcome later = outcomeOf([&] { zero.syncAll(); });
    CHECK(later.code == "device_lost");
    CHECK_MESSAGE(contains(later.message, "injected refused fault"), later.message);
}

TEST_CASE("after a sticky fault the device reopens in the same process; the dead client's "
          "futures, pinned buffers, buffers and recordings fail cleanly") {
    for (const std::string mode : {"async", "sync"}) {
        CAPTURE(mode);
        const auto runtime =
            runtimeWith(mode, R"([{"device": 0, "operation": "launch", "nth": 2}])");
        std::optional<ComputeClient> dead = runtime->open(runtime->select("host:0"));
        Program program(*dead);
        program.setUp();
        PinnedBuffer pinned = dead->allocatePinned(4096);
        std::optional<ReadFuture> afterFault;
        const Outcome faulted = outcomeOf([&] {
            program.faultingStep("launch");
            afterFault.emplace(dead->read(program.y));
        });
        if (mode == "sync") CHECK(faulted.code == "device_lost");
        CHECK(outcomeOf([&] { dead->syncAll(); }).code == "device_lost");

        // close() on a lost device neither throws nor waits for anything.
        CHECK(outcomeOf([&] { dead->close(); }).code == "");
        // Reopen while the dead client's future, pinned buffer, buffers and recording live.
        ComputeClient fresh = runtime->open(runtime->select("host:0"));
        CHECK(computes(fresh));
        if (afterFault) {
            const Outcome waited = outcomeOf([&] { (void)afterFault->wait(); });
            CHECK_MESSAGE(waited.code == "device_lost", waited.message);
        }
        const Outcome oldBuffer = outcomeOf([&] { (void)fresh.readAs<float>(program.y); });
        CHECK(oldBuffer.code == "device_lost");
        CHECK_MESSAGE(contains(oldBuffer.message, "the Buffer was on host:0 (open #"),
                      oldBuffer.message);
        CHECK_MESSAGE(contains(oldBuffer.message, ") when that open of the device was lost: "),
                      oldBuffer.message);
        CHECK_MESSAGE(contains(oldBuffer.message, "injected sticky fault"), oldBuffer.message);
        const Outcome oldRecording = outcomeOf([&] { fresh.replay(program.recording); });
        CHECK(oldRecording.code == "device_lost");
        CHECK_MESSAGE(contains(oldRecording.message, "which was lost: "), oldRecording.message);
        CHECK(pinned.size() == 4096);
        // Everything of the dead client goes in any order without touching the new one.
        program.recording = Recording();
        program.x = Buffer();
        program.y = Buffer();
        afterFault.reset();
        dead.reset();
        pinned = PinnedBuffer();
        CHECK(computes(fresh));
    }
}

TEST_CASE("close() of a lost device returns only when every stream's running work is done") {
    // A kernel still running on one stream when another stream's fault is seen: close() (and
    // the teardown after it) must not free memory under it.
    // Launch #1 is the program's, #2 the gate, #3 the faulting one.
    const auto runtime = runtimeWith("async", R"([{"operation": "launch", "nth": 3}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    Program program(zero);
    program.setUp();
    Buffer aside = zero.empty(64);
    gateOpen = false;
    gateEntered = false;
    gatePassed = false;
    ComputeClient::setStream(7);
    zero.execute(gateKernel(), gateDispatch(aside));
    ComputeClient::setStream(0);
    while (!gateEntered.load()) // running before the fault: a lost device runs nothing new
        std::this_thread::yield();
    program.faultingStep("launch");
    std::thread opener([] {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        gateOpen = true;
    });
    CHECK(outcomeOf([&] { zero.close(); }).code == "");
    CHECK(gatePassed.load()); // the gated kernel finished before close() returned
    opener.join();
}

TEST_CASE("devices.reopen_after_fault: the client reopens its device by itself, a bounded number "
          "of times, and logs each reopen") {
    for (const std::string mode : {"async", "sync"}) {
        CAPTURE(mode);
        // Three sticky faults, one per round: a round launches four times (the program's, the
        // faulting one, two checks), so launches #2, #6 and #10; two reopens allowed.
        const Config config = hostConfig(mode,
                                         R"([{"operation": "launch", "nth": 2},
                                             {"operation": "launch", "nth": 6},
                                             {"operation": "launch", "nth": 10}])",
                                         2);
        std::vector<std::string> logged;
        std::mutex logMutex;
        log::setLevel(log::Subsystem::Streams, log::Level::Warn);
        log::setSink([&](log::Level level, log::Subsystem from, std::string_view message) {
            if (from != log::Subsystem::Streams || level < log::Level::Warn) return;
            std::lock_guard lock(logMutex);
            logged.emplace_back(message);
        });
        Runtime runtime(config);
        ComputeClient client = runtime.open(runtime.select("host:0"));
        ComputeClient copy = client; // copies follow the reopen too
        for (int round = 1; round <= 3; ++round) {
            CAPTURE(round);
            Program program(client);
            program.setUp(); // launch #(2 * round - 1): fine
            CHECK(client.readAs<float>(program.y) == std::vector<float>(256, 5.0f));
            // The faulting launch: its call or the next wait fails with DeviceLost.
            const Outcome faulted = outcomeOf([&] {
                program.faultingStep("launch");
                client.syncAll();
            });
            CHECK(faulted.code == "device_lost");
            // The Buffers from before the fault are gone, whichever client copy asks.
            const Outcome old = outcomeOf([&] { (void)copy.readAs<float>(program.y); });
            CHECK(old.code == "device_lost");
            if (round < 3) {
                // Reopened: the next calls compute, through either copy.
                CHECK(computes(client));
                CHECK(computes(copy));
            } else {
                // Out of reopens: the device stays lost.
                const Outcome after = outcomeOf([&] { (void)computes(client); });
                CHECK(after.code == "device_lost");
            }
        }
        log::setSink(nullptr);
        size_t reopens = 0;
        for (const std::string &line : logged)
            if (contains(line, "was lost and is reopened as open #")) {
                ++reopens;
                CHECK_MESSAGE(contains(line, "(devices.reopen_after_fault); the fault: "), line);
                CHECK_MESSAGE(contains(line, "injected sticky fault"), line);
            }
        CHECK(reopens == 2);
    }
}

TEST_CASE("devices.reopen_after_fault: only the call that meets the fault fails, also when a "
          "plugin call (not a wait) reports it (review finding)") {
    const Config config =
        hostConfig("async", R"([{"operation": "launch", "nth": 2}])", 1);
    Runtime runtime(config);
    ComputeClient client = runtime.open(runtime.select("host:0"));
    Program program(client);
    program.setUp();
    ProfileToken token = client.profileStart();
    program.faultingStep("launch");
    // Plugin calls (a fill is one) fail once the worker ran the fault; no wait marks the
    // device lost first.
    Buffer small = client.empty(64);
    int calls = 0;
    Outcome first;
    while (first.code.empty() && calls++ < 100000)
        first = outcomeOf([&] { client.fill(small, 0u); });
    CHECK(first.code == "device_lost");
    CHECK(computes(client)); // the very next call runs on the reopened device
    // A profile started before the fault ends with DeviceLost, not "another client".
    const Outcome ended = outcomeOf([&] { (void)client.profileEnd(token); });
    CHECK(ended.code == "device_lost");
    CHECK_MESSAGE(contains(ended.message, "which was lost and replaced by this open"),
                  ended.message);
}

TEST_CASE("close() racing another thread's reopening call leaves the client closed (review "
          "finding)") {
    for (int round = 0; round < 20; ++round) {
        CAPTURE(round);
        const Config config =
            hostConfig("async", R"([{"operation": "launch", "nth": 2}])", 5, 1);
        Runtime runtime(config);
        ComputeClient client = runtime.open(runtime.select("host:0"));
        ComputeClient copy = client;
        Program program(client);
        program.setUp();
        program.faultingStep("launch");
        (void)outcomeOf([&] { client.syncAll(); }); // lost now
        std::thread other([&] { (void)outcomeOf([&] { (void)copy.empty(64); }); });
        client.close();
        other.join();
        const Outcome after = outcomeOf([&] { (void)client.empty(64); });
        CHECK_MESSAGE(after.code != "", "a call after close() succeeded");
    }
}

TEST_CASE("an automatic reopen does not wait for the lost open's running kernels; a recording "
          "begun before the fault ends with DeviceLost (review findings)") {
    // Launch #1 the program's, #2 the gate, #3 the faulting one.
    const Config config = hostConfig("async", R"([{"operation": "launch", "nth": 3}])", 1);
    Runtime runtime(config);
    ComputeClient client = runtime.open(runtime.select("host:0"));
    Program program(client);
    program.setUp();
    Buffer aside = client.empty(64);
    gateOpen = false;
    gateEntered = false;
    gatePassed = false;
    ComputeClient::setStream(7);
    client.execute(gateKernel(), gateDispatch(aside));
    ComputeClient::setStream(0);
    while (!gateEntered.load())
        std::this_thread::yield();
    ComputeClient::setStream(3);
    client.beginRecording();
    ComputeClient::setStream(0);
    program.faultingStep("launch");
    CHECK(outcomeOf([&] { client.sync(); }).code == "device_lost");
    // The gate is still closed: the old open's stream 7 is busy. A reopen that waited for it
    // would hang here; the watchdog opens the gate after 5 s so that a failure ends.
    std::thread watchdog([] {
        std::this_thread::sleep_for(std::chrono::seconds(5));
        gateOpen = true;
    });
    const auto start = std::chrono::steady_clock::now();
    CHECK(client.device().id() == "host:0");
    CHECK(computes(client));
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    CHECK_MESSAGE(seconds < 3.0, "the reopen took " << seconds << " s");
    CHECK_FALSE(gatePassed.load()); // the old kernel was still running meanwhile
    ComputeClient::setStream(3);
    const Outcome ended = outcomeOf([&] { (void)client.endRecording(); });
    ComputeClient::setStream(0);
    CHECK(ended.code == "device_lost");
    CHECK_MESSAGE(contains(ended.message, "which was lost and replaced by this open"),
                  ended.message);
    gateOpen = true;
    watchdog.join();
}

namespace {

/// host:0 and host:1 of `runtime`; none (with a message) when collectives are needed and the
/// host plugin has none here.
std::vector<ComputeClient> twoHostDevices(const Runtime &runtime, bool needCollectives = true) {
    std::vector<ComputeClient> devices = {runtime.open(runtime.select("host:0")),
                                          runtime.open(runtime.select("host:1"))};
    if (needCollectives && (devices[0].device().capabilities & BP_CAPABILITY_COLLECTIVES) == 0) {
        MESSAGE("no host collectives here (" << devices[0].device().collectives
                                             << "): the case checks nothing");
        return {};
    }
    return devices;
}

/// A communicator of `clients` in this process, with a 3 s timeout.
Communicator localCommunicator(std::vector<ComputeClient> &clients, bool staged = false) {
    CommunicatorOptions options;
    options.timeout = std::chrono::seconds(3);
    options.forceStaged = staged;
    auto rendezvous = localRendezvous();
    return Communicator::create(clients, *rendezvous, options);
}

} // namespace

TEST_CASE("a sticky fault in a collective: the rank's device is lost, its peer fails within the "
          "communicator's timeout, and both reopen and all-reduce again") {
    const auto runtime = runtimeWith(
        "async", R"([{"device": 0, "operation": "collective", "nth": 1, "class": "sticky"}])");
    std::vector<ComputeClient> devices = twoHostDevices(*runtime);
    if (devices.empty()) return;
    const auto allReduce = [](std::vector<ComputeClient> &clients) {
        Communicator comm = localCommunicator(clients);
        std::vector<Buffer> send, recv;
        for (size_t r = 0; r < clients.size(); ++r) {
            send.push_back(clients[r].createFrom<float>(std::vector<float>(1024, float(r + 1))));
            recv.push_back(clients[r].empty(1024 * 4));
        }
        comm.allReduce(send, recv, 1024, DataType::F32, ReduceOp::Sum);
        std::vector<std::vector<float>> out;
        for (size_t r = 0; r < clients.size(); ++r) out.push_back(clients[r].readAs<float>(recv[r]));
        return out;
    };
    const Outcome failed = outcomeOf([&] { (void)allReduce(devices); });
    INFO(failed.message);
    CHECK(failed.code != "");
    const Outcome zero = outcomeOf([&] { devices[0].syncAll(); });
    CHECK(zero.code == "device_lost");
    CHECK_MESSAGE(contains(zero.message, "injected sticky fault (inject_faults): a collective"),
                  zero.message);
    // Both close and reopen; the all-reduce works again (the fault fired once).
    for (ComputeClient &c : devices) CHECK(outcomeOf([&] { c.close(); }).code == "");
    std::vector<ComputeClient> again = twoHostDevices(*runtime);
    const auto out = allReduce(again);
    CHECK(out[0] == std::vector<float>(1024, 3.0f));
    CHECK(out[1] == std::vector<float>(1024, 3.0f));
}

TEST_CASE("a refused collective poisons its receive buffer; the send buffer keeps its data") {
    const auto runtime = runtimeWith(
        "async", R"([{"device": 0, "operation": "collective", "nth": 1, "class": "refused"}])");
    std::vector<ComputeClient> devices = twoHostDevices(*runtime);
    if (devices.empty()) return;
    Communicator comm = localCommunicator(devices);
    std::vector<Buffer> send, recv;
    for (size_t r = 0; r < devices.size(); ++r) {
        send.push_back(devices[r].createFrom<float>(floats(1024, float(r + 1))));
        recv.push_back(devices[r].createFrom<float>(floats(1024, -1.0f)));
    }
    const Outcome failed = outcomeOf(
        [&] { comm.allReduce(send, recv, 1024, DataType::F32, ReduceOp::Sum); });
    INFO(failed.message);
    CHECK(failed.code != "");
    const Outcome read = outcomeOf([&] { (void)devices[0].readAs<float>(recv[0]); });
    CHECK(read.code == "poisoned");
    CHECK_MESSAGE(contains(read.message, "injected refused fault"), read.message);
    CHECK(devices[0].readAs<float>(send[0]) == floats(1024, 1.0f));
    CHECK(computes(devices[0]));
}

TEST_CASE("poisoning, review findings: a kernel refused for its own source poisons nothing; a "
          "strided read skips poisoned gaps; a writeTensor failing part-way poisons its later "
          "rows") {
    // Copies (reads count too) on host:0: #1 createFrom a, #2 the write that fails (element 1).
    // On host:1: #1 createFrom b, #2 writeTensor's first row, #3 its second (fails); the third
    // is never issued.
    const auto runtime = runtimeWith(
        "async", R"([{"device": 0, "operation": "copy", "nth": 2, "class": "refused"},
                     {"device": 1, "operation": "copy", "nth": 3, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    ComputeClient one = runtime->open(runtime->select("host:1"));
    Buffer a = zero.createFrom<float>(floats(8, 1.0f));
    const float nine = 9.0f;
    CHECK(outcomeOf([&] { zero.write(a, 4, &nine, 4); }).code == "internal");
    // Elements 0, 2, 4, 6 avoid the poisoned element 1; elements 1, 3, 5 do not.
    CHECK(zero.readTensor(Tensor{a, {4}, {2}, 4}).wait().size() == 16);
    const Outcome odd = outcomeOf([&] { (void)zero.readTensor(Tensor{a.view(4), {3}, {2}, 4}).wait(); });
    CHECK(odd.code == "poisoned");
    CHECK_MESSAGE(contains(odd.message, "readTensor"), odd.message);
    // A kernel with no variant for the device is the caller's error: its bindings keep their data.
    Buffer x = zero.createFrom<float>(floats(4, 2.0f));
    const KernelSource cudaOnly{
        "cuda_only", {KernelVariant::text(Dialect::Cuda, "k", "extern \"C\" __global__ void k() {}")}};
    Dispatch d;
    d.grid = {1};
    d.bindings = {x};
    CHECK(outcomeOf([&] { zero.execute(cudaOnly, d); }).code == "unsupported");
    CHECK(zero.readAs<float>(x) == floats(4, 2.0f));
    // writeTensor of 3 rows with padding between them: the second row's copy fails.
    Buffer b = one.createFrom<float>(floats(24, -1.0f));
    const Tensor rows{b, {3, 4}, {8, 1}, 4};
    const std::vector<float> fives = floats(12, 5.0f);
    CHECK(outcomeOf([&] { one.writeTensor(rows, fives.data(), 48); }).code == "internal");
    for (const uint64_t row : {0u, 1u, 2u}) {
        CAPTURE(row);
        CHECK(outcomeOf([&] { (void)one.read(b, row * 32, 16).wait(); }).code == "poisoned");
    }
    CHECK(one.read(b, 16, 16).wait().size() == 16); // the padding after row 0 is valid
}

TEST_CASE("a collective whose send buffer is poisoned on one rank issues nothing on any rank and "
          "poisons every receive buffer; both devices go on") {
    for (const bool staged : {false, true}) {
        CAPTURE(staged);
        // Fills on host:1: the first one fails.
        const auto runtime = runtimeWith(
            "async", R"([{"device": 1, "operation": "fill", "nth": 1, "class": "refused"}])");
        std::vector<ComputeClient> devices = twoHostDevices(*runtime, !staged);
        if (devices.empty()) continue;
        Communicator comm = localCommunicator(devices, staged);
        std::vector<Buffer> send, recv;
        for (size_t r = 0; r < devices.size(); ++r) {
            send.push_back(devices[r].createFrom<float>(floats(256, float(r + 1))));
            recv.push_back(devices[r].createFrom<float>(floats(256, -1.0f)));
        }
        CHECK(outcomeOf([&] { devices[1].fill(send[1], 0u); }).code == "internal");
        const Outcome refused = outcomeOf(
            [&] { comm.allReduce(send, recv, 256, DataType::F32, ReduceOp::Sum); });
        CHECK(refused.code == "poisoned");
        CHECK_MESSAGE(contains(refused.message, "rank 1's send buffer"), refused.message);
        for (size_t r = 0; r < devices.size(); ++r) {
            CAPTURE(r);
            const Outcome read = outcomeOf([&] { (void)devices[r].readAs<float>(recv[r]); });
            CHECK(read.code == "poisoned");
            CHECK_MESSAGE(contains(read.message, "fill on host:1"), read.message);
            CHECK(computes(devices[r]));
        }
        // Written again, the same communicator all-reduces.
        devices[1].write(send[1], 0, floats(256, 2.0f).data(), 1024);
        comm.allReduce(send, recv, 256, DataType::F32, ReduceOp::Sum);
        CHECK(devices[0].readAs<float>(recv[0]) == floats(256, 3.0f));
        CHECK(devices[1].readAs<float>(recv[1]) == floats(256, 3.0f));
    }
}

TEST_CASE("poisoning, second review: a buffer cleared piece by piece keeps exact ranges; a "
          "broadcast readTensor over poison is OutOfMemory, never std::bad_alloc") {
    // Fills on host:0: the first one (over the whole buffer) fails.
    const auto runtime =
        runtimeWith("async", R"([{"device": 0, "operation": "fill", "nth": 1, "class": "refused"}])");
    ComputeClient zero = runtime->open(runtime->select("host:0"));
    constexpr uint64_t kPieces = 1024;
    Buffer b = zero.createFrom<float>(floats(2 * kPieces, 1.0f));
    CHECK(outcomeOf([&] { zero.fill(b, 0u); }).code == "internal");
    // Every other word written again: 1024 separate poisoned ranges are left.
    for (uint64_t i = 0; i < kPieces; ++i) zero.fill(b, 0x40000000u, i * 8, 4); // 2.0f
    const Outcome whole = outcomeOf([&] { (void)zero.readAs<float>(b); });
    CHECK(whole.code == "poisoned");
    CHECK_MESSAGE(contains(whole.message, "bytes 4 to 8 "), whole.message);
    bool exact = true;
    for (uint64_t i = 0; i < kPieces && exact; i += 37) {
        float value = 0;
        exact = outcomeOf([&] { zero.readInto(b, i * 8, &value, 4); }).code == "" &&
                value == 2.0f &&
                outcomeOf([&] { zero.readInto(b, i * 8 + 4, &value, 4); }).code == "poisoned";
    }
    CHECK(exact);
    // A broadcast of one poisoned element to 2^40 elements: refused for its size, as without
    // poison (the check for poison would list a run per element).
    const Outcome huge =
        outcomeOf([&] { (void)zero.readTensor(Tensor{b.view(4, 4), {1ull << 40}, {0}, 4}); });
    CHECK(huge.code == "out_of_memory");
    CHECK(computes(zero));
}
