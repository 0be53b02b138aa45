// The loader fault matrix (issue 11): broken library files, hostile manifests and hostile plugins,
// each with its precise state and message, and the host plugin still running a kernel afterwards
// in the same process. Public API only (Runtime, Config, PluginReport).
//
// Every case builds its own search path: the files it needs (made in a scratch directory, or the
// hostile fixtures of HOSTILE_DIR named one by one) plus the build tree's host manifest. Crashing
// and hanging fixtures run with ProbeMode::Isolated only, where they are contained; every other
// case runs in both probe modes.
#include "../conformance/conformance_kernels.hpp"

#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <elf.h>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numeric>
#include <span>
#include <string>
#include <sys/resource.h>
#include <sys/wait.h>
#include <csignal>
#include <unistd.h>
#include <vector>

namespace fs = std::filesystem;
using backplane::Config;
using backplane::PluginReport;
using backplane::ProbeMode;
using backplane::Runtime;

namespace {

const fs::path kHostManifest = fs::path(PROJECT_BUILD_ROOT) / "plugins" / "host" / "host.json";
const fs::path kHostileDir = HOSTILE_DIR;
/// A well-formed fixture library to copy and damage.
const fs::path kSampleLibrary = fs::path(FIXTURE_DIR) / "fakecpu.so";
/// What a cached crash or timeout result's reason ends with (the contract's wording).
const std::string kCachedSuffix =
    " (cached from an earlier run; run `backplane cache clear probes` to probe again)";

constexpr ProbeMode kBothModes[] = {ProbeMode::Isolated, ProbeMode::InProcess};

/// What a report's `probe` field says for a probed plugin in `mode` with caching off.
std::string probedBy(ProbeMode mode) {
    return mode == ProbeMode::Isolated ? "isolated" : "in_process";
}

/// A scratch directory, removed at the end of the case.
class Scratch {
public:
    explicit Scratch(const std::string &name)
        : dir_(fs::temp_directory_path() /
               ("backplane-fault-matrix-" + name + "-" + std::to_string(getpid()))) {
        fs::remove_all(dir_);
        fs::create_directories(dir_);
    }
    ~Scratch() {
        std::error_code ignored;
        fs::remove_all(dir_, ignored);
    }
    Scratch(const Scratch &) = delete;
    Scratch &operator=(const Scratch &) = delete;
    const fs::path &dir() const { return dir_; }
    fs::path operator/(const std::string &name) const { return dir_ / name; }

private:
    fs::path dir_;
};

void writeFile(const fs::path &file, const std::string &text) {
    std::ofstream out(file, std::ios::binary | std::ios::trunc);
    out << text;
    REQUIRE_MESSAGE(out.good(), "cannot write " << file);
}

std::string readFile(const fs::path &file) {
    std::ifstream in(file, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// A manifest one line long (so JSON positions are on line 1) for plugin `name`; `description`
/// is raw JSON text.
std::string manifestText(const std::string &name, const std::string &library,
                         const std::string &description = "\"fault matrix fixture\"") {
    return R"({"name": ")" + name + R"(", "library": ")" + library +
           R"(", "abi_version": "1.0", "backend": "fake", "description": )" + description + "}";
}

/// Writes `<name>.json` naming `<name>.so` in `dir`; returns the manifest.
fs::path writeManifest(const fs::path &dir, const std::string &name) {
    const fs::path manifest = dir / (name + ".json");
    writeFile(manifest, manifestText(name, name + ".so"));
    return manifest;
}

/// `n` with thousands separators, as the reports write byte counts.
std::string grouped(uint64_t n) {
    std::string digits = std::to_string(n);
    for (int i = static_cast<int>(digits.size()) - 3; i > 0; i -= 3)
        digits.insert(i, ",");
    return digits;
}

/// How long the ELF file says it is: the furthest end of its program headers, segments and
/// section headers (what a truncated copy is measured against).
uint64_t elfDeclaredSize(const fs::path &file) {
    const std::string image = readFile(file);
    REQUIRE(image.size() >= sizeof(Elf64_Ehdr));
    Elf64_Ehdr header{};
    std::memcpy(&header, image.data(), sizeof header);
    uint64_t end = header.e_phoff + uint64_t{header.e_phnum} * header.e_phentsize;
    for (uint16_t i = 0; i < header.e_phnum; ++i) {
        Elf64_Phdr ph{};
        std::memcpy(&ph, image.data() + header.e_phoff + uint64_t{i} * header.e_phentsize,
                    sizeof ph);
        if (ph.p_type != PT_NULL) end = std::max<uint64_t>(end, ph.p_offset + ph.p_filesz);
    }
    if (header.e_shnum > 0 && header.e_shoff != 0)
        end =
            std::max<uint64_t>(end, header.e_shoff + uint64_t{header.e_shnum} * header.e_shentsize);
    return end;
}

/// Overwrites bytes of `file` at `offset`.
void patchFile(const fs::path &file, uint64_t offset, std::initializer_list<unsigned char> bytes) {
    std::fstream io(file, std::ios::binary | std::ios::in | std::ios::out);
    io.seekp(static_cast<std::streamoff>(offset));
    for (const unsigned char b : bytes)
        io.put(static_cast<char>(b));
    REQUIRE_MESSAGE(io.good(), "cannot patch " << file);
}

/// The config of one case: `entries` (manifest files or directories) then the host manifest.
Config caseConfig(std::vector<fs::path> entries, ProbeMode mode) {
    Config config;
    entries.push_back(kHostManifest);
    config.pluginPathOverride = std::move(entries);
    config.cacheEnabled = false;
    config.probeMode = mode;
    return config;
}

/// The same for a crashing or hanging fixture: isolated, with a one-second timeout.
Config isolatedConfig(std::vector<fs::path> entries) {
    Config config = caseConfig(std::move(entries), ProbeMode::Isolated);
    config.probeTimeoutMs = 1000;
    return config;
}

const PluginReport &reportOf(const Runtime &runtime, const fs::path &manifest) {
    const auto &reports = runtime.plugins();
    const auto it = std::find_if(reports.begin(), reports.end(),
                                 [&](const PluginReport &r) { return r.manifest == manifest; });
    REQUIRE_MESSAGE(it != reports.end(), "no report for " << manifest);
    return *it;
}

/// The report's state by its stable name (doctest cannot print the enum).
std::string stateOf(const PluginReport &report) { return backplane::toString(report.state); }

bool startsWith(const std::string &text, const std::string &prefix) {
    return text.rfind(prefix, 0) == 0;
}
bool endsWith(const std::string &text, const std::string &suffix) {
    return text.size() >= suffix.size() &&
           text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}
bool contains(const std::string &text, const std::string &part) {
    return text.find(part) != std::string::npos;
}

/// Is a file named `fileName` mapped into this process?
bool mapped(const std::string &fileName) {
    std::ifstream maps("/proc/self/maps");
    for (std::string line; std::getline(maps, line);)
        if (endsWith(line, "/" + fileName)) return true;
    return false;
}

/// The host plugin is loaded and runs saxpy through backplane::Runtime in this process.
void checkHostRunsKernel(const Runtime &runtime) {
    const auto &reports = runtime.plugins();
    const auto host = std::find_if(reports.begin(), reports.end(),
                                   [](const PluginReport &r) { return r.name == "host"; });
    REQUIRE_MESSAGE(host != reports.end(), "no report for the host plugin");
    REQUIRE_MESSAGE(stateOf(*host) == "loaded", "host: " << stateOf(*host) << ": " << host->reason);

    auto client = runtime.open(runtime.select("host:0"));
    constexpr uint32_t n = 1000;
    std::vector<float> x(n);
    std::vector<float> y(n);
    std::iota(x.begin(), x.end(), 0.0f);
    std::iota(y.begin(), y.end(), 1.0f);
    const auto bx = client.createFrom(std::span<const float>(x));
    const auto by = client.createFrom(std::span<const float>(y));
    client.execute(conformance::saxpyKernel(), conformance::saxpyDispatch(bx, by, 2.0f, n));
    const auto out = client.readAs<float>(by);
    REQUIRE(out.size() == n);
    size_t wrong = 0;
    for (uint32_t i = 0; i < n; ++i)
        if (out[i] != 2.0f * x[i] + y[i]) ++wrong;
    CHECK_MESSAGE(wrong == 0, wrong << " of " << n << " saxpy results are wrong on host:0");
}

/// Core dumps of the crashing fixtures' probe processes would only slow the tests down.
void noCoreDumps() {
    const rlimit none{0, 0};
    setrlimit(RLIMIT_CORE, &none);
}

// ----- broken library files --------------------------------------------------------------------

/// One broken library file: how to make it, and the problem the report must give after
/// "cannot load <library>: " (a prefix of it where the rest depends on the file).
struct FileCase {
    std::string name;
    void (*make)(const fs::path &library);
    std::string problem; ///< the whole problem text, or its beginning when `prefixOnly`
    bool prefixOnly = false;
};

void copySample(const fs::path &library) { fs::copy_file(kSampleLibrary, library); }

const std::vector<FileCase> &fileCases() {
    static const std::vector<FileCase> cases = {
        {"foreign_arch",
         [](const fs::path &library) {
             copySample(library);
             patchFile(library, 18, {EM_AARCH64, 0}); // e_machine, little-endian
         },
         "built for aarch64, this process is x86-64; install the x86-64 build of this plugin"},
        {"elf32",
         [](const fs::path &library) {
             copySample(library);
             patchFile(library, EI_CLASS, {ELFCLASS32});
         },
         "built for 32-bit (ELFCLASS32), this process is 64-bit"},
        {"empty", [](const fs::path &library) { writeFile(library, ""); },
         "empty (0 bytes), not a shared library"},
        {"directory", [](const fs::path &library) { fs::create_directory(library); },
         "a directory, not a shared library"},
        {"text", [](const fs::path &library) { writeFile(library, "hello, not a library\n"); },
         "not an ELF shared library (it starts with \"hello", true},
        {"linker_script",
         [](const fs::path &library) { writeFile(library, "GROUP ( libc.so.6 )\n"); },
         "a linker script", true},
    };
    return cases;
}

} // namespace

TEST_CASE("reports each broken library file in words before dlopen, in both probe modes") {
    REQUIRE_MESSAGE(fs::exists(kHostManifest), kHostManifest << " is not built");
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        for (const FileCase &c : fileCases()) {
            CAPTURE(c.name);
            Scratch scratch("file-" + c.name);
            const fs::path library = scratch / (c.name + ".so");
            c.make(library);
            const fs::path manifest = writeManifest(scratch.dir(), c.name);

            const Runtime runtime(caseConfig({manifest}, mode));
            const PluginReport &report = reportOf(runtime, manifest);
            CHECK(stateOf(report) == "library_load_failed");
            CHECK(report.library == library);
            const std::string expected = "cannot load " + library.string() + ": " + c.problem;
            if (c.prefixOnly)
                CHECK_MESSAGE(startsWith(report.reason, expected), "reason: " << report.reason);
            else
                CHECK(report.reason == expected);
            CHECK(report.probe == "");
            CHECK_FALSE(mapped(library.filename().string()));
            checkHostRunsKernel(runtime);
        }
    }
}

TEST_CASE("reports a truncated library with both sizes instead of dying of SIGBUS in dlopen") {
    const uint64_t fullSize = fs::file_size(kSampleLibrary);
    const uint64_t declared = elfDeclaredSize(kSampleLibrary);
    REQUIRE(fullSize > 50000); // debug build ~475 KB, release ~63 KB
    const std::string original = readFile(kSampleLibrary);
    // 40,000 bytes keep the ELF and program headers but (in this build) end inside the last
    // loadable segment, which dlopen maps and relocates (SIGBUS); half the file keeps every
    // segment and loses the section headers.
    for (const uint64_t kept : {uint64_t{40000}, fullSize / 2}) {
        CAPTURE(kept);
        for (const ProbeMode mode : kBothModes) {
            const std::string modeName = backplane::toString(mode);
            CAPTURE(modeName);
            Scratch scratch("truncated");
            const fs::path library = scratch / "truncated.so";
            writeFile(library, original.substr(0, kept));
            const fs::path manifest = writeManifest(scratch.dir(), "truncated");

            const Runtime runtime(caseConfig({manifest}, mode));
            const PluginReport &report = reportOf(runtime, manifest);
            CHECK(stateOf(report) == "library_load_failed");
            const std::string expected = "cannot load " + library.string() +
                                         ": truncated: " + grouped(kept) + " of " +
                                         grouped(declared) + " bytes (";
            CHECK_MESSAGE(startsWith(report.reason, expected),
                          "expected " << expected << "...\n got " << report.reason);
            CHECK(contains(report.reason, "end beyond the end of the file"));
            CHECK(report.probe == "");
            CHECK_FALSE(mapped("truncated.so"));
            checkHostRunsKernel(runtime);
        }
    }
}

// ----- hostile manifests -----------------------------------------------------------------------

TEST_CASE("reports a manifest with the number 1e999 at its JSON pointer, with line and column") {
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        Scratch scratch("overflow");
        const fs::path manifest = scratch / "overflow.json";
        writeFile(manifest, manifestText("overflow", "overflow.so", "1e999"));

        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "manifest_invalid");
        const std::string expected =
            manifest.string() + ": /description: number overflow parsing '1e999' (line 1, column ";
        CHECK_MESSAGE(startsWith(report.reason, expected),
                      "expected " << expected << "...\n got " << report.reason);
        CHECK(endsWith(report.reason, ")"));
        CHECK(report.probe == "");
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("reports a manifest nested 100,000 levels deep without recursing into it") {
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        Scratch scratch("deep");
        const fs::path manifest = scratch / "deep.json";
        constexpr size_t depth = 100000;
        writeFile(manifest, manifestText("deep", "deep.so",
                                         std::string(depth, '[') + std::string(depth, ']')));

        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "manifest_invalid");
        CHECK_MESSAGE(startsWith(report.reason, manifest.string() + ": /description"),
                      "reason: " << report.reason);
        CHECK(contains(report.reason, "nesting deeper than 32 levels"));
        CHECK(report.probe == "");
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("refuses a manifest larger than 256 KiB before parsing it") {
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        Scratch scratch("huge");
        const fs::path manifest = scratch / "huge.json";
        // Well-formed: parsed, it would name a library that does not exist (library_load_failed).
        writeFile(manifest,
                  manifestText("huge", "huge.so", "\"" + std::string(300u << 10, 'x') + "\""));
        const uint64_t size = fs::file_size(manifest);

        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "manifest_invalid");
        CHECK_MESSAGE(startsWith(report.reason, manifest.string() + ": "),
                      "reason: " << report.reason);
        CHECK_MESSAGE(contains(report.reason, grouped(size)), "reason: " << report.reason);
        CHECK_MESSAGE(contains(report.reason, "262,144"), "reason: " << report.reason);
        CHECK(report.probe == "");
        checkHostRunsKernel(runtime);
    }
}

// ----- hostile plugins, contained in both probe modes -------------------------------------------

TEST_CASE("reports a probe that throws a std::exception across the ABI, in both probe modes") {
    const fs::path manifest = kHostileDir / "hostile_probe_throws.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "probe_failed");
        CHECK_MESSAGE(contains(report.reason, "probe threw"), "reason: " << report.reason);
        CHECK_MESSAGE(contains(report.reason, "fixture probe exploded"),
                      "reason: " << report.reason);
        CHECK(report.probe == probedBy(mode));
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("reports a probe that throws something that is not a std::exception, in both modes") {
    const fs::path manifest = kHostileDir / "hostile_probe_throws_int.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "probe_failed");
        CHECK_MESSAGE(contains(report.reason, "threw an exception that is not a std::exception"),
                      "reason: " << report.reason);
        CHECK(report.probe == probedBy(mode));
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("reports a plugin_init that throws across the ABI as init_failed, in both modes") {
    const fs::path manifest = kHostileDir / "hostile_init_throws.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "init_failed");
        CHECK_MESSAGE(contains(report.reason, "plugin_init threw"), "reason: " << report.reason);
        CHECK_MESSAGE(contains(report.reason, "fixture init exploded"),
                      "reason: " << report.reason);
        CHECK(report.probe == probedBy(mode));
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("refuses a plugin that reports 4 billion devices without asking about each one") {
    const fs::path manifest = kHostileDir / "hostile_device_count.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        Scratch scratch("device-count");
        const fs::path calls = scratch / "device_info_calls";
        // Read by the fixture's device_info, in this process or the probe process.
        setenv("BACKPLANE_FIXTURE_CALLS_FILE", calls.c_str(), 1);
        const auto start = std::chrono::steady_clock::now();
        const Runtime runtime(caseConfig({manifest}, mode));
        const auto took = std::chrono::steady_clock::now() - start;
        unsetenv("BACKPLANE_FIXTURE_CALLS_FILE");

        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "probe_failed");
        CHECK_MESSAGE(
            contains(report.reason,
                     "reports 4294967295 devices, more than the 1024 a plugin may report"),
            "reason: " << report.reason);
        CHECK(report.probe == probedBy(mode));
        const uint64_t called = fs::exists(calls) ? std::stoull(readFile(calls)) : 0;
        CHECK_MESSAGE(called <= 1024, "device_info was called " << called << " times");
        CHECK(took < std::chrono::seconds(10));
        const auto &devices = runtime.devices();
        CHECK(std::none_of(devices.begin(), devices.end(), [](const backplane::PhysicalDevice &d) {
            return d.info().backend == "hostile_device_count";
        }));
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("cuts device strings without a NUL at their field size and keeps bad UTF-8 out of JSON") {
    const fs::path manifest = kHostileDir / "hostile_strings.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        REQUIRE_MESSAGE(stateOf(report) == "loaded", stateOf(report) << ": " << report.reason);
        CHECK(report.probe == probedBy(mode));
        CHECK(report.deviceCount == 2);
        // bp_probe_result::driver_version is char[64], all 'A'.
        CHECK(report.driverVersion.size() >= 63);
        CHECK(report.driverVersion.size() <= 64);
        CHECK(report.driverVersion.find_first_not_of('A') == std::string::npos);

        const backplane::DeviceInfo *unterminated = nullptr;
        const backplane::DeviceInfo *badUtf8 = nullptr;
        for (const auto &device : runtime.devices())
            for (const auto &route : device.routes) {
                if (route.backend != "hostile_strings") continue;
                (route.index == 0 ? unterminated : badUtf8) = &route;
            }
        REQUIRE(unterminated != nullptr);
        REQUIRE(badUtf8 != nullptr);
        const auto cut = [](const std::string &field, size_t capacity) {
            CAPTURE(field);
            CHECK(field.size() + 1 >= capacity);
            CHECK(field.size() <= capacity);
            CHECK(field.find_first_not_of('A') == std::string::npos);
        };
        cut(unterminated->name, 256);
        cut(unterminated->vendor, 64);
        cut(unterminated->arch, 64);
        cut(unterminated->driverVersion, 64);
        cut(unterminated->pciBusId, 32);
        CHECK(startsWith(badUtf8->name, "bad "));

        std::string json;
        CHECK_NOTHROW(json = runtime.reportJson());
        CHECK(contains(json, "hostile_strings"));
        CHECK_MESSAGE(json.find('\xff') == std::string::npos, "raw 0xff byte in reportJson()");
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("cuts a plugin's error message without a NUL at its capacity") {
    const fs::path manifest = kHostileDir / "hostile_error_message.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "probe_failed");
        CHECK(report.probe == probedBy(mode));
        const size_t first = report.reason.find('B');
        REQUIRE_MESSAGE(first != std::string::npos, "reason: " << report.reason);
        const size_t run = report.reason.find_first_not_of('B', first);
        const size_t length = (run == std::string::npos ? report.reason.size() : run) - first;
        CHECK(length >= BP_ERROR_MESSAGE_CAPACITY - 1);
        CHECK(length <= BP_ERROR_MESSAGE_CAPACITY);
        // Reading on past the buffer would bring in whatever lies behind it.
        const bool ascii = std::all_of(report.reason.begin(), report.reason.end(),
                                       [](char c) { return static_cast<unsigned char>(c) < 0x80; });
        CHECK_MESSAGE(ascii, "bytes from beyond bp_error::message in the reason");
        std::string json;
        CHECK_NOTHROW(json = runtime.reportJson());
        checkHostRunsKernel(runtime);
    }
}

TEST_CASE("skips a device whose binding alignment the pools cannot use, keeping the others") {
    const fs::path manifest = kHostileDir / "hostile_alignment.json";
    for (const ProbeMode mode : kBothModes) {
        const std::string modeName = backplane::toString(mode);
        CAPTURE(modeName);
        const Runtime runtime(caseConfig({manifest}, mode));
        const PluginReport &report = reportOf(runtime, manifest);
        CHECK(stateOf(report) == "loaded");
        CHECK(report.deviceCount == 2);
        CHECK_MESSAGE(contains(report.reason, "device_info(0) reports a binding alignment of 3 "
                                              "bytes; it must be a power of two"),
                      "reason: " << report.reason);
        size_t devices = 0;
        for (const auto &d : runtime.devices())
            for (const auto &route : d.routes)
                if (route.backend == "hostile_alignment") {
                    ++devices;
                    CHECK(route.index == 1);
                }
        CHECK(devices == 1);
        checkHostRunsKernel(runtime);
    }
}

// ----- hostile plugins that only the isolated probe contains ------------------------------------

TEST_CASE("contains a probe that segfaults in the probe process and reports SIGSEGV") {
    noCoreDumps();
    const fs::path manifest = kHostileDir / "hostile_probe_segfaults.json";
    const Runtime runtime(isolatedConfig({manifest}));
    const PluginReport &report = reportOf(runtime, manifest);
    CHECK(stateOf(report) == "probe_crashed");
    CHECK_MESSAGE(startsWith(report.reason, "SIGSEGV during probe"), "reason: " << report.reason);
    CHECK(contains(report.reason, "the library was not loaded into this process"));
    CHECK(report.probe == "isolated");
    CHECK_FALSE(mapped("hostile_probe_segfaults.so"));
    checkHostRunsKernel(runtime);
}

TEST_CASE("contains a probe that aborts in the probe process and reports SIGABRT") {
    noCoreDumps();
    const fs::path manifest = kHostileDir / "hostile_probe_aborts.json";
    const Runtime runtime(isolatedConfig({manifest}));
    const PluginReport &report = reportOf(runtime, manifest);
    CHECK(stateOf(report) == "probe_crashed");
    CHECK_MESSAGE(startsWith(report.reason, "SIGABRT during probe"), "reason: " << report.reason);
    CHECK(contains(report.reason, "the library was not loaded into this process"));
    CHECK(report.probe == "isolated");
    CHECK_FALSE(mapped("hostile_probe_aborts.so"));
    checkHostRunsKernel(runtime);
}

TEST_CASE("gives up on a probe that never returns after the probe timeout") {
    const fs::path manifest = kHostileDir / "hostile_probe_hangs.json";
    const auto start = std::chrono::steady_clock::now();
    const Runtime runtime(isolatedConfig({manifest}));
    const auto took = std::chrono::steady_clock::now() - start;
    const PluginReport &report = reportOf(runtime, manifest);
    CHECK(stateOf(report) == "probe_timeout");
    CHECK_MESSAGE(startsWith(report.reason, "no answer in 1 s during probe"),
                  "reason: " << report.reason);
    CHECK(report.probe == "isolated");
    CHECK_FALSE(mapped("hostile_probe_hangs.so"));
    // One second of timeout, not the default ten, and no waiting on the hung child.
    CHECK(took >= std::chrono::milliseconds(900));
    CHECK(took < std::chrono::seconds(6));
    checkHostRunsKernel(runtime);
}

TEST_CASE("reports every fault of the matrix side by side in one runtime") {
    noCoreDumps();
    Scratch scratch("all");
    std::vector<fs::path> entries;
    for (const FileCase &c : fileCases()) {
        c.make(scratch / (c.name + ".so"));
        entries.push_back(writeManifest(scratch.dir(), c.name));
    }
    for (const char *name :
         {"probe_throws", "probe_throws_int", "init_throws", "probe_aborts", "probe_segfaults",
          "probe_hangs", "device_count", "strings", "error_message"})
        entries.push_back(kHostileDir / ("hostile_" + std::string(name) + ".json"));

    // All probes run at once: a longer timeout, so the good ones finish on a loaded machine.
    Config config = isolatedConfig(entries);
    config.probeTimeoutMs = 3000;
    const Runtime runtime(config);
    const std::vector<std::pair<std::string, std::string>> expected = {
        {"foreign_arch", "library_load_failed"},
        {"elf32", "library_load_failed"},
        {"empty", "library_load_failed"},
        {"directory", "library_load_failed"},
        {"text", "library_load_failed"},
        {"linker_script", "library_load_failed"},
        {"hostile_probe_throws", "probe_failed"},
        {"hostile_probe_throws_int", "probe_failed"},
        {"hostile_init_throws", "init_failed"},
        {"hostile_probe_aborts", "probe_crashed"},
        {"hostile_probe_segfaults", "probe_crashed"},
        {"hostile_probe_hangs", "probe_timeout"},
        {"hostile_device_count", "probe_failed"},
        {"hostile_strings", "loaded"},
        {"hostile_error_message", "probe_failed"},
        {"host", "loaded"}};
    for (const auto &[name, state] : expected) {
        CAPTURE(name);
        const auto &reports = runtime.plugins();
        const auto it = std::find_if(reports.begin(), reports.end(),
                                     [&](const PluginReport &r) { return r.name == name; });
        REQUIRE(it != reports.end());
        CHECK_MESSAGE(stateOf(*it) == state, "reason: " << it->reason);
    }
    CHECK(runtime.plugins().size() == expected.size());
    const auto &reports = runtime.plugins();
    const auto hung = std::find_if(reports.begin(), reports.end(), [](const PluginReport &r) {
        return r.name == "hostile_probe_hangs";
    });
    REQUIRE(hung != reports.end());
    CHECK_MESSAGE(startsWith(hung->reason, "no answer in 3 s during probe"),
                  "reason: " << hung->reason);
    std::string json;
    CHECK_NOTHROW(json = runtime.reportJson());
    checkHostRunsKernel(runtime);
}

// ----- the probe cache ---------------------------------------------------------------------------

TEST_CASE("caches probe results, crashes included, until the library file changes") {
    noCoreDumps();
    Scratch scratch("cache");
    const fs::path library = scratch / "hostile_probe_segfaults.so";
    fs::copy_file(kHostileDir / "hostile_probe_segfaults.so", library);
    const fs::path manifest = scratch / "hostile_probe_segfaults.json";
    fs::copy_file(kHostileDir / "hostile_probe_segfaults.json", manifest);
    Config config = isolatedConfig({manifest});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";

    const auto hostReport = [](const Runtime &runtime) -> const PluginReport & {
        return reportOf(runtime, kHostManifest);
    };

    {
        const Runtime first(config);
        const PluginReport &crashed = reportOf(first, manifest);
        CHECK(stateOf(crashed) == "probe_crashed");
        CHECK(startsWith(crashed.reason, "SIGSEGV during probe"));
        CHECK_FALSE(endsWith(crashed.reason, kCachedSuffix));
        CHECK(crashed.probe == "isolated");
        CHECK(hostReport(first).probe == "isolated");
        checkHostRunsKernel(first);
    }
    {
        const Runtime second(config);
        const PluginReport &crashed = reportOf(second, manifest);
        CHECK(stateOf(crashed) == "probe_crashed");
        CHECK_MESSAGE(startsWith(crashed.reason, "SIGSEGV during probe"),
                      "reason: " << crashed.reason);
        CHECK_MESSAGE(endsWith(crashed.reason, kCachedSuffix), "reason: " << crashed.reason);
        CHECK(crashed.probe == "cached");
        CHECK(hostReport(second).probe == "cached");
        CHECK(stateOf(hostReport(second)) == "loaded");
        CHECK_FALSE(mapped("hostile_probe_segfaults.so"));
        checkHostRunsKernel(second);
    }
    // A new build of the plugin in place (new size and modification time): probed again.
    {
        std::ofstream grow(library, std::ios::binary | std::ios::app);
        grow.put('\0');
    }
    fs::last_write_time(library, fs::last_write_time(library) + std::chrono::seconds(2));
    {
        const Runtime third(config);
        const PluginReport &crashed = reportOf(third, manifest);
        CHECK(stateOf(crashed) == "probe_crashed");
        CHECK(crashed.probe == "isolated");
        CHECK_MESSAGE(startsWith(crashed.reason, "SIGSEGV during probe"),
                      "reason: " << crashed.reason);
        CHECK_FALSE(endsWith(crashed.reason, kCachedSuffix));
        CHECK(hostReport(third).probe == "cached");
        checkHostRunsKernel(third);
    }
}

// ----- the isolated probe's own failure modes -------------------------------------------------

TEST_CASE("a warm start takes the cached answer and runs no probe of the plugin in this process") {
    noCoreDumps();
    Scratch scratch("warm");
    const fs::path manifest = kHostileDir / "hostile_crash_marker.json";
    const fs::path marker = scratch / "crash-now";
    setenv("BACKPLANE_FIXTURE_CRASH_MARKER", marker.c_str(), 1);
    Config config = isolatedConfig({manifest});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    {
        const Runtime first(config);
        CHECK(stateOf(reportOf(first, manifest)) == "loaded");
        CHECK(reportOf(first, manifest).probe == "isolated");
    }
    // From now on its probe segfaults. Before the fix, a cached answer meant probing again in
    // this process: this test process died of SIGSEGV here.
    { std::ofstream(marker) << "x"; }
    {
        const Runtime second(config);
        const PluginReport &report = reportOf(second, manifest);
        CHECK(stateOf(report) == "loaded");
        CHECK(report.probe == "cached");
        size_t devices = 0;
        for (const auto &d : second.devices())
            for (const auto &route : d.routes) devices += route.backend == "hostile_crash_marker";
        CHECK(devices == 1); // from the cached answer, every field included
        checkHostRunsKernel(second);
    }
    unsetenv("BACKPLANE_FIXTURE_CRASH_MARKER");
}

TEST_CASE("a probe helper that cannot start is reported, and nothing falls back to in process") {
    noCoreDumps();
    const fs::path manifest = kHostileDir / "hostile_probe_segfaults.json";
    setenv("BACKPLANE_PROBE_HELPER", "/nonexistent/backplane-probe", 1);
    Config config = isolatedConfig({manifest});
    // Before the fix, a failed start probed in this process: SIGSEGV.
    const Runtime runtime(config);
    unsetenv("BACKPLANE_PROBE_HELPER");
    const PluginReport &report = reportOf(runtime, manifest);
    CHECK(stateOf(report) == "probe_failed");
    CHECK_MESSAGE(startsWith(report.reason, "could not start its isolated probe: cannot run "
                                            "/nonexistent/backplane-probe"),
                  "reason: " << report.reason);
    CHECK_FALSE(mapped("hostile_probe_segfaults.so"));
}

TEST_CASE("a broken probe helper is not blamed on the plugins and not cached") {
    Scratch scratch("helper");
    const fs::path manifest = kHostileDir / "hostile_probe_throws.json";
    Config config = isolatedConfig({});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    setenv("BACKPLANE_PROBE_HELPER", "/bin/false", 1);
    {
        const Runtime broken(config);
        const PluginReport &host = reportOf(broken, kHostManifest);
        CHECK(stateOf(host) == "probe_failed");
        CHECK_MESSAGE(startsWith(host.reason, "backplane-probe ended (exit status 1) before "
                                              "loading the plugin"),
                      "reason: " << host.reason);
    }
    unsetenv("BACKPLANE_PROBE_HELPER");
    // Before the fix the helper's failure was cached as the host plugin's crash.
    const Runtime repaired(config);
    CHECK(stateOf(reportOf(repaired, kHostManifest)) == "loaded");
    CHECK(reportOf(repaired, kHostManifest).probe == "isolated");
    checkHostRunsKernel(repaired);
}

TEST_CASE("in-process probing refuses a library an isolated probe saw crash") {
    noCoreDumps();
    Scratch scratch("known-crasher");
    const fs::path manifest = kHostileDir / "hostile_probe_segfaults.json";
    Config config = isolatedConfig({manifest});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    {
        const Runtime isolated(config);
        CHECK(stateOf(reportOf(isolated, manifest)) == "probe_crashed");
    }
    config.probeMode = ProbeMode::InProcess;
    // Without the check, this probe ran in this process: SIGSEGV.
    const Runtime inProcess(config);
    const PluginReport &report = reportOf(inProcess, manifest);
    CHECK(stateOf(report) == "probe_crashed");
    CHECK(report.probe == "cached");
    CHECK_MESSAGE(contains(report.reason, "not loaded in process"), "reason: " << report.reason);
    CHECK_FALSE(mapped("hostile_probe_segfaults.so"));
    checkHostRunsKernel(inProcess);
}

TEST_CASE("an answer that no longer holds at device_open is refused and dropped from the cache") {
    Scratch scratch("stale");
    const fs::path manifest = kHostileDir / "hostile_device_env.json";
    Config config = isolatedConfig({manifest});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    const auto envDevices = [](const Runtime &runtime) {
        std::vector<backplane::DeviceInfo> out;
        for (const auto &d : runtime.devices())
            for (const auto &route : d.routes)
                if (route.backend == "hostile_device_env") out.push_back(route);
        return out;
    };
    setenv("BACKPLANE_FIXTURE_DEVICE_COUNT", "2", 1);
    { CHECK(envDevices(Runtime(config)).size() == 2); }
    setenv("BACKPLANE_FIXTURE_DEVICE_COUNT", "1", 1); // a device went away
    {
        const Runtime cached(config);
        CHECK(reportOf(cached, manifest).probe == "cached");
        const auto devices = envDevices(cached);
        REQUIRE(devices.size() == 2); // the answer from the first start
        backplane::Selection selection;
        selection.device = devices[1];
        // Before the check, device_open(1) went to a plugin that has one device.
        CHECK_THROWS_WITH_AS(cached.open(selection),
                             doctest::Contains("now reports 1 device(s); the devices changed"),
                             backplane::Error);
    }
    {
        const Runtime again(config); // the stale answer was dropped: probed again
        CHECK(reportOf(again, manifest).probe == "isolated");
        CHECK(envDevices(again).size() == 1);
    }
    unsetenv("BACKPLANE_FIXTURE_DEVICE_COUNT");
}

TEST_CASE("answers without devices are not cached, and the driver environment is in the key") {
    Scratch scratch("negative");
    const fs::path noDevice = fs::path(FIXTURE_DIR) / "no_device.json";
    Config config = isolatedConfig({noDevice});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    { const Runtime first(config); }
    {
        const Runtime second(config);
        // Before the fix: "cached", and a driver installed later was never seen.
        CHECK(reportOf(second, noDevice).probe == "isolated");
        CHECK(stateOf(reportOf(second, noDevice)) == "no_device");
        CHECK(reportOf(second, kHostManifest).probe == "cached");
    }
    setenv("VK_DRIVER_FILES", "/nonexistent/icd.json", 1);
    {
        const Runtime otherDrivers(config);
        CHECK(reportOf(otherDrivers, kHostManifest).probe == "isolated");
    }
    unsetenv("VK_DRIVER_FILES");
}

TEST_CASE("a probe helper that never starts loading is the helper's failure, not cached") {
    Scratch scratch("stalled-helper");
    const fs::path helper = scratch / "stalled-helper.sh";
    { std::ofstream(helper) << "#!/bin/sh\nexec sleep 30\n"; }
    fs::permissions(helper, fs::perms::owner_all);
    Config config = isolatedConfig({});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    setenv("BACKPLANE_PROBE_HELPER", helper.c_str(), 1);
    {
        const Runtime stalled(config);
        const PluginReport &host = reportOf(stalled, kHostManifest);
        CHECK(stateOf(host) == "probe_failed");
        CHECK_MESSAGE(startsWith(host.reason, "backplane-probe gave no sign of life in 1 s"),
                      "reason: " << host.reason);
    }
    unsetenv("BACKPLANE_PROBE_HELPER");
    const Runtime repaired(config); // before the fix: probe_timeout, cached for 10 minutes
    CHECK(stateOf(reportOf(repaired, kHostManifest)) == "loaded");
    CHECK(reportOf(repaired, kHostManifest).probe == "isolated");
}

TEST_CASE("a process killed by the deferred in-host probe makes the next start probe in isolation") {
    noCoreDumps();
    Scratch scratch("in-host-crash");
    const fs::path manifest = kHostileDir / "hostile_crash_marker.json";
    const fs::path marker = scratch / "crash-now";
    setenv("BACKPLANE_FIXTURE_CRASH_MARKER", marker.c_str(), 1);
    Config config = isolatedConfig({manifest});
    config.cacheEnabled = true;
    config.cacheDir = scratch / "cache";
    { CHECK(stateOf(reportOf(Runtime(config), manifest)) == "loaded"); }
    { std::ofstream(marker) << "x"; } // from now on its probe segfaults
    // Another process opens the plugin's device: the probe before device_open kills it.
    const fs::path tool = fs::path(PROJECT_BUILD_ROOT) / "tools" / "backplane" / "backplane";
    // (In a sanitized build, ASan must let the SIGSEGV kill the tool rather than exit 1.)
    const std::string command = "ASAN_OPTIONS=handle_segv=0:detect_leaks=0 BACKPLANE_LOG=off "
                                "BACKPLANE_CACHE_DIR='" +
                                config.cacheDir.string() + "' BACKPLANE_PLUGIN_PATH='" +
                                manifest.string() + ":" + kHostManifest.string() +
                                "' BACKPLANE_DEVICE=hostile_crash_marker:0 '" + tool.string() +
                                "' demo > /dev/null 2>&1";
    const int status = std::system(command.c_str());
    const bool killed = WIFEXITED(status) && WEXITSTATUS(status) == 128 + SIGSEGV;
    CHECK_MESSAGE(killed, "the demo was expected to die of SIGSEGV, status " << status);
    // Before the marker, every later start took the cached answer and crashed again at open.
    const Runtime next(config);
    const PluginReport &report = reportOf(next, manifest);
    CHECK(report.probe == "isolated");
    CHECK(stateOf(report) == "probe_crashed");
    checkHostRunsKernel(next);
    unsetenv("BACKPLANE_FIXTURE_CRASH_MARKER");
}
