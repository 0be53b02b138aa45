// MultiStream and SchedulerMultiStream behaviour on fake backends (tests internals:
// backplane_internal_dep). The first four cases port seed 002's unit tests.
#include "stream/multi_stream.hpp"
#include "stream/scheduler_stream.hpp"

#include <doctest/doctest.h>

#include <atomic>
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
        (void)event;
    }
    void releaseEvent(void *event) override { delete static_cast<int *>(event); }

    uintptr_t streams = 0;
    int flushes = 0;
    int waits = 0;
    std::atomic<bool> released{true};
};

BindingUse binding(uint32_t slot, uint64_t cursor = 0) {
    return {slot, cursor, std::make_shared<int>(static_cast<int>(slot))};
}

} // namespace

TEST_CASE("analysis reports a binding of another stream that was never synced") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    ms.resolve(1, {});
    ms.resolve(2, {});
    const std::vector<BindingUse> b = {binding(1), binding(2)};
    const SharedBindingAnalysis analysis = ms.updateSharedBindings(1, b);
    SharedBindingAnalysis expected;
    expected.slices[2].push_back(b[1].hold);
    CHECK(analysis == expected);
}

TEST_CASE("analysis ignores bindings of the current stream among shared ones") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    ms.resolve(1, {});
    ms.resolve(2, {});
    const std::vector<BindingUse> b = {binding(1), binding(2), binding(1)};
    const SharedBindingAnalysis analysis = ms.updateSharedBindings(1, b);
    SharedBindingAnalysis expected;
    expected.slices[2].push_back(b[1].hold);
    CHECK(analysis == expected);
}

TEST_CASE("analysis is empty when every binding belongs to the current stream") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    ms.resolve(1, {});
    ms.resolve(2, {});
    const std::vector<BindingUse> b = {binding(1), binding(1), binding(1)};
    CHECK(ms.updateSharedBindings(1, b).empty());
}

TEST_CASE("resolve records the origin cursor as last synced and advances only its own cursor") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    ms.resolve(1, {});
    ms.resolve(2, {});
    const std::vector<BindingUse> b = {binding(1), binding(2), binding(1)};
    auto resolved = ms.resolve(1, b);
    CHECK(ms.slot(1).lastSynced.at(2) == 1);
    CHECK(ms.slot(1).cursor == 2);
    CHECK(ms.slot(2).lastSynced.empty());
    CHECK(ms.slot(2).cursor == 1);
    ms.finish(resolved);
}

TEST_CASE("a binding already synced creates no event the second time") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    ms.resolve(2, {});
    const std::vector<BindingUse> b = {binding(2, 1)};
    auto first = ms.resolve(1, b);
    ms.finish(first);
    const uint64_t events = ms.eventsCreated();
    auto second = ms.resolve(1, b);
    ms.finish(second);
    CHECK(ms.eventsCreated() == events);
    CHECK(ms.alignmentEvents() == 1); // one origin flush, the first time only
}

TEST_CASE("work that stays on its stream creates no events") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    for (int i = 0; i < 100; ++i) {
        const std::vector<BindingUse> b = {binding(static_cast<uint32_t>(i % 3), 5)};
        auto r = ms.resolve(static_cast<uint32_t>(i % 3), b);
        ms.finish(r);
    }
    CHECK(ms.eventsCreated() == 0);
    CHECK(backend.waits == 0);
}

TEST_CASE("the GC thread keeps cross-stream bindings until their event completed") {
    FakeBackend backend;
    MultiStream ms(backend, kMaxStreams);
    backend.released = false;
    auto hold = std::make_shared<int>(7);
    std::weak_ptr<int> watch = hold;
    {
        std::vector<BindingUse> b = {{2, 1, hold}};
        hold.reset();
        auto r = ms.resolve(1, b);
        b.clear();
        ms.finish(r);
    }
    CHECK_FALSE(watch.expired()); // pending on slot 1 until its next event
    ms.flushWithEvent(1);
    CHECK_FALSE(watch.expired()); // the GC thread waits for that event
    backend.released = true;
    ms.gc().drain();
    CHECK(watch.expired());
    CHECK(ms.gc().released() == 1);
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
