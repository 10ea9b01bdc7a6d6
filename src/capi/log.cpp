// Logging through the C ABI: the level and the program's callback (see salus/log.hpp).
#include "salus/log.hpp"

#include <fmt/format.h>

#include <string>

#include "capi/capi.hpp"

using salus::capi::guarded;
using salus::capi::require;

extern "C" {

salus_status salus_set_log_level(salus_log_level level) {
  // Read as an int before anything copies it as the enum (see enum_value).
  const int value = salus::capi::enum_value(level);
  return guarded([&] {
    if (value < SALUS_LOG_TRACE || value > SALUS_LOG_OFF) {
      throw salus::InvalidArgument(fmt::format(
          "salus_set_log_level: level {} is not a salus_log_level (SALUS_LOG_TRACE {} to "
          "SALUS_LOG_OFF {})",
          value, static_cast<int>(SALUS_LOG_TRACE), static_cast<int>(SALUS_LOG_OFF)));
    }
    salus::set_log_level(static_cast<salus::LogLevel>(value));
  });
}

salus_status salus_get_log_level(salus_log_level* out) {
  return guarded([&] {
    require(out, "salus_get_log_level: out");
    *out = static_cast<salus_log_level>(salus::log_level());
  });
}

salus_status salus_set_log_callback(salus_log_callback callback, void* user_data) {
  return guarded([&] {
    if (callback == nullptr) {
      salus::set_log_sink({});
      return;
    }
    salus::set_log_sink([callback, user_data](salus::LogLevel level, std::string_view message) {
      const std::string text(message);  // C wants it NUL-terminated
      callback(static_cast<salus_log_level>(level), text.c_str(), user_data);
    });
  });
}

}  // extern "C"
