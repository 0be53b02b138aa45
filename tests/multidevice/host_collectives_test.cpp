// Collectives of the host plugin (Gloo) through the raw ABI, every rank a device of one process.
#include "host_collectives_support.hpp"

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <string>
#include <thread>
#include <vector>

using namespace hostcoll;

namespace {

using Clock = std::chrono::steady_clock;
constexpr uint64_t kSecondNs = 1000ull * 1000 * 1000;
const std::string kLoopback = R"("collectives": {"address": "127.0.0.1"})";

std::string options(uint32_t devices, const std::string &extra = "") {
    return "{\"devices\": " + std::to_string(devices) + ", " + kLoopback +
           (extra.empty() ? "" : ", " + extra) + "}";
}

double secondsSince(Clock::time_point start) {
    return std::chrono::duration<double>(Clock::now() - start).count();
}

/// Joins devices[0..n) as ranks 0..n-1 of one communicator, one thread per rank (as the core
/// does); returns each rank's status and message.
std::vector<std::pair<bp_status, std::string>>
joinAll(const Plugin &plugin, std::vector<std::unique_ptr<Device>> &devices, uint64_t timeoutMs) {
    const std::vector<unsigned char> id = plugin.commId();
    const auto size = static_cast<uint32_t>(devices.size());
    std::vector<std::pair<bp_status, std::string>> results(size);
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < size; ++r)
        threads.emplace_back([&, r] {
            results[r].first = devices[r]->join(id, r, size, timeoutMs, &results[r].second);
        });
    for (auto &t : threads)
        t.join();
    return results;
}

std::vector<std::unique_ptr<Device>> openDevices(const Plugin &plugin, uint32_t count,
                                                 uint64_t pageBytes) {
    std::vector<std::unique_ptr<Device>> devices;
    for (uint32_t i = 0; i < count; ++i)
        devices.push_back(std::make_unique<Device>(plugin, i, pageBytes));
    return devices;
}

void requireJoined(const std::vector<std::pair<bp_status, std::string>> &results) {
    for (const auto &[status, message] : results) {
        INFO(message);
        REQUIRE(status == BP_SUCCESS);
    }
}

bp_collective_args allReduce(const Device &device, uint64_t count) {
    auto args = makeArgs<bp_collective_args>();
    args.op = BP_COLLECTIVE_ALL_REDUCE;
    args.type = BP_DATA_F32;
    args.reduce = BP_REDUCE_SUM;
    args.send = device.page();
    args.send_offset = 0;
    args.recv = device.page();
    args.recv_offset = count * 4;
    args.count = count;
    return args;
}

// A host kernel that holds its stream until the test opens the gate; scalars: a Gate*.
struct Gate {
    std::atomic<bool> open{false};
    ~Gate() { open = true; }
};

void gateKernel(const bp_host_kernel_context *context) {
    Gate *gate = nullptr;
    std::memcpy(&gate, context->scalars, sizeof(gate));
    while (!gate->open.load())
        std::this_thread::sleep_for(std::chrono::microseconds(200));
}

void appendBlob(void *user, const void *data, size_t size) {
    auto *blob = static_cast<std::vector<unsigned char> *>(user);
    blob->insert(blob->end(), static_cast<const unsigned char *>(data),
                 static_cast<const unsigned char *>(data) + size);
}

/// Launches gateKernel on `device`'s stream.
bp_kernel *launchGate(Device &device, Gate &gate) {
    const bp_plugin_api &api = device.api();
    auto source = makeArgs<bp_host_kernel_source>();
    source.function = gateKernel;
    std::vector<unsigned char> blob;
    auto compile = makeArgs<bp_kernel_compile_args>();
    compile.dialect = BP_DIALECT_HOST;
    compile.entry_point = "gate";
    compile.source = &source;
    compile.source_size = sizeof(source);
    compile.binary = {&blob, appendBlob};
    bp_error error = makeError();
    check(api.kernel_compile(device.device(), &compile, &error), error, "kernel_compile");
    auto load = makeArgs<bp_kernel_load_args>();
    load.dialect = BP_DIALECT_HOST;
    load.entry_point = "gate";
    load.binary = blob.data();
    load.binary_size = blob.size();
    bp_kernel *kernel = nullptr;
    check(api.kernel_load(device.device(), &load, &kernel, &error), error, "kernel_load");
    auto launch = makeArgs<bp_launch_args>();
    launch.kernel = kernel;
    launch.grid[0] = launch.grid[1] = launch.grid[2] = 1;
    launch.block[0] = launch.block[1] = launch.block[2] = 1;
    Gate *pointer = &gate;
    launch.scalars = &pointer;
    launch.scalar_size = sizeof(pointer);
    check(api.kernel_launch(device.device(), device.stream(), &launch, &error), error,
          "kernel_launch");
    return kernel;
}

/// The whole case table with `size` ranks as threads of this process, each on its own device.
void runCaseTableInThreads(uint32_t size) {
    Plugin plugin(options(size));
    auto devices = openDevices(plugin, size, caseTableBytes(size));
    requireJoined(joinAll(plugin, devices, 30'000));
    std::vector<std::vector<std::string>> failures(size);
    std::vector<std::thread> threads;
    for (uint32_t r = 0; r < size; ++r)
        threads.emplace_back([&, r] {
            try {
                failures[r] = runCaseTable(*devices[r], r, size);
            } catch (const std::exception &e) {
                failures[r].push_back("rank " + std::to_string(r) + ": " + e.what());
            }
        });
    for (auto &t : threads)
        t.join();
    for (const auto &list : failures)
        for (const std::string &failure : list)
            FAIL_CHECK(failure);
}

} // namespace

TEST_CASE("a host device built with Gloo declares collectives and names the engine") {
    Plugin plugin(options(1));
    const bp_device_info info = plugin.info(0);
    CHECK((info.capabilities & BP_CAPABILITY_COLLECTIVES) != 0);
    CHECK(std::string(info.collectives) == "gloo 0.5.0 (tcp)");
}

TEST_CASE("four ranks in one process run every collective, type and reduction exactly") {
    runCaseTableInThreads(4);
}

TEST_CASE("three ranks in one process run every collective, type and reduction exactly") {
    runCaseTableInThreads(3); // averages divide by 3, so they round (by 4 they are exact)
}

TEST_CASE("a communicator of a single rank runs every collective on itself") {
    runCaseTableInThreads(1);
}

TEST_CASE("a rank that joins alone times out with the store's address and the missing rank") {
    Plugin plugin(options(1));
    Device device(plugin, 0, 4096);
    const auto id = plugin.commId();
    std::string message;
    const auto start = Clock::now();
    const bp_status status = device.join(id, 0, 2, 1500, &message);
    const double waited = secondsSince(start);
    INFO(message);
    CHECK(status == BP_ERROR_TIMEOUT);
    CHECK(waited >= 1.4);
    CHECK(waited < 4.0);
    CHECK(message.find("127.0.0.1:") != std::string::npos);
    CHECK(message.find("1 of 2 ranks never joined (rank 1)") != std::string::npos);
}

TEST_CASE("comm_abort fails a blocked all-reduce at once, and then the peer's collectives") {
    Plugin plugin(options(2));
    auto devices = openDevices(plugin, 2, 1 << 16);
    requireJoined(joinAll(plugin, devices, 30'000)); // collectives' own timeout: 30 s
    Device &first = *devices[0];
    Device &second = *devices[1];

    // Rank 1 never issues its all-reduce: rank 0's stays blocked on it.
    std::string message;
    REQUIRE(first.collective(allReduce(first, 1000), &message) == BP_SUCCESS);
    bp_event *blocked = first.flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    CHECK(first.wait(blocked, 0) == BP_ERROR_TIMEOUT); // still pending

    const auto start = Clock::now();
    first.api().comm_abort(first.device(), first.comm());
    const bp_status status = first.wait(blocked, 10 * kSecondNs, &message);
    first.release(blocked);
    INFO(message);
    CHECK(status == BP_ERROR_REMOTE);
    CHECK(secondsSince(start) < 2.0);
    CHECK(message.find("all_reduce") != std::string::npos);
    CHECK(message.find("destroy it and create a new one") != std::string::npos);

    // Later collectives of the aborted rank fail at once.
    REQUIRE(first.collective(allReduce(first, 10)) == BP_SUCCESS);
    CHECK(first.finish(5 * kSecondNs, &message) == BP_ERROR_REMOTE);
    CHECK(message.find("aborted") != std::string::npos);

    // The abort closed rank 0's connections: rank 1's collective fails fast too.
    const auto peerStart = Clock::now();
    REQUIRE(second.collective(allReduce(second, 1000)) == BP_SUCCESS);
    CHECK(second.finish(10 * kSecondNs, &message) == BP_ERROR_REMOTE);
    CHECK(secondsSince(peerStart) < 2.0);
}

TEST_CASE("a malformed communicator id or an oversized communicator is an invalid argument") {
    Plugin plugin(options(1));
    Device device(plugin, 0, 4096);
    const auto good = plugin.commId();
    auto expectInvalid = [&](std::vector<unsigned char> id, const char *needle) {
        std::string message;
        CAPTURE(needle);
        CHECK(device.join(id, 0, 1, 2000, &message) == BP_ERROR_INVALID_ARGUMENT);
        CHECK(message.find(needle) != std::string::npos);
    };
    auto magic = good;
    magic[0] = 'X';
    expectInvalid(magic, "magic");
    expectInvalid(std::vector<unsigned char>(good.begin(), good.begin() + 10), "bytes");
    auto longer = good;
    longer.push_back('1');
    expectInvalid(longer, "header announces");
    auto version = good;
    version[4] = 2;
    expectInvalid(version, "version 2");
    auto port = good;
    port[24] = port[25] = 0;
    expectInvalid(port, "port 0");
    auto host = good;
    host.at(26) = ' '; // the first character of the store's address
    expectInvalid(host, "invalid characters");
    expectInvalid({}, "bytes");
    std::string message;
    CHECK(device.join(good, 0, 5000, 2000, &message) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message.find("at most 1024") != std::string::npos);
}

TEST_CASE("an id whose nonce the store never made is refused by the store") {
    Plugin plugin(options(1));
    Device device(plugin, 0, 4096);
    auto id = plugin.commId();
    id[8] ^= 0xff; // the nonce's first byte
    std::string message;
    CHECK(device.join(id, 0, 1, 3000, &message) == BP_ERROR_REMOTE);
    CHECK(message.find("does not know this communicator") != std::string::npos);
}

TEST_CASE("the rendezvous store outlives malformed, hostile and idle clients") {
    Plugin plugin(options(2));
    const auto id = plugin.commId();
    const auto port = static_cast<uint16_t>(id[24] | (id[25] << 8)); // comm_id.hpp's layout
    std::vector<int> sockets;
    auto connectStore = [&] {
        const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        REQUIRE(fd >= 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_port = htons(port);
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        REQUIRE(::connect(fd, reinterpret_cast<sockaddr *>(&address), sizeof(address)) == 0);
        sockets.push_back(fd);
        return fd;
    };
    auto sendBytes = [](int fd, const std::vector<unsigned char> &bytes) {
        // The store may already have closed the connection: no SIGPIPE, no check.
        (void)::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
    };
    sendBytes(connectStore(), {0xff, 0xff, 0xff, 0xff, 3});    // a 4 GiB frame
    sendBytes(connectStore(), {5, 0, 0, 0, 3, 1, 0, 0, 0});    // Get before Hello
    std::vector<unsigned char> hello = {19, 0, 0, 0, 1, 1, 0}; // Hello, version 1,
    hello.insert(hello.end(), 16, 0xab);                       // a foreign nonce
    sendBytes(connectStore(), hello);
    std::vector<unsigned char> noise(100000);
    for (size_t i = 0; i < noise.size(); ++i)
        noise[i] = static_cast<unsigned char>(i * 131);
    sendBytes(connectStore(), noise);
    sendBytes(connectStore(), {200, 0, 0, 0, 2, 1}); // half a frame
    for (int i = 0; i < 50; ++i)
        connectStore(); // idle clients
    // The refused Hello gets its answer, then the store closes that connection.
    unsigned char reply[64] = {};
    const ssize_t got = ::recv(sockets[2], reply, sizeof(reply), MSG_WAITALL);
    CHECK(got > 5);
    CHECK(reply[4] == 2); // Refused

    // The store still serves a real communicator.
    auto devices = openDevices(plugin, 2, 1 << 16);
    requireJoined(joinAll(plugin, devices, 10'000));
    for (auto &d : devices)
        REQUIRE(d->collective(allReduce(*d, 100)) == BP_SUCCESS);
    for (auto &d : devices)
        CHECK(d->finish(10 * kSecondNs) == BP_SUCCESS);
    for (const int fd : sockets)
        ::close(fd);
}

TEST_CASE("collective arguments are checked before anything is recorded") {
    Plugin plugin(options(2));
    auto devices = openDevices(plugin, 2, 4096);
    requireJoined(joinAll(plugin, devices, 10'000));
    Device &device = *devices[0];
    Device &other = *devices[1];
    const bp_plugin_api &api = device.api();
    auto expectInvalid = [&](bp_collective_args args, const char *needle) {
        CAPTURE(needle);
        bp_error error = makeError();
        CHECK(api.collective(device.device(), device.stream(), device.comm(), &args, &error) ==
              BP_ERROR_INVALID_ARGUMENT);
        CHECK(messageOf(error).find(needle) != std::string::npos);
    };
    const auto base = allReduce(device, 256); // 1 KiB at 0, 1 KiB at 1024 of a 4 KiB page

    auto a = base;
    a.send = nullptr;
    expectInvalid(a, "send is NULL");
    a = base;
    a.recv_offset = 4096 - 100;
    expectInvalid(a, "outside its page");
    a = base;
    a.recv_offset = UINT64_MAX - 2;
    expectInvalid(a, "outside its page");
    a = base;
    a.count = UINT64_MAX / 2;
    expectInvalid(a, "overflows");
    a = base;
    a.op = BP_COLLECTIVE_ALL_GATHER;
    a.count = UINT64_MAX / 4 / 2 + 1; // count * 4 fits, times 2 ranks does not
    expectInvalid(a, "ranks overflows");
    a = base;
    a.reduce = static_cast<bp_reduce_op>(7);
    expectInvalid(a, "reduce 7");
    a = base;
    a.type = static_cast<bp_data_type>(42);
    expectInvalid(a, "type 42");
    a = base;
    a.op = static_cast<bp_collective>(9);
    expectInvalid(a, "op 9");
    a = base;
    a.op = BP_COLLECTIVE_BROADCAST;
    a.peer = 2;
    expectInvalid(a, "peer 2");
    a = base;
    a.op = BP_COLLECTIVE_SEND;
    a.peer = 0;
    expectInvalid(a, "is this rank");
    a = base;
    a.recv_offset = 512; // overlaps send [0, 1024) but is not the same range
    expectInvalid(a, "overlap");
    a = base;
    a.op = BP_COLLECTIVE_ALL_GATHER;
    a.recv_offset = 0; // rank 0's slot of recv is send itself: in place, allowed
    a.count = 128;
    bp_error error = makeError();
    CHECK(api.collective(device.device(), device.stream(), device.comm(), &a, &error) ==
          BP_SUCCESS);
    a.send_offset = 4; // inside recv but not rank 0's slot
    expectInvalid(a, "in-place layout");
    a = base;
    a.recv = other.page();
    expectInvalid(a, "not allocated on this host device");
    // A handle the operation ignores is not looked at: RECV reads no send.
    a = base;
    a.op = BP_COLLECTIVE_RECV;
    a.peer = 1;
    a.send = other.page();
    a.count = 0;
    CHECK(api.collective(device.device(), device.stream(), device.comm(), &a, &error) ==
          BP_SUCCESS);
    // The communicator of another device.
    a = base;
    CHECK(api.collective(device.device(), device.stream(), other.comm(), &a, &error) ==
          BP_ERROR_INVALID_ARGUMENT);
    CHECK(messageOf(error).find("not created on this host device") != std::string::npos);

    // Rank 1 runs the one accepted all-gather too; both streams finish cleanly.
    auto gather = allReduce(other, 128);
    gather.op = BP_COLLECTIVE_ALL_GATHER;
    gather.recv_offset = 0;
    gather.send_offset = 128 * 4;
    REQUIRE(other.collective(gather) == BP_SUCCESS);
    gather.op = BP_COLLECTIVE_SEND; // matches rank 0's zero-byte RECV
    gather.peer = 0;
    gather.count = 0;
    REQUIRE(other.collective(gather) == BP_SUCCESS);
    CHECK(device.finish(20 * kSecondNs) == BP_SUCCESS);
    CHECK(other.finish(20 * kSecondNs) == BP_SUCCESS);
}

TEST_CASE("host devices of one plugin instance are peers and wait for each other's events") {
    Plugin plugin(options(2));
    Plugin another(options(1));
    Device a(plugin, 0, 4096);
    Device b(plugin, 1, 4096);
    Device c(another, 0, 4096);
    const bp_plugin_api &api = plugin.api();
    auto peer = [&](const Device &to, const Device &from) {
        uint32_t result = 7;
        bp_error error = makeError();
        check(api.device_peer_access(to.device(), from.device(), &result, &error), error,
              "device_peer_access");
        return result;
    };
    CHECK(peer(a, b) == 1);
    CHECK(peer(b, a) == 1);
    CHECK(peer(a, a) == 1);
    CHECK(peer(a, c) == 0);
    CHECK(peer(c, a) == 0);

    // b's stream waits for an event of a's stream, held open by a gated kernel.
    Gate gate;
    bp_kernel *kernel = launchGate(a, gate);
    bp_event *held = a.flush();
    bp_error error = makeError();
    check(api.stream_wait_event(b.device(), b.stream(), held, &error), error, "stream_wait_event");
    const uint32_t pattern = 0x01020304;
    b.upload(0, &pattern, 4);
    bp_event *after = b.flush();
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    CHECK(b.wait(after, 0) == BP_ERROR_TIMEOUT); // held behind a's kernel
    gate.open = true;
    CHECK(b.wait(after, 10 * kSecondNs) == BP_SUCCESS);
    b.release(after);
    a.release(held);
    CHECK(a.finish(10 * kSecondNs) == BP_SUCCESS);
    api.kernel_release(a.device(), kernel);
}

TEST_CASE("on sync streams a group runs the ranks' collectives side by side") {
    Plugin plugin(options(2, R"("mode": "sync")"));
    auto devices = openDevices(plugin, 2, 1 << 16);
    requireJoined(joinAll(plugin, devices, 10'000));
    const bp_plugin_api &api = plugin.api();
    std::vector<float> inputs[2] = {std::vector<float>(1000, 1.5f), std::vector<float>(1000, 2.0f)};
    for (int r = 0; r < 2; ++r)
        devices[r]->upload(0, inputs[r].data(), 4000);
    bp_error error = makeError();
    REQUIRE(api.comm_group(plugin.instance(), 1, &error) == BP_SUCCESS);
    for (int r = 0; r < 2; ++r)
        REQUIRE(devices[r]->collective(allReduce(*devices[r], 1000)) == 0);
    const bp_status ended = api.comm_group(plugin.instance(), 0, &error);
    INFO(messageOf(error));
    REQUIRE(ended == BP_SUCCESS);
    for (int r = 0; r < 2; ++r) {
        std::vector<float> result(1000);
        devices[r]->download(4000, result.data(), 4000);
        CHECK(result == std::vector<float>(1000, 3.5f));
    }
    CHECK(api.comm_group(plugin.instance(), 0, &error) == BP_ERROR_INVALID_ARGUMENT);
    CHECK(api.comm_group(plugin.instance(), 2, &error) == BP_ERROR_INVALID_ARGUMENT);
}

TEST_CASE("the collectives' address comes from BACKPLANE_GLOO_ADDRESS before the options") {
    // 192.0.2.1 (TEST-NET-1) is no address of this machine: the store cannot listen there.
    ::setenv("BACKPLANE_GLOO_ADDRESS", "192.0.2.1", 1);
    bp_status status = BP_SUCCESS;
    std::string message;
    {
        Plugin plugin(options(1));
        std::vector<unsigned char> id(BP_COMM_ID_MAX_BYTES);
        size_t size = 0;
        bp_error error = makeError();
        status =
            plugin.api().comm_id_create(plugin.instance(), id.data(), id.size(), &size, &error);
        message = messageOf(error);
    }
    ::unsetenv("BACKPLANE_GLOO_ADDRESS");
    INFO(message);
    CHECK(status == BP_ERROR_INVALID_ARGUMENT);
    CHECK(message.find("BACKPLANE_GLOO_ADDRESS") != std::string::npos);
    CHECK(message.find("192.0.2.1") != std::string::npos);
}

TEST_CASE("bad collectives options fail plugin_init with the key") {
    for (const char *bad :
         {R"({"collectives": {"address": 5}})", R"({"collectives": []})",
          R"({"collectives": {"port": 1}})", R"({"collectives": {"interface": "a b"}})"}) {
        CAPTURE(bad);
        try {
            Plugin plugin(bad);
            FAIL_CHECK("plugin_init accepted it");
        } catch (const CallFailed &e) {
            CHECK(e.status() == BP_ERROR_INVALID_ARGUMENT);
            CHECK(std::string(e.what()).find("collectives") != std::string::npos);
        }
    }
}
