// Fuzzes the plugin manifest reader (detail::parseManifest, what readManifest runs on the file's
// text).
#include "fuzz_check.hpp"
#include "loader/plugin_manifest.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    backplane::fuzz::expectReturnOrError("manifest reader", [&] {
        (void)backplane::detail::parseManifest(backplane::fuzz::asText(data, size),
                                               "/fuzz/plugins/fuzz.json");
    });
    return 0;
}
