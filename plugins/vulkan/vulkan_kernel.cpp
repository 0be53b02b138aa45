// Kernels on the Vulkan plugin: GLSL → SPIR-V with shaderc, SPIR-V checks and reflection, compute
// pipelines (block size through specialization constants) and the VkPipelineCache persisted on
// disk.
#include "vulkan_device.hpp"
#include "vulkan_reflect.hpp"

#include <shaderc/shaderc.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

namespace backplane::vulkan {
namespace {

constexpr uint32_t kSpirvMagic = 0x07230203;
constexpr uint32_t kSpirvMaxVersion = 0x00010600; // SPIR-V 1.6

// On-disk pipeline cache: our header (magic, byte count, FNV-1a of the bytes) so a truncated or
// corrupt file is detected before the driver sees it, then the driver's blob.
constexpr char kCacheMagic[8] = {'B', 'P', 'V', 'K', 'P', 'C', '0', '1'};

uint64_t fnv1a(const unsigned char *data, size_t size) {
    uint64_t hash = 1469598103934665603ull;
    for (size_t i = 0; i < size; ++i) hash = (hash ^ data[i]) * 1099511628211ull;
    return hash;
}

/// Replaces `path` with `bytes` so that the file is always whole: a temporary file next to it is
/// written completely, fsynced, closed and its size checked, and only then renamed over `path`
/// (atomic within a directory). Any failure (a full disk: ENOSPC or EFBIG at write, fsync or
/// close) removes the temporary file and leaves the previous file untouched. A directory removed
/// by `backplane cache clear` is created again. Returns "" or what failed, with errno's text.
std::string publishFile(const std::string &path, const std::vector<unsigned char> &bytes) {
    const std::filesystem::path target(path);
    std::error_code ec;
    std::filesystem::create_directories(target.parent_path(), ec);
    // A random part too: a crashed process may have left a temporary file of a reused pid.
    static std::atomic<uint64_t> counter{0};
    std::random_device random;
    const std::string temp = path + ".tmp." + std::to_string(::getpid()) + "." +
                             std::to_string(counter.fetch_add(1)) + "." + std::to_string(random());
    const auto failed = [&](const std::string &step, int error) {
        ::unlink(temp.c_str());
        return step + " " + temp + ": " + std::strerror(error);
    };
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) return "cannot create " + temp + ": " + std::strerror(errno);
    size_t done = 0;
    while (done < bytes.size()) {
        const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            const int error = n < 0 ? errno : ENOSPC;
            ::close(fd);
            return failed("cannot write", error);
        }
        done += static_cast<size_t>(n);
    }
    struct stat written {};
    if (::fsync(fd) != 0) {
        const int error = errno;
        ::close(fd);
        return failed("cannot flush", error);
    }
    if (::fstat(fd, &written) != 0) {
        const int error = errno;
        ::close(fd);
        return failed("cannot check", error);
    }
    // close() reports write-back errors some file systems (NFS) only detect there.
    if (::close(fd) != 0) return failed("cannot close", errno);
    if (static_cast<uint64_t>(written.st_size) != bytes.size()) {
        ::unlink(temp.c_str());
        return temp + " holds " + std::to_string(written.st_size) + " of " +
               std::to_string(bytes.size()) + " bytes";
    }
    if (::rename(temp.c_str(), path.c_str()) != 0) return failed("cannot rename", errno);
    return {};
}

struct ShadercCompiler {
    shaderc_compiler_t compiler = shaderc_compiler_initialize();
    shaderc_compile_options_t options = shaderc_compile_options_initialize();
    shaderc_compilation_result_t result = nullptr;
    ~ShadercCompiler() {
        if (result) shaderc_result_release(result);
        shaderc_compile_options_release(options);
        shaderc_compiler_release(compiler);
    }
};

void validateSpirv(const void *data, size_t size, const std::string &what) {
    if (data == nullptr || size < 20 || size % 4 != 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         what + ": not SPIR-V (" + std::to_string(size) +
                             " bytes; a module is at least 20 bytes and a multiple of 4)");
    uint32_t header[2];
    std::memcpy(header, data, sizeof header);
    if (header[0] != kSpirvMagic)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         what + ": not SPIR-V (bad magic number; expected 0x07230203)");
    if (header[1] > kSpirvMaxVersion || (header[1] & 0xff0000ff) != 0)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         what + ": unsupported SPIR-V version word 0x" + [&] {
                             char text[16];
                             std::snprintf(text, sizeof text, "%08x", header[1]);
                             return std::string(text);
                         }());
}

} // namespace

void VulkanDevice::compile(const bp_kernel_compile_args &args, sdk::CompileOutput &out) {
    const std::string entry = args.entry_point ? args.entry_point : "main";
    const std::string what = "kernel '" + entry + "'";
    if (args.source == nullptr)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, what + ": source is NULL");
    if (args.dialect == BP_DIALECT_SPIRV) {
        validateSpirv(args.source, args.source_size, what);
        const auto *bytes = static_cast<const unsigned char *>(args.source);
        out.binary.assign(bytes, bytes + args.source_size);
        return;
    }
    if (args.dialect != BP_DIALECT_GLSL)
        throw sdk::Error(sdk::refusedDialectStatus(args.dialect),
                         what + ": the Vulkan plugin compiles GLSL and SPIR-V kernels only");

    ShadercCompiler sc;
    if (sc.compiler == nullptr || sc.options == nullptr)
        throw sdk::Error(BP_ERROR_INTERNAL, "shaderc_compiler_initialize failed");
    shaderc_compile_options_set_target_env(sc.options, shaderc_target_env_vulkan,
                                           shaderc_env_version_vulkan_1_2);
    shaderc_compile_options_set_optimization_level(sc.options,
                                                   shaderc_optimization_level_performance);
    // Generated kernels (backplane/lang.hpp) ask for IEEE signed zeros, infinities and NaNs
    // under this macro (SPIR-V SignedZeroInfNanPreserve): only where the device supports it,
    // since a module with a capability the device lacks must not reach its driver.
    if (physical_.preserveFloatSpecials) {
        static constexpr char kPreserve[] = "BP_PRESERVE_FLOAT_SPECIALS";
        shaderc_compile_options_add_macro_definition(sc.options, kPreserve, sizeof kPreserve - 1,
                                                     "1", 1);
    }
    for (uint32_t i = 0; i < args.option_count; ++i) {
        const std::string option = args.options[i] ? args.options[i] : "";
        if (option.rfind("-D", 0) == 0 && option.size() > 2) {
            const size_t eq = option.find('=');
            const std::string name = option.substr(2, eq == std::string::npos ? eq : eq - 2);
            const std::string value = eq == std::string::npos ? "" : option.substr(eq + 1);
            shaderc_compile_options_add_macro_definition(sc.options, name.data(), name.size(),
                                                         value.data(), value.size());
        } else if (option == "-O0") {
            shaderc_compile_options_set_optimization_level(sc.options,
                                                           shaderc_optimization_level_zero);
        } else if (option == "-Os") {
            shaderc_compile_options_set_optimization_level(sc.options,
                                                           shaderc_optimization_level_size);
        } else if (option == "-g") {
            shaderc_compile_options_set_generate_debug_info(sc.options);
        } else if (option != "-O") {
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             what + ": unknown GLSL compile option '" + option +
                                 "' (known: -DNAME[=VALUE], -O, -O0, -Os, -g)");
        }
    }
    // GLSL's function is always main(), and so is the SPIR-V entry point; `entry` names the
    // kernel in messages and file names.
    const std::string file = entry + ".comp";
    sc.result = shaderc_compile_into_spv(sc.compiler, static_cast<const char *>(args.source),
                                         args.source_size, shaderc_compute_shader, file.c_str(),
                                         entry.c_str(), sc.options);
    const char *log = sc.result ? shaderc_result_get_error_message(sc.result) : nullptr;
    out.log = log ? log : "";
    if (sc.result == nullptr ||
        shaderc_result_get_compilation_status(sc.result) != shaderc_compilation_status_success) {
        std::string message = "GLSL compile of " + what + " failed";
        if (!out.log.empty()) message += ":\n" + out.log;
        throw sdk::Error(BP_ERROR_COMPILE, message,
                         sc.result ? shaderc_result_get_compilation_status(sc.result) : 0);
    }
    const auto *bytes = reinterpret_cast<const unsigned char *>(shaderc_result_get_bytes(sc.result));
    out.binary.assign(bytes, bytes + shaderc_result_get_length(sc.result));
}

std::unique_ptr<sdk::Kernel> VulkanDevice::load(const bp_kernel_load_args &args) {
    failIfUnusable();
    if (args.dialect != BP_DIALECT_GLSL && args.dialect != BP_DIALECT_SPIRV)
        throw sdk::Error(sdk::refusedDialectStatus(args.dialect),
                         "kernel_load: the Vulkan plugin loads SPIR-V blobs (GLSL or SPIR-V)");
    return std::make_unique<VulkanKernel>(*this, args);
}

VulkanKernel::VulkanKernel(VulkanDevice &device, const bp_kernel_load_args &args)
    : device_(device), entryPoint_(args.entry_point ? args.entry_point : "main") {
    const std::string what = "kernel_load of '" + entryPoint_ + "'";
    validateSpirv(args.binary, args.binary_size, what);
    // GLSL modules always name their entry point "main" (shaderc ignores the name for GLSL), so
    // a module with one compute entry point is taken whatever the kernel is called. Reflection
    // runs before the driver sees the module: a module SPIRV-Cross cannot parse, or one using
    // descriptors the plugin never binds, is refused here instead of crashing a driver.
    ShaderInterface shader = reflectComputeShader(args.binary, args.binary_size, entryPoint_,
                                                  args.dialect == BP_DIALECT_GLSL, what);
    const bp_device_info &limits = device.physical().info;
    if (shader.bindingCount > limits.max_bindings)
        throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": the shader uses storage-buffer binding " +
                                                   std::to_string(shader.bindingCount - 1) +
                                                   "; a launch binds at most " +
                                                   std::to_string(limits.max_bindings));
    if (shader.pushConstantBytes > limits.max_scalar_bytes)
        throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": the shader's push-constant block is " +
                                                   std::to_string(shader.pushConstantBytes) +
                                                   " bytes; the device allows " +
                                                   std::to_string(limits.max_scalar_bytes));
    spirvEntryPoint_ = std::move(shader.entryPoint);
    bindingCount_ = shader.bindingCount;
    pushConstantBytes_ = shader.pushConstantBytes;
    auto info = vkStruct<VkShaderModuleCreateInfo>(VK_STRUCTURE_TYPE_SHADER_MODULE_CREATE_INFO);
    info.codeSize = args.binary_size;
    info.pCode = static_cast<const uint32_t *>(args.binary);
    objects_ = std::make_shared<KernelObjects>(device);
    device.check(device.fn().vkCreateShaderModule(device.handle(), &info, nullptr, &objects_->module),
                 "vkCreateShaderModule");
}

KernelObjects::~KernelObjects() {
    const auto &fn = device.fn();
    for (auto &[key, entry] : pipelines) fn.vkDestroyPipeline(device.handle(), entry.pipeline, nullptr);
    fn.vkDestroyShaderModule(device.handle(), module, nullptr);
}

const KernelPipeline &VulkanKernel::pipeline(const uint32_t block[3], uint32_t bindingCount,
                                             uint32_t sharedBytes) {
    const std::array<uint32_t, 5> key{block[0], block[1], block[2], bindingCount, sharedBytes};
    // Back-to-back launches of one shape skip the lock and the map: entries are immutable and
    // live as long as the kernel.
    KernelObjects &objects = *objects_;
    if (const KernelPipeline *last = objects.last.load(std::memory_order_acquire);
        last != nullptr && last->key == key)
        return *last;
    std::lock_guard lock(objects.mutex);
    if (auto it = objects.pipelines.find(key); it != objects.pipelines.end()) {
        objects.last.store(&it->second, std::memory_order_release);
        return it->second;
    }

    // Specialization constants 0, 1, 2 = block size (layout(local_size_x_id = 0, ...)), 3 = the
    // launch's dynamic shared memory bytes. Ids the shader does not declare are ignored.
    const std::array<uint32_t, 4> values{block[0], block[1], block[2], sharedBytes};
    std::array<VkSpecializationMapEntry, 4> entries{};
    for (uint32_t i = 0; i < 4; ++i) entries[i] = {i, i * 4u, 4};
    VkSpecializationInfo specialization{};
    specialization.mapEntryCount = static_cast<uint32_t>(entries.size());
    specialization.pMapEntries = entries.data();
    specialization.dataSize = sizeof values;
    specialization.pData = values.data();

    auto info = vkStruct<VkComputePipelineCreateInfo>(VK_STRUCTURE_TYPE_COMPUTE_PIPELINE_CREATE_INFO);
    info.stage.sType = VK_STRUCTURE_TYPE_PIPELINE_SHADER_STAGE_CREATE_INFO;
    info.stage.stage = VK_SHADER_STAGE_COMPUTE_BIT;
    info.stage.module = objects.module;
    info.stage.pName = spirvEntryPoint_.c_str();
    info.stage.pSpecializationInfo = &specialization;
    const auto [setLayout, pipelineLayout] = device_.layout(bindingCount);
    info.layout = pipelineLayout;
    VkPipeline pipeline = VK_NULL_HANDLE;
    const VkResult result = device_.fn().vkCreateComputePipelines(
        device_.handle(), device_.pipelineCache(), 1, &info, nullptr, &pipeline);
    if (result != VK_SUCCESS && toStatus(result) != BP_ERROR_OUT_OF_MEMORY &&
        result != VK_ERROR_DEVICE_LOST)
        throw sdk::Error(BP_ERROR_LAUNCH,
                         "vkCreateComputePipelines for kernel '" + entryPoint_ + "' failed: " +
                             resultName(result),
                         result);
    device_.check(result, "vkCreateComputePipelines");
    const KernelPipeline &entry =
        objects.pipelines.emplace(key, KernelPipeline{key, pipeline, setLayout, pipelineLayout})
            .first->second;
    objects.last.store(&entry, std::memory_order_release);
    return entry;
}

// ------------------------------------------------------------------------------------------------
// Pipeline cache on disk

std::string VulkanDevice::pipelineCachePath() const {
    const std::string &dir = plugin_.cacheDir();
    if (dir.empty()) return {};
    // Keyed by what the driver itself checks: vendor, device and its pipelineCacheUUID.
    std::string uuid;
    char hex[4];
    for (uint8_t byte : physical_.properties.pipelineCacheUUID) {
        std::snprintf(hex, sizeof hex, "%02x", byte);
        uuid += hex;
    }
    char name[96];
    std::snprintf(name, sizeof name, "vulkan-pipelines-%04x-%04x-", physical_.properties.vendorID,
                  physical_.properties.deviceID);
    return (std::filesystem::path(dir) / (name + uuid + ".bin")).string();
}

void VulkanDevice::loadPipelineCache() {
    std::vector<unsigned char> data;
    const std::string path = pipelineCachePath();
    if (!path.empty()) {
        std::ifstream file(path, std::ios::binary);
        if (file) {
            std::vector<unsigned char> bytes((std::istreambuf_iterator<char>(file)),
                                             std::istreambuf_iterator<char>());
            const size_t header = sizeof kCacheMagic + 2 * sizeof(uint64_t);
            uint64_t size = 0, hash = 0;
            if (bytes.size() >= header) {
                std::memcpy(&size, bytes.data() + sizeof kCacheMagic, sizeof size);
                std::memcpy(&hash, bytes.data() + sizeof kCacheMagic + sizeof size, sizeof hash);
            }
            const bool valid = bytes.size() >= header &&
                               std::memcmp(bytes.data(), kCacheMagic, sizeof kCacheMagic) == 0 &&
                               size == bytes.size() - header &&
                               fnv1a(bytes.data() + header, size) == hash;
            // The driver's own header: length, version, vendor, device, pipelineCacheUUID.
            bool matches = false;
            if (valid && size >= 32) {
                uint32_t fields[4];
                std::memcpy(fields, bytes.data() + header, sizeof fields);
                matches = fields[0] >= 32 && fields[1] == VK_PIPELINE_CACHE_HEADER_VERSION_ONE &&
                          fields[2] == physical_.properties.vendorID &&
                          fields[3] == physical_.properties.deviceID &&
                          std::memcmp(bytes.data() + header + 16,
                                      physical_.properties.pipelineCacheUUID, VK_UUID_SIZE) == 0;
            }
            if (matches) {
                data.assign(bytes.begin() + static_cast<std::ptrdiff_t>(header), bytes.end());
                plugin_.log(BP_LOG_DEBUG, "pipeline cache loaded from " + path + " (" +
                                              std::to_string(data.size()) + " bytes)");
            } else {
                plugin_.log(BP_LOG_WARN, "ignoring corrupt or foreign pipeline cache " + path);
            }
        }
    }
    auto info = vkStruct<VkPipelineCacheCreateInfo>(VK_STRUCTURE_TYPE_PIPELINE_CACHE_CREATE_INFO);
    info.initialDataSize = data.size();
    info.pInitialData = data.empty() ? nullptr : data.data();
    VkResult result = fn_.vkCreatePipelineCache(device_, &info, nullptr, &pipelineCache_);
    if (result != VK_SUCCESS && !data.empty()) {
        info.initialDataSize = 0;
        info.pInitialData = nullptr;
        result = fn_.vkCreatePipelineCache(device_, &info, nullptr, &pipelineCache_);
    }
    check(result, "vkCreatePipelineCache");
}

void VulkanDevice::savePipelineCache() noexcept {
    const std::string path = pipelineCachePath();
    if (path.empty() || pipelineCache_ == VK_NULL_HANDLE) return;
    try {
        size_t size = 0;
        if (fn_.vkGetPipelineCacheData(device_, pipelineCache_, &size, nullptr) != VK_SUCCESS ||
            size == 0)
            return;
        std::vector<unsigned char> data(size);
        if (fn_.vkGetPipelineCacheData(device_, pipelineCache_, &size, data.data()) != VK_SUCCESS)
            return;
        data.resize(size);
        const uint64_t byteCount = size;
        const uint64_t hash = fnv1a(data.data(), data.size());
        std::vector<unsigned char> file(sizeof kCacheMagic + 2 * sizeof(uint64_t));
        std::memcpy(file.data(), kCacheMagic, sizeof kCacheMagic);
        std::memcpy(file.data() + sizeof kCacheMagic, &byteCount, sizeof byteCount);
        std::memcpy(file.data() + sizeof kCacheMagic + sizeof byteCount, &hash, sizeof hash);
        file.insert(file.end(), data.begin(), data.end());
        if (const std::string failure = publishFile(path, file); !failure.empty()) {
            plugin_.log(BP_LOG_WARN, "cannot save the pipeline cache " + path + " (" + failure +
                                         "); the previous file, if any, is kept");
            return;
        }
        plugin_.log(BP_LOG_DEBUG, "pipeline cache saved to " + path + " (" +
                                      std::to_string(size) + " bytes)");
    } catch (const std::exception &e) {
        plugin_.log(BP_LOG_WARN, std::string("cannot save the pipeline cache: ") + e.what());
    }
}

} // namespace backplane::vulkan
