// StreamHeap: moving pages between tiers behind fixed addresses (remap, demote, recall, fetch,
// prefetch, borrowed pages going home after a free) and the per-tier view of a job's blocks.
// The allocator itself is in stream_heap.cpp.
#include <fmt/format.h>

#include <algorithm>
#include <unordered_set>

#include "log/log.hpp"
#include "memory/device_heap.hpp"
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

void StreamHeap::remap(DevicePtr ptr, Location where) {
  std::lock_guard lock(mu_);
  Block* block = live_block(ptr, "remap");
  const std::size_t page = device_.granularity();
  if (device_.backend().granularity(where) != page) {
    throw NotSupported(fmt::format("remap to {}: its page size {} differs from device {}'s {}",
                                   to_string(where), device_.backend().granularity(where),
                                   device_.device(), page));
  }
  Arena& arena = arena_of(*block);
  auto [first, last] = arena.pages_touched(*block);
  std::vector<PageMove> moves;
  for (std::size_t i = first; i < last; ++i) {
    if (arena.page(i).where != where) moves.push_back({arena.page_addr(i), &arena.page(i), {}});
  }
  // The copies' marks come first: recording them may fail, and then no page has been taken.
  std::vector<StreamHandle> streams;
  streams_using(*block, streams);
  streams.push_back(stream());
  auto after = marks_now(streams);
  add_page_fences(moves, after);
  add_fence(block->fence, after);
  std::vector<Page> fresh;
  if (device_.tiers().borrow_from(device_.device(), where, moves.size(), fresh) < moves.size()) {
    device_.tiers().give_back(device_.device(), fresh);
    throw OutOfMemory(
        {.job = block->job,
         .job_name = {},
         .device = device_.device(),
         .requested_bytes = moves.size() * page,
         .job_in_use_bytes = 0,
         .job_limit_bytes = 0,
         .device_in_use_bytes = 0,
         .device_limit_bytes = device_.limit(),
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
std::vector<std::shared_ptr<const Event>> StreamHeap::marks_now(
    std::span<const StreamHandle> streams) {
  std::vector<std::shared_ptr<const Event>> marks;
  for (StreamHandle stream : streams) {
    if (stream.value == kRetiredStream) {
      // A retired stream may be destroyed: what it did is what the retire fence caught.
      add_fence(retire_fence_, marks);
      continue;
    }
    auto mark = std::make_shared<Event>(device_.shared_backend(), device_.device());
    mark->record(stream);
    marks.push_back(std::move(mark));
  }
  return marks;
}

bool StreamHeap::has_job(JobId job) {
  std::lock_guard lock(mu_);
  return ledger_.has_job(job);
}

void StreamHeap::run_moves(MoveReason reason, std::vector<PageMove>& moves,
                           std::span<const std::shared_ptr<const Event>> after) {
  if (moves.empty()) return;
  const std::size_t page = device_.granularity();
  const int device = device_.device();
  MoveRecord record{reason, device, moves.front().slot->where, moves.front().to.where, 0, 0,
                    0.0,    {}};
  std::vector<Page> old;
  std::exception_ptr failure;
  try {
    record.seconds = device_.mover().run(moves, after, device_.access_grants(), old);
  } catch (...) {
    failure = std::current_exception();
  }
  std::vector<Page> unused;
  DeviceCounters& counters = device_.counters();
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
      --remote_pages_;
    }
    if (now != Tier::local) {
      counters.borrowed[static_cast<std::size_t>(now)].fetch_add(page, std::memory_order_relaxed);
      ++remote_pages_;
    }
  }
  record.bytes = record.pages * page;
  record.finished = std::chrono::steady_clock::now();
  counters.pages_moved.fetch_add(record.pages, std::memory_order_relaxed);
  counters.bytes_moved.fetch_add(record.bytes, std::memory_order_relaxed);
  counters.move_nanoseconds.fetch_add(static_cast<std::uint64_t>(record.seconds * 1e9),
                                      std::memory_order_relaxed);
  device_.tiers().give_back(device, old);
  device_.tiers().give_back(device, unused);
  if (record.pages > 0) device_.tiers().report(record);
  if (failure) std::rethrow_exception(failure);
}

template <class F>
void StreamHeap::for_each_live_page(std::optional<JobId> job, F&& visit) {
  // Adjacent blocks can share a page; visit each page once.
  std::pair<const Arena*, std::size_t> last_seen{nullptr, 0};
  ledger_.for_each_block(job, [&](const Block& b) {
    Arena& arena = arena_of(b);
    auto [first, last] = arena.pages_touched(b);
    for (std::size_t i = first; i < last; ++i) {
      if (last_seen == std::pair<const Arena*, std::size_t>{&arena, i}) continue;
      last_seen = {&arena, i};
      visit(arena, i, b);
    }
  });
}

bool StreamHeap::owners_allow(Arena& arena, std::size_t index, const Block& start, JobGate& gate,
                              bool hold, std::vector<JobId>& held, bool* touches_free) {
  const DevicePtr lo = arena.page_addr(index);
  const DevicePtr hi = lo + arena.page_bytes();
  auto allowed = [&](const Block& b) {
    if (b.free) {
      if (touches_free != nullptr) *touches_free = true;
      return true;
    }
    if (!live_.contains(b.addr)) return false;  // set aside while its addresses retire
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

std::size_t StreamHeap::count_pages(const MoveSpec& spec, JobGate* gate) {
  std::lock_guard lock(mu_);
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

std::size_t StreamHeap::move_pages(const MoveSpec& spec, std::vector<Page>& destinations,
                                   JobGate& gate, std::vector<JobId>* owners) {
  if (destinations.empty()) return 0;
  std::lock_guard lock(mu_);
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

std::vector<std::shared_ptr<const Event>> StreamHeap::move_marks(const std::vector<PageMove>& moves,
                                                                 const std::vector<JobId>& held,
                                                                 JobGate& gate, bool touches_free) {
  // The copies wait for (1) every owner's work on every stream it uses (the one its blocks live
  // on, the streams of add_job_stream, those recorded on its blocks): up to the mark taken when
  // it turned quiescent where there is one, else all work so far; (2) work that other streams
  // may still do on blocks freed on these pages (the pages' fences); and (3) where free space
  // shares a page, all work so far on this stream: a block freed there may be in use by work
  // queued after the owners' marks, by a job that is running now.
  const int device = device_.device();
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
    streams.assign(1, stream());
    device_.jobs().streams_of(job, device, streams);
    ledger_.for_each_block(job, [&](const Block& b) {
      streams.insert(streams.end(), b.other_streams.begin(), b.other_streams.end());
      add_fence(b.fence, marks);
    });
    std::sort(streams.begin(), streams.end());
    streams.erase(std::unique(streams.begin(), streams.end()), streams.end());
    for (StreamHandle stream : streams) cover(job, stream);
  }
  if (touches_free) unmarked.push_back(stream());
  std::sort(unmarked.begin(), unmarked.end());
  unmarked.erase(std::unique(unmarked.begin(), unmarked.end()), unmarked.end());
  auto now = marks_now(unmarked);
  marks.insert(marks.end(), now.begin(), now.end());
  add_page_fences(moves, marks);
  return marks;
}

void StreamHeap::add_tier_usage(JobId job, std::size_t (&bytes)[kTierCount]) {
  std::lock_guard lock(mu_);
  ledger_.for_each_block(job, [&](const Block& b) {
    Arena& arena = arena_of(b);
    auto [first, last] = arena.pages_touched(b);
    for (std::size_t i = first; i < last; ++i) {
      const DevicePtr lo = std::max(b.addr, arena.page_addr(i));
      const DevicePtr hi = std::min(b.end(), arena.page_addr(i) + arena.page_bytes());
      bytes[static_cast<std::size_t>(tier_of(arena.page(i).where, device_.device()))] += hi - lo;
    }
  });
}

void StreamHeap::return_stray_remote_pages(OwnFence& own) {
  if (remote_pages_ == 0) return;
  std::vector<Page> pages;
  try {
    for_each_arena([&](Arena& arena) {
      arena.for_each_free_largest_first([&](const Block& free_block) {
        auto [first, last] = arena.pages_inside(free_block);
        for (std::size_t i = first; i < last; ++i) {
          const PageSlot& slot = arena.page(i);
          if (slot.owned() && tier_of(slot.where, device_.device()) != Tier::local) {
            pages.push_back(hand_off(arena, i, own));
          }
        }
      });
    });
  } catch (const Error& e) {
    log::warn("device {}: returning borrowed pages failed: {}", device_.device(), e.what());
  }
  device_.tiers().give_back(device_.device(), pages);
}

void StreamHeap::return_remote_pages(Arena& arena, std::size_t first, std::size_t last,
                                     const Block& merged) {
  std::vector<Page> pages;
  OwnFence own(*this);
  try {
    for (std::size_t i = first; i < last; ++i) {
      const PageSlot& slot = arena.page(i);
      if (slot.owned() && tier_of(slot.where, device_.device()) != Tier::local &&
          !live_touches(arena, i, merged)) {
        pages.push_back(hand_off(arena, i, own));
      }
    }
  } catch (const Error& e) {
    // The free is done; handing borrowed pages back early is not part of it. A page whose fence
    // could not be recorded stays here as free space, and a later free, trim or recall returns it.
    log::warn("device {}: returning borrowed pages after a free failed: {}", device_.device(),
              e.what());
  }
  device_.tiers().give_back(device_.device(), pages);
}

bool StreamHeap::live_touches(Arena& arena, std::size_t index, const Block& from) const {
  // Blocks set aside by carve hold addresses, not data: only live blocks keep a page.
  const DevicePtr lo = arena.page_addr(index);
  const DevicePtr hi = lo + arena.page_bytes();
  for (const Block* b = &from; b != nullptr && b->end() > lo; b = b->prev) {
    if (b->addr < hi && live_.contains(b->addr)) return true;
  }
  for (const Block* b = from.next; b != nullptr && b->addr < hi; b = b->next) {
    if (b->end() > lo && live_.contains(b->addr)) return true;
  }
  return false;
}

}  // namespace salus::memory
