// `backplane trace render TRACE.json OUT.svg`: a trace (backplane::Trace, BACKPLANE_TRACE) as an SVG.
#include "commands.hpp"

#include <backplane/error.hpp>
#include <backplane/trace.hpp>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

namespace backplane::tool {
namespace {

constexpr const char *kUsage =
    "usage: backplane trace render TRACE.json OUT.svg\n"
    "  draws a trace written by BACKPLANE_TRACE=FILE, --trace FILE (demo, bench) or\n"
    "  backplane::Trace as an SVG timeline: one lane per device and stream slot (docs/trace.md)\n";

} // namespace

int runTrace(const Args &args) {
    if (wantsHelp(args)) return printUsage(kUsage, true);
    if (args.size() != 3 || args[0] != "render") return printUsage(kUsage, false);
    std::string svg;
    try {
        svg = renderTraceSvg(args[1]);
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane trace render: %s\n", e.what());
        return 1;
    }
    std::FILE *out = std::fopen(args[2].c_str(), "wb");
    if (out == nullptr) {
        std::fprintf(stderr, "backplane trace render: cannot write %s: %s\n", args[2].c_str(),
                     std::strerror(errno));
        return 1;
    }
    const bool written = std::fwrite(svg.data(), 1, svg.size(), out) == svg.size();
    if (std::fclose(out) != 0 || !written) {
        std::fprintf(stderr, "backplane trace render: writing %s failed: %s\n", args[2].c_str(),
                     std::strerror(errno));
        return 1;
    }
    std::printf("wrote %s (%zu bytes)\n", args[2].c_str(), svg.size());
    return 0;
}

} // namespace backplane::tool
