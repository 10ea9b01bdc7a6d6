// salusd with real processes: the daemon binary and client processes (tests/daemon/
// salus_client.cpp) on the simulated backend, whose pages are memfd pages passed over the socket.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <future>
#include <random>
#include <thread>
#include <vector>

#include "remote/daemon_link.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"

namespace {

using namespace std::chrono_literals;

pid_t spawn(const std::vector<std::string>& argv, const std::string& output = "/dev/null") {
  const pid_t pid = ::fork();
  if (pid == 0) {
    // Both streams to one file: the daemon logs on standard error, --status prints on output.
    if (std::freopen(output.c_str(), "w", stdout) != nullptr) ::dup2(::fileno(stdout), 2);
    std::vector<char*> args;
    for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    ::execv(args[0], args.data());
    ::_exit(127);
  }
  return pid;
}

// Where a process that hangs is stuck: every thread's stack, when gdb is there to say.
void print_stacks(pid_t pid) {
  const std::string command = "command -v gdb >/dev/null && gdb -q -p " + std::to_string(pid) +
                              " -batch -ex 'thread apply all bt 12' 2>/dev/null | grep -E "
                              "'^(Thread|#)' >&2";
  std::fprintf(stderr, "process %d did not end in time; its threads:\n", static_cast<int>(pid));
  (void)std::system(command.c_str());
}

// The exit status, or -1 when it did not end within `limit` (it is then killed).
int wait_for(pid_t pid, std::chrono::milliseconds limit = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      print_stacks(pid);
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct Event {
  double t = 0;
  std::string what;
};
std::vector<Event> events(const std::string& log) {
  std::vector<Event> out;
  std::istringstream in(read_file(log));
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    Event e;
    l >> e.t;
    std::getline(l >> std::ws, e.what);
    out.push_back(e);
  }
  return out;
}

// Iteration intervals [begin, end] of one client's log.
std::vector<std::pair<double, double>> iterations(const std::string& log) {
  std::vector<std::pair<double, double>> out;
  double begun = -1;
  for (const Event& e : events(log)) {
    if (e.what.rfind("begin ", 0) == 0) begun = e.t;
    if (e.what.rfind("end ", 0) == 0 && begun >= 0) out.emplace_back(begun, e.t);
  }
  return out;
}

// Device 0's row of `salusd --status`'s table, column `column` (0: the device's index); -1 when
// there is no such row or column.
double device_column(const std::string& table, std::size_t column) {
  std::istringstream in(table);
  std::string line;
  bool devices = false;
  while (std::getline(in, line)) {
    if (line.rfind("device", 0) == 0) {
      devices = true;
      continue;
    }
    if (!devices) continue;
    std::istringstream row(line);
    std::vector<double> cells;
    double cell = 0;
    while (row >> cell) cells.push_back(cell);
    if (!cells.empty() && cells[0] == 0) return column < cells.size() ? cells[column] : -1;
  }
  return -1;
}

// Device 0's granted pages in `salusd --status`'s table; -1 when there is no such row.
long granted_pages(const std::string& table) {
  return static_cast<long>(device_column(table, 1));
}

// A client whose weights are 24 MiB (60% of a 40 MiB device), made in its first iteration.
const std::vector<std::string> kBigWeights = {"--iterations", "4", "--iteration-ms", "30",
                                              "--persistent-mib", "24", "--ephemeral-mib", "4",
                                              "--weights-in-iteration", "1"};

class Salusd : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/salusd-test-XXXXXX";
    dir_ = ::mkdtemp(tmpl);
    socket_ = dir_ + "/salusd.sock";
  }
  void TearDown() override {
    stop_daemon();
    std::system(("rm -rf " + dir_).c_str());
  }

  void start_daemon(std::vector<std::string> extra = {}) {
    // SALUS_TEST_DAEMON_BACKEND=cuda: scripts/gpu_check.sh runs the C programs' test on a GPU.
    const char* backend = std::getenv("SALUS_TEST_DAEMON_BACKEND");
    std::vector<std::string> argv = {SALUSD_PATH, "--socket", socket_, "--backend",
                                     backend != nullptr ? backend : "sim", "--log-level", "warn"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    daemon_ = spawn(argv, dir_ + "/salusd.log");
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    struct stat st {};
    while (::stat(socket_.c_str(), &st) != 0) {
      ASSERT_LT(std::chrono::steady_clock::now(), deadline) << read_file(dir_ + "/salusd.log");
      std::this_thread::sleep_for(5ms);
    }
  }
  void stop_daemon() {
    if (daemon_ <= 0) return;
    ::kill(daemon_, SIGTERM);
    EXPECT_EQ(wait_for(daemon_, 20s), 0) << read_file(dir_ + "/salusd.log");
    daemon_ = 0;
  }

  pid_t client(const std::string& name, std::vector<std::string> extra = {}) {
    std::vector<std::string> argv = {SALUS_CLIENT_PATH, "--socket", socket_, "--name", name,
                                     "--log", log(name)};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return spawn(argv, dir_ + "/" + name + ".err");
  }
  std::string log(const std::string& name) const { return dir_ + "/" + name + ".log"; }
  std::string status() const {
    const std::string out = dir_ + "/status.txt";
    const pid_t pid = spawn({SALUSD_PATH, "--socket", socket_, "--status"}, out);
    (void)wait_for(pid, 10s);
    return read_file(out);
  }

  // Waits until `name`'s log has a line starting with `what`.
  bool wait_log(const std::string& name, const std::string& what, std::chrono::seconds limit = 30s) {
    const auto deadline = std::chrono::steady_clock::now() + limit;
    while (std::chrono::steady_clock::now() < deadline) {
      for (const Event& e : events(log(name))) {
        if (e.what.rfind(what, 0) == 0) return true;
      }
      std::this_thread::sleep_for(5ms);
    }
    return false;
  }

  void expect_exclusive(const std::vector<std::string>& names) {
    std::vector<std::pair<std::pair<double, double>, std::string>> all;
    for (const auto& n : names) {
      for (const auto& i : iterations(log(n))) all.push_back({i, n});
    }
    std::sort(all.begin(), all.end());
    for (std::size_t k = 1; k < all.size(); ++k) {
      EXPECT_LE(all[k - 1].first.second, all[k].first.first)
          << all[k - 1].second << " and " << all[k].second << " ran iterations at once";
    }
  }

  // Device 0's granted pages once they are `pages` (or what they are after 15 s).
  long wait_for_granted_pages(long pages) {
    const auto deadline = std::chrono::steady_clock::now() + 15s;
    long now = -1;
    do {
      now = granted_pages(status());
      if (now == pages) break;
      std::this_thread::sleep_for(50ms);
    } while (std::chrono::steady_clock::now() < deadline);
    return now;
  }

  void victim_dies_after(const std::string& line);
  void expect_took_turns(pid_t a, pid_t b, const std::string& na, const std::string& nb);

  // Turns alternate: each ran an iteration between two of the other's.
  void expect_alternating(const std::string& a, const std::string& b) {
    const auto ia = iterations(log(a)), ib = iterations(log(b));
    ASSERT_GE(ia.size(), 2u);
    ASSERT_GE(ib.size(), 2u);
    EXPECT_LT(ia.front().first, ib.back().first) << b << " ran all its iterations first";
    EXPECT_LT(ib.front().first, ia.back().first) << a << " ran all its iterations first";
  }

  std::string dir_, socket_;
  pid_t daemon_ = 0;
};

// Both processes ran to the end, six iterations each, one at a time and in alternation.
void Salusd::expect_took_turns(pid_t a, pid_t b, const std::string& na, const std::string& nb) {
  EXPECT_EQ(wait_for(a), 0) << read_file(log(na)) << read_file(dir_ + "/" + na + ".err");
  EXPECT_EQ(wait_for(b), 0) << read_file(log(nb)) << read_file(dir_ + "/" + nb + ".err");
  ASSERT_EQ(iterations(log(na)).size(), 6u);
  ASSERT_EQ(iterations(log(nb)).size(), 6u);
  expect_exclusive({na, nb});
  expect_alternating(na, nb);
}

TEST_F(Salusd, TwoProcessesTakeTurnsUnderFair) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  const pid_t a = client("a", {"--iterations", "6"});
  const pid_t b = client("b", {"--iterations", "6"});
  expect_took_turns(a, b, "a", "b");
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
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  EXPECT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
  EXPECT_EQ(wait_for(b), 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  expect_exclusive({"a", "b"});
  // Both were there throughout: the pages went back and forth, not to one after the other ended.
  expect_alternating("a", "b");
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
// 30 ms pause): its pages go to the other process behind an interprocess event, at once, and the
// other's work on them waits for it. Every byte both wrote is checked; without the wait, the late
// fill would land on the other's fresh data. The device holds exactly both processes' persistent
// memory and one iteration's peak, so every iteration runs in pages the other just gave back.
TEST_F(Salusd, PagesGivenBackBehindQueuedWorkWaitForIt) {
  start_daemon({"--policy", "fair", "--memory", "20MiB"});
  const std::vector<std::string> args = {"--iterations", "6", "--iteration-ms", "40",
                                         "--persistent-mib", "4", "--ephemeral-mib", "8",
                                         "--late-fill-ms", "30"};
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  const int ra = wait_for(a), rb = wait_for(b);
  EXPECT_EQ(ra, 0) << read_file(log("a")) << read_file(dir_ + "/a.err") << "b:\n"
                   << read_file(log("b")) << status();
  EXPECT_EQ(rb, 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  expect_exclusive({"a", "b"});
  expect_alternating("a", "b");
  const std::string table = status();
  EXPECT_GT(device_column(table, 6), 0) << "no page went back behind work:\n" << table;
}

// Two processes whose persistent memory is 60% of the device each: they take turns only because
// the one that waits moves its pages to its host memory, and brings them home at its turn.
TEST_F(Salusd, ProcessesLargerThanTheDeviceTakeTurnsBySpillingToTheHost) {
  start_daemon({"--policy", "fair", "--memory", "40MiB", "--spill", "host"});
  const std::vector<std::string>& args = kBigWeights;
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  EXPECT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
  EXPECT_EQ(wait_for(b), 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  expect_exclusive({"a", "b"});
  expect_alternating("a", "b");
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

TEST_F(Salusd, AClientKilledInsideAnIterationLosesOnlyItsOwnJob) {
  start_daemon({"--policy", "fair", "--memory", "64MiB"});
  const pid_t victim = client("victim", {"--iterations", "50", "--iteration-ms", "50"});
  const pid_t a = client("a", {"--iterations", "6"});
  const pid_t b = client("b", {"--iterations", "6"});
  ASSERT_TRUE(wait_log("victim", "begin 1")) << read_file(log("victim"));
  ::kill(victim, SIGKILL);
  EXPECT_EQ(wait_for(victim), 128 + SIGKILL);
  EXPECT_EQ(wait_for(a), 0) << read_file(log("a"));
  EXPECT_EQ(wait_for(b), 0) << read_file(log("b"));
  // Every page came back: nobody holds any now.
  EXPECT_EQ(wait_for_granted_pages(0), 0) << status();
}

// Three processes whose weights (60% of the device each) fit one at a time, with spilling: the
// victim dies at a chosen moment (`line` in its log); the others finish with every byte intact
// and every page comes back.
void Salusd::victim_dies_after(const std::string& line) {
  start_daemon({"--policy", "fair", "--memory", "40MiB", "--spill", "host"});
  const std::vector<std::string>& args = kBigWeights;
  std::vector<std::string> victim_args = args;
  victim_args[1] = "100";
  const pid_t victim = client("victim", victim_args);
  const pid_t a = client("a", args);
  const pid_t b = client("b", args);
  ASSERT_TRUE(wait_log("victim", line)) << read_file(log("victim"));
  ::kill(victim, SIGKILL);
  EXPECT_EQ(wait_for(victim), 128 + SIGKILL);
  EXPECT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
  EXPECT_EQ(wait_for(b), 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
  expect_exclusive({"a", "b", "victim"});
  EXPECT_EQ(wait_for_granted_pages(0), 0) << status();
}

TEST_F(Salusd, AClientKilledWhileItsPagesGoToAnotherLosesOnlyItsOwnJob) {
  // Its first turn has begun: the others, waiting, are moving their pages out for it.
  victim_dies_after("begin 0");
}

TEST_F(Salusd, AClientKilledWhileWaitingForItsTurnLosesOnlyItsOwnJob) {
  // Its first turn has ended and it asks for the next, behind the others.
  victim_dies_after("end 0");
}

TEST_F(Salusd, ADeadDaemonIsAClearErrorWithinFiveSeconds) {
  start_daemon({"--memory", "64MiB"});
  const pid_t c = client("c", {"--iterations", "1000", "--iteration-ms", "20"});
  ASSERT_TRUE(wait_log("c", "begin 2")) << read_file(log("c"));
  ::kill(daemon_, SIGKILL);
  (void)wait_for(daemon_, 5s);
  daemon_ = 0;
  const auto killed = std::chrono::steady_clock::now();
  EXPECT_EQ(wait_for(c, 10s), 3);
  EXPECT_LT(std::chrono::steady_clock::now() - killed, 5s);
  EXPECT_NE(read_file(log("c")).find("error device error"), std::string::npos) << read_file(log("c"));
  EXPECT_NE(read_file(log("c")).find("is gone"), std::string::npos) << read_file(log("c"));
}

TEST_F(Salusd, TheProcessLimitHolds) {
  start_daemon({"--memory", "64MiB", "--process-limit", "8MiB"});
  const pid_t c = client("c", {"--persistent-mib", "16"});
  EXPECT_EQ(wait_for(c), 3);
  EXPECT_NE(read_file(log("c")).find("error out of memory"), std::string::npos) << read_file(log("c"));
  // The error says which limit: the daemon's reason reaches the client's OutOfMemory.
  EXPECT_NE(read_file(log("c")).find("its limit is 8388608 bytes"), std::string::npos)
      << read_file(log("c"));
  // Within its limit, a process works.
  const pid_t d = client("d", {"--persistent-mib", "2", "--ephemeral-mib", "4"});
  EXPECT_EQ(wait_for(d), 0) << read_file(log("d"));
}

// A process speaking the protocol itself, ignoring its own job's limit: the daemon grants no more
// pages than the limits of the process's jobs add up to, whatever it asks for.
TEST_F(Salusd, JobLimitsBoundWhatAProcessTakesWhateverItAsks) {
  using namespace salus::remote;
  start_daemon({"--memory", "64MiB"});
  auto link_owner = std::make_unique<DaemonLink>(socket_);
  DaemonLink& link = *link_owner;
  AddJob add;
  set_name(add.name, "greedy");
  add.limit_total = 4 << 20;  // two pages
  (void)link.call(MessageType::add_job, add);
  const Received got = link.call(MessageType::take_pages, PageCount{0, 16});
  std::vector<PageEntry> pages;
  std::vector<FenceEntry> fences;
  (void)pages_body(got.record, pages, fences);
  EXPECT_EQ(pages.size(), 2u) << "asked for 16 pages under a 4 MiB job limit";
  try {
    (void)link.call(MessageType::take_pages, PageCount{0, 16});
    ADD_FAILURE() << "a third page was granted";
  } catch (const salus::Error& e) {
    EXPECT_EQ(e.code(), salus::Errc::out_of_memory) << e.what();
    EXPECT_NE(std::string(e.what()).find("the sum of its jobs' limits"), std::string::npos)
        << e.what();
  }
  const std::string table = status();
  EXPECT_NE(table.find("4.0"), std::string::npos) << "the limit is in the table:\n" << table;
  // Given back, so that the daemon need not wait for this process's exit when it stops.
  std::vector<std::uint64_t> ids;
  for (const PageEntry& e : pages) ids.push_back(e.id);
  (void)link.call(MessageType::give_pages,
                  give_pages_body(GiveHead{0, static_cast<std::uint32_t>(ids.size()),
                                           GiveFence::settled, 0},
                                  ids, nullptr));
  link_owner.reset();
}

// A job's turn connection names its session by a secret token: a wrong token, another process
// (even of this user, knowing the token) and a job that is not the session's are each refused with
// a reason; a call for another job ends the connection. The right attach takes turns.
TEST_F(Salusd, ATurnConnectionJoinsOnlyItsOwnProcessesJobs) {
  using namespace salus::remote;
  start_daemon({"--memory", "64MiB"});
  DaemonLink link(socket_);
  AddJob add;
  set_name(add.name, "mine");
  const auto job = body_as<JobAdded>(link.call(MessageType::add_job, add).record).job;
  const Welcome& w = link.welcome();
  // The answer to an attach, or "closed" when the daemon hung up.
  auto attach = [&](const AttachTurns& a, Channel& c) {
    c.send(encode(MessageType::attach_turns, 1, a));
    const auto r = c.receive();
    if (!r) return std::string("closed");
    if (r->record.type() == MessageType::failure) {
      return name_of(body_as<Failure>(r->record).message, "failure");
    }
    return std::string(to_string(r->record.type()));
  };
  {
    Channel c(connect_to(socket_));
    EXPECT_NE(attach({w.session, w.token + 1, job}, c).find("no open session"), std::string::npos);
  }
  {
    Channel c(connect_to(socket_));
    EXPECT_NE(attach({w.session, w.token, job + 1000}, c).find("unknown job"), std::string::npos);
  }
  const pid_t child = ::fork();
  if (child == 0) {
    Channel c(connect_to(socket_));
    ::_exit(attach({w.session, w.token, job}, c).find("not pid") != std::string::npos ? 0 : 1);
  }
  EXPECT_EQ(wait_for(child, 10s), 0) << "another process attached with the right token";
  Channel c(connect_to(socket_));
  ASSERT_EQ(attach({w.session, w.token, job}, c), "done");
  c.send(encode(MessageType::begin_iteration, 2, JobCall{job, -1, 0, 0}));
  auto r = c.receive();
  ASSERT_TRUE(r);
  ASSERT_EQ(r->record.type(), MessageType::turn);
  EXPECT_EQ(body_as<Turn>(r->record).admitted, 1u);
  c.send(encode(MessageType::end_iteration, 3, EndIteration{JobCall{job, -1, 0, 0}, {}}));
  r = c.receive();
  ASSERT_TRUE(r);
  EXPECT_EQ(r->record.type(), MessageType::done);
  c.send(encode(MessageType::begin_iteration, 4, JobCall{job + 1, -1, 0, 0}));
  EXPECT_FALSE(c.receive()) << "a call for another job was answered";
}

// A cancel from another thread reaches a job whose thread waits on its turn connection (the cancel
// goes on the session's connection; the daemon ends the wait, whose answer is the error), at a
// random moment of the wait; the other job, holding the turn, goes on; a timed wait that runs out
// leaves the job able to take its turn later.
TEST_F(Salusd, ACancelFromAnotherThreadEndsAWaitForTheDaemonsTurn) {
  start_daemon({"--memory", "64MiB"});
  auto runtime = salus::Runtime::connect(socket_);
  salus::JobSpec a_spec, b_spec, c_spec;
  a_spec.name = "holder";
  b_spec.name = "cancelled";
  c_spec.name = "patient";
  salus::Job a = runtime->add_job(a_spec);
  salus::Job b = runtime->add_job(b_spec);
  salus::Job c = runtime->add_job(c_spec);
  (void)a.begin_iteration();
  EXPECT_FALSE(c.try_begin_iteration(std::chrono::milliseconds(20)))
      << "a second job took the daemon's turn while the first held it";
  // The wait for the daemon's turn is the job's wait, in its statistics too.
  EXPECT_GE(c.stats().waiting_seconds, 0.019);
  std::promise<std::string> outcome;
  std::thread waiter([&] {
    try {
      (void)b.begin_iteration();
      outcome.set_value("admitted");
    } catch (const salus::Error& e) {
      outcome.set_value(salus::to_string(e.code()));
    }
  });
  std::mt19937 rng(std::random_device{}());
  std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 40));
  const auto cancelled_at = std::chrono::steady_clock::now();
  b.cancel();
  auto result = outcome.get_future();
  ASSERT_EQ(result.wait_for(5s), std::future_status::ready) << "the cancel did not end the wait";
  EXPECT_EQ(result.get(), salus::to_string(salus::Errc::cancelled));
  EXPECT_LT(std::chrono::steady_clock::now() - cancelled_at, 2s);
  waiter.join();
  a.end_iteration();
  // c's timed-out try left it waiting or not: either way its turn comes now.
  ASSERT_TRUE(c.try_begin_iteration(std::chrono::seconds(5)));
  c.end_iteration();
}

TEST_F(Salusd, ASecondDaemonOnTheSameSocketRefusesToStart) {
  start_daemon();
  const std::string out = dir_ + "/second.log";
  const pid_t second = spawn({SALUSD_PATH, "--socket", socket_, "--backend", "sim"}, out);
  EXPECT_EQ(wait_for(second, 10s), 1);
  EXPECT_NE(read_file(out).find("another salusd"), std::string::npos) << read_file(out);
}

TEST_F(Salusd, AnotherUserIsRefused) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to become another user";
  start_daemon();
  const pid_t child = ::fork();
  if (child == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    try {
      (void)salus::Runtime::connect(socket_);
    } catch (const salus::DeviceError& e) {
      ::_exit(std::string(e.what()).find("not yours") != std::string::npos ? 0 : 11);
    } catch (...) {
      ::_exit(12);
    }
    ::_exit(13);
  }
  EXPECT_EQ(wait_for(child, 10s), 0);
}

TEST_F(Salusd, ConnectingWithNoDaemonSaysSo) {
  try {
    (void)salus::Runtime::connect(socket_);
    FAIL() << "connected to nothing";
  } catch (const salus::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("is salusd running?"), std::string::npos) << e.what();
  }
}

}  // namespace
