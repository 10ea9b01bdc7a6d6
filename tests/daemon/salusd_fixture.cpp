// The salusd tests' helpers (salusd_fixture.hpp).
#include "daemon/salusd_fixture.hpp"

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>

namespace salusd_test {

pid_t spawn(const std::vector<std::string>& argv, const std::string& output) {
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
int wait_for(pid_t pid, std::chrono::milliseconds limit) {
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

double device_column(const std::string& table, std::size_t column, const std::string& header) {
  std::istringstream in(table);
  std::string line;
  bool devices = false;
  while (std::getline(in, line)) {
    if (line.rfind(header + " ", 0) == 0) {
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

}  // namespace salusd_test
