// Device selector parsing and matching.
#include "device_selector.hpp"

#include <backplane/error.hpp>

#include <algorithm>
#include <cctype>
#include <string>

namespace backplane::detail {
namespace {

constexpr const char *kForms =
    "use backend:index, backend:<uuid or unique prefix>, backend, *:gpu, *:cpu or *";

std::string_view trim(std::string_view text) {
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
        text.remove_prefix(1);
    while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
        text.remove_suffix(1);
    return text;
}

[[noreturn]] void invalid(std::string_view text, const std::string &why) {
    throw Error(ErrorCode::Config,
                "invalid device selector '" + std::string(text) + "': " + why + " (" + kForms + ")");
}

bool isBackendName(std::string_view name) {
    return !name.empty() && std::all_of(name.begin(), name.end(), [](char c) {
        return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
    });
}

std::string uuidHex(const DeviceInfo &route) {
    std::string hex = route.uuidString();
    hex.erase(std::remove(hex.begin(), hex.end(), '-'), hex.end());
    return hex;
}

} // namespace

std::string preferenceOrigin(const Config &config) {
    const std::string &source = config.devicePreferenceSource;
    if (source.empty()) return "devices.prefer";
    if (source == "BACKPLANE_DEVICE") return source;
    return source + " devices.prefer";
}

DeviceSelector parseSelector(std::string_view raw) {
    const std::string_view text = trim(raw);
    DeviceSelector s;
    s.text = std::string(text);
    if (text.empty()) invalid(raw, "empty selector");
    const size_t colon = text.find(':');
    const std::string_view head = text.substr(0, colon);
    const std::string_view tail =
        colon == std::string_view::npos ? std::string_view{} : text.substr(colon + 1);
    if (colon != std::string_view::npos && tail.empty()) invalid(raw, "nothing after ':'");
    if (head == "*") {
        if (colon == std::string_view::npos || tail == "*") s.kind = DeviceSelector::Kind::Any;
        else if (tail == "gpu") s.kind = DeviceSelector::Kind::AnyGpu;
        else if (tail == "cpu") s.kind = DeviceSelector::Kind::AnyCpu;
        else invalid(raw, "after '*:' only gpu, cpu or * are allowed");
        return s;
    }
    if (!isBackendName(head))
        invalid(raw, "'" + std::string(head) +
                         "' is not a plugin name (letters, digits, '_', '-', '.')");
    s.backend = std::string(head);
    if (colon == std::string_view::npos || tail == "*") {
        s.kind = DeviceSelector::Kind::Backend;
        return s;
    }
    if (std::all_of(tail.begin(), tail.end(),
                    [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
        if (tail.size() > 9) invalid(raw, "device index too large");
        s.kind = DeviceSelector::Kind::BackendIndex;
        s.index = static_cast<uint32_t>(std::stoul(std::string(tail)));
        return s;
    }
    for (const char c : tail) {
        if (c == '-') continue;
        if (!std::isxdigit(static_cast<unsigned char>(c)))
            invalid(raw, "'" + std::string(tail) + "' is neither a device index nor a UUID");
        s.uuidPrefix += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    }
    if (s.uuidPrefix.empty() || s.uuidPrefix.size() > 32)
        invalid(raw, "'" + std::string(tail) + "' is not a UUID or UUID prefix");
    s.kind = DeviceSelector::Kind::BackendUuid;
    return s;
}

bool DeviceSelector::matches(const DeviceInfo &route) const {
    switch (kind) {
    case Kind::Any: return true;
    case Kind::AnyGpu:
        return route.type == DeviceType::DiscreteGpu || route.type == DeviceType::IntegratedGpu ||
               route.type == DeviceType::VirtualGpu;
    case Kind::AnyCpu: return route.type == DeviceType::Cpu;
    case Kind::Backend: return route.backend == backend;
    case Kind::BackendIndex: return route.backend == backend && route.index == index;
    case Kind::BackendUuid:
        return route.backend == backend && route.hasUuid && uuidHex(route).starts_with(uuidPrefix);
    }
    return false;
}

} // namespace backplane::detail
