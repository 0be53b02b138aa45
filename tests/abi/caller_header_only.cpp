// backplane/abi/caller.hpp is header-only: this program uses all of it and links no libbackplane
// (Meson: backplane_abi_dep, include directories only). Exit 0 when its checks hold.
#include <backplane/abi/caller.hpp>

#include <cstdio>
#include <cstring>

namespace {

int gReleases = 0;

} // namespace

int main() {
    auto api = backplane::abi::make<bp_plugin_api>();
    api.stream_destroy = [](bp_device *, bp_stream *) { ++gReleases; };
    alignas(8) static char fakeStream[8];
    {
        const backplane::abi::Owned<bp_stream> stream(api, nullptr,
                                                      reinterpret_cast<bp_stream *>(fakeStream));
    }
    auto error = backplane::abi::make<bp_error>();
    std::strcpy(error.message, "no such kernel");
    try {
        backplane::abi::check(BP_ERROR_NOT_FOUND, &error, "kernel_load");
    } catch (const backplane::Error &e) {
        if (gReleases == 1 && e.code() == backplane::ErrorCode::NotFound &&
            std::strcmp(e.what(), "kernel_load: no such kernel") == 0)
            return 0;
    }
    std::fprintf(stderr, "caller.hpp on its own: releases %d, or check did not throw as expected\n",
                 gReleases);
    return 1;
}
