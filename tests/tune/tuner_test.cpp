// Tests of the tuner: decisions, persistence across tuners, invalidation, threads, failures.
#include "tune_fixtures.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <stdexcept>
#include <thread>

using namespace backplane;
using namespace tunetest;

TEST_CASE("tuning picks the fastest of candidates with clearly different costs") {
    TempDir dir;
    CacheStore store(dir.path());
    tune::Tuner tuner(tunerOptions(&store));
    SleepSet set = sleepers();

    CHECK(tuner.execute(set, Problem{100}) == "fast");
    CHECK(tuner.counters().tunings == 1);
    CHECK(tuner.counters().benchmarkRuns > 0);

    CHECK(tuner.execute(set, Problem{120}) == "fast"); // same bucket: n=128
    CHECK(tuner.counters().tunings == 1);
    CHECK(tuner.counters().memoryHits == 1);

    const auto record = tuner.lookup(set.info(), "n=128");
    REQUIRE(record);
    CHECK(record->winner == "fast");
    CHECK(record->ranking.front() == "fast");
    CHECK(record->results.size() == 3);
    CHECK(std::filesystem::exists(store.entryPath(CacheKind::Tune,
                                                  tune::Tuner::storeKey("sleepers", "n=128",
                                                                        "test-device",
                                                                        set.info().checksum))));
}

TEST_CASE("the slow candidate is eliminated early") {
    tune::Tuner tuner(tunerOptions(nullptr));
    SleepSet set = sleepers();
    tuner.execute(set, Problem{100});
    const auto record = tuner.lookup(set.info(), "n=128");
    REQUIRE(record);
    for (const auto &r : record->results) {
        if (r.name == "slow") {
            CHECK(r.eliminated);
            CHECK(r.samples == 3);
        }
        if (r.name == "fast") CHECK(!r.eliminated);
    }
}

TEST_CASE("a new tuner on the same cache directory runs no benchmark") {
    TempDir dir;
    SleepSet set = sleepers();
    {
        CacheStore store(dir.path());
        tune::Tuner tuner(tunerOptions(&store));
        CHECK(tuner.execute(set, Problem{100}) == "fast");
    }
    CacheStore store(dir.path());
    tune::Tuner tuner(tunerOptions(&store));
    CHECK(tuner.execute(set, Problem{100}) == "fast");
    CHECK(tuner.counters().tunings == 0);
    CHECK(tuner.counters().benchmarkRuns == 0);
    CHECK(tuner.counters().persistentHits == 1);
}

TEST_CASE("changing the candidate set or the device fingerprint re-tunes") {
    TempDir dir;
    CacheStore store(dir.path());
    auto tunings = [&](const SleepSet &set, const std::string &device) {
        tune::Tuner tuner(tunerOptions(&store, device));
        tuner.execute(set, Problem{100});
        return tuner.counters().tunings;
    };
    const SleepSet base = sleepers();
    CHECK(tunings(base, "dev-a") == 1);
    CHECK(tunings(base, "dev-a") == 0);

    SleepSet extra = sleepers();
    extra.add("extra", [](const Problem &) { return std::string("extra"); });
    CHECK(extra.info().checksum != base.info().checksum);
    CHECK(tunings(extra, "dev-a") == 1);

    SleepSet bumped("sleepers", problemKey);
    bumped.add("slow", [](const Problem &) { sleepMs(6); return std::string("slow"); });
    bumped.add("fast", [](const Problem &) { sleepMs(1); return std::string("fast"); },
               {.version = 2});
    bumped.add("medium", [](const Problem &) { sleepMs(3); return std::string("medium"); });
    CHECK(bumped.info().checksum != base.info().checksum);
    CHECK(tunings(bumped, "dev-a") == 1);

    CHECK(tunings(base, "dev-b") == 1);
    CHECK(tunings(base, "dev-a") == 0); // the old entries are still there
}

TEST_CASE("threads asking for the same key tune it once") {
    tune::Tuner tuner(tunerOptions(nullptr));
    SleepSet set = sleepers();
    std::vector<std::string> results(8);
    std::vector<std::thread> threads;
    for (size_t i = 0; i < results.size(); ++i)
        threads.emplace_back([&, i] { results[i] = tuner.execute(set, Problem{100}); });
    for (auto &t : threads) t.join();
    CHECK(tuner.counters().tunings == 1);
    for (const auto &r : results) CHECK(r == "fast");
}

TEST_CASE("threads asking for a key being tuned run the fallback instead of waiting") {
    tune::Tuner tuner(tunerOptions(nullptr));
    std::atomic<bool> tuning{false};
    std::atomic<bool> release{false};
    SleepSet set("gated", problemKey);
    set.add("gate", [&](const Problem &) {
        tuning = true;
        while (!release) sleepMs(0.2);
        sleepMs(2);
        return std::string("gate");
    });
    set.add("quick", [](const Problem &) { return std::string("quick"); });
    set.fallback("quick");

    std::string first;
    std::thread tuningThread([&] { first = tuner.execute(set, Problem{100}); });
    while (!tuning) sleepMs(0.2);
    CHECK(tuner.execute(set, Problem{100}) == "quick");
    CHECK(tuner.counters().fallbackRuns == 1);
    release = true;
    tuningThread.join();
    CHECK(first == "quick");
    CHECK(tuner.counters().tunings == 1);
}

TEST_CASE("an error lists the reason of every candidate when all fail") {
    tune::Tuner tuner(tunerOptions(nullptr));
    SleepSet set("broken", problemKey);
    set.add("a", [](const Problem &) -> std::string {
        throw Error(ErrorCode::Compile, "syntax error in a.cu:3");
    });
    set.add("b", [](const Problem &) -> std::string { throw std::runtime_error("launch of b"); });
    try {
        tuner.execute(set, Problem{100});
        FAIL("expected an error");
    } catch (const Error &e) {
        const std::string message = e.what();
        CHECK(message.find("broken") != std::string::npos);
        CHECK(message.find("a: syntax error in a.cu:3") != std::string::npos);
        CHECK(message.find("b: launch of b") != std::string::npos);
        CHECK(std::string(toString(e.code())) == "internal"); // the codes differ
    }
}

TEST_CASE("a candidate that throws is skipped with its error recorded") {
    tune::Tuner tuner(tunerOptions(nullptr));
    SleepSet set("partly-broken", problemKey);
    set.add("broken", [](const Problem &) -> std::string {
        throw Error(ErrorCode::Launch, "too many registers");
    });
    set.add("slow", [](const Problem &) { sleepMs(3); return std::string("slow"); });
    set.add("fast", [](const Problem &) { sleepMs(1); return std::string("fast"); });
    CHECK(tuner.execute(set, Problem{100}) == "fast");
    const auto record = tuner.lookup(set.info(), "n=128");
    REQUIRE(record);
    CHECK(!record->results[0].ok);
    CHECK(record->results[0].error == "too many registers");
    CHECK(record->ranking.back() == "broken");
}

TEST_CASE("a cached winner that now fails falls back to the next candidate and is re-tuned") {
    TempDir dir;
    CacheStore store(dir.path());
    tune::Tuner tuner(tunerOptions(&store));
    std::atomic<bool> broken{false};
    SleepSet set("flaky", problemKey);
    set.add("medium", [](const Problem &) { sleepMs(3); return std::string("medium"); });
    set.add("fast", [&](const Problem &) {
        if (broken) throw Error(ErrorCode::Launch, "device lost its mind");
        sleepMs(1);
        return std::string("fast");
    });
    CHECK(tuner.execute(set, Problem{100}) == "fast");
    const std::string storeKey =
        tune::Tuner::storeKey("flaky", "n=128", "test-device", set.info().checksum);
    CHECK(store.load(CacheKind::Tune, storeKey).has_value());

    broken = true;
    CHECK(tuner.execute(set, Problem{100}) == "medium");
    CHECK(tuner.counters().staleWinners == 1);
    CHECK(!store.load(CacheKind::Tune, storeKey).has_value()); // stale: not trusted again

    CHECK(tuner.execute(set, Problem{100}) == "medium");
    CHECK(tuner.counters().tunings == 2);
    const auto record = tuner.lookup(set.info(), "n=128");
    REQUIRE(record);
    CHECK(record->winner == "medium");
}

TEST_CASE("output cross-checks reject a candidate whose output differs") {
    tune::Tuner tuner(tunerOptions(nullptr));
    tune::TunableSet<Problem, int> set("checked", problemKey);
    set.add("reference", [](const Problem &) { sleepMs(3); return 42; });
    set.add("wrong-but-fast", [](const Problem &) { return 41; });
    set.add("right", [](const Problem &) { sleepMs(1); return 42; });
    set.check([](const int &expected, const int &got) {
        return expected == got ? std::string()
                               : "expected " + std::to_string(expected) + ", got " +
                                     std::to_string(got);
    });
    CHECK(tuner.execute(set, Problem{100}) == 42);
    const auto record = tuner.lookup(set.info(), "n=128");
    REQUIRE(record);
    CHECK(record->winner == "right");
    CHECK(!record->results[1].ok);
    CHECK(record->results[1].error == "output differs from 'reference': expected 42, got 41");
}

TEST_CASE("level Off runs the first candidate that works without benchmarking") {
    auto options = tunerOptions(nullptr);
    options.level = TuneLevel::Off;
    options.policy.reset();
    tune::Tuner tuner(options);
    SleepSet set("off", problemKey);
    set.add("broken", [](const Problem &) -> std::string { throw std::runtime_error("no"); });
    set.add("second", [](const Problem &) { return std::string("second"); });
    CHECK(tuner.execute(set, Problem{100}) == "second");
    CHECK(tuner.counters().tunings == 0);
    CHECK(tuner.counters().benchmarkRuns == 0);
}

TEST_CASE("level Minimal tries only the default-priority candidates") {
    auto options = tunerOptions(nullptr);
    options.level = TuneLevel::Minimal;
    options.policy.reset();
    tune::Tuner tuner(options);
    SleepSet set("minimal", problemKey);
    set.add("default-a", [](const Problem &) { sleepMs(2); return std::string("a"); });
    set.add("default-b", [](const Problem &) { sleepMs(1); return std::string("b"); });
    set.add("exotic", [](const Problem &) { return std::string("exotic"); },
            {.defaultPriority = false});
    CHECK(tuner.execute(set, Problem{100}) == "b");
    const auto record = tuner.lookup(set.info(), problemKey(Problem{100}, TuneLevel::Minimal));
    REQUIRE(record);
    CHECK(record->results.size() == 2);
    CHECK(record->ranking.size() == 3); // the untried one still ranks, after the tried ones
}

TEST_CASE("a set with one candidate is not benchmarked") {
    tune::Tuner tuner(tunerOptions(nullptr));
    SleepSet set("single", problemKey);
    set.add("only", [](const Problem &) { return std::string("only"); });
    CHECK(tuner.execute(set, Problem{100}) == "only");
    CHECK(tuner.counters().benchmarkRuns == 0);
}

TEST_CASE("candidate names must be unique and the fallback must exist") {
    SleepSet set("names", problemKey);
    set.add("a", [](const Problem &) { return std::string("a"); });
    CHECK_THROWS_AS(set.add("a", [](const Problem &) { return std::string("a"); }), Error);
    CHECK_THROWS_AS(set.fallback("missing"), Error);
}

TEST_CASE("anchoring rounds sizes up to each level's buckets") {
    using tune::anchor;
    CHECK(anchor(1000, TuneLevel::Balanced) == 1024);
    CHECK(anchor(1024, TuneLevel::Balanced) == 1024);
    CHECK(anchor(1025, TuneLevel::Balanced) == 2048);
    CHECK(anchor(1000, TuneLevel::Minimal) == 1024);
    CHECK(anchor(1100, TuneLevel::Minimal) == 4096);
    CHECK(anchor(700, TuneLevel::Extensive) == 768);
    CHECK(anchor(800, TuneLevel::Extensive) == 1024);
    CHECK(anchor(1000, TuneLevel::Full) == 1000);
    CHECK(anchor(1000, TuneLevel::Balanced, {.exact = true}) == 1000);
    CHECK(anchor(5000, TuneLevel::Balanced, {.min = 1, .max = 4096}) == 4096);
    CHECK(anchor(3, TuneLevel::Balanced, {.min = 16}) == 16);
    CHECK(tune::KeyBuilder(TuneLevel::Balanced).axis("m", 1000).exact("dtype", "f32").str() ==
          "m=1024,dtype=f32");
}

TEST_CASE("tuning records survive a JSON round trip") {
    tune::TuneRecord r;
    r.set = "s";
    r.key = "n=1";
    r.device = "d";
    r.checksum = "c";
    r.level = "balanced";
    r.winner = "x";
    r.ranking = {"x", "y"};
    tune::CandidateResult x;
    x.name = "x";
    x.ok = true;
    x.samples = 3;
    x.min = std::chrono::nanoseconds(5);
    x.median = std::chrono::nanoseconds(7);
    x.score = std::chrono::nanoseconds(6);
    tune::CandidateResult y;
    y.name = "y";
    y.error = "boom";
    r.results = {x, y};
    const auto back = tune::Tuner::fromJson(tune::Tuner::toJson(r), "test");
    CHECK(back.winner == "x");
    CHECK(back.ranking == r.ranking);
    CHECK(back.results[0].median.count() == 7);
    CHECK(back.results[1].error == "boom");
    CHECK_THROWS_AS(tune::Tuner::fromJson("{\"set\": 3}", "test"), Error);
}

TEST_CASE("a stored record naming a candidate the set does not have is ignored and re-tuned") {
    TempDir dir;
    CacheStore store(dir.path());
    SleepSet set = sleepers();
    {
        tune::Tuner tuner(tunerOptions(&store));
        CHECK(tuner.execute(set, Problem{100}) == "fast");
    }
    const std::string id =
        tune::Tuner::storeKey("sleepers", "n=128", "test-device", set.info().checksum);
    const std::string file = store.entryPath(CacheKind::Tune, id).string();
    // Hand-edited (or from an older version): a winner no candidate is called any more, through
    // the store so the entry's checksum is valid. Trusting its order would run "slow" first.
    const auto payload = store.load(CacheKind::Tune, id);
    REQUIRE(payload);
    tune::TuneRecord edited = tune::Tuner::fromJson(
        std::string_view(reinterpret_cast<const char *>(payload->data()), payload->size()), file);
    edited.winner = "turbo";
    edited.ranking = {"turbo", "slow", "fast", "medium"};
    REQUIRE(store.store(CacheKind::Tune, id, tune::Tuner::toJson(edited)));

    LogCapture logs(log::Subsystem::Tune);
    tune::Tuner tuner(tunerOptions(&store));
    CHECK(!tuner.lookup(set.info(), "n=128"));
    CHECK(tuner.execute(set, Problem{100}) == "fast");
    CHECK(tuner.counters().persistentHits == 0);
    CHECK(tuner.counters().tunings == 1);
    const auto messages = logs.messages();
    REQUIRE(!messages.empty());
    CHECK(messages[0].find("'turbo'") != std::string::npos);
    CHECK(messages[0].find(file) != std::string::npos);
    // The re-tuned record replaced the edited one.
    const auto stored = tuner.lookup(set.info(), "n=128");
    REQUIRE(stored);
    CHECK(stored->winner == "fast");
    CacheStore reread(dir.path());
    tune::Tuner next(tunerOptions(&reread));
    CHECK(next.execute(set, Problem{100}) == "fast");
    CHECK(next.counters().persistentHits == 1);
}

TEST_CASE("malformed tuning records are errors naming the record and the field") {
    const std::string head = R"({"set":"s","key":"k","device":"d","checksum":"c","winner":"x",)"
                             R"("ranking":["x"],)";
    const std::string deep = std::string(100000, '[') + std::string(100000, ']');
    const std::pair<std::string, std::string> cases[] = {
        {"", "test-record"},
        {"[1, 2]", "/: expected an object"},
        {R"({"set": 3})", "/set: expected a string"},
        {head + R"("results": [{"name": "x", "ok": true, "samples": 1e300}]})",
         "/results/0/samples: expected an integer"},
        {head + R"("results": [{"name": "x", "ok": true, "samples": -1}]})",
         "/results/0/samples: expected an integer"},
        {head + R"("results": [{"name": "x", "ok": true, "min_ns": 1e999}]})", "/results/0/min_ns"},
        {head + R"("results": [{"name": "x", "ok": "yes"}]})", "/results/0/ok: expected true"},
        {head + R"("results": {"name": "x"}})", "/results: expected an array"},
        {head + R"("results": [7]})", "/results/0: expected an object"},
        {R"({"set":"s","key":"k","device":"d","checksum":"c","winner":"x","ranking":[1]})",
         "/ranking/0: expected a candidate name"},
        {R"({"set":"s","key":"k","device":"d","checksum":"c","winner":"x","ranking":["y"]})",
         "/ranking: must start with the winner"},
        {R"({"set":"s","key":"k","device":"d","checksum":"c","winner":"x"})", "/ranking"},
        {"{\"set\": \"\xff\xfe\"}", "test-record"},
        {head + R"("results": [)" + deep + "]}", "nesting deeper"},
        {head.substr(0, 40), "test-record"},
    };
    for (const auto &[text, expected] : cases) {
        INFO("record: " << text.substr(0, 120));
        std::string message;
        try {
            tune::Tuner::fromJson(text, "test-record");
        } catch (const Error &e) {
            CHECK(std::string(toString(e.code())) == "config");
            message = e.what();
        } catch (const std::exception &e) {
            FAIL("not a backplane::Error: " << e.what());
        }
        CHECK(message.rfind("test-record", 0) == 0);
        CHECK(message.find(expected) != std::string::npos);
    }
}

TEST_CASE("candidate names that are not UTF-8 are stored without an exception escaping") {
    TempDir dir;
    CacheStore store(dir.path());
    tune::Tuner tuner(tunerOptions(&store));
    SleepSet set("latin1", problemKey);
    set.add("caf\xe9-slow", [](const Problem &) {
        sleepMs(3);
        return std::string("slow");
    });
    set.add("caf\xe9-fast", [](const Problem &) {
        sleepMs(1);
        return std::string("fast");
    });
    CHECK(tuner.execute(set, Problem{100}) == "fast");
    CHECK(tuner.counters().tunings == 1);
}
