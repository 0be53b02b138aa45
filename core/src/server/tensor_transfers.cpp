// ComputeServer strided transfers: a tensor of any strides read into, or written from, contiguous
// row-major host memory (the seed's CopyDescriptor).
#include "server/compute_server.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>

#include <unistd.h>

namespace backplane::detail {
namespace {

/// One contiguous piece of a tensor: `bytes` at `device` in the buffer, at `host` in the packed
/// row-major copy.
struct Run {
    uint64_t device = 0;
    uint64_t host = 0;
    uint64_t bytes = 0;
};

[[noreturn]] void invalid(const char *what, const std::string &why) {
    throw Error(ErrorCode::InvalidArgument, std::string(what) + ": " + why);
}

/// Checks the descriptor against its buffer and returns the packed size in bytes. Overflow and a
/// last element past the buffer are InvalidArgument; `forWrite` also refuses tensors whose
/// elements overlap (a stride too small for the extents inside it), as their result would
/// depend on the order of the copies.
uint64_t checkTensor(const Tensor &t, const char *what, bool forWrite) {
    if (!t.buffer) invalid(what, "the tensor's Buffer is empty");
    if (t.elementSize == 0) invalid(what, "elementSize is 0");
    if (t.shape.size() != t.strides.size())
        invalid(what, "shape has " + std::to_string(t.shape.size()) + " dimensions, strides " +
                          std::to_string(t.strides.size()));
    uint64_t elements = 1;
    uint64_t lastElement = 0; // in elements
    for (size_t i = 0; i < t.shape.size(); ++i) {
        const uint64_t extent = t.shape[i];
        if (extent == 0) return 0;
        if (elements > UINT64_MAX / extent) invalid(what, "the shape's element count overflows");
        elements *= extent;
        if (t.strides[i] != 0 && extent - 1 > (UINT64_MAX - lastElement) / t.strides[i])
            invalid(what, "the strides overflow 64 bits");
        lastElement += (extent - 1) * t.strides[i];
    }
    if (elements > UINT64_MAX / t.elementSize || lastElement >= UINT64_MAX / t.elementSize)
        invalid(what, "the tensor's bytes overflow 64 bits");
    const uint64_t end = (lastElement + 1) * t.elementSize;
    if (end > t.buffer.size())
        invalid(what, "its last element ends at byte " + std::to_string(end) + ", past the " +
                          std::to_string(t.buffer.size()) + "-byte buffer");
    if (forWrite) {
        // Dimensions by stride: each must step over everything the smaller ones span.
        std::vector<size_t> order(t.shape.size());
        std::iota(order.begin(), order.end(), size_t{0});
        std::sort(order.begin(), order.end(),
                  [&](size_t a, size_t b) { return t.strides[a] < t.strides[b]; });
        uint64_t span = 1; // elements spanned by the dimensions so far
        for (size_t i : order) {
            if (t.shape[i] == 1) continue;
            if (t.strides[i] < span)
                invalid(what, "dimension " + std::to_string(i) + " (stride " +
                                  std::to_string(t.strides[i]) +
                                  ") overlaps the dimensions inside it; a tensor written to must "
                                  "not have overlapping elements");
            span = t.strides[i] * (t.shape[i] - 1) + span;
        }
    }
    return elements * t.elementSize;
}

/// The tensor as contiguous runs in row-major order of its elements, adjacent runs merged.
std::vector<Run> runsOf(const Tensor &t) {
    std::vector<Run> runs;
    const size_t dims = t.shape.size();
    const uint64_t es = t.elementSize;
    if (dims == 0) {
        runs.push_back({0, 0, es});
        return runs;
    }
    const bool innerPacked = t.strides[dims - 1] == 1;
    const uint64_t inner = t.shape[dims - 1];
    std::vector<uint64_t> index(dims, 0);
    uint64_t host = 0;
    const auto push = [&](uint64_t device, uint64_t bytes) {
        if (!runs.empty() && runs.back().device + runs.back().bytes == device)
            runs.back().bytes += bytes;
        else
            runs.push_back({device, host, bytes});
        host += bytes;
    };
    while (true) {
        uint64_t base = 0;
        for (size_t i = 0; i + 1 < dims; ++i) base += index[i] * t.strides[i];
        if (innerPacked) {
            push(base * es, inner * es);
        } else {
            for (uint64_t j = 0; j < inner; ++j) push((base + j * t.strides[dims - 1]) * es, es);
        }
        // Next index of the outer dimensions (odometer).
        size_t d = dims - 1;
        while (d > 0) {
            --d;
            if (++index[d] < t.shape[d]) break;
            index[d] = 0;
            if (d == 0) return runs;
        }
        if (dims == 1) return runs;
    }
}

/// Whether the elements are packed row-major from the buffer's start (one plain transfer).
bool isPacked(const Tensor &t) {
    uint64_t expected = 1;
    for (size_t i = t.shape.size(); i-- > 0;) {
        if (t.shape[i] != 1 && t.strides[i] != expected) return false;
        expected *= t.shape[i];
    }
    return true;
}

/// Packs the tensor's elements from `span` (its bytes from the buffer's start) into `out`, in
/// row-major order: a row at a time where the last dimension is contiguous, else an element at
/// a time. Walks the indices; allocates nothing per element (a broadcast of many elements
/// costs only its output).
void gather(const Tensor &t, const std::byte *span, std::byte *out) {
    const size_t dims = t.shape.size();
    const uint64_t es = t.elementSize;
    if (dims == 0) {
        std::memcpy(out, span, es);
        return;
    }
    const uint64_t inner = t.shape[dims - 1];
    const uint64_t innerStride = t.strides[dims - 1];
    std::vector<uint64_t> index(dims, 0);
    while (true) {
        uint64_t base = 0;
        for (size_t i = 0; i + 1 < dims; ++i) base += index[i] * t.strides[i];
        if (innerStride == 1) {
            std::memcpy(out, span + base * es, inner * es);
            out += inner * es;
        } else {
            for (uint64_t j = 0; j < inner; ++j, out += es)
                std::memcpy(out, span + (base + j * innerStride) * es, es);
        }
        size_t d = dims - 1;
        while (d > 0) {
            --d;
            if (++index[d] < t.shape[d]) break;
            index[d] = 0;
            if (d == 0) return;
        }
        if (dims == 1) return;
    }
}

} // namespace

ReadFuture ComputeServer::readTensor(StreamId stream, const Tensor &tensor) {
    refuseWhileRecording(stream, "readTensor()");
    const uint64_t packed = checkTensor(tensor, "readTensor", false);
    if (packed == 0) return ReadFuture([] { return std::vector<std::byte>{}; });
    uint64_t last = 0;
    for (size_t i = 0; i < tensor.shape.size(); ++i)
        last += (tensor.shape[i] - 1) * tensor.strides[i];
    const uint64_t span = (last + 1) * tensor.elementSize;
    // Only the tensor's own bytes must hold valid data, not the gaps between its rows. The runs
    // are listed only when its span holds poison, and after the size checks below (a broadcast
    // has a run per element).
    const auto refusePoisonedRuns = [&] {
        Slice &slice = *sliceOf(tensor.buffer, "readTensor");
        const uint64_t base = tensor.buffer.offset();
        if (!slice.poison.any() || !slice.poison.find(base, base + span).why) return;
        for (const Run &r : runsOf(tensor))
            refusePoisoned(slice, base + r.device, base + r.device + r.bytes, "readTensor");
    };
    if (isPacked(tensor)) {
        refusePoisonedRuns();
        return read(stream, tensor.buffer, 0, packed, true);
    }
    // One read of the whole span (one transfer beats one per row), packed on the host. The
    // result is allocated now: a tensor too large for host memory (a broadcast of a few bytes to
    // terabytes) fails here with Error(OutOfMemory), before anything is transferred.
    // More than the machine's memory is refused before asking the allocator (which, under a
    // sanitizer, aborts on absurd sizes instead of throwing); the rest may still not fit.
    const auto tooLarge = [&] {
        return Error(ErrorCode::OutOfMemory,
                     "readTensor: the packed result has " + std::to_string(packed) +
                         " bytes, more than host memory can hold; read the tensor in parts "
                         "(a view of fewer rows) or without the broadcast dimensions");
    };
    const long pages = ::sysconf(_SC_PHYS_PAGES), pageSize = ::sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && pageSize > 0 && packed / static_cast<uint64_t>(pageSize) >= static_cast<uint64_t>(pages))
        throw tooLarge();
    std::shared_ptr<std::vector<std::byte>> out;
    try {
        out = std::make_shared<std::vector<std::byte>>(packed);
    } catch (const std::exception &) { // std::bad_alloc, std::length_error
        throw tooLarge();
    }
    try {
        refusePoisonedRuns();
    } catch (const std::bad_alloc &) { // the list of runs of a large broadcast
        throw tooLarge();
    }
    auto whole = std::make_shared<ReadFuture>(read(stream, tensor.buffer, 0, span, true));
    return ReadFuture([whole, out, tensor] {
        const std::vector<std::byte> bytes = whole->wait();
        gather(tensor, bytes.data(), out->data());
        return std::move(*out);
    });
}

void ComputeServer::writeTensor(StreamId stream, const Tensor &tensor, const void *data,
                                uint64_t size) {
    refuseWhileRecording(stream, "writeTensor()");
    const uint64_t packed = checkTensor(tensor, "writeTensor", true);
    if (size != packed)
        invalid("writeTensor", "the host data has " + std::to_string(size) +
                                   " bytes, the tensor's elements " + std::to_string(packed));
    if (packed == 0) return;
    if (data == nullptr) invalid("writeTensor", "the host pointer is null");
    // One stream-ordered write per run: the bytes between rows (padding, or other data of a
    // larger tensor) are never touched.
    const auto *bytes = static_cast<const std::byte *>(data);
    const std::vector<Run> runs = runsOf(tensor);
    // A failure part-way poisons every run, also those after it that were never issued.
    Slice *slice = sliceOf(tensor.buffer, "writeTensor").get();
    std::vector<SliceRange> written;
    written.reserve(runs.size());
    for (const Run &r : runs)
        written.push_back({slice, tensor.buffer.offset() + r.device,
                           tensor.buffer.offset() + r.device + r.bytes});
    issueWriting(written, slotOf(stream), [] { return std::string("writeTensor"); }, [&] {
        for (const Run &r : runs) write(stream, tensor.buffer, r.device, bytes + r.host, r.bytes);
    });
}

} // namespace backplane::detail
