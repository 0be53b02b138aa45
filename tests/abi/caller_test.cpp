// Tests of backplane/abi/caller.hpp (struct builders, handle owners, status checks) against the
// in-tree host plugin, opened with RawPlugin. Owners are given a copy of the plugin's table whose
// release entries count their calls and then forward to the plugin, so "released exactly once"
// is counted at the table, where a double release would reach the plugin.
#include <backplane/abi/caller.hpp>
#include <backplane/error.hpp>
#include <backplane/raw_plugin.hpp>

#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>

using namespace backplane;

namespace {

/// $BACKPLANE_TEST_HOST_MANIFEST (another build's plugin), else the build tree's manifest.
std::string manifestPath() {
    const char *env = std::getenv("BACKPLANE_TEST_HOST_MANIFEST");
    return env != nullptr && *env != '\0' ? env : HOST_PLUGIN_MANIFEST;
}

// The real table the counting entries forward to, and how often each was called.
const bp_plugin_api *gReal = nullptr;
int gStreamDestroys = 0;
int gMemoryFrees = 0;
int gDeviceCloses = 0;

/// The host plugin and a copy of its table whose release entries count, then forward.
struct CountingPlugin {
    RawPlugin plugin = RawPlugin::open(readPluginManifest(manifestPath()));
    bp_plugin_api api = plugin.api();

    CountingPlugin() {
        gReal = &plugin.api();
        gStreamDestroys = gMemoryFrees = gDeviceCloses = 0;
        api.stream_destroy = [](bp_device *device, bp_stream *stream) {
            ++gStreamDestroys;
            gReal->stream_destroy(device, stream);
        };
        api.memory_free = [](bp_device *device, bp_memory *memory) {
            ++gMemoryFrees;
            gReal->memory_free(device, memory);
        };
        api.device_close = [](bp_device *device) {
            ++gDeviceCloses;
            gReal->device_close(device);
        };
    }

    bp_device *open() {
        const auto args = abi::make<bp_device_open_args>();
        auto error = abi::make<bp_error>();
        bp_device *device = nullptr;
        abi::check(api.device_open(plugin.instance(), 0, &args, &device, &error), &error,
                   "device_open");
        REQUIRE(device != nullptr);
        return device;
    }
};

/// Device 0 of the counting plugin, opened (and closed) through an owner, and its handles.
struct OpenDevice : CountingPlugin {
    abi::Owned<bp_device> device{api, open()};

    bp_stream *stream() {
        const auto args = abi::make<bp_stream_create_args>();
        auto error = abi::make<bp_error>();
        bp_stream *stream = nullptr;
        abi::check(api.stream_create(device.get(), &args, &stream, &error), &error,
                   "stream_create");
        REQUIRE(stream != nullptr);
        return stream;
    }
    abi::Owned<bp_stream> ownedStream() { return {api, device.get(), stream()}; }
    abi::Owned<bp_memory> ownedPage(uint64_t size) {
        auto args = abi::make<bp_memory_allocate_args>();
        args.kind = BP_MEMORY_DEVICE;
        args.size = size;
        auto error = abi::make<bp_error>();
        bp_memory *memory = nullptr;
        void *mapped = nullptr;
        abi::check(api.memory_allocate(device.get(), &args, &memory, &mapped, &error), &error,
                   "memory_allocate");
        REQUIRE(memory != nullptr);
        return {api, device.get(), memory};
    }
};

} // namespace

TEST_CASE("make zeroes an ABI struct and sets its struct_size") {
    const auto args = abi::make<bp_launch_args>();
    CHECK(args.struct_size == sizeof(bp_launch_args));
    CHECK(args.kernel == nullptr);
    CHECK(args.binding_count == 0);
    const auto error = abi::make<bp_error>();
    CHECK(error.struct_size == sizeof(bp_error));
    CHECK(error.code == BP_SUCCESS);
    CHECK(error.message[0] == '\0');
}

TEST_CASE("an owner releases its handle once, through the table entry of its type") {
    {
        OpenDevice d;
        {
            const abi::Owned<bp_stream> stream = d.ownedStream();
            const abi::Owned<bp_memory> page = d.ownedPage(4096);
            CHECK(stream.device() == d.device.get());
            CHECK(gStreamDestroys == 0);
            CHECK(gMemoryFrees == 0);
        }
        CHECK(gStreamDestroys == 1);
        CHECK(gMemoryFrees == 1);
        CHECK(gDeviceCloses == 0);
    }
    CHECK(gDeviceCloses == 1);
}

TEST_CASE("reset releases now and the destructor does not release again") {
    OpenDevice d;
    {
        abi::Owned<bp_stream> stream = d.ownedStream();
        stream.reset();
        CHECK(gStreamDestroys == 1);
        CHECK_FALSE(stream);
        stream.reset();
        CHECK(gStreamDestroys == 1);
    }
    CHECK(gStreamDestroys == 1);
}

TEST_CASE("a move leaves the source empty and the handle is released once") {
    OpenDevice d;
    bp_stream *raw = d.stream();
    {
        abi::Owned<bp_stream> source(d.api, d.device.get(), raw);
        abi::Owned<bp_stream> target(std::move(source));
        CHECK(source.get() == nullptr); // NOLINT(bugprone-use-after-move): the contract tested
        CHECK_FALSE(source);
        CHECK(target.get() == raw);

        abi::Owned<bp_stream> assigned;
        assigned = std::move(target);
        CHECK(target.get() == nullptr); // NOLINT(bugprone-use-after-move): as above
        CHECK(assigned.get() == raw);
        CHECK(gStreamDestroys == 0);
    }
    CHECK(gStreamDestroys == 1);
}

TEST_CASE("assigning over an owner releases the handle it held") {
    OpenDevice d;
    abi::Owned<bp_stream> first = d.ownedStream();
    bp_stream *second = d.stream();
    first = abi::Owned<bp_stream>(d.api, d.device.get(), second);
    CHECK(gStreamDestroys == 1);
    CHECK(first.get() == second);
    first.reset();
    CHECK(gStreamDestroys == 2);
}

TEST_CASE("release gives the handle up without releasing it") {
    OpenDevice d;
    bp_stream *raw = d.stream();
    {
        abi::Owned<bp_stream> stream(d.api, d.device.get(), raw);
        CHECK(stream.release() == raw);
        CHECK_FALSE(stream);
    }
    CHECK(gStreamDestroys == 0);
    d.api.stream_destroy(d.device.get(), raw);
    CHECK(gStreamDestroys == 1);
}

TEST_CASE("an empty owner releases nothing") {
    CountingPlugin p;
    {
        const abi::Owned<bp_stream> empty;
        const abi::Owned<bp_stream> null(p.api, nullptr, nullptr);
        const abi::Owned<bp_device> noDevice(p.api, nullptr);
    }
    CHECK(gStreamDestroys == 0);
    CHECK(gDeviceCloses == 0);
}

TEST_CASE("check throws the plugin's message and code for a launch of a NULL kernel") {
    OpenDevice d;
    const abi::Owned<bp_stream> stream = d.ownedStream();
    const auto args = abi::make<bp_launch_args>(); // kernel NULL
    auto error = abi::make<bp_error>();
    const bp_status status = d.api.kernel_launch(d.device.get(), stream.get(), &args, &error);
    REQUIRE(status == BP_ERROR_INVALID_ARGUMENT);
    const std::string message = errorMessage(error);
    REQUIRE_FALSE(message.empty());
    try {
        abi::check(status, &error, "kernel_launch", "host");
        FAIL("check did not throw for " << toString(status));
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::InvalidArgument));
        CHECK(std::string(e.what()) == "kernel_launch: " + message);
        CHECK(e.backend() == "host");
        CHECK(e.vendorCode() == error.vendor_code);
    }
}

TEST_CASE("check passes a success through and needs no error object") {
    CHECK_NOTHROW(abi::check(BP_SUCCESS, nullptr, "probe"));
    try {
        abi::check(BP_ERROR_TIMEOUT, nullptr, "event_wait");
        FAIL("check did not throw");
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::Timeout));
        CHECK(std::string(e.what()) == "event_wait");
    }
}

TEST_CASE("check maps every status as the runtime does") {
    for (int code = 1; code <= 16; ++code) {
        const auto status = static_cast<bp_status>(code);
        auto error = abi::make<bp_error>();
        std::strcpy(error.message, "why");
        error.vendor_code = 7;
        ErrorCode fromCheck{};
        ErrorCode fromRuntime{};
        std::string checkText;
        std::string runtimeText;
        try {
            abi::check(status, &error, "call", "plugin");
        } catch (const Error &e) {
            fromCheck = e.code();
            checkText = e.what();
        }
        try {
            throwIfFailed(status, error, "plugin", "call");
        } catch (const Error &e) {
            fromRuntime = e.code();
            runtimeText = e.what();
        }
        INFO("status " << code);
        CHECK((fromCheck == fromRuntime));
        CHECK(checkText == runtimeText);
        CHECK(checkText == "call: why");
    }
    CHECK((abi::toErrorCode(BP_ERROR_OUT_OF_MEMORY) == ErrorCode::OutOfMemory));
    CHECK((abi::toErrorCode(BP_ERROR_COMPILE) == ErrorCode::Compile));
    CHECK((abi::toErrorCode(BP_ERROR_REMOTE) == ErrorCode::Remote));
    CHECK((abi::toErrorCode(BP_ERROR_NOT_READY) == ErrorCode::Internal));
}

TEST_CASE("a plugin's message is cut at the field and made printable") {
    auto error = abi::make<bp_error>();
    std::memset(error.message, 'x', sizeof(error.message)); // no NUL at all
    error.message[0] = '\n';
    error.message[1] = '\xff';
    const std::string text = abi::errorText(error);
    CHECK(text.size() == sizeof(error.message));
    CHECK(text.substr(0, 3) == "??x");
}
