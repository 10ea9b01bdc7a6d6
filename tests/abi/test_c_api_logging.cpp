// Where Salus's messages go: standard error at the level SALUS_LOG_LEVEL says (never standard
// output, which belongs to the program), or the callback a program installs. The environment is
// read once per process, so those cases run salus_log_probe (tests/c_program/log_probe.c) in a
// process of its own; the callback and the level calls run here.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "abi/c_api_fixture.hpp"

extern char** environ;

namespace {

constexpr const char* kWarning = "1 blocks still live at shutdown";

struct ProbeRun {
  int exit_status = -1;
  std::string out, err;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the probe with SALUS_LOG_LEVEL set to `level` (unset for nullptr), the rest of this
// process's environment kept (the sanitizers' options among it).
ProbeRun run_probe(const char* level) {
  std::vector<std::string> env;
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::strncmp(*e, "SALUS_LOG_LEVEL=", 16) != 0) env.emplace_back(*e);
  }
  if (level != nullptr) env.push_back(std::string("SALUS_LOG_LEVEL=") + level);
  std::vector<char*> envp;
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);

  // Named after this process and run: ctest runs tests (processes) side by side.
  static int runs = 0;
  const std::string base = ::testing::TempDir() + "salus_log_probe." + std::to_string(getpid()) +
                           "." + std::to_string(++runs);
  const std::string out_path = base + ".out";
  const std::string err_path = base + ".err";
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, 1, out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  posix_spawn_file_actions_addopen(&files, 2, err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  char program[] = SALUS_LOG_PROBE;
  char* argv[] = {program, nullptr};
  ProbeRun run;
  pid_t pid = 0;
  const int spawned = posix_spawn(&pid, program, &files, nullptr, argv, envp.data());
  posix_spawn_file_actions_destroy(&files);
  if (spawned != 0) {
    ADD_FAILURE() << "cannot run " << program << ": " << std::strerror(spawned);
    return run;
  }
  int status = 0;
  if (waitpid(pid, &status, 0) == pid && WIFEXITED(status)) run.exit_status = WEXITSTATUS(status);
  run.out = read_file(out_path);
  run.err = read_file(err_path);
  std::remove(out_path.c_str());
  std::remove(err_path.c_str());
  return run;
}

bool contains(const std::string& text, const std::string& needle) {
  return text.find(needle) != std::string::npos;
}

TEST(CApiLogging, WarningsGoToStandardErrorNeverStandardOutput) {
  const ProbeRun run = run_probe(nullptr);
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(run.out, "result 42\n") << "standard output is the program's alone";
  EXPECT_TRUE(contains(run.err, kWarning)) << "stderr: " << run.err;
  EXPECT_TRUE(contains(run.err, "[salus] [warning]")) << "stderr: " << run.err;
}

TEST(CApiLogging, TheEnvironmentSetsTheLevel) {
  for (const char* quiet : {"off", "error", "Critical"}) {
    const ProbeRun run = run_probe(quiet);
    ASSERT_EQ(run.exit_status, 0) << quiet << ": " << run.err;
    EXPECT_EQ(run.out, "result 42\n") << quiet;
    EXPECT_FALSE(contains(run.err, kWarning)) << "SALUS_LOG_LEVEL=" << quiet << ": " << run.err;
  }
  const ProbeRun warn = run_probe("WARN");
  EXPECT_TRUE(contains(warn.err, kWarning)) << warn.err;
  // At debug, the shutdown says more (the default stream is not waited for) but no less.
  const ProbeRun debug = run_probe("debug");
  EXPECT_EQ(debug.out, "result 42\n");
  EXPECT_TRUE(contains(debug.err, kWarning)) << debug.err;
}

TEST(CApiLogging, AnUnknownLevelIsNamedAndTheDefaultApplies) {
  const ProbeRun run = run_probe("verbose");
  ASSERT_EQ(run.exit_status, 0) << run.err;
  EXPECT_EQ(run.out, "result 42\n");
  EXPECT_TRUE(contains(run.err, "SALUS_LOG_LEVEL is 'verbose', which is no level")) << run.err;
  EXPECT_TRUE(contains(run.err, kWarning)) << "the default level (warn) applies: " << run.err;
}

struct Received {
  std::vector<salus_log_level> levels;
  std::vector<std::string> messages;
};

void record(salus_log_level level, const char* message, void* user_data) {
  auto* received = static_cast<Received*>(user_data);
  received->levels.push_back(level);
  received->messages.emplace_back(message);
}

// Makes a runtime, leaves a block in it and destroys it: one warning.
void leave_a_block_at_shutdown() {
  salus_runtime* runtime = nullptr;
  ASSERT_EQ(salus_runtime_create_sim(1, 64 * kMiB, &runtime), SALUS_OK) << salus_last_error();
  void* block = nullptr;
  ASSERT_EQ(salus_allocate(runtime, 4096, 0, nullptr, SALUS_JOB_AUTO, SALUS_PERSISTENT, &block),
            SALUS_OK);
  salus_runtime_destroy(runtime);
}

class CApiLogLevel : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(salus_get_log_level(&saved_), SALUS_OK); }
  void TearDown() override {
    EXPECT_EQ(salus_set_log_callback(nullptr, nullptr), SALUS_OK);
    EXPECT_EQ(salus_set_log_level(saved_), SALUS_OK);
  }
  salus_log_level saved_ = SALUS_LOG_WARN;
};

TEST_F(CApiLogLevel, ACallbackReceivesMessagesWithTheirLevel) {
  ASSERT_EQ(salus_set_log_level(SALUS_LOG_WARN), SALUS_OK);
  Received received;
  ASSERT_EQ(salus_set_log_callback(&record, &received), SALUS_OK) << salus_last_error();
  leave_a_block_at_shutdown();
  ASSERT_EQ(received.messages.size(), 1u);
  EXPECT_EQ(received.levels[0], SALUS_LOG_WARN);
  EXPECT_TRUE(contains(received.messages[0], kWarning)) << received.messages[0];
  EXPECT_FALSE(contains(received.messages[0], "salus:")) << "no prefix: the callback knows";

  // Below the level, nothing arrives; uninstalled, nothing arrives either.
  ASSERT_EQ(salus_set_log_level(SALUS_LOG_ERROR), SALUS_OK);
  salus_log_level level = SALUS_LOG_TRACE;
  ASSERT_EQ(salus_get_log_level(&level), SALUS_OK);
  EXPECT_EQ(level, SALUS_LOG_ERROR);
  leave_a_block_at_shutdown();
  EXPECT_EQ(received.messages.size(), 1u);
  ASSERT_EQ(salus_set_log_level(SALUS_LOG_WARN), SALUS_OK);
  ASSERT_EQ(salus_set_log_callback(nullptr, nullptr), SALUS_OK);
  ::testing::internal::CaptureStderr();
  leave_a_block_at_shutdown();
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(received.messages.size(), 1u);
  EXPECT_TRUE(contains(err, kWarning)) << "standard error again: " << err;
}

}  // namespace
