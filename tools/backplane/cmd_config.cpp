// `backplane config check FILE` and `backplane config show`: validate and print settings.
#include "commands.hpp"

#include <backplane/config.hpp>
#include <backplane/error.hpp>

#include <cstdio>

namespace backplane::tool {

int runConfig(const Args &args) {
    const bool check = args.size() == 2 && args[0] == "check";
    const bool show = args.size() == 1 && args[0] == "show";
    if (!check && !show) {
        std::fputs("usage: backplane config check FILE   validate FILE, print the effective "
                   "settings (file + environment)\n"
                   "       backplane config show         print the settings in effect now\n",
                   stderr);
        return 2;
    }
    try {
        Config config = check ? readConfigFile(args[1]) : loadConfig();
        if (check) applyEnvironment(config);
        if (check) std::printf("OK: %s\n", args[1].c_str());
        std::printf("%s\n", toJson(config).c_str());
        return 0;
    } catch (const Error &e) {
        std::fprintf(stderr, "backplane config: %s\n", e.what());
        return 1;
    }
}

} // namespace backplane::tool
