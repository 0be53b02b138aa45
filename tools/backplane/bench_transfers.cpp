// `backplane bench transfers`: the staging sweep, and the transfer rows the other suites share.
//
// The sweep opens the device once per combination of the staging settings (memory.staging_*:
// chunk size, ring depth, copy threads, streaming stores; docs/config.md), each time through a
// Runtime of its own with only that device's plugin enabled, and times a pageable write and a
// pageable readInto of 256 MiB (16 MiB with --quick) against the plugin's copy from pinned memory
// in the same process (the raw C table, as `bench engine` does). One client of the default
// settings stays open meanwhile, so that the device's context is not torn down and rebuilt for
// every combination. Every combination is one row per direction; the last rows name the best.
#include "bench.hpp"
#include "raw_device.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/runtime.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

namespace backplane::tool {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uint64_t kKiB = 1024;
constexpr uint64_t kMiB = 1024 * kKiB;
/// Sizes up to this are reported in microseconds per transfer, larger ones in GB/s.
constexpr uint64_t kLatencySizeLimit = 1 * kMiB;

double median3(double a, double b, double c) {
    return std::max(std::min(a, b), std::min(std::max(a, b), c));
}

/// The staging settings of one sweep combination.
struct Setting {
    uint64_t chunk = 0;
    uint32_t depth = 0;
    uint32_t threads = 0;
    bool streaming = true;
    std::string text() const {
        return "chunk " + sizeText(chunk) + ", depth " + std::to_string(depth) + ", " +
               std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") +
               (streaming ? ", streaming" : ", memcpy");
    }
};

/// The copy-thread counts to try: 4, 8, 12, 16 up to the hardware threads (1 and the hardware
/// count on a machine with fewer than 4).
std::vector<uint32_t> threadCounts() {
    const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
    std::vector<uint32_t> counts;
    for (const uint32_t n : {4u, 8u, 12u, 16u})
        if (n <= hardware) counts.push_back(n);
    if (counts.empty()) {
        counts.push_back(1);
        if (hardware > 1) counts.push_back(hardware);
    }
    return counts;
}

struct SweepResult {
    Setting setting;
    double write = 0, read = 0; // GB/s
};

void sweepDevice(const Runtime &runtime, const DeviceInfo &info, const BenchOptions &options,
                 BenchRows &rows) {
    uint64_t bytes = options.quick ? 16 * kMiB : 256 * kMiB;
    if (info.memoryBytes != 0) bytes = std::min(bytes, info.memoryBytes / 8);
    if (info.maxAllocationBytes != 0) bytes = std::min(bytes, info.maxAllocationBytes);
    const double gb = static_cast<double>(bytes) / 1e9;
    const std::string device = info.id() + " " + info.name;
    Selection selection;
    selection.device = info;
    // Keeps the device's context alive across the combinations (see the top of the file).
    const ComputeClient keeper = runtime.open(selection);

    double pinnedWrite = 0, pinnedRead = 0, pageableWrite = 0, pageableRead = 0;
    {
        const RawDevice raw(openRawPlugin(runtime, info), info.index);
        const abi::Owned<bp_stream> stream = raw.createStream();
        const RawMemory dst = raw.allocate(BP_MEMORY_DEVICE, bytes);
        const RawMemory pinned = raw.allocate(BP_MEMORY_PINNED_HOST, bytes);
        std::vector<unsigned char> pageable(bytes, 1);
        std::memset(pinned.mapped, 1, bytes);
        auto rate = [&](void *host, bool write) {
            return gb / secondsPerTransfer(bytes, options.quick, [&] {
                       if (write)
                           raw.copyHostToDevice(stream.get(), host, dst.memory.get(), 0, bytes);
                       else
                           raw.copyDeviceToHost(stream.get(), dst.memory.get(), 0, host, bytes);
                       raw.sync(stream.get());
                   });
        };
        pinnedWrite = rate(pinned.mapped, true);
        pinnedRead = rate(pinned.mapped, false);
        pageableWrite = rate(pageable.data(), true);
        pageableRead = rate(pageable.data(), false);
    }
    rows.push_back({"transfers", device,
                    "raw: write " + sizeText(bytes) + " from pageable vs pinned", pageableWrite,
                    pinnedWrite, "GB/s", ""});
    rows.push_back({"transfers", device,
                    "raw: read " + sizeText(bytes) + " into pageable vs pinned", pageableRead,
                    pinnedRead, "GB/s", ""});

    const std::vector<uint64_t> chunks =
        options.quick ? std::vector<uint64_t>{1 * kMiB, 2 * kMiB, 4 * kMiB}
                      : std::vector<uint64_t>{2 * kMiB, 4 * kMiB, 8 * kMiB, 16 * kMiB};
    std::vector<unsigned char> host(bytes, 1);
    std::vector<SweepResult> results;
    Config base = runtime.config();
    base.pluginEnable = {info.backend};
    for (const uint64_t chunk : chunks) {
        for (const uint32_t depth : {2u, 3u, 4u}) {
            for (const uint32_t threads : threadCounts()) {
                for (const bool streaming : {true, false}) {
                    SweepResult r;
                    r.setting = {chunk, depth, threads, streaming};
                    Config config = base;
                    config.stagingChunkBytes = chunk;
                    // The ring of one transfer always fits the device's bound.
                    config.stagingLimitBytes = std::max<uint64_t>(8, depth) * chunk;
                    config.stagingRingDepth = depth;
                    config.stagingCopyThreads = threads;
                    config.stagingStreamingStores = streaming;
                    const Runtime tuned(config);
                    ComputeClient client = tuned.open(selection);
                    const Buffer buffer = client.empty(bytes);
                    r.write = gb / secondsPerTransfer(bytes, options.quick, [&] {
                                  client.write(buffer, 0, host.data(), bytes);
                                  client.sync();
                              });
                    r.read = gb / secondsPerTransfer(bytes, options.quick, [&] {
                                 client.readInto(buffer, 0, host.data(), bytes);
                             });
                    results.push_back(r);
                    rows.push_back({"transfers", device,
                                    "write " + sizeText(bytes) + ": " + r.setting.text(), r.write,
                                    pinnedWrite, "GB/s", ">= 0.85x"});
                    rows.push_back({"transfers", device,
                                    "read " + sizeText(bytes) + ": " + r.setting.text(), r.read,
                                    pinnedRead, "GB/s", ">= 0.85x"});
                }
            }
        }
    }
    // The best of each direction, and the best setting for both: the higher of the two ratios'
    // minimum (one setting serves writes and reads).
    const auto best = [&](auto score) {
        return *std::max_element(
            results.begin(), results.end(),
            [&](const SweepResult &a, const SweepResult &b) { return score(a) < score(b); });
    };
    const SweepResult w = best([](const SweepResult &r) { return r.write; });
    const SweepResult rd = best([](const SweepResult &r) { return r.read; });
    const SweepResult both = best(
        [&](const SweepResult &r) { return std::min(r.write / pinnedWrite, r.read / pinnedRead); });
    rows.push_back({"transfers", device, "best write: " + w.setting.text(), w.write, pinnedWrite,
                    "GB/s", ">= 0.85x"});
    rows.push_back({"transfers", device, "best read: " + rd.setting.text(), rd.read, pinnedRead,
                    "GB/s", ">= 0.85x"});
    rows.push_back({"transfers", device, "best both, write: " + both.setting.text(), both.write,
                    pinnedWrite, "GB/s", ">= 0.85x"});
    rows.push_back({"transfers", device, "best both, read: " + both.setting.text(), both.read,
                    pinnedRead, "GB/s", ">= 0.85x"});
    std::fprintf(stderr,
                 "bench transfers: %s: best setting for both directions: %s "
                 "(memory.staging_chunk_bytes %llu, staging_ring_depth %u, staging_copy_threads "
                 "%u, staging_streaming_stores %s)\n",
                 info.id().c_str(), both.setting.text().c_str(),
                 static_cast<unsigned long long>(both.setting.chunk), both.setting.depth,
                 both.setting.threads, both.setting.streaming ? "true" : "false");
}

} // namespace

std::vector<uint64_t> transferSizes(bool quick, uint64_t largestCap) {
    uint64_t largest = quick ? 16 * kMiB : 256 * kMiB;
    if (largestCap != 0) largest = std::max(1 * kMiB, std::min(largest, largestCap));
    return {4 * kKiB, 64 * kKiB, 1 * kMiB, largest};
}

std::string sizeText(uint64_t bytes) {
    if (bytes >= kMiB && bytes % kMiB == 0) return std::to_string(bytes / kMiB) + " MiB";
    if (bytes >= kKiB && bytes % kKiB == 0) return std::to_string(bytes / kKiB) + " KiB";
    return std::to_string(bytes) + " B";
}

double secondsPerTransfer(uint64_t bytes, bool quick, const std::function<void()> &transfer) {
    const uint64_t budget = quick ? 8 * kMiB : 64 * kMiB;
    const uint64_t calls = std::clamp<uint64_t>(budget / std::max<uint64_t>(bytes, 1), 1, 2000);
    transfer(); // warm-up: first touch of the pages, staging blocks, kernels of the copy
    double batches[3] = {};
    for (double &seconds : batches) {
        const auto start = Clock::now();
        for (uint64_t i = 0; i < calls; ++i)
            transfer();
        seconds = std::chrono::duration<double>(Clock::now() - start).count() /
                  static_cast<double>(calls);
    }
    return median3(batches[0], batches[1], batches[2]);
}

void addTransferRows(BenchRows &rows, const std::string &suite, const std::string &device,
                     const TransferTimes &t, const std::string &pageableName,
                     const std::string &pinnedName) {
    const std::string what = t.direction + " " + sizeText(t.bytes) + " pageable via staging vs ";
    if (t.bytes <= kLatencySizeLimit) {
        rows.push_back({suite, device, what + pageableName, t.runtime * 1e6, t.pageable * 1e6, "us",
                        "<= 1.00x"});
        rows.push_back(
            {suite, device, what + pinnedName, t.runtime * 1e6, t.pinned * 1e6, "us", ""});
        return;
    }
    const double gb = static_cast<double>(t.bytes) / 1e9;
    rows.push_back(
        {suite, device, what + pageableName, gb / t.runtime, gb / t.pageable, "GB/s", ">= 1.00x"});
    rows.push_back(
        {suite, device, what + pinnedName, gb / t.runtime, gb / t.pinned, "GB/s", ">= 0.85x"});
}

void benchTransfers(const BenchOptions &options, BenchRows &rows) {
    const Runtime runtime;
    std::vector<DeviceInfo> devices;
    if (!options.device.empty()) {
        devices.push_back(runtime.select(options.device).device);
    } else {
        for (const PhysicalDevice &p : runtime.devices())
            devices.push_back(p.info());
    }
    if (devices.empty()) std::fprintf(stderr, "bench transfers: no device found\n");
    for (const DeviceInfo &info : devices) {
        try {
            sweepDevice(runtime, info, options, rows);
        } catch (const Error &e) {
            std::fprintf(stderr, "bench transfers: %s failed: %s\n", info.id().c_str(), e.what());
        }
    }
}

} // namespace backplane::tool
