// Test helper: opens a ComputeClient on the built host plugin with given options (internal API).
#pragma once

#include "client/open_client.hpp"
#include "plugin/device_info.hpp"
#include "plugin/plugin_library.hpp"

#include "../conformance/conformance_kernels.hpp"

#include <backplane/client.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace enginetest {

/// Opens host device `device` (0 unless the options ask for more devices); every call is a
/// separate open(). `options` is the host plugin's options JSON.
inline backplane::ComputeClient openHost(const std::string &options = R"({"mode":"async"})",
                                         backplane::Config config = {}, uint32_t device = 0) {
    auto plugin = backplane::detail::PluginLibrary::open(HOST_PLUGIN_PATH, "host",
                                                         {.cacheDir = "", .optionsJson = options});
    const auto info = backplane::detail::toDeviceInfo("host", device, plugin->deviceInfo(device));
    config.cacheEnabled = false;
    return backplane::detail::openComputeClient(plugin, info, config);
}

// saxpy's host kernel and scalars are the conformance suite's (one definition for all tests).
using conformance::SaxpyScalars;
using conformance::saxpyHost;

/// Set by tests: the gated copy kernel spins until it is true.
inline std::atomic<bool> gateOpen{true};

/// One workgroup of dst[i] = src[i]; bindings src, dst; scalars {uint32 n}.
inline void copyWords(const bp_host_kernel_context *c) {
    const uint32_t n = *static_cast<const uint32_t *>(c->scalars);
    const auto *src = static_cast<const uint32_t *>(c->buffers[0]);
    auto *dst = static_cast<uint32_t *>(c->buffers[1]);
    for (uint32_t t = 0; t < c->block[0]; ++t) {
        const uint32_t i = c->workgroup[0] * c->block[0] + t;
        if (i < n) dst[i] = src[i];
    }
}

/// copyWords after the gate opens.
inline void gatedCopyHost(const bp_host_kernel_context *c) {
    while (!gateOpen.load()) {
    }
    copyWords(c);
}

inline backplane::KernelSource saxpyKernel() {
    return {"saxpy", {backplane::KernelVariant::host(&saxpyHost, "saxpy")}};
}
inline backplane::KernelSource gatedCopyKernel() {
    return {"gated_copy", {backplane::KernelVariant::host(&gatedCopyHost, "gated_copy")}};
}

inline backplane::Dispatch saxpyDispatch(const backplane::Buffer &x, const backplane::Buffer &y,
                                         float a, uint32_t n) {
    backplane::Dispatch d;
    d.block = {256, 1, 1};
    d.grid = {(n + 255) / 256, 1, 1};
    d.bindings = {x, y};
    d.scalar(a).scalar(n);
    return d;
}

// ----- gates and watchdog (tests/engine/safety_test.cpp) -----------------------------------------

/// One hazard window: the kernels of gate N spin until it opens. `skip` abandons the gate: its
/// kernels then return without touching memory (for a test that saw the engine free or reuse
/// what the kernel would write, and for the watchdog). `entered` counts workgroups that reached
/// the gate, so a test can tell that the gated kernel is running.
struct GateState {
    std::atomic<bool> open{true};
    std::atomic<bool> skip{false};
    std::atomic<uint32_t> entered{0};
};

/// Gates that may be closed at once. Each has its own kernel function: the kernel cache keys
/// host kernels by function pointer, so one function cannot serve two gates.
inline constexpr int kGateCount = 4;
inline GateState gateStates[kGateCount];

/// Opens every gate; `skip` abandons them (see GateState).
inline void openAllGates(bool skip) {
    for (GateState &g : gateStates) {
        if (skip && !g.open.load()) g.skip.store(true);
        g.open.store(true);
    }
}

/// Gate N's copy kernel: dst[i] = src[i] once gate N opened; bindings src, dst; scalars {uint32 n}.
template <int N> void gateCopyHost(const bp_host_kernel_context *c) {
    GateState &gate = gateStates[N];
    gate.entered.fetch_add(1);
    while (!gate.open.load())
        std::this_thread::yield();
    if (gate.skip.load()) return;
    copyWords(c);
}

/// Gate N, closed for the object's lifetime unless opened; the destructor abandons it if it is
/// still closed (so an early test exit never leaves a kernel spinning).
template <int N> class Gate {
    static_assert(N >= 0 && N < kGateCount);

public:
    Gate() {
        state().skip.store(false);
        state().entered.store(0);
        state().open.store(false);
    }
    ~Gate() {
        if (!isOpen()) abandon();
    }
    Gate(const Gate &) = delete;
    Gate &operator=(const Gate &) = delete;

    /// Lets the gated kernels run to completion.
    void open() { state().open.store(true); }
    /// Lets the gated kernels return without touching memory.
    void abandon() {
        state().skip.store(true);
        state().open.store(true);
    }
    bool isOpen() const { return state().open.load(); }
    bool abandoned() const { return state().skip.load(); }
    /// Workgroups that reached the gate so far.
    uint32_t entered() const { return state().entered.load(); }

    static backplane::KernelSource kernel() {
        return {"gate_copy_" + std::to_string(N),
                {backplane::KernelVariant::host(&gateCopyHost<N>, "gate_copy")}};
    }
    /// The gated copy of `n` uint32 from `src` to `dst`.
    static backplane::Dispatch copy(const backplane::Buffer &src, const backplane::Buffer &dst,
                                    uint32_t n) {
        backplane::Dispatch d;
        d.block = {256, 1, 1};
        d.grid = {(n + 255) / 256, 1, 1};
        d.bindings = {src, dst};
        d.scalar(n);
        return d;
    }

private:
    static GateState &state() { return gateStates[N]; }
};

/// Turns a hang into a failure: once `limit` passed it abandons every gate (so the gated work
/// ends and whatever waited on it returns) and reports fired(). Helper threads started with
/// spawn() are joined by join() or the destructor, after every gate was abandoned. Declare it
/// after the client and the gates it guards, so it is destroyed first.
class Watchdog {
public:
    explicit Watchdog(std::chrono::milliseconds limit = std::chrono::seconds(10))
        : timer_([this, limit] {
              std::unique_lock lock(mutex_);
              if (!stopped_.wait_for(lock, limit, [this] { return stop_; })) {
                  fired_.store(true);
                  openAllGates(true);
              }
          }) {}
    ~Watchdog() {
        openAllGates(true);
        join();
        {
            std::lock_guard lock(mutex_);
            stop_ = true;
        }
        stopped_.notify_all();
        timer_.join();
    }
    Watchdog(const Watchdog &) = delete;
    Watchdog &operator=(const Watchdog &) = delete;

    /// True once the limit passed (the test then failed: something waited too long).
    bool fired() const { return fired_.load(); }

    /// Runs `body` on a helper thread; returns its index for error().
    size_t spawn(std::function<void()> body) {
        auto error = std::make_shared<std::exception_ptr>();
        errors_.push_back(error);
        helpers_.emplace_back([error, body = std::move(body)] {
            try {
                body();
            } catch (...) {
                *error = std::current_exception();
            }
        });
        return errors_.size() - 1;
    }
    /// Joins every helper thread (open the gates they wait on first).
    void join() {
        for (std::thread &t : helpers_)
            if (t.joinable()) t.join();
    }
    /// What helper `index` threw, or null; valid after join().
    std::exception_ptr error(size_t index) const { return *errors_.at(index); }

    /// Polls `done` until it holds or the watchdog fired; returns done().
    bool waitUntil(const std::function<bool()> &done) const {
        while (!done()) {
            if (fired()) return done();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        return true;
    }

private:
    std::atomic<bool> fired_{false};
    std::mutex mutex_;
    std::condition_variable stopped_;
    bool stop_ = false;
    std::vector<std::shared_ptr<std::exception_ptr>> errors_; ///< one per helper, set by it
    std::vector<std::thread> helpers_;
    std::thread timer_; ///< last: starts after the members above
};

} // namespace enginetest
