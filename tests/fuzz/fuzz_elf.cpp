// Fuzzes the ELF pre-check run before dlopen (detail::elfImageProblem) with the bytes as the
// image: once whole, once as a file that shrank after its size was taken.
#include "fuzz_check.hpp"
#include "input/elf_check.hpp"

#include <algorithm>
#include <cstring>

namespace {

/// Checks `image` as a file of `claimedSize` bytes of which only image's are there; a read that
/// asks for bytes outside [0, claimedSize) breaks elfImageProblem's contract.
void check(const uint8_t *data, size_t size, uint64_t claimedSize) {
    const backplane::detail::ReadAt read = [&](uint64_t offset, void *out, size_t want) {
        if (offset > claimedSize || want > claimedSize - offset)
            backplane::fuzz::finding("ELF pre-check", "read outside [0, file size)");
        if (offset >= size) return size_t{0};
        const size_t n = std::min<uint64_t>(want, size - offset);
        std::memcpy(out, data + offset, n);
        return n;
    };
    backplane::fuzz::expectReturnOrError("ELF pre-check", [&] {
        const auto problem = backplane::detail::elfImageProblem(read, claimedSize);
        if (problem && problem->empty())
            backplane::fuzz::finding("ELF pre-check", "an empty problem text");
    });
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    check(data, size, size);
    check(data, size, uint64_t{size} + 4096);
    return 0;
}
