// Ways around gaps of Gloo's TCP transport: ending a context's connections, SIGPIPE.
#include "gloo_connections.hpp"

#include <gloo/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <vector>

namespace backplane::host {

SigpipeBlocked::SigpipeBlocked() noexcept {
    sigset_t pipe;
    sigemptyset(&pipe);
    sigaddset(&pipe, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe, &previous_);
}

SigpipeBlocked::~SigpipeBlocked() {
    if (sigismember(&previous_, SIGPIPE) != 1) {
        sigset_t pending;
        sigemptyset(&pending);
        if (sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1) {
            sigset_t pipe;
            sigemptyset(&pipe);
            sigaddset(&pipe, SIGPIPE);
            const timespec now{0, 0};
            sigtimedwait(&pipe, nullptr, &now);
        }
    }
    pthread_sigmask(SIG_SETMASK, &previous_, nullptr);
}

namespace {

bool sameEndpoint(const sockaddr_storage &a, const sockaddr_storage &b) {
    if (a.ss_family != b.ss_family) return false;
    if (a.ss_family == AF_INET) {
        const auto &x = reinterpret_cast<const sockaddr_in &>(a);
        const auto &y = reinterpret_cast<const sockaddr_in &>(b);
        return x.sin_port == y.sin_port && x.sin_addr.s_addr == y.sin_addr.s_addr;
    }
    if (a.ss_family == AF_INET6) {
        const auto &x = reinterpret_cast<const sockaddr_in6 &>(a);
        const auto &y = reinterpret_cast<const sockaddr_in6 &>(b);
        return x.sin6_port == y.sin6_port &&
               std::memcmp(&x.sin6_addr, &y.sin6_addr, sizeof(x.sin6_addr)) == 0;
    }
    return false;
}

bool localEndpointIn(int fd, const std::vector<sockaddr_storage> &endpoints) {
    sockaddr_storage local{};
    socklen_t length = sizeof(local);
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&local), &length) != 0) return false;
    return std::any_of(endpoints.begin(), endpoints.end(),
                       [&](const sockaddr_storage &e) { return sameEndpoint(local, e); });
}

/// The descriptors open in this process.
std::vector<int> openDescriptors() {
    std::vector<int> fds;
    if (DIR *dir = opendir("/proc/self/fd")) {
        while (const dirent *entry = readdir(dir)) {
            char *end = nullptr;
            const long fd = std::strtol(entry->d_name, &end, 10);
            if (end != entry->d_name && *end == '\0' && fd >= 0 && fd != dirfd(dir))
                fds.push_back(static_cast<int>(fd));
        }
        closedir(dir);
        return fds;
    }
    rlimit limit{};
    const rlim_t last = getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY
                            ? std::min<rlim_t>(limit.rlim_cur, 1 << 20)
                            : 1 << 16;
    for (rlim_t fd = 0; fd < last; ++fd)
        fds.push_back(static_cast<int>(fd));
    return fds;
}

/// The local endpoints of `context`'s connections: unique per socket (a connecting socket has
/// its own port; an accepting one the port of its pair's listener, which Gloo closed).
std::vector<sockaddr_storage> connectionEndpoints(gloo::Context &context) {
    std::vector<sockaddr_storage> endpoints;
    for (int r = 0; r < context.size; ++r) {
        if (r == context.rank) continue;
        const auto &pair = context.getPair(r);
        if (!pair) continue;
        endpoints.push_back(gloo::transport::tcp::Address(pair->address().bytes()).getSockaddr());
    }
    return endpoints;
}

} // namespace

bool anyConnectionOpen(gloo::Context &context) {
    const std::vector<sockaddr_storage> endpoints = connectionEndpoints(context);
    if (endpoints.empty()) return false;
    for (const int fd : openDescriptors())
        if (localEndpointIn(fd, endpoints)) return true;
    return false;
}

// shutdown(2), not close(2): the descriptor stays Gloo's, and its device thread still sees the
// socket end (a read of 0 bytes) and fails what waits on it.
void shutDownConnections(gloo::Context &context) {
    const std::vector<sockaddr_storage> endpoints = connectionEndpoints(context);
    if (endpoints.empty()) return;
    for (const int fd : openDescriptors()) {
        if (!localEndpointIn(fd, endpoints)) continue;
        const int copy = fcntl(fd, F_DUPFD_CLOEXEC, 0);
        if (copy < 0) continue;
        sockaddr_storage peer{};
        socklen_t length = sizeof(peer);
        if (localEndpointIn(copy, endpoints) &&
            getpeername(copy, reinterpret_cast<sockaddr *>(&peer), &length) == 0)
            shutdown(copy, SHUT_RDWR);
        ::close(copy);
    }
}

} // namespace backplane::host
