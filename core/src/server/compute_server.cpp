// ComputeServer: allocation with OOM retry, stream-ordered transfers through staging, launches.
#include "server/compute_server.hpp"

#include "cache/kernel_cache.hpp"
#include "memory/parallel_copy.hpp"

#include <backplane/cache.hpp>
#include <backplane/log.hpp>

#include <boost/container/small_vector.hpp>

#include <algorithm>
#include <cstring>

namespace backplane::detail {
namespace {

// Foreign buffers held by a stream before it is flushed with an event just to release them.
constexpr size_t kMaxPendingHolds = 256;
// Launches with up to this many bindings keep their bookkeeping on the stack.
constexpr size_t kInlineBindings = 16;

// Rejects a host transfer that does not fit the buffer (a caller error, not a plugin one).
void checkTransferRange(const Slice &slice, uint64_t offset, uint64_t size, const char *what) {
    if (offset > slice.size || size > slice.size - offset)
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + " of " + std::to_string(size) + " bytes at offset " +
                        std::to_string(offset) + " overruns a buffer of " +
                        std::to_string(slice.size) + " bytes");
}

// The cache's FNV-1a over raw bytes (kernel keys hash names, sources and function pointers).
uint64_t fnv1a(const void *data, size_t size, uint64_t h = 0xcbf29ce484222325ull) {
    return fnv1a64({static_cast<const unsigned char *>(data), size}, h);
}

bool sameVariant(const KernelVariant &a, const KernelVariant &b) {
    return a.dialect == b.dialect && a.hostFunction == b.hostFunction &&
           a.entryPoint == b.entryPoint && a.source == b.source && a.options == b.options;
}

uint64_t alignUp(uint64_t value, uint64_t alignment) {
    return (value + alignment - 1) / alignment * alignment;
}

} // namespace

ComputeServer::ComputeServer(std::shared_ptr<Driver> driver, const Config &config)
    : driver_(std::move(driver)), config_(config), freeQueue_(std::make_shared<FreeQueue>()) {
    const DeviceInfo &info = driver_->info();
    layout_ = computePoolLayout(info, config_);
    maxStreams_ = std::max<uint32_t>(1, std::min(config_.maxStreams == 0 ? 1 : config_.maxStreams,
                                                 std::max<uint32_t>(info.maxStreams, 1)));
    streams_ = std::make_unique<PluginStreams>(driver_);
    if (driver_->hasCapability(BP_CAPABILITY_ASYNC_STREAMS))
        multi_ = std::make_unique<MultiStream>(*streams_, maxStreams_);
    else
        scheduler_ = std::make_unique<SchedulerMultiStream>(
            *streams_, maxStreams_, config_.schedulerMaxTasks, config_.schedulerMode);
    log::write(log::Subsystem::Streams, log::Level::Debug,
               info.id() + ": " + std::to_string(maxStreams_) + " stream slot(s), " +
                   (multi_ ? "event streams" : "scheduler streams"));
}

ComputeServer::~ComputeServer() {
    std::lock_guard lock(mutex_);
    try {
        syncAllLocked();
    } catch (const std::exception &e) {
        log::write(log::Subsystem::Streams, log::Level::Warn,
                   std::string("closing device: final sync failed: ") + e.what());
    }
    profiles_.clear();
    staging_.clear();
    pinnedCache_.clear();
    multi_.reset();     // drains the GC thread, destroys streams
    scheduler_.reset();
    kernels_.clear();
    drainFrees();
    managers_.clear(); // pages go back to the plugin; the driver closes last
}

const std::shared_ptr<Slice> &ComputeServer::sliceOf(const Buffer &buffer, const char *what) const {
    if (!buffer.slice_)
        throw Error(ErrorCode::InvalidArgument, std::string(what) + ": empty Buffer");
    if (buffer.slice_->queue != freeQueue_)
        throw Error(ErrorCode::InvalidArgument,
                    std::string(what) + ": the Buffer belongs to another device than " +
                        info().id());
    return buffer.slice_;
}

MemoryManager &ComputeServer::manager(uint32_t slot) {
    auto it = managers_.find(slot);
    if (it != managers_.end()) return *it->second;
    return *managers_
                .emplace(slot, std::make_unique<MemoryManager>(driver_, layout_, slot, freeQueue_,
                                                               memoryCounters_))
                .first->second;
}

void ComputeServer::drainFrees() {
    freeScratch_.clear();
    freeQueue_->drain(freeScratch_);
    for (const FreeRecord &r : freeScratch_) manager(r.slot).release(r);
}

template <class Op>
void ComputeServer::submit(uint32_t slot, std::span<const std::shared_ptr<Slice> *const> slices,
                           Op &&op, Hold extraHold) {
    if (multi_) {
        boost::container::small_vector<BindingUse, kInlineBindings> uses;
        for (const auto *s : slices)
            if ((*s)->lastSlot != slot) uses.push_back({(*s)->lastSlot, (*s)->lastCursor, *s});
        MultiStream::Resolved resolved =
            multi_->resolve(slot, std::span<const BindingUse>(uses.data(), uses.size()));
        op(static_cast<bp_stream *>(resolved.stream));
        StreamSlot &state = multi_->slot(slot);
        for (const auto *s : slices) {
            if ((*s)->record.slot != slot) state.pendingHolds.push_back(*s);
            (*s)->lastSlot = slot;
            (*s)->lastCursor = resolved.cursor;
        }
        if (extraHold) state.pendingHolds.push_back(std::move(extraHold));
        multi_->finish(resolved);
        if (state.pendingHolds.size() > kMaxPendingHolds) multi_->releasePendingHolds(slot);
        return;
    }
    std::vector<uint32_t> origins;
    SchedulerTask task;
    for (const auto *s : slices) {
        origins.push_back((*s)->lastSlot);
        task.holds.push_back(*s);
        (*s)->lastSlot = slot;
    }
    if (extraHold) task.holds.push_back(std::move(extraHold));
    task.run = [op = std::forward<Op>(op)](void *stream) mutable {
        op(static_cast<bp_stream *>(stream));
    };
    scheduler_->registerTask(slot, std::move(task), origins);
}

void ComputeServer::executeQueued() {
    if (scheduler_) scheduler_->executeAll();
}

// ----- memory -----------------------------------------------------------------------------------

std::shared_ptr<Slice> ComputeServer::allocateLocked(uint32_t slot, uint64_t size) {
    drainFrees();
    try {
        return manager(slot).reserve(size, mode_);
    } catch (const Error &e) {
        if (e.code() != ErrorCode::OutOfMemory) throw;
        if (size > layout_.maxAllocationBytes) throw;
        log::write(log::Subsystem::Memory, log::Level::Info,
                   info().id() + ": out of memory for " + std::to_string(size) +
                       " bytes; releasing cached pages and retrying");
    }
    releaseEverythingIdle();
    try {
        auto slice = manager(slot).reserve(size, mode_);
        ++counters_.outOfMemoryRetries;
        return slice;
    } catch (const Error &e) {
        if (e.code() != ErrorCode::OutOfMemory) throw;
        drainFrees();
        MemoryUsage usage;
        for (auto &[index, m] : managers_) m->appendUsage(usage);
        throw Error(ErrorCode::OutOfMemory,
                    "cannot allocate " + std::to_string(size) + " bytes on " + info().id() +
                        " even after releasing every cached page (" + e.what() +
                        "); free buffers, lower memory use or pick a larger device. Usage: " +
                        usage.toString(),
                    info().backend, e.vendorCode());
    }
}

void ComputeServer::releaseEverythingIdle() {
    syncAllLocked();
    if (multi_) multi_->gc().drain();
    drainFrees();
    for (auto &[index, m] : managers_) m->cleanup(true);
}

Buffer ComputeServer::empty(StreamId stream, uint64_t size) {
    std::lock_guard lock(mutex_);
    return Buffer(allocateLocked(slotOf(stream), size));
}

Buffer ComputeServer::create(StreamId stream, const void *data, uint64_t size) {
    Buffer buffer = empty(stream, size);
    write(stream, buffer, data, size, 0);
    return buffer;
}

Tensor ComputeServer::emptyTensor(StreamId stream, std::span<const uint64_t> shape,
                                  uint64_t elementSize, TensorLayout layout) {
    Tensor t;
    t.shape.assign(shape.begin(), shape.end());
    t.elementSize = elementSize;
    t.strides.assign(shape.size(), 1);
    if (shape.empty()) {
        t.buffer = empty(stream, elementSize);
        return t;
    }
    uint64_t rowElements = shape.back();
    if (layout == TensorLayout::Optimized && shape.size() >= 2) {
        const uint64_t pitch = alignUp(rowElements * elementSize, layout_.alignment);
        if (pitch % elementSize == 0) rowElements = pitch / elementSize;
    }
    uint64_t stride = 1;
    for (size_t i = shape.size(); i-- > 0;) {
        t.strides[i] = stride;
        stride *= (i + 1 == shape.size()) ? rowElements : shape[i];
    }
    t.buffer = empty(stream, stride * elementSize);
    return t;
}

void ComputeServer::setAllocationMode(AllocationMode mode) {
    std::lock_guard lock(mutex_);
    mode_ = mode;
}

MemoryUsage ComputeServer::memoryUsage() {
    std::lock_guard lock(mutex_);
    drainFrees();
    MemoryUsage usage;
    for (auto &[index, m] : managers_) m->appendUsage(usage);
    return usage;
}

void ComputeServer::memoryCleanup() {
    std::lock_guard lock(mutex_);
    releaseEverythingIdle();
}

PinnedBuffer ComputeServer::allocatePinned(size_t size) {
    return PinnedBuffer(
        std::make_shared<PinnedBlock>(driver_->allocate(BP_MEMORY_PINNED_HOST, size)));
}

std::shared_ptr<PinnedBlock> ComputeServer::pinnedBlock(size_t size) {
    {
        std::lock_guard lock(pinnedMutex_);
        auto it = pinnedCache_.lower_bound(size);
        if (it != pinnedCache_.end() && it->first <= 4 * size + 4096) {
            auto block = std::move(it->second);
            pinnedCache_.erase(it);
            return block;
        }
    }
    size_t rounded = 4096;
    while (rounded < size) rounded *= 2;
    return std::make_shared<PinnedBlock>(driver_->allocate(BP_MEMORY_PINNED_HOST, rounded));
}

void ComputeServer::recyclePinned(std::shared_ptr<PinnedBlock> block) {
    std::lock_guard lock(pinnedMutex_);
    if (pinnedCache_.size() < 16) pinnedCache_.emplace(block->size(), std::move(block));
}

// ----- transfers --------------------------------------------------------------------------------

ComputeServer::StagingRing &ComputeServer::stagingRing(uint32_t slot) {
    StagingRing &ring = staging_[slot];
    if (!ring.blocks[0]) {
        const uint64_t chunk = std::max<uint64_t>(config_.stagingChunkBytes, 64 * 1024);
        for (auto &block : ring.blocks)
            block = std::make_shared<PinnedBlock>(driver_->allocate(BP_MEMORY_PINNED_HOST, chunk));
    }
    return ring;
}

EventPtr ComputeServer::flushEvent(uint32_t slot) { return multi_->flushWithEvent(slot); }

void ComputeServer::write(StreamId stream, const Buffer &buffer, const void *data, uint64_t size,
                          uint64_t offset) {
    const auto &slice = sliceOf(buffer, "write");
    checkTransferRange(*slice, offset, size, "write");
    if (size == 0) return;
    std::lock_guard lock(mutex_);
    const uint32_t slot = slotOf(stream);
    const std::shared_ptr<Slice> *slices[] = {&slice};
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    Driver *driver = driver_.get();
    if (!multi_) {
        auto bytes = std::make_shared<std::vector<std::byte>>(
            static_cast<const std::byte *>(data), static_cast<const std::byte *>(data) + size);
        submit(slot, slices, [driver, memory, base, bytes](bp_stream *s) {
            driver->copyHostToDevice(s, bytes->data(), memory, base, bytes->size());
        });
        return;
    }
    StagingRing &ring = stagingRing(slot);
    const uint64_t chunk = ring.blocks[0]->size();
    const auto *src = static_cast<const std::byte *>(data);
    uint64_t done = 0;
    for (uint64_t i = 0; done < size; ++i) {
        const uint64_t n = std::min(chunk, size - done);
        const size_t k = i % 2;
        // Double buffering: chunk i+1 is copied into the other block while chunk i is in flight.
        if (ring.inFlight[k]) {
            ring.inFlight[k]->wait();
            ring.inFlight[k].reset();
        }
        PinnedBlock &block = *ring.blocks[k];
        ParallelCopy::shared().copy(block.data(), src + done, n);
        submit(slot, slices, [&](bp_stream *s) {
            driver->copyHostToDevice(s, block.data(), memory, base + done, n);
        });
        ring.inFlight[k] = flushEvent(slot);
        done += n;
    }
}

void ComputeServer::write(StreamId stream, const Buffer &buffer, const PinnedBuffer &data,
                          uint64_t size, uint64_t offset) {
    const auto &slice = sliceOf(buffer, "write");
    if (!data.block_ || size > data.block_->size() || offset + size > slice->size)
        throw Error(ErrorCode::InvalidArgument, "pinned write: sizes out of range");
    std::lock_guard lock(mutex_);
    const std::shared_ptr<Slice> *slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    void *src = data.block_->data();
    submit(slotOf(stream), slices,
           [driver, memory, base, src, size](bp_stream *s) {
               driver->copyHostToDevice(s, src, memory, base, size);
           },
           data.block_);
}

void ComputeServer::readStaged(uint32_t slot, const std::shared_ptr<Slice> &slice, uint64_t offset,
                               uint64_t size, std::byte *out) {
    StagingRing &ring = stagingRing(slot);
    const uint64_t chunk = ring.blocks[0]->size();
    const std::shared_ptr<Slice> *slices[] = {&slice};
    Driver *driver = driver_.get();
    const uint64_t count = (size + chunk - 1) / chunk;
    EventPtr events[2];
    auto drainChunk = [&](uint64_t i) {
        const size_t k = i % 2;
        events[k]->wait();
        events[k].reset();
        const uint64_t at = i * chunk;
        ParallelCopy::shared().copy(out + at, ring.blocks[k]->data(), std::min(chunk, size - at));
    };
    for (uint64_t i = 0; i < count; ++i) {
        const size_t k = i % 2;
        if (ring.inFlight[k]) {
            ring.inFlight[k]->wait();
            ring.inFlight[k].reset();
        }
        const uint64_t at = i * chunk;
        const uint64_t n = std::min(chunk, size - at);
        void *dst = ring.blocks[k]->data();
        submit(slot, slices, [&](bp_stream *s) {
            driver->copyDeviceToHost(s, slice->memory, slice->offset + offset + at, dst, n);
        });
        events[k] = flushEvent(slot);
        if (i >= 1) drainChunk(i - 1); // chunk i is in flight while chunk i-1 is copied out
    }
    drainChunk(count - 1);
}

void ComputeServer::read(StreamId stream, const Buffer &buffer, void *into, uint64_t size,
                         uint64_t offset) {
    const auto &slice = sliceOf(buffer, "read");
    checkTransferRange(*slice, offset, size, "read");
    if (size == 0) return;
    std::lock_guard lock(mutex_);
    const uint32_t slot = slotOf(stream);
    if (!multi_) {
        const std::shared_ptr<Slice> *slices[] = {&slice};
        Driver *driver = driver_.get();
        bp_memory *memory = slice->memory;
        const uint64_t base = slice->offset + offset;
        submit(slot, slices, [driver, memory, base, into, size](bp_stream *s) {
            driver->copyDeviceToHost(s, memory, base, into, size);
        });
        syncLocked(slot);
        return;
    }
    readStaged(slot, slice, offset, size, static_cast<std::byte *>(into));
}

ReadFuture ComputeServer::read(StreamId stream, const Buffer &buffer, uint64_t offset,
                               uint64_t size) {
    const auto &slice = sliceOf(buffer, "read");
    if (offset > slice->size)
        throw Error(ErrorCode::InvalidArgument, "read offset beyond the end of the buffer");
    if (size == UINT64_MAX || offset + size > slice->size) size = slice->size - offset;
    std::lock_guard lock(mutex_);
    const uint32_t slot = slotOf(stream);
    const std::shared_ptr<Slice> *slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    if (!multi_) {
        auto out = std::make_shared<std::vector<std::byte>>(size);
        submit(slot, slices, [driver, memory, base, out](bp_stream *s) {
            driver->copyDeviceToHost(s, memory, base, out->data(), out->size());
        });
        syncLocked(slot);
        return ReadFuture([out] { return std::move(*out); });
    }
    if (size <= config_.stagingChunkBytes) {
        auto block = pinnedBlock(size);
        void *dst = block->data();
        submit(slot, slices, [&](bp_stream *s) {
            driver->copyDeviceToHost(s, memory, base, dst, size);
        });
        EventPtr event = flushEvent(slot);
        std::weak_ptr<ComputeServer> self = weak_from_this();
        return ReadFuture([self, block, event, size]() {
            event->wait();
            std::vector<std::byte> out(size);
            std::memcpy(out.data(), block->data(), size);
            if (auto server = self.lock()) server->recyclePinned(block);
            return out;
        });
    }
    auto out = std::make_shared<std::vector<std::byte>>(size);
    readStaged(slot, slice, offset, size, out->data());
    return ReadFuture([out] { return std::move(*out); });
}

void ComputeServer::read(StreamId stream, const Buffer &buffer, const PinnedBuffer &into,
                         uint64_t size, uint64_t offset) {
    const auto &slice = sliceOf(buffer, "read");
    if (!into.block_ || size > into.block_->size() || offset + size > slice->size)
        throw Error(ErrorCode::InvalidArgument, "pinned read: sizes out of range");
    std::lock_guard lock(mutex_);
    const uint32_t slot = slotOf(stream);
    const std::shared_ptr<Slice> *slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    void *dst = into.block_->data();
    submit(slot, slices, [driver, memory, base, dst, size](bp_stream *s) {
        driver->copyDeviceToHost(s, memory, base, dst, size);
    });
    syncLocked(slot);
}

void ComputeServer::copy(StreamId stream, const Buffer &src, uint64_t srcOffset,
                         const Buffer &dst, uint64_t dstOffset, uint64_t size) {
    const auto &a = sliceOf(src, "copy");
    const auto &b = sliceOf(dst, "copy");
    if (srcOffset + size > a->size || dstOffset + size > b->size)
        throw Error(ErrorCode::InvalidArgument, "copy: range beyond the end of a buffer");
    std::lock_guard lock(mutex_);
    const std::shared_ptr<Slice> *slices[] = {&a, &b};
    Driver *driver = driver_.get();
    bp_memory *from = a->memory;
    bp_memory *to = b->memory;
    const uint64_t fromOffset = a->offset + srcOffset;
    const uint64_t toOffset = b->offset + dstOffset;
    submit(slotOf(stream), slices, [=](bp_stream *s) {
        driver->copyDeviceToDevice(s, from, fromOffset, to, toOffset, size);
    });
}

void ComputeServer::fill(StreamId stream, const Buffer &buffer, uint32_t pattern, uint64_t offset,
                         uint64_t size) {
    const auto &slice = sliceOf(buffer, "fill");
    if (size == UINT64_MAX) size = slice->size - std::min(offset, slice->size);
    if (offset % 4 != 0 || size % 4 != 0 || offset + size > slice->size)
        throw Error(ErrorCode::InvalidArgument, "fill: offset and size must be multiples of 4 "
                                                "inside the buffer");
    std::lock_guard lock(mutex_);
    const std::shared_ptr<Slice> *slices[] = {&slice};
    Driver *driver = driver_.get();
    bp_memory *memory = slice->memory;
    const uint64_t base = slice->offset + offset;
    submit(slotOf(stream), slices,
           [=](bp_stream *s) { driver->fill(s, memory, base, size, pattern); });
}

// ----- kernels ----------------------------------------------------------------------------------

std::string ComputeServer::diskCacheKey(const KernelVariant &v) const {
    const DeviceInfo &d = info();
    std::string key = std::string("backplane-") + BACKPLANE_VERSION + "|" +
                      driver_->plugin().name() + "-" + driver_->plugin().version() + "|" + d.arch +
                      "|" + d.driverVersion + "|" + d.uuidString() + "|" + toString(v.dialect) +
                      "|" + v.entryPoint + "|";
    uint64_t h = fnv1a(v.source.data(), v.source.size());
    for (const std::string &o : v.options) h = fnv1a(o.data(), o.size() + 1, h);
    char hex[17];
    std::snprintf(hex, sizeof(hex), "%016llx", static_cast<unsigned long long>(h));
    return key + hex + "|" + std::to_string(v.source.size());
}

const ComputeServer::LoadedKernel &ComputeServer::kernelFor(const KernelSource &kernel) {
    const DeviceInfo &d = info();
    const KernelVariant *variant = nullptr;
    for (const KernelVariant &v : kernel.variants)
        if (d.accepts(v.dialect)) {
            variant = &v;
            break;
        }
    if (variant == nullptr) {
        std::string given;
        for (const KernelVariant &v : kernel.variants)
            given += std::string(given.empty() ? "" : ", ") + toString(v.dialect);
        throw Error(ErrorCode::Unsupported,
                    "kernel '" + kernel.name + "' has no variant " + d.id() +
                        " accepts (variants: " + (given.empty() ? "none" : given) +
                        "); add a variant in one of the device's dialects",
                    d.backend);
    }
    uint64_t fast = fnv1a(kernel.name.data(), kernel.name.size());
    fast = fnv1a(variant->entryPoint.data(), variant->entryPoint.size(), fast);
    const auto fn = reinterpret_cast<uintptr_t>(variant->hostFunction);
    fast = fnv1a(&fn, sizeof(fn), fast);
    const uint64_t tail[3] = {static_cast<uint64_t>(variant->dialect), variant->source.size(),
                              variant->options.size()};
    fast = fnv1a(tail, sizeof(tail), fast);
    auto &bucket = kernels_[fast];
    for (const auto &entry : bucket)
        if (entry->name == kernel.name && sameVariant(entry->variant, *variant)) {
            ++counters_.kernelCacheHits;
            return *entry;
        }

    const auto dialect = static_cast<bp_dialect>(variant->dialect);
    bp_host_kernel_source hostSource{sizeof(bp_host_kernel_source), variant->hostFunction};
    const void *source = variant->source.data();
    size_t sourceSize = variant->source.size();
    if (variant->dialect == Dialect::Host) {
        if (variant->hostFunction == nullptr)
            throw Error(ErrorCode::InvalidArgument,
                        "kernel '" + kernel.name + "': its host variant has no function");
        source = &hostSource;
        sourceSize = sizeof(hostSource);
    }
    auto entry = std::make_unique<LoadedKernel>();
    entry->variant = *variant;
    entry->name = kernel.name;
    const bool portable =
        driver_->hasCapability(BP_CAPABILITY_PORTABLE_BINARIES) && config_.cacheEnabled;
    const std::string key = portable ? diskCacheKey(*variant) : std::string();
    if (portable) {
        if (auto blob = loadCachedKernel(config_, key)) {
            try {
                entry->kernel = driver_->load(kernel.name, dialect, variant->entryPoint,
                                              blob->data(), blob->size());
                ++counters_.diskCacheHits;
            } catch (const Error &e) {
                log::write(log::Subsystem::Cache, log::Level::Warn,
                           "cached binary of kernel '" + kernel.name +
                               "' did not load, recompiling: " + e.what());
            }
        }
    }
    if (!entry->kernel) {
        CompiledKernel compiled = driver_->compile(kernel.name, dialect, variant->entryPoint,
                                                   source, sourceSize, variant->options);
        ++counters_.kernelsCompiled;
        entry->kernel = driver_->load(kernel.name, dialect, variant->entryPoint,
                                      compiled.binary.data(), compiled.binary.size());
        if (portable) storeCachedKernel(config_, key, compiled.binary);
    }
    bucket.push_back(std::move(entry));
    return *bucket.back();
}

void ComputeServer::prepare(const KernelSource &kernel) {
    std::lock_guard lock(mutex_);
    kernelFor(kernel);
}

void ComputeServer::execute(StreamId stream, const KernelSource &kernel,
                            const Dispatch &dispatch) {
    // The launch path allocates nothing on the heap for up to kInlineBindings buffers.
    boost::container::small_vector<const std::shared_ptr<Slice> *, kInlineBindings + 1> slices;
    for (const Buffer &b : dispatch.bindings) slices.push_back(&sliceOf(b, "execute"));
    if (dispatch.gridBuffer) {
        if (!driver_->hasCapability(BP_CAPABILITY_INDIRECT_DISPATCH))
            throw Error(ErrorCode::Unsupported,
                        "kernel '" + kernel.name + "': " + info().id() +
                            " has no indirect dispatch (grid from a buffer)",
                        info().backend);
        slices.push_back(&sliceOf(dispatch.gridBuffer, "execute"));
    }
    std::lock_guard lock(mutex_);
    bp_kernel *handle = kernelFor(kernel).kernel.get();
    const uint32_t slot = slotOf(stream);

    boost::container::small_vector<bp_binding, kInlineBindings> bindings;
    for (size_t i = 0; i < dispatch.bindings.size(); ++i) {
        const Slice &s = **slices[i];
        bindings.push_back({s.memory, s.offset, s.size});
    }
    bp_launch_args args{};
    args.struct_size = sizeof(args);
    args.kernel = handle;
    std::copy(dispatch.grid.begin(), dispatch.grid.end(), args.grid);
    std::copy(dispatch.block.begin(), dispatch.block.end(), args.block);
    if (dispatch.gridBuffer) {
        const Slice &g = **slices.back();
        args.grid_memory = g.memory;
        args.grid_offset = g.offset + dispatch.gridOffset;
    }
    args.binding_count = static_cast<uint32_t>(bindings.size());
    args.shared_memory_bytes = dispatch.sharedMemoryBytes;
    args.scalar_size = dispatch.scalars.size();
    Driver *driver = driver_.get();
    if (multi_) {
        // Recorded right away: the plugin copies what it needs during the call.
        submit(slot, std::span(slices.data(), slices.size()), [&](bp_stream *s) {
            args.bindings = bindings.data();
            args.scalars = dispatch.scalars.empty() ? nullptr : dispatch.scalars.data();
            driver->launch(s, args, kernel.name);
        });
        return;
    }
    // Scheduler streams run the launch later: it owns copies of everything it points to.
    struct LaunchData {
        std::vector<bp_binding> bindings;
        std::vector<std::byte> scalars;
        bp_launch_args args{};
    };
    auto data = std::make_shared<LaunchData>();
    data->bindings.assign(bindings.begin(), bindings.end());
    data->scalars = dispatch.scalars;
    data->args = args;
    submit(slot, std::span(slices.data(), slices.size()),
           [driver, data, name = kernel.name](bp_stream *s) {
        data->args.bindings = data->bindings.data();
        data->args.scalars = data->scalars.empty() ? nullptr : data->scalars.data();
        driver->launch(s, data->args, name);
    });
}

// ----- streams ----------------------------------------------------------------------------------

void ComputeServer::syncLocked(uint32_t slot) {
    if (multi_) {
        multi_->sync(slot);
        return;
    }
    // Interleaved batches may run on another slot's backend stream: submit and wait for all.
    (void)slot;
    scheduler_->executeAll();
    for (void *stream : scheduler_->streams()) {
        EventOwner event = driver_->flush(static_cast<bp_stream *>(stream), true);
        ++counters_.eventsCreated;
        driver_->eventWait(event.get());
    }
}

void ComputeServer::syncAllLocked() {
    if (multi_) {
        for (uint32_t slot : multi_->activeSlots()) multi_->sync(slot);
        return;
    }
    syncLocked(0);
}

void ComputeServer::flush(StreamId stream) {
    std::lock_guard lock(mutex_);
    const uint32_t slot = slotOf(stream);
    if (multi_) {
        driver_->flush(static_cast<bp_stream *>(multi_->slot(slot).stream), false);
        return;
    }
    scheduler_->executeStreams({slot});
}

void ComputeServer::sync(StreamId stream) {
    std::lock_guard lock(mutex_);
    syncLocked(slotOf(stream));
}

void ComputeServer::syncAll() {
    std::lock_guard lock(mutex_);
    syncAllLocked();
}

// ----- profiling --------------------------------------------------------------------------------

ProfileToken ComputeServer::profileStart(StreamId stream) {
    std::lock_guard lock(mutex_);
    const uint32_t slot = slotOf(stream);
    ProfileRecord record;
    record.id = nextProfile_++;
    record.slot = slot;
    if (multi_ && driver_->hasCapability(BP_CAPABILITY_TIMESTAMPS) &&
        driver_->plugin().has(&bp_plugin_api::event_elapsed_ns)) {
        record.start = driver_->flush(static_cast<bp_stream *>(multi_->slot(slot).stream), true,
                                      true);
        ++counters_.eventsCreated;
    } else {
        syncLocked(slot);
        record.hostStart = std::chrono::steady_clock::now();
    }
    profiles_.push_back(std::move(record));
    return {profiles_.back().id};
}

ProfileDuration ComputeServer::profileEnd(StreamId stream, ProfileToken token) {
    std::lock_guard lock(mutex_);
    (void)stream;
    auto it = std::find_if(profiles_.begin(), profiles_.end(),
                           [&](const ProfileRecord &r) { return r.id == token.id; });
    if (it == profiles_.end())
        throw Error(ErrorCode::InvalidArgument,
                    "profileEnd: unknown or already ended token " + std::to_string(token.id));
    ProfileRecord record = std::move(*it);
    profiles_.erase(it);
    ProfileDuration duration;
    if (record.start) {
        EventOwner end = driver_->flush(
            static_cast<bp_stream *>(multi_->slot(record.slot).stream), true, true);
        ++counters_.eventsCreated;
        driver_->eventWait(end.get());
        duration.nanoseconds = driver_->elapsedNs(record.start.get(), end.get());
        duration.deviceTimestamps = true;
        return duration;
    }
    syncLocked(record.slot);
    duration.nanoseconds = static_cast<uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() -
                                                             record.hostStart)
            .count());
    return duration;
}

// ----- introspection ----------------------------------------------------------------------------

EngineStats ComputeServer::stats() {
    std::lock_guard lock(mutex_);
    EngineStats s = counters_;
    s.pageAllocations = memoryCounters_.pageAllocations;
    s.pageReleases = memoryCounters_.pageReleases;
    if (multi_) {
        s.eventsCreated += multi_->eventsCreated();
        s.alignmentEvents = multi_->alignmentEvents();
        s.streamWaits = multi_->streamWaits();
        s.gcReleases = multi_->gc().released();
    } else {
        s.schedulerFlushes = scheduler_->batches();
    }
    return s;
}

uint64_t ComputeServer::nativeHandle(StreamId stream, NativeKind kind, const Buffer *buffer) {
    std::lock_guard lock(mutex_);
    switch (kind) {
    case NativeKind::Device: return driver_->nativeHandle(BP_NATIVE_DEVICE, nullptr);
    case NativeKind::Stream: {
        const uint32_t slot = slotOf(stream);
        void *s = multi_ ? multi_->slot(slot).stream : scheduler_->stream(slot);
        return driver_->nativeHandle(BP_NATIVE_STREAM, s);
    }
    case NativeKind::Memory:
        if (buffer == nullptr)
            throw Error(ErrorCode::InvalidArgument, "nativeHandle(Memory) needs a buffer");
        return driver_->nativeHandle(BP_NATIVE_MEMORY, sliceOf(*buffer, "nativeHandle")->memory);
    }
    return 0;
}

} // namespace backplane::detail
