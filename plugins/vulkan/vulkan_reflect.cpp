// SPIRV-Cross reflection of compute kernels: the entry point, the set-0 storage buffers and the
// push-constant block it uses.
#include "vulkan_reflect.hpp"

#include <spirv-tools/libspirv.h>
#include <spirv_cross_c.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_map>
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

/// SPIRV-Tools' validator (Vulkan 1.3 rules) over a module before anything parses it: SPIRV-Cross
/// and drivers assume valid SPIR-V (SPIRV-Cross's parser crashes on some invalid modules).
/// Throws sdk::Error(BP_ERROR_INVALID_ARGUMENT) with the validator's message.
void validate(const std::vector<uint32_t> &words, const std::string &what) {
    spv_context context = spvContextCreate(SPV_ENV_VULKAN_1_3);
    if (context == nullptr) throw sdk::Error(BP_ERROR_INTERNAL, what + ": spvContextCreate failed");
    spv_validator_options options = spvValidatorOptionsCreate();
    spv_const_binary_t binary{words.data(), words.size()};
    spv_diagnostic diagnostic = nullptr;
    const spv_result_t result = spvValidateWithOptions(context, options, &binary, &diagnostic);
    std::string detail = diagnostic != nullptr && diagnostic->error != nullptr ? diagnostic->error : "";
    spvDiagnosticDestroy(diagnostic);
    spvValidatorOptionsDestroy(options);
    spvContextDestroy(context);
    if (result != SPV_SUCCESS)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         what + ": the SPIR-V module is not valid (SPIRV-Tools: " +
                             (detail.empty() ? "code " + std::to_string(result) : detail) + ")");
}

/// Whether a module's instructions tile it exactly and it declares the cooperative-matrix
/// capability (NV 5357 or KHR 6022), the one reason to read it without SPIRV-Cross.
bool declaresCooperativeMatrices(const std::vector<uint32_t> &words) {
    if (words.size() < 5 || words[0] != 0x07230203u) return false;
    bool declared = false;
    size_t at = 5;
    while (at < words.size()) {
        const uint32_t count = words[at] >> 16, op = words[at] & 0xffffu;
        if (count == 0 || count > words.size() - at) return false;
        if (op == 17 && count == 2 && (words[at + 1] == 5357 || words[at + 1] == 6022)) declared = true;
        at += count;
    }
    return declared;
}

/// The launch interface read straight from the SPIR-V words, for modules SPIRV-Cross cannot
/// parse (Debian 12's release predates the cooperative-matrix opcodes the kernel language's
/// matrix units use). It reads only what the plugin binds: the GLCompute entry points, set-0
/// storage buffers and the push-constant block's extent; other descriptors are refused as above.
/// From SPIR-V 1.4 an entry point lists every global it uses, so only those count (as SPIRV-Cross
/// counts active variables); before, every declared one does.
ShaderInterface scanComputeShader(const std::vector<uint32_t> &words, const std::string &entryPoint,
                                  bool anyEntryPoint, const std::string &what) {
    const auto malformed = [&](const std::string &why) {
        return sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                          what + ": the SPIR-V module cannot be reflected (" + why + ")");
    };
    if (words.size() < 5) throw malformed("shorter than its header");
    const uint32_t version = words[1];
    struct Entry {
        std::string name;
        std::vector<uint32_t> interface;
    };
    std::vector<Entry> entries;
    std::unordered_map<uint32_t, uint32_t> binding, set, scalarBytes, pointee, pointerClass;
    std::unordered_map<uint32_t, std::pair<uint32_t, uint32_t>> vectors; // component, count
    std::unordered_map<uint32_t, std::vector<uint32_t>> structs;
    std::unordered_map<uint64_t, uint32_t> memberOffset; // (struct << 32 | member) -> offset
    std::unordered_map<uint32_t, bool> bufferBlock;
    std::vector<std::pair<uint32_t, uint32_t>> variables; // (id, pointer type)
    for (size_t at = 5; at < words.size();) {
        const uint32_t count = words[at] >> 16, op = words[at] & 0xffffu;
        if (count == 0 || at + count > words.size()) throw malformed("an instruction runs past the end");
        const uint32_t *w = &words[at];
        switch (op) {
        case 15: // OpEntryPoint model id "name" interface...
            if (count >= 4 && w[1] == 5) {
                Entry e;
                size_t i = 3;
                for (; i < count; ++i) {
                    const char *bytes = reinterpret_cast<const char *>(&w[i]);
                    const size_t length = strnlen(bytes, 4);
                    e.name.append(bytes, length);
                    if (length < 4) break;
                }
                for (++i; i < count; ++i) e.interface.push_back(w[i]);
                entries.push_back(std::move(e));
            }
            break;
        case 71: // OpDecorate target decoration literal
            if (count >= 4 && w[2] == 33) binding[w[1]] = w[3];
            if (count >= 4 && w[2] == 34) set[w[1]] = w[3];
            if (count >= 3 && w[2] == 3) bufferBlock[w[1]] = true;
            break;
        case 72: // OpMemberDecorate struct member Offset value
            if (count >= 5 && w[3] == 35) memberOffset[uint64_t{w[1]} << 32 | w[2]] = w[4];
            break;
        case 21: // OpTypeInt result width signedness
        case 22: // OpTypeFloat result width
            if (count >= 3) scalarBytes[w[1]] = w[2] / 8;
            break;
        case 23: // OpTypeVector result component count
            if (count >= 4) vectors[w[1]] = {w[2], w[3]};
            break;
        case 30: // OpTypeStruct result members...
            if (count >= 2) structs[w[1]] = std::vector<uint32_t>(w + 2, w + count);
            break;
        case 32: // OpTypePointer result class type
            if (count >= 4) {
                pointerClass[w[1]] = w[2];
                pointee[w[1]] = w[3];
            }
            break;
        case 59: // OpVariable type result class
            if (count >= 4) variables.push_back({w[2], w[1]});
            break;
        default: break;
        }
        at += count;
    }
    ShaderInterface shader;
    const Entry *entry = nullptr;
    for (const Entry &e : entries)
        if (e.name == entryPoint) entry = &e;
    if (entry == nullptr && entries.size() == 1 && anyEntryPoint) entry = &entries[0];
    if (entry == nullptr) {
        std::string known;
        for (const Entry &e : entries) known += (known.empty() ? "" : ", ") + e.name;
        throw sdk::Error(BP_ERROR_NOT_FOUND, what + ": the SPIR-V module has no compute entry "
                                                    "point of that name (it has: " +
                                                 (known.empty() ? "none" : known) + ")");
    }
    shader.entryPoint = entry->name;
    const bool listsAll = version >= 0x00010400u;
    const std::string plugin = "; the Vulkan plugin binds storage buffers of descriptor set 0 "
                               "(one per launch binding) and one push-constant block only";
    const auto bytesOf = [&](uint32_t type) -> uint32_t {
        if (auto it = scalarBytes.find(type); it != scalarBytes.end()) return it->second;
        if (auto it = vectors.find(type); it != vectors.end() && scalarBytes.count(it->second.first))
            return scalarBytes[it->second.first] * it->second.second;
        throw malformed("a push-constant member of a type the plugin cannot size");
    };
    for (const auto &[id, type] : variables) {
        if (listsAll && std::find(entry->interface.begin(), entry->interface.end(), id) ==
                            entry->interface.end())
            continue;
        const uint32_t storage = pointerClass.count(type) ? pointerClass[type] : UINT32_MAX;
        const uint32_t block = pointee.count(type) ? pointee[type] : 0;
        const std::string where = "(set " + std::to_string(set.count(id) ? set[id] : 0) +
                                  ", binding " + std::to_string(binding.count(id) ? binding[id] : 0) + ")";
        const bool storageBuffer = storage == 12 || (storage == 2 && bufferBlock.count(block));
        if (storageBuffer) {
            if (!structs.count(block))
                throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": the shader uses an array of "
                                                              "storage buffers " + where + plugin);
            if (set.count(id) && set[id] != 0)
                throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": the shader uses the storage buffer " +
                                                           where + " in set " + std::to_string(set[id]) + plugin);
            const uint32_t b = binding.count(id) ? binding[id] : 0;
            shader.bindingCount = std::max(shader.bindingCount, b == UINT32_MAX ? UINT32_MAX : b + 1);
        } else if (storage == 9) { // PushConstant
            if (!structs.count(block)) throw malformed("a push constant that is not a block");
            const std::vector<uint32_t> &members = structs[block];
            uint64_t bytes = 0;
            for (uint32_t m = 0; m < members.size(); ++m) {
                const auto offset = memberOffset.find(uint64_t{block} << 32 | m);
                if (offset == memberOffset.end()) throw malformed("a push-constant member without an offset");
                bytes = std::max(bytes, uint64_t{offset->second} + bytesOf(members[m]));
            }
            if (bytes > UINT32_MAX) throw malformed("a push-constant block past 4 GiB");
            shader.pushConstantBytes = std::max(shader.pushConstantBytes, static_cast<uint32_t>(bytes));
        } else if (storage == 0 || storage == 2) { // UniformConstant (images, samplers), Uniform
            throw sdk::Error(BP_ERROR_UNSUPPORTED,
                             what + ": the shader uses a descriptor other than a storage buffer " +
                                 where + plugin);
        }
    }
    return shader;
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
    validate(std::vector<uint32_t>(words.begin(), words.end()), what);
    spvc_parsed_ir ir = nullptr;
    if (spvc_context_parse_spirv(raw, words.data(), words.size(), &ir) != SPVC_SUCCESS) {
        // Opcodes newer than this SPIRV-Cross (cooperative matrices): read the words directly.
        // Only for a well-formed module that declares them; anything else stays refused.
        std::vector<uint32_t> plain(words.begin(), words.end());
        if (!declaresCooperativeMatrices(plain)) throw reflectionError("parse");
        try {
            return scanComputeShader(plain, entryPoint, anyEntryPoint, what);
        } catch (const sdk::Error &) {
            throw;
        } catch (const std::exception &) {
            throw reflectionError("parse");
        }
    }
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
