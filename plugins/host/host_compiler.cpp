// The host plugin's C++ compiler: find it, run it on a generated source, load what it made.
#include "host_compiler.hpp"

#include <backplane/abi/plugin_sdk.hpp>

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

extern char **environ;

namespace backplane::host {
namespace {

constexpr char kMagic[8] = {'B', 'P', 'C', 'X', 'X', 'S', 'O', '1'};
constexpr size_t kFingerprintChars = 16;
constexpr size_t kMaxLogBytes = size_t{1} << 20;

[[noreturn]] void compileError(const std::string &message) {
    throw sdk::Error(BP_ERROR_COMPILE, message);
}

uint64_t fnv1a(std::string_view text, uint64_t h = 0xcbf29ce484222325ull) {
    for (unsigned char c : text) {
        h ^= c;
        h *= 0x100000001b3ull;
    }
    return h;
}

bool executable(const std::string &path) {
    struct stat st {};
    return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

/// `name` if it holds a '/', else its first match on PATH; "" when none.
std::string findProgram(const std::string &name) {
    if (name.find('/') != std::string::npos) return executable(name) ? name : "";
    const char *path = std::getenv("PATH");
    if (path == nullptr) return "";
    std::stringstream dirs(path);
    std::string dir;
    while (std::getline(dirs, dir, ':')) {
        if (dir.empty()) continue;
        const std::string candidate = dir + "/" + name;
        if (executable(candidate)) return candidate;
    }
    return "";
}

/// Runs `argv` with stdout and stderr into `output` (at most kMaxLogBytes kept); returns the
/// exit status, or -1 when it could not start or died of a signal. posix_spawn, not fork: the
/// process has other threads.
int runProcess(const std::vector<std::string> &argv, std::string &output) {
    output.clear();
    int pipeFds[2];
    if (::pipe2(pipeFds, O_CLOEXEC) != 0) {
        output = std::string("pipe: ") + std::strerror(errno);
        return -1;
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, pipeFds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, pipeFds[1], 2);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    std::vector<char *> args;
    for (const std::string &a : argv) args.push_back(const_cast<char *>(a.c_str()));
    args.push_back(nullptr);
    pid_t pid = 0;
    const int spawned = ::posix_spawn(&pid, args[0], &actions, nullptr, args.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    ::close(pipeFds[1]);
    if (spawned != 0) {
        ::close(pipeFds[0]);
        output = argv[0] + ": " + std::strerror(spawned);
        return -1;
    }
    char buffer[4096];
    for (;;) {
        const ssize_t n = ::read(pipeFds[0], buffer, sizeof buffer);
        if (n > 0) {
            if (output.size() < kMaxLogBytes) output.append(buffer, static_cast<size_t>(n));
            continue;
        }
        if (n < 0 && errno == EINTR) continue;
        break;
    }
    ::close(pipeFds[0]);
    int status = 0;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// The CPU as the compiler's -march=native sees it: model and feature flags.
std::string cpuIdentity() {
    std::ifstream in("/proc/cpuinfo");
    std::string line, model, flags;
    while (std::getline(in, line) && (model.empty() || flags.empty())) {
        if (model.empty() && line.rfind("model name", 0) == 0) model = line;
        if (flags.empty() && (line.rfind("flags", 0) == 0 || line.rfind("Features", 0) == 0))
            flags = line;
    }
    return model + "\n" + flags;
}

std::string firstLine(const std::string &text) {
    const size_t end = text.find('\n');
    return text.substr(0, end);
}

/// A temporary directory, removed with what is in it.
class TempDir {
public:
    TempDir() {
        const char *base = std::getenv("TMPDIR");
        std::string pattern = std::string(base && *base ? base : "/tmp") + "/backplane-cxx-XXXXXX";
        if (::mkdtemp(pattern.data()) == nullptr)
            compileError("cannot create a temporary directory " + pattern + " for the compiler: " +
                         std::strerror(errno) + " (set TMPDIR to a writable directory)");
        path_ = pattern;
    }
    ~TempDir() {
        for (const std::string &f : files_) ::unlink(f.c_str());
        ::rmdir(path_.c_str());
    }
    TempDir(const TempDir &) = delete;
    TempDir &operator=(const TempDir &) = delete;
    std::string file(const std::string &name) {
        files_.push_back(path_ + "/" + name);
        return files_.back();
    }

private:
    std::string path_;
    std::vector<std::string> files_;
};

bool writeFile(const std::string &path, const void *data, size_t size) {
    std::ofstream out(path, std::ios::binary);
    out.write(static_cast<const char *>(data), static_cast<std::streamsize>(size));
    return static_cast<bool>(out);
}

/// A file name made of the entry point (an identifier already; anything else becomes '_').
std::string fileStem(const std::string &entry) {
    std::string stem;
    for (char c : entry.substr(0, 100))
        stem += (std::isalnum(static_cast<unsigned char>(c)) || c == '_') ? c : '_';
    return stem.empty() ? "kernel" : stem;
}

/// A 64-bit ELF shared object of this machine whose headers and loaded segments lie inside
/// `size` bytes (the cache may be shared, and a truncated object would fault inside dlopen).
bool plausibleObject(const unsigned char *data, size_t size) {
    Elf64_Ehdr header;
    if (data == nullptr || size < sizeof header) return false;
    std::memcpy(&header, data, sizeof header);
    if (std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 || header.e_ident[EI_CLASS] != ELFCLASS64 ||
        header.e_type != ET_DYN)
        return false;
#if defined(__x86_64__)
    if (header.e_machine != EM_X86_64) return false;
#elif defined(__aarch64__)
    if (header.e_machine != EM_AARCH64) return false;
#endif
    const auto inside = [size](uint64_t offset, uint64_t bytes) {
        return offset <= size && bytes <= size - offset;
    };
    if (header.e_phentsize != sizeof(Elf64_Phdr) ||
        !inside(header.e_phoff, uint64_t{header.e_phnum} * sizeof(Elf64_Phdr)))
        return false;
    if (header.e_shnum != 0 &&
        !inside(header.e_shoff, uint64_t{header.e_shnum} * header.e_shentsize))
        return false;
    for (uint16_t i = 0; i < header.e_phnum; ++i) {
        Elf64_Phdr segment;
        std::memcpy(&segment, data + header.e_phoff + size_t{i} * sizeof segment, sizeof segment);
        if (segment.p_type == PT_LOAD && !inside(segment.p_offset, segment.p_filesz)) return false;
    }
    return true;
}

} // namespace

LoadedObject::~LoadedObject() {
    if (handle_ != nullptr) ::dlclose(handle_);
}

HostCompiler::HostCompiler(const HostOptions &options) : options_(options) {}

const std::vector<std::string> &HostCompiler::flags() {
    // No contraction (a*b+c rounds twice, as on every target), wrapping integers, no errno from
    // sqrt, and the float functions called (not folded at compile time) so that they give the
    // interpreter's bits. Integer x / 0 is handled by the generated code.
    static const std::vector<std::string> kFlags = {
        "-std=c++17",         "-O3",
        "-march=native",      "-shared",
        "-fPIC",              "-fno-math-errno",
        "-ffp-contract=off",  "-fwrapv",
        "-fno-builtin-sinf",  "-fno-builtin-cosf",
        "-fno-builtin-tanhf", "-fno-builtin-expf",
        "-fno-builtin-logf",  "-fno-builtin-powf",
        "-fvisibility=hidden", "-w"};
    return kFlags;
}

const HostCompiler::Identity &HostCompiler::identity() const {
    std::call_once(found_, [this] {
        Identity id;
        if (!options_.compileKernels) {
            id.description = "the host plugin's \"compile_kernels\" option is false";
            identity_ = id;
            return;
        }
        std::vector<std::string> names;
        std::string origin;
        if (!options_.compiler.empty()) {
            names = {options_.compiler};
            origin = "the host plugin's \"compiler\" option";
        } else if (const char *env = std::getenv("BACKPLANE_HOST_CXX"); env && *env) {
            names = {env};
            origin = "BACKPLANE_HOST_CXX";
        } else {
            names = {"c++", "g++", "clang++"};
            origin = "PATH";
        }
        for (const std::string &name : names) {
            id.path = findProgram(name);
            if (!id.path.empty()) break;
        }
        if (id.path.empty()) {
            std::string tried;
            for (const std::string &n : names) tried += (tried.empty() ? "" : ", ") + n;
            id.description = "no C++ compiler found (" + tried + " from " + origin +
                             "); install g++, or set BACKPLANE_HOST_CXX or the host plugin's "
                             "\"compiler\" option";
            identity_ = id;
            return;
        }
        std::string version;
        const int status = runProcess({id.path, "--version"}, version);
        if (status != 0) {
            id.description = "the C++ compiler " + id.path + " (from " + origin +
                             ") failed to run --version (status " + std::to_string(status) +
                             "): " + firstLine(version);
            id.path.clear();
            identity_ = id;
            return;
        }
        std::string all = version + '\0';
        for (const std::string &f : flags()) all += f + ' ';
        all += '\0' + cpuIdentity();
        char hex[kFingerprintChars + 1];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(fnv1a(all)));
        id.available = true;
        id.fingerprint = hex;
        id.description = firstLine(version) + " (" + id.path + ")";
        identity_ = id;
    });
    return identity_;
}

std::vector<unsigned char> HostCompiler::compile(const std::string &entry, std::string_view source,
                                                 const std::vector<std::string> &options,
                                                 std::string &log) const {
    const Identity &id = identity();
    if (!id.available)
        throw sdk::Error(BP_ERROR_UNSUPPORTED, "kernel_compile of '" + entry +
                                                   "': the host plugin compiles no C++ here: " +
                                                   id.description);
    TempDir dir;
    const std::string stem = fileStem(entry);
    const std::string sourceFile = dir.file(stem + ".cpp");
    const std::string objectFile = dir.file(stem + ".so");
    if (!writeFile(sourceFile, source.data(), source.size()))
        compileError("kernel_compile of '" + entry + "': cannot write " + sourceFile);
    std::vector<std::string> argv = {id.path};
    argv.insert(argv.end(), flags().begin(), flags().end());
    argv.insert(argv.end(), options.begin(), options.end());
    argv.insert(argv.end(), {"-o", objectFile, sourceFile});
    const int status = runProcess(argv, log);
    if (status != 0)
        compileError("kernel '" + entry + "': " + id.path + " failed (status " +
                     std::to_string(status) + "):\n" + log);
    std::ifstream in(objectFile, std::ios::binary);
    const std::vector<unsigned char> object((std::istreambuf_iterator<char>(in)),
                                            std::istreambuf_iterator<char>());
    if (!plausibleObject(object.data(), object.size()))
        compileError("kernel '" + entry + "': " + id.path + " wrote no shared object " + objectFile);
    std::vector<unsigned char> blob(kMagic, kMagic + sizeof kMagic);
    blob.insert(blob.end(), id.fingerprint.begin(), id.fingerprint.end());
    const auto length = static_cast<uint32_t>(entry.size());
    const auto *lengthBytes = reinterpret_cast<const unsigned char *>(&length);
    blob.insert(blob.end(), lengthBytes, lengthBytes + sizeof length);
    blob.insert(blob.end(), entry.begin(), entry.end());
    blob.insert(blob.end(), object.begin(), object.end());
    return blob;
}

std::shared_ptr<LoadedObject> HostCompiler::load(const std::string &entry, const void *blob,
                                                 size_t size) const {
    const Identity &id = identity();
    const auto *bytes = static_cast<const unsigned char *>(blob);
    const std::string what = "kernel_load of '" + entry + "'";
    if (!id.available)
        throw sdk::Error(BP_ERROR_UNSUPPORTED,
                         what + ": the host plugin loads no compiled kernels here: " + id.description);
    constexpr size_t kHeader = sizeof kMagic + kFingerprintChars + sizeof(uint32_t);
    if (bytes == nullptr || size < kHeader || std::memcmp(bytes, kMagic, sizeof kMagic) != 0)
        compileError(what + ": not a blob of the host plugin's compiler");
    const std::string fingerprint(reinterpret_cast<const char *>(bytes) + sizeof kMagic,
                                  kFingerprintChars);
    if (fingerprint != id.fingerprint)
        compileError(what + ": compiled by another compiler or for another CPU (fingerprint " +
                     fingerprint + ", here " + id.fingerprint + ")");
    uint32_t length = 0;
    std::memcpy(&length, bytes + sizeof kMagic + kFingerprintChars, sizeof length);
    if (length > size - kHeader ||
        std::string_view(reinterpret_cast<const char *>(bytes) + kHeader, length) != entry)
        compileError(what + ": the blob holds another kernel");
    const unsigned char *object = bytes + kHeader + length;
    const size_t objectSize = size - kHeader - length;
    if (!plausibleObject(object, objectSize))
        compileError(what + ": the blob's shared object is not a whole ELF object of this machine");

    // From a temporary file of a unique name, removed once loaded. Not a memfd's
    // "/proc/self/fd/N": the dynamic loader knows objects by name, and an object it keeps (a
    // kernel still loaded, or one it did not unload) would be returned again for a reused N.
    const char *base = std::getenv("TMPDIR");
    std::string path = std::string(base && *base ? base : "/tmp") + "/backplane-" +
                       fileStem(entry).substr(0, 40) + "-XXXXXX.so";
    const int fd = ::mkstemps(path.data(), 3);
    if (fd < 0)
        compileError(what + ": cannot create " + path + ": " + std::strerror(errno) +
                     " (set TMPDIR to a writable directory)");
    size_t written = 0;
    while (written < objectSize) {
        const ssize_t n = ::write(fd, object + written, objectSize - written);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        written += static_cast<size_t>(n);
    }
    ::close(fd);
    void *handle = written == objectSize ? ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL) : nullptr;
    const char *openError = handle == nullptr ? ::dlerror() : nullptr;
    const std::string openMessage =
        written != objectSize ? "cannot write " + path : openError ? openError : "dlopen failed";
    ::unlink(path.c_str());
    if (handle == nullptr) compileError(what + ": " + openMessage);
    ::dlerror();
    void *symbol = ::dlsym(handle, entry.c_str());
    if (symbol == nullptr) {
        ::dlclose(handle);
        compileError(what + ": the shared object has no function " + entry);
    }
    bp_host_kernel_fn fn = nullptr;
    static_assert(sizeof fn == sizeof symbol);
    std::memcpy(&fn, &symbol, sizeof fn);
    bp_host_kernel_runs_fn runs = nullptr; // optional: absent from older or hand-written sources
    if (void *runsSymbol = ::dlsym(handle, (entry + BP_CPP_RUNS_SUFFIX).c_str()))
        std::memcpy(&runs, &runsSymbol, sizeof runs);
    return std::make_shared<LoadedObject>(handle, fn, runs);
}

} // namespace backplane::host
