// Recorded sequences: what a Recording holds, and how the server bakes and replays it.
#pragma once

#include "memory/slice.hpp"
#include "memory/staging_pool.hpp"
#include "device/driver.hpp"

#include <backplane/client.hpp>

#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace backplane::detail {

/// One recorded operation with everything it uses held: its slices (bindings, grid buffer, copy
/// ends), the pinned block of a host copy, and the argument structs the plugin gets. Pointers in
/// the structs (`launch.bindings`, `launch.scalars`, `op`) point into this object: fixPointers()
/// sets them after a copy.
struct RecordedOp {
    bp_graph_op_kind kind = BP_GRAPH_OP_LAUNCH;
    std::string kernelName;      ///< launches: for messages
    std::vector<std::shared_ptr<Slice>> slices;
    std::shared_ptr<PinnedBlock> pinned; ///< host copies
    bp_launch_args launch{};
    std::vector<bp_binding> bindings;
    std::vector<std::byte> scalars;
    bp_copy_host_to_device_args toDevice{};
    bp_copy_device_to_host_args toHost{};
    bp_copy_device_to_device_args copy{};
    bp_fill_args fill{};
    bp_graph_op op{};
    /// Launches: what each binding does (KernelSource::access; missing ones are ReadWrite).
    std::vector<BindingAccess> access;
    /// The bytes the op reads and writes, from its slices' starts (poisoning, docs/streams.md
    /// "What failed work leaves behind"); set by computeRanges().
    std::vector<SliceRange> reads, writes;

    void fixPointers();
    /// Sets `reads` and `writes` from the argument structs and `slices`.
    void computeRanges();
};

/// One immutable version of a recording: its ops, the slices they use (each once) and the
/// plugin's graph of them, if any. A replay holds the version it issued until that replay
/// completed, so an update() never changes or frees what a pending replay uses.
struct RecordingVersion {
    std::vector<RecordedOp> ops;
    std::vector<std::shared_ptr<Slice>> slices;
    /// Shared between versions while the plugin updates the graph in place.
    std::shared_ptr<GraphOwner> graph;

    /// A deep copy with its pointers fixed (for update()).
    std::shared_ptr<RecordingVersion> clone() const;
    /// Gathers `slices` from the ops, each slice once.
    void collectSlices();
    /// The ops as the plugin's graph_create wants them.
    std::vector<bp_graph_op> graphOps() const;
    /// Every range some op writes (a failed replay poisons them all).
    std::vector<SliceRange> allWrites() const;
};

/// What a Recording shares. The server keeps it alive (and the server alive through it).
struct RecordingState {
    std::shared_ptr<ComputeServer> server;
    std::mutex mutex; ///< guards the fields below; taken before the engine lock
    std::shared_ptr<RecordingVersion> version;
    std::vector<size_t> launchOps; ///< op index of launch n
    bool native = false;
    std::string note;
};

/// A recording in progress of one thread on one stream: the ops so far.
struct RecordingBuilder {
    std::mutex mutex;
    std::vector<RecordedOp> ops;
};

} // namespace backplane::detail
