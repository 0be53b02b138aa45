// ComputeServer: one opened device — pools, stream alignment, staging, kernel cache, profiling.
#pragma once

#include "memory/memory_manager.hpp"
#include "memory/slice.hpp"
#include "server/driver.hpp"
#include "stream/multi_stream.hpp"
#include "stream/scheduler_stream.hpp"

#include <backplane/client.hpp>
#include <backplane/config.hpp>

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace backplane::detail {

/// A page of pinned host memory (PinnedBuffer, staging).
class PinnedBlock {
public:
    explicit PinnedBlock(MemoryPage page) : page_(std::move(page)) {}
    void *data() const noexcept { return page_.mapped; }
    size_t size() const noexcept { return static_cast<size_t>(page_.size); }
    bp_memory *memory() const noexcept { return page_.memory.get(); }

private:
    MemoryPage page_;
};

/// The plugin's streams and events, as MultiStream and SchedulerMultiStream want them.
class PluginStreams final : public EventBackend, public SchedulerBackend {
public:
    explicit PluginStreams(std::shared_ptr<Driver> driver) : driver_(std::move(driver)) {}
    void *createStream() override { return driver_->createStream().release(); }
    void destroyStream(void *stream) override {
        driver_->api().stream_destroy(driver_->device(), static_cast<bp_stream *>(stream));
    }
    void *flush(void *stream) override {
        return driver_->flush(static_cast<bp_stream *>(stream), true).release();
    }
    void waitEvent(void *stream, void *event) override {
        driver_->waitEvent(static_cast<bp_stream *>(stream), static_cast<bp_event *>(event));
    }
    void waitEventSync(void *event) override { driver_->eventWait(static_cast<bp_event *>(event)); }
    void releaseEvent(void *event) override {
        driver_->api().event_release(driver_->device(), static_cast<bp_event *>(event));
    }
    void submit(void *stream) override { driver_->flush(static_cast<bp_stream *>(stream), false); }

private:
    std::shared_ptr<Driver> driver_;
};

/// The server of one opened device. Thread-safe: one lock per device serialises the engine
/// (pools, streams, kernel cache); frees arrive through a FreeQueue so dropping a Buffer never
/// takes the lock. Stream ids are the callers' (ComputeClient passes the thread's current one).
class ComputeServer : public std::enable_shared_from_this<ComputeServer> {
public:
    ComputeServer(std::shared_ptr<Driver> driver, const Config &config);
    ~ComputeServer();
    ComputeServer(const ComputeServer &) = delete;
    ComputeServer &operator=(const ComputeServer &) = delete;

    const DeviceInfo &info() const noexcept { return driver_->info(); }
    const Driver &driver() const noexcept { return *driver_; }
    bool asyncStreams() const noexcept { return multi_ != nullptr; }
    const PoolLayout &poolLayout() const noexcept { return layout_; }

    Buffer create(StreamId stream, const void *data, uint64_t size);
    Buffer empty(StreamId stream, uint64_t size);
    Tensor emptyTensor(StreamId stream, std::span<const uint64_t> shape, uint64_t elementSize,
                       TensorLayout layout);
    void setAllocationMode(AllocationMode mode);
    MemoryUsage memoryUsage();
    void memoryCleanup();
    PinnedBuffer allocatePinned(size_t size);

    void write(StreamId stream, const Buffer &buffer, const void *data, uint64_t size,
               uint64_t offset);
    void write(StreamId stream, const Buffer &buffer, const PinnedBuffer &data, uint64_t size,
               uint64_t offset);
    ReadFuture read(StreamId stream, const Buffer &buffer, uint64_t offset, uint64_t size);
    void read(StreamId stream, const Buffer &buffer, void *into, uint64_t size, uint64_t offset);
    void read(StreamId stream, const Buffer &buffer, const PinnedBuffer &into, uint64_t size,
              uint64_t offset);
    void copy(StreamId stream, const Buffer &src, uint64_t srcOffset, const Buffer &dst,
              uint64_t dstOffset, uint64_t size);
    void fill(StreamId stream, const Buffer &buffer, uint32_t pattern, uint64_t offset,
              uint64_t size);

    void execute(StreamId stream, const KernelSource &kernel, const Dispatch &dispatch);
    void prepare(const KernelSource &kernel);

    void flush(StreamId stream);
    void sync(StreamId stream);
    void syncAll();

    ProfileToken profileStart(StreamId stream);
    ProfileDuration profileEnd(StreamId stream, ProfileToken token);

    EngineStats stats();
    uint64_t nativeHandle(StreamId stream, NativeKind kind, const Buffer *buffer);

private:
    struct LoadedKernel {
        KernelVariant variant; ///< copy, to verify fast-key hits
        std::string name;
        KernelOwner kernel;
    };
    struct StagingRing {
        std::shared_ptr<PinnedBlock> blocks[2];
        EventPtr inFlight[2];
    };
    struct ProfileRecord {
        uint64_t id = 0;
        uint32_t slot = 0;
        EventOwner start;
        std::chrono::steady_clock::time_point hostStart;
    };

    uint32_t slotOf(StreamId stream) const noexcept {
        return static_cast<uint32_t>(stream % maxStreams_);
    }
    const std::shared_ptr<Slice> &sliceOf(const Buffer &buffer, const char *what) const;
    std::shared_ptr<Slice> allocateLocked(uint32_t slot, uint64_t size);
    MemoryManager &manager(uint32_t slot);
    void drainFrees();
    void syncLocked(uint32_t slot);
    void syncAllLocked();
    void releaseEverythingIdle();

    /// Enqueues `op` on `slot` after aligning with the slices' last uses; records the use.
    /// In scheduler mode `op` runs later: it must own what it uses.
    template <class Op>
    void submit(uint32_t slot, std::span<const std::shared_ptr<Slice> *const> slices, Op &&op,
                Hold extraHold = {});
    /// Makes queued scheduler work of every slot reach the backend (no-op for async plugins).
    void executeQueued();

    std::shared_ptr<PinnedBlock> pinnedBlock(size_t size);
    void recyclePinned(std::shared_ptr<PinnedBlock> block);
    StagingRing &stagingRing(uint32_t slot);
    void readStaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                    uint64_t size, std::byte *out);
    EventPtr flushEvent(uint32_t slot);

    const LoadedKernel &kernelFor(const KernelSource &kernel);
    std::string diskCacheKey(const KernelVariant &variant) const;

    std::shared_ptr<Driver> driver_;
    Config config_;
    PoolLayout layout_;
    uint32_t maxStreams_ = 1;
    std::shared_ptr<FreeQueue> freeQueue_;
    MemoryCounters memoryCounters_;
    std::vector<FreeRecord> freeScratch_;

    std::mutex mutex_;
    std::unique_ptr<PluginStreams> streams_;
    std::map<uint32_t, std::unique_ptr<MemoryManager>> managers_;
    AllocationMode mode_ = AllocationMode::Auto;
    std::unique_ptr<MultiStream> multi_;              ///< async plugins
    std::unique_ptr<SchedulerMultiStream> scheduler_; ///< plugins without async streams
    std::map<uint32_t, StagingRing> staging_;
    std::mutex pinnedMutex_;
    std::multimap<size_t, std::shared_ptr<PinnedBlock>> pinnedCache_;
    std::unordered_map<uint64_t, std::vector<std::unique_ptr<LoadedKernel>>> kernels_;
    std::vector<ProfileRecord> profiles_;
    uint64_t nextProfile_ = 1;
    EngineStats counters_; ///< fields the server counts itself
};

} // namespace backplane::detail
