// Buffer: a refcounted handle to device memory handed out by a ComputeClient.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

namespace backplane {

namespace detail {
struct Slice;
class ComputeServer;
} // namespace detail

/// A handle to one allocation of device memory. Cheap to copy (a shared pointer); the memory
/// returns to its pool when the last copy is gone AND no work still in flight on another stream
/// uses it (the engine holds its own reference until that work's event completed). Work on the
/// handle's own stream is ordered, so its memory may be reused right away for later work there.
///
/// A default-constructed Buffer is empty. A Buffer works with the ComputeClient that allocated it
/// (and that client's copies); with another one every call is Error(InvalidArgument) saying
/// whose it is (another open() of the device, a closed client, another device). A Buffer that
/// outlives every ComputeClient of its device is inert: using it is an error, destroying it is
/// fine. A zero-byte Buffer (ComputeClient::empty(0)) is valid, has size() 0 and holds no
/// memory. Thread-safety: like std::shared_ptr (copies may be used and destroyed from any
/// thread).
class Buffer {
public:
    Buffer() = default;

    /// Bytes the caller asked for (of a view: the view's bytes).
    uint64_t size() const noexcept { return size_; }
    /// Where this Buffer starts in its allocation: 0, or the offset given to view().
    uint64_t offset() const noexcept { return offset_; }
    /// A view of `size` bytes from `offset` of this Buffer (UINT64_MAX: up to the end). A view is
    /// a Buffer: it works wherever one does (bindings, transfers, copies, fills, collectives,
    /// cross-device copies) with offsets counted from its start, keeps the whole allocation
    /// alive, and is ordered with every other use of the allocation (the engine tracks hazards on
    /// the allocation, not per view). A range past the end is Error(InvalidArgument). A kernel
    /// binding of a view must start at a multiple of DeviceInfo::bindingAlignment (checked at
    /// execute, with the alignment in the message).
    Buffer view(uint64_t offset, uint64_t size = UINT64_MAX) const;
    /// False for a default-constructed Buffer.
    bool valid() const noexcept { return slice_ != nullptr; }
    explicit operator bool() const noexcept { return valid(); }
    /// True when this is the only reference, including in-flight cross-stream uses: the caller
    /// may then overwrite the memory in place instead of allocating a new buffer.
    bool unique() const noexcept { return slice_ != nullptr && slice_.use_count() == 1; }
    /// Identity of the underlying allocation (equal for copies and views); for tests and logs.
    const void *id() const noexcept { return slice_.get(); }

private:
    friend class detail::ComputeServer;
    explicit Buffer(std::shared_ptr<detail::Slice> slice);
    std::shared_ptr<detail::Slice> slice_;
    uint64_t offset_ = 0; ///< view start in the allocation
    uint64_t size_ = 0;   ///< view bytes
};

/// A tensor allocation: a Buffer plus its shape and the strides (in elements) the engine chose.
/// Contiguous tensors have packed strides; "optimized" ones pad each row so its pitch is a
/// multiple of the device's binding alignment (at least 256 bytes).
struct Tensor {
    Buffer buffer;
    std::vector<uint64_t> shape;
    std::vector<uint64_t> strides;
    uint64_t elementSize = 0;
};

/// Tensor layouts for ComputeClient::emptyTensor.
enum class TensorLayout { Contiguous, Optimized };

} // namespace backplane
