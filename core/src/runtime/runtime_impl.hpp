// Runtime::Impl: what a Runtime holds; the core's client code (Runtime::open) uses it.
#pragma once

#include <backplane/config.hpp>
#include <backplane/runtime.hpp>

#include "plugin/plugin_library.hpp"
#include "trace/trace_recorder.hpp"

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace backplane {

struct Runtime::Impl {
    Config config;
    std::vector<std::filesystem::path> searchPath;
    std::vector<PluginReport> reports;
    std::vector<PhysicalDevice> devices; ///< best first (default order)
    /// Loaded plugins by name (DeviceInfo::backend). Shared with everything opened from them.
    std::map<std::string, std::shared_ptr<detail::PluginLibrary>> libraries;
    /// This Runtime started BACKPLANE_TRACE's trace: it is written when the Runtime goes.
    bool environmentTrace = false;

    Impl() = default;
    Impl(const Impl &) = delete;
    Impl &operator=(const Impl &) = delete;
    ~Impl() {
        if (environmentTrace) detail::stopEnvironmentTrace();
    }

    /// The loaded library of plugin `backend` (a DeviceInfo::backend), or nullptr.
    std::shared_ptr<detail::PluginLibrary> library(const std::string &backend) const {
        const auto it = libraries.find(backend);
        return it == libraries.end() ? nullptr : it->second;
    }
};

} // namespace backplane
