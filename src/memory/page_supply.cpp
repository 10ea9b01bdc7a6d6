#include "memory/page_supply.hpp"

#include <algorithm>
#include <iterator>

#include "log/log.hpp"

namespace salus::memory {

std::size_t PageSupply::gather(Arena& arena, std::size_t first, std::size_t last,
                               std::size_t missing, std::vector<Page>& pages,
                               std::vector<Page>& stash, bool fresh_chunks) {
  pages.reserve(missing);
  std::size_t got = p_.pool.acquire_kept(missing, pages);
  // Without fresh chunks the caller asks other streams for spare pages next and tries again:
  // this heap's own are for that try, so that nothing moves on a try that fails.
  if (got < missing && !fresh_chunks) return missing - got;
  OwnFence own(p_.stream);
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
        log::debug("device {}: taking spare pages failed: {}", p_.device, e.what());
        got = pages.size();
      }
    }
  }
  if (got < missing) got += p_.pool.acquire(missing - got, pages);
  // The block is live now, so reclaiming cannot take pages from under it.
  if (got < missing) got += reclaim(missing - got, pages, own, Take::any);
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

std::size_t PageSupply::take_spare(std::size_t wanted, std::size_t missing,
                                   std::vector<Page>& pages, OwnFence& own) {
  std::size_t got = reclaim(wanted, pages, own, Take::spare);
  // Short of quiet pages while the GPU is behind: pages it may still touch, their old addresses
  // kept until it has (the stream orders the new block after that work anyway). An old address
  // that is needed again before then gets a fresh page, so this pays only where fragmentation
  // strands pages: large blocks (optimizer state made in the first iteration splits the
  // activations' space, and the next iteration's large tensors no longer fit it), and not in a
  // first iteration, whose free space the next one reuses in place.
  if (got < wanted && missing >= kFencedMovePages && iterations_ended_ > 0) {
    got += reclaim(wanted - got, pages, own, Take::spare_fenced);
  }
  // A fence now lets the space freed so far count as quiet once the GPU has caught up.
  if (got < wanted) end_epoch();
  return got;
}

std::size_t PageSupply::reclaim(std::size_t wanted, std::vector<Page>& out, OwnFence& own,
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
      if (!slot.owned() || slot.where != p_.pool.where()) continue;
      if ((take == Take::idle || take == Take::spare) && !settled(slot.fence)) continue;
      if (spare) {
        if (arena.gave_spare(i)) continue;
        arena.mark_gave_spare(i);
        // Quiet: nothing can touch the old address, which goes at once.
        out.push_back(take == Take::spare ? p_.table.unmap_page(arena, i)
                                          : p_.table.hand_off(arena, i, own.get()));
      } else {
        out.push_back(p_.table.hand_off(arena, i, own.get()));
      }
      ++taken;
    }
  };
  p_.arenas.for_each([&](Arena& arena) {
    if (taken >= wanted) return;
    arena.for_each_free_holding_pages([&](const Block& b) {
      visit(arena, b);
      return taken < wanted;
    });
  });
  return taken;
}

void PageSupply::end_iteration() {
  ++iterations_ended_;
  end_epoch();
}

void PageSupply::end_epoch() {
  OwnFence own(p_.stream);
  try {
    (void)own.get();
  } catch (const Error& e) {
    // Without its fence the epoch goes on: its frees count as quiet with the next one.
    log::debug("device {}: no fence for an epoch: {}", p_.device, e.what());
    return;
  }
  if (!epochs_.end(own.get())) return;
  p_.arenas.set_epoch(epochs_.current());
}

bool PageSupply::quiet(const Block& free_block, OwnFence& own) {
  try {
    if (own.get() == nullptr) return true;
    epochs_.poll();
  } catch (const Error& e) {
    // Not known to be quiet, so not quiet: the page stays, a fresh one is made.
    log::debug("device {}: asking whether free space is quiet failed: {}", p_.device, e.what());
  }
  return epochs_.quiet(free_block.freed_epoch);
}

Block* PageSupply::carve_in(Arena& arena, std::size_t bytes) {
  // A block over addresses still retiring could be mapped only after waiting on the host; a few
  // detours elsewhere in the (generous) address space usually find one that need not wait.
  constexpr int kMaxDetours = 4;
  for (int detour = 0;; ++detour) {
    Block* block = arena.carve(bytes);
    if (block == nullptr) {
      if (std::none_of(detours_.begin(), detours_.end(),
                       [&](const auto& d) { return d.first == &arena; })) {
        return nullptr;
      }
      // Out of addresses: the set-aside blocks come back, and the wait is the way forward.
      std::erase_if(detours_, [&](const auto& d) {
        if (d.first == &arena) release_block(d.second);
        return d.first == &arena;
      });
      return arena.carve(bytes);
    }
    if (!p_.table.retiring() || detour == kMaxDetours ||
        !PageTable::awaits_retiring(arena, *block)) {
      return block;
    }
    detours_.emplace_back(&arena, block);
  }
}

void PageSupply::settle_retiring(bool wait) {
  p_.table.settle_retiring(wait);
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

void PageSupply::unmap_all() {
  settle_retiring(true);
  std::vector<Page> pages;
  p_.arenas.for_each([&](Arena& arena) {
    for (std::size_t i = 0; i < arena.page_count(); ++i) {
      if (!arena.page(i).owned()) continue;
      try {
        if (arena.page(i).fence) arena.page(i).fence->wait();
        pages.push_back(p_.table.unmap_page(arena, i));
      } catch (const Error& e) {
        log::error("unmapping at shutdown failed: {}", e.what());
      }
    }
  });
  p_.tiers.give_back(p_.device, pages);
}

void PageSupply::release_with_remote_pages(Arena& arena, Block* block) {
  auto [first, last] = arena.pages_touched(*block);
  const Block* merged = arena.release(block);
  return_remote_pages(arena, first, last, *merged);
}

void PageSupply::return_stray_remote_pages(OwnFence& own) {
  if (p_.table.remote_pages() == 0) return;
  std::vector<Page> pages;
  try {
    p_.arenas.for_each([&](Arena& arena) {
      arena.for_each_free_holding_pages([&](const Block& free_block) {
        auto [first, last] = arena.pages_inside(free_block);
        last = std::min(last, arena.mapped_high());
        for (std::size_t i = first; i < last; ++i) {
          const PageSlot& slot = arena.page(i);
          if (slot.owned() && tier_of(slot.where, p_.device) != Tier::local) {
            pages.push_back(p_.table.hand_off(arena, i, own.get()));
          }
        }
        return true;
      });
    });
  } catch (const Error& e) {
    log::warn("device {}: returning borrowed pages failed: {}", p_.device, e.what());
  }
  p_.tiers.give_back(p_.device, pages);
}

void PageSupply::return_remote_pages(Arena& arena, std::size_t first, std::size_t last,
                                     const Block& merged) {
  std::vector<Page> pages;
  OwnFence own(p_.stream);
  try {
    for (std::size_t i = first; i < last; ++i) {
      const PageSlot& slot = arena.page(i);
      if (slot.owned() && tier_of(slot.where, p_.device) != Tier::local &&
          !live_touches(arena, i, merged)) {
        pages.push_back(p_.table.hand_off(arena, i, own.get()));
      }
    }
  } catch (const Error& e) {
    // The free is done; handing borrowed pages back early is not part of it. A page whose fence
    // could not be recorded stays here as free space, and a later free, trim or recall returns it.
    log::warn("device {}: returning borrowed pages after a free failed: {}", p_.device, e.what());
  }
  p_.tiers.give_back(p_.device, pages);
}

bool PageSupply::live_touches(Arena& arena, std::size_t index, const Block& from) const {
  // Blocks set aside by carve_in hold addresses, not data: only live blocks keep a page.
  const DevicePtr lo = arena.page_addr(index);
  const DevicePtr hi = lo + arena.page_bytes();
  for (const Block* b = &from; b != nullptr && b->end() > lo; b = b->prev) {
    if (b->addr < hi && p_.live.contains(b->addr)) return true;
  }
  for (const Block* b = from.next; b != nullptr && b->addr < hi; b = b->next) {
    if (b->end() > lo && p_.live.contains(b->addr)) return true;
  }
  return false;
}

}  // namespace salus::memory
