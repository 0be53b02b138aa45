// ComputeServer transfers: pageable writes and reads through the staging pool, pinned transfers,
// device copies and fills. Host memcpy and every wait run with no lock held.
#include "server/compute_server.hpp"

#include "memory/parallel_copy.hpp"

#include <algorithm>
#include <cstring>

namespace backplane::detail {
namespace {

// Rejects a host transfer that does not fit the buffer (a caller error, not a plugin one).
// A pinned transfer uses the PinnedBuffer from its start.
void checkPinnedSize(const PinnedBuffer &pinned, uint64_t size, const char *what) {
    if (pinned.data() == nullptr)
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + ": the PinnedBuffer is empty (default-constructed)");
    if (size > pinned.size())
        throw Error(ErrorCode::InvalidArgument, std::string(what) + " of " + std::to_string(size) +
                                                    " bytes overruns a PinnedBuffer of " +
                                                    std::to_string(pinned.size()) + " bytes");
}

void checkHostPointer(const void *host, const char *what) {
    if (host == nullptr)
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + ": the host pointer is null (only a transfer of 0 bytes "
                                        "may pass one)");
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
    const uint64_t chunk = staging_->blockBytes();
    const uint64_t count = (size + chunk - 1) / chunk;
    std::vector<StagingLease> leases = stagingBlocks(static_cast<size_t>(std::min<uint64_t>(2, count)), slot, true);
    if (leases.empty()) {
        copyUnstaged(slot, slice, offset, size, const_cast<std::byte *>(src), true);
        return;
    }
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    // Double buffering: chunk i+1 is copied into one block while chunk i is in flight from the
    // other. Each block is reused only after the fence of its previous copy.
    for (uint64_t i = 0; i < count; ++i) {
        StagingLease &lease = leases[i % leases.size()];
        Fence &ready = lease.block().ready;
        waitFence(ready); // this transfer's copy from the same block, two chunks ago
        ready = {};
        const uint64_t at = i * chunk;
        const uint64_t n = std::min(chunk, size - at);
        ParallelCopy::shared().copy(lease.data(), src + at, n);
        std::lock_guard lock(mutex_);
        submit(slot, slices, [&](bp_stream *s) {
            driver->copyHostToDevice(s, lease.data(), slice->memory, slice->offset + offset + at,
                                     n);
        });
        ready = fenceLocked(slot);
    }
    // The leases go back to the pool with their fences: no one touches a block before its copy
    // completed, and the pool never frees one before that either.
}

void ComputeServer::readStaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                               uint64_t size, std::byte *out) {
    const uint64_t chunk = staging_->blockBytes();
    const uint64_t count = (size + chunk - 1) / chunk;
    std::vector<StagingLease> leases = stagingBlocks(static_cast<size_t>(std::min<uint64_t>(2, count)), slot, true);
    if (leases.empty()) {
        copyUnstaged(slot, slice, offset, size, out, false);
        return;
    }
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    const uint64_t depth = leases.size();
    auto drain = [&](uint64_t i) {
        StagingLease &lease = leases[i % depth];
        waitFence(lease.block().ready);
        lease.block().ready = {};
        const uint64_t at = i * chunk;
        ParallelCopy::shared().copy(out + at, lease.data(), std::min(chunk, size - at));
    };
    for (uint64_t i = 0; i < count; ++i) {
        if (i >= depth) drain(i - depth); // chunk i-1 is in flight while chunk i-2 is copied out
        // A block still pending from this stream's earlier work needs no host wait: the copy
        // into it is ordered after that work, and the new fence covers both.
        StagingLease &lease = leases[i % depth];
        const uint64_t at = i * chunk;
        const uint64_t n = std::min(chunk, size - at);
        std::lock_guard lock(mutex_);
        submit(slot, slices, [&](bp_stream *s) {
            driver->copyDeviceToHost(s, slice->memory, slice->offset + offset + at, lease.data(),
                                     n);
        });
        lease.block().ready = fenceLocked(slot);
    }
    for (uint64_t i = count > depth ? count - depth : 0; i < count; ++i) drain(i);
}

void ComputeServer::write(StreamId stream, const Buffer &buffer, uint64_t offset, const void *data,
                          uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "write");
    checkBufferRange(buffer, offset, size, "write");
    if (size == 0) return;
    offset += buffer.offset();
    checkHostPointer(data, "write");
    const uint32_t slot = slotOf(stream);
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
        return;
    }
    writeStaged(slot, slice, offset, static_cast<const std::byte *>(data), size);
    throttle(slot);
}

void ComputeServer::readInto(StreamId stream, const Buffer &buffer, uint64_t offset, void *into,
                             uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "readInto");
    checkBufferRange(buffer, offset, size, "readInto");
    if (size == 0) return;
    offset += buffer.offset();
    checkHostPointer(into, "readInto");
    const uint32_t slot = slotOf(stream);
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
        return;
    }
    readStaged(slot, slice, offset, size, static_cast<std::byte *>(into));
    throttle(slot);
}

ReadFuture ComputeServer::read(StreamId stream, const Buffer &buffer, uint64_t offset,
                               uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "read");
    if (size == UINT64_MAX) size = buffer.size() - std::min(offset, buffer.size());
    checkBufferRange(buffer, offset, size, "read");
    if (size == 0) return ReadFuture([] { return std::vector<std::byte>{}; });
    offset += buffer.offset();
    const uint32_t slot = slotOf(stream);
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    if (!multi_) {
        auto out = std::make_shared<std::vector<std::byte>>(size);
        {
            std::lock_guard lock(mutex_);
            submit(slot, slices, [driver, memory, base, out](bp_stream *s) {
                driver->copyDeviceToHost(s, memory, base, out->data(), out->size());
            });
        }
        syncSlot(slot);
        return ReadFuture([out] { return std::move(*out); });
    }
    if (size > staging_->blockBytes()) {
        // Larger reads run the staged pipeline now; the future is ready.
        auto out = std::make_shared<std::vector<std::byte>>(size);
        readStaged(slot, slice, offset, size, out->data());
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
                driver->copyDeviceToHost(s, memory, base, lease->data(), size);
            });
            fence = fenceLocked(slot);
        }
        lease->block().ready = fence;
        throttle(slot);
        return ReadFuture([self, lease, fence, size]() mutable {
            waitFence(self, fence);
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
               [&](bp_stream *s) { driver->copyDeviceToHost(s, memory, base, dst, size); },
               own ? Hold(own) : Hold(out));
        fence = fenceLocked(slot);
    }
    throttle(slot);
    return ReadFuture([self, own, out, fence, size]() {
        waitFence(self, fence);
        if (!own) return std::move(*out);
        const auto *bytes = static_cast<const std::byte *>(own->data());
        return std::vector<std::byte>(bytes, bytes + size);
    });
}

// ----- pinned memory ----------------------------------------------------------------------------

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
    const uint32_t slot = slotOf(stream);
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices,
               [driver, memory, base, src, size](bp_stream *s) {
                   driver->copyHostToDevice(s, src, memory, base, size);
               },
               data.block_);
    }
    throttle(slot);
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
    Fence fence;
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices, [driver, memory, base, dst, size](bp_stream *s) {
            driver->copyDeviceToHost(s, memory, base, dst, size);
        }, into.block_);
        if (multi_) fence = fenceLocked(slot);
    }
    if (multi_)
        waitFence(fence);
    else
        syncSlot(slot);
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
    const uint32_t slot = slotOf(stream);
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices, [=](bp_stream *s) {
            driver->copyDeviceToDevice(s, from, fromOffset, to, toOffset, size);
        });
    }
    throttle(slot);
}

void ComputeServer::fill(StreamId stream, const Buffer &buffer, uint32_t pattern, uint64_t offset,
                         uint64_t size) {
    checkAlive();
    const auto &slice = sliceOf(buffer, "fill");
    if (size == UINT64_MAX) size = buffer.size() - std::min(offset, buffer.size());
    if (offset % 4 != 0 || size % 4 != 0 || offset > buffer.size() ||
        size > buffer.size() - offset)
        throw Error(ErrorCode::InvalidArgument, "fill: offset and size must be multiples of 4 "
                                                "inside the buffer");
    if (size == 0) return;
    offset += buffer.offset();
    if (offset % 4 != 0)
        throw Error(ErrorCode::InvalidArgument,
                    "fill: the Buffer is a view starting at byte " +
                        std::to_string(buffer.offset()) +
                        " of its allocation; a fill must start at a multiple of 4 there");
    const SlicePtr slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    const uint32_t slot = slotOf(stream);
    {
        std::lock_guard lock(mutex_);
        submit(slot, slices,
               [=](bp_stream *s) { driver->fill(s, memory, base, size, pattern); });
    }
    throttle(slot);
}

} // namespace backplane::detail
