// One opened GPU: context, memory pages, streams, pooled events and transfers.
#include "gpu_device.hpp"

#include <chrono>
#include <thread>
#include <type_traits>

namespace backplane::gpu {
namespace {

void requireRange(uint64_t offset, uint64_t size, uint64_t capacity, const char *what) {
    if (offset > capacity || size > capacity - offset)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         std::string(what) + ": range [" + std::to_string(offset) + ", +" +
                             std::to_string(size) + ") exceeds the page of " +
                             std::to_string(capacity) + " bytes");
}

// CUcontext is a pointer; HIP's "context" is the device ordinal.
template <class Handle> uint64_t handleValue(Handle handle) {
    if constexpr (std::is_pointer_v<Handle>)
        return static_cast<uint64_t>(reinterpret_cast<uintptr_t>(handle));
    else
        return static_cast<uint64_t>(handle);
}

} // namespace

// --- memory -------------------------------------------------------------------------------------

GpuMemory::GpuMemory(GpuDevice &device, bp_memory_kind kind, uint64_t size)
    : device_(device), kind_(kind), size_(size) {
    const auto &d = device.driver();
    if (kind == BP_MEMORY_DEVICE) {
        device.check(bpv::memAlloc(d, &ptr_, size));
    } else {
        // HOST_VISIBLE is served by pinned host memory mapped into the device's address space:
        // both sides see it, which is the contract; device-local BAR memory is not used.
        device.check(bpv::hostAlloc(d, &host_, size));
        ptr_ = bpv::fromHostPtr(host_);
    }
}

GpuMemory::GpuMemory(GpuDevice &device, void *host, uint64_t size)
    : device_(device), kind_(BP_MEMORY_PINNED_HOST), size_(size), host_(host) {
    device.check(bpv::hostRegister(device.driver(), host, size), BP_ERROR_INVALID_ARGUMENT);
    registered_ = true;
    ptr_ = bpv::fromHostPtr(host_);
}

GpuMemory::~GpuMemory() {
    device_.enterForRelease();
    if (registered_)
        bpv::hostUnregister(device_.driver(), host_);
    else if (kind_ == BP_MEMORY_DEVICE)
        bpv::memFree(device_.driver(), ptr_);
    else
        bpv::hostFree(device_.driver(), host_);
}

bpv::DevicePtr GpuMemory::at(uint64_t offset, uint64_t size) const {
    requireRange(offset, size, size_, "memory access");
    return bpv::offsetPtr(ptr_, offset);
}

// --- streams and events ---------------------------------------------------------------------------

GpuStream::GpuStream(GpuDevice &device) : device_(device) {
    device.check(bpv::streamCreate(device.driver(), &stream_));
}

GpuStream::~GpuStream() {
    device_.enterForRelease();
    bpv::streamSynchronize(device_.driver(), stream_);
    bpv::streamDestroy(device_.driver(), stream_);
}

GpuEvent::GpuEvent(GpuDevice &device, bool timing)
    : device_(device), timing_(timing), event_(device.acquireEvent(timing)) {}

GpuEvent::~GpuEvent() { device_.recycleEvent(event_, timing_); }

bpv::Event GpuDevice::acquireEvent(bool timing) {
    {
        std::lock_guard lock(eventMutex_);
        auto &pool = freeEvents_[timing ? 1 : 0];
        if (!pool.empty()) {
            const bpv::Event event = pool.back();
            pool.pop_back();
            return event;
        }
    }
    bpv::Event event{};
    check(bpv::eventCreate(driver_, &event, timing));
    return event;
}

void GpuDevice::recycleEvent(bpv::Event event, bool timing) noexcept {
    // Re-recording a pooled event is safe even while a stream still waits on it: a wait binds
    // to the recording that was current when it was enqueued.
    try {
        std::lock_guard lock(eventMutex_);
        freeEvents_[timing ? 1 : 0].push_back(event);
    } catch (...) {
        enterForRelease();
        bpv::eventDestroy(driver_, event);
    }
}

// --- device ---------------------------------------------------------------------------------------

namespace {

/// The first sticky fault of each device in this process. The driver keeps a device unusable for
/// the rest of the process after one (measured on CUDA 13 / driver 580: neither
/// cuDevicePrimaryCtxReset nor a new context recovers it, docs/measurements/
/// h200-2026-11-28-s4-cuda-sticky-fault.txt), so a later open fails at once, saying why.
struct ProcessFaults {
    std::mutex mutex;
    std::map<uint32_t, std::string> first; ///< by device ordinal
};

ProcessFaults &processFaults() {
    static ProcessFaults faults;
    return faults;
}

} // namespace

GpuDevice::GpuDevice(GpuDeviceDescription description, std::shared_ptr<NcclLoader> nccl)
    : driver_(gpu::driver()), description_(std::move(description)), nccl_(std::move(nccl)) {
    {
        ProcessFaults &faults = processFaults();
        std::lock_guard lock(faults.mutex);
        if (const auto found = faults.first.find(description_.ordinal);
            found != faults.first.end())
            throw sdk::Error(BP_ERROR_DEVICE_LOST,
                             name() + " cannot be opened again in this process: " +
                                 found->second);
    }
    check(bpv::contextRetain(driver_, &context_, description_.id));
}

GpuDevice::~GpuDevice() {
    enterForRelease();
    for (auto &pool : freeEvents_)
        for (const bpv::Event event : pool) bpv::eventDestroy(driver_, event);
    if (captureStream_ != nullptr) bpv::streamDestroy(driver_, captureStream_);
    bpv::contextRelease(driver_, context_, description_.id);
}

std::string GpuDevice::name() const {
    return std::string(bpv::kApiName) + " device " + std::to_string(description_.ordinal);
}

void GpuDevice::markLost(const std::string &why, bool fault) const {
    {
        std::lock_guard lock(lostMutex_);
        if (!lost_.load()) lostReason_ = why;
        lost_.store(true);
    }
    if (!fault) return;
    ProcessFaults &faults = processFaults();
    std::lock_guard lock(faults.mutex);
    faults.first.emplace(description_.ordinal, why); // the first one stays
}

void GpuDevice::enter() const {
    if (lost_.load(std::memory_order_relaxed)) {
        std::lock_guard lock(lostMutex_);
        throw sdk::Error(BP_ERROR_DEVICE_LOST,
                         std::string(bpv::kApiName) + " device " +
                             std::to_string(description_.ordinal) + " is lost since: " +
                             lostReason_);
    }
    // Set the context only when another one is current: the get is a thread-local read, the
    // set is not free. The context is left current (it is the primary context, the one the
    // vendor's runtime API uses too).
    bpv::Context current{};
    if (!bpv::contextCurrent(driver_, &current).ok() || current != context_)
        check(bpv::contextSetCurrent(driver_, context_));
}

void GpuDevice::enterForRelease() const noexcept {
    bpv::Context current{};
    if (!bpv::contextCurrent(driver_, &current).ok() || current != context_)
        bpv::contextSetCurrent(driver_, context_);
}

void GpuDevice::check(const bpv::Call &call, bp_status fallback) const {
    if (call.ok()) return;
    sdk::Error error = toError(driver_, call, fallback);
    if (error.code() == BP_ERROR_DEVICE_LOST) markLost(error.what(), bpv::isFault(call.result));
    throw error;
}

std::unique_ptr<sdk::Memory> GpuDevice::allocate(const bp_memory_allocate_args &args,
                                                 void **mapped) {
    enter();
    if (args.size == 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "memory_allocate: size must be > 0");
    if (sdk::rawValue(args.kind) > BP_MEMORY_HOST_VISIBLE)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "memory_allocate: unknown memory kind " +
                                                        std::to_string(sdk::rawValue(args.kind)));
    auto memory = std::make_unique<GpuMemory>(*this, args.kind, args.size);
    *mapped = memory->host();
    return memory;
}

std::unique_ptr<sdk::Memory> GpuDevice::registerHost(const bp_memory_register_args &args) {
    enter();
    return std::make_unique<GpuMemory>(*this, args.host, args.size);
}

std::unique_ptr<sdk::Stream> GpuDevice::createStream(const bp_stream_create_args &) {
    enter();
    return std::make_unique<GpuStream>(*this);
}

std::unique_ptr<sdk::Event> GpuDevice::flush(sdk::Stream &stream, const bp_flush_args &args,
                                             bool wantEvent) {
    enter();
    // Work is submitted as it is recorded; a flush only needs an event when asked for one.
    if (!wantEvent) return nullptr;
    auto &gpuStream = sdk::as<GpuStream>(stream);
    auto event = std::make_unique<GpuEvent>(*this, (args.flags & BP_FLUSH_TIMING_EVENT) != 0);
    check(bpv::eventRecord(driver_, event->get(), gpuStream.get()));
    if (!gpuStream.marks().empty()) {
        gpuStream.marks().forgetDestroyed();
        event->marks() = gpuStream.marks();
    }
    return event;
}

void GpuDevice::waitEvent(sdk::Stream &stream, sdk::Event &event) {
    enter();
    // The event may belong to another device of this plugin (ABI 1.1, device_peer_access): both
    // cuStreamWaitEvent and hipStreamWaitEvent accept an event of another device's context.
    auto &gpuStream = sdk::as<GpuStream>(stream);
    auto &gpuEvent = sdk::as<GpuEvent>(event);
    check(bpv::streamWaitEvent(driver_, gpuStream.get(), gpuEvent.get()));
    gpuStream.marks().merge(gpuEvent.marks());
}

bool GpuDevice::eventWait(sdk::Event &event, uint64_t timeoutNs) {
    enter();
    const bpv::Event e = sdk::as<GpuEvent>(event).get();
    if (timeoutNs == UINT64_MAX) {
        check(bpv::eventSynchronize(driver_, e));
        sdk::as<GpuEvent>(event).marks().check();
        return true;
    }
    // Poll with a growing pause: short waits stay responsive, long ones do not burn a core.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::nanoseconds(timeoutNs);
    auto pause = std::chrono::microseconds(2);
    for (;;) {
        const bpv::Call query = bpv::eventQuery(driver_, e);
        if (query.ok()) {
            sdk::as<GpuEvent>(event).marks().check();
            return true;
        }
        if (query.result != bpv::kNotReady) check(query);
        if (std::chrono::steady_clock::now() >= deadline) return false;
        std::this_thread::sleep_for(pause);
        pause = std::min(pause * 2, std::chrono::microseconds(1000));
    }
}

bool GpuDevice::eventQuery(sdk::Event &event) {
    enter();
    auto &gpuEvent = sdk::as<GpuEvent>(event);
    const bpv::Call query = bpv::eventQuery(driver_, gpuEvent.get());
    if (query.result == bpv::kNotReady) return false;
    check(query);
    gpuEvent.marks().check();
    return true;
}

uint64_t GpuDevice::elapsedNs(sdk::Event &start, sdk::Event &end) {
    enter();
    auto &s = sdk::as<GpuEvent>(start);
    auto &e = sdk::as<GpuEvent>(end);
    if (!s.timing() || !e.timing())
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         "event_elapsed_ns needs two events flushed with BP_FLUSH_TIMING_EVENT");
    float ms = 0;
    check(bpv::eventElapsedMs(driver_, &ms, s.get(), e.get()));
    return static_cast<uint64_t>(static_cast<double>(ms) * 1e6);
}

// --- transfers --------------------------------------------------------------------------------------

void GpuDevice::copyHostToDevice(sdk::Stream &stream, const bp_copy_host_to_device_args &args) {
    enter();
    recordCopyHostToDevice(sdk::as<GpuStream>(stream).get(), args);
}

void GpuDevice::copyDeviceToHost(sdk::Stream &stream, const bp_copy_device_to_host_args &args) {
    enter();
    recordCopyDeviceToHost(sdk::as<GpuStream>(stream).get(), args);
}

void GpuDevice::copyDeviceToDevice(sdk::Stream &stream,
                                   const bp_copy_device_to_device_args &args) {
    enter();
    recordCopyDeviceToDevice(sdk::as<GpuStream>(stream).get(), args);
}

void GpuDevice::fill(sdk::Stream &stream, const bp_fill_args &args) {
    enter();
    recordFill(sdk::as<GpuStream>(stream).get(), args);
}

// An empty transfer is checked like any other and then records nothing: a stream capture may
// refuse a copy of zero bytes, which a replay must not turn into an error.
void GpuDevice::recordCopyHostToDevice(bpv::Stream stream,
                                       const bp_copy_host_to_device_args &args) {
    const ProfilerRange range("copy host to device");
    if (args.src == nullptr && args.size > 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "copy_host_to_device: src is NULL");
    const auto dst = sdk::as<GpuMemory>(args.dst).at(args.dst_offset, args.size);
    if (args.size == 0) return;
    check(bpv::copyHtoD(driver_, dst, args.src, args.size, stream));
}

void GpuDevice::recordCopyDeviceToHost(bpv::Stream stream,
                                       const bp_copy_device_to_host_args &args) {
    const ProfilerRange range("copy device to host");
    if (args.dst == nullptr && args.size > 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "copy_device_to_host: dst is NULL");
    const auto src = sdk::as<GpuMemory>(args.src).at(args.src_offset, args.size);
    if (args.size == 0) return;
    check(bpv::copyDtoH(driver_, args.dst, src, args.size, stream));
}

void GpuDevice::recordCopyDeviceToDevice(bpv::Stream stream,
                                         const bp_copy_device_to_device_args &args) {
    const ProfilerRange range("copy device to device");
    const auto src = sdk::as<GpuMemory>(args.src).at(args.src_offset, args.size);
    const auto dst = sdk::as<GpuMemory>(args.dst).at(args.dst_offset, args.size);
    if (args.size == 0) return;
    check(bpv::copyDtoD(driver_, dst, src, args.size, stream));
}

void GpuDevice::recordFill(bpv::Stream stream, const bp_fill_args &args) {
    const ProfilerRange range("fill");
    if (args.offset % 4 != 0 || args.size % 4 != 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, "fill: offset and size must be multiples of 4");
    const auto dst = sdk::as<GpuMemory>(args.dst).at(args.offset, args.size);
    if (args.size == 0) return;
    check(bpv::fillD32(driver_, dst, args.pattern, args.size / 4, stream));
}

void GpuDevice::copyPeer(sdk::Stream &stream, sdk::Device &source,
                         const bp_copy_device_to_device_args &args) {
    auto &src = sdk::as<GpuDevice>(source);
    src.enter(); // fails fast when the source device is lost
    enter();
    // Per pair: BP_CAPABILITY_PEER_COPY only says that this device reaches some other device.
    const PeerAccess peer = peerAccessTo(src);
    if (!peer.access)
        throw sdk::Error(BP_ERROR_UNSUPPORTED, "copy_peer from " + src.name() + " into " + name() +
                                                   ": " + peer.why +
                                                   "; copy through host memory instead");
    const auto from = sdk::as<GpuMemory>(args.src).at(args.src_offset, args.size);
    const auto to = sdk::as<GpuMemory>(args.dst).at(args.dst_offset, args.size);
    const ProfilerRange range("copy from peer");
    check(bpv::copyPeer(driver_, to, context_, description_.id, from, src.context_,
                        src.description_.id, args.size, sdk::as<GpuStream>(stream).get()));
}

bool GpuDevice::peerAccess(sdk::Device &src) {
    auto &source = sdk::as<GpuDevice>(src);
    enter();
    return peerAccessTo(source).access;
}

GpuDevice::PeerAccess GpuDevice::peerAccessTo(GpuDevice &source) {
    std::lock_guard lock(peerMutex_);
    const auto known = peers_.find(source.description_.ordinal);
    if (known != peers_.end()) return known->second;
    PeerAccess peer;
    if (source.description_.id == description_.id) {
        // The same GPU opened twice: one primary context, a peer copy is a local copy.
        peer.access = true;
    } else {
        int can = 0;
        const bpv::Call query = bpv::canAccessPeer(driver_, &can, description_.id,
                                                   source.description_.id);
        if (!query.ok()) {
            peer.why = toError(driver_, query).what();
        } else if (can == 0) {
            peer.why = std::string(query.name) + " says that " + name() +
                       " cannot access the memory of " + source.name() +
                       " (no NVLink or PCIe peer-to-peer path between them)";
        } else {
            // The copy runs on this device's stream and reads the source's memory: map the
            // source's allocations into this context, once. Done here rather than at open so
            // that devices never used together pay nothing (the mapping makes every later
            // allocation of the source more expensive). NCCL enabling the same pair later, or
            // another thread here, finds it already enabled, which enablePeerAccess accepts.
            enter();
            const bpv::Call enable = bpv::enablePeerAccess(driver_, source.context_);
            if (enable.ok())
                peer.access = true;
            else
                peer.why = toError(driver_, enable).what();
        }
    }
    peers_.emplace(source.description_.ordinal, peer);
    return peer;
}

uint64_t GpuDevice::nativeHandle(bp_native_kind kind, const void *object) {
    switch (kind) {
    case BP_NATIVE_DEVICE:
        return handleValue(context_);
    case BP_NATIVE_STREAM:
        return handleValue(
            sdk::as<GpuStream>(static_cast<bp_stream *>(const_cast<void *>(object))).get());
    case BP_NATIVE_MEMORY:
        return bpv::ptrValue(
            sdk::as<GpuMemory>(static_cast<bp_memory *>(const_cast<void *>(object))).at(0, 0));
    }
    sdk::unsupported("native_handle of this kind");
}

} // namespace backplane::gpu
