// Joining the plugins' communicators for a Communicator: one comm_create per local rank, the id
// shared through the rendezvous, and the CPU device that carries the staged path between
// processes.
#include "comm/communicator_state.hpp"

#include <exception>
#include <future>

namespace backplane::detail {

/// Joins `comms[i]` for every local server concurrently (a plugin's comm_create returns once
/// every rank joined, so ranks of one process must join from separate threads).
std::vector<CommOwner> joinAll(const std::vector<Driver *> &drivers, const Bytes &id,
                               uint32_t firstRank, uint32_t size, uint64_t timeoutMs) {
    std::vector<std::future<CommOwner>> joins;
    for (size_t i = 0; i < drivers.size(); ++i)
        joins.push_back(std::async(std::launch::async, [&, i] {
            return drivers[i]->commCreate(id, firstRank + static_cast<uint32_t>(i), size,
                                          timeoutMs);
        }));
    std::vector<CommOwner> comms;
    std::exception_ptr failure;
    for (auto &j : joins) {
        try {
            comms.push_back(j.get());
        } catch (...) {
            if (!failure) failure = std::current_exception();
        }
    }
    if (failure) {
        for (size_t i = 0; i < comms.size(); ++i) drivers[i]->commAbort(comms[i].get());
        std::rethrow_exception(failure);
    }
    return comms;
}

/// The id bytes process 0 made, handed to every process through the rendezvous.
Bytes shareId(Rendezvous &rendezvous, uint32_t process, const std::function<Bytes()> &make,
              std::chrono::milliseconds timeout) {
    const Bytes mine = process == 0 ? make() : Bytes{};
    const std::vector<Bytes> all = rendezvous.allGather(mine, timeout);
    if (all.empty() || all[0].empty())
        throw Error(ErrorCode::InvalidArgument,
                    "Communicator::create: process 0 sent no communicator id");
    return all[0];
}

namespace {

/// Whether the staged path between processes can run on `device`: it moves host memory, so a
/// CPU device, with a collective engine (the host plugin's Gloo). `asyncStreams`: only one whose
/// streams are asynchronous, as the engine choice counts a rank's collectives (a sync-mode host
/// device has no Gloo there).
bool carriesProcesses(const DeviceInfo &device, bool asyncStreams) {
    return device.type == DeviceType::Cpu &&
           (device.capabilities & BP_CAPABILITY_COLLECTIVES) != 0 &&
           (!asyncStreams || (device.capabilities & BP_CAPABILITY_ASYNC_STREAMS) != 0);
}

} // namespace

/// One of `given` that carriesProcesses, else the first such device of `runtime`, opened.
ComputeClient openProcessCarrier(const Runtime &runtime, const std::vector<ComputeClient> &given) {
    for (const ComputeClient &c : given)
        if (carriesProcesses(c.device(), true)) return c;
    std::string why;
    for (const PhysicalDevice &physical : runtime.devices())
        for (const DeviceInfo &route : physical.routes) {
            if (carriesProcesses(route, false)) {
                try {
                    return runtime.open(runtime.select(route.id()));
                } catch (const Error &e) {
                    throw Error(ErrorCode::Unsupported,
                                "Communicator::create: the staged path between processes runs on "
                                "the collectives of " + route.id() + " (" + route.collectives +
                                    "), and it could not be opened: " + std::string(e.what()));
                }
            }
            if (route.type == DeviceType::Cpu)
                why += (why.empty() ? "" : "; ") + route.id() + " has none (" +
                       (route.collectives.empty() ? std::string("no engine named")
                                                  : route.collectives) + ")";
        }
    invalid("Communicator::create",
            "the staged path between processes needs the collectives of a CPU device (the host "
            "plugin's Gloo), and " + (why.empty() ? std::string("there is no CPU device") : why));
}

} // namespace backplane::detail
