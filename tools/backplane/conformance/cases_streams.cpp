// Cases over streams and events: flush, host waits and queries, device-side waits across
// streams, timestamps, events that outlive their stream, release in any order, threads.
#include "handles.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <thread>

namespace backplane::conformance {
namespace {

/// A copy big enough that an asynchronous device is likely still busy right after the flush.
constexpr uint64_t kBusyBytes = 64ull << 20;

uint64_t busyBytes(const CaseContext &ctx) {
    return std::min<uint64_t>(kBusyBytes, ctx.info().max_allocation_bytes);
}

} // namespace

CONFORMANCE_CASE("stream.create_destroy",
                 "streams up to max_streams (at most 16) are created, each flushes, and all are destroyed") {
    OpenDevice &device = ctx.device();
    std::vector<Stream> streams;
    const uint32_t count = std::min<uint32_t>(ctx.info().max_streams, 16);
    for (uint32_t i = 0; i < count; ++i) streams.push_back(device.createStream());
    for (const Stream &s : streams) device.finish(s);
}

CONFORMANCE_CASE("stream.flush_without_event",
                 "stream_flush with a NULL event pointer submits the work without returning an event") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, 4096);
    device.fill(stream, page, 0, 4096, 0x5a5a5a5au);
    auto args = abi::make<bp_flush_args>();
    bp_error error = makeError();
    succeed(device.api().stream_flush(device.get(), stream.get(), &args, nullptr, &error), error,
            "stream_flush(out NULL)");
    const auto bytes = device.readAll(stream, page);
    require(bytes[0] == 0x5a && bytes[4095] == 0x5a, "work flushed without an event did not run");
}

CONFORMANCE_CASE("stream.null_flush_args",
                 "stream_flush with NULL args behaves as flags 0 or fails with invalid_argument") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    bp_event *event = nullptr;
    bp_error error = makeError();
    const bp_status status = device.api().stream_flush(device.get(), stream.get(), nullptr, &event, &error);
    if (status != BP_SUCCESS) {
        expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT}, "stream_flush(args NULL)");
        return;
    }
    Event owned(device.api(), device.get(), event);
    require(event != nullptr, "stream_flush(args NULL) succeeded without an event");
    device.wait(owned);
}

CONFORMANCE_CASE("stream.destroy_waits",
                 "stream_destroy waits for flushed work: a download's bytes are there after it returns") {
    OpenDevice &device = ctx.device();
    const auto data = patternBytes(busyBytes(ctx), 3);
    std::vector<uint8_t> back(data.size()); // outlives the stream: a download may be pending
    Stream stream = device.createStream();
    Page page = device.pageWith(stream, data);
    device.download(stream, page, 0, back.data(), back.size());
    bp_error error = makeError();
    succeed(device.api().stream_flush(device.get(), stream.get(), nullptr, nullptr, &error), error,
            "stream_flush");
    stream.reset();
    require(back == data, "bytes of a download flushed before stream_destroy were not all there "
                          "when it returned");
}

CONFORMANCE_CASE("event.outlives_stream",
                 "an event flushed from a stream stays valid after the stream is destroyed") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, 4096);
    device.fill(stream, page, 0, 4096, 1);
    Event event = device.flush(stream);
    stream.reset();
    device.wait(event);
    bp_error error = makeError();
    succeed(device.api().event_query(device.get(), event.get(), &error), error,
            "event_query after the stream was destroyed");
}

CONFORMANCE_CASE("event.query_and_wait",
                 "event_query never blocks and ends in success; event_wait with timeout 0 answers success or timeout") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, busyBytes(ctx));
    device.fill(stream, page, 0, page.size, 7);
    Event event = device.flush(stream);
    // Neither call may wait for the work: each must answer well within the time the work takes.
    const auto quick = [&](const char *what, auto call) {
        const auto t0 = std::chrono::steady_clock::now();
        const bp_status status = call();
        const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                            std::chrono::steady_clock::now() - t0).count();
        require(ms < 500, std::string(what) + " took " + std::to_string(ms) +
                              " ms: it must answer at once, not wait for the work");
        return status;
    };
    bp_error error = makeError();
    const bp_status first = quick("event_query of pending work", [&] {
        return device.api().event_query(device.get(), event.get(), &error);
    });
    if (first != BP_SUCCESS) expectFailure(first, error, {BP_ERROR_NOT_READY}, "event_query of pending work");
    error = makeError();
    const bp_status zero = quick("event_wait(timeout 0) of pending work", [&] {
        return device.api().event_wait(device.get(), event.get(), 0, &error);
    });
    if (zero != BP_SUCCESS) expectFailure(zero, error, {BP_ERROR_TIMEOUT}, "event_wait(timeout 0) of pending work");
    device.wait(event);
    for (int i = 0; i < 3; ++i) {
        error = makeError();
        succeed(device.api().event_query(device.get(), event.get(), &error), error,
                "event_query after event_wait returned");
        error = makeError();
        succeed(device.api().event_wait(device.get(), event.get(), 0, &error), error,
                "event_wait(timeout 0) of a completed event");
    }
}

CONFORMANCE_CASE("event.empty_stream",
                 "an event flushed from a stream with no work completes") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    for (int i = 0; i < 3; ++i) device.wait(device.flush(stream));
}

CONFORMANCE_CASE("event.completion_means_done",
                 "when event_wait returns, every transfer recorded before the flush has landed in host memory") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    const auto data = patternBytes(busyBytes(ctx), 11);
    Page page = device.pageWith(stream, data);
    for (int round = 0; round < 3; ++round) {
        std::vector<uint8_t> back(data.size(), 0);
        device.download(stream, page, 0, back.data(), back.size());
        device.wait(device.flush(stream));
        require(back == data, "a download was incomplete when its event completed (round " +
                                  std::to_string(round) + ")");
    }
}

CONFORMANCE_CASE("event.cross_stream_wait",
                 "stream_wait_event orders a second stream after work of the first") {
    OpenDevice &device = ctx.device();
    Stream producer = device.createStream(), consumer = device.createStream();
    const uint64_t size = busyBytes(ctx);
    Page a = device.allocate(BP_MEMORY_DEVICE, size), b = device.allocate(BP_MEMORY_DEVICE, size);
    device.fill(producer, b, 0, size, 0);
    device.finish(producer);
    for (uint32_t round = 1; round <= 3; ++round) {
        device.fill(producer, a, 0, size, 0x01010101u * round);
        Event ready = device.flush(producer);
        bp_error error = makeError();
        succeed(device.api().stream_wait_event(device.get(), consumer.get(), ready.get(), &error),
                error, "stream_wait_event");
        auto copy = abi::make<bp_copy_device_to_device_args>();
        copy.src = a.get();
        copy.dst = b.get();
        copy.size = size;
        error = makeError();
        succeed(device.api().copy_device_to_device(device.get(), consumer.get(), &copy, &error),
                error, "copy_device_to_device");
        ready.reset(); // the caller may release the event right after the wait is recorded
        const auto bytes = device.readAll(consumer, b);
        require(bytes.front() == round && bytes[size / 2] == round && bytes.back() == round,
                "the consumer stream copied before the producer's fill completed (round " +
                    std::to_string(round) + ")");
    }
}

CONFORMANCE_CASE("event.release_pending",
                 "an event released before its work completes does not cancel or break the work") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, busyBytes(ctx));
    device.fill(stream, page, 0, page.size, 0x09090909u);
    device.flush(stream).reset();
    const auto bytes = device.readAll(stream, page);
    require(bytes.front() == 9 && bytes.back() == 9, "work whose event was released early did not run");
}

CONFORMANCE_CASE("event.many_waiters",
                 "event_wait and event_query of one event run from many threads at once") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, busyBytes(ctx));
    device.fill(stream, page, 0, page.size, 3);
    Event event = device.flush(stream);
    std::atomic<int> wrong{0};
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t)
        threads.emplace_back([&, t] {
            bp_error error = makeError();
            if (t % 2 == 0) {
                if (device.api().event_wait(device.get(), event.get(), UINT64_MAX, &error) != BP_SUCCESS)
                    ++wrong;
                return;
            }
            for (;;) {
                const bp_status s = device.api().event_query(device.get(), event.get(), &error);
                if (s == BP_SUCCESS) return;
                if (s != BP_ERROR_NOT_READY) {
                    ++wrong;
                    return;
                }
                std::this_thread::yield();
            }
        });
    for (auto &t : threads) t.join();
    require(wrong == 0, std::to_string(wrong.load()) + " of 8 concurrent waiters/queriers failed");
}

CONFORMANCE_CASE("event.timestamps",
                 "timing events give elapsed nanoseconds when TIMESTAMPS is declared, else fail cleanly") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Page page = device.allocate(BP_MEMORY_DEVICE, busyBytes(ctx));
    auto args = abi::make<bp_flush_args>();
    args.flags = BP_FLUSH_TIMING_EVENT;
    bp_event *raw = nullptr;
    bp_error error = makeError();
    const bp_status startStatus = device.api().stream_flush(device.get(), stream.get(), &args, &raw, &error);
    if (!ctx.declares(BP_CAPABILITY_TIMESTAMPS)) {
        Event start(device.api(), device.get(), raw);
        if (startStatus != BP_SUCCESS) {
            expectFailure(startStatus, error, {BP_ERROR_UNSUPPORTED}, "a timing flush without TIMESTAMPS");
            return;
        }
        Event end = device.flush(stream, BP_FLUSH_TIMING_EVENT);
        device.wait(end);
        uint64_t ns = 0;
        error = makeError();
        expectFailure(device.api().event_elapsed_ns(device.get(), start.get(), end.get(), &ns, &error),
                      error, {BP_ERROR_UNSUPPORTED}, "event_elapsed_ns without TIMESTAMPS");
        return;
    }
    succeed(startStatus, error, "stream_flush(BP_FLUSH_TIMING_EVENT)");
    Event start(device.api(), device.get(), raw);
    device.fill(stream, page, 0, page.size, 1);
    Event end = device.flush(stream, BP_FLUSH_TIMING_EVENT);
    device.wait(end);
    device.wait(start);
    uint64_t ns = 0;
    error = makeError();
    succeed(device.api().event_elapsed_ns(device.get(), start.get(), end.get(), &ns, &error), error,
            "event_elapsed_ns(start, end)");
    require(ns < 60ull * 1000 * 1000 * 1000, "a " + std::to_string(page.size) + "-byte fill took " +
                                                 std::to_string(ns) + " ns by the timestamps");
    error = makeError();
    expectFailure(device.api().event_elapsed_ns(device.get(), start.get(), end.get(), nullptr, &error),
                  error, {BP_ERROR_INVALID_ARGUMENT}, "event_elapsed_ns(out NULL)");
}

CONFORMANCE_CASE("event.untimed_elapsed",
                 "event_elapsed_ns of events flushed without BP_FLUSH_TIMING_EVENT fails cleanly or answers") {
    OpenDevice &device = ctx.device();
    Stream stream = device.createStream();
    Event start = device.flush(stream), end = device.flush(stream);
    device.wait(end);
    device.wait(start);
    uint64_t ns = 0;
    bp_error error = makeError();
    const bp_status status = device.api().event_elapsed_ns(device.get(), start.get(), end.get(), &ns, &error);
    if (status != BP_SUCCESS)
        expectFailure(status, error, {BP_ERROR_INVALID_ARGUMENT, BP_ERROR_UNSUPPORTED},
                      "event_elapsed_ns of untimed events");
}

CONFORMANCE_CASE("release.any_order",
                 "pages, events, kernels and streams are released in any order before device_close") {
    OpenDevice &device = ctx.device();
    Stream a = device.createStream(), b = device.createStream();
    Page p = device.allocate(BP_MEMORY_DEVICE, 1 << 16);
    device.fill(a, p, 0, p.size, 5);
    Event e1 = device.flush(a);
    device.fill(b, p, 0, 4096, 6);
    Event e2 = device.flush(b);
    Kernel k;
    try {
        k = device.saxpy();
    } catch (const NotApplicable &) {
    }
    device.wait(e1);
    device.wait(e2);
    a.reset();   // stream before its event
    k.reset();   // kernel before the pages
    e2.reset();
    p.memory.reset(); // page after streams
    b.reset();
    e1.reset();  // event last, after its stream
    ctx.closeDevice();
}

CONFORMANCE_CASE("threads.streams_in_parallel",
                 "transfers on different streams from different threads at once all land correctly") {
    OpenDevice &device = ctx.device();
    std::atomic<int> wrong{0};
    std::string first;
    std::mutex mutex;
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t)
        threads.emplace_back([&, t] {
            try {
                Stream stream = device.createStream();
                for (int round = 0; round < 10; ++round) {
                    const auto data = patternBytes(4096u * (1 + (t + round) % 16), t * 100 + round);
                    Page page = device.pageWith(stream, data);
                    if (device.readAll(stream, page) != data) ++wrong;
                }
            } catch (const std::exception &e) {
                ++wrong;
                const std::lock_guard lock(mutex);
                if (first.empty()) first = e.what();
            }
        });
    for (auto &t : threads) t.join();
    require(wrong == 0, std::to_string(wrong.load()) + " of 60 round trips on 6 parallel streams "
                        "were wrong" + (first.empty() ? "" : "; first error: " + first));
}

} // namespace backplane::conformance
