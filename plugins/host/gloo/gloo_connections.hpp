// Ways around gaps of Gloo's TCP transport (Gloo 0.5.0 as Debian 12 packages it): ending a
// context's connections from outside, and SIGPIPE.
#pragma once

#include <csignal>

namespace gloo {
class Context;
}

namespace backplane::host {

/// SIGPIPE blocked on this thread while an object lives. Gloo writes to its sockets with
/// writev(2), which raises SIGPIPE (default action: end the process) when the connection was shut
/// down; blocked, the write fails with EPIPE and Gloo reports it. Threads started meanwhile (Gloo's
/// device loop) inherit the mask. A SIGPIPE left pending by such a write is taken before the mask
/// is restored, so it is never delivered later.
class SigpipeBlocked {
public:
    SigpipeBlocked() noexcept;
    ~SigpipeBlocked();
    SigpipeBlocked(const SigpipeBlocked &) = delete;
    SigpipeBlocked &operator=(const SigpipeBlocked &) = delete;

private:
    sigset_t previous_{};
};

/// Ends every connection of `context` now: shuts its sockets down. Gloo's device thread then sees
/// each one close and fails every operation pending on it, and each peer sees it close and fails
/// its own. (Gloo's own call for this, tcp::Context::signalException, is protected, and the Debian
/// package lacks a header its class needs.) A connection's socket is found among the process's
/// descriptors by its local address; it is shut down through a duplicate checked again first, so
/// a descriptor Gloo closed and the process reused meanwhile is never touched.
void shutDownConnections(gloo::Context &context);

/// Whether a socket of `context`'s connections is still open in this process (Gloo closes a
/// connection's socket once it saw it fail).
bool anyConnectionOpen(gloo::Context &context);

} // namespace backplane::host
