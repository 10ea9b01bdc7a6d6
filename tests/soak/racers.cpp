#include "soak/racers.hpp"

#include <cstdio>
#include <string>

#include "salus/sim.hpp"
#include "soak/holder.hpp"
#include "soak/stamps.hpp"

namespace salus::soak {

AllocationRace::AllocationRace(SoakShared shared, RaceConfig config)
    : shared_(shared), config_(config), streams_(static_cast<std::size_t>(config.devices)) {}

AllocationRace::~AllocationRace() {
  stop();
  retire_streams();
}

void AllocationRace::start() {
  if (config_.threads <= 0) return;
  for (int i = 0; i < config_.threads; ++i) threads_.emplace_back([this, i] { racer(i); });
  threads_.emplace_back([this] { coordinator(); });
}

void AllocationRace::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  changed_.notify_all();
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

void AllocationRace::retire_streams() {
  for (std::size_t device = 0; device < streams_.size(); ++device) {
    if (streams_[device].value == 0) continue;
    shared_.runtime.memory().retire_stream(static_cast<int>(device), streams_[device]);
    shared_.runtime.backend().destroy_stream(streams_[device]);
    streams_[device] = {};
  }
}

void AllocationRace::coordinator() {
  Heartbeat& beat = shared_.watchdog.enroll("soak-race-end");
  std::mt19937_64 rng(config_.seed ^ 0x5ACE5ACE5ACEull);
  for (std::uint64_t number = 1;; ++number) {
    {
      std::lock_guard lock(mu_);
      if (stopping_) break;
    }
    beat.beat(Phase::working);
    run_round(number, rng, beat);
    // A pause three rounds long on average, the racers idle: they spin only around a job's
    // end, and leave the two shared cores to the slots most of the time.
    std::this_thread::sleep_for(std::chrono::milliseconds(
        rng() % static_cast<std::uint64_t>(6 * config_.max_round.count())));
  }
  beat.beat(Phase::done);
}

void AllocationRace::run_round(std::uint64_t number, std::mt19937_64& rng, Heartbeat& beat) {
  JobSpec spec;
  spec.name = "race" + std::to_string(number);
  spec.device = static_cast<int>(rng() % static_cast<std::uint64_t>(config_.devices));
  spec.blocks_outlive_job = shared_.blocks_outlive_job;
  StreamHandle& stream = streams_[static_cast<std::size_t>(spec.device)];
  if (stream.value == 0) stream = shared_.runtime.backend().create_stream(spec.device, 0);
  Job job = shared_.runtime.add_job(spec);
  shared_.runtime.bind_stream(spec.device, stream, job.id());
  bool stopped = false;
  {
    std::lock_guard lock(mu_);
    // A stop that came since the coordinator last looked may have let the racers go already
    // (each leaves when it sees the stop and no new round): a round published now would wait
    // for them for ever. Under the same lock as the racers' check, so one of the two wins.
    stopped = stopping_;
    if (!stopped) {
      id_ = job.id();
      job_.emplace(std::move(job));
      device_ = spec.device;
      stream_ = stream;
      ended_by_.store(EndedBy::none);
      racing_ = config_.threads;
      round_ = number;
    }
  }
  if (stopped) {
    job.leave();
    return;
  }
  changed_.notify_all();
  std::this_thread::sleep_for(
      std::chrono::milliseconds(1 + rng() % static_cast<std::uint64_t>(config_.max_round.count())));
  const EndedBy how = rng() % 3 == 0 ? EndedBy::leave : EndedBy::cancel;
  {
    std::unique_lock gate(gate_);
    ended_by_.store(how);
    if (how == EndedBy::cancel) {
      job_->cancel();
    } else {
      job_->leave();
    }
  }
  shared_.counters.race_rounds.fetch_add(1, std::memory_order_relaxed);
  std::unique_lock lock(mu_);
  while (racing_ > 0) {
    beat.beat(Phase::working);
    changed_.wait_for(lock, std::chrono::milliseconds(100));
  }
  job_.reset();
  shared_.watchdog.progress(spec.device);
}

void AllocationRace::racer(int index) {
  char name[16];
  std::snprintf(name, sizeof name, "soak-race%d", index);
  Heartbeat& beat = shared_.watchdog.enroll(name);
  std::mt19937_64 rng(config_.seed * 0x9E3779B97F4A7C15ull + static_cast<std::uint64_t>(index));
  std::uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock lock(mu_);
      beat.beat(Phase::idle);
      changed_.wait(lock, [&] { return stopping_ || round_ != seen; });
      if (round_ == seen) break;  // stopping
      seen = round_;
    }
    beat.beat(Phase::working);
    race(rng, beat);
    {
      std::lock_guard lock(mu_);
      --racing_;
    }
    changed_.notify_all();
  }
  beat.beat(Phase::done);
}

bool AllocationRace::stamp(const Block& block) {
  if (shared_.blocks_outlive_job) {
    write_stamps(block.ptr, block.bytes, block.tag);
    return true;
  }
  std::shared_lock gate(gate_);
  if (ended_by_.load() != EndedBy::none) return false;
  write_stamps(block.ptr, block.bytes, block.tag);
  return true;
}

bool AllocationRace::check(const Block& block) {
  std::shared_lock gate(gate_, std::defer_lock);
  if (!shared_.blocks_outlive_job) {
    gate.lock();
    if (ended_by_.load() != EndedBy::none) return false;
  }
  shared_.counters.blocks_checked.fetch_add(1, std::memory_order_relaxed);
  if (stamps_intact(block.ptr, block.bytes, block.tag)) return true;
  shared_.counters.mismatches.fetch_add(1);
  char text[160];
  std::snprintf(text, sizeof text,
                "race job: block 0x%llx (%zu bytes) does not read back its stamps",
                static_cast<unsigned long long>(block.ptr), block.bytes);
  shared_.log.note(text);
  return true;
}

// One round: allocate and free until the job's end answers.
void AllocationRace::race(std::mt19937_64& rng, Heartbeat& beat) {
  Job& job = *job_;  // stays until every racer is done with the round
  const std::string name = job.name();
  Counters& c = shared_.counters;
  std::vector<Block> mine;
  for (;;) {
    beat.beat(Phase::working);
    const std::size_t bytes = 512 + rng() % (512 * KiB);
    const bool on_bound = rng() % 2 == 0;
    DevicePtr ptr = 0;
    try {
      // Now and then the stream is bound again (a framework thread making it current): that
      // call races the job's end too, and must answer it as the allocations do.
      if (rng() % 8 == 0) shared_.runtime.bind_stream(device_, stream_, id_);
      ptr = on_bound ? shared_.runtime.allocate(bytes, device_, stream_, id_) : job.allocate(bytes);
    } catch (const OutOfMemory&) {
      c.out_of_memory.fetch_add(1, std::memory_order_relaxed);
      continue;
    } catch (const std::exception& e) {
      c.race_lost.fetch_add(1, std::memory_order_relaxed);
      count_answer(shared_, ended_by_.load(), e, name + ": racing allocation or bind_stream");
      break;
    }
    c.race_allocations.fetch_add(1, std::memory_order_relaxed);
    const Block block{ptr, bytes, next_tag_.fetch_add(1), device_,
                      on_bound ? stream_ : StreamHandle{}};
    if (!stamp(block)) break;
    mine.push_back(block);
    if (mine.size() <= 3) continue;
    const std::size_t victim = rng() % mine.size();
    if (!check(mine[victim])) break;
    try {
      job.deallocate(mine[victim].ptr);
    } catch (const std::exception& e) {
      count_answer(shared_, ended_by_.load(), e, name + ": racing free");
      break;
    }
    mine.erase(mine.begin() + static_cast<std::ptrdiff_t>(victim));
  }
  // With blocks_outlive_job what this racer still holds is valid and its to free; otherwise the
  // job's end freed it.
  if (shared_.blocks_outlive_job) {
    for (const Block& block : mine) shared_.holder.free_now({block, name, std::nullopt, nullptr});
  }
}

}  // namespace salus::soak
