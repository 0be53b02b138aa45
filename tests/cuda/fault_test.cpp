// Real faults on a CUDA GPU (issue 30): a kernel that writes far outside its allocation and one
// that calls __trap() raise sticky errors. The device is lost with a message naming the fault,
// every later call fails at once, close() returns, and a reopen in the same process fails at
// once saying that CUDA keeps a faulted device unusable until the process restarts (measured:
// docs/measurements/h200-2026-11-28-s4-cuda-sticky-fault.txt); devices.reopen_after_fault tries,
// logs and gives up the same way. Each fault runs in a child process of its own (a fault ends
// CUDA for its process); the parent computes correctly after every child. Public API; exits 77
// (SKIP) without a CUDA device.
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/kernels.hpp>
#include <backplane/runtime.hpp>

#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace backplane;

namespace {

std::string selfPath;

constexpr const char *kFaultSource = R"(
extern "C" __global__ void wild_write(unsigned int *p, unsigned int n) {
    // 1 TiB past the allocation: no page is mapped there.
    p[(1ull << 38) + threadIdx.x] = n;
}
extern "C" __global__ void trap_now(unsigned int *p, unsigned int n) {
    if (threadIdx.x == 0) __trap();
    p[threadIdx.x] = n;
}
)";

Config cudaConfig(uint32_t reopenAfterFault = 0) {
    Config config;
    config.pluginPathOverride = {CUDA_MANIFEST};
    config.pluginEnable = {"cuda"};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    config.reopenAfterFault = reopenAfterFault;
    return config;
}

/// saxpy (the portable kernel) over 1 M elements, x = 1, y = 2, a = 3: every y is 5.
bool computes(ComputeClient &client) {
    const uint32_t n = 1 << 20;
    Buffer x = client.createFrom<float>(std::vector<float>(n, 1.0f));
    Buffer y = client.createFrom<float>(std::vector<float>(n, 2.0f));
    Dispatch d;
    d.block = {256};
    d.grid = {n / 256};
    d.bindings = {x, y};
    d.scalar(3.0f).scalar(n);
    client.execute(kernels::saxpy(), d);
    Buffer z = client.empty(uint64_t{n} * 4);
    client.copy(y, 0, z, 0, uint64_t{n} * 4);
    return client.readAs<float>(z) == std::vector<float>(n, 5.0f);
}

struct Outcome {
    std::string code;
    std::string message;
};

Outcome outcomeOf(const std::function<void()> &call) {
    try {
        call();
    } catch (const Error &e) {
        return {toString(e.code()), e.what()};
    }
    return {};
}

/// Runs the faulting kernel and waits.
Outcome fault(ComputeClient &client, const char *entry) {
    Buffer p = client.empty(4096);
    Dispatch d;
    d.block = {32};
    d.grid = {1};
    d.bindings = {p};
    d.scalar(7u);
    return outcomeOf([&] {
        client.execute({entry, {KernelVariant::text(Dialect::Cuda, entry, kFaultSource)}}, d);
        client.syncAll();
    });
}

bool contains(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

/// A child's checks: prints what failed and counts it.
int failures = 0;
void expect(bool ok, const std::string &what, const std::string &detail) {
    if (ok) return;
    ++failures;
    std::fprintf(stderr, "child: %s: %s\n", what.c_str(), detail.c_str());
}

/// One fault in this process, then what the client and a reopen do.
int childFault(const char *entry, uint32_t reopenAfterFault) {
    const Runtime runtime(cudaConfig(reopenAfterFault));
    ComputeClient client = runtime.open(runtime.select("cuda:0"));
    expect(computes(client), "before the fault", "saxpy was wrong");
    const Outcome faulted = fault(client, entry);
    std::printf("fault (%s): %s: %s\n", entry, faulted.code.c_str(), faulted.message.c_str());
    expect(faulted.code == "device_lost", "the fault", faulted.code + ": " + faulted.message);
    expect(contains(faulted.message, "restart the process"), "the fault's advice",
           faulted.message);
    const Outcome later = outcomeOf([&] { (void)computes(client); });
    std::printf("later call: %s: %s\n", later.code.c_str(), later.message.c_str());
    expect(later.code == "device_lost", "a later call", later.code + ": " + later.message);
    expect(outcomeOf([&] { client.close(); }).code == "", "close()", "threw");
    const Outcome reopened = outcomeOf([&] { runtime.open(runtime.select("cuda:0")); });
    std::printf("reopen: %s: %s\n", reopened.code.c_str(), reopened.message.c_str());
    expect(reopened.code == "device_lost", "the reopen", reopened.code + ": " + reopened.message);
    expect(contains(reopened.message, "cannot be opened again in this process"),
           "the reopen's message", reopened.message);
    return failures == 0 ? 0 : 1;
}

int runChild(const std::string &mode) {
    const std::string command = "'" + selfPath + "' --child=" + mode;
    const int status = std::system(command.c_str());
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

} // namespace

TEST_CASE("an out-of-bounds write loses the device for its process, which says so; this process "
          "still computes") {
    CHECK(runChild("wild_write") == 0);
    const Runtime runtime(cudaConfig());
    ComputeClient client = runtime.open(runtime.select("cuda:0"));
    CHECK(computes(client));
}

TEST_CASE("a trap loses the device for its process, which says so; this process still computes") {
    CHECK(runChild("trap_now") == 0);
    const Runtime runtime(cudaConfig());
    ComputeClient client = runtime.open(runtime.select("cuda:0"));
    CHECK(computes(client));
}

TEST_CASE("devices.reopen_after_fault on CUDA: the reopen is tried, logged and refused") {
    CHECK(runChild("reopen") == 0);
}

int main(int argc, char **argv) {
    selfPath = argv[0];
    for (int i = 1; i < argc; ++i) {
        const std::string arg = argv[i];
        try {
            if (arg == "--child=wild_write") return childFault("wild_write", 0);
            if (arg == "--child=trap_now") return childFault("trap_now", 0);
            if (arg == "--child=reopen") return childFault("wild_write", 2);
        } catch (const std::exception &e) {
            std::fprintf(stderr, "child: %s\n", e.what());
            return 1;
        }
    }
    try {
        const Runtime runtime(cudaConfig());
        if (runtime.devices().empty()) {
            std::printf("SKIP: no CUDA device\n");
            return 77;
        }
    } catch (const Error &e) {
        if (e.code() == ErrorCode::NoDriver || e.code() == ErrorCode::NoDevice) {
            std::printf("SKIP: %s\n", e.what());
            return 77;
        }
        std::fprintf(stderr, "FAIL: %s\n", e.what());
        return 1;
    }
    doctest::Context context(argc, argv);
    return context.run();
}
