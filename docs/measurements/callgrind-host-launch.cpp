// The launch loop behind docs/performance.md's callgrind count (session 5, 2026-11-28):
//   g++ -std=c++20 -O2 -g -Icore/include docs/measurements/callgrind-host-launch.cpp -Lbuild/core -lbackplane \
//       -Wl,-rpath,$PWD/build/core -o /tmp/launch
//   BACKPLANE_LOG=off valgrind --tool=callgrind --callgrind-out-file=cg.out /tmp/launch
//   callgrind_annotate --inclusive=yes cg.out | grep ComputeServer::execute
//   callgrind_annotate --auto=yes cg.out core/src/server/compute_server.cpp   # per line
#include <backplane/client.hpp>
#include <backplane/config.hpp>
#include <backplane/runtime.hpp>
#include <cstring>
using namespace backplane;
static void noop(const bp_host_kernel_context *) {}
int main() {
    Config config;
    config.pluginPathOverride = {"build/plugins/host/host.json"};
    config.probeMode = ProbeMode::InProcess;
    config.cacheEnabled = false;
    config.pluginOptions["host"] = R"({"workers":1,"mode":"async"})";
    Runtime runtime(config);
    ComputeClient c = runtime.open(runtime.select("host"));
    Buffer x = c.empty(1024), y = c.empty(1024);
    const KernelSource k{"noop", {KernelVariant::host(&noop, "noop")}, {BindingAccess::Read, BindingAccess::ReadWrite}};
    Dispatch d; d.bindings = {x, y}; d.scalar(1.0f);
    for (int i = 0; i < 200; ++i) c.execute(k, d);
    c.sync();
    for (int i = 0; i < 5000; ++i) c.execute(k, d);
    c.sync();
}
