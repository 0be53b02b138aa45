// A process's description of its ranks (core/src/comm/peer_description.cpp): what this version
// writes reads back; what another process sends is untrusted, and every malformed description is
// Error(Remote) naming the process, where and what, never a crash or another exception. Tests
// internals: backplane_internal_dep. (communicator_test feeds the same through a Rendezvous.)
#include "comm/peer_description.hpp"

#include <backplane/error.hpp>

#include <doctest/doctest.h>

#include <exception>
#include <string>
#include <typeinfo>

using namespace backplane;
using detail::kMaxPeerPluginNameBytes;
using detail::kMaxRanksPerProcess;
using detail::parsePeerDescription;
using detail::PeerDescription;

namespace {

std::string describedAs(const std::string &ranks, const std::string &plugins = R"(["host"])",
                        const std::string &collectives = "[true]",
                        const std::string &forceStaged = "false") {
    return R"({"ranks":)" + ranks + R"(,"plugins":)" + plugins + R"(,"collectives":)" +
           collectives + R"(,"force_staged":)" + forceStaged + "}";
}

/// The message of the Error that reading `text` as process 3's throws; fails the test when it
/// throws anything else or nothing.
std::string refusal(const std::string &text) {
    try {
        (void)parsePeerDescription(text, 3);
    } catch (const Error &e) {
        CHECK((e.code() == ErrorCode::Remote));
        return e.what();
    } catch (const std::exception &e) {
        FAIL("another exception escaped: " << typeid(e).name() << ": " << e.what());
        return "";
    }
    FAIL("accepted");
    return "";
}

} // namespace

TEST_CASE("a description this version writes reads back unchanged") {
    PeerDescription d;
    d.ranks = 3;
    d.plugins = {"host", "cuda", "vulkan"};
    d.collectives = {true, false, true};
    d.forceStaged = true;
    const PeerDescription back = parsePeerDescription(detail::writePeerDescription(d), 0);
    CHECK(back.ranks == 3);
    CHECK(back.plugins == d.plugins);
    CHECK(back.collectives == d.collectives);
    CHECK(back.forceStaged);
}

TEST_CASE("the largest description within the limits is accepted, one more rank is not") {
    PeerDescription d;
    d.ranks = kMaxRanksPerProcess;
    d.plugins.assign(d.ranks, std::string(kMaxPeerPluginNameBytes, 'p'));
    d.collectives.assign(d.ranks, true);
    const std::string text = detail::writePeerDescription(d);
    CHECK(text.size() <= detail::kPeerDescriptionJsonLimits.maxBytes);
    CHECK(parsePeerDescription(text, 0).ranks == kMaxRanksPerProcess);

    d.ranks += 1;
    d.plugins.emplace_back("host");
    d.collectives.push_back(true);
    CHECK(refusal(detail::writePeerDescription(d)).find("/ranks: 4097 ranks") != std::string::npos);
    CHECK(refusal(describedAs("1", "[\"" + std::string(kMaxPeerPluginNameBytes + 1, 'p') + "\"]"))
              .find("/plugins/0: a plugin name of 65 bytes") != std::string::npos);
}

TEST_CASE("a hostile description is refused with an error naming the process and what is wrong") {
    struct Hostile {
        const char *what;
        std::string text;
        const char *expected;
    };
    const Hostile cases[] = {
        {"nested 100000 levels deep", std::string(100000, '[') + std::string(100000, ']'),
         "nesting deeper than 4 levels"},
        {"nested deep inside the plugins",
         describedAs("1", std::string(1000, '[') + std::string(1000, ']')),
         "/plugins/0/0/0: nesting deeper than 4 levels"},
        {"a 10 MB plugin name", describedAs("1", "[\"" + std::string(10u << 20, 'a') + "\"]"),
         "bytes accepted here"},
        {"rank count 2^40", describedAs("1099511627776"),
         "/ranks: 1099511627776 ranks; expected 1 to 4096"},
        {"rank count 2^32 + 1", describedAs("4294967297"), "/ranks: 4294967297 ranks"},
        {"rank count 2^64", describedAs("18446744073709551616"), "/ranks: a floating-point number"},
        {"rank count -1", describedAs("-1"), "/ranks: -1 ranks"},
        {"rank count 0", describedAs("0", "[]", "[]"), "/ranks: 0 ranks"},
        {"rank count true", describedAs("true"),
         "/ranks: boolean true; expected an integer 1 to 4096"},
        {"rank count 1.5", describedAs("1.5"), "/ranks: a floating-point number 1.5"},
        {"rank count 1.0", describedAs("1.0"), "/ranks: a floating-point number 1.0"},
        {"rank count 1e999", describedAs("1e999"), "/ranks: number overflow"},
        {"rank count a string", describedAs("\"1\""), "/ranks: string \"1\"; expected an integer"},
        {"rank count null", describedAs("null"), "/ranks: null; expected an integer"},
        {"a plugin name that is a number", describedAs("1", "[7]"),
         "/plugins/0: the integer 7; expected a plugin name"},
        {"an empty plugin name", describedAs("1", R"([""])"), "/plugins/0: a plugin name of 0"},
        {"more plugins than ranks", describedAs("1", R"(["host","host"])"),
         "/plugins: 2 entries for 1 rank(s)"},
        {"fewer collectives than ranks", describedAs("2", R"(["host","host"])", "[true]"),
         "/collectives: 1 entries for 2 rank(s)"},
        {"plugins an object", describedAs("1", R"({"0":"host"})"),
         "/plugins: an object; expected an array"},
        {"collectives as numbers", describedAs("1", R"(["host"])", "[1]"),
         "/collectives/0: the integer 1; expected true or false"},
        {"force_staged a string", describedAs("1", R"(["host"])", "[true]", "\"no\""),
         "/force_staged: string \"no\"; expected true or false"},
        {"the rank count twice", R"({"ranks":1,"ranks":2})", "duplicate key 'ranks'"},
        {"no rank count", R"({"plugins":["host"],"collectives":[true],"force_staged":false})",
         "/: no \"ranks\""},
        {"no force_staged", R"({"ranks":1,"plugins":["host"],"collectives":[true]})",
         "/: no \"force_staged\""},
        {"an unknown key",
         R"({"ranks":1,"plugins":["host"],"collectives":[true],"force_staged":false,"x/y":1})",
         "/x~1y: an unknown key"},
        {"an array", "[1,2,3]", "/: an array; expected an object"},
        {"a number", "12", "/: the integer 12; expected an object"},
        {"not JSON", R"({"ranks":)", "not valid JSON"},
        {"nothing", "", "not valid JSON"},
        {"a NUL byte", std::string("{\"ranks\":1\0}", 12), "a NUL byte"},
        {"invalid UTF-8 in a name", describedAs("1", "[\"\xff\"]"), "not valid JSON"},
    };
    for (const Hostile &c : cases) {
        const std::string what = c.what;
        CAPTURE(what);
        const std::string message = refusal(c.text);
        CAPTURE(message.substr(0, 400));
        CHECK(message.rfind("Communicator::create: process 3's description of its ranks: ", 0) ==
              0);
        CHECK(message.find(c.expected) != std::string::npos);
        CHECK(message.size() < 1500);
    }
}

TEST_CASE("every truncation of a valid description is refused with an Error") {
    const std::string valid = describedAs("2", R"(["host","cuda"])", "[true,false]");
    for (size_t n = 0; n < valid.size(); ++n) {
        CAPTURE(n);
        (void)refusal(valid.substr(0, n));
    }
}

TEST_CASE("a refusal's message is whole UTF-8 and plugin names are plain identifiers") {
    // Review findings: the echoed value was cut inside a multi-byte character, and plugin names
    // with a newline or a NUL were accepted.
    std::string ranks = "\"";
    for (int i = 0; i < 40; ++i) ranks += "\xE2\x82\xAC"; // U+20AC, three bytes each
    ranks += "\"";
    const std::string message = refusal(describedAs(ranks));
    // Every lead byte in the message has all its continuation bytes.
    for (size_t i = 0; i < message.size();) {
        const auto c = static_cast<unsigned char>(message[i]);
        const size_t length = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
        REQUIRE_MESSAGE(i + length <= message.size(), "cut inside a character: " << message);
        for (size_t k = 1; k < length; ++k)
            REQUIRE((static_cast<unsigned char>(message[i + k]) & 0xC0) == 0x80);
        i += length;
    }
    for (const char *name : {R"("ho\nst")", R"("host\u0000")", R"("a b")", R"("x/y")"}) {
        CAPTURE(name);
        CHECK(refusal(describedAs("1", std::string("[") + name + "]"))
                  .find("a plugin name has only letters") != std::string::npos);
    }
}
