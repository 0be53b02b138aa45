// Recorded sequences: recording a stream's launches, copies and fills, baking them into the
// plugin's graph, replaying and updating them (docs/recording.md).
#include "server/recording.hpp"

#include "server/compute_server.hpp"
#include "lang/ir.hpp"

#include <backplane/lang.hpp>
#include <backplane/log.hpp>

#include <algorithm>
#include <unordered_set>

namespace backplane::detail {

// ----- what a recording holds -------------------------------------------------------------------

void RecordedOp::fixPointers() {
    launch.bindings = bindings.empty() ? nullptr : bindings.data();
    launch.scalars = scalars.empty() ? nullptr : scalars.data();
    launch.binding_count = static_cast<uint32_t>(bindings.size());
    launch.scalar_size = scalars.size();
    op = {};
    op.struct_size = sizeof(op);
    op.kind = kind;
    switch (kind) {
    case BP_GRAPH_OP_LAUNCH: op.launch = &launch; break;
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE: op.to_device = &toDevice; break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST: op.to_host = &toHost; break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE: op.copy = &copy; break;
    case BP_GRAPH_OP_FILL: op.fill = &fill; break;
    }
}

void RecordedOp::computeRanges() {
    reads.clear();
    writes.clear();
    // Argument offsets count from the memory object; ranges count from the slice.
    const auto range = [](const std::shared_ptr<Slice> &s, uint64_t memoryOffset, uint64_t size) {
        return SliceRange{s.get(), memoryOffset - s->offset, memoryOffset - s->offset + size};
    };
    switch (kind) {
    case BP_GRAPH_OP_LAUNCH:
        for (size_t i = 0; i < bindings.size(); ++i) {
            const SliceRange r = range(slices[i], bindings[i].offset, bindings[i].size);
            const BindingAccess a = i < access.size() ? access[i] : BindingAccess::ReadWrite;
            if (a != BindingAccess::Write) reads.push_back(r);
            if (a != BindingAccess::Read) writes.push_back(r);
        }
        if (launch.grid_memory != nullptr)
            reads.push_back(range(slices.back(), launch.grid_offset, 3 * sizeof(uint32_t)));
        break;
    case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
        writes.push_back(range(slices[0], toDevice.dst_offset, toDevice.size));
        break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
        reads.push_back(range(slices[0], toHost.src_offset, toHost.size));
        break;
    case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
        reads.push_back(range(slices[0], copy.src_offset, copy.size));
        writes.push_back(range(slices[1], copy.dst_offset, copy.size));
        break;
    case BP_GRAPH_OP_FILL: writes.push_back(range(slices[0], fill.offset, fill.size)); break;
    }
}

std::vector<SliceRange> RecordingVersion::allWrites() const {
    std::vector<SliceRange> out;
    for (const RecordedOp &op : ops) out.insert(out.end(), op.writes.begin(), op.writes.end());
    return out;
}

std::shared_ptr<RecordingVersion> RecordingVersion::clone() const {
    auto copy = std::make_shared<RecordingVersion>(*this);
    for (RecordedOp &op : copy->ops) op.fixPointers();
    return copy;
}

void RecordingVersion::collectSlices() {
    slices.clear();
    std::unordered_set<const Slice *> seen;
    for (const RecordedOp &op : ops)
        for (const std::shared_ptr<Slice> &slice : op.slices)
            if (seen.insert(slice.get()).second) slices.push_back(slice);
}

std::vector<bp_graph_op> RecordingVersion::graphOps() const {
    std::vector<bp_graph_op> out;
    out.reserve(ops.size());
    for (const RecordedOp &op : ops) out.push_back(op.op);
    return out;
}

namespace {

/// Fills a launch op from a checked dispatch (`slices`: its bindings, then the grid buffer).
void fillLaunch(RecordedOp &op, bp_kernel *kernel, const Dispatch &dispatch,
                std::span<const std::shared_ptr<Slice> *const> slices) {
    op.slices.clear();
    op.bindings.clear();
    for (size_t i = 0; i < dispatch.bindings.size(); ++i) {
        const std::shared_ptr<Slice> &s = *slices[i];
        const Buffer &b = dispatch.bindings[i];
        op.slices.push_back(s);
        op.bindings.push_back({s->memory, s->offset + b.offset(), b.size()});
    }
    op.launch = {};
    op.launch.struct_size = sizeof(op.launch);
    op.launch.kernel = kernel;
    std::copy(dispatch.grid.begin(), dispatch.grid.end(), op.launch.grid);
    std::copy(dispatch.block.begin(), dispatch.block.end(), op.launch.block);
    if (dispatch.gridBuffer) {
        const std::shared_ptr<Slice> &g = *slices.back();
        op.slices.push_back(g);
        op.launch.grid_memory = g->memory;
        op.launch.grid_offset = g->offset + dispatch.gridBuffer.offset() + dispatch.gridOffset;
    }
    op.launch.shared_memory_bytes = dispatch.sharedMemoryBytes;
    op.scalars = dispatch.scalars;
}

/// Issues a version's ops one by one on `stream` (plugins without graphs).
void replayCalls(Driver &driver, bp_stream *stream, const RecordingVersion &version) {
    for (const RecordedOp &op : version.ops) {
        switch (op.kind) {
        case BP_GRAPH_OP_LAUNCH: driver.launch(stream, op.launch, op.kernelName); break;
        case BP_GRAPH_OP_COPY_HOST_TO_DEVICE:
            driver.copyHostToDevice(stream, op.toDevice.src, op.toDevice.dst,
                                    op.toDevice.dst_offset, op.toDevice.size);
            break;
        case BP_GRAPH_OP_COPY_DEVICE_TO_HOST:
            driver.copyDeviceToHost(stream, op.toHost.src, op.toHost.src_offset, op.toHost.dst,
                                    op.toHost.size);
            break;
        case BP_GRAPH_OP_COPY_DEVICE_TO_DEVICE:
            driver.copyDeviceToDevice(stream, op.copy.src, op.copy.src_offset, op.copy.dst,
                                      op.copy.dst_offset, op.copy.size);
            break;
        case BP_GRAPH_OP_FILL:
            driver.fill(stream, op.fill.dst, op.fill.offset, op.fill.size, op.fill.pattern);
            break;
        }
    }
}

std::string dims(const uint32_t (&d)[3]) {
    return "(" + std::to_string(d[0]) + ", " + std::to_string(d[1]) + ", " + std::to_string(d[2]) +
           ")";
}

} // namespace

// ----- recording --------------------------------------------------------------------------------

namespace {

/// The recordings the calling thread has open. A thread that ends without endRecording() must
/// not leave its stream recording (a later thread may get the same std::thread::id, and its calls
/// would be recorded, never run) nor keep the memory the recording holds: they are discarded
/// when the thread ends.
struct OpenRecordings {
    std::vector<std::pair<std::weak_ptr<ComputeServer>, StreamId>> open;
    OpenRecordings() = default;
    OpenRecordings(const OpenRecordings &) = delete;
    OpenRecordings &operator=(const OpenRecordings &) = delete;
    ~OpenRecordings() {
        for (const auto &[server, stream] : open)
            if (const auto alive = server.lock())
                alive->discardRecording(std::this_thread::get_id(), stream);
    }
    void forget(const ComputeServer *server, StreamId stream) {
        std::erase_if(open, [&](const auto &entry) {
            return entry.second == stream && entry.first.lock().get() == server;
        });
    }
};
thread_local OpenRecordings openRecordings;

} // namespace

void ComputeServer::discardRecording(std::thread::id thread, StreamId stream) {
    std::shared_ptr<RecordingBuilder> builder; // dropped after the lock: its buffers go back
    {
        std::lock_guard lock(recordingMutex_);
        const auto it = recordingStreams_.find({thread, stream});
        if (it == recordingStreams_.end()) return;
        builder = std::move(it->second);
        recordingStreams_.erase(it);
        recordings_.store(static_cast<uint32_t>(recordingStreams_.size()),
                          std::memory_order_release);
    }
    log::write(log::Subsystem::Streams, log::Level::Warn,
               info().id() + ": a thread ended while recording on stream " +
                   std::to_string(stream) + " (beginRecording without endRecording); the "
                   "recording was discarded");
}

std::shared_ptr<RecordingBuilder> ComputeServer::findRecording(StreamId stream) {
    std::lock_guard lock(recordingMutex_);
    const auto it = recordingStreams_.find({std::this_thread::get_id(), stream});
    return it == recordingStreams_.end() ? nullptr : it->second;
}

void ComputeServer::refuseRecorded(StreamId stream, const char *what) {
    if (!findRecording(stream)) return;
    throw Error(ErrorCode::InvalidArgument,
                std::string(what) + " cannot be recorded: this thread's stream " +
                    std::to_string(stream) + " of " + info().id() +
                    " is recording (beginRecording), and a recording holds only launches, "
                    "copies, fills and PinnedBuffer transfers. Do it before beginRecording() or "
                    "after endRecording(), or on another stream");
}

void ComputeServer::beginRecording(StreamId stream) {
    checkAlive();
    std::lock_guard lock(recordingMutex_);
    auto [it, added] = recordingStreams_.try_emplace({std::this_thread::get_id(), stream});
    if (!added)
        throw Error(ErrorCode::InvalidArgument,
                    "beginRecording: this thread's stream " + std::to_string(stream) + " of " +
                        info().id() + " is already recording; call endRecording() first");
    it->second = std::make_shared<RecordingBuilder>();
    recordings_.store(static_cast<uint32_t>(recordingStreams_.size()), std::memory_order_release);
    openRecordings.open.emplace_back(weak_from_this(), stream);
}

bool ComputeServer::recording(StreamId stream) { return recordingOf(stream) != nullptr; }

void ComputeServer::recordOp(RecordingBuilder &builder, RecordedOp op) {
    op.computeRanges();
    std::lock_guard lock(builder.mutex);
    builder.ops.push_back(std::move(op));
}

void ComputeServer::recordLaunch(RecordingBuilder &builder, const KernelSource &kernel,
                                 const Dispatch &dispatch) {
    boost::container::small_vector<SlicePtr, 17> slices;
    checkDispatch(kernel.name, dispatch, slices);
    checkLaunchLimits(info(), kernel.name, dispatch, true);
    RecordedOp op;
    op.kind = BP_GRAPH_OP_LAUNCH;
    op.kernelName = kernel.name;
    op.access = kernel.access;
    // Compiled now, so that a compile error shows at the recorded call; kernels live as long as
    // the server, which the recording keeps.
    fillLaunch(op, kernels_.find(kernel), dispatch, {slices.data(), slices.size()});
    recordOp(builder, std::move(op));
}

bool ComputeServer::bakeGraph(RecordingVersion &version, std::string &note) {
    if (!multi_) {
        note = "the core issues the recorded calls: " + info().id() +
               " runs on scheduler streams (no native asynchronous streams)";
        return false;
    }
    if (!config_.nativeRecordings) {
        note = "the core issues the recorded calls: streams.native_recordings is false";
        return false;
    }
    std::string why;
    const std::vector<bp_graph_op> ops = version.graphOps();
    GraphOwner graph;
    try {
        graph = driver_->graphCreate(ops, why);
    } catch (const Error &e) {
        // The core checked every op like the calls; what the plugin's graphs still refuse
        // (pinned memory of another device, say) the calls may do: they replay it instead. A
        // lost device or a full memory is the application's to know.
        if (e.code() == ErrorCode::DeviceLost || e.code() == ErrorCode::OutOfMemory) throw;
        why = std::string("the plugin's graph_create refused it (") + e.what() + ")";
        log::write(log::Subsystem::Streams, log::Level::Warn, info().id() + ": " + why);
    }
    if (!graph) {
        note = "the core issues the recorded calls: " + why;
        log::write(log::Subsystem::Streams, log::Level::Debug, info().id() + ": " + note);
        return false;
    }
    version.graph = std::make_shared<GraphOwner>(std::move(graph));
    note = "one graph of the " + driver_->plugin().name() + " plugin";
    return true;
}

Recording ComputeServer::endRecording(StreamId stream) {
    std::shared_ptr<RecordingBuilder> builder;
    {
        std::lock_guard lock(recordingMutex_);
        const auto it = recordingStreams_.find({std::this_thread::get_id(), stream});
        if (it == recordingStreams_.end()) {
            if (const auto lost = lostRecordings_.find({std::this_thread::get_id(), stream});
                lost != lostRecordings_.end()) {
                const uint64_t open = lost->second;
                lostRecordings_.erase(lost);
                throw Error(ErrorCode::DeviceLost,
                            "endRecording: the recording of this thread's stream " +
                                std::to_string(stream) + " began on open #" +
                                std::to_string(open) + " of " + info().id() +
                                ", which was lost and replaced by this open (#" +
                                std::to_string(openNumber_) +
                                ", devices.reopen_after_fault): record it again",
                            info().backend);
            }
            throw Error(ErrorCode::InvalidArgument,
                        "endRecording: this thread's stream " + std::to_string(stream) + " of " +
                            info().id() + " is not recording; call beginRecording() first");
        }
        builder = std::move(it->second);
        recordingStreams_.erase(it);
        recordings_.store(static_cast<uint32_t>(recordingStreams_.size()),
                          std::memory_order_release);
    }
    openRecordings.forget(this, stream);
    auto state = std::make_shared<RecordingState>();
    state->server = shared_from_this();
    auto version = std::make_shared<RecordingVersion>();
    {
        std::lock_guard lock(builder->mutex);
        version->ops = std::move(builder->ops);
    }
    for (size_t i = 0; i < version->ops.size(); ++i) {
        version->ops[i].fixPointers();
        if (version->ops[i].kind == BP_GRAPH_OP_LAUNCH) state->launchOps.push_back(i);
    }
    version->collectSlices();
    if (version->ops.empty()) state->note = "nothing was recorded: a replay does nothing";
    else state->native = bakeGraph(*version, state->note);
    state->version = std::move(version);
    return Recording(std::move(state));
}

// ----- replay and update ------------------------------------------------------------------------

void ComputeServer::replay(StreamId stream, const Recording &recording) {
    checkAlive();
    if (!recording.state_)
        throw Error(ErrorCode::InvalidArgument,
                    "replay: the Recording is empty (default-constructed); use the one "
                    "endRecording() returned");
    RecordingState &state = *recording.state_;
    if (state.server.get() != this && state.server->lost_.load(std::memory_order_acquire)) {
        std::lock_guard lock(state.server->lostMutex_);
        throw Error(ErrorCode::DeviceLost,
                    "replay: the Recording was made on " + state.server->info().id() +
                        " open #" + std::to_string(state.server->openNumber_) +
                        ", which was lost: " + state.server->lostReason_ +
                        ". Record it again on this client (" + info().id() + " open #" +
                        std::to_string(openNumber_) + ")",
                    info().backend);
    }
    if (state.server.get() != this)
        throw Error(ErrorCode::InvalidArgument,
                    "replay: the Recording was made by another client (" +
                        state.server->info().id() + " open #" +
                        std::to_string(state.server->openNumber_) + "), not this one (" +
                        info().id() + " open #" + std::to_string(openNumber_) +
                        "); replay it with the client that recorded it");
    refuseWhileRecording(stream, "replay()");
    const uint32_t slot = slotOf(stream);
    {
        // The recording's lock is held until the replay is issued: an update() cannot change
        // the plugin's graph while it is being launched.
        std::lock_guard stateLock(state.mutex);
        std::shared_ptr<RecordingVersion> version = state.version;
        if (version->ops.empty()) return;
        boost::container::small_vector<SlicePtr, 32> slices;
        for (const std::shared_ptr<Slice> &slice : version->slices) slices.push_back(&slice);
        Driver *driver = driver_.get();
        // What the recording reads before writing it must hold valid data; what it writes is
        // valid once the replay is issued, and poisoned when it fails or is not issued.
        for (const RecordedOp &op : version->ops) {
            if (const Poison::Hit hit = firstPoisoned(op.reads); hit.why)
                refuseDependent(hit, version->allWrites(), "replay (not issued)");
            for (const SliceRange &w : op.writes) w.slice->poison.clear(w.begin, w.end);
        }
        try {
            std::lock_guard lock(mutex_);
            // One operation using every slice of the recording: it is ordered after their
            // earlier uses on any stream and becomes their last use. The version is held until
            // it completed.
            submit(
                slot, std::span<const SlicePtr>(slices.data(), slices.size()),
                [this, driver, version, slot](bp_stream *s) {
                    timed(s, slot, "replay", "replay", [&] {
                        if (version->graph) driver->graphLaunch(s, version->graph->get());
                        else replayCalls(*driver, s, *version);
                    });
                },
                Hold(version));
        } catch (const std::exception &e) {
            poisonWritten(version->allWrites(), slot, "replay of a recording", e);
            throw;
        }
    }
    throttle(slot); // no lock held: it may wait for the GC
}

void ComputeServer::updateRecording(RecordingState &state, size_t launch,
                                    const Dispatch &dispatch, const std::string *kernelName) {
    checkAlive();
    std::lock_guard stateLock(state.mutex);
    if (launch >= state.launchOps.size())
        throw Error(ErrorCode::InvalidArgument,
                    "Recording::update: launch " + std::to_string(launch) +
                        " does not exist: the recording has " +
                        std::to_string(state.launchOps.size()) + " launch(es), numbered from 0");
    const size_t index = state.launchOps[launch];
    const RecordedOp &old = state.version->ops[index];
    const std::string what = "Recording::update of launch " + std::to_string(launch) +
                             " (kernel '" + old.kernelName + "')";
    if (kernelName != nullptr && *kernelName != old.kernelName)
        throw Error(ErrorCode::InvalidArgument,
                    what + ": the update names kernel '" + *kernelName +
                        "'; a recorded launch keeps its kernel");
    boost::container::small_vector<SlicePtr, 17> slices;
    checkDispatch(old.kernelName, dispatch, slices);
    checkLaunchLimits(info(), old.kernelName, dispatch, true);
    const bool oldGrid = old.launch.grid_memory != nullptr;
    if (dispatch.bindings.size() != old.bindings.size())
        throw Error(ErrorCode::InvalidArgument,
                    what + ": it was recorded with " + std::to_string(old.bindings.size()) +
                        " binding(s), the update has " + std::to_string(dispatch.bindings.size()) +
                        "; the number of bindings cannot change");
    if (!std::equal(dispatch.block.begin(), dispatch.block.end(), std::begin(old.launch.block)))
        throw Error(ErrorCode::InvalidArgument,
                    what + ": the block size cannot change (recorded " + dims(old.launch.block) +
                        ")");
    if (dispatch.scalars.size() != old.scalars.size())
        throw Error(ErrorCode::InvalidArgument,
                    what + ": it was recorded with " + std::to_string(old.scalars.size()) +
                        " scalar bytes, the update has " + std::to_string(dispatch.scalars.size()) +
                        " (a portable kernel's update must pass the kernel: "
                        "update(launch, kernel, dispatch))");
    if (bool(dispatch.gridBuffer) != oldGrid ||
        dispatch.sharedMemoryBytes != old.launch.shared_memory_bytes)
        throw Error(ErrorCode::InvalidArgument,
                    what + ": whether the grid comes from a buffer, and the dynamic shared "
                           "memory, cannot change");
    std::shared_ptr<RecordingVersion> next = state.version->clone();
    RecordedOp &op = next->ops[index];
    fillLaunch(op, old.launch.kernel, dispatch, {slices.data(), slices.size()});
    op.fixPointers();
    op.computeRanges();
    next->collectSlices();
    if (next->graph && !driver_->graphUpdate(next->graph->get(), static_cast<uint32_t>(index),
                                             op.op)) {
        // No update in place: a new graph. The old one stays with the versions that pending
        // replays hold, and goes when they completed.
        next->graph.reset();
        state.native = bakeGraph(*next, state.note);
    }
    state.version = std::move(next);
}

} // namespace backplane::detail

// ----- the public Recording ---------------------------------------------------------------------

namespace backplane {

namespace {
detail::RecordingState &stateOf(const std::shared_ptr<detail::RecordingState> &state,
                                const char *what) {
    if (!state)
        throw Error(ErrorCode::InvalidArgument,
                    std::string("Recording::") + what +
                        ": the Recording is empty (default-constructed)");
    return *state;
}
} // namespace

size_t Recording::operations() const {
    detail::RecordingState &state = stateOf(state_, "operations");
    std::lock_guard lock(state.mutex);
    return state.version->ops.size();
}

size_t Recording::launches() const {
    detail::RecordingState &state = stateOf(state_, "launches");
    std::lock_guard lock(state.mutex);
    return state.launchOps.size();
}

bool Recording::native() const {
    detail::RecordingState &state = stateOf(state_, "native");
    std::lock_guard lock(state.mutex);
    return state.native;
}

std::string Recording::replayNote() const {
    detail::RecordingState &state = stateOf(state_, "replayNote");
    std::lock_guard lock(state.mutex);
    return state.note;
}

void Recording::update(size_t launch, const Dispatch &dispatch) {
    detail::RecordingState &state = stateOf(state_, "update");
    state.server->updateRecording(state, launch, dispatch);
}

void Recording::update(size_t launch, const lang::Kernel &kernel, const Dispatch &dispatch) {
    detail::RecordingState &state = stateOf(state_, "update");
    // As ComputeClient::execute prepares it: the kernel's dynamic shared memory included.
    Dispatch prepared = kernel.prepare(dispatch);
    if (const auto dialect = lang::detail::dialectOn(kernel.source(), state.server->info()))
        prepared = lang::detail::withDynamicShared(kernel.module(), *dialect, std::move(prepared));
    state.server->updateRecording(state, launch, prepared, &kernel.source().name);
}

} // namespace backplane
