// salus_job_try_begin_iteration and salus_job_withdraw through the shared library: a wait with a
// time limit keeps the job's place; withdrawing ends it, handing back a turn granted meanwhile.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <string>
#include <thread>

#include "abi/c_api_fixture.hpp"

namespace {

TEST_F(CApi, TryBeginWaitsAtMostItsTimeoutAndKeepsThePlace) {
  const uint32_t holder = add_job("holder");
  const uint32_t waiter = add_job("waiter");
  ASSERT_EQ(salus_job_begin_iteration(runtime, holder, nullptr), SALUS_OK);
  int begun = -1;
  void* stream = reinterpret_cast<void*>(0x1);
  const auto before = std::chrono::steady_clock::now();
  ASSERT_EQ(salus_job_try_begin_iteration(runtime, waiter, 0.02, &stream, &begun), SALUS_OK)
      << salus_last_error();
  EXPECT_GE(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(20));
  EXPECT_EQ(begun, 0);
  EXPECT_EQ(stream, nullptr);
  EXPECT_EQ(job_stats(waiter).state, SALUS_JOB_WAITING) << "still queued";
  ASSERT_EQ(salus_job_end_iteration(runtime, holder), SALUS_OK);
  ASSERT_EQ(salus_job_try_begin_iteration(runtime, waiter, 5.0, &stream, &begun), SALUS_OK);
  EXPECT_EQ(begun, 1);
  EXPECT_NE(stream, nullptr);
  EXPECT_EQ(job_stats(waiter).state, SALUS_JOB_RUNNING);
  ASSERT_EQ(salus_job_end_iteration(runtime, waiter), SALUS_OK);
  EXPECT_EQ(job_stats(waiter).iterations, 1u);
}

TEST_F(CApi, WithdrawEndsAPendingWaitAndHandsBackAGrantedTurn) {
  const uint32_t holder = add_job("holder");
  const uint32_t waiter = add_job("waiter");
  int begun = -1;
  EXPECT_EQ(salus_job_withdraw(runtime, waiter), SALUS_OK) << "idle: nothing to do";
  ASSERT_EQ(salus_job_begin_iteration(runtime, holder, nullptr), SALUS_OK);
  ASSERT_EQ(salus_job_try_begin_iteration(runtime, waiter, 0.0, nullptr, &begun), SALUS_OK);
  ASSERT_EQ(begun, 0);
  EXPECT_EQ(salus_job_withdraw(runtime, holder), SALUS_ERROR_INVALID_ARGUMENT) << "running";
  ASSERT_EQ(salus_job_end_iteration(runtime, holder), SALUS_OK);  // grants the waiter its turn
  ASSERT_EQ(salus_job_withdraw(runtime, waiter), SALUS_OK) << salus_last_error();
  EXPECT_EQ(job_stats(waiter).state, SALUS_JOB_IDLE);
  EXPECT_EQ(job_stats(waiter).iterations, 0u);
  // The lane is free: the holder's next turn comes at once.
  ASSERT_EQ(salus_job_try_begin_iteration(runtime, holder, 0.0, nullptr, &begun), SALUS_OK);
  EXPECT_EQ(begun, 1);
  ASSERT_EQ(salus_job_end_iteration(runtime, holder), SALUS_OK);
}

TEST_F(CApi, WithdrawRefusesWhileAThreadWaitsAndCancelWakesIt) {
  const uint32_t holder = add_job("holder");
  const uint32_t waiter = add_job("waiter");
  ASSERT_EQ(salus_job_begin_iteration(runtime, holder, nullptr), SALUS_OK);
  std::atomic<salus_status> waited{SALUS_OK};
  std::thread t([&] { waited = salus_job_begin_iteration(runtime, waiter, nullptr); });
  while (job_stats(waiter).state != SALUS_JOB_WAITING) std::this_thread::yield();
  std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(salus_job_withdraw(runtime, waiter), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("cancel"), std::string::npos);
  int begun = 0;
  EXPECT_EQ(salus_job_try_begin_iteration(runtime, waiter, 0.0, nullptr, &begun),
            SALUS_ERROR_INVALID_ARGUMENT)
      << "one waiter at a time";
  ASSERT_EQ(salus_job_cancel(runtime, waiter), SALUS_OK);
  t.join();
  EXPECT_EQ(waited.load(), SALUS_ERROR_CANCELLED);
  EXPECT_EQ(salus_job_withdraw(runtime, waiter), SALUS_OK) << "cancelled: nothing to withdraw";
  ASSERT_EQ(salus_job_end_iteration(runtime, holder), SALUS_OK);
}

TEST_F(CApi, TryBeginAndWithdrawRefuseBadInput) {
  const uint32_t job = add_job("a");
  int begun = 0;
  EXPECT_EQ(salus_job_try_begin_iteration(nullptr, job, 0.0, nullptr, &begun),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_job_try_begin_iteration(runtime, job, 0.0, nullptr, nullptr),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_NE(std::string(salus_last_error()).find("begun"), std::string::npos);
  EXPECT_EQ(salus_job_try_begin_iteration(runtime, job, -1.0, nullptr, &begun),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_job_try_begin_iteration(runtime, job, std::nan(""), nullptr, &begun),
            SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_job_try_begin_iteration(runtime, 9999, 0.0, nullptr, &begun),
            SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(salus_job_withdraw(nullptr, job), SALUS_ERROR_INVALID_ARGUMENT);
  EXPECT_EQ(salus_job_withdraw(runtime, 9999), SALUS_ERROR_UNKNOWN_JOB);
  EXPECT_EQ(job_stats(job).state, SALUS_JOB_IDLE) << "a failed call changes nothing";
  // A huge timeout is a plain wait.
  ASSERT_EQ(salus_job_try_begin_iteration(runtime, job, 1e300, nullptr, &begun), SALUS_OK);
  EXPECT_EQ(begun, 1);
  ASSERT_EQ(salus_job_end_iteration(runtime, job), SALUS_OK);
}

}  // namespace
