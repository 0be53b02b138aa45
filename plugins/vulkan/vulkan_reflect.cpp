// SPIRV-Cross reflection of compute kernels: the entry point, the set-0 storage buffers and the
// push-constant block it uses.
#include "vulkan_reflect.hpp"

#include <spirv_cross_c.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

namespace backplane::vulkan {
namespace {

/// Owns an spvc_context; everything SPIRV-Cross allocates (IR, compiler, lists) goes with it.
struct ContextDeleter {
    void operator()(spvc_context context) const noexcept { spvc_context_destroy(context); }
};
using ContextOwner = std::unique_ptr<std::remove_pointer_t<spvc_context>, ContextDeleter>;

/// Descriptor kinds the plugin never binds (it binds set-0 storage buffers only).
struct UnboundKind {
    spvc_resource_type type;
    const char *name;
};
constexpr std::array<UnboundKind, 9> kUnboundKinds{{
    {SPVC_RESOURCE_TYPE_UNIFORM_BUFFER, "a uniform buffer"},
    {SPVC_RESOURCE_TYPE_STORAGE_IMAGE, "a storage image"},
    {SPVC_RESOURCE_TYPE_SAMPLED_IMAGE, "a sampled image"},
    {SPVC_RESOURCE_TYPE_SEPARATE_IMAGE, "a separate image"},
    {SPVC_RESOURCE_TYPE_SEPARATE_SAMPLERS, "a sampler"},
    {SPVC_RESOURCE_TYPE_ATOMIC_COUNTER, "an atomic counter"},
    {SPVC_RESOURCE_TYPE_ACCELERATION_STRUCTURE, "an acceleration structure"},
    {SPVC_RESOURCE_TYPE_SUBPASS_INPUT, "a subpass input"},
    {SPVC_RESOURCE_TYPE_SHADER_RECORD_BUFFER, "a shader record buffer"},
}};

std::string describe(spvc_compiler compiler, const spvc_reflected_resource &resource) {
    const std::string name = resource.name && *resource.name ? resource.name : "(unnamed)";
    return "'" + name + "' (set " +
           std::to_string(
               spvc_compiler_get_decoration(compiler, resource.id, SpvDecorationDescriptorSet)) +
           ", binding " +
           std::to_string(
               spvc_compiler_get_decoration(compiler, resource.id, SpvDecorationBinding)) +
           ")";
}

} // namespace

ShaderInterface reflectComputeShader(const void *spirv, size_t size, const std::string &entryPoint,
                                     bool anyEntryPoint, const std::string &what) {
    spvc_context raw = nullptr;
    if (spvc_context_create(&raw) != SPVC_SUCCESS)
        throw sdk::Error(BP_ERROR_INTERNAL, what + ": spvc_context_create failed");
    const ContextOwner context(raw);
    const auto reflectionError = [&](const char *step) {
        const char *detail = spvc_context_get_last_error_string(raw);
        return sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                          what + ": the SPIR-V module cannot be reflected (SPIRV-Cross " + step +
                              ": " + (detail && *detail ? detail : "no detail") + ")");
    };

    // The blob may be unaligned; SPIRV-Cross reads words.
    std::vector<SpvId> words(size / 4);
    std::memcpy(words.data(), spirv, words.size() * 4);
    spvc_parsed_ir ir = nullptr;
    if (spvc_context_parse_spirv(raw, words.data(), words.size(), &ir) != SPVC_SUCCESS)
        throw reflectionError("parse");
    spvc_compiler compiler = nullptr;
    if (spvc_context_create_compiler(raw, SPVC_BACKEND_NONE, ir, SPVC_CAPTURE_MODE_TAKE_OWNERSHIP,
                                     &compiler) != SPVC_SUCCESS)
        throw reflectionError("compiler");

    const spvc_entry_point *entries = nullptr;
    size_t entryCount = 0;
    if (spvc_compiler_get_entry_points(compiler, &entries, &entryCount) != SPVC_SUCCESS)
        throw reflectionError("entry points");
    std::vector<std::string> names;
    for (size_t i = 0; i < entryCount; ++i)
        if (entries[i].execution_model == SpvExecutionModelGLCompute)
            names.emplace_back(entries[i].name);
    ShaderInterface shader;
    if (std::find(names.begin(), names.end(), entryPoint) != names.end())
        shader.entryPoint = entryPoint;
    else if (names.size() == 1 && anyEntryPoint)
        shader.entryPoint = names[0];
    else {
        std::string known;
        for (const auto &n : names)
            known += (known.empty() ? "" : ", ") + n;
        throw sdk::Error(BP_ERROR_NOT_FOUND, what +
                                                 ": the SPIR-V module has no compute entry "
                                                 "point of that name (it has: " +
                                                 (known.empty() ? "none" : known) + ")");
    }
    if (spvc_compiler_set_entry_point(compiler, shader.entryPoint.c_str(),
                                      SpvExecutionModelGLCompute) != SPVC_SUCCESS)
        throw reflectionError("entry point");

    // Only what the entry point's call tree touches: a declared but unused buffer needs no
    // descriptor (and -O removes it from the module anyway).
    spvc_set active = nullptr;
    spvc_resources resources = nullptr;
    if (spvc_compiler_get_active_interface_variables(compiler, &active) != SPVC_SUCCESS ||
        spvc_compiler_create_shader_resources_for_active_variables(compiler, &resources, active) !=
            SPVC_SUCCESS)
        throw reflectionError("resources");
    const auto list = [&](spvc_resource_type type) {
        const spvc_reflected_resource *items = nullptr;
        size_t count = 0;
        if (spvc_resources_get_resource_list_for_type(resources, type, &items, &count) !=
            SPVC_SUCCESS)
            throw reflectionError("resources");
        return std::pair{items, count};
    };

    const std::string plugin = "; the Vulkan plugin binds storage buffers of descriptor set 0 "
                               "(one per launch binding) and one push-constant block only";
    for (const UnboundKind &kind : kUnboundKinds) {
        const auto [items, count] = list(kind.type);
        if (count > 0)
            throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": the shader uses " + kind.name + " " +
                                                       describe(compiler, items[0]) + plugin);
    }

    const auto [buffers, bufferCount] = list(SPVC_RESOURCE_TYPE_STORAGE_BUFFER);
    for (size_t i = 0; i < bufferCount; ++i) {
        const spvc_reflected_resource &buffer = buffers[i];
        const unsigned set =
            spvc_compiler_get_decoration(compiler, buffer.id, SpvDecorationDescriptorSet);
        if (set != 0)
            throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": the shader uses the storage buffer " +
                                                       describe(compiler, buffer) + " in set " +
                                                       std::to_string(set) + plugin);
        if (spvc_type_get_num_array_dimensions(
                spvc_compiler_get_type_handle(compiler, buffer.type_id)) > 0)
            throw sdk::Error(BP_ERROR_UNSUPPORTED, what +
                                                       ": the shader uses an array of storage "
                                                       "buffers " +
                                                       describe(compiler, buffer) + plugin);
        const unsigned binding =
            spvc_compiler_get_decoration(compiler, buffer.id, SpvDecorationBinding);
        // Saturating: binding 0xffffffff must not wrap to a count of 0 (the load refuses it).
        shader.bindingCount =
            std::max(shader.bindingCount, binding == UINT32_MAX ? UINT32_MAX : binding + 1);
    }

    const auto [blocks, blockCount] = list(SPVC_RESOURCE_TYPE_PUSH_CONSTANT);
    for (size_t i = 0; i < blockCount; ++i) {
        // The declared size runs to the end of the last member (std430 has no tail padding);
        // a block with offset-decorated members counts the bytes before them too.
        size_t bytes = 0;
        if (spvc_compiler_get_declared_struct_size(
                compiler, spvc_compiler_get_type_handle(compiler, blocks[i].base_type_id),
                &bytes) != SPVC_SUCCESS)
            throw reflectionError("push-constant size");
        shader.pushConstantBytes = std::max(shader.pushConstantBytes, static_cast<uint32_t>(bytes));
    }
    return shader;
}

} // namespace backplane::vulkan
