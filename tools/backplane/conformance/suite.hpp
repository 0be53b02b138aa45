// The conformance suite's vocabulary: cases, their context, and the checks cases use.
#pragma once

// A case is a function over one plugin device that either returns (passed), throws CaseFailure
// (failed, with the reason) or throws NotApplicable (the device lacks what the case needs, e.g. a
// second device for peer copies). Cases call the plugin's C table directly through the RAII
// handles of handles.hpp; a crash or hang in a case is caught by the runner (runner.hpp), which
// runs cases in a child process.

#include <backplane/abi/caller.hpp>
#include <backplane/abi/plugin.h>
#include <backplane/raw_plugin.hpp>

#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace backplane::conformance {

/// Thrown by a check that failed: the case failed, `what()` says why.
class CaseFailure : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

/// Thrown when the case cannot apply to this device (`what()` says what is missing).
class NotApplicable : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

class OpenDevice;

/// What a case runs against: the plugin, one device of it, and that device's description.
class CaseContext {
public:
    CaseContext(RawPlugin plugin, std::string optionsJson, uint32_t index, uint32_t deviceCount,
                bp_device_info info);
    ~CaseContext();

    const bp_plugin_api &api() const noexcept { return plugin_.api(); }
    bp_plugin *plugin() const noexcept { return plugin_.instance(); }
    const RawPlugin &raw() const noexcept { return plugin_; }
    /// The options plugin_init received (the runtime cases pass the same).
    const std::string &optionsJson() const noexcept { return optionsJson_; }
    /// The device under test: its index, the probe's device count, and its description.
    uint32_t index() const noexcept { return index_; }
    uint32_t deviceCount() const noexcept { return deviceCount_; }
    const bp_device_info &info() const noexcept { return info_; }
    /// The plugin's name for messages.
    const std::string &name() const noexcept { return plugin_.manifest().name; }

    bool declares(uint32_t capability) const noexcept { return (info_.capabilities & capability) != 0; }
    bool accepts(bp_dialect dialect) const noexcept { return (info_.dialects & (1u << dialect)) != 0; }

    /// The device under test, opened on first use and closed when the case ends.
    OpenDevice &device();
    /// Closes the device now (a case that checks close itself).
    void closeDevice();

private:
    RawPlugin plugin_;
    std::string optionsJson_;
    uint32_t index_;
    uint32_t deviceCount_;
    bp_device_info info_;
    std::unique_ptr<OpenDevice> device_;
};

/// One case of the suite.
struct Case {
    const char *name;    ///< stable id, "group.what" (used in expected_failures)
    const char *summary; ///< one sentence: what the plugin must do
    void (*run)(CaseContext &);
};

/// Every case, in registration order (grouped by file).
std::vector<Case> &registry();

/// Registers a case at static initialisation (CONFORMANCE_CASE below).
struct Registrar {
    Registrar(const char *name, const char *summary, void (*run)(CaseContext &)) {
        registry().push_back({name, summary, run});
    }
};

#define BP_CONFORMANCE_CONCAT2(a, b) a##b
#define BP_CONFORMANCE_CONCAT(a, b) BP_CONFORMANCE_CONCAT2(a, b)
/// Defines a case: CONFORMANCE_CASE("memory.zero_size", "sentence") { body using `ctx` }.
#define CONFORMANCE_CASE(NAME, SUMMARY)                                                            \
    static void BP_CONFORMANCE_CONCAT(conformanceCase, __LINE__)(::backplane::conformance::CaseContext &); \
    static const ::backplane::conformance::Registrar BP_CONFORMANCE_CONCAT(conformanceRegistrar, __LINE__)( \
        NAME, SUMMARY, &BP_CONFORMANCE_CONCAT(conformanceCase, __LINE__));                         \
    static void BP_CONFORMANCE_CONCAT(conformanceCase, __LINE__)(                                 \
        [[maybe_unused]] ::backplane::conformance::CaseContext &ctx)

// Checks ------------------------------------------------------------------------------------------

/// Fails the case with `message` unless `condition`.
inline void require(bool condition, const std::string &message) {
    if (!condition) throw CaseFailure(message);
}

/// Fails the case when a call that must succeed did not: "<what> returned <status>: <message>".
void succeed(bp_status status, const bp_error &error, const std::string &what);

/// Checks a call that must fail cleanly: its status is one of `allowed`, the bp_error carries the
/// same code, and its message is non-empty (the ABI: a failing call says why).
void expectFailure(bp_status status, const bp_error &error, std::initializer_list<bp_status> allowed,
                   const std::string &what);

/// An enum argument holding `value`, which may lie outside the enumeration: what a C caller can
/// pass (plugin.h: plugins read enums as integers and reject unknown values).
/// (Not instrumented: returning the value loads it as the enum type, which UBSan's enum check
/// rightly flags; the suite passes such values on purpose.)
template <class Enum> __attribute__((no_sanitize("undefined"))) Enum rawEnum(int value) noexcept {
    static_assert(sizeof(Enum) == sizeof(int));
    Enum e;
    std::memcpy(&e, &value, sizeof(e));
    return e;
}

/// "invalid_argument or unsupported" for messages.
std::string statusList(std::initializer_list<bp_status> statuses);

} // namespace backplane::conformance
