// The logger: per-subsystem thresholds, BACKPLANE_LOG, replaceable sink.
#include <backplane/error.hpp>
#include <backplane/log.hpp>

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>

namespace backplane::log {
namespace {

constexpr std::array<const char *, kSubsystemCount> kSubsystemNames = {
    "loader", "config", "memory", "streams", "compile", "tune", "cache", "plugin", "tool", "comm"};
constexpr std::array<const char *, 6> kLevelNames = {"trace", "debug", "info",
                                                     "warn",  "error", "off"};

struct State {
    std::array<std::atomic<int>, kSubsystemCount> levels{};
    std::mutex sinkMutex;
    Sink sink;

    State() {
        for (auto &l : levels) l.store(static_cast<int>(Level::Warn));
    }
};

Level parseLevel(std::string_view text) {
    for (size_t i = 0; i < kLevelNames.size(); ++i)
        if (text == kLevelNames[i]) return static_cast<Level>(i);
    throw Error(ErrorCode::Config, "BACKPLANE_LOG: unknown level '" + std::string(text) +
                                       "' (use trace, debug, info, warn, error or off)");
}

void applySpec(State &s, std::string_view spec) {
    while (!spec.empty()) {
        const size_t comma = spec.find(',');
        std::string_view item = spec.substr(0, comma);
        spec = comma == std::string_view::npos ? std::string_view{} : spec.substr(comma + 1);
        if (item.empty()) continue;
        const size_t eq = item.find('=');
        if (eq == std::string_view::npos) {
            const Level l = parseLevel(item);
            for (auto &level : s.levels) level.store(static_cast<int>(l));
            continue;
        }
        const std::string_view name = item.substr(0, eq);
        const Level l = parseLevel(item.substr(eq + 1));
        bool found = false;
        for (size_t i = 0; i < kSubsystemNames.size(); ++i) {
            if (name == kSubsystemNames[i]) {
                s.levels[i].store(static_cast<int>(l));
                found = true;
            }
        }
        if (!found)
            throw Error(ErrorCode::Config, "BACKPLANE_LOG: unknown subsystem '" +
                                               std::string(name) + "'");
    }
}

State &configuredState() {
    // Leaked on purpose: plugins may still log while static destructors run.
    static State &s = []() -> State & {
        State &st = *new State();
        if (const char *spec = std::getenv("BACKPLANE_LOG"); spec != nullptr) {
            try {
                applySpec(st, spec);
            } catch (const Error &e) {
                std::fprintf(stderr, "backplane [warn config] %s; logging stays at warn\n",
                             e.what());
            }
        }
        return st;
    }();
    return s;
}

} // namespace

const char *toString(Level level) noexcept { return kLevelNames[static_cast<size_t>(level)]; }
const char *toString(Subsystem subsystem) noexcept {
    return kSubsystemNames[static_cast<size_t>(subsystem)];
}

void setSink(Sink sink) {
    State &s = configuredState();
    const std::lock_guard lock(s.sinkMutex);
    s.sink = std::move(sink);
}

void setLevel(Subsystem subsystem, Level l) {
    configuredState().levels[static_cast<size_t>(subsystem)].store(static_cast<int>(l));
}

void setLevel(Level l) {
    for (auto &level : configuredState().levels) level.store(static_cast<int>(l));
}

Level level(Subsystem subsystem) noexcept {
    return static_cast<Level>(configuredState().levels[static_cast<size_t>(subsystem)].load());
}

void configure(std::string_view spec) { applySpec(configuredState(), spec); }

bool enabled(Subsystem subsystem, Level l) noexcept {
    return l != Level::Off &&
           static_cast<int>(l) >=
               configuredState().levels[static_cast<size_t>(subsystem)].load(
                   std::memory_order_relaxed);
}

void write(Subsystem subsystem, Level l, std::string_view message) {
    if (!enabled(subsystem, l)) return;
    State &s = configuredState();
    const std::lock_guard lock(s.sinkMutex);
    if (s.sink) {
        s.sink(l, subsystem, message);
        return;
    }
    std::fprintf(stderr, "backplane [%s %s] %.*s\n", toString(l), toString(subsystem),
                 static_cast<int>(message.size()), message.data());
}

} // namespace backplane::log
