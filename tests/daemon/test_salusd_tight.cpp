// Processes short of pages (issue 34, items 1 and 2), under every policy: a process that cannot
// fit fails alone, while the others wait for its pages instead of for a clock; and processes that
// fit together, on a device just above what they need together, all finish.
#include <string>
#include <vector>

#include "daemon/salusd_fixture.hpp"

namespace salusd_test {
namespace {

class ShortOfPages : public Salusd, public ::testing::WithParamInterface<const char*> {};

// "a" and "b" (8 MiB of weights, iterations of 4 MiB more) run; then "big" asks for 36 MiB of
// weights on the 40 MiB device. It takes what the others cache and waits for the rest; they, short
// at their next iterations, wait too. Big fails (its job cannot fit beside theirs) and lingers 3 s
// holding its pages, as a Python script unwinds. Before, each short request failed after 2 s of
// reclaims, whoever was short: a or b failed beside big. Now, when every short process is stuck,
// the one holding the most gives way, and the others wait while it may still give its pages back
// (until its exit).
TEST_P(ShortOfPages, AJobThatCannotFitFailsAloneAndTheOthersWaitForItsPages) {
  start_daemon({"--policy", GetParam(), "--memory", "40MiB"});
  const std::vector<std::string> small = {"--iterations",    "40", "--persistent-mib", "8",
                                          "--ephemeral-mib", "4",  "--iteration-ms",   "20"};
  const pid_t a = client("a", small);
  const pid_t b = client("b", small);
  ASSERT_TRUE(wait_log("a", "begin 1")) << read_file(log("a"));
  ASSERT_TRUE(wait_log("b", "begin 1")) << read_file(log("b"));
  const pid_t big = client(
      "big", {"--iterations", "2", "--persistent-mib", "36", "--linger-on-error-ms", "3000"});
  EXPECT_EQ(wait_for(big), 3) << read_file(log("big"));
  const std::string big_log = read_file(log("big"));
  EXPECT_NE(big_log.find("error out of memory"), std::string::npos) << big_log;
  EXPECT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
  EXPECT_EQ(wait_for(b), 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  EXPECT_EQ(wait_for_granted_pages(0), 0) << status();
}

// Three processes whose weights and largest iteration fit the device together with one page to
// spare (persistent 8 + 6 + 4 MiB, each iteration 8 MiB more at its peak: 26 MiB, on 28 MiB). The
// policies that run one process's iteration at a time must fit them all; those that run
// iterations side by side may do so only where they fit. Each finishes, every byte checked.
TEST_P(ShortOfPages, JustAboveTheFloorEveryoneFinishes) {
  start_daemon({"--policy", GetParam(), "--memory", "28MiB"});
  const std::vector<std::pair<std::string, std::string>> jobs = {
      {"a", "8"}, {"b", "6"}, {"c", "4"}};
  std::vector<pid_t> pids;
  for (const auto& [name, persistent] : jobs) {
    pids.push_back(client(name, {"--iterations", "8", "--persistent-mib", persistent,
                                 "--ephemeral-mib", "8", "--iteration-ms", "10"}));
  }
  for (std::size_t i = 0; i < jobs.size(); ++i) {
    const std::string& name = jobs[i].first;
    EXPECT_EQ(wait_for(pids[i]), 0)
        << name << "\n"
        << read_file(log(name)) << read_file(dir_ + "/" + name + ".err");
  }
  EXPECT_EQ(wait_for_granted_pages(0), 0) << status();
}

INSTANTIATE_TEST_SUITE_P(Policies, ShortOfPages,
                         ::testing::Values("fair", "pack", "memory_aware", "fifo"),
                         [](const auto& info) { return std::string(info.param); });

}  // namespace
}  // namespace salusd_test
