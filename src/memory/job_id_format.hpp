// Formats a JobId with fmt as its number (internal: the public headers do not depend on fmt).
#pragma once

#include <fmt/format.h>

#include <cstdint>

#include "salus/job_id.hpp"

template <>
struct fmt::formatter<salus::JobId> : fmt::formatter<std::uint32_t> {
  template <typename FormatContext>
  auto format(const salus::JobId& job, FormatContext& ctx) const {
    return fmt::formatter<std::uint32_t>::format(job.value, ctx);
  }
};
