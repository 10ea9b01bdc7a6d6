// Where Salus's own messages go. Salus logs to standard error, never standard output (a program
// that prints its results there keeps them clean), through a logger of its own: spdlog's default
// logger and registry belong to the embedding program and are never touched.
//
// The level starts from the environment variable SALUS_LOG_LEVEL (trace, debug, info, warn,
// error, critical or off; case does not matter), else warn: a library embedded in someone else's
// program speaks only when something needs its user's attention (memory still live at shutdown,
// a driver call that failed), not to say which backend it picked. An unknown value is reported
// once, on standard error, and the default applies. set_log_level overrides the variable.
#pragma once

#include <functional>
#include <optional>
#include <string_view>

#include "salus/export.hpp"

namespace salus {

// The values are those of salus_log_level in c_api.h.
enum class LogLevel : int {
  trace = 0,
  debug = 1,
  info = 2,
  warn = 3,
  error = 4,
  critical = 5,
  off = 6
};

// "trace", "debug", ... "off".
[[nodiscard]] SALUS_API const char* to_string(LogLevel level) noexcept;
// The level a name such as SALUS_LOG_LEVEL's value names (any case; "warning" and "err" too), or
// nullopt for anything else.
[[nodiscard]] SALUS_API std::optional<LogLevel> parse_log_level(std::string_view name) noexcept;

// Messages below `level` are dropped (LogLevel::off drops all). From any thread.
SALUS_API void set_log_level(LogLevel level);
[[nodiscard]] SALUS_API LogLevel log_level();

// Receives each message that passes the level instead of standard error: its level and its text
// (no time stamp, no "salus" prefix). It is called on the thread that logs, which may hold Salus's
// internal locks or be a stream's worker thread: it must return quickly, must not throw and must
// not call into Salus. One message at a time reaches it.
using LogSink = std::function<void(LogLevel level, std::string_view message)>;

// Installs `sink`; an empty one sends messages to standard error again. Returns once no message
// is being delivered to the previous sink, so whatever that sink referred to may then go.
SALUS_API void set_log_sink(LogSink sink);

}  // namespace salus
