// Stand-alone runner of the Vulkan bench suite (tools/backplane/bench_vulkan.cpp), so the suite
// can be run before and besides `backplane bench`: bench_vulkan [--quick].
#include "../../tools/backplane/bench.hpp"

#include <cstdio>
#include <cstring>

int main(int argc, char **argv) {
    backplane::tool::BenchOptions options;
    options.quick = argc > 1 && std::strcmp(argv[1], "--quick") == 0;
    backplane::tool::BenchRows rows;
    backplane::tool::benchVulkan(options, rows);
    std::printf("%-92s %12s %12s %6s %8s %s\n", "what", "runtime", "raw", "unit", "ratio",
                "target");
    for (const auto &r : rows)
        std::printf("%-92s %12.3f %12.3f %6s %7.2fx %s\n", r.what.c_str(), r.runtime, r.raw,
                    r.unit.c_str(), r.ratio(), r.target.c_str());
    if (!rows.empty()) std::printf("device: %s\n", rows.front().device.c_str());
    return rows.empty() ? 77 : 0;
}
