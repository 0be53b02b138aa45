// Runtime::open: opens the selected device through the plugin the Runtime loaded.
#include "client/open_client.hpp"
#include "runtime/runtime_impl.hpp"

#include <backplane/runtime.hpp>

namespace backplane {

ComputeClient Runtime::open(const Selection &selection) const {
    std::shared_ptr<detail::PluginLibrary> plugin = impl_->library(selection.device.backend);
    if (!plugin)
        throw Error(ErrorCode::NotFound,
                    "cannot open " + selection.device.id() + ": plugin '" +
                        selection.device.backend +
                        "' is not loaded in this Runtime; pick a device from Runtime::devices()");
    return detail::openComputeClient(std::move(plugin), selection.device, impl_->config);
}

} // namespace backplane
