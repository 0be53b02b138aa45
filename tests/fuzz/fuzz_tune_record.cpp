// Fuzzes the tuning-record reader (Tuner::fromJson: records read back from the cache directory).
#include "fuzz_check.hpp"

#include <backplane/tune.hpp>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    backplane::fuzz::expectReturnOrError("tuning-record reader", [&] {
        (void)backplane::tune::Tuner::fromJson(backplane::fuzz::asText(data, size),
                                               "/fuzz/tune/0000000000000000.json");
    });
    return 0;
}
