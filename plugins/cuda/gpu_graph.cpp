// Recorded sequences (ABI 1.3) as vendor graphs, built by stream capture of the ordinary calls.
#include "gpu_device.hpp"

namespace backplane::gpu {
namespace {

const char *opName(bp_graph_op_kind kind) {
    switch (kind) {
    case BP_GRAPH_OP_LAUNCH:
        return "a launch";
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        return "a copy to the device";
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        return "a copy to the host";
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        return "a device copy";
    case BP_GRAPH_OP_FILL:
        return "a fill";
    }
    return "an unknown op";
}

/// Ends a capture that did not reach its end (an op threw), so that the capture stream is
/// usable again; the partial graph is dropped.
class CaptureScope {
public:
    CaptureScope(const bpv::Driver &driver, bpv::Stream stream) noexcept
        : driver_(driver), stream_(stream) {}
    ~CaptureScope() {
        if (!active_) return;
        CapturedGraph partial(driver_);
        bpv::endCapture(driver_, stream_, partial.out());
    }
    CaptureScope(const CaptureScope &) = delete;
    CaptureScope &operator=(const CaptureScope &) = delete;
    /// Ends the capture into `graph`.
    bpv::Call end(CapturedGraph &graph) {
        active_ = false;
        return bpv::endCapture(driver_, stream_, graph.out());
    }

private:
    const bpv::Driver &driver_;
    bpv::Stream stream_;
    bool active_ = true;
};

} // namespace

CapturedGraph::~CapturedGraph() {
    if (graph_ != nullptr) bpv::graphDestroy(driver_, graph_);
}

GpuGraph::~GpuGraph() {
    if (exec_ == nullptr) return;
    device_.enterForRelease();
    // The core releases a graph after its launches completed; the driver would also defer the
    // free of one still running.
    bpv::graphExecDestroy(device_.driver(), exec_);
}

void GpuDevice::recordOp(bpv::Stream stream, const sdk::GraphOp &op) {
    switch (op.kind) {
    case BP_GRAPH_OP_LAUNCH:
        recordLaunch(stream, op.launch);
        return;
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        recordCopyHostToDevice(stream, op.toDevice);
        return;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        recordCopyDeviceToHost(stream, op.toHost);
        return;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        recordCopyDeviceToDevice(stream, op.copy);
        return;
    case BP_GRAPH_OP_FILL:
        recordFill(stream, op.fill);
        return;
    }
    throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                     "op kind " + std::to_string(sdk::rawValue(op.kind)) + " is unknown");
}

void GpuDevice::checkGraphCall(const bpv::Call &call, const std::string &what) const {
    if (call.ok()) return;
    try {
        check(call);
    } catch (const sdk::Error &e) {
        if (e.code() == BP_ERROR_DEVICE_LOST || e.code() == BP_ERROR_OUT_OF_MEMORY) throw;
        throw sdk::Error(BP_ERROR_UNSUPPORTED, what + ": " + e.what(), e.vendorCode());
    }
}

CapturedGraph GpuDevice::captureGraph(const std::vector<sdk::GraphOp> &ops) {
    std::lock_guard lock(captureMutex_);
    if (captureStream_ == nullptr) check(bpv::streamCreate(driver_, &captureStream_));
    CapturedGraph graph(driver_);
    checkGraphCall(bpv::beginCapture(driver_, captureStream_), "capturing a graph");
    CaptureScope scope(driver_, captureStream_);
    for (size_t i = 0; i < ops.size(); ++i) {
        try {
            recordOp(captureStream_, ops[i]);
        } catch (const sdk::Error &e) {
            const std::string where = "op " + std::to_string(i) + " (" + opName(ops[i].kind) + ")";
            // No vendor code: the op's own checks refused it, as the ordinary call would have.
            if (e.vendorCode() == 0 || e.code() == BP_ERROR_DEVICE_LOST ||
                e.code() == BP_ERROR_OUT_OF_MEMORY)
                throw sdk::Error(e.code(), where + ": " + e.what(), e.vendorCode());
            // The driver refused to capture what it would have run: the ordinary call, in the
            // core's op-by-op replay, reports whatever is wrong with it.
            throw sdk::Error(BP_ERROR_UNSUPPORTED,
                             where + " cannot be captured into a " + bpv::kApiName +
                                 " graph: " + e.what(),
                             e.vendorCode());
        }
    }
    checkGraphCall(scope.end(graph), "capturing a graph");
    return graph;
}

GpuGraph &GpuDevice::ownGraph(sdk::Graph &graph, const char *what) {
    auto &own = sdk::as<GpuGraph>(graph);
    if (&own.device_ != this)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, std::string(what) + ": the graph belongs to " +
                                                        own.device_.name() + ", not to " + name());
    return own;
}

std::unique_ptr<sdk::Graph> GpuDevice::createGraph(std::vector<sdk::GraphOp> &ops) {
    enter();
    if (!bpv::hasGraphs(driver_))
        throw sdk::Error(BP_ERROR_UNSUPPORTED,
                         std::string("graph_create: this ") + bpv::kDriverDescription +
                             " has no stream capture or graphs; the operations are replayed one "
                             "by one");
    auto graph = std::make_unique<GpuGraph>(*this, std::move(ops));
    try {
        const CapturedGraph captured = captureGraph(graph->ops_);
        // The executable graph is a copy: the captured one is freed on return.
        checkGraphCall(bpv::graphInstantiate(driver_, &graph->exec_, captured.get()),
                       "instantiating the captured graph");
    } catch (const sdk::Error &e) {
        throw sdk::Error(e.code(),
                         std::string("graph_create: ") + e.what() +
                             (e.code() == BP_ERROR_UNSUPPORTED
                                  ? "; the operations are replayed one by one"
                                  : ""),
                         e.vendorCode());
    }
    return graph;
}

void GpuDevice::launchGraph(sdk::Stream &stream, sdk::Graph &graph) {
    enter();
    auto &own = ownGraph(graph, "graph_launch");
    // Ordered on the stream like a launch: after the work recorded before, before the work and
    // the events recorded after. The graph records no collective, so the stream's marks stay.
    std::lock_guard lock(own.mutex_);
    check(bpv::graphLaunch(driver_, own.exec_, sdk::as<GpuStream>(stream).get()));
}

void GpuDevice::updateGraph(sdk::Graph &graph, uint32_t index, sdk::GraphOp &op) {
    enter();
    auto &own = ownGraph(graph, "graph_update");
    std::lock_guard lock(own.mutex_);
    const std::string what = "graph_update of op " + std::to_string(index);
    if (index >= own.ops_.size())
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                         what + ": the graph has " + std::to_string(own.ops_.size()) + " ops");
    const sdk::GraphOp &old = own.ops_[index];
    if (op.kind != old.kind)
        throw sdk::Error(BP_ERROR_INVALID_ARGUMENT, what + ": it is " + opName(old.kind) +
                                                        ", the new op " + opName(op.kind) +
                                                        "; an update keeps the kind");
    if (op.kind == BP_GRAPH_OP_LAUNCH) {
        const bp_launch_args &was = old.launch, &now = op.launch;
        if (now.kernel != was.kernel)
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             what + ": the new launch runs another kernel; an update keeps the "
                                    "kernel (record a new graph instead)");
        if (now.block[0] != was.block[0] || now.block[1] != was.block[1] ||
            now.block[2] != was.block[2])
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             what + ": the new launch has another block size; an update keeps "
                                    "the block size");
        if (now.binding_count != was.binding_count)
            throw sdk::Error(BP_ERROR_INVALID_ARGUMENT,
                             what + ": the new launch has " + std::to_string(now.binding_count) +
                                 " bindings instead of " + std::to_string(was.binding_count) +
                                 "; an update keeps the binding count");
    }
    if (!bpv::hasGraphUpdate(driver_))
        throw sdk::Error(BP_ERROR_UNSUPPORTED,
                         what + ": this " + bpv::kDriverDescription +
                             " cannot update an instantiated graph; the graph is rebuilt");
    // The whole sequence is captured again with the new op, and the driver takes the new
    // parameters into the executable graph; launches already recorded keep the old ones. On any
    // failure the graph keeps its old op, matching the executable graph, which is unchanged.
    std::swap(own.ops_[index], op);
    try {
        const CapturedGraph captured = captureGraph(own.ops_);
        std::string why;
        const bpv::Call updated = bpv::graphExecUpdate(driver_, own.exec_, captured.get(), &why);
        checkGraphCall(updated, "the driver refused the update" +
                                    (why.empty() ? std::string() : " (" + why + ")"));
    } catch (const sdk::Error &e) {
        std::swap(own.ops_[index], op);
        throw sdk::Error(e.code(),
                         what + ": " + e.what() +
                             (e.code() == BP_ERROR_UNSUPPORTED ? "; the graph is rebuilt" : ""),
                         e.vendorCode());
    } catch (...) {
        std::swap(own.ops_[index], op);
        throw;
    }
}

} // namespace backplane::gpu
