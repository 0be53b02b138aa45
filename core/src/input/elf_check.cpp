// ELF header checks before dlopen: class, byte order, machine, type, and the file's length
// against every offset its headers name.
#include "elf_check.hpp"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <vector>

namespace backplane::detail {
namespace {

#if defined(__x86_64__)
constexpr uint16_t kProcessMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kProcessMachine = EM_AARCH64;
#elif defined(__i386__)
constexpr uint16_t kProcessMachine = EM_386;
#elif defined(__arm__)
constexpr uint16_t kProcessMachine = EM_ARM;
#elif defined(__riscv)
constexpr uint16_t kProcessMachine = EM_RISCV;
#elif defined(__powerpc64__)
constexpr uint16_t kProcessMachine = EM_PPC64;
#elif defined(__s390x__)
constexpr uint16_t kProcessMachine = EM_S390;
#else
constexpr uint16_t kProcessMachine = EM_NONE; // unknown: the machine check is skipped
#endif

constexpr unsigned char kProcessClass = sizeof(void *) == 8 ? ELFCLASS64 : ELFCLASS32;
constexpr unsigned char kProcessData =
    __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__ ? ELFDATA2LSB : ELFDATA2MSB;

bool readExactly(const ReadAt &read, uint64_t offset, void *out, size_t size) {
    auto *bytes = static_cast<unsigned char *>(out);
    size_t done = 0;
    while (done < size) {
        const size_t n = read(offset + done, bytes + done, size - done);
        if (n == 0) return false;
        done += n;
    }
    return true;
}

/// What a non-ELF file looks like, from its first bytes.
std::string lookalike(const unsigned char *head, size_t size) {
    const std::string text(reinterpret_cast<const char *>(head), size);
    if (text.rfind("!<arch>", 0) == 0) return "a static archive (.a), not a shared library";
    if (text.rfind("#!", 0) == 0) return "a script, not a shared library";
    if (text.find("GROUP") != std::string::npos || text.find("INPUT") != std::string::npos)
        return "a linker script (such as the libfoo.so of a -dev package), not a shared library";
    if (text.rfind("MZ", 0) == 0) return "a Windows executable or DLL, not an ELF shared library";
    if (size >= 4 && (std::memcmp(head, "\xcf\xfa\xed\xfe", 4) == 0 ||
                      std::memcmp(head, "\xca\xfe\xba\xbe", 4) == 0))
        return "a macOS Mach-O file, not an ELF shared library";
    std::string shown;
    for (size_t i = 0; i < size && i < 8; ++i) {
        const unsigned char c = head[i];
        if (std::isprint(c) && c != '"' && c != '\\') {
            shown += static_cast<char>(c);
        } else {
            static const char *hex = "0123456789abcdef";
            shown += "\\x";
            shown += hex[c >> 4];
            shown += hex[c & 15];
        }
    }
    return "not an ELF shared library (it starts with \"" + shown + "\")";
}

std::string typeProblem(uint16_t type) {
    switch (type) {
    case ET_EXEC: return "an executable, not a shared library (link it with -shared)";
    case ET_REL: return "an object file (.o), not a shared library (link it with -shared)";
    case ET_CORE: return "a core dump, not a shared library";
    default: return "an ELF file of type " + std::to_string(type) + ", not a shared library";
    }
}

/// Where an extent [offset, offset + size) ends, or nullopt on overflow.
std::optional<uint64_t> endOf(uint64_t offset, uint64_t size) {
    uint64_t end = 0;
    if (__builtin_add_overflow(offset, size, &end)) return std::nullopt;
    return end;
}

template <class Ehdr, class Phdr, class Shdr>
std::optional<std::string> checkNative(const ReadAt &read, uint64_t fileSize) {
    Ehdr header{};
    if (fileSize < sizeof(Ehdr) || !readExactly(read, 0, &header, sizeof(Ehdr)))
        return "truncated: " + groupedNumber(fileSize) + " of " + groupedNumber(sizeof(Ehdr)) +
               " bytes (the ELF header alone needs " + std::to_string(sizeof(Ehdr)) + ")";
    if (kProcessMachine != EM_NONE && header.e_machine != kProcessMachine)
        return "built for " + elfMachineName(header.e_machine) + ", this process is " +
               elfMachineName(kProcessMachine) + "; install the " +
               elfMachineName(kProcessMachine) + " build of this plugin";
    if (header.e_type != ET_DYN) return typeProblem(header.e_type);

    uint64_t needed = sizeof(Ehdr);
    std::string neededBy = "the ELF header";
    const auto need = [&](std::optional<uint64_t> end, const std::string &what) {
        const uint64_t value = end.value_or(UINT64_MAX);
        if (value > needed) {
            needed = value;
            neededBy = what;
        }
    };
    if (header.e_phnum == PN_XNUM)
        return std::string("a corrupt or unsupported ELF file: more than 65,534 program headers");
    if (header.e_phnum > 0) {
        if (header.e_phentsize < sizeof(Phdr))
            return "a corrupt ELF file: program header entries of " +
                   std::to_string(header.e_phentsize) + " bytes (at least " +
                   std::to_string(sizeof(Phdr)) + " expected)";
        const uint64_t tableBytes = uint64_t{header.e_phnum} * header.e_phentsize;
        need(endOf(header.e_phoff, tableBytes), "its program headers");
        if (needed <= fileSize) {
            for (uint16_t i = 0; i < header.e_phnum; ++i) {
                Phdr ph{};
                if (!readExactly(read, header.e_phoff + uint64_t{i} * header.e_phentsize, &ph,
                                 sizeof(Phdr)))
                    break;
                if (ph.p_type == PT_NULL) continue;
                need(endOf(ph.p_offset, ph.p_filesz), "segment " + std::to_string(i));
            }
        }
    }
    if (header.e_shnum > 0 && header.e_shoff != 0) {
        if (header.e_shentsize < sizeof(Shdr))
            return "a corrupt ELF file: section header entries of " +
                   std::to_string(header.e_shentsize) + " bytes (at least " +
                   std::to_string(sizeof(Shdr)) + " expected)";
        need(endOf(header.e_shoff, uint64_t{header.e_shnum} * header.e_shentsize),
             "its section headers");
    }
    if (needed > fileSize) {
        // Beyond any real library (1 TiB): a corrupt header, not a short copy.
        if (needed == UINT64_MAX || needed > (uint64_t{1} << 40))
            return "a corrupt ELF file: " + neededBy + " would end at byte " +
                   groupedNumber(needed) + " of a " + groupedNumber(fileSize) + "-byte file";
        return "truncated: " + groupedNumber(fileSize) + " of " + groupedNumber(needed) +
               " bytes (" + neededBy + " end beyond the end of the file; copy or install it "
               "again)";
    }
    return std::nullopt;
}

} // namespace

std::string groupedNumber(uint64_t n) {
    const std::string digits = std::to_string(n);
    std::string out;
    for (size_t i = 0; i < digits.size(); ++i) {
        if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
        out += digits[i];
    }
    return out;
}

std::string elfMachineName(uint16_t machine) {
    switch (machine) {
    case EM_X86_64: return "x86-64";
    case EM_AARCH64: return "aarch64";
    case EM_386: return "i386";
    case EM_ARM: return "32-bit ARM";
    case EM_RISCV: return "RISC-V";
    case EM_PPC64: return "ppc64";
    case EM_PPC: return "ppc";
    case EM_S390: return "s390x";
    case EM_MIPS: return "MIPS";
    case EM_SPARCV9: return "SPARC v9";
    case 258: return "LoongArch";
    case EM_NONE: return "no machine (EM_NONE)";
    default: return "machine " + std::to_string(machine);
    }
}

std::optional<std::string> elfImageProblem(const ReadAt &read, uint64_t fileSize) {
    if (fileSize == 0) return std::string("empty (0 bytes), not a shared library");
    unsigned char ident[EI_NIDENT] = {};
    const size_t headBytes = fileSize < EI_NIDENT ? static_cast<size_t>(fileSize) : EI_NIDENT;
    if (!readExactly(read, 0, ident, headBytes))
        return std::string("unreadable: the file ended while reading its first bytes");
    if (headBytes < SELFMAG || std::memcmp(ident, ELFMAG, SELFMAG) != 0)
        return lookalike(ident, headBytes);
    if (headBytes < EI_NIDENT)
        return "truncated: " + groupedNumber(fileSize) + " of at least " +
               std::to_string(EI_NIDENT) + " bytes (the ELF identification alone needs " +
               std::to_string(EI_NIDENT) + ")";
    const unsigned char fileClass = ident[EI_CLASS];
    if (fileClass != ELFCLASS32 && fileClass != ELFCLASS64)
        return "a corrupt ELF file: unknown class " + std::to_string(fileClass);
    if (fileClass != kProcessClass)
        return std::string("built for ") + (fileClass == ELFCLASS32 ? "32-bit" : "64-bit") +
               " (ELFCLASS" + (fileClass == ELFCLASS32 ? "32" : "64") + "), this process is " +
               (kProcessClass == ELFCLASS32 ? "32-bit" : "64-bit");
    if (ident[EI_DATA] != kProcessData)
        return std::string("built for a ") +
               (ident[EI_DATA] == ELFDATA2MSB ? "big-endian" : "little-endian") +
               " machine, this process is " +
               (kProcessData == ELFDATA2MSB ? "big-endian" : "little-endian");
    if constexpr (sizeof(void *) == 8)
        return checkNative<Elf64_Ehdr, Elf64_Phdr, Elf64_Shdr>(read, fileSize);
    else
        return checkNative<Elf32_Ehdr, Elf32_Phdr, Elf32_Shdr>(read, fileSize);
}

std::optional<std::string> libraryFileProblem(const std::filesystem::path &file) {
    const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        const int error = errno;
        if (error == ENOENT) return std::string("does not exist");
        if (error == EACCES) return std::string("cannot be read (permission denied)");
        return std::string("cannot be opened: ") + std::strerror(error);
    }
    struct stat st {};
    std::optional<std::string> problem;
    if (::fstat(fd, &st) != 0) {
        problem = std::string("cannot be examined: ") + std::strerror(errno);
    } else if (S_ISDIR(st.st_mode)) {
        problem = "a directory, not a shared library";
    } else if (!S_ISREG(st.st_mode)) {
        problem = "not a regular file (a device, pipe or socket), not a shared library";
    } else {
        const ReadAt read = [fd](uint64_t offset, void *out, size_t size) -> size_t {
            for (;;) {
                const ssize_t n = ::pread(fd, out, size, static_cast<off_t>(offset));
                if (n >= 0) return static_cast<size_t>(n);
                if (errno != EINTR) return 0;
            }
        };
        problem = elfImageProblem(read, static_cast<uint64_t>(st.st_size));
    }
    ::close(fd);
    return problem;
}

} // namespace backplane::detail
