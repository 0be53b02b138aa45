// Fuzzes the config file reader (detail::parseConfigText, what readConfigFile runs on the file's
// text) and, for accepted files, toJson: what `backplane config check` prints.
#include "config/config_text.hpp"
#include "fuzz_check.hpp"

#include <backplane/config.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    backplane::fuzz::expectReturnOrError("config reader", [&] {
        const backplane::Config config = backplane::detail::parseConfigText(
            backplane::fuzz::asText(data, size), "/fuzz/backplane.json");
        (void)backplane::toJson(config, 2);
    });
    return 0;
}
