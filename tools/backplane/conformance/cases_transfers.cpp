// Cases over transfers and fills: round trips, offsets, unaligned and zero sizes, ranges past
// the page, overflowing offsets, NULL pointers, stream order.
#include "handles.hpp"

#include <cstring>

namespace backplane::conformance {
namespace {

/// Ranges every transfer must refuse on a page of `size` bytes: past the end, and offsets
/// whose sum with the size overflows 64 bits.
struct BadRange {
    uint64_t offset;
    uint64_t size;
};
std::vector<BadRange> badRanges(uint64_t size) {
    return {{size, 4}, {size - 4, 8}, {0, size + 4}, {UINT64_MAX - 3, 8}, {8, UINT64_MAX - 3}};
}

std::string range(const BadRange &r) {
    return "offset " + std::to_string(r.offset) + ", size " + std::to_string(r.size);
}

/// The page still holds `expected` (a refused transfer wrote nothing).
void unchanged(OpenDevice &d, const Stream &s, const Page &p, const std::vector<uint8_t> &expected,
               const std::string &after) {
    require(d.readAll(s, p) == expected, "the page changed after a refused " + after);
}

} // namespace

CONFORMANCE_CASE("transfer.round_trip",
                 "bytes written with copy_host_to_device read back unchanged with copy_device_to_host") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    for (const size_t size : {size_t{4}, size_t{4096}, size_t{1} << 20, size_t{16} << 20}) {
        const auto data = patternBytes(size, static_cast<uint32_t>(size));
        Page page = device.pageWith(stream, data);
        require(device.readAll(stream, page) == data,
                "a " + std::to_string(size) + "-byte round trip came back different");
    }
}

CONFORMANCE_CASE("transfer.offsets",
                 "copies at offsets touch exactly the bytes they name and no others") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    std::vector<uint8_t> expected = patternBytes(8192, 1);
    Page page = device.pageWith(stream, expected);
    const auto patch = patternBytes(1000, 2);
    device.upload(stream, page, 4097, patch.data(), patch.size());
    std::memcpy(expected.data() + 4097, patch.data(), patch.size());
    require(device.readAll(stream, page) == expected, "an upload at offset 4097 touched other bytes");
    std::vector<uint8_t> part(333);
    device.download(stream, page, 4500, part.data(), part.size());
    device.finish(stream);
    require(std::memcmp(part.data(), expected.data() + 4500, part.size()) == 0,
            "a download at offset 4500 read the wrong bytes");
}

CONFORMANCE_CASE("transfer.unaligned_sizes",
                 "copies of 1, 3, 5 and 4097 bytes at odd offsets are exact") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    std::vector<uint8_t> expected(16384, 0);
    Page page = device.pageWith(stream, expected);
    uint64_t offset = 1;
    std::vector<std::vector<uint8_t>> sources; // valid until the flush's event completed (ABI)
    for (const uint64_t size : {1ull, 3ull, 5ull, 4097ull}) {
        const auto &data = sources.emplace_back(patternBytes(size, static_cast<uint32_t>(size) + 9));
        device.upload(stream, page, offset, data.data(), size);
        std::memcpy(expected.data() + offset, data.data(), size);
        offset += size + 2;
    }
    require(device.readAll(stream, page) == expected, "unaligned uploads wrote the wrong bytes");
    for (const uint64_t at : {1ull, 7ull, 4099ull}) {
        std::vector<uint8_t> back(4097);
        device.download(stream, page, at, back.data(), back.size());
        device.finish(stream);
        require(std::memcmp(back.data(), expected.data() + at, back.size()) == 0,
                "a 4097-byte download at offset " + std::to_string(at) + " read the wrong bytes");
    }
}

CONFORMANCE_CASE("transfer.zero_size",
                 "zero-byte copies and fills succeed and change nothing, even at the end of the page") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const auto data = patternBytes(4096, 4);
    Page page = device.pageWith(stream, data), other = device.pageWith(stream, data);
    uint8_t host[4] = {1, 2, 3, 4};
    for (const uint64_t offset : {0ull, 4096ull}) {
        bp_error error = makeError();
        succeed(device.tryUpload(stream, page, offset, host, 0, error), error,
                "copy_host_to_device of 0 bytes at " + std::to_string(offset));
        error = makeError();
        succeed(device.tryDownload(stream, page, offset, host, 0, error), error,
                "copy_device_to_host of 0 bytes at " + std::to_string(offset));
        error = makeError();
        succeed(device.tryCopy(stream, page, offset, other, offset, 0, error), error,
                "copy_device_to_device of 0 bytes at " + std::to_string(offset));
        error = makeError();
        succeed(device.tryFill(stream, page, offset, 0, 0xffffffffu, error), error,
                "fill of 0 bytes at " + std::to_string(offset));
    }
    require(host[0] == 1 && host[3] == 4, "a 0-byte download wrote host memory");
    unchanged(device, stream, page, data, "sequence of 0-byte transfers");
}

CONFORMANCE_CASE("transfer.out_of_range",
                 "copies past the page or with overflowing offsets fail with invalid_argument and write nothing") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const auto data = patternBytes(4096, 5);
    Page page = device.pageWith(stream, data), other = device.pageWith(stream, data);
    std::vector<uint8_t> host(64, 0);
    for (const BadRange &r : badRanges(4096)) {
        const bool small = r.size <= host.size();
        bp_error error = makeError();
        if (small) {
            expectFailure(device.tryUpload(stream, page, r.offset, host.data(), r.size, error), error,
                          {BP_ERROR_INVALID_ARGUMENT}, "copy_host_to_device(" + range(r) + ")");
            error = makeError();
            expectFailure(device.tryDownload(stream, page, r.offset, host.data(), r.size, error), error,
                          {BP_ERROR_INVALID_ARGUMENT}, "copy_device_to_host(" + range(r) + ")");
            error = makeError();
        }
        expectFailure(device.tryCopy(stream, page, r.offset, other, 0, r.size, error), error,
                      {BP_ERROR_INVALID_ARGUMENT}, "copy_device_to_device(src " + range(r) + ")");
        error = makeError();
        expectFailure(device.tryCopy(stream, page, 0, other, r.offset, r.size, error), error,
                      {BP_ERROR_INVALID_ARGUMENT}, "copy_device_to_device(dst " + range(r) + ")");
    }
    unchanged(device, stream, page, data, "out-of-range copy");
    unchanged(device, stream, other, data, "out-of-range copy");
}

CONFORMANCE_CASE("transfer.null_pointers",
                 "NULL host pointers, pages, args or streams fail with invalid_argument") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, 4096);
    bp_error error = makeError();
    expectFailure(device.tryUpload(stream, page, 0, nullptr, 16, error), error, {BP_ERROR_INVALID_ARGUMENT},
                  "copy_host_to_device(src NULL)");
    error = makeError();
    expectFailure(device.tryDownload(stream, page, 0, nullptr, 16, error), error, {BP_ERROR_INVALID_ARGUMENT},
                  "copy_device_to_host(dst NULL)");
    error = makeError();
    uint8_t host[16] = {};
    expectFailure(device.tryUpload(stream, Page{}, 0, host, 16, error), error, {BP_ERROR_INVALID_ARGUMENT},
                  "copy_host_to_device(dst page NULL)");
    error = makeError();
    expectFailure(device.api().copy_host_to_device(device.get(), stream.get(), nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "copy_host_to_device(args NULL)");
    error = makeError();
    expectFailure(device.api().fill(device.get(), stream.get(), nullptr, &error), error,
                  {BP_ERROR_INVALID_ARGUMENT}, "fill(args NULL)");
    error = makeError();
    expectFailure(device.tryFill(Stream{}, page, 0, 16, 0, error), error, {BP_ERROR_INVALID_ARGUMENT},
                  "fill(stream NULL)");
}

CONFORMANCE_CASE("transfer.device_to_device",
                 "copy_device_to_device copies between pages and within one page at offsets") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const auto a = patternBytes(65536, 21);
    std::vector<uint8_t> b = patternBytes(65536, 22);
    Page pa = device.pageWith(stream, a), pb = device.pageWith(stream, b);
    bp_error error = makeError();
    succeed(device.tryCopy(stream, pa, 100, pb, 3, 30000, error), error, "copy_device_to_device(a+100 -> b+3)");
    std::memcpy(b.data() + 3, a.data() + 100, 30000);
    error = makeError();
    succeed(device.tryCopy(stream, pb, 0, pb, 40000, 20000, error), error,
            "copy_device_to_device within one page (0 -> 40000)");
    std::memcpy(b.data() + 40000, b.data(), 20000);
    require(device.readAll(stream, pb) == b, "device-to-device copies produced the wrong bytes");
    require(device.readAll(stream, pa) == a, "the source page of a device-to-device copy changed");
}

CONFORMANCE_CASE("transfer.stream_order",
                 "upload, fill, copy and download on one stream take effect in the order recorded") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page a = device.allocate(BP_MEMORY_DEVICE, 1 << 20), b = device.allocate(BP_MEMORY_DEVICE, 1 << 20);
    const auto data = patternBytes(1 << 20, 8);
    device.upload(stream, a, 0, data.data(), data.size());
    device.fill(stream, a, 4096, 4096, 0x77777777u);
    bp_error error = makeError();
    succeed(device.tryCopy(stream, a, 0, b, 0, 1 << 20, error), error, "copy_device_to_device");
    device.fill(stream, a, 0, 1 << 20, 0);
    std::vector<uint8_t> back(1 << 20);
    device.download(stream, b, 0, back.data(), back.size());
    device.finish(stream);
    std::vector<uint8_t> expected = data;
    std::memset(expected.data() + 4096, 0x77, 4096);
    require(back == expected, "work on one stream did not take effect in recorded order");
}

CONFORMANCE_CASE("transfer.host_memory_reuse",
                 "after the event of a flush completes, the host buffer of an upload may be reused") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, 1 << 20);
    std::vector<uint8_t> host = patternBytes(1 << 20, 30);
    const std::vector<uint8_t> first = host;
    device.upload(stream, page, 0, host.data(), host.size());
    device.finish(stream);
    std::fill(host.begin(), host.end(), 0xEE);
    require(device.readAll(stream, page) == first,
            "changing the host buffer after the upload's event completed changed the page");
}

CONFORMANCE_CASE("fill.patterns",
                 "fill writes its 4-byte pattern in host byte order over exactly the range") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    std::vector<uint8_t> expected = patternBytes(65536, 40);
    Page page = device.pageWith(stream, expected);
    const std::pair<uint64_t, uint64_t> ranges[] = {{0, 4}, {8, 4088}, {8192, 32768}, {65532, 4}};
    uint32_t pattern = 0x11223344u;
    for (const auto &[offset, size] : ranges) {
        device.fill(stream, page, offset, size, pattern);
        for (uint64_t i = 0; i < size; i += 4) std::memcpy(expected.data() + offset + i, &pattern, 4);
        pattern = pattern * 2654435761u + 1;
    }
    require(device.readAll(stream, page) == expected, "fills wrote the wrong bytes or outside their range");
}

CONFORMANCE_CASE("fill.unaligned_rejected",
                 "fills at offsets or of sizes that are not multiples of 4 fail with invalid_argument") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const auto data = patternBytes(4096, 41);
    Page page = device.pageWith(stream, data);
    for (const auto &[offset, size] : {std::pair<uint64_t, uint64_t>{2, 8}, {0, 6}, {1, 1}}) {
        bp_error error = makeError();
        expectFailure(device.tryFill(stream, page, offset, size, 0, error), error,
                      {BP_ERROR_INVALID_ARGUMENT},
                      "fill(offset " + std::to_string(offset) + ", size " + std::to_string(size) + ")");
    }
    unchanged(device, stream, page, data, "unaligned fill");
}

CONFORMANCE_CASE("fill.out_of_range",
                 "fills past the page or with overflowing offsets fail with invalid_argument and write nothing") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const auto data = patternBytes(4096, 42);
    Page page = device.pageWith(stream, data);
    for (const BadRange &r : badRanges(4096)) {
        bp_error error = makeError();
        expectFailure(device.tryFill(stream, page, r.offset & ~3ull, r.size & ~3ull, 0, error), error,
                      {BP_ERROR_INVALID_ARGUMENT}, "fill(" + range(r) + ")");
    }
    unchanged(device, stream, page, data, "out-of-range fill");
}

CONFORMANCE_CASE("transfer.large",
                 "a 256 MiB page (or max_allocation_bytes if smaller) round-trips") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const uint64_t size = std::min<uint64_t>(256ull << 20, ctx.info().max_allocation_bytes) & ~4095ull;
    const auto data = patternBytes(size, 50);
    Page page = device.pageWith(stream, data);
    require(device.readAll(stream, page) == data, "a " + std::to_string(size) + "-byte round trip differed");
}

CONFORMANCE_CASE("peer.copy",
                 "copy_peer copies from another device of the plugin when PEER_COPY is declared, else fails cleanly") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const bool declared = ctx.declares(BP_CAPABILITY_PEER_COPY);
    if (!ctx.raw().has(&bp_plugin_api::copy_peer)) {
        require(!declared, "PEER_COPY is declared but copy_peer is NULL");
        return;
    }
    if (ctx.deviceCount() < 2) {
        if (declared) throw NotApplicable("PEER_COPY is declared but the plugin sees one device");
        // Undeclared: a copy_peer call must fail cleanly (the source is this same device).
        Page a = device.allocate(BP_MEMORY_DEVICE, 4096), b = device.allocate(BP_MEMORY_DEVICE, 4096);
        auto args = abi::make<bp_copy_device_to_device_args>();
        args.src = a.get();
        args.dst = b.get();
        args.size = 4096;
        bp_error error = makeError();
        const bp_status status = device.api().copy_peer(device.get(), stream.get(), device.get(), &args, &error);
        if (status != BP_SUCCESS)
            expectFailure(status, error, {BP_ERROR_UNSUPPORTED, BP_ERROR_INVALID_ARGUMENT},
                          "copy_peer without PEER_COPY");
        return;
    }
    auto openArgs = abi::make<bp_device_open_args>();
    const uint32_t otherIndex = ctx.index() == 0 ? 1 : 0;
    bp_device *other = nullptr;
    bp_error error = makeError();
    succeed(device.api().device_open(ctx.plugin(), otherIndex, &openArgs, &other, &error), error,
            "device_open(" + std::to_string(otherIndex) + ")");
    struct Close {
        const bp_plugin_api &api;
        bp_device *d;
        ~Close() { api.device_close(d); }
    } close{device.api(), other};
    auto alloc = abi::make<bp_memory_allocate_args>();
    alloc.kind = BP_MEMORY_DEVICE;
    alloc.size = 65536;
    bp_memory *srcMemory = nullptr;
    void *mapped = nullptr;
    error = makeError();
    succeed(device.api().memory_allocate(other, &alloc, &srcMemory, &mapped, &error), error,
            "memory_allocate on the peer");
    Page src{Owned<bp_memory>(device.api(), other, srcMemory), mapped, 65536};
    auto streamArgs = abi::make<bp_stream_create_args>();
    bp_stream *peerStreamRaw = nullptr;
    error = makeError();
    succeed(device.api().stream_create(other, &streamArgs, &peerStreamRaw, &error), error,
            "stream_create on the peer");
    Stream peerStream(device.api(), other, peerStreamRaw);
    const auto data = patternBytes(65536, 60);
    error = makeError();
    auto upload = abi::make<bp_copy_host_to_device_args>();
    upload.src = data.data();
    upload.dst = src.get();
    upload.size = data.size();
    succeed(device.api().copy_host_to_device(other, peerStream.get(), &upload, &error), error,
            "upload on the peer"); // the peer's device, stream and page
    bp_event *ready = nullptr;
    error = makeError();
    succeed(device.api().stream_flush(other, peerStream.get(), nullptr, &ready, &error), error,
            "flush on the peer");
    Event readyOwned(device.api(), other, ready);
    error = makeError();
    succeed(device.api().event_wait(other, ready, UINT64_MAX, &error), error, "wait on the peer");
    Page dst = device.allocate(BP_MEMORY_DEVICE, 65536);
    auto args = abi::make<bp_copy_device_to_device_args>();
    args.src = src.get();
    args.dst = dst.get();
    args.size = 65536;
    error = makeError();
    const bp_status status = device.api().copy_peer(device.get(), stream.get(), other, &args, &error);
    if (!declared) {
        if (status != BP_SUCCESS)
            expectFailure(status, error, {BP_ERROR_UNSUPPORTED, BP_ERROR_INVALID_ARGUMENT},
                          "copy_peer without PEER_COPY");
        device.finish(stream);
        return;
    }
    succeed(status, error, "copy_peer");
    require(device.readAll(stream, dst) == data, "copy_peer delivered the wrong bytes");
}

} // namespace backplane::conformance
