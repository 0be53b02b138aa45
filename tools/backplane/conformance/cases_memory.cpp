// Cases over storage: every memory kind, sizes at and past the limits, mapping, many pages,
// allocation from many threads.
#include "handles.hpp"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

namespace backplane::conformance {
namespace {

bp_status tryAllocate(OpenDevice &device, uint32_t kind, uint64_t size, bp_memory **out,
                      void **mapped, bp_error &error) {
    auto args = abi::make<bp_memory_allocate_args>();
    args.kind = rawEnum<bp_memory_kind>(static_cast<int>(kind));
    args.size = size;
    return device.api().memory_allocate(device.get(), &args, out, mapped, &error);
}

/// A DEVICE allocation of `size` bytes must be refused with out_of_memory or invalid_argument
/// (freed again if the plugin served it, so the case fails without leaking).
void expectRefused(OpenDevice &device, uint64_t size, const std::string &what) {
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    const bp_status status = tryAllocate(device, BP_MEMORY_DEVICE, size, &memory, &mapped, error);
    if (status == BP_SUCCESS) device.api().memory_free(device.get(), memory);
    expectFailure(status, error, {BP_ERROR_OUT_OF_MEMORY, BP_ERROR_INVALID_ARGUMENT},
                  "memory_allocate(" + what + ")");
}

/// After a refused allocation, the device must still serve a normal one.
void stillAllocates(OpenDevice &device, const std::string &after) {
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    succeed(tryAllocate(device, BP_MEMORY_DEVICE, 4096, &memory, &mapped, error), error,
            "memory_allocate(4096) after " + after);
    device.api().memory_free(device.get(), memory);
}

} // namespace

CONFORMANCE_CASE("memory.device_pages",
                 "DEVICE pages of many sizes allocate and free; pages are distinct") {
    OpenDevice &device = ctx.device();
    std::vector<Page> pages;
    for (const uint64_t size : {1ull, 3ull, 4ull, 4096ull, 65537ull, 1ull << 20})
        pages.push_back(device.allocate(BP_MEMORY_DEVICE, size));
    for (size_t a = 0; a < pages.size(); ++a)
        for (size_t b = a + 1; b < pages.size(); ++b)
            require(pages[a].get() != pages[b].get(), "two live pages share one handle");
}

CONFORMANCE_CASE("memory.host_mapped_kinds",
                 "PINNED_HOST and HOST_VISIBLE pages are mapped and writable, or the kind is unsupported") {
    OpenDevice &device = ctx.device();
    for (const bp_memory_kind kind : {BP_MEMORY_PINNED_HOST, BP_MEMORY_HOST_VISIBLE}) {
        Page page = device.allocateIfSupported(kind, 65536);
        if (!page.memory) continue;
        auto *bytes = static_cast<uint8_t *>(page.mapped);
        for (size_t i = 0; i < 65536; i += 4096) bytes[i] = static_cast<uint8_t>(i >> 12);
        for (size_t i = 0; i < 65536; i += 4096)
            require(bytes[i] == static_cast<uint8_t>(i >> 12), "a mapped page does not keep a write");
    }
}

CONFORMANCE_CASE("memory.pinned_transfers",
                 "a PINNED_HOST page's address works as the host side of both transfers") {
    OpenDevice &device = ctx.device();
    Page pinned = device.allocateIfSupported(BP_MEMORY_PINNED_HOST, 1 << 16);
    if (!pinned.memory) throw NotApplicable("PINNED_HOST memory is unsupported");
    Stream stream = device.createStream();
    const auto data = patternBytes(1 << 16, 7);
    std::memcpy(pinned.mapped, data.data(), data.size());
    Page page = device.allocate(BP_MEMORY_DEVICE, 1 << 16);
    device.upload(stream, page, 0, pinned.mapped, data.size());
    device.finish(stream);
    std::memset(pinned.mapped, 0, data.size());
    device.download(stream, page, 0, pinned.mapped, data.size());
    device.finish(stream);
    require(std::memcmp(pinned.mapped, data.data(), data.size()) == 0,
            "bytes through a pinned page came back different");
}

CONFORMANCE_CASE("memory.zero_size", "memory_allocate of 0 bytes fails with invalid_argument") {
    OpenDevice &device = ctx.device();
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    expectFailure(tryAllocate(device, BP_MEMORY_DEVICE, 0, &memory, &mapped, error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "memory_allocate(0 bytes)");
}

CONFORMANCE_CASE("memory.unknown_kind", "memory_allocate of an unknown kind fails with invalid_argument") {
    OpenDevice &device = ctx.device();
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    expectFailure(tryAllocate(device, 77, 4096, &memory, &mapped, error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "memory_allocate(kind 77)");
}

CONFORMANCE_CASE("memory.above_max_allocation",
                 "a page larger than max_allocation_bytes is refused with a status; the device still allocates") {
    OpenDevice &device = ctx.device();
    const uint64_t size = ctx.info().max_allocation_bytes + 1;
    expectRefused(device, size, "max_allocation_bytes + 1 = " + std::to_string(size));
    stillAllocates(device, "a refused oversized allocation");
}

CONFORMANCE_CASE("memory.out_of_memory",
                 "an allocation no device can serve fails with out_of_memory or invalid_argument, never a crash") {
    OpenDevice &device = ctx.device();
    for (const uint64_t size : {uint64_t{1} << 62, UINT64_MAX})
        expectRefused(device, size, std::to_string(size) + " bytes");
    stillAllocates(device, "refused huge allocations");
}

CONFORMANCE_CASE("memory.null_arguments",
                 "memory_allocate with NULL args or a NULL out pointer fails with invalid_argument") {
    OpenDevice &device = ctx.device();
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    expectFailure(device.api().memory_allocate(device.get(), nullptr, &memory, &mapped, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "memory_allocate(NULL args)");
    error = makeError();
    expectFailure(tryAllocate(device, BP_MEMORY_DEVICE, 4096, nullptr, &mapped, error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "memory_allocate(NULL out)");
}

CONFORMANCE_CASE("memory.map_device",
                 "memory_map of a DEVICE page works when MAPPABLE_DEVICE_MEMORY is declared, else says unsupported") {
    OpenDevice &device = ctx.device();
    Page page = device.allocate(BP_MEMORY_DEVICE, 4096);
    void *mapped = nullptr;
    bp_error error = makeError();
    const bp_status status = device.api().memory_map(device.get(), page.get(), &mapped, &error);
    if (!ctx.declares(BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY)) {
        expectFailure(status, error, {BP_ERROR_UNSUPPORTED},
                      "memory_map without BP_CAPABILITY_MAPPABLE_DEVICE_MEMORY");
        return;
    }
    succeed(status, error, "memory_map (MAPPABLE_DEVICE_MEMORY is declared)");
    require(mapped != nullptr, "memory_map succeeded with a NULL address");
    Stream stream = device.createStream();
    device.fill(stream, page, 0, 4096, 0x01020304u);
    device.finish(stream);
    require(*static_cast<const uint32_t *>(mapped) == 0x01020304u,
            "a fill is not visible through the mapped address after its event completed");
}

CONFORMANCE_CASE("memory.many_pages_any_order",
                 "hundreds of pages allocate and free in random order") {
    OpenDevice &device = ctx.device();
    std::vector<Page> pages;
    for (int i = 0; i < 300; ++i) pages.push_back(device.allocate(BP_MEMORY_DEVICE, 256 + 64 * (i % 17)));
    std::mt19937 random(12345);
    std::shuffle(pages.begin(), pages.end(), random);
    while (!pages.empty()) pages.pop_back();
    stillAllocates(device, "freeing 300 pages");
}

CONFORMANCE_CASE("memory.concurrent_allocation",
                 "memory_allocate and memory_free run concurrently from many threads") {
    OpenDevice &device = ctx.device();
    std::atomic<int> failures{0};
    std::string first;
    std::mutex mutex;
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
        threads.emplace_back([&, t] {
            for (int i = 0; i < 50; ++i) {
                bp_memory *memory = nullptr;
                void *mapped = nullptr;
                bp_error error = makeError();
                const uint32_t kind = (t % 4 == 3) ? BP_MEMORY_PINNED_HOST : BP_MEMORY_DEVICE;
                const bp_status s = tryAllocate(device, kind, 4096u * (1 + i % 8), &memory, &mapped, error);
                if (s == BP_ERROR_UNSUPPORTED && kind != BP_MEMORY_DEVICE) continue;
                if (s != BP_SUCCESS) {
                    ++failures;
                    const std::lock_guard lock(mutex);
                    if (first.empty()) first = std::string(toString(s)) + ": " + errorMessage(error);
                    continue;
                }
                device.api().memory_free(device.get(), memory);
            }
        });
    for (auto &t : threads) t.join();
    require(failures == 0, std::to_string(failures.load()) +
                               " concurrent allocations failed; first: " + first);
}

} // namespace backplane::conformance
