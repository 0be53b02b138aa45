// ComputeClient: forwards to the device's server with the calling thread's current stream.
#include "client/open_client.hpp"

#include "server/compute_server.hpp"

#include <backplane/error.hpp>

#include <atomic>
#include <cstdio>
#include <optional>

namespace backplane {
namespace {

std::atomic<StreamId> nextThreadStream{0};
thread_local std::optional<StreamId> threadStream;

std::string bytesText(uint64_t bytes) {
    char text[64];
    if (bytes >= (1ull << 20))
        std::snprintf(text, sizeof(text), "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
    else
        std::snprintf(text, sizeof(text), "%llu B", static_cast<unsigned long long>(bytes));
    return text;
}

} // namespace

Buffer::Buffer(std::shared_ptr<detail::Slice> slice)
    : slice_(std::move(slice)), size_(slice_ ? slice_->size : 0) {}

Buffer Buffer::view(uint64_t offset, uint64_t size) const {
    if (!slice_) throw Error(ErrorCode::InvalidArgument, "Buffer::view of an empty Buffer");
    if (offset > size_)
        throw Error(ErrorCode::InvalidArgument,
                    "Buffer::view at offset " + std::to_string(offset) + " starts past the end of a " +
                        std::to_string(size_) + "-byte buffer");
    if (size == UINT64_MAX) size = size_ - offset;
    if (size > size_ - offset)
        throw Error(ErrorCode::InvalidArgument,
                    "Buffer::view of " + std::to_string(size) + " bytes at offset " +
                        std::to_string(offset) + " overruns a " + std::to_string(size_) +
                        "-byte buffer");
    Buffer v = *this;
    v.offset_ = offset_ + offset;
    v.size_ = size;
    return v;
}

void *PinnedBuffer::data() const noexcept { return block_ ? block_->data() : nullptr; }
size_t PinnedBuffer::size() const noexcept { return block_ ? block_->size() : 0; }

std::string MemoryUsage::toString() const {
    std::string out = "in use " + bytesText(bytesInUse) + ", reserved " + bytesText(bytesReserved) +
                      ", padding " + bytesText(bytesPadding) + ", " +
                      std::to_string(allocationCount) + " allocation(s), " +
                      std::to_string(pageCount) + " page(s), staging " + bytesText(bytesStaging);
    for (const PoolUsage &p : pools)
        out += "; [" + p.name + ": " +
               std::to_string(p.pages) + " page(s), " + bytesText(p.bytesReserved) +
               " reserved, " + bytesText(p.bytesInUse) + " in use]";
    return out;
}

StreamId ComputeClient::currentStream() {
    if (!threadStream) threadStream = nextThreadStream.fetch_add(1);
    return *threadStream;
}

void ComputeClient::setStream(StreamId id) { threadStream = id; }

ComputeClient::ComputeClient(std::shared_ptr<detail::ComputeServer> server)
    : server_(std::move(server)) {}

const DeviceInfo &ComputeClient::device() const { return server_->followed().info(); }

Buffer ComputeClient::create(const void *data, uint64_t size) {
    return server_->current().create(currentStream(), data, size);
}
Buffer ComputeClient::empty(uint64_t size) { return server_->current().empty(currentStream(), size); }
void ComputeClient::close() {
    // Every open of the chain (the lost ones an automatic reopen left, then the newest): once
    // beginClose() returned, no reopen starts from that open, so the successor read after it is
    // final even while another thread's call is reopening.
    std::shared_ptr<detail::ComputeServer> server = server_;
    while (server) {
        server->beginClose();
        server->close();
        server = server->successor();
    }
}
Tensor ComputeClient::emptyTensor(std::span<const uint64_t> shape, uint64_t elementSize,
                                  TensorLayout layout) {
    return server_->current().emptyTensor(currentStream(), shape, elementSize, layout);
}
void ComputeClient::setAllocationMode(AllocationMode mode) { server_->current().setAllocationMode(mode); }
MemoryUsage ComputeClient::memoryUsage() const { return server_->followed().memoryUsage(); }
void ComputeClient::memoryCleanup() { server_->current().memoryCleanup(); }
PinnedBuffer ComputeClient::allocatePinned(size_t size) { return server_->current().allocatePinned(size); }
PinnedBuffer ComputeClient::registerHost(void *data, size_t size) {
    return server_->current().registerHost(data, size);
}

void ComputeClient::write(const Buffer &buffer, uint64_t offset, const void *data, uint64_t size) {
    server_->current().write(currentStream(), buffer, offset, data, size);
}
void ComputeClient::write(const Buffer &buffer, uint64_t offset, const PinnedBuffer &data,
                          uint64_t size) {
    server_->current().write(currentStream(), buffer, offset, data, size);
}
ReadFuture ComputeClient::read(const Buffer &buffer, uint64_t offset, uint64_t size) {
    return server_->current().read(currentStream(), buffer, offset, size);
}
void ComputeClient::readInto(const Buffer &buffer, uint64_t offset, void *into, uint64_t size) {
    server_->current().readInto(currentStream(), buffer, offset, into, size);
}
void ComputeClient::readInto(const Buffer &buffer, uint64_t offset, const PinnedBuffer &into,
                             uint64_t size) {
    server_->current().readInto(currentStream(), buffer, offset, into, size);
}
void ComputeClient::checkWholeElements(uint64_t bytes, size_t elementSize) {
    if (elementSize != 0 && bytes % elementSize == 0) return;
    throw Error(ErrorCode::InvalidArgument,
                "readAs: the buffer's " + std::to_string(bytes) +
                    " bytes are not a whole number of elements (sizeof(T) = " +
                    std::to_string(elementSize) + "); read() gives the bytes as they are");
}
void ComputeClient::copy(const Buffer &src, uint64_t srcOffset, const Buffer &dst,
                         uint64_t dstOffset, uint64_t size) {
    server_->current().copy(currentStream(), src, srcOffset, dst, dstOffset, size);
}
void ComputeClient::copy(const Buffer &src, uint64_t srcOffset, ComputeClient &dstClient,
                         const Buffer &dst, uint64_t dstOffset, uint64_t size) {
    const StreamId stream = currentStream();
    server_->current().copyToDevice(stream, src, srcOffset, dstClient.server_->current(), stream, dst, dstOffset, size);
}

std::shared_ptr<detail::ComputeServer> detail::serverOf(const ComputeClient &client) {
    return detail::ComputeServer::newest(client.server_);
}

ReadFuture ComputeClient::readTensor(const Tensor &tensor) {
    return server_->current().readTensor(currentStream(), tensor);
}

void ComputeClient::writeTensor(const Tensor &tensor, const void *data, uint64_t size) {
    server_->current().writeTensor(currentStream(), tensor, data, size);
}

void ComputeClient::fill(const Buffer &buffer, uint32_t pattern, uint64_t offset, uint64_t size) {
    server_->current().fill(currentStream(), buffer, pattern, offset, size);
}

void ComputeClient::execute(const KernelSource &kernel, const Dispatch &dispatch) {
    server_->current().execute(currentStream(), kernel, dispatch);
}
void ComputeClient::prepare(const KernelSource &kernel) { server_->current().prepare(kernel); }

void ComputeClient::beginRecording() { server_->current().beginRecording(currentStream()); }
Recording ComputeClient::endRecording() { return server_->current().endRecording(currentStream()); }
bool ComputeClient::recording() const { return server_->followed().recording(currentStream()); }
void ComputeClient::replay(const Recording &recording) {
    server_->current().replay(currentStream(), recording);
}

void ComputeClient::flush() { server_->current().flush(currentStream()); }
void ComputeClient::sync() { server_->current().sync(currentStream()); }
void ComputeClient::syncAll() { server_->current().syncAllChecked(); }

ProfileToken ComputeClient::profileStart() { return server_->current().profileStart(currentStream()); }
ProfileDuration ComputeClient::profileEnd(ProfileToken token) { return server_->current().profileEnd(token); }

EngineStats ComputeClient::stats() const { return server_->followed().stats(); }
uint64_t ComputeClient::nativeHandle(NativeKind kind, const Buffer *buffer) const {
    return server_->current().nativeHandle(currentStream(), kind, buffer);
}

NativeBuffer ComputeClient::nativeBuffer(const Buffer &buffer) const {
    return server_->current().nativeBuffer(buffer);
}

namespace detail {

ComputeClient openComputeClient(std::shared_ptr<PluginLibrary> plugin, const DeviceInfo &info,
                                const Config &config) {
    std::shared_ptr<Driver> driver = Driver::open(std::move(plugin), info);
    return ComputeClient(std::make_shared<ComputeServer>(std::move(driver), config));
}

} // namespace detail
} // namespace backplane
