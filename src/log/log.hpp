// The library's one logging home: every message Salus writes goes through salus::log, to the
// "salus" logger (standard error, or the sink the embedding program installed; see
// salus/log.hpp). Never spdlog's default logger or its registry: those belong to the embedding
// program, which may reconfigure or drop them at any time.
#pragma once

#include <spdlog/logger.h>

#include <utility>

namespace salus::log {

// The "salus" logger. Made on first use (reading SALUS_LOG_LEVEL then) and never destroyed, so
// that destructors of static objects (a default runtime torn down at exit) may still log.
spdlog::logger& logger();

// One function per level that Salus's messages use; a message below the logger's level costs
// one comparison (nothing is formatted).
template <class... Args>
void debug(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().debug(format, std::forward<Args>(args)...);
}
template <class... Args>
void info(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().info(format, std::forward<Args>(args)...);
}
template <class... Args>
void warn(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().warn(format, std::forward<Args>(args)...);
}
template <class... Args>
void error(spdlog::format_string_t<Args...> format, Args&&... args) {
  logger().error(format, std::forward<Args>(args)...);
}

}  // namespace salus::log
