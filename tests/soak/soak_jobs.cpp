// The soak's job threads and canceller (see soak_jobs.hpp).
//
// Memory a job holds is written and read on the host (the simulated GPUs' memory is host memory),
// as PyTorch's CPU tensors over simulated memory are. A cancel from the canceller frees the job's
// blocks at once, and another job may get those addresses: so every access to a job's memory, and
// the allocation that precedes its first stamp, happens under the slot's mutex after checking that
// the job was not cancelled, and the canceller cancels under the same mutex. Without that gate a
// stamp could land in another job's block and be reported as corruption that Salus did not cause.
//
// Stamps are sparse to spare the CPU (two cores shared by several engineers): one 8-byte word per
// 4 KiB, plus the block's last word, each a hash of the block's tag and the offset. That still
// touches every OS page of every block, so a page moved to a peer or the host and back with the
// wrong bytes, or two live blocks sharing a page, shows up.
#include "soak/soak_jobs.hpp"

#include <chrono>
#include <cstring>
#include <thread>

#include "salus/sim.hpp"

namespace salus::soak {
namespace {

constexpr std::size_t kStampStride = 4096;
constexpr std::size_t kMaxMessages = 10;

std::uint64_t stamp_word(std::uint64_t tag, std::size_t offset) {
  // splitmix64 of (tag, offset): distinct blocks and offsets give unrelated words.
  std::uint64_t z = tag * 0x9E3779B97F4A7C15ull + offset + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Calls fn(offset) for each stamped word of a block of `bytes` (at least 8).
template <class Fn>
void for_each_stamp(std::size_t bytes, Fn&& fn) {
  for (std::size_t offset = 0; offset + sizeof(std::uint64_t) <= bytes; offset += kStampStride) {
    fn(offset);
  }
  fn((bytes - sizeof(std::uint64_t)) & ~std::size_t{7});
}

void write_stamps(DevicePtr ptr, std::size_t bytes, std::uint64_t tag) {
  auto* base = reinterpret_cast<unsigned char*>(ptr);
  for_each_stamp(bytes, [&](std::size_t offset) {
    const std::uint64_t word = stamp_word(tag, offset);
    std::memcpy(base + offset, &word, sizeof word);
  });
}

bool stamps_intact(DevicePtr ptr, std::size_t bytes, std::uint64_t tag) {
  const auto* base = reinterpret_cast<const unsigned char*>(ptr);
  bool intact = true;
  for_each_stamp(bytes, [&](std::size_t offset) {
    std::uint64_t word = 0;
    std::memcpy(&word, base + offset, sizeof word);
    if (word != stamp_word(tag, offset)) intact = false;
  });
  return intact;
}

// Half sub-page blocks (they share pages with other jobs' blocks), half up to `max_bytes`.
std::size_t random_block_size(std::mt19937_64& rng, std::size_t max_bytes) {
  if (rng() % 2 == 0) return 512 + rng() % (256 * KiB);
  return 256 * KiB + rng() % (max_bytes - 256 * KiB + 1);
}

double uniform(std::mt19937_64& rng, double low, double high) {
  return std::uniform_real_distribution<double>(low, high)(rng);
}

// Runs fn with the slot's mutex held, unless the job was cancelled (then its memory is gone).
template <class SlotT, class Fn>
void gated(SlotT& slot, const std::string& job_name, Fn&& fn) {
  std::lock_guard lock(slot.mu);
  if (slot.cancelled) throw JobCancelled(job_name);
  fn();
}

}  // namespace

Population::Population(Runtime& runtime, Watchdog& watchdog, PopulationConfig config)
    : runtime_(runtime),
      watchdog_(watchdog),
      config_(config),
      slots_(static_cast<std::size_t>(config.slots)) {}

Population::~Population() {
  stop(std::chrono::milliseconds(0));
}

void Population::start() {
  started_ns_ = now_ns();
  for (int i = 0; i < config_.slots; ++i) threads_.emplace_back([this, i] { worker(i); });
  threads_.emplace_back([this] { canceller(); });
}

void Population::stop(std::chrono::milliseconds grace) {
  stopping_.store(true);
  const auto deadline = std::chrono::steady_clock::now() + grace;
  auto jobs_present = [this] { return live_jobs() > 0; };
  while (jobs_present() && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Stragglers (a job waiting for a turn that another job's memory blocks): cancel until the
  // workers, who start no new job once stopping, have all gone.
  while (jobs_present()) {
    for (Slot& slot : slots_) cancel_slot(slot, counters_.cancelled_at_shutdown);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
}

int Population::live_jobs() {
  int live = 0;
  for (Slot& slot : slots_) {
    std::lock_guard lock(slot.mu);
    if (slot.job) ++live;
  }
  return live;
}

std::vector<std::string> Population::messages() {
  std::lock_guard lock(messages_mu_);
  return messages_;
}

void Population::note_error(const std::string& text, bool cancel_race) {
  (cancel_race ? counters_.cancel_races : counters_.errors).fetch_add(1);
  std::lock_guard lock(messages_mu_);
  if (messages_.size() < kMaxMessages) {
    messages_.push_back((cancel_race ? "after a cancel: " : "error: ") + text);
  }
}

JobSpec Population::random_spec(const std::string& name, std::mt19937_64& rng) const {
  JobSpec spec;
  spec.name = name;
  spec.kind = rng() % 4 == 0 ? JobKind::inference : JobKind::training;
  spec.priority = static_cast<int>(rng() % 3);
  // Skewed placement (weights devices, devices - 1, ..., 1): the busy devices run out and borrow,
  // the quiet ones have idle pages to lend.
  const int devices = config_.devices;
  std::uint64_t roll = rng() % static_cast<std::uint64_t>(devices * (devices + 1) / 2);
  spec.device = 0;
  for (int weight = devices; roll >= static_cast<std::uint64_t>(weight); --weight) {
    roll -= static_cast<std::uint64_t>(weight);
    ++spec.device;
  }
  spec.expected_iterations = rng() % 2 == 0 ? 0 : 1 + rng() % 50;
  spec.hints.persistent_bytes = rng() % (12 * MiB);
  spec.hints.ephemeral_peak_bytes = rng() % (12 * MiB);
  spec.hints.iteration_seconds = uniform(rng, 0.0005, 0.005);
  return spec;
}

std::optional<Population::Block> Population::allocate_block(Job& job, std::size_t bytes,
                                                            std::optional<Lifetime> lifetime) {
  try {
    const DevicePtr ptr = job.allocate(bytes, lifetime);
    counters_.allocations.fetch_add(1, std::memory_order_relaxed);
    Block block{ptr, bytes, next_tag_.fetch_add(1, std::memory_order_relaxed)};
    write_stamps(block.ptr, block.bytes, block.tag);
    return block;
  } catch (const OutOfMemory&) {
    counters_.out_of_memory.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
}

void Population::check_block(const Block& block, const std::string& job_name) {
  counters_.blocks_checked.fetch_add(1, std::memory_order_relaxed);
  if (stamps_intact(block.ptr, block.bytes, block.tag)) return;
  counters_.mismatches.fetch_add(1);
  char text[160];
  std::snprintf(text, sizeof text, "%s: block 0x%llx (%zu bytes) does not read back its stamps",
                job_name.c_str(), static_cast<unsigned long long>(block.ptr), block.bytes);
  note_error(text, false);
}

void Population::worker(int index) {
  char name[16];
  std::snprintf(name, sizeof name, "soak-job%02d", index);
  Heartbeat& beat = watchdog_.enroll(name);
  std::mt19937_64 rng(config_.seed * 0x100000001B3ull + static_cast<std::uint64_t>(index) + 1);
  while (!stopping_.load()) run_job(index, rng, beat);
  beat.beat(Phase::done);
}

void Population::run_job(int index, std::mt19937_64& rng, Heartbeat& beat) {
  if (index == 0 && config_.simulate_hang_after &&
      static_cast<double>(now_ns() - started_ns_) / 1e9 >= *config_.simulate_hang_after) {
    wedge(beat);
  }
  Slot& slot = slots_[static_cast<std::size_t>(index)];
  const std::string name =
      "slot" + std::to_string(index) + ".job" + std::to_string(counters_.arrived.fetch_add(1) + 1);
  const JobSpec spec = random_spec(name, rng);
  beat.device.store(spec.device);
  beat.beat(Phase::working);
  slot.step = "add_job";
  {
    Job job = runtime_.add_job(spec);
    std::lock_guard lock(slot.mu);
    slot.job.emplace(std::move(job));
    slot.cancelled = false;
    slot.device = spec.device;
  }
  try {
    live(slot, name, rng, beat);
  } catch (const JobCancelled&) {
    // The cancel freed everything the job held; the canceller counted it.
  } catch (const std::exception& e) {
    bool cancelled = false;
    {
      std::lock_guard lock(slot.mu);
      cancelled = slot.cancelled;
    }
    note_error(name + " in " + slot.step + ": " + e.what(), cancelled);
  }
  {
    std::lock_guard lock(slot.mu);
    slot.job.reset();  // leaves, if it has not yet
  }
  watchdog_.progress(spec.device);
  beat.beat(Phase::working);
}

// The job's life between arrival and its end: persistent blocks, iterations, and its fate (leave
// normally, or end inside an iteration). Throws JobCancelled when the canceller got it first.
void Population::live(Slot& slot, const std::string& name, std::mt19937_64& rng, Heartbeat& beat) {
  const int iterations =
      1 + static_cast<int>(rng() % static_cast<std::uint64_t>(config_.max_iterations_per_job));
  const std::uint64_t fate_roll = rng() % 100;
  const Fate fate = fate_roll < 70   ? Fate::leave
                    : fate_roll < 85 ? Fate::leave_mid_iteration
                                     : Fate::drop_mid_iteration;
  const int fate_at = static_cast<int>(rng() % static_cast<std::uint64_t>(iterations));
  std::vector<Block> persistent;
  slot.step = "allocate (persistent)";
  for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) {
    const std::size_t bytes = random_block_size(rng, config_.max_persistent_block);
    gated(slot, name, [&] {
      if (auto block = allocate_block(*slot.job, bytes, std::nullopt)) persistent.push_back(*block);
    });
  }
  bool ended_inside = false;
  for (int it = 0; it < iterations && !stopping_.load() && !ended_inside; ++it) {
    const bool end_inside = fate != Fate::leave && it == fate_at;
    ended_inside = !run_iteration(slot, name, rng, beat, persistent, end_inside, fate);
  }
  if (!ended_inside) {
    // Free some persistent blocks by hand; leave() frees the rest.
    slot.step = "deallocate and leave";
    gated(slot, name, [&] {
      for (const Block& block : persistent) {
        check_block(block, name);
        if (rng() % 2 == 0) slot.job->deallocate(block.ptr);
      }
      slot.job->leave();
    });
    counters_.left_normally.fetch_add(1);
  }
}

bool Population::run_iteration(Slot& slot, const std::string& name, std::mt19937_64& rng,
                               Heartbeat& beat, std::vector<Block>& persistent, bool end_inside,
                               Fate fate) {
  slot.step = "begin_iteration";
  beat.beat(Phase::waiting_turn);
  const StreamHandle stream = slot.job->begin_iteration();
  beat.beat(Phase::working);
  // The job's pages may have moved to a peer or the host while it waited, and come back.
  gated(slot, name, [&] {
    for (const Block& block : persistent) check_block(block, name);
  });
  slot.step = "iteration body";
  std::vector<Block> ephemeral;
  const int device = slot.device;
  for (int phase = 1 + static_cast<int>(rng() % 3); phase > 0; --phase) {
    for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) {
      const std::size_t bytes = random_block_size(rng, config_.max_ephemeral_block);
      gated(slot, name, [&] {
        if (auto block = allocate_block(*slot.job, bytes, std::nullopt))
          ephemeral.push_back(*block);
      });
    }
    if (config_.kernels) {
      launch_sim_kernel(runtime_.backend(), stream, device, uniform(rng, 20e-6, 400e-6),
                        uniform(rng, 0.25, 1.0));
      counters_.kernels.fetch_add(1, std::memory_order_relaxed);
    }
    // Check everything, then free about half of this iteration's blocks.
    gated(slot, name, [&] {
      std::vector<Block> kept;
      for (const Block& block : ephemeral) {
        check_block(block, name);
        if (rng() % 2 == 0) {
          slot.job->deallocate(block.ptr);
        } else {
          kept.push_back(block);
        }
      }
      ephemeral = std::move(kept);
    });
    beat.beat(Phase::working);
  }
  if (end_inside) {
    slot.step = "leave inside an iteration";
    // Leaves with ephemeral blocks live and (perhaps) kernels queued: the runtime frees them.
    gated(slot, name, [&] {
      if (fate == Fate::leave_mid_iteration) {
        slot.job->leave();
      } else {
        slot.job.reset();
      }
    });
    (fate == Fate::leave_mid_iteration ? counters_.left_mid_iteration
                                       : counters_.dropped_mid_iteration)
        .fetch_add(1);
    return false;
  }
  gated(slot, name, [&] {
    for (const Block& block : ephemeral) {
      check_block(block, name);
      slot.job->deallocate(block.ptr);
    }
    for (Block& block : persistent) {  // what the next iteration must find
      block.tag = next_tag_.fetch_add(1, std::memory_order_relaxed);
      write_stamps(block.ptr, block.bytes, block.tag);
    }
  });
  // As a training loop reading its loss: the host does not run ahead of the device without
  // bound (the simulated streams queue whatever they are given).
  slot.step = "synchronize_stream";
  runtime_.backend().synchronize_stream(stream);
  slot.step = "end_iteration";
  slot.job->end_iteration();
  counters_.iterations.fetch_add(1, std::memory_order_relaxed);
  watchdog_.progress(device);
  return true;
}

void Population::canceller() {
  Heartbeat& beat = watchdog_.enroll("soak-cancel");
  std::mt19937_64 rng(config_.seed ^ 0xC4A05C4A05ull);
  const auto max_ms = static_cast<std::uint64_t>(config_.cancel_interval_max.count());
  while (!stopping_.load()) {
    beat.beat(Phase::working);
    std::this_thread::sleep_for(std::chrono::milliseconds(1 + rng() % max_ms));
    cancel_slot(slots_[rng() % slots_.size()], counters_.cancelled);
  }
  beat.beat(Phase::done);
}

bool Population::cancel_slot(Slot& slot, std::atomic<std::uint64_t>& tally) {
  std::lock_guard lock(slot.mu);
  if (!slot.job || slot.cancelled) return false;
  slot.cancelled = true;
  try {
    slot.job->cancel();
  } catch (const std::exception& e) {
    note_error(std::string("cancel: ") + e.what(), false);
  }
  tally.fetch_add(1);
  watchdog_.progress(slot.device);
  return true;
}

void Population::wedge(Heartbeat& beat) {
  std::fprintf(stderr, "soak: --simulate-hang: thread '%s' wedges now\n", beat.name.c_str());
  beat.beat(Phase::working);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace salus::soak
