// Checking a plugin library's ELF headers before dlopen, so a foreign or truncated file becomes
// a sentence instead of a misleading loader message or a SIGBUS.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <string>

namespace backplane::detail {

/// Reads up to `size` bytes at `offset` into `out`; returns how many it read (0 at end of file).
using ReadAt = std::function<size_t(uint64_t offset, void *out, size_t size)>;

/// Why an image of `fileSize` bytes, read through `read`, cannot be a shared library for this
/// process: not ELF (with what it looks like instead), another class, byte order or machine
/// ("built for aarch64, this process is x86-64"), not a shared object, or shorter than its
/// program headers, segments and section headers say ("truncated: 40,000 of 1,234,567 bytes").
/// nullopt when nothing is wrong with the headers. Never reads outside [0, fileSize).
std::optional<std::string> elfImageProblem(const ReadAt &read, uint64_t fileSize);

/// elfImageProblem for a file; also names a missing file ("does not exist"), a directory, an
/// empty file and anything that is not a regular file. Each text reads after "cannot load FILE: ". Opens without blocking (a FIFO cannot hang it) and
/// never maps the file.
std::optional<std::string> libraryFileProblem(const std::filesystem::path &file);

/// The name of ELF machine `machine` as users know it ("x86-64", "aarch64"), or "machine N".
std::string elfMachineName(uint16_t machine);

/// `n` with thousands separators: 1234567 -> "1,234,567".
std::string groupedNumber(uint64_t n);

} // namespace backplane::detail
