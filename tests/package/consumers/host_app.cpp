// A host application built against an installed backplane alone (tests/package/consumers.sh
// builds it with CMake and with pkg-config): selects the host device, round-trips a buffer
// through ComputeClient, and catches backplane::Error thrown from inside libbackplane.so.
#include <backplane/client.hpp>
#include <backplane/error.hpp>
#include <backplane/runtime.hpp>

#include <cstdint>
#include <iostream>
#include <vector>

int main() {
    try {
        const backplane::Runtime runtime; // BACKPLANE_PLUGIN_PATH names the installed plugins
        try {
            (void)runtime.select("no_such_backend:0");
            std::cerr << "host app: selecting no_such_backend:0 did not throw\n";
            return 1;
        } catch (const backplane::Error &e) {
            if (e.code() != backplane::ErrorCode::NoMatchingDevice) {
                std::cerr << "host app: expected no_matching_device, got "
                          << backplane::toString(e.code()) << ": " << e.what() << "\n";
                return 1;
            }
        }
        const backplane::Selection selection = runtime.select("host");
        backplane::ComputeClient client = runtime.open(selection);
        const std::vector<uint32_t> values{1, 2, 3, 0xdeadbeef};
        const backplane::Buffer buffer =
            client.create(values.data(), values.size() * sizeof(uint32_t));
        if (client.readAs<uint32_t>(buffer) != values) {
            std::cerr << "host app: the buffer read back differs from what was written\n";
            return 1;
        }
        std::cout << "host app: " << selection.device.id() << " round-tripped "
                  << values.size() * sizeof(uint32_t) << " bytes\n";
        return 0;
    } catch (const backplane::Error &e) {
        std::cerr << "host app: backplane::Error (" << backplane::toString(e.code())
                  << "): " << e.what() << "\n";
        return 1;
    }
}
