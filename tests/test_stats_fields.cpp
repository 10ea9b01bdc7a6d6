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
#undef SALUS_STATS_MEMBER
};

// The listed names.
#define SALUS_STATS_NAME(type, name, what) #name,
const std::vector<std::string> kDeviceFields = {SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_NAME)};
const std::vector<std::string> kClassFields = {SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_NAME)};
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

TEST(StatsFields, NamesAreUniqueAndTheClassesDoNotClashWithThem) {
  const std::set<std::string> device(kDeviceFields.begin(), kDeviceFields.end());
  EXPECT_EQ(device.size(), kDeviceFields.size()) << "a device statistic is listed twice";
  EXPECT_EQ(std::set<std::string>(kClassFields.begin(), kClassFields.end()).size(),
            kClassFields.size());
  // C and Python name the classes' fields persistent and ephemeral next to the listed ones.
  EXPECT_EQ(device.count("persistent") + device.count("ephemeral"), 0u);
}

}  // namespace
}  // namespace salus::testing
