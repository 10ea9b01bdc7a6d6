// salusd with real processes, when something goes wrong: a client killed at any moment loses only
// its own job, a dead daemon is a clear error, limits hold whatever a process asks, a cancel from
// another thread ends a wait for the daemon's turn, and a second daemon or another user is refused.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <future>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "remote/channel.hpp"
#include "remote/turn_channel.hpp"
#include "remote/daemon_link.hpp"
#include "remote/turn_channel.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"
#include "salus/remote.hpp"

#include "daemon/salusd_fixture.hpp"

namespace salusd_test {

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

namespace {

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
  // Attached, the connection's records go through the shared memory its answer carries.
  auto socket = std::make_shared<Channel>(connect_to(socket_));
  socket->send(encode(MessageType::attach_turns, 1, AttachTurns{w.session, w.token, job}));
  std::optional<Received> attached = socket->receive();
  ASSERT_TRUE(attached);
  ASSERT_EQ(attached->record.type(), MessageType::done);
  ASSERT_EQ(attached->fds.size(), 1u) << "the answer carries the connection's shared memory";
  TurnChannel c(socket, TurnRings::adopt(std::move(attached->fds.front())));
  const auto now = std::chrono::steady_clock::now;
  c.send(encode(MessageType::begin_iteration, 2, JobCall{job, -1, 0, 0}));
  auto r = c.receive(now(), {});
  ASSERT_TRUE(r);
  ASSERT_EQ(r->record.type(), MessageType::turn);
  EXPECT_EQ(body_as<Turn>(r->record).admitted, 1u);
  c.send(encode(MessageType::end_iteration, 3, EndIteration{JobCall{job, -1, 0, 0}, {}}));
  r = c.receive(now(), {});
  ASSERT_TRUE(r);
  EXPECT_EQ(r->record.type(), MessageType::done);
  c.send(encode(MessageType::begin_iteration, 4, JobCall{job + 1, -1, 0, 0}));
  EXPECT_FALSE(c.receive(now(), {})) << "a call for another job was answered";
}

// A cancel from another thread reaches a job whose thread waits on its turn connection (the cancel
// goes on the session's connection; the daemon ends the wait, whose answer is the error), at a
// random moment of the wait; the other job, holding the turn, goes on; a timed wait that runs out
// leaves the job able to take its turn later.
TEST_F(Salusd, ACancelFromAnotherThreadEndsAWaitForTheDaemonsTurn) {
  start_daemon({"--memory", "64MiB"});
  auto runtime = salus::connect_runtime(socket_);
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
      (void)salus::connect_runtime(socket_);
    } catch (const salus::DeviceError& e) {
      ::_exit(std::string(e.what()).find("not yours") != std::string::npos ? 0 : 11);
    } catch (...) {
      ::_exit(12);
    }
    ::_exit(13);
  }
  EXPECT_EQ(wait_for(child, 10s), 0);
}

// A lock file planted as a symbolic link (by another user, say) is not written through: the
// daemon refuses to start and the link's target keeps its bytes (issue 34, item 7).
TEST_F(Salusd, ALockFileThatIsALinkIsRefusedAndItsTargetKept) {
  const std::string target = dir_ + "/precious";
  {
    std::FILE* f = std::fopen(target.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("precious bytes", f);
    std::fclose(f);
  }
  ASSERT_EQ(::symlink(target.c_str(), (socket_ + ".lock").c_str()), 0);
  const std::string out = dir_ + "/refused.log";
  const pid_t daemon = spawn({SALUSD_PATH, "--socket", socket_, "--backend", "sim"}, out);
  EXPECT_EQ(wait_for(daemon, 20s), 1) << read_file(out);
  EXPECT_NE(read_file(out).find("symbolic link"), std::string::npos) << read_file(out);
  EXPECT_EQ(read_file(target), "precious bytes");
}

// A lock file another user made beside the socket (in a folder others may write) is not written
// either, even by root; and the default socket's private folder is made 0700, and refused when it
// is not this user's alone (issue 34, item 7).
TEST_F(Salusd, ALockFileOfAnotherUserIsRefused) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to make a file of another user";
  const std::string lock = socket_ + ".lock";
  {
    std::FILE* f = std::fopen(lock.c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("theirs", f);
    std::fclose(f);
  }
  ASSERT_EQ(::chown(lock.c_str(), 65534, 65534), 0);
  const std::string out = dir_ + "/refused.log";
  const pid_t daemon = spawn({SALUSD_PATH, "--socket", socket_, "--backend", "sim"}, out);
  EXPECT_EQ(wait_for(daemon, 20s), 1) << read_file(out);
  EXPECT_NE(read_file(out).find("is not a file of uid 0"), std::string::npos) << read_file(out);
  EXPECT_EQ(read_file(lock), "theirs");
}

TEST(PrivateSocketFolder, IsMadeForThisUserAloneAndRefusedOtherwise) {
  char tmpl[] = "/tmp/salus-folder-test-XXXXXX";
  const std::string base = ::mkdtemp(tmpl);
  const std::string fresh = base + "/fresh";
  salus::remote::make_private_folder(fresh);
  struct stat st {};
  ASSERT_EQ(::lstat(fresh.c_str(), &st), 0);
  EXPECT_TRUE(S_ISDIR(st.st_mode));
  EXPECT_EQ(st.st_mode & 07777, 0700u);
  salus::remote::make_private_folder(fresh);  // there already, and fine
  const std::string open_to_all = base + "/open";
  ASSERT_EQ(::mkdir(open_to_all.c_str(), 0777), 0);
  ASSERT_EQ(::chmod(open_to_all.c_str(), 0777), 0);
  EXPECT_THROW(salus::remote::make_private_folder(open_to_all), salus::InvalidArgument);
  const std::string link = base + "/link";
  ASSERT_EQ(::symlink(fresh.c_str(), link.c_str()), 0);
  EXPECT_THROW(salus::remote::make_private_folder(link), salus::InvalidArgument);
  std::system(("rm -rf " + base).c_str());
}

// A client does not trust a daemon of another user at its path: that daemon would get the
// client's memory and decide its turns (issue 34, item 7). Root runs the client here; the daemon
// runs as nobody, in a folder both may write.
TEST_F(Salusd, AClientRefusesADaemonOfAnotherUser) {
  if (::getuid() != 0) GTEST_SKIP() << "needs root to start a daemon as another user";
  ASSERT_EQ(::chmod(dir_.c_str(), 0777), 0);
  const pid_t daemon = ::fork();
  if (daemon == 0) {
    if (::setgid(65534) != 0 || ::setuid(65534) != 0) ::_exit(10);
    const std::string log = dir_ + "/nobody.log";
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ::dup2(fd, 1);
      ::dup2(fd, 2);
    }
    ::execl(SALUSD_PATH, SALUSD_PATH, "--socket", socket_.c_str(), "--backend", "sim",
            static_cast<char*>(nullptr));
    ::_exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  struct stat st {};
  while (::stat(socket_.c_str(), &st) != 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  try {
    (void)salus::connect_runtime(socket_);
    ADD_FAILURE() << "root's client used nobody's daemon";
  } catch (const salus::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("runs as uid 65534"), std::string::npos) << e.what();
  }
  ::kill(daemon, SIGTERM);
  EXPECT_EQ(wait_for(daemon, 20s), 0) << read_file(dir_ + "/nobody.log");
}

TEST_F(Salusd, ConnectingWithNoDaemonSaysSo) {
  try {
    (void)salus::connect_runtime(socket_);
    FAIL() << "connected to nothing";
  } catch (const salus::DeviceError& e) {
    EXPECT_NE(std::string(e.what()).find("is salusd running?"), std::string::npos) << e.what();
  }
}


}  // namespace
}  // namespace salusd_test
