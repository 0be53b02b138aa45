// ComputeServer: one opened device — pools, stream alignment, staging, kernels, profiling.
#pragma once

#include "memory/memory_pool.hpp"
#include "memory/slice.hpp"
#include "memory/staging_pool.hpp"
#include "device/driver.hpp"
#include "server/kernel_registry.hpp"
#include "stream/hazards.hpp"
#include "stream/multi_stream.hpp"
#include "stream/scheduler_stream.hpp"
#include "trace/trace_recorder.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>

#include <boost/container/small_vector.hpp>

#include <atomic>
#include <chrono>
#include <map>
#include <thread>
#include <memory>
#include <optional>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace backplane::detail {

struct RecordingBuilder;
struct RecordingState;
struct RecordedOp;
struct RecordingVersion;

/// The plugin's streams and events, as MultiStream and SchedulerMultiStream want them. Shared by
/// every event it made, so an event (in a ReadFuture, say) may outlive the server.
class PluginStreams final : public EventBackend, public SchedulerBackend {
public:
    explicit PluginStreams(std::shared_ptr<Driver> driver) : driver_(std::move(driver)) {}
    void *createStream() override { return driver_->createStream().release(); }
    void destroyStream(void *stream) override {
        releaseStream(*driver_, static_cast<bp_stream *>(stream));
    }
    void *flush(void *stream) override {
        return driver_->flush(static_cast<bp_stream *>(stream), true).release();
    }
    void waitEvent(void *stream, void *event) override {
        driver_->waitEvent(static_cast<bp_stream *>(stream), static_cast<bp_event *>(event));
    }
    void waitEventSync(void *event) override { driver_->eventWait(static_cast<bp_event *>(event)); }
    bool waitEventFor(void *event, uint64_t timeoutNs) override {
        return driver_->eventWaitFor(static_cast<bp_event *>(event), timeoutNs);
    }
    bool queryEvent(void *event) override {
        return driver_->eventQuery(static_cast<bp_event *>(event));
    }
    void releaseEvent(void *event) override {
        detail::releaseEvent(*driver_, static_cast<bp_event *>(event));
    }
    void submit(void *stream) override { driver_->flush(static_cast<bp_stream *>(stream), false); }

private:
    std::shared_ptr<Driver> driver_;
};

/// Error(InvalidArgument) unless [offset, offset + size) lies inside `buffer` (a view: inside the
/// view); offsets are the caller's, counted from the buffer's start.
void checkBufferRange(const Buffer &buffer, uint64_t offset, uint64_t size, const char *what);

/// The time of day now, "20:31:02 UTC" (failure messages).
std::string utcTimeOfDay();

/// The first poisoned range among `read` (a failed operation was to write it); none (a null
/// `why`) in one atomic load per range while nothing is poisoned.
inline Poison::Hit firstPoisoned(std::span<const SliceRange> read) {
    for (const SliceRange &r : read)
        if (r.slice->poison.any())
            if (Poison::Hit hit = r.slice->poison.find(r.begin, r.end); hit.why) return hit;
    return {};
}
/// An operation named `what` that would read the poisoned `hit` is not issued: what it was to
/// write takes the same poison (the failure spreads to the work that depends on it, named by
/// its first cause), and Error(Poisoned) says why.
[[noreturn]] void refuseDependent(const Poison::Hit &hit, std::span<const SliceRange> written,
                                  const std::string &what);
/// Error(Poisoned) for a call named `what` reading [begin, end) of `slice` when that is poisoned.
inline void refusePoisoned(Slice &slice, uint64_t begin, uint64_t end, const char *what) {
    const SliceRange read[] = {{&slice, begin, end}};
    if (const Poison::Hit hit = firstPoisoned(read); hit.why) refuseDependent(hit, {}, what);
}

/// The device limits a plugin checks at launch (block and grid sizes, threads per block,
/// bindings, scalar bytes, dynamic shared memory), checked by the core before a launch is issued
/// or recorded: a caller's error fails as Error(Launch) naming the kernel and the limit, never
/// in the plugin (where a refused launch could look like a bad binary). Size limits a plugin
/// did not report (0) are not checked; a dynamic shared memory limit of 0 means none. `recorded`
/// also refuses a block dimension of 0 (a recording must fail at the recorded call, not at a
/// replay; an unrecorded launch with a zero dimension is a no-op).
void checkLaunchLimits(const DeviceInfo &d, const std::string &kernelName,
                       const Dispatch &dispatch, bool recorded);

/// The server of one opened device. Thread-safe. Locking (docs/streams.md, "Locks"):
/// - the engine lock `mutex_` guards the pools, the stream state and slices' hazards; under it
///   the server only does bookkeeping and enqueues work on plugin streams — it never waits for
///   an event, compiles, does disk I/O or copies host memory;
/// - the kernel registry and the staging pool have their own locks;
/// - event waits (sync, reads, staging reuse, the out-of-memory path) run with no lock held.
/// Frees arrive through a FreeQueue so dropping a Buffer never takes the lock. Stream ids are
/// the callers' (ComputeClient passes the thread's current one).
class ComputeServer : public std::enable_shared_from_this<ComputeServer> {
public:
    ComputeServer(std::shared_ptr<Driver> driver, const Config &config);
    ~ComputeServer();
    ComputeServer(const ComputeServer &) = delete;
    ComputeServer &operator=(const ComputeServer &) = delete;

    const DeviceInfo &info() const noexcept { return driver_->info(); }
    const Driver &driver() const noexcept { return *driver_; }
    Driver &driver() noexcept { return *driver_; }
    bool asyncStreams() const noexcept { return multi_ != nullptr; }
    const PoolLayout &poolLayout() const noexcept { return layout_; }
    /// This device's process id in traces (its open number).
    uint32_t tracePid() const noexcept { return static_cast<uint32_t>(openNumber_); }

    Buffer create(StreamId stream, const void *data, uint64_t size);
    Buffer empty(StreamId stream, uint64_t size);
    Tensor emptyTensor(StreamId stream, std::span<const uint64_t> shape, uint64_t elementSize,
                       TensorLayout layout);
    void setAllocationMode(AllocationMode mode);
    MemoryUsage memoryUsage();
    void memoryCleanup();
    PinnedBuffer allocatePinned(size_t size);
    /// ComputeClient::registerHost (transfers.cpp).
    PinnedBuffer registerHost(void *data, size_t size);

    // Transfers take (buffer, offset, host side, size), as ComputeClient's do.
    void write(StreamId stream, const Buffer &buffer, uint64_t offset, const void *data,
               uint64_t size);
    void write(StreamId stream, const Buffer &buffer, uint64_t offset, const PinnedBuffer &data,
               uint64_t size);
    /// `poisonChecked`: the caller checked the bytes it returns for poison (readTensor).
    ReadFuture read(StreamId stream, const Buffer &buffer, uint64_t offset, uint64_t size,
                    bool poisonChecked = false);
    void readInto(StreamId stream, const Buffer &buffer, uint64_t offset, void *into,
                  uint64_t size);
    void readInto(StreamId stream, const Buffer &buffer, uint64_t offset, const PinnedBuffer &into,
                  uint64_t size);
    void copy(StreamId stream, const Buffer &src, uint64_t srcOffset, const Buffer &dst,
              uint64_t dstOffset, uint64_t size);
    void fill(StreamId stream, const Buffer &buffer, uint32_t pattern, uint64_t offset,
              uint64_t size);
    /// A tensor of any strides as packed row-major bytes, and back (tensor_transfers.cpp).
    ReadFuture readTensor(StreamId stream, const Tensor &tensor);
    void writeTensor(StreamId stream, const Tensor &tensor, const void *data, uint64_t size);
    /// Records one collective of `comm` (its send/recv fields filled from the buffers, either
    /// may be null), ordered like a launch on them. `sendBytes` / `recvBytes` must fit the
    /// buffers (Error(InvalidArgument) naming `what`).
    void collective(StreamId stream, bp_comm *comm, bp_collective_args args, const Buffer *send,
                    uint64_t sendBytes, const Buffer *recv, uint64_t recvBytes,
                    const std::string &what);
    /// collective()'s checks alone (the buffers are this server's and large enough), so that a
    /// group of several ranks is refused before any of it is recorded.
    void checkCollective(const Buffer *send, uint64_t sendBytes, const Buffer *recv,
                         uint64_t recvBytes, const std::string &what) const;
    /// Copies into a buffer of another server (device_copy.cpp); see ComputeClient::copy.
    void copyToDevice(StreamId stream, const Buffer &src, uint64_t srcOffset, ComputeServer &dst,
                      StreamId dstStream, const Buffer &dstBuffer, uint64_t dstOffset,
                      uint64_t size);

    void execute(StreamId stream, const KernelSource &kernel, const Dispatch &dispatch);
    void prepare(const KernelSource &kernel);

    // recorded sequences (recording.cpp)
    void beginRecording(StreamId stream);
    Recording endRecording(StreamId stream);
    bool recording(StreamId stream);
    /// Error(InvalidArgument) when the calling thread records on `stream`: `what` cannot be part
    /// of a recording (also for the Communicator, which checks every rank before issuing).
    void refuseWhileRecording(StreamId stream, const char *what) {
        if (recordings_.load(std::memory_order_acquire) != 0) refuseRecorded(stream, what);
    }
    void replay(StreamId stream, const Recording &recording);
    /// Drops the open recording of `thread` on `stream`, if any (its thread ended).
    void discardRecording(std::thread::id thread, StreamId stream);
    /// Recording::update; `kernelName`, when given, must be the recorded launch's kernel.
    void updateRecording(RecordingState &state, size_t launch, const Dispatch &dispatch,
                         const std::string *kernelName = nullptr);

    void flush(StreamId stream);
    void sync(StreamId stream);
    /// The server that calls should go to: this one, or after an automatic reopen
    /// (devices.reopen_after_fault) the newest open of the device. One load while not lost.
    ComputeServer &current() {
        if (!lost_.load(std::memory_order_acquire) && !driver_->lost()) return *this;
        return reopened();
    }
    /// The newest open reached by reopens already made (never starts one): for accessors and
    /// for close().
    ComputeServer &followed();
    /// current() of `server`, as the shared pointer (the communicator keeps its servers);
    /// `reopen` false: only follows reopens already made (close() must not reopen).
    static std::shared_ptr<ComputeServer> newest(std::shared_ptr<ComputeServer> server,
                                                 bool reopen = true);

    void syncAll();
    /// ComputeClient::syncAll: refuses a closed or lost client first (syncAll itself also
    /// serves teardown, which must wait on a lost device too).
    void syncAllChecked();
    /// ComputeClient::close(): waits for the work issued so far, then refuses every later call
    /// (Error(InvalidArgument) naming close) and returns idle memory. Idempotent.
    void close();

    ProfileToken profileStart(StreamId stream);
    /// Ends `token` on the stream it was started on.
    ProfileDuration profileEnd(ProfileToken token);

    EngineStats stats();
    /// Allocations served by the slice caches so far (tests, benchmarks).
    uint64_t sliceCacheHits() { return freeQueue_->cache().hits(); }
    uint64_t nativeHandle(StreamId stream, NativeKind kind, const Buffer *buffer);
    NativeBuffer nativeBuffer(const Buffer &buffer);

    // Poisoning for work issued through several servers (the Communicator; poisoning.cpp).
    /// The first poisoned range of bytes [0, size) of `buffer` (any server's); none: null why.
    static Poison::Hit poisonedIn(const Buffer &buffer, uint64_t size);
    /// Poisons bytes [0, size) of `buffer` with `why` (a failure that spreads).
    static void poisonLike(const Buffer &buffer, uint64_t size, const PoisonReason &why);
    /// Poisons bytes [0, size) of `buffer`, this server's, after `operation` failed with `e` on
    /// `stream` (nothing when this device is lost).
    void poisonAfter(const Buffer &buffer, uint64_t size, StreamId stream,
                     const std::string &operation, const std::exception &e);

    /// Waits for `fence` with no lock held and records the completion; a failure marks the
    /// device lost and throws Error(DeviceLost). Usable after the server is gone (ReadFuture).
    static void waitFence(const std::weak_ptr<ComputeServer> &server, const Fence &fence);

private:
    using SlicePtr = const std::shared_ptr<Slice> *;
    struct ProfileRecord {
        uint64_t id = 0;
        StreamId stream = 0; ///< tokens of one stream nest
        uint32_t slot = 0;
        EventOwner start;
        std::chrono::steady_clock::time_point hostStart;
    };

    uint32_t slotOf(StreamId stream) const noexcept {
        return static_cast<uint32_t>(stream % maxStreams_);
    }
    /// The buffer's slice; Error(InvalidArgument) for an empty Buffer and for one of another
    /// client, saying whose (another open() of the device, a closed client, another device).
    const std::shared_ptr<Slice> &sliceOf(const Buffer &buffer, const char *what) const;
    /// nativeBuffer with mutex_ held.
    NativeBuffer nativeBufferLocked(const Buffer &buffer, const char *what);
    /// A zero-byte slice: no pool memory, the identity of this server.
    std::shared_ptr<Slice> zeroSlice(uint32_t slot) const;
    /// Throws Error(DeviceLost) once a stream's work failed.
    void checkAlive() const;
public:
    /// ComputeClient::close(): no automatic reopen starts from this open any more.
    void beginClose();
    /// The open that replaced this one after its fault; null when none did (yet).
    std::shared_ptr<ComputeServer> successor();

private:
    /// current() once lost: the successor, made now when devices.reopen_after_fault allows
    /// another reopen (this server is closed then), else this server.
    ComputeServer &reopened();
    /// Records the first sticky failure: `why`, the time, and (when known) the stream slot whose
    /// work showed it. Later calls fail with Error(DeviceLost) saying so.
    void markLost(const std::string &why, std::optional<uint32_t> slot = std::nullopt) const;
    void waitFence(const Fence &fence);
    /// Whether `fence` completed, without blocking: the tracker, else (when `query`) the plugin.
    bool fenceSettled(const Fence &fence, bool query = true);
    /// Up to `count` staging blocks ready for the host (never waits for other streams); one
    /// beyond the device's bound when none is free and `beyondLimit`.
    std::vector<StagingLease> stagingBlocks(size_t count, uint32_t slot, bool beyondLimit);

    /// Checks a dispatch against the device (alignment, empty bindings, the grid buffer) and
    /// gathers the slices it uses: its bindings in order, then the grid buffer.
    void checkDispatch(const std::string &kernelName, const Dispatch &dispatch,
                       boost::container::small_vector<SlicePtr, 17> &slices) const;
    /// execute() after its checks and the kernel's lookup (`handle`): issues the launch on the
    /// stream (retrying once with a recompiled kernel when a cached binary fails to launch).
    void launchChecked(StreamId stream, const KernelSource &kernel, const Dispatch &dispatch,
                       const boost::container::small_vector<SlicePtr, 17> &slices,
                       bp_kernel *handle, const TraceSpan &span);

    // recorded sequences (recording.cpp)
    /// The calling thread's open recording on `stream`, or null; one load when none is open.
    std::shared_ptr<RecordingBuilder> recordingOf(StreamId stream) {
        if (recordings_.load(std::memory_order_acquire) == 0) return nullptr;
        return findRecording(stream);
    }
    std::shared_ptr<RecordingBuilder> findRecording(StreamId stream);
    void refuseRecorded(StreamId stream, const char *what);
    /// Appends a launch / copy / fill / pinned copy to `builder` (checked like the real call).
    void recordLaunch(RecordingBuilder &builder, const KernelSource &kernel,
                      const Dispatch &dispatch);
    void recordOp(RecordingBuilder &builder, RecordedOp op);
    /// Builds the plugin's graph of `version` into it; false (with `note`) when there is none.
    bool bakeGraph(RecordingVersion &version, std::string &note);

    // memory (compute_server.cpp)
    std::shared_ptr<Slice> allocate(uint32_t slot, uint64_t size);
    void drainFreesLocked();
    /// Every slice cache back into the pool (their records queued with their hazards and
    /// applied), and the cache hits' changes of bytes in use folded into it. Before anything
    /// that must see cached memory as free: usage reports, idle release, a new page, the
    /// out-of-memory retry, teardown.
    void flushCachesLocked();
    /// The pool's periodic check, for allocations served by the slice caches.
    void maintainPool();
    /// A cached slice as the new allocation of `size` bytes on `slot`.
    std::shared_ptr<Slice> reuseCached(Slice *slice, uint64_t size, uint32_t slot);
    /// The periodic release of idle pages, when due; never waits. The pages it takes from the
    /// pool go to `freed`: the caller drops them after releasing the engine lock.
    void releaseIdleLocked(bool everything, std::vector<MemoryPage> &freed);
    /// Runs scheduler work; a failure there marks the device lost (queued work was dropped).
    template <class F> void scheduled(F &&work);
    /// Issues an operation whose arguments were accepted and that writes `written`
    /// (poisoning.cpp, docs/streams.md "What failed work leaves behind"): when `issue` throws,
    /// the ranges are poisoned with the failure, named by `describe()` ("kernel 'saxpy'"),
    /// unless the device is lost (then none of its memory is readable anyway); when it returns,
    /// they hold valid data again. Marking happens when the call returns or throws, in the order
    /// of the calls.
    template <class F, class D>
    void issueWriting(std::span<const SliceRange> written, uint32_t slot, D &&describe,
                      F &&issue);
    /// Runs `op`, which enqueues one operation on stream `s` of `slot` (engine lock held). While
    /// a trace records device times on a device that has timestamps, `op` goes between two
    /// timing events, and the span is drawn on the slot's device lane once its work completed
    /// (device_times.cpp, docs/trace.md "Device times").
    template <class F>
    void timed(bp_stream *s, uint32_t slot, const char *category, std::string_view name, F &&op);
    /// Draws the device spans whose work completed, placed on the host clock by a timing event
    /// on a stream of its own (idle: waiting for it waits for nothing else), waited for now. No
    /// lock held; never throws. `whenOldestDone`: only when the oldest pending span completed
    /// (the cheap check of the issuing path). Called after syncs and reads, when many spans
    /// are pending, and when a trace stops.
    void drawDeviceSpans(bool whenOldestDone = false) noexcept;
    /// Once per server (engine lock held): Trace::stop() draws this server's finished spans
    /// before the trace ends.
    void registerDeviceFlusher();
    /// Poisons `written` with the failure `e` of the operation `operation` on `slot`.
    void poisonWritten(std::span<const SliceRange> written, uint32_t slot,
                       const std::string &operation, const std::exception &e) const;
    /// Waits for every stream, then returns every idle page and staging block to the plugin.
    void releaseEverythingIdle();

    /// Enqueues `op` on `slot` after ordering it behind the slices' pending uses; records the use.
    /// Under the engine lock. In scheduler mode `op` runs later: it must own what it uses.
    template <class Op>
    void submit(uint32_t slot, std::span<const SlicePtr> slices, Op &&op, Hold extraHold = {});
    /// Flushes `slot` with a fence (the engine lock is held).
    Fence fenceLocked(uint32_t slot);
    /// Work of `slot` reaches the device and the host waits for it, no lock held while waiting.
    void syncSlot(uint32_t slot);
    /// Lets the GC catch up when `slot`'s backlog grew too long (no lock held).
    void throttle(uint32_t slot);

    // copies between devices (device_copy.cpp)
    /// copyToDevice() after its checks.
    void copyChecked(StreamId stream, const Buffer &src, uint64_t srcOffset, ComputeServer &dst,
                     StreamId dstStream, const Buffer &dstBuffer, uint64_t dstOffset,
                     uint64_t size);
    void copyPeerTo(uint32_t slot, const std::shared_ptr<Slice> &a, uint64_t from,
                    ComputeServer &dst, uint32_t dstSlot, const std::shared_ptr<Slice> &b,
                    uint64_t to, uint64_t size);
    void copyStagedTo(StreamId stream, const Buffer &src, uint64_t srcOffset, ComputeServer &dst,
                      StreamId dstStream, const Buffer &dstBuffer, uint64_t dstOffset,
                      uint64_t size);

    // transfers (transfers.cpp)
    /// write() of pageable memory after its checks (`offset` from the slice's start).
    void writeChecked(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                      const void *data, uint64_t size);
    void writeStaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                     const std::byte *src, uint64_t size);
    void readStaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                    uint64_t size, std::byte *out);
    /// The last resort without pinned memory: a copy from or into the caller's memory, waited.
    void copyUnstaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                      uint64_t size, void *host, bool toDevice);

    std::shared_ptr<Driver> driver_;
    Config config_;
    PoolLayout layout_;
    uint32_t maxStreams_ = 1;
    uint64_t openNumber_ = 0; ///< which open() of the process this is (messages, profile tokens)
    std::shared_ptr<FreeQueue> freeQueue_;
    std::shared_ptr<PluginStreams> streams_;
    CompletionTracker tracker_;
    KernelRegistry kernels_;

    mutable std::atomic<bool> lost_{false};
    std::atomic<bool> closed_{false}; ///< close() was called
    mutable std::mutex lostMutex_;
    mutable std::string lostReason_; ///< "<why> (since 16:58:03 UTC, seen on stream slot 2)"
    std::mutex successorMutex_;
    /// The open that replaced this one after its fault (devices.reopen_after_fault).
    std::shared_ptr<ComputeServer> successor_;
    bool closing_ = false; ///< close() began: no reopen from here (guarded by successorMutex_)
    uint32_t reopens_ = 0; ///< reopens before this open (its predecessors' count)
    /// The opens this one replaced after their faults, oldest first: their profile tokens end
    /// with DeviceLost here.
    std::vector<uint64_t> predecessors_;
    std::vector<Hold> lostHolds_; ///< what failed work used: kept until teardown

    /// One operation between two timing events, waiting to be drawn (device times).
    struct DeviceSpan {
        uint32_t slot = 0;
        const char *category = "";
        std::string name;
        EventOwner start, end;
    };
    /// Async streams with timestamps and event_elapsed_ns: device times can be drawn.
    bool deviceTimes_ = false;
    std::vector<DeviceSpan> deviceSpans_;          ///< guarded by mutex_
    std::atomic<size_t> pendingDeviceSpans_{0};    ///< deviceSpans_.size(), read without the lock
    /// At most this many spans wait (each holds two timing events: Vulkan has 1024 slots);
    /// beyond it, operations run untimed. Drawing starts at half of it.
    static constexpr size_t kMaxDeviceSpans = 256;
    StreamOwner anchorStream_;      ///< the anchors' own stream (guarded by mutex_)
    bool deviceFlusherSet_ = false; ///< registered with the recorder (guarded by mutex_)

    std::mutex mutex_; ///< the engine lock (see the class comment)
    std::vector<FreeRecord> freeScratch_;
    std::unique_ptr<MemoryPool> pool_;
    std::atomic<AllocationMode> mode_{AllocationMode::Auto}; ///< read without the lock too
    std::unique_ptr<MultiStream> multi_;              ///< async plugins
    std::unique_ptr<SchedulerMultiStream> scheduler_; ///< plugins without async streams
    std::vector<uint64_t> schedulerCursors_;         ///< per slot, scheduler mode
    std::vector<ProfileRecord> profiles_;
    uint64_t nextProfile_ = 1;
    EngineStats counters_; ///< fields the server counts itself
    std::atomic<uint64_t> peerCopies_{0};   ///< cross-device copies through copy_peer
    std::atomic<uint64_t> stagedCopies_{0}; ///< cross-device copies through host memory

    std::unique_ptr<StagingPool> staging_;

    std::mutex recordingMutex_; ///< guards recordingStreams_
    /// Open recordings by (thread, stream): a recording takes the calls of the thread that began
    /// it on that stream; other threads using the same stream id are not recorded.
    std::map<std::pair<std::thread::id, StreamId>, std::shared_ptr<RecordingBuilder>>
        recordingStreams_;
    std::atomic<uint32_t> recordings_{0}; ///< recordingStreams_.size(), read without the lock
    /// Recordings that were open on a predecessor when it was lost, with its open number: their
    /// endRecording() here throws DeviceLost (guarded by recordingMutex_).
    std::map<std::pair<std::thread::id, StreamId>, uint64_t> lostRecordings_;
};

} // namespace backplane::detail

// ----- the submit template (used by compute_server.cpp and transfers.cpp) -----------------------

#include <boost/container/small_vector.hpp>

namespace backplane::detail {

template <class Op>
void ComputeServer::submit(uint32_t slot, std::span<const SlicePtr> slices, Op &&op,
                           Hold extraHold) {
    if (multi_) {
        // Every pending use of the memory (the slice's own, or inherited from what it reuses) is
        // aligned with, whichever stream it was on; the op then becomes the slices' last use.
        boost::container::small_vector<StreamUse, 16> uses;
        for (SlicePtr s : slices)
            for (const StreamUse &u : (*s)->uses.uses()) uses.push_back(u);
        const MultiStream::Resolved r = multi_->resolve(slot, {uses.data(), uses.size()});
        op(static_cast<bp_stream *>(r.stream));
        for (SlicePtr s : slices) {
            (*s)->uses.reset({slot, r.cursor});
            if ((*s)->homeSlot != slot) multi_->hold(slot, *s);
        }
        if (extraHold) multi_->hold(slot, std::move(extraHold));
        return;
    }
    // Scheduler streams: a task runs after the queues of every slot its memory was used on.
    std::vector<uint32_t> origins;
    SchedulerTask task;
    const uint64_t cursor = ++schedulerCursors_[slot];
    for (SlicePtr s : slices) {
        for (const StreamUse &u : (*s)->uses.uses())
            if (u.slot != slot && !tracker_.isComplete(u)) origins.push_back(u.slot);
        task.holds.push_back(*s);
        (*s)->uses.reset({slot, cursor});
    }
    if (extraHold) task.holds.push_back(std::move(extraHold));
    task.run = [op = std::forward<Op>(op)](void *stream) mutable {
        op(static_cast<bp_stream *>(stream));
    };
    scheduled([&] { scheduler_->registerTask(slot, std::move(task), origins); });
}

template <class F, class D>
void ComputeServer::issueWriting(std::span<const SliceRange> written, uint32_t slot,
                                 D &&describe, F &&issue) {
    try {
        issue();
    } catch (const std::exception &e) {
        poisonWritten(written, slot, describe(), e);
        throw;
    }
    for (const SliceRange &w : written) w.slice->poison.clear(w.begin, w.end);
}

template <class F>
void ComputeServer::timed(bp_stream *s, uint32_t slot, const char *category,
                          std::string_view name, F &&op) {
    if (!deviceTimes_ || !tracingDevice() || deviceSpans_.size() >= kMaxDeviceSpans) {
        op();
        return;
    }
    // A timing event the plugin cannot make (out of timestamp slots, say) leaves the operation
    // untimed: a trace never fails the program.
    EventOwner start;
    try {
        start = driver_->flush(s, true, true);
    } catch (const std::exception &) {
        op();
        return;
    }
    op();
    EventOwner end;
    try {
        end = driver_->flush(s, true, true);
    } catch (const std::exception &) {
        return;
    }
    counters_.eventsCreated += 2;
    deviceSpans_.push_back({slot, category, std::string(name), std::move(start), std::move(end)});
    pendingDeviceSpans_.store(deviceSpans_.size(), std::memory_order_relaxed);
    registerDeviceFlusher();
}

template <class F> void ComputeServer::scheduled(F &&work) {
    try {
        work();
    } catch (const std::exception &e) {
        markLost(e.what());
        throw;
    }
}

} // namespace backplane::detail
