// Statistics are declared once (salus/stats_fields.h) and the C++ and C structs are made from the
// lists. These checks catch a field added to a struct by hand instead of to its list: the struct
// would no longer have the layout the list alone gives it. (The Python side is checked by
// python_bindings/tests/test_stats_fields.py.)
#include <gtest/gtest.h>

#include <cstddef>
#include <set>
#include <string>
#include <type_traits>
#include <vector>

#include "salus/c_api.h"
#include "salus/memory.hpp"
#include "salus/runtime.hpp"
#include "salus/stats_fields.h"

namespace salus::testing {
namespace {

// What the lists alone make: the same members, in the same order, and nothing else.
struct ListedClassBytes {
#define SALUS_STATS_MEMBER(type, name, what) type name;
  SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_MEMBER)
};
struct ListedDeviceStats {
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_MEMBER)
  ListedClassBytes by_class[kLifetimeCount];
};
struct ListedCDeviceStats {
  size_t struct_size;
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_MEMBER)
  ListedClassBytes persistent, ephemeral;
};
struct ListedJobMemoryStats {  // the members written by hand first, as in JobMemoryStats
  JobId job;
  std::string name;
  bool alive;
  ListedClassBytes by_class[kLifetimeCount];
  std::vector<std::size_t> in_use_by_device;
  std::size_t in_use_by_tier[kTierCount];
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_MEMBER)
};
struct ListedCJobMemoryStats {
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_MEMBER)
};
struct ListedJobStats {  // the members written by hand around the lists, as in JobStats
  JobId id;
  std::string name;
  JobKind kind;
  int device;
  int lane;
  JobState state;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_MEMBER)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_MEMBER)
  MemoryCurve memory_curve;
  JobMemoryStats memory;
};
struct ListedCJobTurnStats {
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_MEMBER)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
};

// salus_job_stats as C ABI 1.1 (and 1.0) had it: 1.2 only appends, so these stay where they are.
struct CJobStats11 {
  size_t struct_size;
  uint32_t job;
  int device;
  int lane;
  salus_job_state state;
  uint64_t iterations;
  double attained_seconds, waiting_seconds, max_wait_seconds, iteration_seconds;
  size_t persistent_in_use, ephemeral_in_use;
  size_t persistent_peak, ephemeral_peak;
  size_t persistent_blocks, ephemeral_blocks;
  size_t in_use, peak;
  uint64_t promoted_bytes;
  size_t profile_persistent_bytes, profile_ephemeral_peak_bytes;
  int quiescent;
  size_t on_peer_bytes, on_host_bytes;
};

// The listed names.
#define SALUS_STATS_NAME(type, name, what) #name,
const std::vector<std::string> kDeviceFields = {SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_NAME)};
const std::vector<std::string> kClassFields = {SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_NAME)};
const std::vector<std::string> kJobMemoryFields = {SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_NAME)};
#undef SALUS_STATS_NAME

TEST(StatsFields, TheCppStructsHoldTheListedFieldsAndNothingElse) {
  static_assert(sizeof(ClassBytes) == sizeof(ListedClassBytes));
  static_assert(sizeof(DeviceMemoryStats) == sizeof(ListedDeviceStats));
  // Each listed field sits where the list puts it: a field slipped in by hand moves the others.
#define SALUS_STATS_OFFSET(type, name, what)                                          \
  EXPECT_EQ(offsetof(DeviceMemoryStats, name), offsetof(ListedDeviceStats, name)) << #name; \
  static_assert(std::is_same_v<decltype(DeviceMemoryStats::name), type>, #name);
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_OFFSET)
#undef SALUS_STATS_OFFSET
  EXPECT_EQ(offsetof(DeviceMemoryStats, by_class), offsetof(ListedDeviceStats, by_class));
}

TEST(StatsFields, TheCStructHoldsTheListedFieldsAndNothingElse) {
  static_assert(sizeof(salus_class_bytes) == sizeof(ListedClassBytes));
  static_assert(sizeof(salus_device_stats) == sizeof(ListedCDeviceStats));
#define SALUS_STATS_OFFSET(type, name, what)                                               \
  EXPECT_EQ(offsetof(salus_device_stats, name), offsetof(ListedCDeviceStats, name)) << #name; \
  static_assert(std::is_same_v<decltype(salus_device_stats::name), type>, #name);
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_OFFSET)
#undef SALUS_STATS_OFFSET
  EXPECT_EQ(offsetof(salus_device_stats, ephemeral), offsetof(ListedCDeviceStats, ephemeral));
}

TEST(StatsFields, TheJobStructsHoldTheListedFieldsAndNothingElse) {
  static_assert(sizeof(JobMemoryStats) == sizeof(ListedJobMemoryStats));
  static_assert(sizeof(salus_job_memory_stats) == sizeof(ListedCJobMemoryStats));
#define SALUS_STATS_OFFSET(type, name, what)                                                \
  EXPECT_EQ(offsetof(JobMemoryStats, name), offsetof(ListedJobMemoryStats, name)) << #name; \
  EXPECT_EQ(offsetof(salus_job_memory_stats, name), offsetof(ListedCJobMemoryStats, name))  \
      << #name;                                                                             \
  static_assert(std::is_same_v<decltype(JobMemoryStats::name), type>, #name);               \
  static_assert(std::is_same_v<decltype(salus_job_memory_stats::name), type>, #name);
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_OFFSET)
#undef SALUS_STATS_OFFSET
  EXPECT_EQ(offsetof(JobMemoryStats, in_use_by_tier),
            offsetof(ListedJobMemoryStats, in_use_by_tier));
}

TEST(StatsFields, JobStatsHoldTheListedTurnAndProfileFieldsAndNothingElse) {
  static_assert(sizeof(JobStats) == sizeof(ListedJobStats));
  static_assert(sizeof(salus_job_turn_stats) == sizeof(ListedCJobTurnStats));
#define SALUS_STATS_OFFSET(type, name, what)                                                 \
  EXPECT_EQ(offsetof(JobStats, name), offsetof(ListedJobStats, name)) << #name;             \
  EXPECT_EQ(offsetof(salus_job_turn_stats, name), offsetof(ListedCJobTurnStats, name))      \
      << #name;                                                                              \
  static_assert(std::is_same_v<decltype(JobStats::name), type>, #name);                     \
  static_assert(std::is_same_v<decltype(salus_job_turn_stats::name), type>, #name);
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_OFFSET)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_OFFSET)
#undef SALUS_STATS_OFFSET
  EXPECT_EQ(offsetof(JobStats, memory_curve), offsetof(ListedJobStats, memory_curve));
}

TEST(StatsFields, TheCJobStatsOnlyGrewAtTheEnd) {
  // 1.1's fields keep their offsets and types; its size is where 1.2's block begins.
#define SALUS_OLD_FIELD(name)                                                       \
  EXPECT_EQ(offsetof(salus_job_stats, name), offsetof(CJobStats11, name)) << #name; \
  static_assert(std::is_same_v<decltype(salus_job_stats::name), decltype(CJobStats11::name)>);
  // clang-format off
  SALUS_OLD_FIELD(struct_size) SALUS_OLD_FIELD(job) SALUS_OLD_FIELD(device) SALUS_OLD_FIELD(lane)
  SALUS_OLD_FIELD(state) SALUS_OLD_FIELD(iterations) SALUS_OLD_FIELD(attained_seconds)
  SALUS_OLD_FIELD(waiting_seconds) SALUS_OLD_FIELD(max_wait_seconds)
  SALUS_OLD_FIELD(iteration_seconds) SALUS_OLD_FIELD(persistent_in_use)
  SALUS_OLD_FIELD(ephemeral_in_use) SALUS_OLD_FIELD(persistent_peak)
  SALUS_OLD_FIELD(ephemeral_peak) SALUS_OLD_FIELD(persistent_blocks)
  SALUS_OLD_FIELD(ephemeral_blocks) SALUS_OLD_FIELD(in_use) SALUS_OLD_FIELD(peak)
  SALUS_OLD_FIELD(promoted_bytes) SALUS_OLD_FIELD(profile_persistent_bytes)
  SALUS_OLD_FIELD(profile_ephemeral_peak_bytes) SALUS_OLD_FIELD(quiescent)
  SALUS_OLD_FIELD(on_peer_bytes) SALUS_OLD_FIELD(on_host_bytes)
#undef SALUS_OLD_FIELD
  EXPECT_EQ(offsetof(salus_job_stats, memory), sizeof(CJobStats11));
  // clang-format on
  // After `memory`, only what the header names: the class bytes, the tiers and (1.5) the turns.
  struct Appended {
    ListedCJobMemoryStats memory;
    ListedClassBytes persistent, ephemeral;
    size_t in_use_by_tier[SALUS_TIER_COUNT];
    ListedCJobTurnStats turns;
  };
  EXPECT_EQ(sizeof(salus_job_stats), sizeof(CJobStats11) + sizeof(Appended));
  EXPECT_EQ(offsetof(salus_job_stats, ephemeral) - offsetof(salus_job_stats, memory),
            offsetof(Appended, ephemeral));
  EXPECT_EQ(offsetof(salus_job_stats, turns) - offsetof(salus_job_stats, memory),
            offsetof(Appended, turns));
  static_assert(SALUS_TIER_COUNT == kTierCount && static_cast<int>(Tier::local) == 0 &&
                static_cast<int>(Tier::peer) == 1 && static_cast<int>(Tier::host) == 2);
}

TEST(StatsFields, NamesAreUniqueAndTheClassesDoNotClashWithThem) {
  const std::set<std::string> device(kDeviceFields.begin(), kDeviceFields.end());
  EXPECT_EQ(device.size(), kDeviceFields.size()) << "a device statistic is listed twice";
  EXPECT_EQ(std::set<std::string>(kClassFields.begin(), kClassFields.end()).size(),
            kClassFields.size());
  // C and Python name the classes' fields persistent and ephemeral next to the listed ones.
  EXPECT_EQ(device.count("persistent") + device.count("ephemeral"), 0u);
  const std::set<std::string> job(kJobMemoryFields.begin(), kJobMemoryFields.end());
  EXPECT_EQ(job.size(), kJobMemoryFields.size()) << "a job statistic is listed twice";
  // ... and the members written by hand, next to the job's listed ones.
  for (const char* by_hand : {"persistent", "ephemeral", "by_class", "in_use_by_device",
                              "in_use_by_tier", "job", "name", "alive"}) {
    EXPECT_EQ(job.count(by_hand), 0u) << by_hand;
  }
}

}  // namespace
}  // namespace salus::testing
