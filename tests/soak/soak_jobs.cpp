// The soak's job threads and canceller (see soak_jobs.hpp).
//
// Memory a job holds is written and read on the host (the simulated GPUs' memory is host memory),
// as PyTorch's CPU tensors over simulated memory are: every allocation is a CPU consumer, stamped
// at once, so a block handed on while another stream's work on it is still queued shows up.
//
// Two modes (JobSpec::blocks_outlive_job):
// - release (off): a cancel or a leave from the canceller frees the job's blocks at once, and
//   another job may get those addresses. So every host access to a job's memory happens under
//   the slot's mutex after checking that no other thread ended the job, and the canceller ends
//   jobs under the same mutex. Without that gate a stamp could land in another job's block and
//   be reported as corruption that Salus did not cause.
// - outlive (on): the job's blocks stay valid until their holder frees them, so host accesses
//   need no gate; after the job's end its thread frees what it still holds, or hands it to the
//   holder's thread.
// In both modes a reader is enqueued on a stream only under the mutex, while the job lives: the
// job's end must order the job's memory after that reader (and Salus cannot know of work
// enqueued on a stream after the job's end).
#include "soak/soak_jobs.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <utility>

#include "salus/sim.hpp"
#include "soak/holder.hpp"
#include "soak/stamps.hpp"

namespace salus::soak {

Population::Population(SoakShared shared, PopulationConfig config)
    : shared_(shared), config_(config), slots_(static_cast<std::size_t>(config.slots)) {
  for (Slot& slot : slots_) {
    slot.streams.assign(static_cast<std::size_t>(config.devices), StreamHandle{});
    slot.ended = std::make_shared<std::atomic<bool>>(true);
  }
}

Population::~Population() {
  stop(std::chrono::milliseconds(0));
  retire_streams();
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
    for (Slot& slot : slots_)
      end_slot(slot, EndedBy::cancel, shared_.counters.cancelled_at_shutdown);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  threads_.clear();
  // Queued readers point into the slots: they run once the kernels ahead of them are done.
  for (Slot& slot : slots_) {
    for (const StreamHandle stream : slot.streams) {
      if (stream.value != 0) shared_.runtime.backend().synchronize_stream(stream);
    }
  }
  const auto readers_deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  for (Slot& slot : slots_) {
    while (slot.readers.load() > 0 && std::chrono::steady_clock::now() < readers_deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (slot.readers.load() > 0) {
      shared_.error("stream readers still queued 30 s after the last job left");
      std::fflush(stdout);
      std::_Exit(1);  // they would read a destroyed population
    }
  }
}

void Population::retire_streams() {
  for (Slot& slot : slots_) {
    for (std::size_t device = 0; device < slot.streams.size(); ++device) {
      StreamHandle& stream = slot.streams[device];
      if (stream.value == 0) continue;
      shared_.runtime.memory().retire_stream(static_cast<int>(device), stream);
      shared_.runtime.backend().destroy_stream(stream);
      stream = {};
    }
  }
}

int Population::live_jobs() {
  int live = 0;
  for (Slot& slot : slots_) {
    std::lock_guard lock(slot.mu);
    if (slot.job) ++live;
  }
  return live;
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
  spec.blocks_outlive_job = shared_.blocks_outlive_job;
  return spec;
}

template <class Fn>
void Population::while_alive(Slot& slot, Fn&& fn) {
  std::lock_guard lock(slot.mu);
  if (slot.ended_by != EndedBy::none) throw Ended{};
  fn();
}

template <class Fn>
void Population::gated(Slot& slot, Fn&& fn) {
  if (shared_.blocks_outlive_job) {
    fn();
  } else {
    while_alive(slot, std::forward<Fn>(fn));
  }
}

StreamHandle Population::framework_stream(Slot& slot, int device) {
  StreamHandle& stream = slot.streams[static_cast<std::size_t>(device)];
  if (stream.value == 0) stream = shared_.runtime.backend().create_stream(device, 0);
  return stream;
}

std::optional<Block> Population::allocate_block(Slot& slot, std::size_t bytes, bool on_bound) {
  const StreamHandle bound = slot.streams[static_cast<std::size_t>(slot.device)];
  DevicePtr ptr = 0;
  try {
    // Not under the gate: allocations race the canceller's cancels and leaves.
    ptr = on_bound ? shared_.runtime.allocate(bytes, slot.device, bound, slot.id)
                   : slot.job->allocate(bytes);
  } catch (const OutOfMemory&) {
    shared_.counters.out_of_memory.fetch_add(1, std::memory_order_relaxed);
    return std::nullopt;
  }
  shared_.counters.allocations.fetch_add(1, std::memory_order_relaxed);
  Block block{ptr, bytes, next_tag_.fetch_add(1, std::memory_order_relaxed), slot.device,
              on_bound ? bound : StreamHandle{}};
  gated(slot, [&] { write_stamps(block.ptr, block.bytes, block.tag); });
  return block;
}

void Population::check_block(const Block& block, const std::string& job_name) {
  shared_.counters.blocks_checked.fetch_add(1, std::memory_order_relaxed);
  if (stamps_intact(block.ptr, block.bytes, block.tag)) return;
  shared_.counters.mismatches.fetch_add(1);
  char text[160];
  std::snprintf(text, sizeof text, "%s: block 0x%llx (%zu bytes) does not read back its stamps",
                job_name.c_str(), static_cast<unsigned long long>(block.ptr), block.bytes);
  shared_.log.note(text);
}

void Population::worker(int index) {
  char name[16];
  std::snprintf(name, sizeof name, "soak-job%02d", index);
  Heartbeat& beat = shared_.watchdog.enroll(name);
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
  const std::string name = "slot" + std::to_string(index) + ".job" +
                           std::to_string(shared_.counters.arrived.fetch_add(1) + 1);
  const JobSpec spec = random_spec(name, rng);
  beat.device.store(spec.device);
  beat.beat(Phase::working);
  Held held;
  try {
    join_job(slot, spec);
    live(slot, name, rng, beat, held);
  } catch (const Ended&) {
    // Another thread ended the job; its thread noticed at the gate, before Salus said so.
  } catch (const std::exception& e) {
    EndedBy how = EndedBy::none;
    {
      std::lock_guard lock(slot.mu);
      how = slot.ended_by;
    }
    count_answer(shared_, how, e, name + " in " + slot.step);
  }
  slot.step = "after the job's end";
  let_go(slot, name, rng, held);
  {
    std::lock_guard lock(slot.mu);
    slot.ended->store(true);
    slot.job.reset();  // leaves, if it has not yet
  }
  shared_.watchdog.progress(spec.device);
  beat.beat(Phase::working);
}

void Population::join_job(Slot& slot, const JobSpec& spec) {
  slot.step = "add_job";
  Job job = shared_.runtime.add_job(spec);
  const JobId id = job.id();
  const StreamHandle bound = framework_stream(slot, spec.device);
  {
    std::lock_guard lock(slot.mu);
    slot.job.emplace(std::move(job));
    slot.ended_by = EndedBy::none;
    slot.left = false;
    slot.ended = std::make_shared<std::atomic<bool>>(false);
    slot.id = id;
    slot.device = spec.device;
  }
  // The canceller may have got the job already: then this is its first answer.
  slot.step = "bind_stream";
  shared_.runtime.bind_stream(spec.device, bound, id);
}

// The job's life between arrival and its end: persistent and shared blocks, iterations, and its
// fate (leave normally, or end inside an iteration). Throws when another thread ended it first.
void Population::live(Slot& slot, const std::string& name, std::mt19937_64& rng, Heartbeat& beat,
                      Held& held) {
  const int iterations =
      1 + static_cast<int>(rng() % static_cast<std::uint64_t>(config_.max_iterations_per_job));
  const std::uint64_t fate_roll = rng() % 100;
  const Fate fate = fate_roll < 70   ? Fate::leave
                    : fate_roll < 85 ? Fate::leave_mid_iteration
                                     : Fate::drop_mid_iteration;
  const int fate_at = static_cast<int>(rng() % static_cast<std::uint64_t>(iterations));
  slot.step = "allocate (persistent)";
  for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) {
    const std::size_t bytes = random_block_size(rng, config_.max_persistent_block);
    if (auto block = allocate_block(slot, bytes, rng() % 4 == 0)) {
      held.persistent.push_back(*block);
    }
  }
  if (config_.stream_readers) {
    slot.step = "allocate (shared)";
    for (int n = 1 + static_cast<int>(rng() % 2); n > 0; --n) {
      const std::size_t bytes = random_block_size(rng, config_.max_persistent_block / 2);
      if (auto block = allocate_block(slot, bytes, rng() % 2 == 0)) {
        held.shared.push_back(*block);
      }
    }
  }
  bool ended_inside = false;
  for (int it = 0; it < iterations && !stopping_.load() && !ended_inside; ++it) {
    const bool end_inside = fate != Fate::leave && it == fate_at;
    ended_inside = !run_iteration(slot, name, rng, beat, held, end_inside, fate);
  }
  if (ended_inside) return;
  slot.step = "deallocate and leave";
  gated(slot, [&] {
    for (const Block& block : held.persistent) check_block(block, name);
    for (const Block& block : held.shared) check_block(block, name);
  });
  // Some blocks by hand (shared ones perhaps with readers queued); leave() frees, or with
  // blocks_outlive_job hands on, the rest.
  for (std::vector<Block>* blocks : {&held.persistent, &held.shared}) {
    while (!blocks->empty() && rng() % 2 == 0) {
      slot.job->deallocate(blocks->back().ptr);
      blocks->pop_back();
    }
  }
  leave_by_itself(slot, false);
  shared_.counters.left_normally.fetch_add(1);
}

bool Population::run_iteration(Slot& slot, const std::string& name, std::mt19937_64& rng,
                               Heartbeat& beat, Held& held, bool end_inside, Fate fate) {
  if (rng() % 2 == 0) {
    // As a framework that binds its stream again before each step: the canceller's cancels and
    // leaves race this call too.
    slot.step = "bind_stream (again)";
    shared_.runtime.bind_stream(slot.device, slot.streams[static_cast<std::size_t>(slot.device)],
                                slot.id);
  }
  slot.step = "begin_iteration";
  beat.beat(Phase::waiting_turn);
  const StreamHandle lane = slot.job->begin_iteration();
  beat.beat(Phase::working);
  // The job's pages may have moved to a peer or the host while it waited, and come back.
  gated(slot, [&] {
    for (const Block& block : held.persistent) check_block(block, name);
    for (const Block& block : held.shared) check_block(block, name);
  });
  slot.step = "iteration body";
  for (int phase = 1 + static_cast<int>(rng() % 3); phase > 0; --phase) {
    for (int n = 1 + static_cast<int>(rng() % 3); n > 0; --n) {
      const std::size_t bytes = random_block_size(rng, config_.max_ephemeral_block);
      if (auto block = allocate_block(slot, bytes, rng() % 4 == 0)) {
        held.ephemeral.push_back(*block);
      }
    }
    if (config_.kernels) {
      launch_sim_kernel(shared_.runtime.backend(), lane, slot.device, uniform(rng, 20e-6, 400e-6),
                        uniform(rng, 0.25, 1.0));
      shared_.counters.kernels.fetch_add(1, std::memory_order_relaxed);
    }
    if (config_.stream_readers) use_on_second_stream(slot, name, rng, lane, held);
    gated(slot, [&] {
      for (const Block& block : held.ephemeral) check_block(block, name);
    });
    free_ephemeral(slot, name, rng, held, false);
    beat.beat(Phase::working);
  }
  if (end_inside) {
    slot.step = "leave inside an iteration";
    // Leaves with ephemeral blocks live and (perhaps) kernels and readers queued.
    leave_by_itself(slot, fate == Fate::drop_mid_iteration);
    (fate == Fate::leave_mid_iteration ? shared_.counters.left_mid_iteration
                                       : shared_.counters.dropped_mid_iteration)
        .fetch_add(1);
    return false;
  }
  free_ephemeral(slot, name, rng, held, true);
  gated(slot, [&] {
    for (Block& block : held.persistent) {  // what the next iteration must find
      block.tag = next_tag_.fetch_add(1, std::memory_order_relaxed);
      write_stamps(block.ptr, block.bytes, block.tag);
    }
  });
  // As a training loop reading its loss: the host does not run ahead of the device without
  // bound (the simulated streams queue whatever they are given).
  slot.step = "synchronize_stream";
  shared_.runtime.backend().synchronize_stream(lane);
  slot.step = "end_iteration";
  slot.job->end_iteration();
  shared_.counters.iterations.fetch_add(1, std::memory_order_relaxed);
  shared_.watchdog.progress(slot.device);
  return true;
}

// A block that lives on the lane is read on the bound stream, one that lives on the bound
// stream on the lane: either way not on its own stream, so only the job's other streams (which
// Salus was told of: bind_stream, begin_iteration) order its reuse after the reader.
void Population::use_on_second_stream(Slot& slot, const std::string& name, std::mt19937_64& rng,
                                      StreamHandle lane, Held& held) {
  const StreamHandle bound = slot.streams[static_cast<std::size_t>(slot.device)];
  // The bound stream is never synchronized otherwise: keep its queue short.
  if (slot.readers.load() >= 3) shared_.runtime.backend().synchronize_stream(bound);
  std::vector<Block> picks;
  for (const std::vector<Block>* blocks : {&held.shared, &held.ephemeral}) {
    for (const Block& block : *blocks) {
      if (rng() % 3 == 0) picks.push_back(block);
    }
  }
  if (picks.empty()) return;
  slot.step = "enqueue readers";
  while_alive(slot, [&] {
    for (const Block& block : picks) {
      const StreamHandle second = block.home.value != 0 ? lane : bound;
      enqueue_reader(shared_, second, block, uniform(rng, 0.2e-3, 3e-3), name, slot.readers);
    }
  });
  slot.step = "iteration body";
}

void Population::free_ephemeral(Slot& slot, const std::string& name, std::mt19937_64& rng,
                                Held& held, bool all) {
  std::vector<Block> kept;
  std::size_t i = 0;
  try {
    for (; i < held.ephemeral.size(); ++i) {
      const Block& block = held.ephemeral[i];
      if (!all && rng() % 2 == 0) {
        kept.push_back(block);
      } else if (rng() % 4 == 0) {
        // A free from another thread, later (its readers perhaps still queued).
        HeldBlock handed{block, name, std::nullopt, slot.ended};
        if (!shared_.blocks_outlive_job) handed.job = slot.id;
        shared_.holder.hold(std::move(handed), std::chrono::microseconds(rng() % 5000));
      } else {
        slot.job->deallocate(block.ptr);
      }
    }
  } catch (...) {
    // The job ended: what was not freed is still held (let_go hands it on).
    kept.insert(kept.end(), held.ephemeral.begin() + static_cast<std::ptrdiff_t>(i),
                held.ephemeral.end());
    held.ephemeral = std::move(kept);
    throw;
  }
  held.ephemeral = std::move(kept);
}

void Population::leave_by_itself(Slot& slot, bool drop) {
  std::lock_guard lock(slot.mu);
  if (slot.ended_by != EndedBy::none) throw Ended{};
  slot.ended->store(true);
  slot.left = true;
  if (drop) {
    slot.job.reset();
  } else {
    slot.job->leave();
  }
}

void Population::let_go(Slot& slot, const std::string& name, std::mt19937_64& rng, Held& held) {
  if (shared_.blocks_outlive_job) {
    // Still valid: free them now, right after the end (readers perhaps still queued on the
    // job's other stream), or from the holder's thread a little later.
    for (const std::vector<Block>* blocks : {&held.persistent, &held.shared, &held.ephemeral}) {
      for (const Block& block : *blocks) {
        HeldBlock handed{block, name, std::nullopt, slot.ended};
        if (rng() % 2 == 0) {
          shared_.holder.free_now(handed);
        } else {
          shared_.holder.hold(std::move(handed), std::chrono::microseconds(rng() % 20000));
        }
      }
    }
  }
  held = Held{};
}

void Population::canceller() {
  Heartbeat& beat = shared_.watchdog.enroll("soak-cancel");
  std::mt19937_64 rng(config_.seed ^ 0xC4A05C4A05ull);
  const auto max_ms = static_cast<std::uint64_t>(config_.cancel_interval_max.count());
  while (!stopping_.load()) {
    // Asleep in short steps, so that stop() is not kept waiting by a long interval.
    const auto wake =
        std::chrono::steady_clock::now() + std::chrono::milliseconds(1 + rng() % max_ms);
    while (!stopping_.load() && std::chrono::steady_clock::now() < wake) {
      beat.beat(Phase::working);
      std::this_thread::sleep_until(
          std::min(wake, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
    }
    if (stopping_.load()) break;
    Slot& slot = slots_[rng() % slots_.size()];
    if (rng() % 3 == 0) {
      end_slot(slot, EndedBy::leave, shared_.counters.left_by_other);
    } else {
      end_slot(slot, EndedBy::cancel, shared_.counters.cancelled);
    }
  }
  beat.beat(Phase::done);
}

bool Population::end_slot(Slot& slot, EndedBy how, std::atomic<std::uint64_t>& tally) {
  std::lock_guard lock(slot.mu);
  if (!slot.job || slot.left || slot.ended_by != EndedBy::none) return false;
  slot.ended_by = how;
  slot.ended->store(true);
  try {
    if (how == EndedBy::cancel) {
      slot.job->cancel();
    } else {
      slot.job->leave();
    }
  } catch (const std::exception& e) {
    shared_.error(std::string(how == EndedBy::cancel ? "cancel: " : "leave: ") + e.what());
  }
  tally.fetch_add(1);
  shared_.watchdog.progress(slot.device);
  return true;
}

void Population::wedge(Heartbeat& beat) {
  std::fprintf(stderr, "soak: --simulate-hang: thread '%s' wedges now\n", beat.name.c_str());
  beat.beat(Phase::working);
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace salus::soak
