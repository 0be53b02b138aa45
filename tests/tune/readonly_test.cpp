// The store on a read-only cache directory (its own executable: it exits 77 when the directory
// cannot be made read-only, e.g. as root, where chmod does not restrict writes).
#include "tune_fixtures.hpp"

#include <doctest/doctest.h>

#include <cstdio>
#include <fstream>

using namespace backplane;
using namespace tunetest;

TEST_CASE("a read-only cache directory degrades to memory with one warning") {
    TempDir dir;
    {
        CacheStore writer(dir.path());
        REQUIRE(writer.store(CacheKind::Kernels, "old", "kept"));
    }
    std::filesystem::permissions(dir.path() / "kernels", std::filesystem::perms::owner_read |
                                                             std::filesystem::perms::owner_exec);
    {
        std::ofstream probe(dir.path() / "kernels" / "probe");
        if (probe) {
            std::printf("SKIP: chmod did not make the directory read-only (running as root or "
                        "with CAP_DAC_OVERRIDE); the store's degrade path is still covered by "
                        "'a cache directory that cannot be created degrades to memory'\n");
            std::exit(77);
        }
    }
    CacheStore store(dir.path());
    LogCapture logs(log::Subsystem::Cache);
    CHECK(store.load(CacheKind::Kernels, "old").has_value()); // reads still work
    CHECK(!store.store(CacheKind::Kernels, "new", "one"));
    CHECK(!store.store(CacheKind::Kernels, "newer", "two"));
    CHECK(store.load(CacheKind::Kernels, "new").has_value());
    CHECK(!store.persistent());
    REQUIRE(logs.messages().size() == 1);
    CHECK(logs.messages()[0].find("not writable") != std::string::npos);
}
