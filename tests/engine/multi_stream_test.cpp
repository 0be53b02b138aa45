// MultiStream and SchedulerMultiStream behaviour on fake backends (tests internals:
// backplane_internal_dep). The first four cases port seed 002's unit tests.
#include "stream/multi_stream.hpp"
#include "stream/scheduler_stream.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <string>
#include <vector>

using namespace backplane::detail;

namespace {

constexpr uint32_t kMaxStreams = 4;

/// Streams and events are counters; events "complete" when the test says so.
class FakeBackend final : public EventBackend {
public:
    void *createStream() override { return reinterpret_cast<void *>(++streams); }
    void destroyStream(void *) override {}
    void *flush(void *) override {
        ++flushes;
        return new int(0);
    }
    void waitEvent(void *, void *) override { ++waits; }
    void waitEventSync(void *event) override {
        while (!released.load()) {
        }
        if (fail.load()) throw std::runtime_error("the fake stream's work failed");
        (void)event;
    }
    bool queryEvent(void *) override {
        if (released.load() && fail.load()) throw std::runtime_error("the fake stream's work failed");
        return released.load();
    }
    bool waitEventFor(void *event, uint64_t) override {
        if (!released.load()) return false;
        waitEventSync(event);
        return true;
    }
    void releaseEvent(void *event) override { delete static_cast<int *>(event); }

    uintptr_t streams = 0;
    int flushes = 0;
    int waits = 0;
    std::atomic<bool> released{true};
    std::atomic<bool> fail{false};
};

/// A MultiStream over a FakeBackend with its completion tracker.
struct Fixture {
    std::shared_ptr<FakeBackend> backend = std::make_shared<FakeBackend>();
    CompletionTracker tracker{kMaxStreams};
    std::vector<std::string> failures;
    MultiStream ms{backend, kMaxStreams, tracker,
                   [this](const std::string &why) { failures.push_back(why); }};
};

StreamUse use(uint32_t slot, uint64_t cursor = 1) { return {slot, cursor}; }

} // namespace

TEST_CASE("analysis reports a use on another stream that was never synced") {
    Fixture f;
    f.ms.resolve(1, {});
    f.ms.resolve(2, {});
    const std::vector<StreamUse> uses = {use(1), use(2)};
    SharedBindingAnalysis expected;
    expected.origins[2] = 1;
    CHECK(f.ms.updateSharedBindings(1, uses) == expected);
}

TEST_CASE("analysis ignores uses of the current stream among shared ones") {
    Fixture f;
    f.ms.resolve(1, {});
    f.ms.resolve(2, {});
    const std::vector<StreamUse> uses = {use(1), use(2), use(1)};
    SharedBindingAnalysis expected;
    expected.origins[2] = 1;
    CHECK(f.ms.updateSharedBindings(1, uses) == expected);
}

TEST_CASE("analysis is empty when every use belongs to the current stream") {
    Fixture f;
    f.ms.resolve(1, {});
    f.ms.resolve(2, {});
    const std::vector<StreamUse> uses = {use(1), use(1), use(1)};
    CHECK(f.ms.updateSharedBindings(1, uses).empty());
}

TEST_CASE("resolve records the origin cursor as last synced and advances only its own cursor") {
    Fixture f;
    f.ms.resolve(1, {});
    f.ms.resolve(2, {});
    const std::vector<StreamUse> uses = {use(1), use(2), use(1)};
    f.ms.resolve(1, uses);
    CHECK(f.ms.slot(1).lastSynced.at(2) == 1);
    CHECK(f.ms.slot(1).cursor == 2);
    CHECK(f.ms.slot(2).lastSynced.empty());
    CHECK(f.ms.slot(2).cursor == 1);
}

TEST_CASE("a use already synced creates no event the second time") {
    Fixture f;
    f.ms.resolve(2, {});
    const std::vector<StreamUse> uses = {use(2, 1)};
    f.ms.resolve(1, uses);
    const uint64_t events = f.ms.eventsCreated();
    f.ms.resolve(1, uses);
    CHECK(f.ms.eventsCreated() == events);
    CHECK(f.ms.alignmentEvents() == 1); // one origin flush, the first time only
}

TEST_CASE("a use known to have completed needs no event") {
    Fixture f;
    f.ms.resolve(2, {});
    f.tracker.complete(2, 1);
    const std::vector<StreamUse> uses = {use(2, 1)};
    f.ms.resolve(1, uses);
    CHECK(f.ms.eventsCreated() == 0);
    CHECK(f.backend->waits == 0);
}

TEST_CASE("a newer use on a stream synced earlier is waited for again") {
    // The recycled-memory hazard: a stream synced with slot 2 at cursor 1 must still wait for
    // slot 2's later work on memory it now reuses.
    Fixture f;
    f.ms.resolve(2, {});
    f.ms.resolve(1, std::vector<StreamUse>{use(2, 1)});
    f.ms.resolve(2, {});
    const int waits = f.backend->waits;
    f.ms.resolve(1, std::vector<StreamUse>{use(2, 2)});
    CHECK(f.backend->waits == waits + 1);
    CHECK(f.ms.slot(1).lastSynced.at(2) == 2);
}

TEST_CASE("work that stays on its stream creates no events") {
    Fixture f;
    for (int i = 0; i < 100; ++i) {
        const auto slot = static_cast<uint32_t>(i % 3);
        const std::vector<StreamUse> uses = {use(slot, 5)};
        f.ms.resolve(slot, uses);
    }
    CHECK(f.ms.eventsCreated() == 0);
    CHECK(f.backend->waits == 0);
}

TEST_CASE("the GC thread keeps holds until their fence completed and records the completion") {
    Fixture f;
    f.backend->released = false;
    f.ms.resolve(1, {});
    auto hold = std::make_shared<int>(7);
    std::weak_ptr<int> watch = hold;
    f.ms.hold(1, hold);
    f.ms.hold(1, hold); // held once
    hold.reset();
    CHECK_FALSE(watch.expired()); // pending on slot 1 until its next fence
    f.ms.flush(1);
    CHECK_FALSE(watch.expired()); // the GC thread waits for that fence
    CHECK(f.tracker.completed(1) == 0);
    f.backend->released = true;
    f.ms.gc().drain();
    CHECK(watch.expired());
    CHECK(f.ms.gc().released() == 1);
    CHECK(f.tracker.completed(1) == 1);
}

TEST_CASE("a slot holds many objects once each and flushes them at the bound") {
    Fixture f;
    f.backend->released = false;
    constexpr size_t kObjects = MultiStream::kMaxPendingHolds + 40;
    std::vector<std::shared_ptr<int>> objects;
    std::vector<std::weak_ptr<int>> watches;
    for (size_t i = 0; i < kObjects; ++i) {
        objects.push_back(std::make_shared<int>(static_cast<int>(i)));
        watches.push_back(objects.back());
    }
    // Each object twice, the second time while it is pending: held once.
    for (size_t i = 0; i < kObjects; ++i) {
        f.ms.hold(1, objects[i]);
        if (i < MultiStream::kMaxPendingHolds) f.ms.hold(1, objects[i / 2]);
    }
    CHECK(f.ms.alignmentEvents() == 1); // one flush at the bound, not more
    objects.clear();
    for (const auto &watch : watches)
        REQUIRE_FALSE(watch.expired()); // held: by the GC (first 257) or pending on slot 1
    f.ms.flush(1);
    f.backend->released = true;
    f.ms.gc().drain();
    for (const auto &watch : watches)
        CHECK(watch.expired());
    CHECK(f.ms.gc().released() == kObjects);
}

TEST_CASE("a failed fence keeps its holds and reports the failure") {
    Fixture f;
    f.backend->fail = true;
    auto hold = std::make_shared<int>(7);
    std::weak_ptr<int> watch = hold;
    f.ms.hold(1, std::move(hold));
    f.ms.flush(1);
    f.ms.gc().drain();
    CHECK_FALSE(watch.expired()); // never released while the device is in doubt
    CHECK(f.ms.gc().released() == 0);
    CHECK(f.failures.size() == 1);
    CHECK(f.tracker.completed(1) == 0);
}

TEST_CASE("the GC queue is bounded: throttle waits until the GC caught up") {
    Fixture f;
    f.backend->released = false;
    for (size_t i = 0; i < GcThread::kMaxQueued + 8; ++i) {
        f.ms.hold(1, std::make_shared<int>(0));
        f.ms.flush(1);
    }
    std::atomic<bool> passed{false};
    std::thread producer([&] {
        f.ms.gc().throttle(1);
        passed = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    CHECK_FALSE(passed.load()); // more than kMaxQueued tasks wait: backpressure
    f.backend->released = true;
    producer.join();
    CHECK(passed.load());
    CHECK(f.ms.gc().queued() <= GcThread::kMaxQueued / 2);
}

TEST_CASE("polling records a completed fence without waiting") {
    Fixture f;
    f.backend->released = false;
    f.ms.resolve(3, {});
    f.ms.fenceCovering(3, 1);
    f.ms.pollCompletion();
    CHECK(f.tracker.completed(3) == 0);
    f.backend->released = true;
    f.ms.pollCompletion();
    CHECK(f.tracker.completed(3) == 1);
}

namespace {

class FakeScheduler final : public SchedulerBackend {
public:
    void *createStream() override { return reinterpret_cast<void *>(++streams); }
    void destroyStream(void *) override {}
    void submit(void *) override { ++submits; }
    uintptr_t streams = 0;
    int submits = 0;
};

} // namespace

TEST_CASE("scheduler streams run a producer's queue before a consumer on another stream") {
    FakeScheduler backend;
    SchedulerMultiStream s(backend, kMaxStreams, 8, backplane::SchedulerMode::Interleave);
    std::vector<std::string> order;
    s.registerTask(1, {[&](void *) { order.push_back("produce"); }, {}}, std::vector<uint32_t>{});
    const std::vector<uint32_t> origins = {1};
    s.registerTask(2, {[&](void *) { order.push_back("consume"); }, {}}, origins);
    CHECK(order == std::vector<std::string>{"produce"});
    s.executeAll();
    CHECK(order == std::vector<std::string>{"produce", "consume"});
}

TEST_CASE("scheduler streams batch up to max tasks before executing") {
    FakeScheduler backend;
    SchedulerMultiStream s(backend, kMaxStreams, 3, backplane::SchedulerMode::Sequential);
    int ran = 0;
    for (int i = 0; i < 2; ++i) s.registerTask(0, {[&](void *) { ++ran; }, {}}, {});
    CHECK(ran == 0);
    s.registerTask(0, {[&](void *) { ++ran; }, {}}, {});
    CHECK(ran == 3);
    CHECK(s.batches() == 1);
}

TEST_CASE("interleave merges queues round robin onto one stream") {
    FakeScheduler backend;
    SchedulerMultiStream s(backend, kMaxStreams, 100, backplane::SchedulerMode::Interleave);
    std::vector<std::pair<int, void *>> runs;
    for (int i = 0; i < 2; ++i) {
        s.registerTask(0, {[&, i](void *st) { runs.push_back({i, st}); }, {}}, {});
        s.registerTask(1, {[&, i](void *st) { runs.push_back({10 + i, st}); }, {}}, {});
    }
    s.executeStreams({0, 1});
    REQUIRE(runs.size() == 4);
    CHECK(runs[0].first == 0);
    CHECK(runs[1].first == 10);
    CHECK(runs[2].first == 1);
    CHECK(runs[3].first == 11);
    for (const auto &r : runs) CHECK(r.second == runs[0].second);
}

namespace {

/// Events complete one by one, when the test says so.
class GatedBackend final : public EventBackend {
public:
    struct Event {
        std::atomic<bool> done{false};
    };
    void *createStream() override { return reinterpret_cast<void *>(++streams); }
    void destroyStream(void *) override {}
    void *flush(void *) override {
        events.push_back(new Event);
        return events.back();
    }
    void waitEvent(void *, void *) override {}
    void waitEventSync(void *event) override {
        while (!static_cast<Event *>(event)->done.load()) std::this_thread::yield();
    }
    bool waitEventFor(void *event, uint64_t) override {
        std::this_thread::sleep_for(std::chrono::microseconds(100));
        return queryEvent(event);
    }
    bool queryEvent(void *event) override { return static_cast<Event *>(event)->done.load(); }
    void releaseEvent(void *event) override { delete static_cast<Event *>(event); }
    uintptr_t streams = 0;
    std::vector<Event *> events; ///< in flush order (the test flips `done`)
};

} // namespace

TEST_CASE("a slow stream does not hold back the GC's releases for another stream") {
    auto backend = std::make_shared<GatedBackend>();
    CompletionTracker tracker(kMaxStreams);
    MultiStream ms(backend, kMaxStreams, tracker, nullptr);
    auto slow = std::make_shared<int>(1);
    auto fast = std::make_shared<int>(2);
    std::weak_ptr<int> slowWatch = slow, fastWatch = fast;
    ms.hold(1, std::move(slow));
    ms.flush(1); // event 0: stays pending
    ms.hold(2, std::move(fast));
    ms.flush(2); // event 1
    backend->events[1]->done = true;
    for (int i = 0; i < 2000 && !fastWatch.expired(); ++i)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    CHECK(fastWatch.expired()); // released although the older task of slot 1 is pending
    CHECK_FALSE(slowWatch.expired());
    CHECK(tracker.completed(2) == 0); // no operation was counted on slot 2's cursor
    // Throttling is per stream: slot 2 has no backlog, so it never waits for slot 1.
    for (size_t i = 0; i < GcThread::kMaxQueued + 4; ++i) {
        ms.hold(1, std::make_shared<int>(0));
        ms.flush(1);
    }
    ms.gc().throttle(2); // returns at once
    for (auto *event : backend->events) event->done = true;
    ms.gc().drain();
    CHECK(slowWatch.expired());
}

TEST_CASE("draining the GC waits for the tasks queued before it, not for later ones") {
    auto backend = std::make_shared<GatedBackend>();
    CompletionTracker tracker(kMaxStreams);
    MultiStream ms(backend, kMaxStreams, tracker, nullptr);
    ms.hold(1, std::make_shared<int>(1));
    ms.flush(1);
    std::atomic<bool> drained{false};
    std::thread drainer([&] {
        ms.gc().drain();
        drained = true;
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    CHECK_FALSE(drained.load());
    // Work queued after the drain began, still pending, must not delay it.
    ms.hold(2, std::make_shared<int>(2));
    ms.flush(2);
    backend->events[0]->done = true;
    drainer.join();
    CHECK(drained.load());
    for (auto *event : backend->events) event->done = true;
}
