// A page goes to another process only once no process can reach it (issue 34, item 7). A process
// that hung up but lives may still map its pages, so they wait for its exit, however long; before,
// they went to the next process after --exit-wait, which then shared its bytes with the first.
// And on the simulated device, whose pages are mapped as ordinary memory, a forked child keeps
// its parent's mappings: the pages wait until no process maps them.
#include <sys/mman.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "daemon/salusd_fixture.hpp"
#include "remote/channel.hpp"
#include "remote/daemon_link.hpp"
#include "remote/protocol.hpp"
#include "salus/error.hpp"

namespace salusd_test {
namespace {

using namespace salus::remote;

// In a forked client: greets the daemon on `c` and takes every page of device 0. Returns the
// grant and the page size; leaves the process (_exit 2 or 3) when the daemon says otherwise.
std::pair<Received, std::size_t> take_every_page(Channel& c) {
  c.send(encode(MessageType::hello, 1, Hello{}));
  const auto welcome = c.receive();
  if (!welcome || welcome->record.type() != MessageType::welcome) ::_exit(2);
  const auto w = body_as<Welcome>(welcome->record);
  const auto pages = static_cast<std::uint32_t>(w.device_bytes[0] / w.page_bytes);
  c.send(encode(MessageType::take_pages, 2, PageCount{0, pages}));
  auto got = c.receive();
  if (!got || got->record.type() != MessageType::pages) ::_exit(3);
  return {std::move(*got), w.page_bytes};
}

// A forked process that takes every page of device 0, hangs up, says so on `hung_up`, and lives
// on with the pages' descriptors (what it would map them through) until `go` is written.
pid_t hung_up_holder(const std::string& socket, int hung_up, int go) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  int code = 0;
  try {
    std::vector<UniqueFd> held;
    {
      Channel c(connect_to(socket));
      held = std::move(take_every_page(c).first.fds);
    }  // hung up
    const char one = 1;
    if (::write(hung_up, &one, 1) != 1) code = 4;
    char byte = 0;
    (void)!::read(go, &byte, 1);
  } catch (...) {
    code = 5;
  }
  ::_exit(code);
}

TEST_F(Salusd, APageOfAProcessThatHungUpWaitsForItsExit) {
  start_daemon({"--memory", "16MiB", "--exit-wait", "0.2"});
  int hung_up[2], go[2];
  ASSERT_EQ(::pipe2(hung_up, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  const pid_t holder = hung_up_holder(socket_, hung_up[1], go[0]);
  ASSERT_GT(holder, 0);
  char byte = 0;
  ASSERT_EQ(::read(hung_up[0], &byte, 1), 1);
  // The daemon has seen it hang up once its status says so.
  std::string table;
  const auto deadline = std::chrono::steady_clock::now() + 15s;  // a hang bound
  do {
    table = status();
  } while (table.find("hung up") == std::string::npos &&
           std::chrono::steady_clock::now() < deadline);
  ASSERT_NE(table.find("pages wait until no process can reach them"), std::string::npos) << table;
  const long all = granted_pages(table);
  ASSERT_GT(all, 0) << table;

  // While it lives, none of its pages goes to another process: an ask fails as short.
  DaemonLink asker(socket_);
  try {
    (void)asker.call(MessageType::take_pages, PageCount{0, 1});
    ADD_FAILURE() << "a page of a process that hung up and lives was handed on";
  } catch (const salus::Error& e) {
    EXPECT_EQ(e.code(), salus::Errc::out_of_memory) << e.what();
  }
  EXPECT_EQ(granted_pages(status()), all);
  EXPECT_NE(read_file(dir_ + "/salusd.log").find("hung up holding pages and has not exited"),
            std::string::npos)
      << read_file(dir_ + "/salusd.log");

  // Once it exits, they come back and are handed on.
  ASSERT_EQ(::write(go[1], &byte, 1), 1);
  EXPECT_EQ(wait_for(holder, 20s), 0);
  EXPECT_EQ(wait_for_granted_pages(0), 0);
  EXPECT_NO_THROW((void)asker.call(MessageType::take_pages, PageCount{0, 1}));
  for (const int fd : {hung_up[0], hung_up[1], go[0], go[1]}) ::close(fd);
}

// A forked process that takes every page of device 0 and maps them, writes a pattern into them,
// and forks a child that keeps the mappings (and nothing else: it closes the socket and the
// pages' descriptors it inherited). The child says so on `ready` and waits for `go`; then it
// reads its mappings and writes on `ready` 'y' when they still hold the pattern (no other
// process's bytes), else 'n', and exits.
// The first process lives until it is killed.
pid_t parent_of_a_mapping_child(const std::string& socket, int ready, int go) {
  const pid_t pid = ::fork();
  if (pid != 0) return pid;
  std::vector<std::pair<char*, std::size_t>> mapped;
  {
    Channel c(connect_to(socket));
    auto [got, page_bytes] = take_every_page(c);
    std::vector<PageEntry> entries;
    std::vector<FenceEntry> fences;
    (void)pages_body(got.record, entries, fences);
    for (const PageEntry& e : entries) {
      void* p = ::mmap(nullptr, page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       got.fds.at(e.fd_index).get(), static_cast<off_t>(e.offset));
      if (p == MAP_FAILED) ::_exit(4);
      std::memset(p, 0x5a, page_bytes);
      mapped.emplace_back(static_cast<char*>(p), page_bytes);
    }
    const pid_t child = ::fork();
    if (child == 0) {
      // Only the mappings: the socket and the pages' descriptors go (as a child that execs would).
      std::vector<int> inherited;
      for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
        inherited.push_back(std::stoi(entry.path().filename().string()));
      }
      for (const int fd : inherited) {
        if (fd > 2 && fd != ready && fd != go) ::close(fd);
      }
      const char one = 1;
      if (::write(ready, &one, 1) != 1) ::_exit(5);
      char byte = 0;
      (void)!::read(go, &byte, 1);
      char verdict = 'y';
      for (const auto& [p, bytes] : mapped) {
        for (std::size_t i = 0; i < bytes; i += 4096) {
          if (p[i] != 0x5a) verdict = 'n';
        }
      }
      (void)!::write(ready, &verdict, 1);
      ::_exit(0);
    }
    for (;;) ::pause();  // until the test kills it, once the child is ready
  }
}

TEST_F(Salusd, APageAForkedChildStillMapsWaitsUntilItIsUnmapped) {
  start_daemon({"--memory", "16MiB", "--exit-wait", "0.2"});
  int ready[2], go[2];
  ASSERT_EQ(::pipe2(ready, O_CLOEXEC), 0);
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  const pid_t parent = parent_of_a_mapping_child(socket_, ready[1], go[0]);
  ASSERT_GT(parent, 0);
  char byte = 0;
  ASSERT_EQ(::read(ready[0], &byte, 1), 1);  // the child maps the pages now
  ::kill(parent, SIGKILL);  // the parent goes (its read would wait for ever)
  ASSERT_NE(wait_for(parent, 20s), -1);
  // The parent's session closes: the daemon finds the child's mappings.
  const auto deadline = std::chrono::steady_clock::now() + 15s;  // a hang bound
  while (read_file(dir_ + "/salusd.log").find("still maps pages") == std::string::npos &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(10ms);
  }
  EXPECT_NE(read_file(dir_ + "/salusd.log").find("still maps pages"), std::string::npos)
      << read_file(dir_ + "/salusd.log");
  const long all = granted_pages(status());

  // While the child maps them, they go to nobody; the bytes it mapped stay its parent's.
  DaemonLink asker(socket_);
  try {
    (void)asker.call(MessageType::take_pages, PageCount{0, 1});
    ADD_FAILURE() << "a page a live process still maps was handed on";
  } catch (const salus::Error& e) {
    EXPECT_EQ(e.code(), salus::Errc::out_of_memory) << e.what();
  }
  EXPECT_EQ(granted_pages(status()), all);

  // The child ends (reading its pages unchanged); then they come back and are handed on.
  ASSERT_EQ(::write(go[1], &byte, 1), 1);
  char verdict = 0;
  ASSERT_EQ(::read(ready[0], &verdict, 1), 1);
  EXPECT_EQ(verdict, 'y') << "the child's mappings held another process's bytes";
  EXPECT_EQ(wait_for_granted_pages(0), 0);
  EXPECT_NO_THROW((void)asker.call(MessageType::take_pages, PageCount{0, 1}));
  for (const int fd : {ready[0], ready[1], go[0], go[1]}) ::close(fd);
}

}  // namespace
}  // namespace salusd_test
