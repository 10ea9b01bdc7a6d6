// The fixture of the salusd tests: a daemon binary and client processes (tests/daemon/
// salus_client.cpp) on the simulated backend, in a temporary folder of their own, and the helpers
// that read the clients' logs and the daemon's --status table.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace salusd_test {

using namespace std::chrono_literals;

// Runs argv[0] with both standard streams to `output`.
pid_t spawn(const std::vector<std::string>& argv, const std::string& output = "/dev/null");
// The exit status, or -1 when it did not end within `limit` (it is then killed).
int wait_for(pid_t pid, std::chrono::milliseconds limit = 60s);
std::string read_file(const std::string& path);

// One line of a client's log: seconds since its start, and what happened.
struct Event {
  double t = 0;
  std::string what;
};
std::vector<Event> events(const std::string& log);
// Iteration intervals [begin, end] of one client's log.
std::vector<std::pair<double, double>> iterations(const std::string& log);
// Device 0's row of a table of `salusd --status` (the one whose header starts with `header`:
// "device" for pages, "gpu" for the driver's memory), column `column` (0: the device's index); -1
// when there is no such row or column.
double device_column(const std::string& table, std::size_t column,
                     const std::string& header = "device");
// Device 0's granted pages in `salusd --status`'s table; -1 when there is no such row.
long granted_pages(const std::string& table);

// A client whose weights are 24 MiB (60% of a 40 MiB device), made in its first iteration.
inline const std::vector<std::string> kBigWeights = {
    "--iterations", "4", "--iteration-ms", "30", "--persistent-mib", "24", "--ephemeral-mib", "4",
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
    // A failure keeps the logs of the daemon and every client: a rare one may not come back.
    if (HasFailure()) {
      std::fprintf(stderr, "salusd test: logs kept in %s\n", dir_.c_str());
      return;
    }
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

  // Clients "a" and "b", each with `args`, ran to the end, one iteration at a time and in
  // alternation. Returns their process ids.
  std::pair<pid_t, pid_t> expect_pair_alternates(const std::vector<std::string>& args) {
    const pid_t a = client("a", args);
    const pid_t b = client("b", args);
    EXPECT_EQ(wait_for(a), 0) << read_file(log("a")) << read_file(dir_ + "/a.err");
    EXPECT_EQ(wait_for(b), 0) << read_file(log("b")) << read_file(dir_ + "/b.err");
    expect_exclusive({"a", "b"});
    expect_alternating("a", "b");
    return {a, b};
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

}  // namespace salusd_test
