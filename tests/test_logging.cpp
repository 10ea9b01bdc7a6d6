// Salus's logger (salus/log.hpp): its own, never spdlog's default logger, which belongs to the
// embedding program; level names; a sink the program installs. Where messages go by default and
// SALUS_LOG_LEVEL are checked in a process of their own (tests/abi/test_c_api_logging.cpp).
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "log/log.hpp"
#include "salus/log.hpp"
#include "salus/memory.hpp"
#include "salus/sim.hpp"

namespace salus::testing {
namespace {

struct Message {
  LogLevel level;
  std::string text;
};

// Restores the level and standard error after each test.
class Logging : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = log_level(); }
  void TearDown() override {
    set_log_sink({});
    set_log_level(saved_);
  }
  void capture() {
    set_log_sink([this](LogLevel level, std::string_view text) {
      messages_.push_back({level, std::string(text)});
    });
  }

  LogLevel saved_ = LogLevel::warn;
  std::vector<Message> messages_;
};

// A memory manager left with a live block when it goes: the warning Salus gives at shutdown.
void leave_a_block_at_shutdown() {
  MemoryManager memory(make_sim_backend(SimConfig::uniform(1, 64 * MiB)));
  (void)memory.allocate({.bytes = 4096});
}

TEST(LogLevels, NamesAreReadInAnyCase) {
  EXPECT_EQ(parse_log_level("trace"), LogLevel::trace);
  EXPECT_EQ(parse_log_level("DEBUG"), LogLevel::debug);
  EXPECT_EQ(parse_log_level("Info"), LogLevel::info);
  EXPECT_EQ(parse_log_level("warn"), LogLevel::warn);
  EXPECT_EQ(parse_log_level("warning"), LogLevel::warn);
  EXPECT_EQ(parse_log_level("err"), LogLevel::error);
  EXPECT_EQ(parse_log_level("critical"), LogLevel::critical);
  EXPECT_EQ(parse_log_level("off"), LogLevel::off);
  for (const char* bad : {"", "verbose", "warn ", "criticality", "0", "3"}) {
    EXPECT_EQ(parse_log_level(bad), std::nullopt) << bad;
  }
  for (int i = 0; i <= static_cast<int>(LogLevel::off); ++i) {
    const auto level = static_cast<LogLevel>(i);
    EXPECT_EQ(parse_log_level(to_string(level)), level) << to_string(level);
  }
}

TEST_F(Logging, ASinkReceivesMessagesWithTheirLevel) {
  set_log_level(LogLevel::warn);
  capture();
  leave_a_block_at_shutdown();
  ASSERT_EQ(messages_.size(), 1u);
  EXPECT_EQ(messages_[0].level, LogLevel::warn);
  EXPECT_EQ(messages_[0].text, "device 0 stream 0x0: 1 blocks still live at shutdown");

  set_log_level(LogLevel::off);
  EXPECT_EQ(log_level(), LogLevel::off);
  leave_a_block_at_shutdown();
  EXPECT_EQ(messages_.size(), 1u) << "off drops everything";
  set_log_level(LogLevel::debug);
  leave_a_block_at_shutdown();
  EXPECT_GE(messages_.size(), 2u);
}

TEST_F(Logging, SpdlogsDefaultLoggerIsTheProgramsAlone) {
  // The program's own default logger, with a level that would show everything.
  std::ostringstream program_log;
  const auto before = spdlog::default_logger();
  spdlog::set_default_logger(std::make_shared<spdlog::logger>(
      "program", std::make_shared<spdlog::sinks::ostream_sink_mt>(program_log)));
  spdlog::set_level(spdlog::level::trace);  // the program's setting, not Salus's
  set_log_level(LogLevel::warn);
  capture();
  leave_a_block_at_shutdown();
  spdlog::set_default_logger(before);
  EXPECT_EQ(program_log.str(), "") << "Salus wrote to the program's logger";
  EXPECT_EQ(messages_.size(), 1u) << "spdlog::set_level did not change Salus's level";
  EXPECT_EQ(&log::logger(), &log::logger());
  EXPECT_EQ(log::logger().name(), "salus");
  EXPECT_EQ(spdlog::get("salus"), nullptr) << "not in spdlog's registry";
}

}  // namespace
}  // namespace salus::testing
