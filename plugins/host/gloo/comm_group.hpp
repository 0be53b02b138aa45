// comm_group of the host plugin's collectives.
#pragma once

#include "../host_stream.hpp"

#include <functional>

namespace backplane::host {

/// comm_group for the calling thread (NCCL's semantics: a group's collectives run together).
/// Within a group collectives are deferred; the group's end gives each stream one task that
/// runs its members concurrently (a send and its recv may share a stream: run in order, the
/// blocking send would wait forever), submitting to the streams from one thread each (a
/// synchronous stream runs the task inside submit), and throws the first failure.
/// endCommGroup throws BP_ERROR_INVALID_ARGUMENT for an end without a begin.
void beginCommGroup();
void endCommGroup();

/// When the calling thread is inside a group, keeps `task` (moved from) for the group's end and
/// returns true; otherwise returns false and leaves it.
bool deferToGroup(HostStream &stream, std::function<void()> &task);

} // namespace backplane::host
