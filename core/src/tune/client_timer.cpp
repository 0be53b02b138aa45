// ClientTimer: tuner samples measured with the engine's profiling tokens.
#include <backplane/client.hpp>
#include <backplane/tune.hpp>

namespace backplane::tune {

ClientTimer::ClientTimer(const ComputeClient &client)
    : client_(std::make_unique<ComputeClient>(client)) {}

ClientTimer::~ClientTimer() = default;

std::chrono::nanoseconds ClientTimer::time(const std::function<void()> &run) {
    // Work queued before the sample must not be billed to it.
    client_->sync();
    const ProfileToken token = client_->profileStart();
    try {
        run();
    } catch (...) {
        // Close the span so the client's token stack stays balanced, then report the failure.
        try {
            client_->profileEnd(token);
        } catch (...) {
        }
        throw;
    }
    return std::chrono::nanoseconds(client_->profileEnd(token).nanoseconds);
}

} // namespace backplane::tune
