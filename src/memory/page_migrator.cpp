// PageMigrator: moving pages between tiers behind fixed addresses for one stream heap. The
// allocator itself is in stream_heap.cpp; borrowed pages going home after a free are the heap's
// PageSupply's (page_supply.cpp), as they are handed off like any free page.
#include "memory/page_migrator.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "memory/device_counters.hpp"
#include "memory/job_table.hpp"
#include "memory/stream_heap.hpp"

namespace salus::memory {

namespace {

// Appends the events of `fence` while it is pending.
void add_fence(const FencePtr& fence, std::vector<std::shared_ptr<const Event>>& marks) {
  if (settled(fence)) return;
  const auto events = fence->events();
  marks.insert(marks.end(), events.begin(), events.end());
}

// Appends the events of the moved pages' fences: other streams' work on blocks freed there.
void add_page_fences(std::span<const PageMove> moves,
                     std::vector<std::shared_ptr<const Event>>& marks) {
  for (const PageMove& move : moves) {
    if (settled(move.slot->fence)) continue;
    const auto events = move.slot->fence->events();
    marks.insert(marks.end(), events.begin(), events.end());
  }
}

}  // namespace

void PageMigrator::remap(const Block& block, Location where,
                         std::span<const StreamHandle> streams) {
  const MigratorDevice& device = heap_.device;
  const std::size_t page = device.page_bytes;
  if (device.backend->granularity(where) != page) {
    throw NotSupported(fmt::format("remap to {}: its page size {} differs from device {}'s {}",
                                   to_string(where), device.backend->granularity(where),
                                   device.device, page));
  }
  Arena& arena = arena_of(heap_.arenas, block);
  auto [first, last] = arena.pages_touched(block);
  std::vector<PageMove> moves;
  for (std::size_t i = first; i < last; ++i) {
    if (arena.page(i).where != where) moves.push_back({arena.page_addr(i), &arena.page(i), {}});
  }
  // The copies' marks come first: recording them may fail, and then no page has been taken.
  auto after = marks_now(streams);
  add_page_fences(moves, after);
  add_fence(block.fence, after);
  std::vector<Page> fresh;
  if (device.tiers.borrow_from(device.device, where, moves.size(), fresh) < moves.size()) {
    device.tiers.give_back(device.device, fresh);
    throw OutOfMemory(
        {.job = block.job,
         .job_name = {},
         .device = device.device,
         .requested_bytes = moves.size() * page,
         .job_in_use_bytes = 0,
         .job_limit_bytes = 0,
         .device_in_use_bytes = 0,
         .device_limit_bytes = device.limit_bytes,
         .reason = fmt::format("remap found too few free pages at {}", to_string(where))});
  }
  for (PageMove& move : moves) {
    move.to = std::move(fresh.back());
    fresh.pop_back();
  }
  run_moves(MoveReason::remap, moves, after);
  // The caller asked for its bytes where they now are: ordered after all work so far, the host
  // included.
}

std::vector<std::shared_ptr<const Event>> PageMigrator::marks_now(
    std::span<const StreamHandle> streams) {
  std::vector<std::shared_ptr<const Event>> marks;
  for (StreamHandle stream : streams) {
    if (stream.value == StreamHeap::kRetiredStream) {
      // A retired stream may be destroyed: what it did is what the retire fence caught.
      add_fence(heap_.retire_fence, marks);
      continue;
    }
    auto mark = std::make_shared<Event>(heap_.device.backend, heap_.device.device);
    mark->record(stream);
    marks.push_back(std::move(mark));
  }
  return marks;
}

void PageMigrator::run_moves(MoveReason reason, std::vector<PageMove>& moves,
                             std::span<const std::shared_ptr<const Event>> after) {
  if (moves.empty()) return;
  const std::size_t page = heap_.device.page_bytes;
  const int device = heap_.device.device;
  MoveRecord record{reason, device, moves.front().slot->where, moves.front().to.where, 0, 0,
                    0.0,    {}};
  std::vector<Page> old;
  std::exception_ptr failure;
  try {
    record.seconds = heap_.device.mover.run(moves, after, heap_.device.grants, old);
  } catch (...) {
    failure = std::current_exception();
  }
  std::vector<Page> unused;
  DeviceCounters& counters = heap_.device.counters;
  for (PageMove& move : moves) {
    if (!move.done) {
      unused.push_back(std::move(move.to));
      continue;
    }
    ++record.pages;
    // The page changed tier under the same address: keep the borrowed counts true.
    const Tier before = tier_of(old[record.pages - 1].where, device);
    const Tier now = tier_of(move.slot->where, device);
    if (before != Tier::local) {
      counters.borrowed[static_cast<std::size_t>(before)].fetch_sub(page,
                                                                    std::memory_order_relaxed);
      --heap_.remote_pages;
    }
    if (now != Tier::local) {
      counters.borrowed[static_cast<std::size_t>(now)].fetch_add(page, std::memory_order_relaxed);
      ++heap_.remote_pages;
    }
  }
  record.bytes = record.pages * page;
  record.finished = std::chrono::steady_clock::now();
  counters.pages_moved.fetch_add(record.pages, std::memory_order_relaxed);
  counters.bytes_moved.fetch_add(record.bytes, std::memory_order_relaxed);
  counters.move_nanoseconds.fetch_add(static_cast<std::uint64_t>(record.seconds * 1e9),
                                      std::memory_order_relaxed);
  heap_.device.tiers.give_back(device, old);
  heap_.device.tiers.give_back(device, unused);
  if (record.pages > 0) heap_.device.tiers.report(record);
  if (failure) std::rethrow_exception(failure);
}

template <class F>
void PageMigrator::for_each_live_page(std::optional<JobId> job, F&& visit) {
  // Adjacent blocks can share a page; visit each page once.
  std::pair<const Arena*, std::size_t> last_seen{nullptr, 0};
  heap_.ledger.for_each_block(job, [&](const Block& b) {
    Arena& arena = arena_of(heap_.arenas, b);
    auto [first, last] = arena.pages_touched(b);
    for (std::size_t i = first; i < last; ++i) {
      if (last_seen == std::pair<const Arena*, std::size_t>{&arena, i}) continue;
      last_seen = {&arena, i};
      visit(arena, i, b);
    }
  });
}

bool PageMigrator::owners_allow(Arena& arena, std::size_t index, const Block& start, JobGate& gate,
                                bool hold, std::vector<JobId>& held, bool* touches_free) {
  const DevicePtr lo = arena.page_addr(index);
  const DevicePtr hi = lo + arena.page_bytes();
  auto allowed = [&](const Block& b) {
    if (b.free) {
      if (touches_free != nullptr) *touches_free = true;
      return true;
    }
    if (!heap_.live.contains(b.addr)) return false;  // set aside while its addresses retire
    if (std::find(held.begin(), held.end(), b.job) != held.end()) return true;
    if (!(hold ? gate.try_hold(b.job) : gate.may_move(b.job))) return false;
    held.push_back(b.job);
    return true;
  };
  // Walk out from the block the page was reached through, both ways, while blocks touch it.
  for (const Block* b = &start; b != nullptr && b->end() > lo; b = b->prev) {
    if (!allowed(*b)) return false;
  }
  for (const Block* b = start.next; b != nullptr && b->addr < hi; b = b->next) {
    if (!allowed(*b)) return false;
  }
  return true;
}

std::size_t PageMigrator::count_pages(const MoveSpec& spec, JobGate* gate) {
  std::unordered_set<const PageSlot*> seen;
  std::vector<JobId> allowed;  // owners already asked
  for_each_live_page(spec.job, [&](Arena& arena, std::size_t i, const Block& block) {
    const PageSlot& slot = arena.page(i);
    if (!slot.mapped || !spec.from(slot.where) || seen.contains(&slot)) return;
    // A page shared with a job that may not move now (a running one) is not a candidate.
    if (gate != nullptr && !owners_allow(arena, i, block, *gate, false, allowed)) return;
    seen.insert(&slot);
  });
  return seen.size();
}

std::size_t PageMigrator::move_pages(const MoveSpec& spec, std::vector<Page>& destinations,
                                     JobGate& gate, std::vector<JobId>* owners) {
  if (destinations.empty()) return 0;
  std::vector<JobId> held;
  std::vector<PageMove> moves;
  std::unordered_set<const PageSlot*> chosen;
  bool touches_free = false;
  for_each_live_page(spec.job, [&](Arena& arena, std::size_t i, const Block& block) {
    if (moves.size() == destinations.size()) return;
    PageSlot& slot = arena.page(i);
    if (!slot.mapped || !spec.from(slot.where) || !chosen.insert(&slot).second) return;
    if (!owners_allow(arena, i, block, gate, true, held, &touches_free)) return;
    moves.push_back({arena.page_addr(i), &slot, {}});
  });
  // Best destinations first: callers list them in order of preference (lenders best first, then
  // the host; the borrower's own memory, then the host). When fewer pages can move than were
  // counted (some share a page with a running job), the worse ones are what is left over.
  std::exception_ptr failure;
  try {
    // The marks come first: recording them may fail, and then the destinations stay the caller's.
    const auto marks = move_marks(moves, held, gate, touches_free);
    for (std::size_t i = 0; i < moves.size(); ++i) moves[i].to = std::move(destinations[i]);
    destinations.erase(destinations.begin(),
                       destinations.begin() + static_cast<std::ptrdiff_t>(moves.size()));
    run_moves(spec.reason, moves, marks);
  } catch (...) {
    failure = std::current_exception();
  }
  for (JobId job : held) gate.release(job);
  if (failure) std::rethrow_exception(failure);
  std::size_t moved = 0;
  for (const PageMove& move : moves) moved += move.done ? 1 : 0;
  // Every held job owns at least one chosen page; all of them moved unless a round failed.
  if (owners != nullptr && moved > 0) owners->insert(owners->end(), held.begin(), held.end());
  return moved;
}

std::vector<std::shared_ptr<const Event>> PageMigrator::move_marks(
    const std::vector<PageMove>& moves, const std::vector<JobId>& held, JobGate& gate,
    bool touches_free) {
  // The copies wait for (1) every owner's work on every stream it uses (the one its blocks live
  // on, the streams of add_job_stream, those recorded on its blocks): up to the mark taken when
  // it turned quiescent where there is one, else all work so far; (2) work that other streams
  // may still do on blocks freed on these pages (the pages' fences); and (3) where free space
  // shares a page, all work so far on this stream: a block freed there may be in use by work
  // queued after the owners' marks, by a job that is running now.
  const int device = heap_.device.device;
  std::vector<std::shared_ptr<const Event>> marks;
  std::vector<StreamHandle> unmarked;
  auto cover = [&](JobId job, StreamHandle stream) {
    if (auto mark = gate.quiet_mark(job, device, stream)) {
      marks.push_back(std::move(mark));
    } else {
      unmarked.push_back(stream);
    }
  };
  std::vector<StreamHandle> streams;
  for (JobId job : held) {
    streams.assign(1, heap_.stream);
    heap_.device.jobs.streams_of(job, device, streams);
    heap_.ledger.for_each_block(job, [&](const Block& b) {
      streams.insert(streams.end(), b.other_streams.begin(), b.other_streams.end());
      add_fence(b.fence, marks);
    });
    std::sort(streams.begin(), streams.end());
    streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
    for (StreamHandle stream : streams) cover(job, stream);
  }
  if (touches_free) unmarked.push_back(heap_.stream);
  std::sort(unmarked.begin(), unmarked.end());
  unmarked.erase(std::unique(unmarked.begin(), unmarked.end()), unmarked.end());
  auto now = marks_now(unmarked);
  marks.insert(marks.end(), now.begin(), now.end());
  add_page_fences(moves, marks);
  return marks;
}

void PageMigrator::add_tier_usage(JobId job, std::size_t (&bytes)[kTierCount]) {
  heap_.ledger.for_each_block(job, [&](const Block& b) {
    Arena& arena = arena_of(heap_.arenas, b);
    auto [first, last] = arena.pages_touched(b);
    for (std::size_t i = first; i < last; ++i) {
      const DevicePtr lo = std::max(b.addr, arena.page_addr(i));
      const DevicePtr hi = std::min(b.end(), arena.page_addr(i) + arena.page_bytes());
      bytes[static_cast<std::size_t>(tier_of(arena.page(i).where, heap_.device.device))] +=
          hi - lo;
    }
  });
}

}  // namespace salus::memory
