// The case context, the checks and the RAII handles of the conformance suite.
#include "handles.hpp"

#include <algorithm>
#include <cstring>

namespace backplane::conformance {

std::vector<Case> &registry() {
    static std::vector<Case> cases;
    return cases;
}

CaseContext::CaseContext(RawPlugin plugin, std::string optionsJson, uint32_t index,
                         uint32_t deviceCount, bp_device_info info)
    : plugin_(std::move(plugin)), optionsJson_(std::move(optionsJson)), index_(index),
      deviceCount_(deviceCount), info_(info) {}

CaseContext::~CaseContext() = default;

OpenDevice &CaseContext::device() {
    if (!device_) device_ = std::make_unique<OpenDevice>(*this);
    return *device_;
}

void CaseContext::closeDevice() { device_.reset(); }

std::string statusList(std::initializer_list<bp_status> statuses) {
    std::string text;
    for (const bp_status s : statuses) text += (text.empty() ? "" : " or ") + std::string(toString(s));
    return text;
}

void succeed(bp_status status, const bp_error &error, const std::string &what) {
    if (status == BP_SUCCESS) return;
    std::string message = what + " returned " + toString(status);
    if (const std::string text = errorMessage(error); !text.empty()) message += ": " + text;
    throw CaseFailure(message);
}

void expectFailure(bp_status status, const bp_error &error, std::initializer_list<bp_status> allowed,
                   const std::string &what) {
    bool ok = false;
    for (const bp_status s : allowed) ok = ok || s == status;
    if (!ok)
        throw CaseFailure(what + " returned " + toString(status) + ", expected " +
                          statusList(allowed) +
                          (status == BP_SUCCESS ? "" : " (message: " + errorMessage(error) + ")"));
    if (error.code != status)
        throw CaseFailure(what + " returned " + toString(status) + " but set bp_error::code to " +
                          toString(error.code) + " (they must be equal)");
    if (errorMessage(error).empty())
        throw CaseFailure(what + " failed with " + toString(status) +
                          " but left bp_error::message empty (say what was wrong)");
}

// OpenDevice --------------------------------------------------------------------------------------

OpenDevice::OpenDevice(CaseContext &ctx) : ctx_(ctx) {
    auto args = abi::make<bp_device_open_args>();
    bp_error error = makeError();
    bp_device *device = nullptr;
    succeed(api().device_open(ctx.plugin(), ctx.index(), &args, &device, &error), error,
            "device_open(" + std::to_string(ctx.index()) + ")");
    device_ = Owned<bp_device>(api(), device);
    require(device != nullptr, "device_open succeeded but returned a NULL device");
}

Page OpenDevice::allocate(bp_memory_kind kind, uint64_t size) {
    Page page = allocateIfSupported(kind, size);
    if (!page.memory)
        throw CaseFailure("memory_allocate(kind " + std::to_string(kind) +
                          ") is unsupported, but this case needs it");
    return page;
}

Page OpenDevice::allocateIfSupported(bp_memory_kind kind, uint64_t size) {
    auto args = abi::make<bp_memory_allocate_args>();
    args.kind = kind;
    args.size = size;
    bp_memory *memory = nullptr;
    void *mapped = nullptr;
    bp_error error = makeError();
    const bp_status status = api().memory_allocate(get(), &args, &memory, &mapped, &error);
    if (status == BP_ERROR_UNSUPPORTED && kind != BP_MEMORY_DEVICE) return {};
    succeed(status, error, "memory_allocate(kind " + std::to_string(kind) + ", " +
                               std::to_string(size) + " bytes)");
    require(memory != nullptr, "memory_allocate succeeded but returned a NULL page");
    if (kind != BP_MEMORY_DEVICE)
        require(mapped != nullptr, "memory_allocate of a host-mapped kind (" + std::to_string(kind) +
                                       ") returned no host address");
    return {Owned<bp_memory>(api(), get(), memory), mapped, size};
}

Stream OpenDevice::createStream() {
    auto args = abi::make<bp_stream_create_args>();
    bp_stream *stream = nullptr;
    bp_error error = makeError();
    succeed(api().stream_create(get(), &args, &stream, &error), error, "stream_create");
    require(stream != nullptr, "stream_create succeeded but returned a NULL stream");
    return Stream(api(), get(), stream);
}

Event OpenDevice::flush(const Stream &stream, uint32_t flags) {
    auto args = abi::make<bp_flush_args>();
    args.flags = flags;
    bp_event *event = nullptr;
    bp_error error = makeError();
    succeed(api().stream_flush(get(), stream.get(), &args, &event, &error), error,
            "stream_flush");
    require(event != nullptr, "stream_flush was asked for an event but returned NULL");
    return Event(api(), get(), event);
}

void OpenDevice::wait(const Event &event) {
    bp_error error = makeError();
    succeed(api().event_wait(get(), event.get(), UINT64_MAX, &error), error,
            "event_wait(forever)");
}

void OpenDevice::finish(const Stream &stream) { wait(flush(stream)); }

bp_status OpenDevice::tryUpload(const Stream &stream, const Page &page, uint64_t offset,
                                const void *data, uint64_t size, bp_error &error) {
    auto args = abi::make<bp_copy_host_to_device_args>();
    args.src = data;
    args.dst = page.get();
    args.dst_offset = offset;
    args.size = size;
    return api().copy_host_to_device(get(), stream.get(), &args, &error);
}

bp_status OpenDevice::tryDownload(const Stream &stream, const Page &page, uint64_t offset,
                                  void *into, uint64_t size, bp_error &error) {
    auto args = abi::make<bp_copy_device_to_host_args>();
    args.src = page.get();
    args.src_offset = offset;
    args.dst = into;
    args.size = size;
    return api().copy_device_to_host(get(), stream.get(), &args, &error);
}

bp_status OpenDevice::tryCopy(const Stream &stream, const Page &src, uint64_t srcOffset,
                              const Page &dst, uint64_t dstOffset, uint64_t size, bp_error &error) {
    auto args = abi::make<bp_copy_device_to_device_args>();
    args.src = src.get();
    args.src_offset = srcOffset;
    args.dst = dst.get();
    args.dst_offset = dstOffset;
    args.size = size;
    return api().copy_device_to_device(get(), stream.get(), &args, &error);
}

bp_status OpenDevice::tryFill(const Stream &stream, const Page &page, uint64_t offset,
                              uint64_t size, uint32_t pattern, bp_error &error) {
    auto args = abi::make<bp_fill_args>();
    args.dst = page.get();
    args.offset = offset;
    args.size = size;
    args.pattern = pattern;
    return api().fill(get(), stream.get(), &args, &error);
}

namespace {
std::string range(uint64_t offset, uint64_t size) {
    return "(offset " + std::to_string(offset) + ", " + std::to_string(size) + " bytes)";
}
} // namespace

void OpenDevice::upload(const Stream &stream, const Page &page, uint64_t offset, const void *data,
                        uint64_t size) {
    bp_error error = makeError();
    succeed(tryUpload(stream, page, offset, data, size, error), error,
            "copy_host_to_device" + range(offset, size));
}

void OpenDevice::download(const Stream &stream, const Page &page, uint64_t offset, void *into,
                          uint64_t size) {
    bp_error error = makeError();
    succeed(tryDownload(stream, page, offset, into, size, error), error,
            "copy_device_to_host" + range(offset, size));
}

void OpenDevice::fill(const Stream &stream, const Page &page, uint64_t offset, uint64_t size,
                      uint32_t pattern) {
    bp_error error = makeError();
    succeed(tryFill(stream, page, offset, size, pattern, error), error, "fill" + range(offset, size));
}

Page OpenDevice::pageWith(const Stream &stream, const std::vector<uint8_t> &bytes) {
    Page page = allocate(BP_MEMORY_DEVICE, bytes.size());
    upload(stream, page, 0, bytes.data(), bytes.size());
    finish(stream);
    return page;
}

std::vector<uint8_t> OpenDevice::readAll(const Stream &stream, const Page &page) {
    std::vector<uint8_t> bytes(page.size);
    download(stream, page, 0, bytes.data(), bytes.size());
    finish(stream);
    return bytes;
}

bp_status compileKernel(const OpenDevice &device, bp_dialect dialect, const KernelText &source,
                        std::vector<uint8_t> &binary, std::string &log, bp_error &error) {
    struct Sinks {
        static void toBytes(void *user, const void *data, size_t size) {
            auto *out = static_cast<std::vector<uint8_t> *>(user);
            out->insert(out->end(), static_cast<const uint8_t *>(data),
                        static_cast<const uint8_t *>(data) + size);
        }
        static void toText(void *user, const void *data, size_t size) {
            static_cast<std::string *>(user)->append(static_cast<const char *>(data), size);
        }
    };
    auto args = abi::make<bp_kernel_compile_args>();
    args.dialect = dialect;
    args.entry_point = source.entry;
    args.source = source.source;
    args.source_size = source.size;
    args.binary = {&binary, &Sinks::toBytes};
    args.log = {&log, &Sinks::toText};
    return device.api().kernel_compile(device.get(), &args, &error);
}

Kernel OpenDevice::saxpy(bp_dialect dialect) {
    const KernelText source = saxpySource(dialect);
    std::vector<uint8_t> binary;
    std::string log;
    bp_error error = makeError();
    const bp_status status = compileKernel(*this, dialect, source, binary, log, error);
    if (status != BP_SUCCESS)
        succeed(status, error, "kernel_compile(saxpy, dialect " + std::to_string(dialect) + ")" +
                                   (log.empty() ? "" : " log: " + fieldText(log.data(), std::min<size_t>(log.size(), 2000))));
    require(!binary.empty(), "kernel_compile succeeded but wrote no binary");
    auto load = abi::make<bp_kernel_load_args>();
    load.dialect = dialect;
    load.entry_point = source.entry;
    load.binary = binary.data();
    load.binary_size = binary.size();
    bp_kernel *kernel = nullptr;
    error = makeError();
    succeed(api().kernel_load(get(), &load, &kernel, &error), error, "kernel_load(saxpy)");
    require(kernel != nullptr, "kernel_load succeeded but returned a NULL kernel");
    return Kernel(api(), get(), kernel);
}

bp_dialect OpenDevice::saxpyDialect() const {
    for (const bp_dialect d : {BP_DIALECT_HOST, BP_DIALECT_CUDA, BP_DIALECT_HIP, BP_DIALECT_GLSL})
        if (ctx_.accepts(d)) return d;
    throw NotApplicable("the device accepts none of the dialects the suite has kernels in "
                        "(host, cuda, hip, glsl)");
}

Kernel OpenDevice::saxpy() { return saxpy(saxpyDialect()); }

bp_launch_args saxpyArgs(const Kernel &kernel, const Page &x, const Page &y, float a, uint32_t n,
                         uint32_t block, uint64_t xOffset, bp_binding (&bindings)[2],
                         SaxpyScalars &scalars) {
    bindings[0] = {x.get(), xOffset, uint64_t{n} * sizeof(float)};
    bindings[1] = {y.get(), 0, uint64_t{n} * sizeof(float)};
    scalars = {a, n};
    auto args = abi::make<bp_launch_args>();
    args.kernel = kernel.get();
    args.grid[0] = (n + block - 1) / block;
    args.grid[1] = args.grid[2] = 1;
    args.block[0] = block;
    args.block[1] = args.block[2] = 1;
    args.bindings = bindings;
    args.binding_count = 2;
    args.scalars = &scalars;
    args.scalar_size = sizeof(scalars);
    return args;
}

bp_status OpenDevice::launchSaxpy(const Stream &stream, const Kernel &kernel, const Page &x,
                                  const Page &y, float a, uint32_t n, bp_error &error,
                                  uint64_t xOffset, uint32_t block) {
    bp_binding bindings[2];
    SaxpyScalars scalars;
    const bp_launch_args args = saxpyArgs(kernel, x, y, a, n, block, xOffset, bindings, scalars);
    return api().kernel_launch(get(), stream.get(), &args, &error);
}

// Data helpers ------------------------------------------------------------------------------------

std::vector<uint8_t> floatBytes(const std::vector<float> &values) {
    std::vector<uint8_t> bytes(values.size() * sizeof(float));
    std::memcpy(bytes.data(), values.data(), bytes.size());
    return bytes;
}

std::vector<float> bytesToFloats(const std::vector<uint8_t> &bytes) {
    std::vector<float> values(bytes.size() / sizeof(float));
    std::memcpy(values.data(), bytes.data(), values.size() * sizeof(float));
    return values;
}

std::vector<uint8_t> patternBytes(size_t size, uint32_t seed) {
    std::vector<uint8_t> bytes(size);
    uint32_t state = seed * 2654435761u + 1;
    for (auto &b : bytes) {
        state = state * 1664525u + 1013904223u;
        b = static_cast<uint8_t>(state >> 24);
    }
    return bytes;
}

} // namespace backplane::conformance
