// StreamHeap: physical pages under its address ranges. Gathering pages for a new block, mapping
// them, handing free ones to another user (behind a fence, the old address kept until the work
// enqueued before has finished) and reclaiming them.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include "log/log.hpp"
#include "memory/device_heap.hpp"
#include "memory/stream_heap.hpp"

namespace salus::memory {

const FencePtr& StreamHeap::OwnFence::get() {
  if (!asked_) {
    // A retired stream may be gone: its work is what the retire fence caught.
    if (heap_.retired_) {
      fence_ = settled(heap_.retire_fence_) ? nullptr : heap_.retire_fence_;
      asked_ = true;
      return fence_;
    }
    // An idle stream has nothing queued that could touch the page: no fence, and the page is
    // unmapped at once. (Work enqueued from now on only touches live blocks.)
    const StreamHandle stream = heap_.stream();
    if (!heap_.device_.backend().query_stream(stream, heap_.device_.device())) {
      fence_ = Fence::after(heap_.device_.events(), std::span(&stream, 1));
    }
    asked_ = true;
  }
  return fence_;
}

std::size_t StreamHeap::take_spare(std::size_t wanted, std::size_t missing,
                                   std::vector<Page>& pages, OwnFence& own) {
  std::size_t got = reclaim_locked(wanted, pages, own, Take::spare);
  // Short of quiet pages while the GPU is behind: pages it may still touch, their old addresses
  // kept until it has (the stream orders the new block after that work anyway). An old address
  // that is needed again before then gets a fresh page, so this pays only where fragmentation
  // strands pages: large blocks (optimizer state made in the first iteration splits the
  // activations' space, and the next iteration's large tensors no longer fit it), and not in a
  // first iteration, whose free space the next one reuses in place.
  if (got < wanted && missing >= kFencedMovePages && iterations_ended_ > 0) {
    got += reclaim_locked(wanted - got, pages, own, Take::spare_fenced);
  }
  // A fence now lets the space freed so far count as quiet once the GPU has caught up.
  if (got < wanted) end_epoch();
  return got;
}

std::size_t StreamHeap::gather_pages(Arena& arena, std::size_t first, std::size_t last,
                                     std::size_t missing, std::vector<Page>& pages,
                                     std::vector<Page>& stash, bool fresh_chunks) {
  pages.reserve(missing);
  std::size_t got = device_.pool().acquire_kept(missing, pages);
  // Without fresh chunks the caller asks other streams for spare pages next and tries again:
  // this heap's own are for that try, so that nothing moves on a try that fails.
  if (got < missing && !fresh_chunks) return missing - got;
  OwnFence own(*this);
  if (got < missing) {
    // A page this heap mapped and left free costs nothing to move here once (two driver calls,
    // in a warm-up iteration); a fresh chunk would stay reserved. An address that gave its page
    // away this way and needs one again would trade pages back and forth every iteration: it
    // gets a fresh one, and no address gives its page away twice, so moves stop.
    std::size_t again = 0;
    for (std::size_t i = first; i < last; ++i) {
      if (!arena.page(i).mapped && arena.gave_spare(i)) ++again;
    }
    if (missing - got > again) {
      try {
        got += take_spare(missing - got - again, missing, pages, own);
      } catch (const Error& e) {
        // Moving a spare page is a saving, not a need: a driver failure (the pages stay where
        // they were) leaves it to fresh chunks. Pages taken before it are in `pages`.
        log::debug("device {}: taking spare pages failed: {}", device_.device(), e.what());
        got = pages.size();
      }
    }
  }
  if (got < missing) got += device_.pool().acquire(missing - got, pages);
  // The block is live now, so reclaiming cannot take pages from under it.
  if (got < missing) got += reclaim_locked(missing - got, pages, own, Take::any);
  if (got < missing && stash.size() >= missing - got) {
    // Borrowed pages go in front: map_pages takes pages from the back, so the local ones fill the
    // block's first pages and the borrowed ones its last.
    const auto take = stash.end() - static_cast<std::ptrdiff_t>(missing - got);
    pages.insert(pages.begin(), std::make_move_iterator(take),
                 std::make_move_iterator(stash.end()));
    stash.erase(take, stash.end());
    got = missing;
  }
  return missing - got;
}

void StreamHeap::settle_retiring(bool wait) {
  table_.settle_retiring(wait);
  // Set-aside blocks whose addresses have settled go back to the free set.
  std::erase_if(detours_, [&](const std::pair<Arena*, Block*>& d) {
    auto [arena, block] = d;
    auto [first, last] = arena->pages_touched(*block);
    for (std::size_t i = first; i < last; ++i) {
      if (arena->page(i).retiring) return false;
    }
    release_block(block);  // borrowed pages it shared with a block freed meanwhile go home
    return true;
  });
}

std::size_t StreamHeap::reclaim_locked(std::size_t wanted, std::vector<Page>& out, OwnFence& own,
                                       Take take) {
  std::size_t taken = 0;
  const bool spare = take == Take::spare || take == Take::spare_fenced;
  auto visit = [&](Arena& arena, const Block& free_block) {
    if (take == Take::spare && !quiet(free_block, own)) return;
    auto [first, last] = arena.pages_inside(free_block);
    last = std::min(last, arena.mapped_high());  // nothing above was ever mapped
    for (std::size_t i = first; i < last && taken < wanted; ++i) {
      // Pages of other tiers in free space went home when they were freed.
      const PageSlot& slot = arena.page(i);
      if (!slot.owned() || slot.where != device_.pool().where()) continue;
      if ((take == Take::idle || take == Take::spare) && !settled(slot.fence)) continue;
      if (spare) {
        if (arena.gave_spare(i)) continue;
        arena.mark_gave_spare(i);
        // Quiet: nothing can touch the old address, which goes at once.
        out.push_back(take == Take::spare ? table_.unmap_page(arena, i)
                                          : table_.hand_off(arena, i, own.get()));
      } else {
        out.push_back(table_.hand_off(arena, i, own.get()));
      }
      ++taken;
    }
  };
  for_each_arena([&](Arena& arena) {
    if (taken >= wanted) return;
    arena.for_each_free_holding_pages([&](const Block& b) {
      visit(arena, b);
      return taken < wanted;
    });
  });
  return taken;
}

void StreamHeap::end_epoch() {
  OwnFence own(*this);
  try {
    (void)own.get();
  } catch (const Error& e) {
    // Without its fence the epoch goes on: its frees count as quiet with the next one.
    log::debug("device {}: no fence for an epoch: {}", device_.device(), e.what());
    return;
  }
  if (!epochs_.end(own.get())) return;
  for_each_arena([&](Arena& arena) { arena.set_epoch(epochs_.current()); });
}

bool StreamHeap::quiet(const Block& free_block, OwnFence& own) {
  try {
    if (own.get() == nullptr) return true;
    epochs_.poll();
  } catch (const Error& e) {
    // Not known to be quiet, so not quiet: the page stays, a fresh one is made.
    log::debug("device {}: asking whether free space is quiet failed: {}", device_.device(),
               e.what());
  }
  return epochs_.quiet(free_block.freed_epoch);
}

std::size_t StreamHeap::reclaim_pages(std::size_t wanted, Take take) {
  std::lock_guard lock(mu_);
  if (table_.retiring()) settle_retiring(false);
  OwnFence own(*this);
  // Work enqueued on this stream before its blocks were freed may still touch their pages.
  if (take == Take::idle && own.get() != nullptr) return 0;
  if (take == Take::any) return_stray_remote_pages(own);
  std::vector<Page> pages;
  std::size_t taken = 0;
  try {
    taken = reclaim_locked(wanted, pages, own, take);
  } catch (...) {
    device_.pool().put(pages);  // those taken before the failure
    throw;
  }
  device_.pool().put(pages);
  return taken;
}

void StreamHeap::settle(bool wait) {
  std::lock_guard lock(mu_);
  settle_retiring(wait);
}

}  // namespace salus::memory
