// A rank killed in the middle of an NCCL all-reduce (issue 30): two processes, one GPU each, all-
// reduce over the CUDA plugin; process 1 is killed (SIGKILL) right after issuing a large
// all-reduce. The survivor's wait fails with Error(Remote) within the communicator's timeout (the
// plugin's watchdog aborts the NCCL communicator), never hangs; it closes its client, opens the
// GPU again in the same process, and all-reduces with a replacement process 1 correctly.
// Exits 77 (SKIP) with the reason when there are fewer than 2 GPUs or no usable NCCL. The parent
// process never initializes CUDA (children are forked from it); public API only.
#include <backplane/client.hpp>
#include <backplane/communicator.hpp>
#include <backplane/config.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <sys/types.h>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace backplane;
using namespace std::chrono_literals;

namespace {

constexpr int kSkip = 77;

std::string manifestPath() {
    const char *env = std::getenv("BACKPLANE_TEST_CUDA_MANIFEST");
    return env != nullptr && *env != '\0' ? env : CUDA_PLUGIN_MANIFEST;
}

std::unique_ptr<Runtime> cudaRuntime() {
    Config config;
    config.pluginPathOverride = {manifestPath()};
    config.probeMode = ProbeMode::InProcess;
    return std::make_unique<Runtime>(config);
}

/// Forks `body` and returns the child's pid; the child exits with body's result (98 when it
/// threw: the message goes to stderr).
pid_t spawn(const char *name, const std::function<int()> &body) {
    std::fflush(stdout);
    const pid_t pid = fork();
    if (pid != 0) return pid;
    int code = 99;
    try {
        code = body();
    } catch (const std::exception &e) {
        std::fprintf(stderr, "%s: %s\n", name, e.what());
        code = 98;
    }
    std::fflush(stdout);
    std::fflush(stderr);
    _exit(code);
}

/// The child's exit code, 128 + signal when a signal ended it, -1 when it outlived `limit`
/// (then it is killed).
int waitFor(pid_t pid, std::chrono::seconds limit) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid)
            return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
        std::this_thread::sleep_for(20ms);
    }
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    return -1;
}

std::string freshDirectory(const std::string &name) {
    const auto dir = std::filesystem::temp_directory_path() /
                     ("backplane-rank-killed-" + name + "-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir);
    return dir.string();
}

/// One all-reduce of `count` floats, rank r contributing r + 1; true when every element is the
/// sum over both ranks (3).
bool allReduceOnce(ComputeClient &client, Communicator &comm, uint32_t rank, size_t count) {
    Buffer b = client.createFrom<float>(std::vector<float>(count, float(rank + 1)));
    comm.allReduce(b, b, count, DataType::F32, ReduceOp::Sum);
    for (float v : client.readAs<float>(b))
        if (v != 3.0f) return false;
    return true;
}

/// A communicator of two processes (one GPU each) and the rendezvous it met on.
struct Joined {
    std::unique_ptr<Rendezvous> rendezvous;
    Communicator comm;
};

/// `timeout`: the communicator's (a collective whose peer is gone fails after it); the second
/// communicator waits longer, for the survivor's timeout and reopen.
Joined join(ComputeClient &client, const std::string &dir, uint32_t process,
            std::chrono::milliseconds timeout = 10s) {
    auto rendezvous = directoryRendezvous(dir, process, 2);
    CommunicatorOptions options;
    options.timeout = timeout;
    std::vector<ComputeClient> clients = {client};
    Communicator comm = Communicator::create(clients, *rendezvous, options);
    return {std::move(rendezvous), std::move(comm)};
}

} // namespace

int main() {
    // Whether the machine can run it: a child opens the plugin (the parent stays CUDA-free).
    const int probe = waitFor(spawn("probe", [] {
        auto runtime = cudaRuntime();
        size_t gpus = 0;
        for (const PhysicalDevice &d : runtime->devices())
            for (const DeviceInfo &route : d.routes)
                if (route.backend == "cuda") ++gpus;
        if (gpus < 2) {
            std::printf("SKIP: %zu CUDA device(s) here, the case needs 2\n", gpus);
            return kSkip;
        }
        ComputeClient zero = runtime->open(runtime->select("cuda:0"));
        if ((zero.device().capabilities & BP_CAPABILITY_COLLECTIVES) == 0) {
            std::printf("SKIP: no collectives on cuda:0: %s\n", zero.device().collectives.c_str());
            return kSkip;
        }
        return 0;
    }), 120s);
    if (probe == kSkip) return kSkip;
    if (probe != 0) {
        std::printf("FAIL: the probe child ended with %d\n", probe);
        return 1;
    }

    const std::string first = freshDirectory("first"), second = freshDirectory("second");
    // Process 0: the survivor. It all-reduces with process 1, sees it die mid-collective, then
    // reopens its GPU and all-reduces with the replacement.
    const pid_t survivor = spawn("survivor", [&] {
        auto runtime = cudaRuntime();
        ComputeClient client = runtime->open(runtime->select("cuda:0"));
        {
            Joined joined = join(client, first, 0);
            Communicator &comm = joined.comm;
            if (!allReduceOnce(client, comm, 0, 1 << 16)) {
                std::printf("survivor: the first all-reduce is wrong\n");
                return 2;
            }
            // Both are past the first all-reduce; process 1 then issues its part of the next
            // one and is killed while its kernel waits for this process's part, which comes
            // after the kill: a peer gone in the middle of the collective.
            (void)joined.rendezvous->allGather({}, 30s);
            std::this_thread::sleep_for(1500ms);
            const auto before = std::chrono::steady_clock::now();
            try {
                (void)allReduceOnce(client, comm, 0, size_t{1} << 26); // 256 MiB
                std::printf("survivor: the all-reduce whose peer was killed succeeded\n");
                return 3;
            } catch (const Error &e) {
                const double seconds =
                    std::chrono::duration<double>(std::chrono::steady_clock::now() - before)
                        .count();
                std::printf("survivor: after %.1f s, Error(%s): %s\n", seconds, toString(e.code()),
                            e.what());
                if (e.code() != ErrorCode::Remote) return 4;
            }
        }
        // Close the dead open and open the GPU again, in this process.
        client.close();
        ComputeClient again = runtime->open(runtime->select("cuda:0"));
        Joined joined = join(again, second, 0, 60s);
        const bool right = allReduceOnce(again, joined.comm, 0, 1 << 20);
        std::printf("survivor: the all-reduce after the reopen is %s\n", right ? "right" : "WRONG");
        return right ? 0 : 5;
    });
    const pid_t victim = spawn("victim", [&] {
        auto runtime = cudaRuntime();
        ComputeClient client = runtime->open(runtime->select("cuda:1"));
        Joined joined = join(client, first, 1);
        if (!allReduceOnce(client, joined.comm, 1, 1 << 16)) return 2;
        (void)joined.rendezvous->allGather({}, 30s);
        Buffer b = client.createFrom<float>(std::vector<float>(size_t{1} << 26, 2.0f));
        joined.comm.allReduce(b, b, size_t{1} << 26, DataType::F32, ReduceOp::Sum);
        client.flush();
        std::this_thread::sleep_for(300ms); // its kernel now waits for process 0's part
        std::printf("victim: killed with the all-reduce in flight\n");
        std::fflush(stdout);
        raise(SIGKILL);
        return 6;
    });
    const int victimStatus = waitFor(victim, 120s);
    // The replacement joins the survivor's second communicator on the killed process's GPU.
    const pid_t replacement = spawn("replacement", [&] {
        auto runtime = cudaRuntime();
        ComputeClient client = runtime->open(runtime->select("cuda:1"));
        Joined joined = join(client, second, 1, 60s);
        return allReduceOnce(client, joined.comm, 1, 1 << 20) ? 0 : 5;
    });
    const int survivorStatus = waitFor(survivor, 180s);
    const int replacementStatus = waitFor(replacement, 60s);
    std::filesystem::remove_all(first);
    std::filesystem::remove_all(second);
    std::printf("victim %d (expected %d: SIGKILL), survivor %d, replacement %d (expected 0)\n",
                victimStatus, 128 + SIGKILL, survivorStatus, replacementStatus);
    const bool passed =
        victimStatus == 128 + SIGKILL && survivorStatus == 0 && replacementStatus == 0;
    std::printf("%s\n", passed ? "PASS" : "FAIL");
    return passed ? 0 : 1;
}
