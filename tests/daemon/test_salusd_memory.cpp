// What salusd keeps of the GPU between its clients (issue 33, item 5): pages nobody takes for
// --idle-release seconds go back to the driver, and `salusd --status` says what is left to other
// programs.
#include <string>

#include "daemon/salusd_fixture.hpp"

namespace salusd_test {

// The "gpu" table: 0 index, 1 free at start MiB, 2 reserve MiB, 3 made MiB, 4 released idle,
// 5 left to others MiB.
TEST_F(Salusd, PagesNobodyTakesGoBackToTheDriverAndTheStatusSaysWhatIsLeft) {
  start_daemon({"--memory", "64MiB", "--idle-release", "0.2"});
  const std::string idle = status();
  EXPECT_EQ(device_column(idle, 1, "gpu"), 64) << idle;
  EXPECT_EQ(device_column(idle, 5, "gpu"), 64) << idle;
  const pid_t a = client("a", {"--iterations", "3", "--iteration-ms", "5", "--persistent-mib", "16",
                               "--ephemeral-mib", "8"});
  ASSERT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
  // The client's pages came back at its exit; made, they are no longer left to others until the
  // daemon lets them go (within a tick of the server loop, 1 s, after 0.2 s idle).
  const auto deadline = std::chrono::steady_clock::now() + 15s;
  std::string table = status();
  while (device_column(table, 3, "gpu") != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(100ms);
    table = status();
  }
  EXPECT_EQ(device_column(table, 3, "gpu"), 0) << "pages are still made:\n" << table;
  EXPECT_GE(device_column(table, 4, "gpu"), 12) << "24 MiB of 2 MiB pages went back:\n" << table;
  EXPECT_EQ(device_column(table, 5, "gpu"), 64) << table;
  EXPECT_EQ(granted_pages(table), 0) << table;
}

// Kept: with --idle-release 0 the pages stay made for the next client (the old behaviour, and a
// baseline for the benchmarks).
TEST_F(Salusd, WithIdleReleaseZeroPagesStayMade) {
  start_daemon({"--memory", "64MiB", "--idle-release", "0"});
  const pid_t a = client("a", {"--iterations", "2", "--iteration-ms", "5", "--persistent-mib", "16",
                               "--ephemeral-mib", "8"});
  ASSERT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
  std::this_thread::sleep_for(1500ms);  // past a tick of the server loop
  const std::string table = status();
  EXPECT_GE(device_column(table, 3, "gpu"), 24) << table;
  EXPECT_EQ(device_column(table, 4, "gpu"), 0) << table;
}

}  // namespace salusd_test
