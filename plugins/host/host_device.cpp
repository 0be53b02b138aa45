// One opened host device: storage, streams, transfers and host-dialect kernels.
#include "host_device.hpp"

#include "gloo/host_comm.hpp"

#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <limits>
#include <sstream>
#include <type_traits>
#include <typeinfo>
#include <vector>

namespace backplane::host {
namespace {

// Pages are aligned to this, well above any binding alignment and SIMD width.
constexpr uint64_t kPageAlignment = 256;

/// dynamic_cast to a final class, as a comparison of the object's type with it (no walk of the
/// class hierarchy): on every launch, copy, flush and wait.
template <class Final, class Base> Final *exactly(Base &object) {
    static_assert(std::is_final_v<Final> && std::is_base_of_v<Base, Final>);
    return typeid(object) == typeid(Final) ? static_cast<Final *>(&object) : nullptr;
}

[[noreturn]] void invalid(const std::string &message) {
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, message);
}

[[noreturn]] void rejectLaunch(const std::string &message) {
    throw sdk::Error(BP_ERROR_LAUNCH, message);
}

std::string dims(const uint32_t (&d)[3]) {
    return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) +
           ")";
}

/// Checks that [offset, offset + size) lies inside `memory`'s page.
void checkRange(const HostMemory &memory, uint64_t offset, uint64_t size, const char *operation,
                const char *which) {
    if (size > memory.size() || offset > memory.size() - size)
        invalid(std::string(operation) + ": " + which + " range of " + std::to_string(size) +
                " bytes at offset " + std::to_string(offset) + " lies outside its page of " +
                std::to_string(memory.size()) + " bytes");
}

/// Reads a bp_host_kernel_source of a caller that may know an older (smaller) layout: a 1.1
/// caller's ends before user_data, which then stays NULL.
bp_host_kernel_source readHostSource(const void *data, size_t size, const std::string &what) {
    constexpr size_t kMinimum =
        offsetof(bp_host_kernel_source, function) + sizeof(bp_host_kernel_fn);
    bp_host_kernel_source source{};
    if (data == nullptr || size < kMinimum)
        invalid(what + ": expected a bp_host_kernel_source of " + std::to_string(sizeof(source)) +
                " bytes, got " + std::to_string(data == nullptr ? 0 : size) + " bytes");
    size_t declared = 0;
    std::memcpy(&declared, data, sizeof(declared));
    if (declared > size)
        invalid(what + ": bp_host_kernel_source::struct_size says " + std::to_string(declared) +
                " bytes but only " + std::to_string(size) + " were given (a truncated source)");
    const size_t n = std::min({size, declared, sizeof(source)});
    if (n < kMinimum)
        invalid(what + ": bp_host_kernel_source::struct_size " + std::to_string(declared) +
                " is too small; set it to sizeof(bp_host_kernel_source)");
    std::memcpy(&source, data, n);
    source.struct_size = sizeof(source);
    if (source.function == nullptr) invalid(what + ": bp_host_kernel_source::function is NULL");
    return source;
}

/// Everything a launch needs at execution time, copied when it is recorded. Small launches (the
/// common case) keep their bindings and scalars inline, so the task is one allocation.
struct LaunchRecord {
    static constexpr uint32_t kInlineBindings = 8;
    static constexpr size_t kInlineScalarBytes = 64;

    bp_host_kernel_fn function = nullptr;
    const void *userData = nullptr;
    /// A compiled kernel's object: loaded until the launch ran, even if the kernel is released.
    std::shared_ptr<const LoadedObject> code;
    uint32_t grid[3] = {0, 0, 0};
    const unsigned char *indirectGrid = nullptr; ///< three uint32 read at execution time
    uint32_t block[3] = {1, 1, 1};
    uint32_t bufferCount = 0;
    size_t scalarSize = 0;
    void *inlineBuffers[kInlineBindings] = {};
    uint64_t inlineSizes[kInlineBindings] = {};
    /// Cast to the kernel's scalar struct: aligned like malloc's memory.
    alignas(std::max_align_t) unsigned char inlineScalars[kInlineScalarBytes] = {};
    std::vector<void *> moreBuffers;        ///< all bindings, when more than kInlineBindings
    std::vector<uint64_t> moreSizes;        ///< their sizes
    std::vector<unsigned char> moreScalars; ///< all scalars, when more than kInlineScalarBytes
    /// Indirect launches only (the message when the grid read is too large): the kernel may be
    /// released before the launch runs.
    std::string entryPoint;

    void *const *buffers() const noexcept {
        return bufferCount <= kInlineBindings ? inlineBuffers : moreBuffers.data();
    }
    const uint64_t *bufferSizes() const noexcept {
        return bufferCount <= kInlineBindings ? inlineSizes : moreSizes.data();
    }
    const unsigned char *scalars() const noexcept {
        if (scalarSize == 0) return nullptr;
        return scalarSize <= kInlineScalarBytes ? inlineScalars : moreScalars.data();
    }
};

/// The first failure a launch's kernel reported through bp_host_kernel_context::fail (ABI 1.6).
struct LaunchFailure {
    std::mutex mutex;
    bool failed = false;
    bp_status status = BP_ERROR_INTERNAL;
    std::string message;

    static void report(const bp_host_kernel_context *context, bp_status status,
                       const char *message) {
        if (context == nullptr || context->fail_state == nullptr) return;
        auto &self = *static_cast<LaunchFailure *>(context->fail_state);
        std::lock_guard lock(self.mutex);
        if (self.failed) return;
        self.failed = true;
        self.status = status == BP_SUCCESS ? BP_ERROR_INTERNAL : status;
        try {
            self.message = message != nullptr ? message : "(no message)";
        } catch (...) {
            self.status = BP_ERROR_OUT_OF_MEMORY; // the message itself did not fit
        }
    }
};

void runLaunch(const LaunchRecord &launch, WorkgroupPool &pool, const bp_device_info &info) {
    uint32_t grid[3] = {launch.grid[0], launch.grid[1], launch.grid[2]};
    if (launch.indirectGrid != nullptr) {
        std::memcpy(grid, launch.indirectGrid, sizeof(grid));
        for (int d = 0; d < 3; ++d)
            if (grid[d] > info.max_grid_size[d])
                rejectLaunch("kernel '" + launch.entryPoint + "': the indirect grid " + dims(grid) +
                             " read from grid_memory exceeds max_grid_size " +
                             dims(info.max_grid_size) + "; the launch was skipped");
    }
    void *const *buffers = launch.buffers();
    const uint64_t *bufferSizes = launch.bufferSizes();
    const unsigned char *scalars = launch.scalars();
    // A compiled kernel with a runs entry computes `run` neighbouring workgroups along x per
    // call: enough calls for about sixteen claims per worker, at most 64 workgroups each.
    const bp_host_kernel_runs_fn runs = launch.code ? launch.code->runs() : nullptr;
    const uint32_t run =
        runs == nullptr ? 1
                        : std::clamp<uint32_t>(grid[0] / (pool.workers() * 16u), 1u, 64u);
    const uint64_t runsPerRow = (uint64_t{grid[0]} + run - 1) / run;
    const uint64_t perSlice = runsPerRow * grid[1];
    const uint64_t count = perSlice * grid[2];
    LaunchFailure failure;
    pool.run(count, [&](uint64_t i) {
        bp_host_kernel_context context{};
        context.struct_size = sizeof(context);
        std::copy(std::begin(grid), std::end(grid), context.grid);
        std::copy(std::begin(launch.block), std::end(launch.block), context.block);
        const uint64_t x = (i % runsPerRow) * run;
        context.workgroup[0] = static_cast<uint32_t>(x);
        context.workgroup[1] = static_cast<uint32_t>((i / runsPerRow) % grid[1]);
        context.workgroup[2] = static_cast<uint32_t>(i / perSlice);
        context.buffers = buffers;
        context.buffer_sizes = bufferSizes;
        context.buffer_count = launch.bufferCount;
        context.scalars = scalars;
        context.scalar_size = launch.scalarSize;
        context.user_data = launch.userData;
        context.fail = &LaunchFailure::report;
        context.fail_state = &failure;
        if (run == 1) launch.function(&context);
        else runs(&context, static_cast<uint32_t>(std::min<uint64_t>(run, grid[0] - x)));
    });
    if (failure.failed) throw sdk::Error(failure.status, "kernel_launch: " + failure.message);
}

} // namespace

HostMemory::HostMemory(HostDevice &owner, void *data, uint64_t size, bool owned)
    : owner_(owner), data_(static_cast<unsigned char *>(data)), size_(size), owned_(owned) {}

HostMemory::~HostMemory() {
    if (!owned_) { // registered: the application's memory
        if (registered_) owner_.unregisterRange(data_);
        return;
    }
    std::free(data_);
    owner_.releaseBytes(size_);
}

HostDevice::HostDevice(const bp_device_info &info, const void *plugin, const HostOptions &options,
                       std::shared_ptr<GlooLoader> gloo,
                       std::shared_ptr<std::atomic<uint64_t>> allocated,
                       std::shared_ptr<const HostCompiler> compiler,
                       std::shared_ptr<FaultPlan> faults)
    : info_(info), plugin_(plugin), options_(options), gloo_(std::move(gloo)),
      compiler_(std::move(compiler)), async_(options.async),
      allocated_(std::move(allocated)), allocatedBytes_(*allocated_), pool_(options.workers),
      faults_(std::move(faults)) {}

HostDevice::~HostDevice() = default;

void HostDevice::enter() const {
    if (lost_->lost()) throw sdk::Error(BP_ERROR_DEVICE_LOST, lost_->reason());
}

HostDevice::Task HostDevice::injectedFault(FaultOperation operation,
                                          const std::function<std::string()> &what) {
    if (!faults_ || faults_->empty()) return {};
    const std::optional<FaultClass> fault = faults_->next(operation);
    if (!fault) return {};
    const std::string device = "host device " + std::to_string(faults_->device());
    if (*fault == FaultClass::Refused)
        throw sdk::Error(operation == FaultOperation::Launch ? BP_ERROR_LAUNCH : BP_ERROR_INTERNAL,
                         "injected refused fault (inject_faults): " + what() + " on " + device +
                             " was refused");
    // The work never happens; the device is lost from the moment it would have run.
    return [lost = lost_, why = "injected sticky fault (inject_faults): " + what() + " on " +
                                device + " failed when it ran"] {
        lost->mark(why);
        throw sdk::Error(BP_ERROR_DEVICE_LOST, why);
    };
}

void HostDevice::releaseBytes(uint64_t bytes) noexcept {
    allocatedBytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

std::unique_ptr<sdk::Memory> HostDevice::allocate(const bp_memory_allocate_args &args,
                                                  void **mapped) {
    enter();
    const auto kind = sdk::rawValue(args.kind);
    if (kind != BP_MEMORY_DEVICE && kind != BP_MEMORY_PINNED_HOST && kind != BP_MEMORY_HOST_VISIBLE)
        invalid("memory_allocate: unknown memory kind " + std::to_string(kind));
    if (args.size == 0) invalid("memory_allocate: size must be > 0");

    // Reserve the bytes against the budget first, so concurrent allocations cannot overshoot.
    const uint64_t budget = info_.memory_bytes;
    uint64_t used = allocatedBytes_.load(std::memory_order_relaxed);
    do {
        if (args.size > budget - used)
            throw sdk::Error(BP_ERROR_OUT_OF_MEMORY,
                             "memory_allocate of " + std::to_string(args.size) +
                                 " bytes: the host device has " + std::to_string(used) +
                                 " of its " + std::to_string(budget) +
                                 " bytes in use; free memory or raise the host plugin's "
                                 "\"memory_bytes\" option");
    } while (
        !allocatedBytes_.compare_exchange_weak(used, used + args.size, std::memory_order_relaxed));

    const uint64_t rounded = (args.size + kPageAlignment - 1) / kPageAlignment * kPageAlignment;
    void *data = rounded <= std::numeric_limits<size_t>::max()
                     ? std::aligned_alloc(kPageAlignment, static_cast<size_t>(rounded))
                     : nullptr;
    if (data == nullptr) {
        releaseBytes(args.size);
        throw sdk::Error(BP_ERROR_OUT_OF_MEMORY,
                         "memory_allocate: aligned_alloc of " + std::to_string(rounded) +
                             " bytes failed; the host is out of memory",
                         errno);
    }
    // Every kind is plain host memory, so every page is mapped.
    *mapped = data;
    return std::make_unique<HostMemory>(*this, data, args.size);
}

namespace {

/// Why [data, data + size) cannot be registered: some of it is not mapped readable and writable
/// in this process (/proc/self/maps), or "" when all of it is (or the maps cannot be read).
/// Transfers write into registered memory from a stream worker, where a fault would end the
/// process (CUDA's cuMemHostRegister refuses such ranges too).
std::string unusableRange(uintptr_t begin, uintptr_t end) {
    std::ifstream maps("/proc/self/maps");
    if (!maps) return {};
    uintptr_t covered = begin; // everything below it is mapped rw
    std::string line;
    while (covered < end && std::getline(maps, line)) {
        unsigned long long low = 0, high = 0;
        char perms[5] = {};
        if (std::sscanf(line.c_str(), "%llx-%llx %4s", &low, &high, perms) != 3) continue;
        if (high <= covered) continue;
        if (low > covered) break; // a hole (the file is sorted by address)
        if (perms[0] != 'r' || perms[1] != 'w')
            return "the mapping " + line.substr(0, line.find(' ', line.find(' ') + 1)) +
                   " is not readable and writable";
        covered = static_cast<uintptr_t>(high);
    }
    if (covered < end) {
        std::ostringstream at;
        at << "the address 0x" << std::hex << covered << " is not mapped";
        return at.str();
    }
    return {};
}

} // namespace

std::unique_ptr<sdk::Memory> HostDevice::registerHost(const bp_memory_register_args &args) {
    const auto begin = reinterpret_cast<uintptr_t>(args.host);
    const auto range = [&] {
        std::ostringstream text;
        text << "[" << args.host << ", +" << args.size << " bytes)";
        return text.str();
    };
    if (args.size > std::numeric_limits<uintptr_t>::max() - begin)
        invalid("memory_register: " + range() + " wraps past the end of the address space");
    const uintptr_t end = begin + static_cast<uintptr_t>(args.size);
    if (const std::string why = unusableRange(begin, end); !why.empty())
        invalid("memory_register: " + range() + " cannot be registered: " + why +
                "; register memory the application allocated and may write");
    // Made before the lock: its destructor (unregisterRange) takes the lock, so it must not
    // run while this function holds it (a throwing emplace below would otherwise self-deadlock).
    auto memory = std::make_unique<HostMemory>(*this, args.host, args.size, false);
    std::lock_guard lock(registeredMutex_);
    auto next = registered_.lower_bound(begin);
    const bool overlapsNext = next != registered_.end() && next->first < end;
    const bool overlapsPrevious = next != registered_.begin() &&
                                  std::prev(next)->first + std::prev(next)->second > begin;
    if (overlapsNext || overlapsPrevious) {
        const auto &other = overlapsNext ? *next : *std::prev(next);
        std::ostringstream text;
        text << "memory_register: " << range() << " overlaps the registered range ["
             << reinterpret_cast<const void *>(other.first) << ", +" << other.second
             << " bytes); register each range once (as CUDA's cuMemHostRegister requires)";
        invalid(text.str());
    }
    registered_.emplace(begin, args.size);
    memory->markRegistered();
    return memory;
}

void HostDevice::unregisterRange(const void *data) noexcept {
    std::lock_guard lock(registeredMutex_);
    registered_.erase(reinterpret_cast<uintptr_t>(data));
}

void *HostDevice::map(sdk::Memory &memory) {
    auto *page = dynamic_cast<HostMemory *>(&memory);
    if (page == nullptr || &page->owner() != this)
        invalid("memory_map: the memory was not allocated on this host device");
    return page->data();
}

HostStream &HostDevice::ownStream(sdk::Stream &stream) const {
    auto *hostStream = exactly<HostStream>(stream);
    if (hostStream == nullptr || hostStream->owner() != this)
        invalid("the stream was not created on this host device");
    return *hostStream;
}

HostMemory &HostDevice::ownMemory(bp_memory *memory, const char *what) const {
    if (memory == nullptr) invalid(std::string(what) + " is NULL");
    auto *page = exactly<HostMemory>(sdk::as<sdk::Memory>(memory));
    if (page == nullptr || &page->owner() != this)
        invalid(std::string(what) +
                " was not allocated on this host device (use copy_peer between devices)");
    return *page;
}

std::unique_ptr<sdk::Stream> HostDevice::createStream(const bp_stream_create_args &) {
    enter();
    return std::make_unique<HostStream>(this, async_, lost_);
}

std::unique_ptr<sdk::Event> HostDevice::flush(sdk::Stream &stream, const bp_flush_args &args,
                                              bool wantEvent) {
    HostStream &hostStream = ownStream(stream);
    // Work is handed to the worker as it is recorded; a flush only makes a completion point.
    if (!wantEvent) return nullptr;
    return hostStream.flush((args.flags & BP_FLUSH_TIMING_EVENT) != 0);
}

namespace {
const HostEvent &hostEvent(sdk::Event &event) {
    auto *found = exactly<HostEvent>(event);
    if (found == nullptr) invalid("the event was not created by the host plugin");
    return *found;
}
} // namespace

void HostDevice::waitEvent(sdk::Stream &stream, sdk::Event &event) {
    ownStream(stream).waitEvent(hostEvent(event));
}

bool HostDevice::eventWait(sdk::Event &event, uint64_t timeoutNs) {
    return hostEvent(event).wait(timeoutNs);
}

bool HostDevice::eventQuery(sdk::Event &event) { return hostEvent(event).query(); }

uint64_t HostDevice::elapsedNs(sdk::Event &start, sdk::Event &end) {
    const HostEvent &first = hostEvent(start);
    const HostEvent &last = hostEvent(end);
    if (!first.isTiming() || !last.isTiming())
        invalid("event_elapsed_ns: both events must be flushed with BP_FLUSH_TIMING_EVENT");
    if (!first.query() || !last.query())
        throw sdk::Error(BP_ERROR_NOT_READY,
                         "event_elapsed_ns: an event is still pending; wait for both first");
    const int64_t from = first.timestampNs();
    const int64_t to = last.timestampNs();
    if (to < from)
        invalid("event_elapsed_ns: the end event completed " + std::to_string(from - to) +
                " ns before the start event");
    return static_cast<uint64_t>(to - from);
}

HostDevice::Task HostDevice::hostToDeviceTask(const bp_copy_host_to_device_args &args) const {
    const HostMemory &dst = ownMemory(args.dst, "copy_host_to_device: dst");
    checkRange(dst, args.dst_offset, args.size, "copy_host_to_device", "dst");
    if (args.size == 0) return {};
    if (args.src == nullptr) invalid("copy_host_to_device: src is NULL");
    return [to = dst.data() + args.dst_offset, from = args.src, n = args.size] {
        std::memcpy(to, from, n);
    };
}

HostDevice::Task HostDevice::deviceToHostTask(const bp_copy_device_to_host_args &args) const {
    const HostMemory &src = ownMemory(args.src, "copy_device_to_host: src");
    checkRange(src, args.src_offset, args.size, "copy_device_to_host", "src");
    if (args.size == 0) return {};
    if (args.dst == nullptr) invalid("copy_device_to_host: dst is NULL");
    return [to = args.dst, from = src.data() + args.src_offset, n = args.size] {
        std::memcpy(to, from, n);
    };
}

HostDevice::Task HostDevice::copyTask(const HostMemory &source,
                                      const bp_copy_device_to_device_args &args,
                                      const char *operation) const {
    const HostMemory &dst = ownMemory(args.dst, (std::string(operation) + ": dst").c_str());
    checkRange(source, args.src_offset, args.size, operation, "src");
    checkRange(dst, args.dst_offset, args.size, operation, "dst");
    if (args.size == 0) return {};
    // memmove: a copy within one page may overlap.
    return [to = dst.data() + args.dst_offset, from = source.data() + args.src_offset,
            n = args.size] { std::memmove(to, from, n); };
}

HostDevice::Task HostDevice::fillTask(const bp_fill_args &args) const {
    const HostMemory &dst = ownMemory(args.dst, "fill: dst");
    if (args.offset % 4 != 0 || args.size % 4 != 0)
        invalid("fill: offset " + std::to_string(args.offset) + " and size " +
                std::to_string(args.size) + " must be multiples of 4");
    checkRange(dst, args.offset, args.size, "fill", "dst");
    if (args.size == 0) return {};
    return [to = dst.data() + args.offset, n = args.size, pattern = args.pattern] {
        for (uint64_t i = 0; i < n; i += 4)
            std::memcpy(to + i, &pattern, 4);
    };
}

void HostDevice::copyHostToDevice(sdk::Stream &stream, const bp_copy_host_to_device_args &args) {
    HostStream &hostStream = ownStream(stream);
    enter();
    Task task = hostToDeviceTask(args);
    if (Task fault = injectedFault(FaultOperation::Copy, [] { return std::string("copy_host_to_device"); }))
        task = std::move(fault);
    if (task) hostStream.submit(std::move(task));
}

void HostDevice::copyDeviceToHost(sdk::Stream &stream, const bp_copy_device_to_host_args &args) {
    HostStream &hostStream = ownStream(stream);
    enter();
    Task task = deviceToHostTask(args);
    if (Task fault = injectedFault(FaultOperation::Copy, [] { return std::string("copy_device_to_host"); }))
        task = std::move(fault);
    if (task) hostStream.submit(std::move(task));
}

void HostDevice::copyDeviceToDevice(sdk::Stream &stream,
                                    const bp_copy_device_to_device_args &args) {
    HostStream &hostStream = ownStream(stream);
    enter();
    Task task = copyTask(ownMemory(args.src, "copy_device_to_device: src"), args,
                         "copy_device_to_device");
    if (Task fault = injectedFault(FaultOperation::Copy, [] { return std::string("copy_device_to_device"); }))
        task = std::move(fault);
    if (task) hostStream.submit(std::move(task));
}

void HostDevice::copyPeer(sdk::Stream &stream, sdk::Device &source,
                          const bp_copy_device_to_device_args &args) {
    HostStream &hostStream = ownStream(stream);
    enter();
    auto *sourceDevice = dynamic_cast<HostDevice *>(&source);
    if (sourceDevice == nullptr) invalid("copy_peer: the source device is not a host device");
    Task task = copyTask(sourceDevice->ownMemory(args.src, "copy_peer: src"), args, "copy_peer");
    if (Task fault = injectedFault(FaultOperation::Copy, [] { return std::string("copy_peer"); }))
        task = std::move(fault);
    if (task) hostStream.submit(std::move(task));
}

void HostDevice::fill(sdk::Stream &stream, const bp_fill_args &args) {
    HostStream &hostStream = ownStream(stream);
    enter();
    Task task = fillTask(args);
    if (Task fault = injectedFault(FaultOperation::Fill, [] { return std::string("fill"); }))
        task = std::move(fault);
    if (task) hostStream.submit(std::move(task));
}

void HostDevice::compile(const bp_kernel_compile_args &args, sdk::CompileOutput &out) {
    const std::string entry = args.entry_point ? args.entry_point : "";
    if (sdk::rawValue(args.dialect) == BP_DIALECT_CPP) {
        // Runs the system's compiler in this thread: the core calls kernel_compile outside its
        // locks, and this plugin takes none here.
        if (args.source == nullptr && args.source_size != 0)
            invalid("kernel_compile of '" + entry + "': source is NULL");
        std::vector<std::string> options;
        for (uint32_t i = 0; i < args.option_count && args.options != nullptr; ++i)
            if (args.options[i] != nullptr) options.emplace_back(args.options[i]);
        out.binary = compiler_->compile(
            entry, std::string_view(static_cast<const char *>(args.source), args.source_size),
            options, out.log);
        return;
    }
    if (sdk::rawValue(args.dialect) != BP_DIALECT_HOST)
        throw sdk::Error(sdk::refusedDialectStatus(args.dialect),
                         "kernel_compile of '" + entry +
                             "': the host plugin runs only the host "
                             "dialect (native functions) and C++ (compiled), not " +
                             sdk::dialectName(args.dialect) +
                             "; give the kernel a host variant or use a GPU plugin");
    const bp_host_kernel_source source =
        readHostSource(args.source, args.source_size, "kernel_compile of '" + entry + "'");
    // The blob is the source at this plugin's full size, so user_data travels to kernel_load.
    const auto *bytes = reinterpret_cast<const unsigned char *>(&source);
    out.binary.assign(bytes, bytes + sizeof(source));
    std::ostringstream log;
    log << "host kernel '" << entry << "': native function at "
        << reinterpret_cast<const void *>(source.function) << " with user_data " << source.user_data
        << "; the blob is valid in this process only\n";
    out.log = log.str();
}

std::unique_ptr<sdk::Kernel> HostDevice::load(const bp_kernel_load_args &args) {
    const std::string entry = args.entry_point ? args.entry_point : "";
    if (sdk::rawValue(args.dialect) == BP_DIALECT_CPP) {
        std::shared_ptr<const LoadedObject> code =
            compiler_->load(entry, args.binary, args.binary_size);
        const bp_host_kernel_fn fn = code->entry();
        return std::make_unique<HostKernel>(fn, nullptr, entry, std::move(code));
    }
    if (sdk::rawValue(args.dialect) != BP_DIALECT_HOST)
        throw sdk::Error(sdk::refusedDialectStatus(args.dialect), "kernel_load of '" + entry +
                                                   "': the host plugin cannot load a " +
                                                   sdk::dialectName(args.dialect) + " blob");
    const bp_host_kernel_source source =
        readHostSource(args.binary, args.binary_size, "kernel_load of '" + entry + "'");
    return std::make_unique<HostKernel>(source.function, source.user_data, entry);
}

HostDevice::Task HostDevice::launchTask(const bp_launch_args &args) {
    if (args.kernel == nullptr) invalid("kernel_launch: kernel is NULL");
    auto *kernel = exactly<HostKernel>(sdk::as<sdk::Kernel>(args.kernel));
    if (kernel == nullptr) invalid("kernel_launch: the kernel was not loaded by the host plugin");
    // Messages are built only on failure: this is the launch hot path.
    const auto what = [kernel] { return "kernel_launch of '" + kernel->entryPoint() + "'"; };

    LaunchRecord record;
    record.function = kernel->function();
    record.userData = kernel->userData();
    record.code = kernel->code();

    uint64_t threads = 1;
    for (int d = 0; d < 3; ++d) {
        if (args.block[d] == 0 || args.block[d] > info_.max_block_size[d])
            rejectLaunch(what() + ": block " + dims(args.block) + " must lie within (1, 1, 1) and " +
                         dims(info_.max_block_size));
        threads *= args.block[d];
        record.block[d] = args.block[d];
    }
    if (threads > info_.max_block_threads)
        rejectLaunch(what() + ": block " + dims(args.block) + " has " + std::to_string(threads) +
                     " threads, more than " + std::to_string(info_.max_block_threads));
    if (args.shared_memory_bytes > info_.max_shared_memory_bytes)
        rejectLaunch(what() + ": host kernels get no dynamic shared memory (asked for " +
                     std::to_string(args.shared_memory_bytes) +
                     " bytes); use a local array in the function");

    if (args.grid_memory != nullptr) {
        const HostMemory &gridPage = ownMemory(args.grid_memory, (what() + ": grid_memory").c_str());
        if (args.grid_offset % 4 != 0)
            invalid(what() + ": grid_offset " + std::to_string(args.grid_offset) +
                    " must be a multiple of 4");
        checkRange(gridPage, args.grid_offset, 3 * sizeof(uint32_t), what().c_str(), "grid_memory");
        record.indirectGrid = gridPage.data() + args.grid_offset;
        record.entryPoint = kernel->entryPoint();
    } else {
        for (int d = 0; d < 3; ++d) {
            if (args.grid[d] > info_.max_grid_size[d])
                rejectLaunch(what() + ": grid " + dims(args.grid) + " exceeds max_grid_size " +
                             dims(info_.max_grid_size));
            record.grid[d] = args.grid[d];
        }
    }

    if (args.binding_count > info_.max_bindings)
        rejectLaunch(what() + ": " + std::to_string(args.binding_count) +
                     " bindings, more than the host device's " +
                     std::to_string(info_.max_bindings));
    if (args.binding_count > 0 && args.bindings == nullptr)
        invalid(what() + ": binding_count is " + std::to_string(args.binding_count) +
                " but bindings is NULL");
    record.bufferCount = args.binding_count;
    const bool inlineBindings = args.binding_count <= LaunchRecord::kInlineBindings;
    if (!inlineBindings) {
        record.moreBuffers.resize(args.binding_count);
        record.moreSizes.resize(args.binding_count);
    }
    void **buffers = inlineBindings ? record.inlineBuffers : record.moreBuffers.data();
    uint64_t *bufferSizes = inlineBindings ? record.inlineSizes : record.moreSizes.data();
    for (uint32_t i = 0; i < args.binding_count; ++i) {
        const bp_binding &binding = args.bindings[i];
        try {
            const HostMemory &page = ownMemory(binding.memory, "memory");
            if (binding.offset % info_.binding_alignment != 0)
                invalid("offset " + std::to_string(binding.offset) +
                        " is not a multiple of binding_alignment " +
                        std::to_string(info_.binding_alignment));
            checkRange(page, binding.offset, binding.size, "range", "binding");
            buffers[i] = page.data() + binding.offset;
            bufferSizes[i] = binding.size;
        } catch (const sdk::Error &e) {
            throw sdk::Error(e.code(), what() + ": binding " + std::to_string(i) + ": " + e.what());
        }
    }

    if (args.scalar_size > info_.max_scalar_bytes)
        rejectLaunch(what() + ": " + std::to_string(args.scalar_size) + " scalar bytes, more than " +
                     std::to_string(info_.max_scalar_bytes));
    if (args.scalar_size > 0) {
        if (args.scalars == nullptr)
            invalid(what() + ": scalar_size is " + std::to_string(args.scalar_size) +
                    " but scalars is NULL");
        // The caller's bytes may change after the call.
        const auto *bytes = static_cast<const unsigned char *>(args.scalars);
        record.scalarSize = args.scalar_size;
        if (args.scalar_size <= LaunchRecord::kInlineScalarBytes)
            std::memcpy(record.inlineScalars, bytes, args.scalar_size);
        else
            record.moreScalars.assign(bytes, bytes + args.scalar_size);
    }

    return [this, launch = std::move(record)] { runLaunch(launch, pool_, info_); };
}

void HostDevice::launch(sdk::Stream &stream, const bp_launch_args &args) {
    HostStream &hostStream = ownStream(stream);
    enter();
    Task task = launchTask(args);
    if (Task fault = injectedFault(FaultOperation::Launch, [&args] {
            const auto *kernel = exactly<HostKernel>(sdk::as<sdk::Kernel>(args.kernel));
            return "the launch of '" + (kernel ? kernel->entryPoint() : std::string("?")) + "'";
        }))
        task = std::move(fault);
    hostStream.submit(std::move(task));
}

// ----- graphs (ABI 1.3): replay lists -----------------------------------------------------------

HostGraph::Step HostDevice::graphStep(const sdk::GraphOp &op) {
    HostGraph::Step step;
    step.kind = op.kind;
    switch (op.kind) {
    case BP_GRAPH_OP_LAUNCH:
        step.kernel = op.launch.kernel;
        std::copy(std::begin(op.launch.block), std::end(op.launch.block), step.block);
        step.bindingCount = op.launch.binding_count;
        step.run = launchTask(op.launch);
        break;
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE: step.run = hostToDeviceTask(op.toDevice); break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST: step.run = deviceToHostTask(op.toHost); break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        step.run = copyTask(ownMemory(op.copy.src, "copy_device_to_device: src"), op.copy,
                            "copy_device_to_device");
        break;
    case BP_GRAPH_OP_FILL: step.run = fillTask(op.fill); break;
    }
    return step;
}

std::unique_ptr<sdk::Graph> HostDevice::createGraph(std::vector<sdk::GraphOp> &ops) {
    std::vector<HostGraph::Step> steps;
    steps.reserve(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) {
        try {
            steps.push_back(graphStep(ops[i]));
        } catch (const sdk::Error &e) {
            throw sdk::Error(e.code(), "graph_create: op " + std::to_string(i) + ": " + e.what());
        }
    }
    return std::make_unique<HostGraph>(std::move(steps));
}

void HostDevice::launchGraph(sdk::Stream &stream, sdk::Graph &graph) {
    HostStream &hostStream = ownStream(stream);
    auto *list = dynamic_cast<HostGraph *>(&graph);
    if (list == nullptr) invalid("graph_launch: the graph was not made by the host plugin");
    enter();
    // One task for the whole list: the per-op cost is a call, not a queue hand-off.
    Task task = [steps = list->steps()] {
        for (const HostGraph::Step &step : *steps)
            if (step.run) step.run();
    };
    if (Task fault = injectedFault(FaultOperation::Replay, [] { return std::string("graph_launch (a replay)"); }))
        task = std::move(fault);
    hostStream.submit(std::move(task));
}

void HostDevice::updateGraph(sdk::Graph &graph, uint32_t index, sdk::GraphOp &op) {
    auto *list = dynamic_cast<HostGraph *>(&graph);
    if (list == nullptr) invalid("graph_update: the graph was not made by the host plugin");
    const std::vector<HostGraph::Step> &steps = *list->steps();
    const std::string what = "graph_update: op " + std::to_string(index);
    if (index >= steps.size())
        invalid(what + " does not exist: the graph has " + std::to_string(steps.size()) + " ops");
    const HostGraph::Step &old = steps[index];
    if (op.kind != old.kind)
        invalid(what + ": the kind cannot change (" + std::to_string(old.kind) + " -> " +
                std::to_string(op.kind) + ")");
    if (op.kind == BP_GRAPH_OP_LAUNCH &&
        (op.launch.kernel != old.kernel || op.launch.binding_count != old.bindingCount ||
         !std::equal(std::begin(old.block), std::end(old.block), std::begin(op.launch.block))))
        invalid(what + ": a launch keeps its kernel, block size and number of bindings");
    HostGraph::Step step = graphStep(op);
    // Copy on write: a replay already queued runs the list it captured.
    auto next = std::make_shared<std::vector<HostGraph::Step>>(steps);
    (*next)[index] = std::move(step);
    list->replace(std::move(next));
}

bool HostDevice::peerAccess(sdk::Device &src) {
    const auto *source = dynamic_cast<const HostDevice *>(&src);
    return source != nullptr && source->plugin_ == plugin_;
}

std::unique_ptr<sdk::Comm> HostDevice::createComm(const bp_comm_create_args &args) {
    return HostComm::join(this, args, options_, *gloo_);
}

void HostDevice::collective(sdk::Stream &stream, sdk::Comm &comm, const bp_collective_args &args) {
    HostStream &hostStream = ownStream(stream);
    auto *hostComm = dynamic_cast<HostComm *>(&comm);
    if (hostComm == nullptr || hostComm->owner() != this)
        invalid("collective: the communicator was not created on this host device");
    enter();
    if (Task fault = injectedFault(FaultOperation::Collective,
                                   [] { return std::string("a collective"); })) {
        hostStream.submit(std::move(fault)); // this rank fails here; its peers see it leave
        return;
    }
    // Only the handles the operation uses are looked at (RECV ignores send, for instance).
    hostComm->record(hostStream, args, [this](bp_memory *memory, const std::string &what) {
        return &ownMemory(memory, what.c_str());
    });
}

uint64_t HostDevice::nativeHandle(bp_native_kind kind, const void *object) {
    switch (kind) {
    case BP_NATIVE_DEVICE:
        return reinterpret_cast<uint64_t>(this);
    case BP_NATIVE_MEMORY: {
        auto *memory = static_cast<bp_memory *>(const_cast<void *>(object));
        return reinterpret_cast<uint64_t>(ownMemory(memory, "native_handle: memory").data());
    }
    case BP_NATIVE_STREAM: {
        if (object == nullptr) invalid("native_handle: stream is NULL");
        auto *stream = static_cast<bp_stream *>(const_cast<void *>(object));
        return reinterpret_cast<uint64_t>(&ownStream(sdk::as<sdk::Stream>(stream)));
    }
    }
    invalid("native_handle: unknown kind " + std::to_string(static_cast<int>(kind)));
}

} // namespace backplane::host
