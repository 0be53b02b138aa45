// `backplane token`: a fresh secret for the TCP rendezvous (BACKPLANE_RENDEZVOUS_TOKEN).
#include "commands.hpp"

#include <backplane/communicator.hpp>

#include <cstdio>

namespace backplane::tool {

int runToken(const Args &args) {
    if (wantsHelp(args) || !args.empty()) {
        std::fputs("usage: backplane token\n"
                   "  prints 32 random bytes as hexadecimal digits, for every process of one job:\n"
                   "  export BACKPLANE_RENDEZVOUS_TOKEN=$(backplane token)\n",
                   wantsHelp(args) ? stdout : stderr);
        return wantsHelp(args) ? 0 : 2;
    }
    std::printf("%s\n", newRendezvousToken().c_str());
    return 0;
}

} // namespace backplane::tool
