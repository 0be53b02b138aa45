// ComputeServer transfers: pageable writes and reads through the staging pool, pinned transfers,
// device copies and fills. Host memcpy and every wait run with no lock held.
#include "server/compute_server.hpp"

#include "memory/parallel_copy.hpp"
#include "server/recording.hpp"

#include <algorithm>
#include <array>
#include <cstring>

namespace backplane::detail {
namespace {

// Rejects a host transfer that does not fit the buffer (a caller error, not a plugin one).
// A pinned transfer uses the PinnedBuffer from its start.
void checkPinnedSize(const PinnedBuffer &pinned, uint64_t size, const char *what) {
    if (!pinned.valid())
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + ": the PinnedBuffer is empty (default-constructed)");
    if (size > pinned.size())
        throw Error(ErrorCode::InvalidArgument, std::string(what) + " of " + std::to_string(size) +
                                                    " bytes overruns a PinnedBuffer of " +
                                                    std::to_string(pinned.size()) + " bytes");
}

/// The wait of a read's future, on the lane of the stream that issued it.
void traceReadWait(const std::weak_ptr<ComputeServer> &server, uint32_t slot,
                   const TraceSpan &waited, uint64_t size) {
    if (!waited) return;
    if (auto alive = server.lock())
        traceComplete(alive->tracePid(), slot, "transfer", "read (wait)", waited.start,
                      {{"bytes", size}});
}

void checkHostPointer(const void *host, const char *what) {
    if (host == nullptr)
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + ": the host pointer is null (only a transfer of 0 bytes "
                                        "may pass one)");
}

/// The chunks of one staged transfer of `size` bytes through blocks of `block` bytes, so that
/// the host's copies overlap the device's:
/// - from four blocks on, the transfer ramps: its first three chunks are 1/8, 1/4 and 1/2 of a
///   block, and so are its last three in reverse order. The device then starts copying (a write)
///   or the host starts emptying blocks (a read) after an eighth of a block instead of a whole
///   one, and the step at the end that nothing overlaps is short too;
/// - from 1 MiB up to four blocks, four equal chunks (multiples of 4 KiB);
/// - below 1 MiB, one chunk per block (one chunk: the per-chunk costs would outweigh the overlap).
class ChunkPlan {
public:
    ChunkPlan(uint64_t size, uint64_t block) : size_(size), step_(block) {
        constexpr uint64_t kSplitFrom = 1u << 20;
        if (size >= 4 * block && block >= (512u << 10)) {
            ramp_ = 3;
            eighth_ = block / 8;
        } else if (size >= kSplitFrom) {
            step_ = std::min(block, ((size + 3) / 4 + 4095) / 4096 * 4096);
        }
        const uint64_t edge = 7 * eighth_; // 1/8 + 1/4 + 1/2 of a block
        middle_ = (size - 2 * edge + step_ - 1) / step_;
    }
    uint64_t count() const noexcept { return middle_ + 2 * ramp_; }
    /// Where chunk `i` starts in the transfer.
    uint64_t offset(uint64_t i) const noexcept {
        if (i < ramp_) return eighth_ * ((uint64_t{1} << i) - 1); // 0, 1/8, 3/8
        if (i < ramp_ + middle_) return 7 * eighth_ + (i - ramp_) * step_;
        const uint64_t fromEnd = count() - i; // 3, 2, 1: the last chunk is 1/8 of a block
        return size_ - eighth_ * ((uint64_t{1} << fromEnd) - 1);
    }
    uint64_t bytes(uint64_t i) const noexcept {
        return (i + 1 < count() ? offset(i + 1) : size_) - offset(i);
    }

private:
    uint64_t size_;
    uint64_t step_;       ///< bytes of the chunks between the ramps (the last may be shorter)
    uint64_t ramp_ = 0;   ///< ramp chunks at each end (0 or 3)
    uint64_t eighth_ = 0; ///< an eighth of a block when ramping
    uint64_t middle_ = 0; ///< chunks between the ramps
};

uint32_t ringDepth(const Config &config) { return std::clamp(config.stagingRingDepth, 1u, 16u); }

CopyPlan copyPlan(const Config &config) {
    return {config.stagingCopyThreads != 0 ? config.stagingCopyThreads
                                           : ParallelCopy::defaultThreads(),
            config.stagingStreamingStores};
}

} // namespace

void checkBufferRange(const Buffer &buffer, uint64_t offset, uint64_t size, const char *what) {
    if (offset > buffer.size() || size > buffer.size() - offset)
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + " of " + std::to_string(size) + " bytes at offset " +
                        std::to_string(offset) + " overruns a buffer of " +
                        std::to_string(buffer.size()) + " bytes");
}

// ----- pageable memory through staging ----------------------------------------------------------

void ComputeServer::copyUnstaged(uint32_t slot, const std::shared_ptr<Slice> &slice,
                                 uint64_t offset, uint64_t size, void *host, bool toDevice) {
    // No pinned memory at all: the plugin copies from or into the caller's memory, which must
    // stay valid until the copy completed, so this waits.
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    Fence fence;
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices, [&](bp_stream *s) {
            if (toDevice)
                driver->copyHostToDevice(s, host, slice->memory, slice->offset + offset, size);
            else
                driver->copyDeviceToHost(s, slice->memory, slice->offset + offset, host, size);
        });
        fence = fenceLocked(slot);
    }
    waitFence(fence);
}

void ComputeServer::writeStaged(uint32_t slot, const std::shared_ptr<Slice> &slice,
                                uint64_t offset, const std::byte *src, uint64_t size) {
    const ChunkPlan chunks(size, staging_->blockBytes());
    const uint64_t count = chunks.count();
    std::vector<StagingLease> leases = stagingBlocks(
        static_cast<size_t>(std::min<uint64_t>(ringDepth(config_), count)), slot, true);
    if (leases.empty()) {
        copyUnstaged(slot, slice, offset, size, const_cast<std::byte *>(src), true);
        return;
    }
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    const CopyPlan plan = copyPlan(config_);
    // A ring of blocks: chunk i is copied into one while the chunks before it are in flight from
    // the others. Each block is reused only after the fence of its previous copy. A transfer of
    // one chunk copies on the calling thread (ParallelCopy splits only large copies).
    for (uint64_t i = 0; i < count; ++i) {
        StagingLease &lease = leases[i % leases.size()];
        const TraceSpan chunkSpan; // the wait for the block, the host copy into it, the submit
        Fence &ready = lease.block().ready;
        waitFence(ready); // this transfer's copy from the same block, one ring ago
        ready = {};
        const uint64_t at = chunks.offset(i);
        const uint64_t n = chunks.bytes(i);
        ParallelCopy::shared().copy(lease.data(), src + at, n, plan);
        std::lock_guard lock(mutex_);
        submit(slot, slices, [&](bp_stream *s) {
            timed(s, slot, "transfer", "write chunk", [&] {
                driver->copyHostToDevice(s, lease.data(), slice->memory,
                                         slice->offset + offset + at, n);
            });
        });
        ready = fenceLocked(slot);
        if (chunkSpan)
            traceComplete(tracePid(), slot, "staging", "write chunk", chunkSpan.start,
                          {{"bytes", n}, {"chunk", i}});
    }
    // The leases go back to the pool with their fences: no one touches a block before its copy
    // completed, and the pool never frees one before that either.
}

void ComputeServer::readStaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                               uint64_t size, std::byte *out) {
    const ChunkPlan chunks(size, staging_->blockBytes());
    const uint64_t count = chunks.count();
    std::vector<StagingLease> leases = stagingBlocks(
        static_cast<size_t>(std::min<uint64_t>(ringDepth(config_), count)), slot, true);
    if (leases.empty()) {
        copyUnstaged(slot, slice, offset, size, out, false);
        return;
    }
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    const CopyPlan plan = copyPlan(config_);
    const uint64_t depth = leases.size();
    auto drain = [&](uint64_t i) {
        const TraceSpan chunkSpan; // the wait for the chunk's copy, then the host copy out
        StagingLease &lease = leases[i % depth];
        waitFence(lease.block().ready);
        lease.block().ready = {};
        ParallelCopy::shared().copy(out + chunks.offset(i), lease.data(), chunks.bytes(i), plan);
        if (chunkSpan)
            traceComplete(tracePid(), slot, "staging", "read chunk", chunkSpan.start,
                          {{"bytes", chunks.bytes(i)}, {"chunk", i}});
    };
    for (uint64_t i = 0; i < count; ++i) {
        // The chunks after i - depth are in flight while chunk i - depth is copied out.
        if (i >= depth) drain(i - depth);
        // A block still pending from this stream's earlier work needs no host wait: the copy
        // into it is ordered after that work, and the new fence covers both.
        StagingLease &lease = leases[i % depth];
        const uint64_t at = chunks.offset(i);
        const uint64_t n = chunks.bytes(i);
        std::lock_guard lock(mutex_);
        submit(slot, slices, [&](bp_stream *s) {
            timed(s, slot, "transfer", "read chunk", [&] {
                driver->copyDeviceToHost(s, slice->memory, slice->offset + offset + at,
                                         lease.data(), n);
            });
        });
        lease.block().ready = fenceLocked(slot);
    }
    for (uint64_t i = count > depth ? count - depth : 0; i < count; ++i) drain(i);
}

void ComputeServer::write(StreamId stream, const Buffer &buffer, uint64_t offset, const void *data,
                          uint64_t size) {
    checkAlive();
    refuseWhileRecording(stream, "write() of pageable host memory (use a PinnedBuffer)");
    const auto &slice = sliceOf(buffer, "write");
    checkBufferRange(buffer, offset, size, "write");
    if (size == 0) return;
    offset += buffer.offset();
    checkHostPointer(data, "write");
    const uint32_t slot = slotOf(stream);
    const SliceRange written[] = {{slice.get(), offset, offset + size}};
    issueWriting(written, slot, [] { return std::string("write"); },
                 [&] { writeChecked(slot, slice, offset, data, size); });
}

void ComputeServer::writeChecked(uint32_t slot, const std::shared_ptr<Slice> &slice,
                                 uint64_t offset, const void *data, uint64_t size) {
    const TraceSpan span;
    const auto traced = [&] {
        if (span) traceComplete(tracePid(), slot, "transfer", "write", span.start, {{"bytes", size}});
    };
    if (!multi_) {
        // Scheduler streams: the queued task owns a copy of the data.
        auto bytes = std::make_shared<std::vector<std::byte>>(
            static_cast<const std::byte *>(data), static_cast<const std::byte *>(data) + size);
        const SlicePtr slices[] = {&slice};
        Driver *driver = driver_.get();
        bp_memory *memory = slice->memory;
        const uint64_t base = slice->offset + offset;
        std::lock_guard lock(mutex_);
        submit(slot, slices, [driver, memory, base, bytes](bp_stream *s) {
            driver->copyHostToDevice(s, bytes->data(), memory, base, bytes->size());
        });
        traced();
        return;
    }
    writeStaged(slot, slice, offset, static_cast<const std::byte *>(data), size);
    throttle(slot);
    traced();
}

void ComputeServer::readInto(StreamId stream, const Buffer &buffer, uint64_t offset, void *into,
                             uint64_t size) {
    checkAlive();
    refuseWhileRecording(stream, "readInto() into pageable host memory (use a PinnedBuffer)");
    const auto &slice = sliceOf(buffer, "readInto");
    checkBufferRange(buffer, offset, size, "readInto");
    if (size == 0) return;
    offset += buffer.offset();
    checkHostPointer(into, "readInto");
    refusePoisoned(*slice, offset, offset + size, "readInto");
    const uint32_t slot = slotOf(stream);
    const TraceSpan span;
    const auto traced = [&] {
        if (span) traceComplete(tracePid(), slot, "transfer", "read", span.start, {{"bytes", size}});
    };
    if (!multi_) {
        const SlicePtr slices[] = {&slice};
        Driver *driver = driver_.get();
        bp_memory *memory = slice->memory;
        const uint64_t base = slice->offset + offset;
        {
            std::lock_guard lock(mutex_);
            submit(slot, slices, [driver, memory, base, into, size](bp_stream *s) {
                driver->copyDeviceToHost(s, memory, base, into, size);
            });
        }
        syncSlot(slot);
        traced();
        return;
    }
    readStaged(slot, slice, offset, size, static_cast<std::byte *>(into));
    throttle(slot);
    traced();
}

ReadFuture ComputeServer::read(StreamId stream, const Buffer &buffer, uint64_t offset,
                               uint64_t size, bool poisonChecked) {
    checkAlive();
    refuseWhileRecording(stream, "read()");
    const auto &slice = sliceOf(buffer, "read");
    if (size == UINT64_MAX) size = buffer.size() - std::min(offset, buffer.size());
    checkBufferRange(buffer, offset, size, "read");
    if (size == 0) return ReadFuture([] { return std::vector<std::byte>{}; });
    offset += buffer.offset();
    if (!poisonChecked) refusePoisoned(*slice, offset, offset + size, "read");
    const uint32_t slot = slotOf(stream);
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    // A read that returns a pending future is traced up to its submission ("read (async)").
    const TraceSpan span;
    const auto traced = [&](const char *name) {
        if (span) traceComplete(tracePid(), slot, "transfer", name, span.start, {{"bytes", size}});
    };
    if (!multi_) {
        auto out = std::make_shared<std::vector<std::byte>>(size);
        {
            std::lock_guard lock(mutex_);
            submit(slot, slices, [driver, memory, base, out](bp_stream *s) {
                driver->copyDeviceToHost(s, memory, base, out->data(), out->size());
            });
        }
        syncSlot(slot);
        traced("read");
        return ReadFuture([out] { return std::move(*out); });
    }
    if (size > staging_->blockBytes()) {
        // Larger reads run the staged pipeline now; the future is ready.
        auto out = std::make_shared<std::vector<std::byte>>(size);
        readStaged(slot, slice, offset, size, out->data());
        traced("read");
        return ReadFuture([out] { return std::move(*out); });
    }
    const std::weak_ptr<ComputeServer> self = weak_from_this();
    std::vector<StagingLease> leases = stagingBlocks(1, slot, false);
    if (!leases.empty()) {
        // The copy lands in a staging block the future owns. Dropping the future returns the
        // block with the copy's fence, so nothing reuses or frees it before the copy is done.
        // A block still pending here was last used by this stream: the copy below is ordered
        // after that use on the device, and its fence covers both.
        auto lease = std::make_shared<StagingLease>(std::move(leases.front()));
        Fence fence;
        {
            std::lock_guard lock(mutex_);
            submit(slot, slices, [&](bp_stream *s) {
                timed(s, slot, "transfer", "read",
                      [&] { driver->copyDeviceToHost(s, memory, base, lease->data(), size); });
            });
            fence = fenceLocked(slot);
        }
        lease->block().ready = fence;
        throttle(slot);
        traced("read (async)");
        return ReadFuture([self, lease, fence, size, slot]() mutable {
            const TraceSpan waited;
            waitFence(self, fence);
            traceReadWait(self, slot, waited, size);
            lease->block().ready = {};
            std::vector<std::byte> out(lease->data(), lease->data() + size);
            lease.reset(); // back to the pool
            return out;
        });
    }
    // No staging block free (unwaited futures hold them): the copy lands in pinned memory of the
    // future's own, which the stream also holds until the copy completed (the future may be
    // dropped before that). Only without pinned memory does it copy into pageable memory.
    std::shared_ptr<PinnedBlock> own;
    try {
        own = std::make_shared<PinnedBlock>(driver_->allocate(BP_MEMORY_PINNED_HOST, size));
    } catch (const Error &e) {
        if (e.code() != ErrorCode::OutOfMemory) throw;
    }
    auto out = own ? std::shared_ptr<std::vector<std::byte>>()
                   : std::make_shared<std::vector<std::byte>>(size);
    void *dst = own ? own->data() : static_cast<void *>(out->data());
    Fence fence;
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices,
               [&](bp_stream *s) {
                   timed(s, slot, "transfer", "read",
                         [&] { driver->copyDeviceToHost(s, memory, base, dst, size); });
               },
               own ? Hold(own) : Hold(out));
        fence = fenceLocked(slot);
    }
    throttle(slot);
    traced("read (async)");
    return ReadFuture([self, own, out, fence, size, slot]() {
        const TraceSpan waited;
        waitFence(self, fence);
        traceReadWait(self, slot, waited, size);
        if (!own) return std::move(*out);
        const auto *bytes = static_cast<const std::byte *>(own->data());
        return std::vector<std::byte>(bytes, bytes + size);
    });
}

// ----- pinned memory ----------------------------------------------------------------------------

PinnedBuffer ComputeServer::registerHost(void *data, size_t size) {
    checkAlive();
    if (data == nullptr || size == 0)
        throw Error(ErrorCode::InvalidArgument,
                    "registerHost: needs host memory and a size > 0 (data " +
                        std::string(data ? "set" : "null") + ", size " + std::to_string(size) +
                        ")");
    if (reinterpret_cast<uintptr_t>(data) > UINTPTR_MAX - size)
        throw Error(ErrorCode::InvalidArgument,
                    "registerHost: " + std::to_string(size) +
                        " bytes from the given address run past the end of the address space");
    // The page's owner unregisters the range when the last PinnedBuffer copy, recording or
    // pending transfer holding the block lets it go.
    try {
        return PinnedBuffer(std::make_shared<PinnedBlock>(driver_->registerHost(data, size)));
    } catch (const Error &e) {
        if (e.code() != ErrorCode::InvalidArgument) throw;
        // The range may overlap an earlier registration that only completed transfers still
        // hold: their holds go when the GC sees the fences (review finding: registering a range
        // again right after its PinnedBuffer and readInto were done was refused now and then).
        // Let those go, then ask once more; a range that is really in use is refused again.
        syncAll();
        if (multi_) multi_->gc().drain();
    }
    return PinnedBuffer(std::make_shared<PinnedBlock>(driver_->registerHost(data, size)));
}

void ComputeServer::write(StreamId stream, const Buffer &buffer, uint64_t offset,
                          const PinnedBuffer &data, uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "write");
    checkPinnedSize(data, size, "pinned write");
    checkBufferRange(buffer, offset, size, "pinned write");
    if (size == 0) return;
    offset += buffer.offset();
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    void *src = data.block_->data();
    if (auto builder = recordingOf(stream)) {
        RecordedOp op;
        op.kind = BP_GRAPH_OP_COPY_HOST_TO_DEVICE;
        op.slices = {slice};
        op.pinned = data.block_;
        op.toDevice = {sizeof(op.toDevice), src, memory, base, size};
        recordOp(*builder, std::move(op));
        return;
    }
    const uint32_t slot = slotOf(stream);
    const TraceSpan span;
    const SliceRange written[] = {{slice.get(), offset, offset + size}};
    issueWriting(written, slot, [] { return std::string("write (pinned)"); }, [&] {
        std::lock_guard lock(mutex_);
        // Scheduler streams run the op later: it captures by value.
        submit(slot, slices,
               [this, driver, memory, base, src, size, slot](bp_stream *s) {
                   timed(s, slot, "transfer", "write (pinned)",
                         [&] { driver->copyHostToDevice(s, src, memory, base, size); });
               },
               data.block_);
    });
    throttle(slot);
    if (span)
        traceComplete(tracePid(), slot, "transfer", "write (pinned)", span.start, {{"bytes", size}});
}

void ComputeServer::readInto(StreamId stream, const Buffer &buffer, uint64_t offset,
                             const PinnedBuffer &into, uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "readInto");
    checkPinnedSize(into, size, "pinned readInto");
    checkBufferRange(buffer, offset, size, "pinned readInto");
    if (size == 0) return;
    offset += buffer.offset();
    const uint32_t slot = slotOf(stream);
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    void *dst = into.block_->data();
    if (auto builder = recordingOf(stream)) {
        RecordedOp op;
        op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_HOST;
        op.slices = {slice};
        op.pinned = into.block_;
        op.toHost = {sizeof(op.toHost), memory, base, dst, size};
        recordOp(*builder, std::move(op));
        return;
    }
    refusePoisoned(*slice, offset, offset + size, "readInto (pinned)");
    const TraceSpan span;
    Fence fence;
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices, [this, driver, memory, base, dst, size, slot](bp_stream *s) {
            timed(s, slot, "transfer", "read (pinned)",
                  [&] { driver->copyDeviceToHost(s, memory, base, dst, size); });
        }, into.block_);
        if (multi_) fence = fenceLocked(slot);
    }
    if (multi_)
        waitFence(fence);
    else
        syncSlot(slot);
    if (span)
        traceComplete(tracePid(), slot, "transfer", "read (pinned)", span.start, {{"bytes", size}});
}

// ----- device-side ------------------------------------------------------------------------------

void ComputeServer::copy(StreamId stream, const Buffer &src, uint64_t srcOffset,
                         const Buffer &dst, uint64_t dstOffset, uint64_t size) {
    checkAlive();
    const auto &a = sliceOf(src, "copy");
    const auto &b = sliceOf(dst, "copy");
    checkBufferRange(src, srcOffset, size, "copy source range");
    checkBufferRange(dst, dstOffset, size, "copy destination range");
    srcOffset += src.offset();
    dstOffset += dst.offset();
    if (a->memory == b->memory && size != 0) {
        const uint64_t from = a->offset + srcOffset;
        const uint64_t to = b->offset + dstOffset;
        if (from < to + size && to < from + size)
            throw Error(ErrorCode::InvalidArgument,
                        "copy: the source and destination ranges overlap (" +
                            std::to_string(size) + " bytes); copies between overlapping "
                            "ranges are undefined on GPUs: copy through a temporary buffer");
    }
    if (size == 0) return;
    const SlicePtr slices[] = {&a, &b};
    Driver *driver = driver_.get();
    bp_memory *from = a->memory;
    bp_memory *to = b->memory;
    const uint64_t fromOffset = a->offset + srcOffset;
    const uint64_t toOffset = b->offset + dstOffset;
    if (auto builder = recordingOf(stream)) {
        RecordedOp op;
        op.kind = BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE;
        op.slices = {a, b};
        op.copy = {sizeof(op.copy), from, fromOffset, to, toOffset, size};
        recordOp(*builder, std::move(op));
        return;
    }
    const uint32_t slot = slotOf(stream);
    const TraceSpan span;
    const SliceRange read[] = {{a.get(), srcOffset, srcOffset + size}};
    const SliceRange written[] = {{b.get(), dstOffset, dstOffset + size}};
    if (const Poison::Hit hit = firstPoisoned(read); hit.why)
        refuseDependent(hit, written, "copy (not issued)");
    issueWriting(written, slot, [] { return std::string("copy"); }, [&] {
        std::lock_guard lock(mutex_);
        submit(slot, slices, [=, this](bp_stream *s) {
            timed(s, slot, "copy", "copy", [&] {
                driver->copyDeviceToDevice(s, from, fromOffset, to, toOffset, size);
            });
        });
    });
    throttle(slot);
    if (span) traceComplete(tracePid(), slot, "copy", "copy", span.start, {{"bytes", size}});
}

void ComputeServer::fill(StreamId stream, const Buffer &buffer, uint32_t pattern, uint64_t offset,
                         uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "fill");
    if (size == UINT64_MAX) size = buffer.size() - std::min(offset, buffer.size());
    if (offset % 4 != 0 || offset > buffer.size() || size > buffer.size() - offset)
        throw Error(ErrorCode::InvalidArgument,
                    "fill: " + std::to_string(size) + " bytes at offset " + std::to_string(offset) +
                        " of a " + std::to_string(buffer.size()) +
                        "-byte buffer; the offset must be a multiple of 4 and the range inside "
                        "the buffer");
    if (size == 0) return;
    offset += buffer.offset();
    if (offset % 4 != 0)
        throw Error(ErrorCode::InvalidArgument,
                    "fill: the Buffer is a view starting at byte " +
                        std::to_string(buffer.offset()) +
                        " of its allocation; a fill must start at a multiple of 4 there");
    // Devices fill whole 4-byte words; the last 1 to 3 bytes of a size that is not a multiple of
    // 4 get the pattern's first bytes (in memory order) through a stream-ordered write.
    const uint64_t words = size & ~uint64_t{3};
    const uint64_t tail = size - words;
    std::array<std::byte, 4> tailBytes{};
    std::memcpy(tailBytes.data(), &pattern, 4);
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    if (auto builder = recordingOf(stream)) {
        // A recording keeps what it copies from: the tail bytes live in pinned memory of the
        // recording's own, allocated before anything is recorded (a failure records nothing).
        std::shared_ptr<PinnedBlock> bytes;
        if (tail != 0) {
            bytes = std::make_shared<PinnedBlock>(driver_->allocate(BP_MEMORY_PINNED_HOST, 4));
            std::memcpy(bytes->data(), tailBytes.data(), 4);
        }
        if (words != 0) {
            RecordedOp op;
            op.kind = BP_GRAPH_OP_FILL;
            op.slices = {slice};
            op.fill = {sizeof(op.fill), memory, base, words, pattern};
            recordOp(*builder, std::move(op));
        }
        if (tail != 0) {
            RecordedOp op;
            op.kind = BP_GRAPH_OP_COPY_HOST_TO_DEVICE;
            op.slices = {slice};
            op.pinned = bytes;
            op.toDevice = {sizeof(op.toDevice), bytes->data(), memory, base + words, tail};
            recordOp(*builder, std::move(op));
        }
        return;
    }
    const uint32_t slot = slotOf(stream);
    const TraceSpan span;
    const SliceRange written[] = {{slice.get(), offset, offset + size}};
    issueWriting(written, slot, [] { return std::string("fill"); }, [&] {
        if (words != 0) {
            std::lock_guard lock(mutex_);
            submit(slot, slices, [=, this](bp_stream *s) {
                timed(s, slot, "fill", "fill",
                      [&] { driver->fill(s, memory, base, words, pattern); });
            });
        }
        if (tail != 0)
            write(stream, buffer, offset - buffer.offset() + words, tailBytes.data(), tail);
    });
    throttle(slot);
    if (span)
        traceComplete(tracePid(), slot, "fill", "fill", span.start,
                      {{"bytes", size}, {"pattern", pattern}});
}

} // namespace backplane::detail
