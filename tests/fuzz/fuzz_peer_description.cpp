// Fuzzes the reader of another process's description of its ranks (Communicator::create's first
// rendezvous step), and that what it accepts is within its limits and reads back the same.
#include "comm/peer_description.hpp"
#include "fuzz_check.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    backplane::fuzz::expectReturnOrError("peer description reader", [&] {
        const backplane::detail::PeerDescription d =
            backplane::detail::parsePeerDescription(backplane::fuzz::asText(data, size), 1);
        if (d.ranks == 0 || d.ranks > backplane::detail::kMaxRanksPerProcess ||
            d.plugins.size() != d.ranks || d.collectives.size() != d.ranks)
            backplane::fuzz::finding(
                "peer description reader",
                "accepted a rank count out of range or lists of another length");
        // What it accepted, written again, is read back unchanged.
        const backplane::detail::PeerDescription again =
            backplane::detail::parsePeerDescription(backplane::detail::writePeerDescription(d), 1);
        if (again.ranks != d.ranks || again.plugins != d.plugins ||
            again.collectives != d.collectives || again.forceStaged != d.forceStaged)
            backplane::fuzz::finding("peer description reader",
                                     "an accepted description does not survive writing it again");
    });
    return 0;
}
