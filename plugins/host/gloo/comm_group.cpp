// comm_group of the host plugin: collectives of synchronous streams run together at the group's
// end.
#include "comm_group.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <algorithm>
#include <exception>
#include <system_error>
#include <thread>
#include <vector>

namespace backplane::host {
namespace {

struct DeferredCollective {
    HostStream *stream;
    std::function<void()> task;
};

struct GroupState {
    uint32_t depth = 0;
    std::vector<DeferredCollective> deferred;
};

thread_local GroupState tGroup;

/// Runs collectives of synchronous streams side by side: one thread per stream.
void runDeferred(std::vector<DeferredCollective> deferred) {
    std::vector<HostStream *> streams;
    std::vector<std::vector<size_t>> byStream;
    for (size_t i = 0; i < deferred.size(); ++i) {
        auto at = std::find(streams.begin(), streams.end(), deferred[i].stream);
        if (at == streams.end()) {
            streams.push_back(deferred[i].stream);
            byStream.emplace_back();
            at = streams.end() - 1;
        }
        byStream[static_cast<size_t>(at - streams.begin())].push_back(i);
    }
    std::vector<std::exception_ptr> errors(streams.size());
    auto runStream = [&](size_t s) {
        for (const size_t i : byStream[s]) {
            try {
                streams[s]->submit(std::move(deferred[i].task));
            } catch (...) {
                if (!errors[s]) errors[s] = std::current_exception();
            }
        }
    };
    std::vector<std::thread> threads;
    for (size_t s = 1; s < streams.size(); ++s) {
        try {
            threads.emplace_back(runStream, s);
        } catch (const std::system_error &) { // no thread: run it here (its peers time out)
            runStream(s);
        }
    }
    runStream(0);
    for (std::thread &t : threads)
        t.join();
    for (const std::exception_ptr &e : errors)
        if (e) std::rethrow_exception(e);
}

} // namespace

void beginCommGroup() { ++tGroup.depth; }

void endCommGroup() {
    if (tGroup.depth == 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "comm_group: an end (begin = 0) without a matching begin on this thread");
    if (--tGroup.depth > 0) return;
    std::vector<DeferredCollective> deferred;
    deferred.swap(tGroup.deferred);
    if (deferred.empty()) return;
    // NCCL's group semantics: the collectives of a group run concurrently. A send and the recv
    // it pairs with may sit on one stream (a ring of ranks), and a blocking send would wait
    // forever for the recv queued behind it. So each stream gets ONE task that runs its
    // members side by side (one thread each), on asynchronous and synchronous streams alike.
    std::vector<DeferredCollective> perStream;
    for (DeferredCollective &d : deferred) {
        auto at = std::find_if(perStream.begin(), perStream.end(),
                               [&](const DeferredCollective &p) { return p.stream == d.stream; });
        if (at == perStream.end()) {
            perStream.push_back({d.stream, std::move(d.task)});
            continue;
        }
        at->task = [first = std::move(at->task), next = std::move(d.task)] {
            std::exception_ptr failure;
            std::thread other([&] {
                try {
                    next();
                } catch (...) {
                    failure = std::current_exception();
                }
            });
            try {
                first();
            } catch (...) {
                other.join();
                throw;
            }
            other.join();
            if (failure) std::rethrow_exception(failure);
        };
    }
    runDeferred(std::move(perStream));
}

bool deferToGroup(HostStream &stream, std::function<void()> &task) {
    if (tGroup.depth == 0) return false;
    tGroup.deferred.push_back({&stream, std::move(task)});
    return true;
}

} // namespace backplane::host
