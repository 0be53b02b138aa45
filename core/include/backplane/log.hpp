// The runtime's one logger: subsystems, levels, and a sink a host application can replace.
#pragma once

#include <functional>
#include <string>
#include <string_view>

namespace backplane::log {

enum class Level { Trace = 0, Debug = 1, Info = 2, Warn = 3, Error = 4, Off = 5 };

/// Where a message comes from. `Plugin` carries messages plugins send through the ABI.
enum class Subsystem { Loader, Config, Memory, Streams, Compile, Tune, Cache, Plugin, Tool, Comm };
inline constexpr int kSubsystemCount = 10;

const char *toString(Level level) noexcept;
const char *toString(Subsystem subsystem) noexcept;

/// Receives every message at or above its subsystem's level. Called from any thread, possibly
/// concurrently; must not call back into the logger.
using Sink = std::function<void(Level, Subsystem, std::string_view message)>;

/// Replaces the sink (default: one line per message on stderr). Pass nullptr to restore it.
void setSink(Sink sink);
/// Sets the threshold of one subsystem, or of all.
void setLevel(Subsystem subsystem, Level level);
void setLevel(Level level);
Level level(Subsystem subsystem) noexcept;

/// Parses a level spec: "debug" or "warn,loader=trace,memory=debug". The environment variable
/// BACKPLANE_LOG is applied this way on first use. Throws backplane::Error(Config) if malformed.
void configure(std::string_view spec);

/// True when a message of this level would be delivered; check before building costly text.
bool enabled(Subsystem subsystem, Level level) noexcept;
/// Delivers a message (thread-safe).
void write(Subsystem subsystem, Level level, std::string_view message);

} // namespace backplane::log
