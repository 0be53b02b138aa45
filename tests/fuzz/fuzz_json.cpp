// Fuzzes the bounded JSON reader under the config file's limits, and dumpJson of what it accepts.
#include "fuzz_check.hpp"
#include "input/json_input.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    backplane::fuzz::expectReturnOrError("JSON reader", [&] {
        const nlohmann::json value =
            backplane::detail::parseJson(backplane::fuzz::asText(data, size), "/fuzz/input.json",
                                         backplane::detail::kConfigJsonLimits);
        // dumpJson is documented never to throw on a value within the limits.
        try {
            (void)backplane::detail::dumpJson(value, 1);
        } catch (...) {
            backplane::fuzz::finding("dumpJson", "threw on a value parseJson accepted");
        }
    });
    return 0;
}
