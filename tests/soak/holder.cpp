#include "soak/holder.hpp"

#include <cstdio>
#include <utility>
#include <vector>

#include "soak/stamps.hpp"

namespace salus::soak {

Holder::Holder(Runtime& runtime, Counters& counters, ErrorLog& log)
    : runtime_(runtime), counters_(counters), log_(log) {}

Holder::~Holder() {
  stop();
}

void Holder::start(Watchdog& watchdog) {
  thread_ = std::thread([this, &watchdog] { run(watchdog.enroll("soak-holder")); });
}

void Holder::hold(HeldBlock held, std::chrono::microseconds delay) {
  {
    std::lock_guard lock(mu_);
    queue_.emplace(std::chrono::steady_clock::now() + delay, std::move(held));
  }
  wake_.notify_one();
}

std::size_t Holder::held() {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void Holder::free_now(const HeldBlock& held) {
  const Block& b = held.block;
  if (!held.job) {
    // Valid until this free, whatever became of its job.
    counters_.blocks_checked.fetch_add(1, std::memory_order_relaxed);
    if (!stamps_intact(b.ptr, b.bytes, b.tag)) {
      counters_.mismatches.fetch_add(1);
      char text[160];
      std::snprintf(text, sizeof text,
                    "%s: block 0x%llx (%zu bytes) changed while its holder still held it",
                    held.job_name.c_str(), static_cast<unsigned long long>(b.ptr), b.bytes);
      log_.note(text);
    }
  }
  try {
    runtime_.deallocate(b.ptr, MemoryManager::FreeCheck{b.bytes, b.device, held.job});
    counters_.held_frees.fetch_add(1, std::memory_order_relaxed);
  } catch (const InvalidArgument& e) {
    if (held.job && held.ended && held.ended->load()) {
      counters_.held_frees_refused.fetch_add(1, std::memory_order_relaxed);
      return;
    }
    counters_.errors.fetch_add(1);
    log_.note("error: holder's free of a block of " + held.job_name + ": " + e.what());
  } catch (const std::exception& e) {
    counters_.errors.fetch_add(1);
    log_.note("error: holder's free of a block of " + held.job_name + ": " + e.what());
  }
}

void Holder::stop() {
  std::multimap<std::chrono::steady_clock::time_point, HeldBlock> rest;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  {
    std::lock_guard lock(mu_);
    rest.swap(queue_);
  }
  for (const auto& [due, held] : rest) free_now(held);
}

void Holder::run(Heartbeat& beat) {
  std::unique_lock lock(mu_);
  while (!stopping_) {
    beat.beat(Phase::working);
    const auto now = std::chrono::steady_clock::now();
    std::vector<HeldBlock> due;
    while (!queue_.empty() && queue_.begin()->first <= now) {
      due.push_back(std::move(queue_.begin()->second));
      queue_.erase(queue_.begin());
    }
    if (!due.empty()) {
      lock.unlock();
      for (const HeldBlock& held : due) free_now(held);
      lock.lock();
      continue;
    }
    const auto next = queue_.empty() ? now + std::chrono::milliseconds(100) : queue_.begin()->first;
    wake_.wait_until(lock, next);
  }
  beat.beat(Phase::done);
}

}  // namespace salus::soak
