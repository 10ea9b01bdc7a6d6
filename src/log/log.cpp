// The "salus" logger: its sink (standard error or the embedding program's LogSink), its level
// (SALUS_LOG_LEVEL, set_log_level), and the public API of salus/log.hpp.
#include "log/log.hpp"

#include <spdlog/sinks/base_sink.h>

#include <array>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>

#include "salus/log.hpp"

namespace salus {
namespace log {
namespace {

static_assert(static_cast<int>(LogLevel::trace) == spdlog::level::trace &&
                  static_cast<int>(LogLevel::warn) == spdlog::level::warn &&
                  static_cast<int>(LogLevel::off) == spdlog::level::off,
              "LogLevel converts to spdlog's level by value");

constexpr LogLevel kDefaultLevel = LogLevel::warn;  // why: see salus/log.hpp

// Writes formatted lines to standard error, or hands each message to the installed LogSink.
// base_sink holds its mutex around sink_it_, so one message at a time reaches either.
class SalusSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  // Installs `sink` and returns the previous one (for the caller to destroy outside the lock).
  LogSink exchange(LogSink sink) {
    std::lock_guard lock(mutex_);
    user_.swap(sink);
    return sink;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    if (user_) {
      user_(static_cast<LogLevel>(msg.level),
            std::string_view(msg.payload.data(), msg.payload.size()));
      return;
    }
    spdlog::memory_buf_t line;
    formatter_->format(msg, line);
    std::fwrite(line.data(), 1, line.size(), stderr);
  }
  void flush_() override { std::fflush(stderr); }

 private:
  LogSink user_;  // guarded by mutex_
};

struct Logging {
  std::shared_ptr<SalusSink> sink = std::make_shared<SalusSink>();
  spdlog::logger logger{"salus", sink};  // not registered with spdlog: see log/log.hpp
};

Logging* make_logging() {
  auto* logging = new Logging;
  logging->logger.set_level(static_cast<spdlog::level::level_enum>(kDefaultLevel));
  const char* given = std::getenv("SALUS_LOG_LEVEL");
  if (given == nullptr || *given == '\0') return logging;
  if (const auto level = parse_log_level(given)) {
    logging->logger.set_level(static_cast<spdlog::level::level_enum>(*level));
  } else {
    logging->logger.warn(
        "SALUS_LOG_LEVEL is '{}', which is no level (trace, debug, info, warn, error, critical or "
        "off); logging at {}",
        given, to_string(kDefaultLevel));
  }
  return logging;
}

Logging& logging() {
  // Never destroyed: see logger().
  static Logging* const instance = make_logging();
  return *instance;
}

}  // namespace

spdlog::logger& logger() {
  return logging().logger;
}

}  // namespace log

const char* to_string(LogLevel level) noexcept {
  switch (level) {
    case LogLevel::trace:
      return "trace";
    case LogLevel::debug:
      return "debug";
    case LogLevel::info:
      return "info";
    case LogLevel::warn:
      return "warn";
    case LogLevel::error:
      return "error";
    case LogLevel::critical:
      return "critical";
    case LogLevel::off:
      return "off";
  }
  return "unknown";
}

std::optional<LogLevel> parse_log_level(std::string_view name) noexcept {
  std::array<char, 8> lower{};  // the longest name, "critical", fits
  if (name.size() > lower.size()) return std::nullopt;
  for (std::size_t i = 0; i < name.size(); ++i) {
    lower[i] = static_cast<char>(std::tolower(static_cast<unsigned char>(name[i])));
  }
  const std::string_view given(lower.data(), name.size());
  // spdlog's own spellings of two levels are accepted too.
  if (given == "warning") return LogLevel::warn;
  if (given == "err") return LogLevel::error;
  for (int i = 0; i <= static_cast<int>(LogLevel::off); ++i) {
    if (given == to_string(static_cast<LogLevel>(i))) return static_cast<LogLevel>(i);
  }
  return std::nullopt;
}

void set_log_level(LogLevel level) {
  log::logger().set_level(static_cast<spdlog::level::level_enum>(level));
}

LogLevel log_level() {
  return static_cast<LogLevel>(log::logger().level());
}

void set_log_sink(LogSink sink) {
  LogSink previous = log::logging().sink->exchange(std::move(sink));
  // `previous` goes here, outside the sink's lock.
}

}  // namespace salus
