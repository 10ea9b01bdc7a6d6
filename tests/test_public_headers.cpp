// salus/salus.hpp alone brings the whole public C++ API: this file includes nothing else of Salus
// and uses one symbol from each public header.
#include <gtest/gtest.h>

#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <type_traits>

#include "salus/salus.hpp"

#ifndef SALUS_API
#error "salus/salus.hpp does not bring salus/export.hpp"
#endif

namespace {

TEST(PublicHeaders, SalusHppBringsTheWholeCppApi) {
  // salus/cuda.hpp and salus/sim.hpp
  static_assert(std::is_same_v<decltype(&salus::cuda_available), bool (*)() noexcept>);
  static_assert(std::is_same_v<decltype(salus::make_sim_backend(salus::SimConfig{})),
                               std::shared_ptr<salus::DeviceBackend>>);
  // salus/device.hpp
  EXPECT_STREQ(salus::to_string(salus::LinkKind::nvlink), "nvlink");
  // salus/error.hpp
  EXPECT_EQ(salus::UnknownJob(salus::JobId{7}).job(), salus::JobId{7});
  // salus/job_id.hpp
  EXPECT_EQ(std::hash<salus::JobId>{}(salus::kUnattributedJob),
            std::hash<salus::JobId>{}(salus::JobId{0}));
  // salus/log.hpp
  EXPECT_EQ(salus::parse_log_level(salus::to_string(salus::LogLevel::warn)), salus::LogLevel::warn);
  // salus/memory.hpp
  EXPECT_STREQ(salus::to_string(salus::Lifetime::ephemeral), "ephemeral");
  // salus/runtime.hpp
  EXPECT_STREQ(salus::to_string(salus::JobState::running), "running");
  // salus/scheduler.hpp
  const auto names = salus::PolicyRegistry::with_builtins().names();
  EXPECT_NE(std::find(names.begin(), names.end(), std::string("memory_aware")), names.end());
  // salus/simulation.hpp
  EXPECT_EQ(salus::sched::placement_names().front(), "least_loaded");
}

}  // namespace
