// One rank of a host-plugin communicator in its own process, for host_multiprocess_test.
//
//   host_collectives_worker ROLE RANK SIZE (ID-HEX | new) [TIMEOUT-MS]
//   host_collectives_worker bench RANKS MIB [REPEATS]
//
// With "new" the worker makes the id itself (its process then hosts the rendezvous store) and
// prints "ID <hex>" first. Roles:
//   cases     run the whole case table (host_collectives_support.hpp); exit 0 when all matched
//   victim    join, print "JOINED", then sleep until killed (never issues a collective)
//   survivor  join, record a 4 MiB all-reduce, print "ISSUED", wait for it; print
//             "RESULT <status> <milliseconds> <message>", keep the communicator 4 s more; exit
//             0 when it failed with BP_ERROR_REMOTE or BP_ERROR_TIMEOUT (its peer was killed)
//   receiver  join, record a 64 MiB RECV from rank 0, print "ISSUED", and half a second later stop
//             itself (SIGSTOP): the data rank 0 sends fills the socket buffers and stays there
//   aborter   join, wait for SIGUSR1, record a 64 MiB SEND to rank 1, print "ISSUED", wait
//             half a second (Gloo's device thread is blocked writing to the stopped receiver),
//             comm_abort, then print "RESULT ..." like survivor; exit 0 for BP_ERROR_REMOTE
//   bench     (no test) RANKS ranks as threads of this process, each on its own host device: times
//             an f32 sum all-reduce of MIB MiB per rank, REPEATS times after one warm-up, and
//             prints the best and median time and the bus bandwidth, 2 (n - 1) / n * bytes / time
// A failed comm_create prints "JOINFAILED <status> <message>"; every other failure goes to stderr.
// Either exits with status 1. Output lines are flushed at once.
#include "host_collectives_support.hpp"

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

using namespace hostcoll;

namespace {

void say(const std::string &line) {
    std::printf("%s\n", line.c_str());
    std::fflush(stdout);
}

int fail(const std::string &why) {
    std::fprintf(stderr, "worker: %s\n", why.c_str());
    return 1;
}

/// The bench role: all-reduce timings with `ranks` threads of this process.
int bench(uint32_t ranks, uint64_t mib, int repeats) {
    Plugin plugin(R"({"devices": )" + std::to_string(ranks) +
                  R"(, "collectives": {"address": "127.0.0.1"}})");
    const uint64_t bytes = mib << 20;
    std::vector<std::unique_ptr<Device>> devices;
    for (uint32_t r = 0; r < ranks; ++r)
        devices.push_back(std::make_unique<Device>(plugin, r, 2 * bytes));
    const auto id = plugin.commId();
    std::vector<std::thread> threads;
    std::vector<bp_status> joined(ranks);
    for (uint32_t r = 0; r < ranks; ++r)
        threads.emplace_back([&, r] { joined[r] = devices[r]->join(id, r, ranks, 60'000); });
    for (auto &t : threads)
        t.join();
    threads.clear();
    for (const bp_status s : joined)
        if (s != BP_SUCCESS) return fail("comm_create failed: " + std::to_string(s));
    std::vector<float> ones(bytes / 4, 1.0f);
    for (auto &d : devices)
        d->upload(0, ones.data(), bytes);
    for (auto &d : devices)
        if (d->finish(UINT64_MAX) != BP_SUCCESS) return fail("upload failed");
    auto args = makeArgs<bp_collective_args>();
    args.op = BP_COLLECTIVE_ALL_REDUCE;
    args.type = BP_DATA_F32;
    args.reduce = BP_REDUCE_SUM;
    args.send_offset = 0;
    args.recv_offset = bytes;
    args.count = bytes / 4;
    std::vector<double> seconds;
    for (int i = 0; i <= repeats; ++i) {
        const auto start = std::chrono::steady_clock::now();
        std::vector<bp_status> done(ranks);
        for (uint32_t r = 0; r < ranks; ++r)
            threads.emplace_back([&, r] {
                auto a = args;
                a.send = a.recv = devices[r]->page();
                done[r] = devices[r]->collective(a);
                if (done[r] == BP_SUCCESS) done[r] = devices[r]->finish(UINT64_MAX);
            });
        for (auto &t : threads)
            t.join();
        threads.clear();
        for (const bp_status s : done)
            if (s != BP_SUCCESS) return fail("all-reduce failed: " + std::to_string(s));
        if (i > 0)
            seconds.push_back(
                std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    std::sort(seconds.begin(), seconds.end());
    const double busBytes = 2.0 * (ranks - 1) / ranks * static_cast<double>(bytes);
    std::printf("all-reduce f32 sum, %u ranks (threads), %llu MiB per rank, %d runs: best %.1f ms, "
                "median %.1f ms, bus bandwidth %.2f GB/s (best)\n",
                ranks, static_cast<unsigned long long>(mib), repeats, seconds.front() * 1e3,
                seconds[seconds.size() / 2] * 1e3, busBytes / seconds.front() / 1e9);
    return 0;
}

} // namespace

int main(int argc, char **argv) {
    if (argc >= 4 && std::string(argv[1]) == "bench") {
        try {
            return bench(static_cast<uint32_t>(std::stoul(argv[2])), std::stoull(argv[3]),
                         argc > 4 ? std::stoi(argv[4]) : 5);
        } catch (const std::exception &e) {
            return fail(e.what());
        }
    }
    if (argc < 5) return fail("usage: ROLE RANK SIZE (ID-HEX | new) [TIMEOUT-MS]");
    const std::string role = argv[1];
    const auto rank = static_cast<uint32_t>(std::stoul(argv[2]));
    const auto size = static_cast<uint32_t>(std::stoul(argv[3]));
    const std::string idText = argv[4];
    const uint64_t timeoutMs = argc > 5 ? std::stoull(argv[5]) : 30'000;
    // The aborter waits for SIGUSR1: blocked before any thread starts, so every thread inherits
    // the mask and sigwait() takes it.
    sigset_t go;
    sigemptyset(&go);
    sigaddset(&go, SIGUSR1);
    if (role == "aborter") pthread_sigmask(SIG_BLOCK, &go, nullptr);
    try {
        Plugin plugin(R"({"collectives": {"address": "127.0.0.1"}})");
        const uint64_t pageBytes = role == "cases" ? caseTableBytes(size) : (64u << 20);
        Device device(plugin, 0, pageBytes);
        std::vector<unsigned char> id;
        if (idText == "new") {
            id = plugin.commId();
            say("ID " + toHex(id));
        } else {
            id = fromHex(idText);
        }
        std::string message;
        const bp_status joined = device.join(id, rank, size, timeoutMs, &message);
        if (joined != BP_SUCCESS) {
            say("JOINFAILED " + std::to_string(joined) + " " + message);
            return 1;
        }

        if (role == "cases") {
            const auto failures = runCaseTable(device, rank, size);
            for (const std::string &f : failures)
                std::fprintf(stderr, "worker: %s\n", f.c_str());
            return failures.empty() ? 0 : 1;
        }
        if (role == "victim") {
            say("JOINED");
            for (;;)
                std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        if (role == "receiver" || role == "aborter") {
            auto args = makeArgs<bp_collective_args>();
            args.type = BP_DATA_U8;
            args.send = args.recv = device.page();
            args.count = 64u << 20;
            args.peer = 1 - rank;
            args.op = role == "receiver" ? BP_COLLECTIVE_RECV : BP_COLLECTIVE_SEND;
            if (role == "aborter") {
                int signal = 0;
                sigwait(&go, &signal);
            }
            if (device.collective(args, &message) != BP_SUCCESS)
                return fail("collective: " + message);
            bp_event *event = device.flush();
            say("ISSUED");
            std::this_thread::sleep_for(std::chrono::milliseconds(500));
            if (role == "receiver") {
                raise(SIGSTOP);
                device.wait(event, UINT64_MAX);
                return 0;
            }
            const auto start = std::chrono::steady_clock::now();
            device.api().comm_abort(device.device(), device.comm());
            const bp_status status = device.wait(event, UINT64_MAX, &message);
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
            device.release(event);
            say("RESULT " + std::to_string(status) + " " + std::to_string(ms) + " " + message);
            return status == BP_ERROR_REMOTE ? 0 : 1;
        }
        if (role == "survivor") {
            constexpr uint64_t kCount = 1u << 20; // 4 MiB of f32
            auto args = makeArgs<bp_collective_args>();
            args.op = BP_COLLECTIVE_ALL_REDUCE;
            args.type = BP_DATA_F32;
            args.reduce = BP_REDUCE_SUM;
            args.send = args.recv = device.page();
            args.recv_offset = kCount * 4;
            args.count = kCount;
            if (device.collective(args, &message) != BP_SUCCESS)
                return fail("collective: " + message);
            bp_event *event = device.flush();
            const auto start = std::chrono::steady_clock::now();
            say("ISSUED");
            const bp_status status = device.wait(event, UINT64_MAX, &message);
            const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - start)
                                .count();
            device.release(event);
            say("RESULT " + std::to_string(status) + " " + std::to_string(ms) + " " + message);
            // Keep the communicator (and its connections) a while: the other ranks must learn
            // of the failure from this rank's communicator, not from this process's exit.
            std::this_thread::sleep_for(std::chrono::seconds(4));
            return status == BP_ERROR_REMOTE || status == BP_ERROR_TIMEOUT ? 0 : 1;
        }
        return fail("unknown role " + role);
    } catch (const std::exception &e) {
        return fail(e.what());
    }
}
