// ComputeClient: the thread-safe front of one opened device (memory, transfers, launches, streams).
#pragma once

#include <backplane/buffer.hpp>
#include <backplane/device.hpp>
#include <backplane/kernel.hpp>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

namespace backplane {

class ComputeClient;
namespace lang {
class Kernel; // backplane/lang.hpp
} // namespace lang
namespace detail {
class ComputeServer;
class PinnedBlock;
struct RecordingState;
/// The server behind a client (for the core's own parts: the Communicator).
std::shared_ptr<ComputeServer> serverOf(const ComputeClient &client);
} // namespace detail

/// A logical stream. Work submitted on one stream runs in order; streams map onto the device's
/// backend streams as `id % maxStreams`. Each thread has a current stream (a per-thread id by
/// default); see ComputeClient::setStream and StreamGuard.
using StreamId = uint64_t;

/// How new allocations are served. Auto: pooled, pages released when unused. Persistent: exact
/// pages kept for the client's lifetime (weights, long-lived buffers).
enum class AllocationMode { Auto, Persistent };

/// One memory pool's figures.
struct PoolUsage {
    std::string name;           ///< "sliced 32 MiB", "exclusive", "persistent", "staging"
    uint32_t streamSlot = 0;    ///< always 0: pools are per device, shared by its streams
    uint64_t pageBytes = 0;     ///< page size (0 for exclusive/persistent: sized per request)
    uint64_t maxSliceBytes = 0; ///< largest request the pool serves
    uint32_t pages = 0;
    uint64_t bytesInUse = 0;    ///< requested bytes of live allocations
    uint64_t bytesReserved = 0; ///< bytes of pages held from the plugin
    uint64_t bytesPadding = 0;  ///< alignment padding of live allocations
    uint64_t allocations = 0;   ///< live allocations
};

/// Memory usage of one device, summed over pools; `pools` lists the pools that hold pages (and
/// "staging" when the runtime holds pinned staging blocks).
struct MemoryUsage {
    uint64_t bytesInUse = 0;
    uint64_t bytesReserved = 0; ///< device pages held from the plugin
    uint64_t bytesStaging = 0;  ///< pinned host memory held for staging transfers and reads
    uint64_t bytesPadding = 0;
    uint64_t allocationCount = 0; ///< live allocations
    uint32_t pageCount = 0;
    std::vector<PoolUsage> pools;
    /// One line per pool, human readable (used in out-of-memory messages).
    std::string toString() const;
};

/// Counters of the engine since the client was opened (for tests, benchmarks and logs).
struct EngineStats {
    uint64_t eventsCreated = 0;     ///< all events flushed (reads, syncs, alignment, staging)
    uint64_t alignmentEvents = 0;   ///< events created only because a buffer crossed streams
    uint64_t streamWaits = 0;       ///< device-side waits between streams
    uint64_t gcReleases = 0;        ///< cross-stream holds released by the GC thread
    uint64_t pageAllocations = 0;   ///< pages requested from the plugin
    uint64_t pageReleases = 0;      ///< pages returned to the plugin
    uint64_t kernelsCompiled = 0;   ///< kernel_compile calls
    uint64_t kernelCacheHits = 0;   ///< launches served by the in-memory kernel cache
    uint64_t diskCacheHits = 0;     ///< kernels loaded from the on-disk cache
    uint64_t schedulerFlushes = 0;  ///< task batches executed (scheduler streams only)
    uint64_t outOfMemoryRetries = 0;///< allocations that succeeded after a cleanup
    uint64_t peerCopies = 0;        ///< copies to another device through the plugin's copy_peer
    uint64_t stagedCopies = 0;      ///< copies to another device through host memory
};

/// A profiling token from ComputeClient::profileStart. Tokens of one stream nest (LIFO).
struct ProfileToken {
    uint64_t id = 0;     ///< numbered per client from 1; 0: not from profileStart
    uint64_t client = 0; ///< which open() started it, so another client refuses it
};

/// The measured span of a profiling token.
struct ProfileDuration {
    uint64_t nanoseconds = 0;
    bool deviceTimestamps = false; ///< true when measured with device timing events
    double microseconds() const { return static_cast<double>(nanoseconds) / 1000.0; }
};

/// Result of an asynchronous read: the copy is ordered on the stream at read() time; wait()
/// blocks until it completed and returns the bytes. wait() may be called once (later calls
/// return nothing). Dropping a future without wait() is safe: the copy keeps its memory until it
/// completed. A future may outlive its ComputeClient: closing the client waits for every
/// stream, so wait() then returns the bytes (or throws Error if the device failed).
class ReadFuture {
public:
    ReadFuture() = default;
    explicit ReadFuture(std::function<std::vector<std::byte>()> finish)
        : finish_(std::move(finish)) {}
    ReadFuture(ReadFuture &&) noexcept = default;
    ReadFuture &operator=(ReadFuture &&) noexcept = default;
    ReadFuture(const ReadFuture &) = delete; ///< one owner: copies would share one result
    ReadFuture &operator=(const ReadFuture &) = delete;
    /// Blocks until the data arrived. Throws Error if the device failed.
    std::vector<std::byte> wait() {
        auto f = std::move(finish_);
        finish_ = nullptr;
        return f ? f() : std::vector<std::byte>{};
    }

private:
    std::function<std::vector<std::byte>()> finish_;
};

/// Host memory pinned (page-locked) through the runtime (allocatePinned), or the application's
/// own memory registered with the device (registerHost): transfers from and to it go straight
/// to the device without staging. Keep its contents unchanged after a write from it until a
/// later read or sync on the same stream returned.
class PinnedBuffer {
public:
    PinnedBuffer() = default;
    /// False for a default-constructed PinnedBuffer. A PinnedBuffer of 0 bytes
    /// (allocatePinned(0)) is valid: transfers of 0 bytes with it do nothing.
    bool valid() const noexcept { return block_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }
    /// The first byte (nullptr for a PinnedBuffer of 0 bytes).
    void *data() const noexcept;
    size_t size() const noexcept;

private:
    friend class detail::ComputeServer;
    explicit PinnedBuffer(std::shared_ptr<detail::PinnedBlock> block) : block_(std::move(block)) {}
    std::shared_ptr<detail::PinnedBlock> block_;
};

/// Native objects for interop (mirrors bp_native_kind).
enum class NativeKind { Device, Stream, Memory };

/// What native code needs to use a Buffer (ComputeClient::nativeBuffer): the backend's memory
/// object that holds it, where in that object it starts, and how many bytes it has. Buffers share
/// pool pages, so `memory` alone does not identify a buffer; `offset` does.
struct NativeBuffer {
    /// The memory object: the page's CUdeviceptr (CUDA), hipDeviceptr_t (HIP), host pointer
    /// (host plugin), or VkBuffer handle (Vulkan: bind it at `offset`).
    uint64_t memory = 0;
    /// Bytes from the start of `memory` to this Buffer's (or view's) first byte.
    uint64_t offset = 0;
    /// Bytes of this Buffer or view.
    uint64_t size = 0;
    /// memory + offset where `memory` is a byte address (the plugin declares
    /// BP_CAPABILITY_ADDRESSABLE_MEMORY: CUDA, HIP, host), else 0 (Vulkan).
    uint64_t address = 0;
};

/// A sequence of launches, copies and fills recorded once on one stream of a client
/// (ComputeClient::beginRecording ... endRecording) and replayed many times with
/// ComputeClient::replay (docs/recording.md). A replay means the same as issuing the recorded
/// calls again, in order, on the replaying thread's current stream, with the buffers, kernels and
/// scalars they were recorded with; it is ordered after every earlier use of those buffers on
/// every stream, like any other work. The device replays it as one native object where it has
/// one (a CUDA graph, a reusable Vulkan command buffer, the host plugin's replay list), else the
/// core issues the recorded calls itself.
///
/// A recording keeps every buffer it uses (also ones the application dropped after recording
/// them), its kernels, its PinnedBuffers and the device open: the memory pool never hands that
/// memory to anything else while the recording exists. Cheap to copy (copies share it); safe
/// from any thread.
class Recording {
public:
    Recording() = default;
    /// False for a default-constructed Recording.
    explicit operator bool() const noexcept { return state_ != nullptr; }
    /// Operations recorded (launches, copies, fills). A fill whose size is not a multiple of 4
    /// counts as two: the whole words, then a copy of the last bytes from 4 bytes of pinned
    /// memory the recording holds.
    size_t operations() const;
    /// Launches recorded; update() numbers them from 0 in recording order.
    size_t launches() const;
    /// True when the device replays the recording as one native object; false when the core
    /// issues the recorded calls one by one (replayNote() says why).
    bool native() const;
    /// How the recording replays, for logs: "cuda graph"-like text from the plugin or the reason
    /// the core replays the calls itself.
    std::string replayNote() const;
    /// Changes launch number `launch` for later replays: grid, bindings and scalars may change;
    /// the kernel, the block size, the number of bindings, the scalar size and whether the grid
    /// comes from a buffer may not (Error(InvalidArgument), nothing changed). Replays issued
    /// before the call keep the old values. The device updates its native object in place where
    /// it can (CUDA graph exec update), else the core builds a new one.
    void update(size_t launch, const Dispatch &dispatch);
    /// The same for a launch of a portable kernel (its dispatch prepared like execute() does).
    void update(size_t launch, const lang::Kernel &kernel, const Dispatch &dispatch);

private:
    friend class detail::ComputeServer;
    explicit Recording(std::shared_ptr<detail::RecordingState> state) : state_(std::move(state)) {}
    std::shared_ptr<detail::RecordingState> state_;
};

/// The application's handle to one opened device. Cheap to copy (shares one server), safe to
/// use from any thread at once. Every operation runs on the calling thread's current stream.
/// Errors: every function throws backplane::Error (OutOfMemory with the request size and the
/// usage, Compile with the kernel name and compiler log, Launch, DeviceLost...); after an
/// OutOfMemory the client stays usable. An operation that fails after its arguments were
/// accepted poisons the bytes it was to write: reading them (or running work that reads them)
/// throws Error(Poisoned) naming that failure until they are written again (docs/streams.md,
/// "What failed work leaves behind").
class ComputeClient {
public:
    /// The device this client drives.
    const DeviceInfo &device() const;

    // memory ------------------------------------------------------------------------------------
    /// Allocates `size` bytes and copies `data` into them (stream-ordered). `data` may be null
    /// when `size` is 0.
    Buffer create(const void *data, uint64_t size);
    /// Allocates from a typed span.
    template <class T> Buffer createFrom(std::span<const T> values) {
        return create(values.data(), values.size_bytes());
    }
    /// Allocates `size` uninitialised bytes. More than the device's largest allocation
    /// (DeviceInfo::maxAllocationBytes, else its memory) is Error(OutOfMemory) naming the size,
    /// before anything is reserved. A zero-byte Buffer (size 0) takes no memory and no
    /// page: it is valid, transfers, copies and fills of 0 bytes on it do nothing, read() gives
    /// no bytes, and binding it to a kernel is Error(InvalidArgument) (it has no memory to
    /// bind), as is nativeHandle(Memory) of it.
    Buffer empty(uint64_t size);
    /// Allocates a tensor. Optimized pads rows (the last dimension) to the pitch alignment and
    /// returns the strides to use. elementSize 0, or a shape whose bytes overflow 64 bits, is
    /// Error(InvalidArgument).
    Tensor emptyTensor(std::span<const uint64_t> shape, uint64_t elementSize,
                       TensorLayout layout = TensorLayout::Contiguous);
    /// Sets how later allocations are served (see AllocationMode).
    void setAllocationMode(AllocationMode mode);
    /// Usage of every pool.
    MemoryUsage memoryUsage() const;
    /// Waits for the work of every stream, then returns every page that holds no live
    /// allocation, and every idle staging block, to the plugin.
    void memoryCleanup();
    /// Allocates page-locked host memory for direct transfers. `size` 0 gives a valid, empty
    /// PinnedBuffer (like empty(0)); more than the device can pin is Error(OutOfMemory) naming
    /// the size.
    PinnedBuffer allocatePinned(size_t size);
    /// Registers `size` bytes of the application's own memory at `data` with the device
    /// (page-locks them: cuMemHostRegister on CUDA), so that write() and readInto() of the
    /// returned PinnedBuffer (whose data() is `data`) move them directly, at pinned speed,
    /// without staging. The caller promises that the memory stays allocated, in place, while the
    /// PinnedBuffer, a copy of it, or a recording using it lives; a transfer holds the
    /// registration until its copy completed. The registration (never the memory) is released
    /// when the last of those goes. Registering takes time (the driver locks every page): it pays
    /// for a buffer that is transferred several times (docs/memory.md, "Registered host
    /// memory"). Throws Error(Unsupported) naming the plugin when the device cannot register
    /// host memory (Vulkan, plugins of ABI < 1.3), Error(InvalidArgument) for a null `data`,
    /// `size` 0, or a range the driver refuses (one overlapping a registered range).
    PinnedBuffer registerHost(void *data, size_t size);

    // transfers ---------------------------------------------------------------------------------
    // One argument order for every transfer: the buffer, where in it (offset), the host side
    // (when there is one), then how many bytes (size):
    //
    //     client.write(buffer, offset, data, size);
    //     ReadFuture f = client.read(buffer, offset, size);   // both optional: the whole buffer
    //     client.readInto(buffer, offset, into, size);
    //
    // read() is the only transfer named read, so `read(buffer, 0, n)` always means offset 0, n
    // bytes; reading into caller memory is readInto(). The host side is a pointer or a
    // PinnedBuffer (used from its start). A range that does not fit the buffer (or the
    // PinnedBuffer) is Error(InvalidArgument) before anything is transferred; 0 bytes do nothing,
    // and only then may the host pointer be null. copy() and fill() follow the same rule, each
    // buffer followed by its offset and the size last: copy(src, srcOffset, dst, dstOffset,
    // size), fill(buffer, pattern, offset, size) (pattern first: fill(buffer, pattern) fills all).

    /// Copies `size` bytes from host memory `data` into `buffer` at `offset`. Pageable memory
    /// goes through the pinned staging pipeline; the call returns once `data` may be reused.
    void write(const Buffer &buffer, uint64_t offset, const void *data, uint64_t size);
    /// Copies the first `size` bytes of runtime-pinned `data` into `buffer` at `offset`, without
    /// staging (see PinnedBuffer for when its contents may change again).
    void write(const Buffer &buffer, uint64_t offset, const PinnedBuffer &data, uint64_t size);
    /// Reads `size` bytes at `offset` (with UINT64_MAX: up to the end), ordered on the current
    /// stream; wait() on the future gives the bytes.
    ReadFuture read(const Buffer &buffer, uint64_t offset = 0, uint64_t size = UINT64_MAX);
    /// Reads `size` bytes at `offset` into ordinary (pageable) host memory `into` and returns
    /// when they are there. Goes through the pinned staging pipeline; allocates no result.
    void readInto(const Buffer &buffer, uint64_t offset, void *into, uint64_t size);
    /// Reads `size` bytes at `offset` into the start of runtime-pinned `into`, without staging;
    /// blocks until done.
    void readInto(const Buffer &buffer, uint64_t offset, const PinnedBuffer &into, uint64_t size);
    /// Convenience: the whole buffer as elements of T (read() then wait()). Throws
    /// Error(InvalidArgument), before any transfer, when the buffer's size is not a multiple of
    /// sizeof(T).
    template <class T> std::vector<T> readAs(const Buffer &buffer) {
        static_assert(std::is_trivially_copyable_v<T>, "readAs<T> copies bytes into T");
        checkWholeElements(buffer.size(), sizeof(T));
        const std::vector<std::byte> bytes = read(buffer).wait();
        std::vector<T> out(bytes.size() / sizeof(T));
        if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
        return out;
    }
    /// Device-side copy of `size` bytes. `src` and `dst` may be the same buffer when the ranges
    /// do not overlap (overlapping ranges: Error(InvalidArgument)).
    void copy(const Buffer &src, uint64_t srcOffset, const Buffer &dst, uint64_t dstOffset,
              uint64_t size);
    /// Copies `size` bytes of `src` (this client's) to `dst`, a Buffer of `dstClient`: any other
    /// opened device, of any plugin. Ordered after every earlier use of `src` and before later
    /// uses of `src` and `dst`, on every stream of both devices, without the caller syncing;
    /// it runs on this thread's current stream on both devices. Same plugin with peer access
    /// for the pair: the plugin's copy_peer, asynchronous. Otherwise a pipelined copy through
    /// pinned host memory, which returns once the bytes left `src` (the write into `dst` is
    /// stream-ordered there like write()). EngineStats::peerCopies / stagedCopies say which.
    /// `dstClient` may be this client (then it is copy() above).
    void copy(const Buffer &src, uint64_t srcOffset, ComputeClient &dstClient, const Buffer &dst,
              uint64_t dstOffset, uint64_t size);
    /// Reads a tensor of any strides (Tensor::strides, in elements, from the start of
    /// Tensor::buffer, which may be a view) as packed row-major bytes: an Optimized (row-padded)
    /// tensor reads back contiguous. Strides may be 0 (broadcast). Error(InvalidArgument) when
    /// shape and strides differ in length, elementSize is 0, or an element lies past the buffer.
    ReadFuture readTensor(const Tensor &tensor);
    /// Writes packed row-major `data` (`size` = elements × elementSize) into a tensor of any
    /// strides, touching only its elements (never the padding or other data between rows).
    /// Tensors whose elements overlap (a stride too small for the dimensions inside it) are
    /// Error(InvalidArgument), as is a size that is not the tensor's.
    void writeTensor(const Tensor &tensor, const void *data, uint64_t size);
    /// Fills `size` bytes from `offset` with a 4-byte pattern repeated in memory order (byte k of
    /// the range gets byte k % 4 of `pattern` as it lies in memory). `offset` must be a multiple
    /// of 4 (as must the view's start in its allocation); `size` may be any number of bytes, so
    /// fill(buffer, pattern) fills every byte of any buffer. A range outside the buffer is
    /// Error(InvalidArgument) naming it, before anything is issued.
    void fill(const Buffer &buffer, uint32_t pattern, uint64_t offset = 0,
              uint64_t size = UINT64_MAX);

    // kernels -----------------------------------------------------------------------------------
    /// Compiles (or finds in the caches) the variant the device accepts and launches it.
    void execute(const KernelSource &kernel, const Dispatch &dispatch);
    /// Launches a portable kernel (backplane/lang.hpp): checks the dispatch against its signature,
    /// appends the buffer lengths it reads, and hands the device the variant it accepts.
    void execute(const lang::Kernel &kernel, const Dispatch &dispatch);
    /// Compiles and loads ahead of the first launch (optional).
    void prepare(const KernelSource &kernel);

    /// Closes this client and every copy of it: waits for the work issued so far (a ReadFuture
    /// of it still returns its bytes), returns idle memory, and from then on every call of the
    /// client, and every use of its Buffers, throws Error(InvalidArgument) saying it was closed;
    /// only device(), stats() and memoryUsage() keep answering (what they last knew).
    /// Idempotent. The device may be opened again (Runtime::open) at once, also while
    /// ReadFutures or PinnedBuffers of this client live; the client's remaining memory goes back
    /// when its last copy and Buffer are gone.
    void close();

    // streams -----------------------------------------------------------------------------------
    /// Submits pending work of the current stream.
    void flush();
    /// Waits for all work of the current stream.
    void sync();
    /// Waits for all work of every stream of this device.
    void syncAll();
    /// The calling thread's current stream.
    static StreamId currentStream();
    /// Sets the calling thread's current stream (for every client).
    static void setStream(StreamId id);

    // recording ---------------------------------------------------------------------------------
    /// Starts recording this thread's calls on the current stream: until endRecording(),
    /// execute(), copy() (on this device), fill(), and write() / readInto() of a PinnedBuffer
    /// that this thread issues on this stream are recorded, not run (other threads sharing the
    /// stream id are not recorded) (a recorded readInto fills the PinnedBuffer at each replay: sync() before
    /// reading it). Buffers may be allocated meanwhile (empty()). Calls that must run now or
    /// take pageable host memory — read(), readInto() / write() / create() of pageable memory,
    /// tensor transfers, copies to another device, collectives, sync() of this stream,
    /// profiling, replay() — are Error(InvalidArgument) while the stream records; other
    /// streams and threads work as usual. Error(InvalidArgument) when it already records.
    void beginRecording();
    /// Ends this thread's recording on the current stream and returns it (it may hold no
    /// operations; replaying that does nothing). Error(InvalidArgument) when none is open.
    Recording endRecording();
    /// True while this thread records on the current stream.
    bool recording() const;
    /// Issues the recording on the current stream (see Recording). Error(InvalidArgument) for a
    /// recording of another client or while this stream records.
    void replay(const Recording &recording);

    // profiling ---------------------------------------------------------------------------------
    /// Starts a span on the current stream. Tokens started on one stream nest: end them in
    /// reverse order. Tokens of different streams are independent.
    ProfileToken profileStart();
    /// Ends a span on the stream it was started on: waits for that stream and returns the
    /// duration (device timestamps where the device has BP_CAPABILITY_TIMESTAMPS, else the host
    /// clock around stream syncs). Throws Error(InvalidArgument), ending nothing, for a token
    /// ended out of order (the message names the token still open inside it), one already
    /// ended, one of another client, or one not from profileStart; the client stays usable.
    ProfileDuration profileEnd(ProfileToken token);

    // introspection -----------------------------------------------------------------------------
    EngineStats stats() const;
    /// The vendor object behind the device, the current stream's backend stream, or a buffer's
    /// memory (uint64: pointer or handle). For Memory: the buffer's own address where the plugin's
    /// memory is addressable (CUDA, HIP, host: nativeBuffer(b).address), else the handle of the
    /// object that holds it (a VkBuffer shared with other buffers: nativeBuffer gives the
    /// offset). Throws Error(Unsupported) where the plugin has none.
    uint64_t nativeHandle(NativeKind kind, const Buffer *buffer = nullptr) const;
    /// Where `buffer` (or a view) lives, for native code (docs/interop.md). Ordering: work this
    /// client issued on the buffer may still be running, and the runtime does not see native
    /// work. Call sync() before native code touches the buffer, and finish the native work (for
    /// CUDA: cuStreamSynchronize, or work on nativeHandle(Stream) of this thread's stream, which
    /// later calls on that stream follow) before handing the buffer back to calls of this
    /// client. Error(InvalidArgument) for an empty or zero-byte Buffer or one of another client.
    NativeBuffer nativeBuffer(const Buffer &buffer) const;

    /// For the core: wraps a server (detail::openComputeClient builds it).
    explicit ComputeClient(std::shared_ptr<detail::ComputeServer> server);

private:
    friend std::shared_ptr<detail::ComputeServer> detail::serverOf(const ComputeClient &client);
    /// Error(InvalidArgument) unless `bytes` is a multiple of `elementSize` (readAs).
    static void checkWholeElements(uint64_t bytes, size_t elementSize);

    std::shared_ptr<detail::ComputeServer> server_;
};

/// Makes `id` the calling thread's current stream for its scope, then restores the previous one.
class StreamGuard {
public:
    explicit StreamGuard(StreamId id) : previous_(ComputeClient::currentStream()) {
        ComputeClient::setStream(id);
    }
    ~StreamGuard() { ComputeClient::setStream(previous_); }
    StreamGuard(const StreamGuard &) = delete;
    StreamGuard &operator=(const StreamGuard &) = delete;

private:
    StreamId previous_;
};

} // namespace backplane
