// salusd with real processes, taking turns and sharing memory: processes alternate under fair and
// priority, pages go to the next process, pack places processes side by side by what they report,
// and processes larger than the device spill to the host.
#include <signal.h>
#include <unistd.h>

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "daemon/salusd_fixture.hpp"

namespace salusd_test {

// Both processes ran to the end, six iterations each, one at a time and in alternation.
void Salusd::expect_took_turns(pid_t a, pid_t b, const std::string& na, const std::string& nb) {
  EXPECT_EQ(wait_for(a), 0) << read_file(log(na)) << read_file(dir_ + "/" + na + ".err");
  EXPECT_EQ(wait_for(b), 0) << read_file(log(nb)) << read_file(dir_ + "/" + nb + ".err");
  ASSERT_EQ(iterations(log(na)).size(), 6u);
  ASSERT_EQ(iterations(log(nb)).size(), 6u);
  expect_exclusive({na, nb});
  expect_alternating(na, nb);
}

namespace {

TEST_F(Salusd, TwoProcessesTakeTurnsUnderFair) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  const pid_t a = client("a", {"--iterations", "6"});
  const pid_t b = client("b", {"--iterations", "6"});
  expect_took_turns(a, b, "a", "b");
}

// A connected job posts its iterations' ends on its turn connection and leaves on its session's
// link: the daemon counts every iteration, the last one too, whichever connection it reads first.
// (Before the leave waited for the posted end, the daemon's trace lost the last iteration of about
// one process in three.)
TEST_F(Salusd, TheLastIterationOfAJobThatLeavesCounts) {
  const std::string trace = dir_ + "/trace.json";
  start_daemon({"--policy", "fair", "--memory", "64MiB", "--trace", trace});
  constexpr int kProcesses = 6, kIterations = 20;
  std::vector<pid_t> pids;
  for (int i = 0; i < kProcesses; ++i) {
    pids.push_back(client("e" + std::to_string(i),
                          {"--empty", "1", "--iterations", std::to_string(kIterations)}));
  }
  for (int i = 0; i < kProcesses; ++i) {
    EXPECT_EQ(wait_for(pids[i]), 0) << read_file(log("e" + std::to_string(i)));
  }
  stop_daemon();
  const auto json = nlohmann::json::parse(read_file(trace));
  std::map<std::string, int> counted;
  for (const auto& e : json.contains("traceEvents") ? json["traceEvents"] : json) {
    if (e.value("cat", "") == "iteration") ++counted[e.value("name", "")];
  }
  for (int i = 0; i < kProcesses; ++i) {
    EXPECT_EQ(counted["e" + std::to_string(i)], kIterations) << "process e" << i;
  }
}

TEST_F(Salusd, CProgramsTakeTurnsThroughTheCAbi) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  const pid_t a = spawn({SALUS_C_CLIENT_PATH, socket_, "ca", "6", log("ca")}, dir_ + "/ca.err");
  const pid_t b = spawn({SALUS_C_CLIENT_PATH, socket_, "cb", "6", log("cb")}, dir_ + "/cb.err");
  expect_took_turns(a, b, "ca", "cb");
}

TEST_F(Salusd, FourProcessesUnderPriority) {
  start_daemon({"--policy", "priority", "--memory", "96MiB"});
  std::vector<pid_t> pids;
  for (int i = 0; i < 4; ++i) {
    pids.push_back(client("p" + std::to_string(i),
                          {"--iterations", "4", "--priority", i == 3 ? "10" : "0"}));
  }
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(wait_for(pids[i]), 0) << read_file(log("p" + std::to_string(i)));
  }
  expect_exclusive({"p0", "p1", "p2", "p3"});
  // The urgent one goes first whenever it waits: between its first and last iteration the
  // others get at most the turn that was already running each time it asked again.
  const auto urgent = iterations(log("p3"));
  ASSERT_EQ(urgent.size(), 4u);
  int others = 0;
  for (const char* name : {"p0", "p1", "p2"}) {
    for (const auto& [begin, end] : iterations(log(name))) {
      others += begin > urgent.front().first && begin < urgent.back().first;
    }
  }
  EXPECT_LE(others, 4) << "p3 (priority 10) waited behind " << others << " iterations";
}

// Memory exactly the persistent memory of both plus one ephemeral peak: the two processes'
// iterations fit only because the one that waits gives its activation pages to the one whose turn
// it is, and the daemon's peak (its statistics) is no more than that sum.
TEST_F(Salusd, ActivationPagesGoToTheNextProcess) {
  // Each process peaks at 4 MiB persistent + 8 MiB ephemeral = 12 MiB; both at once would need
  // 24. The device has 16 MiB (8 pages of 2 MiB): 2 x 4 persistent + one 8 MiB ephemeral peak.
  const std::string trace = dir_ + "/trace.json";
  start_daemon({"--policy", "fair", "--memory", "16MiB", "--trace", trace});
  const std::vector<std::string> args = {"--iterations", "8", "--iteration-ms", "40",
                                         "--persistent-mib", "4", "--ephemeral-mib", "8"};
  // Both were there throughout: the pages went back and forth, not to one after the other ended.
  const auto [a, b] = expect_pair_alternates(args);
  const std::string table = status();
  const double peak_mib = device_column(table, 3);
  EXPECT_GT(peak_mib, 12.0) << table;  // more than one process alone ever needs
  EXPECT_LE(peak_mib, 2 * 4 + 8) << "peak above persistent + one ephemeral peak:\n" << table;
  // One trace has both processes' iterations and the pages going between them.
  stop_daemon();
  const std::string json = read_file(trace);
  for (const auto& [name, pid] : {std::pair{"a", a}, std::pair{"b", b}}) {
    EXPECT_NE(json.find(std::string("\"name\":\"") + name + "\""), std::string::npos)
        << "no iteration of " << name << " in the trace";
    const std::string process = "salus_client " + std::to_string(pid);
    EXPECT_NE(json.find("grant -> " + process), std::string::npos) << "no grant to " << name;
    EXPECT_NE(json.find("give back <- " + process), std::string::npos) << "nothing back from "
                                                                        << name;
  }
  EXPECT_NE(json.find("salusd pages gpu0"), std::string::npos);
}

// pack plans with what each process measured of its job and reported at its iterations' ends:
// two processes of 4 MiB persistent and 8 MiB ephemeral each run their iterations side by side
// on a device that holds both peaks (24 MiB of 40), and take turns, with nobody out of memory,
// on one that holds both persistents and one peak only (16 MiB). Before the reports the daemon
// knew nothing of their memory and ran them side by side in both, so that one ran out.
TEST_F(Salusd, PackRunsProcessesSideBySideOnlyWhereTheirReportedMemoryFits) {
  const std::vector<std::string> args = {"--iterations", "12", "--iteration-ms", "40",
                                         "--persistent-mib", "4", "--ephemeral-mib", "8"};
  auto overlaps = [&](const std::string& x_name, const std::string& y_name) {
    int n = 0;
    for (const auto& x : iterations(log(x_name))) {
      for (const auto& y : iterations(log(y_name))) n += x.first < y.second && y.first < x.second;
    }
    return n;
  };
  auto run_pair = [&](const std::string& x, const std::string& y) {
    const pid_t px = client(x, args);
    const pid_t py = client(y, args);
    EXPECT_EQ(wait_for(px), 0) << read_file(log(x)) << read_file(dir_ + "/" + x + ".err");
    EXPECT_EQ(wait_for(py), 0) << read_file(log(y)) << read_file(dir_ + "/" + y + ".err");
    EXPECT_EQ(iterations(log(x)).size(), 12u);
    EXPECT_EQ(iterations(log(y)).size(), 12u);
  };
  start_daemon({"--policy", "pack", "--memory", "40MiB"});
  run_pair("a", "b");
  EXPECT_GE(overlaps("a", "b"), 4) << "room for both, yet they took turns";
  stop_daemon();
  start_daemon({"--policy", "pack", "--memory", "16MiB"});
  run_pair("c", "d");
  EXPECT_EQ(overlaps("c", "d"), 0) << "side by side where only one peak fits";
}

// The same pair with --reclaim never (the benchmarks' "without Salus" baseline): the daemon asks
// nobody for the pages they cache, so the activation region no longer moves, both peaks do not
// fit, and one of the two is told so with the reason while the other goes on to the end.
TEST_F(Salusd, WithReclaimNeverCachedPagesStayWithTheirProcess) {
  start_daemon({"--policy", "fair", "--memory", "16MiB", "--reclaim", "never"});
  const std::vector<std::string> args = {"--iterations", "20", "--iteration-ms", "40",
                                         "--persistent-mib", "4", "--ephemeral-mib", "8"};
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  const int ra = wait_for(a), rb = wait_for(b);
  ASSERT_TRUE((ra == 0 && rb == 3) || (ra == 3 && rb == 0))
      << ra << " " << rb << read_file(log("a")) << read_file(log("b"));
  const std::string failed = read_file(log(ra == 3 ? "a" : "b"));
  EXPECT_NE(failed.find("error out of memory"), std::string::npos) << failed;
  EXPECT_NE(failed.find("--reclaim never"), std::string::npos) << failed;
  EXPECT_NE(status().find("reclaim never"), std::string::npos);
}

// A process's turn ends with a block freed while work on it is still queued (a fill behind a
// 30 ms pause), and the other process's iteration runs in those pages: the device holds exactly
// both processes' persistent memory and one iteration's peak. Every byte both wrote is checked;
// without a wait for the giver's tail, the late fill would land on the other's fresh data. The
// wait is the turn's (its fence, waited for on the host before the next process's work), so the
// pages reach the other once that work has completed; pages handed on while it is still queued,
// through their own fences, are tested on the coordinator (test_salusd_handover.cpp).
TEST_F(Salusd, PagesGivenBackBehindQueuedWorkWaitForIt) {
  start_daemon({"--policy", "fair", "--memory", "20MiB"});
  // The next process asks for pages at once (no check that would wait for its own stream).
  const std::vector<std::string> args = {"--iterations", "6", "--iteration-ms", "40",
                                         "--persistent-mib", "4", "--ephemeral-mib", "8",
                                         "--late-fill-ms", "30", "--check-at-begin", "0"};
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  const int ra = wait_for(a), rb = wait_for(b);
  EXPECT_EQ(ra, 0) << read_file(log("a")) << read_file(dir_ + "/a.err") << "b:\n"
                   << read_file(log("b")) << status();
  EXPECT_EQ(rb, 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  expect_exclusive({"a", "b"});
  expect_alternating("a", "b");
}

// Two processes whose persistent memory is 60% of the device each: they take turns only because
// the one that waits moves its pages to its host memory, and brings them home at its turn.
TEST_F(Salusd, ProcessesLargerThanTheDeviceTakeTurnsBySpillingToTheHost) {
  start_daemon({"--policy", "fair", "--memory", "40MiB", "--spill", "host"});
  expect_pair_alternates(kBigWeights);
  // Each came back to pages that had gone to the host: fetched home at its turn.
  for (const std::string name : {"a", "b"}) {
    long long fetched = -1;
    for (const Event& e : events(log(name))) {
      if (e.what.rfind("moves fetched ", 0) == 0) fetched = std::stoll(e.what.substr(14));
    }
    EXPECT_GT(fetched, 0) << read_file(log(name));
  }
}

// The same without spilling: the second process's weights cannot fit, and it is told so.
TEST_F(Salusd, WithoutSpillingAProcessThatCannotFitGetsOutOfMemory) {
  start_daemon({"--policy", "fair", "--memory", "40MiB"});
  const std::vector<std::string>& args = kBigWeights;
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  const int ra = wait_for(a), rb = wait_for(b);
  EXPECT_TRUE((ra == 0 && rb == 3) || (ra == 3 && rb == 0)) << ra << " " << rb;
  const std::string failed = log(ra == 3 ? "a" : "b");
  EXPECT_NE(read_file(failed).find("error out of memory"), std::string::npos) << read_file(failed);
}


}  // namespace
}  // namespace salusd_test
