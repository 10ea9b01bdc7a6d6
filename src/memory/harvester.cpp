#include "waits/blocking.hpp"
#include "memory/harvester.hpp"

#include <algorithm>

#include "cuda/process_fork.hpp"
#include "log/log.hpp"

namespace salus::memory {

namespace {

// Visits the stream heaps of device `d` that `job` has had blocks in (JobRecord::heaps); none
// when the id names no job.
template <class F>
void for_each_heap_of(const JobRecord* job, int d, F&& visit) {
  if (job == nullptr) return;
  for (StreamHeap* heap : job->heaps_used(d)) visit(*heap);
}

// Every job the base gate allows, except one.
class ExceptGate final : public JobGate {
 public:
  ExceptGate(JobGate& base, JobId excluded) : base_(base), excluded_(excluded) {}
  bool try_hold(JobId job) override { return job != excluded_ && base_.try_hold(job); }
  bool may_move(JobId job) override { return job != excluded_ && base_.may_move(job); }
  void release(JobId job) override { base_.release(job); }
  std::shared_ptr<const Event> quiet_mark(JobId job, int device, StreamHandle stream) override {
    return base_.quiet_mark(job, device, stream);
  }

 private:
  JobGate& base_;
  JobId excluded_;
};

// One job is held already (by whoever owns this gate); others as the base gate says.
class OwnerGate final : public JobGate {
 public:
  OwnerGate(JobGate& base, JobId owner) : base_(base), owner_(owner) {}
  bool try_hold(JobId job) override { return job == owner_ || base_.try_hold(job); }
  bool may_move(JobId job) override { return job == owner_ || base_.may_move(job); }
  void release(JobId job) override {
    if (job != owner_) base_.release(job);
  }
  std::shared_ptr<const Event> quiet_mark(JobId job, int device, StreamHandle stream) override {
    return base_.quiet_mark(job, device, stream);
  }

 private:
  JobGate& base_;
  JobId owner_;
};

bool is_local_to(Location where, int device) {
  return where == Location::gpu(device);
}

}  // namespace

Harvester::Harvester(const std::vector<std::unique_ptr<DeviceHeap>>& devices, Tiers& tiers,
                     JobTable& jobs)
    : devices_(devices),
      tiers_(tiers),
      jobs_(jobs),
      worker_(process::running_thread([this](std::stop_token stop) { run_prefetches(stop); })) {}

Harvester::~Harvester() {
  worker_.request_stop();
  prefetch_cv_.notify_all();
}

std::size_t Harvester::demote_others(DeviceHeap& device, std::size_t pages, JobId requester) {
  ExceptGate others(jobs_, requester);
  return evict(device, pages, others);
}

std::size_t Harvester::take_local(DeviceHeap& device, std::size_t pages, std::vector<Page>& out) {
  // Best effort: what it took stays in `out` for the caller to use or give back, also when a
  // step fails (reclaiming records fences, and that may fail).
  const std::size_t before = out.size();
  try {
    const std::size_t got = device.pool().acquire(pages, out);
    if (got < pages && device.reclaim_from_others(nullptr, pages - got) > 0) {
      device.pool().acquire(pages - got, out);
    }
  } catch (const Error& e) {
    log::warn("device {}: taking pages for a move failed: {}", device.device(), e.what());
  }
  return out.size() - before;
}

std::size_t Harvester::recall(DeviceHeap& lender, std::size_t pages) {
  if (lender.pool().lent_bytes() == 0) return 0;
  const Location home = Location::gpu(lender.device());
  const StreamHeap::MoveSpec spec{MoveReason::recall,
                                  [home](Location where) { return where == home; }, std::nullopt};
  std::size_t recalled = 0;
  std::vector<JobId> owners;
  for (const auto& borrower : devices_) {
    if (borrower.get() == &lender) continue;
    borrower->for_each_stream_heap([&](StreamHeap& heap) {
      if (recalled >= pages) return;
      const std::size_t candidates = std::min(heap.count_pages(spec), pages - recalled);
      if (candidates == 0) return;
      // Back to the borrower's own memory when it has room, else to the host.
      std::vector<Page> destinations;
      const std::size_t own = take_local(*borrower, candidates, destinations);
      PageSource* host = tiers_.host();
      if (own < candidates && host != nullptr && tiers_.fits(borrower->device(), *host)) {
        host->lend(candidates - own, 0, destinations);
      }
      try {
        // Pages that went to the borrower's own memory are home, not away.
        recalled +=
            heap.move_pages(spec, destinations, jobs_, own < candidates ? &owners : nullptr);
      } catch (const Error& e) {
        log::error("recalling pages of device {} failed: {}", lender.device(), e.what());
      }
      tiers_.give_back(borrower->device(), destinations);
    });
  }
  lender.counters().recalled_pages.fetch_add(recalled, std::memory_order_relaxed);
  mark_away(owners);
  return recalled;
}

void Harvester::mark_away(const std::vector<JobId>& jobs) {
  for (JobId id : jobs) {
    JobRecord* job = jobs_.find(id);
    if (job == nullptr) continue;
    std::lock_guard lock(job->activity_mu);
    if (!job->active) job->away = true;
  }
  // A prefetch target among them should come back as soon as there is room.
  if (!jobs.empty()) signal_room();
}

std::size_t Harvester::evict(DeviceHeap& device, std::size_t pages, JobGate& gate) {
  const int d = device.device();
  const StreamHeap::MoveSpec spec{
      MoveReason::demote, [d](Location where) { return is_local_to(where, d); }, std::nullopt};
  std::size_t evicted = 0;
  std::vector<JobId> owners;
  device.for_each_stream_heap([&](StreamHeap& heap) {
    if (evicted >= pages) return;
    const std::size_t candidates = std::min(heap.count_pages(spec), pages - evicted);
    if (candidates == 0) return;
    std::vector<Page> destinations;
    if (tiers_.borrow(d, candidates, destinations) == 0) return;
    std::size_t moved = 0;
    try {
      moved = heap.move_pages(spec, destinations, gate, &owners);
    } catch (const Error& e) {
      log::error("demoting pages on device {} failed: {}", d, e.what());
    }
    tiers_.give_back(d, destinations);
    evicted += moved;
  });
  mark_away(owners);
  return evicted;
}

std::size_t Harvester::fetch_home(JobId job, MoveReason reason, JobGate& own, JobGate* others) {
  std::size_t moved = 0;
  const JobRecord* record = jobs_.find(job);
  for (const auto& device : devices_) {
    const int d = device->device();
    const StreamHeap::MoveSpec spec{reason, [d](Location where) { return !is_local_to(where, d); },
                                    job};
    for_each_heap_of(record, d, [&](StreamHeap& heap) {
      // Only pages that can come home now: room made (by reclaiming, or by pushing other idle
      // jobs down a tier) for a page shared with a running job, or for a job that is not
      // quiescent (a prefetch of a running one), would be room made for nothing.
      const std::size_t wanted = heap.count_pages(spec, &own);
      if (wanted == 0) return;
      std::vector<Page> destinations;
      const std::size_t got = take_local(*device, wanted, destinations);
      if (got < wanted && others != nullptr && evict(*device, wanted - got, *others) > 0) {
        device->pool().acquire(wanted - got, destinations);
      }
      try {
        moved += heap.move_pages(spec, destinations, own) * device->granularity();
      } catch (const Error& e) {
        log::error("bringing pages home to device {} failed: {}", d, e.what());
      }
      tiers_.give_back(d, destinations);
    });
  }
  return moved;
}

void Harvester::set_quiescent(JobRecord& job) {
  // Moves of its pages need wait only for its own work, not for what others enqueue later on a
  // stream it shares with them.
  // Marks go on every stream it has blocks on and every stream it works on (add_job_stream):
  // its pages may be in use on any of them.
  std::vector<QuietMark> marks;
  if (tiers_.spills()) {
    std::vector<StreamHandle> streams;
    for (const auto& device : devices_) {
      streams.clear();
      for_each_heap_of(&job, device->device(), [&](StreamHeap& heap) {
        // A retired heap's stream may be gone; moves of its pages wait for its retire fence.
        const StreamHandle stream = heap.stream();
        if (stream.value != StreamHeap::kRetiredStream && heap.has_job(job.id)) {
          streams.push_back(stream);
        }
      });
      jobs_.streams_of(job.id, device->device(), streams);
      std::sort(streams.begin(), streams.end());
      streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
      for (StreamHandle stream : streams) {
        auto mark = std::make_shared<Event>(device->shared_backend(), device->device());
        mark->record(stream);
        marks.push_back({device->device(), stream, std::move(mark)});
      }
    }
  }
  {
    std::lock_guard lock(job.activity_mu);
    job.active = false;
    job.quiet_marks = std::move(marks);
  }
  tiers_.notify_safe_point();
  signal_room();
}

std::size_t Harvester::activate(JobRecord& job) {
  bool waited_for_move = false;  // a prefetch (or demotion) of its pages was still running
  {
    std::unique_lock lock(job.activity_mu);
    if (job.active) return 0;
    job.activating = true;
    waited_for_move = job.moving > 0;
    if (waited_for_move) waits::before_blocking();
    job.activity_cv.wait(lock, [&] { return job.moving == 0; });
  }
  {
    std::lock_guard lock(prefetch_mu_);
    std::erase(targets_, job.id);
  }
  std::size_t fetched = 0;
  std::exception_ptr failure;
  try {
    if (tiers_.spills()) {
      // A prefetch round in flight may hold the very room this job needs (pages taken for it
      // that it can no longer move, the job being active now): wait for the round to give them
      // back, and let no new round take room before the running job has had it.
      const auto rounds = hold_prefetches();
      OwnerGate own(jobs_, job.id);
      ExceptGate others(jobs_, job.id);
      fetched = fetch_home(job.id, MoveReason::fetch, own, &others);
    }
  } catch (...) {
    failure = std::current_exception();
  }
  bool away = false;
  {
    std::lock_guard lock(job.activity_mu);
    away = std::exchange(job.away, false);
    job.quiet_marks.clear();
    job.active = true;
    job.activating = false;
  }
  job.activations.fetch_add(1, std::memory_order_relaxed);
  if (away) job.activations_after_move.fetch_add(1, std::memory_order_relaxed);
  if (fetched > 0 || waited_for_move)
    job.activations_waited.fetch_add(1, std::memory_order_relaxed);
  job.fetched_bytes.fetch_add(fetched, std::memory_order_relaxed);
  if (failure) std::rethrow_exception(failure);
  return fetched;
}

void Harvester::prefetch(JobId job) {
  if (!tiers_.spills()) return;
  {
    std::lock_guard lock(prefetch_mu_);
    if (std::find(targets_.begin(), targets_.end(), job) != targets_.end()) return;
    targets_.push_back(job);
    fresh_ = true;
  }
  prefetch_cv_.notify_all();
}

std::size_t Harvester::demote(JobId job, DeviceHeap& device) {
  const int d = device.device();
  const StreamHeap::MoveSpec spec{MoveReason::demote,
                                  [d](Location where) { return is_local_to(where, d); }, job};
  std::size_t moved = 0;
  std::vector<JobId> owners;
  for_each_heap_of(jobs_.find(job), d, [&](StreamHeap& heap) {
    const std::size_t wanted = heap.count_pages(spec);
    if (wanted == 0) return;
    std::vector<Page> destinations;
    tiers_.borrow(d, wanted, destinations);
    try {
      moved += heap.move_pages(spec, destinations, jobs_, &owners) * device.granularity();
    } catch (...) {
      tiers_.give_back(d, destinations);
      throw;
    }
    tiers_.give_back(d, destinations);
  });
  mark_away(owners);
  return moved;
}

void Harvester::signal_room() {
  {
    std::lock_guard lock(prefetch_mu_);
    if (targets_.empty()) return;
    room_ = true;
  }
  prefetch_cv_.notify_all();
}

void Harvester::run_prefetches(std::stop_token stop) {
  std::unique_lock lock(prefetch_mu_);
  while (!stop.stop_requested()) {
    if (!prefetch_cv_.wait(lock, stop, [&] { return !targets_.empty() && (fresh_ || room_); })) {
      return;
    }
    fresh_ = room_ = false;
    // Frees during this round ask for another: the room they make may come too late for it.
    waiting_for_room_.store(true, std::memory_order_relaxed);
    const std::vector<JobId> targets = targets_;
    lock.unlock();
    std::vector<JobId> done;
    std::unique_lock round = hold_prefetches();
    for (JobId target : targets) {
      try {
        // Only free room: a prefetch that pushed other jobs down could push down the job whose
        // turn comes first (it is quiescent too, for a moment, between its iterations).
        const std::size_t moved = fetch_home(target, MoveReason::prefetch, jobs_, nullptr);
        // A target stays one until it is activated: pages at home now may go down later (the
        // running job's forward pass pushes them), and then they should come back.
        JobRecord* record = jobs_.find(target);
        if (record == nullptr || !record->alive.load(std::memory_order_acquire)) {
          done.push_back(target);
        } else {
          record->prefetched_bytes.fetch_add(moved, std::memory_order_relaxed);
        }
      } catch (const Error& e) {
        log::warn("prefetching job {} failed: {}", target.value, e.what());
        done.push_back(target);
      }
    }
    round.unlock();
    lock.lock();
    for (JobId target : done) std::erase(targets_, target);
    // What is left waits for room: frees and jobs turning quiescent signal it.
    if (targets_.empty()) waiting_for_room_.store(false, std::memory_order_relaxed);
  }
}

}  // namespace salus::memory
