// ComputeServer copies between two opened devices (the seed's ServerCommunication): copy_peer
// where one plugin instance owns both and the pair has peer access, else a pipelined copy
// through the source's pinned staging blocks. Either way the copy is ordered after every pending
// use of the source and before later uses of both buffers, on both devices, without the caller
// syncing. The two engine locks are never held together (two threads copying in opposite
// directions would otherwise deadlock).
#include "server/compute_server.hpp"

#include <future>
#include <tuple>

namespace backplane::detail {

void ComputeServer::copyToDevice(StreamId stream, const Buffer &src, uint64_t srcOffset,
                                 ComputeServer &dst, StreamId dstStream, const Buffer &dstBuffer,
                                 uint64_t dstOffset, uint64_t size) {
    if (&dst == this) {
        copy(stream, src, srcOffset, dstBuffer, dstOffset, size);
        return;
    }
    refuseWhileRecording(stream, "a copy to another device");
    dst.refuseWhileRecording(dstStream, "a copy from another device");
    checkAlive();
    dst.checkAlive();
    const auto &a = sliceOf(src, "copy to another device (source)");
    const auto &b = dst.sliceOf(dstBuffer, "copy from another device (destination)");
    checkBufferRange(src, srcOffset, size, "cross-device copy source range");
    checkBufferRange(dstBuffer, dstOffset, size, "cross-device copy destination range");
    if (size == 0) return;
    // The source must hold valid data; the destination is poisoned if the copy fails (on
    // either device: a lost source leaves it unwritten too).
    const uint64_t from = src.offset() + srcOffset, to = dstBuffer.offset() + dstOffset;
    const SliceRange read[] = {{a.get(), from, from + size}};
    const SliceRange written[] = {{b.get(), to, to + size}};
    if (const Poison::Hit hit = firstPoisoned(read); hit.why)
        refuseDependent(hit, written, "copy to " + dst.info().id() + " (not issued)");
    dst.issueWriting(written, dst.slotOf(dstStream),
                     [&] { return "copy from " + info().id(); },
                     [&] { copyChecked(stream, src, srcOffset, dst, dstStream, dstBuffer,
                                       dstOffset, size); });
}

void ComputeServer::copyChecked(StreamId stream, const Buffer &src, uint64_t srcOffset,
                                ComputeServer &dst, StreamId dstStream, const Buffer &dstBuffer,
                                uint64_t dstOffset, uint64_t size) {
    const auto &a = sliceOf(src, "copy to another device (source)");
    const auto &b = dst.sliceOf(dstBuffer, "copy from another device (destination)");
    const TraceSpan span; // on the source's lane, named after the destination
    const auto traced = [&](const char *how) {
        if (span)
            traceComplete(tracePid(), slotOf(stream), "copy",
                          std::string("copy to ") + dst.info().id() + " (" + how + ")", span.start,
                          {{"bytes", size}, {"to_pid", dst.tracePid()}});
    };
    if (multi_ && dst.multi_ && dst.driver_->peerAccess(*driver_)) {
        copyPeerTo(slotOf(stream), a, src.offset() + srcOffset, dst, dst.slotOf(dstStream), b,
                   dstBuffer.offset() + dstOffset, size);
        ++peerCopies_;
        traced("peer");
        return;
    }
    copyStagedTo(stream, src, srcOffset, dst, dstStream, dstBuffer, dstOffset, size);
    ++stagedCopies_;
    traced("staged");
}

void ComputeServer::copyPeerTo(uint32_t slot, const std::shared_ptr<Slice> &a, uint64_t from,
                               ComputeServer &dst, uint32_t dstSlot,
                               const std::shared_ptr<Slice> &b, uint64_t to, uint64_t size) {
    Driver *source = driver_.get();
    Driver *target = dst.driver_.get();
    // 1. A point on the source's stream after every pending use of the source buffer.
    Fence ready;
    {
        std::lock_guard lock(mutex_);
        const SlicePtr slices[] = {&a};
        submit(slot, slices, [](bp_stream *) {});
        ready = fenceLocked(slot);
    }
    // 2. The destination's stream waits for it on the device, then copies. The source slice is
    //    held until the copy completed (its memory must not return to a pool under the copy).
    Fence done;
    {
        std::lock_guard lock(dst.mutex_);
        const SlicePtr slices[] = {&b};
        auto hold = std::make_shared<std::pair<std::shared_ptr<Slice>, EventPtr>>(a, ready.event);
        dst.submit(
            dstSlot, slices,
            [&](bp_stream *s) {
                target->waitEvent(s, static_cast<bp_event *>(ready.event->get()));
                target->copyPeer(s, *source, a->memory, a->offset + from, b->memory,
                                 b->offset + to, size);
            },
            std::move(hold));
        done = dst.fenceLocked(dstSlot);
    }
    // 3. Later uses of the source (a write into it) wait for the copy on the device.
    {
        std::lock_guard lock(mutex_);
        const SlicePtr slices[] = {&a};
        submit(slot, slices,
               [&](bp_stream *s) {
                   source->waitEvent(s, static_cast<bp_event *>(done.event->get()));
               },
               done.event);
    }
    throttle(slot);
    dst.throttle(dstSlot);
}

void ComputeServer::copyStagedTo(StreamId stream, const Buffer &src, uint64_t srcOffset,
                                 ComputeServer &dst, StreamId dstStream, const Buffer &dstBuffer,
                                 uint64_t dstOffset, uint64_t size) {
    const uint32_t slot = slotOf(stream);
    const uint64_t chunk = staging_->blockBytes();
    const uint64_t count = (size + chunk - 1) / chunk;
    std::vector<StagingLease> leases =
        multi_ ? stagingBlocks(static_cast<size_t>(std::min<uint64_t>(2, count)), slot, true)
               : std::vector<StagingLease>{};
    if (leases.empty()) {
        // Scheduler streams or no pinned memory: through ordinary host memory, one piece at a
        // time (each side stages it itself).
        std::vector<std::byte> bounce(static_cast<size_t>(std::min(chunk, size)));
        for (uint64_t at = 0; at < size; at += chunk) {
            const uint64_t n = std::min(chunk, size - at);
            readInto(stream, src, srcOffset + at, bounce.data(), n);
            dst.write(dstStream, dstBuffer, dstOffset + at, bounce.data(), n);
        }
        return;
    }
    // Chunk i arrives in one staging block while the destination takes chunk i-1 from the other
    // (on its own thread). The writer is joined before its block is filled again, and before
    // the leases go (declared after them, so destroyed first, also on an exception).
    const std::shared_ptr<Slice> &a = sliceOf(src, "copy to another device (source)");
    const SlicePtr slices[] = {&a};
    Driver *driver = driver_.get();
    std::future<void> writer;
    for (uint64_t i = 0; i < count; ++i) {
        StagingLease &lease = leases[i % leases.size()];
        const uint64_t at = i * chunk;
        const uint64_t n = std::min(chunk, size - at);
        if (leases.size() == 1 && writer.valid()) writer.get();
        Fence fence;
        {
            std::lock_guard lock(mutex_);
            submit(slot, slices, [&](bp_stream *s) {
                driver->copyDeviceToHost(s, a->memory, a->offset + src.offset() + srcOffset + at,
                                         lease.data(), n);
            });
            fence = fenceLocked(slot);
        }
        waitFence(fence);
        lease.block().ready = {};
        if (writer.valid()) writer.get();
        writer = std::async(std::launch::async, [&dst, dstStream, &dstBuffer, dstOffset, at, n,
                                                 data = lease.data()] {
            dst.write(dstStream, dstBuffer, dstOffset + at, data, n);
        });
    }
    if (writer.valid()) writer.get();
    throttle(slot);
}

} // namespace backplane::detail

namespace backplane::detail {

// The Communicator runs these checks on every local rank before any rank's part is issued, on
// the staged engine too, whose devices may lack asynchronous streams: that is collective()'s.
void ComputeServer::checkCollective(const Buffer *send, uint64_t sendBytes, const Buffer *recv,
                                    uint64_t recvBytes, const std::string &what) const {
    checkAlive();
    for (const auto &[buffer, bytes, side] :
         {std::tuple{send, sendBytes, ": the send buffer"},
          std::tuple{recv, recvBytes, ": the receive buffer"}}) {
        if (buffer == nullptr) continue;
        const std::shared_ptr<Slice> &slice = sliceOf(*buffer, what.c_str());
        checkBufferRange(*buffer, 0, bytes, (what + side).c_str());
        if (slice->memory == nullptr)
            throw Error(ErrorCode::InvalidArgument,
                        what + side + " is a zero-byte Buffer: it has no memory to take part "
                                      "in a collective");
    }
}

void ComputeServer::collective(StreamId stream, bp_comm *comm, bp_collective_args args,
                               const Buffer *send, uint64_t sendBytes, const Buffer *recv,
                               uint64_t recvBytes, const std::string &what) {
    refuseWhileRecording(stream, "a collective");
    if (!multi_)
        throw Error(ErrorCode::Unsupported,
                    what + ": " + info().id() +
                        " has no asynchronous streams; collectives need them",
                    info().backend);
    checkCollective(send, sendBytes, recv, recvBytes, what);
    boost::container::small_vector<SlicePtr, 2> slices;
    if (send != nullptr) {
        slices.push_back(&sliceOf(*send, what.c_str()));
        checkBufferRange(*send, 0, sendBytes, (what + ": the send buffer").c_str());
        args.send = (*slices.back())->memory;
        args.send_offset = (*slices.back())->offset + send->offset();
    }
    if (recv != nullptr) {
        slices.push_back(&sliceOf(*recv, what.c_str()));
        checkBufferRange(*recv, 0, recvBytes, (what + ": the receive buffer").c_str());
        args.recv = (*slices.back())->memory;
        args.recv_offset = (*slices.back())->offset + recv->offset();
    }
    const uint32_t slot = slotOf(stream);
    Driver *driver = driver_.get();
    const TraceSpan span;
    // The send buffer must hold valid data; the receive buffer is poisoned if the collective
    // fails (a peer that failed or left included).
    boost::container::small_vector<SliceRange, 1> read, written;
    if (send != nullptr)
        read.push_back({slices.front()->get(), send->offset(), send->offset() + sendBytes});
    if (recv != nullptr)
        written.push_back({slices.back()->get(), recv->offset(), recv->offset() + recvBytes});
    const std::span<const SliceRange> reads(read.data(), read.size());
    const std::span<const SliceRange> writes(written.data(), written.size());
    if (const Poison::Hit hit = firstPoisoned(reads); hit.why)
        refuseDependent(hit, writes, what + " (not issued)");
    issueWriting(writes, slot, [&] { return what; }, [&] {
        std::lock_guard lock(mutex_);
        // Not timed for device times: inside a comm group the plugin issues it at the group's
        // end, after both timing events.
        submit(slot, std::span(slices.data(), slices.size()),
               [&](bp_stream *s) { driver->collective(s, comm, args); });
    });
    throttle(slot);
    if (span)
        traceComplete(tracePid(), slot, "collective", what, span.start,
                      {{"send_bytes", sendBytes}, {"recv_bytes", recvBytes}});
}

} // namespace backplane::detail
