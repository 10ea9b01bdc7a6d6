// One connected process, as the coordinator sees it: who it is, how to reach it, its jobs, and
// the worker threads that run its blocking requests. The SessionTable keeps them.
#pragma once

#include <fmt/format.h>

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "daemon/page_bank.hpp"
#include "remote/channel.hpp"
#include "remote/protocol.hpp"
#include "salus/runtime.hpp"

namespace salus::daemon {

// Runs a session's blocking requests (a wait for a turn, for pages), each on a thread of the
// pool: a request blocks only its own thread, never the connection's reader. Threads stay for
// the next request (a turn a round costs no thread creation) and grow in number only while
// that many requests block at once (one per job waiting for its turn, plus page requests).
class Workers {
 public:
  Workers() = default;
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() { join(); }

  // Runs `task` on a thread of the pool, unless `limit` tasks are queued or running already:
  // false then, and nothing runs.
  bool run(std::function<void()> task, std::size_t limit) {
    std::lock_guard lock(mu_);
    if (tasks_.size() + running_ >= limit) return false;
    tasks_.push_back(std::move(task));
    if (idle_ == 0) {
      threads_.emplace_back([this] { loop(); });
    } else {
      cv_.notify_one();
    }
    return true;
  }
  // Runs what is queued, then ends every thread.
  void join() {
    std::vector<std::thread> threads;
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
      threads.swap(threads_);
    }
    cv_.notify_all();
    for (std::thread& t : threads) t.join();
  }

 private:
  void loop() {
    std::unique_lock lock(mu_);
    for (;;) {
      ++idle_;
      cv_.wait(lock, [&] { return stopping_ || !tasks_.empty(); });
      --idle_;
      if (tasks_.empty()) return;  // stopping, nothing left
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      ++running_;
      lock.unlock();
      task();
      task = nullptr;  // what it captured goes before the lock is taken again
      lock.lock();
      --running_;
    }
  }

  std::mutex mu_;  // a leaf lock
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  std::vector<std::thread> threads_;
  int idle_ = 0;
  std::size_t running_ = 0;
  bool stopping_ = false;
};

struct Session {
  // Delivers a record (and descriptors) to the process; may throw when it is gone.
  using Sender = std::function<void(std::span<const std::byte>, std::span<const int>)>;

  SessionId id = 0;
  std::uint64_t token = 0;  // what its turn connections name (Welcome, AttachTurns)
  remote::PeerCredentials peer;
  Sender send;
  // The process, held from its first record (a pid may name another process by the time it hung
  // up): its exit is what frees its pages (ExitWatch::wait_for_exit). Empty for the daemon's
  // own process (a coordinator in a test) and when it could not be opened.
  remote::UniqueFd pidfd;
  // Guarded by the SessionTable's lock. What the page waits read of the process (its jobs' limits
  // and turns, its hang-up) is the PageLedger's, under the ledger's lock.
  bool greeted = false;
  std::string name;  // its hello's (also read unlocked by its own connection's thread)
  bool closing = false;
  std::map<std::uint64_t, std::shared_ptr<Job>> jobs;  // by the daemon's job id
  // Each turn connection's hang-up, run when the session closes.
  std::vector<std::function<void()>> hang_ups;

  // A process may have this many blocking requests (page asks, turns asked on this connection)
  // in the daemon at once, each on a thread: more are refused, not given threads without bound.
  static constexpr std::size_t kMaxBlocking = 64;
  Workers workers;
  // Runs `fn` on a worker; throws InvalidArgument when kMaxBlocking requests wait already.
  void spawn(std::function<void()> fn) {
    if (!workers.run(std::move(fn), kMaxBlocking)) {
      throw InvalidArgument(fmt::format(
          "process {} has {} requests waiting in salusd already (the most at once)", peer.pid,
          kMaxBlocking));
    }
  }
  void join_workers() { workers.join(); }
};

}  // namespace salus::daemon
