// More parts of a stream heap, alone, on the simulated backend: the stream it serves and fences
// after that stream's work (HeapStream), its address space and where a new block goes
// (HeapArenas), and where a new block's pages come from (PageSupply). Each takes the parts of a
// device it uses, so no DeviceHeap or StreamHeap is built here.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "memory/device_counters.hpp"
#include "memory/event_pool.hpp"
#include "memory/heap_arenas.hpp"
#include "memory/heap_stream.hpp"
#include "memory/page_pool.hpp"
#include "memory/page_supply.hpp"
#include "memory/page_table.hpp"
#include "memory/quiet_epochs.hpp"
#include "memory/tiers.hpp"
#include "salus/sim.hpp"
#include "support/stream_gate.hpp"

namespace salus::memory {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// A device's parts, and a stream whose work the test can hold at a gate.
struct HeapPartsTest : ::testing::Test {
  std::shared_ptr<DeviceBackend> backend =
      make_sim_backend(SimConfig::uniform(1, std::size_t{64} * MiB));
  std::size_t page = backend->granularity(Location::gpu(0));
  StreamHandle handle = backend->create_stream(0, 0);
  std::shared_ptr<EventPool> events = EventPool::make(backend, 0);
  std::atomic<bool> done{false};
  std::promise<void> gate;
  bool held = false;

  void hold() {
    done.store(false);
    gate = test_support::block_stream(*backend, handle, done);
    held = true;
  }
  void release() {
    if (std::exchange(held, false)) gate.set_value();
    backend->synchronize_stream(handle);
  }
  ~HeapPartsTest() override {
    release();
    backend->destroy_stream(handle);
  }
};

// --- HeapStream ----------------------------------------------------------------------------------

TEST_F(HeapPartsTest, AnIdleStreamNeedsNoFenceAndABusyOneGetsOneAskedOnce) {
  HeapStream stream(*backend, *events, 0, handle);
  EXPECT_EQ(stream.stream().value, handle.value);
  OwnFence idle(stream);
  EXPECT_EQ(idle.get(), nullptr) << "nothing queued can touch a page";
  hold();
  OwnFence busy(stream);
  const FencePtr fence = busy.get();
  ASSERT_NE(fence, nullptr);
  EXPECT_EQ(busy.get(), fence) << "one fence per OwnFence, whatever asks";
  EXPECT_FALSE(fence->done());
  release();
  EXPECT_TRUE(fence->done());
}

TEST_F(HeapPartsTest, ARetiredStreamsWorkIsItsRetireFenceUntilThatSettles) {
  HeapStream stream(*backend, *events, 0, handle);
  hold();
  FencePtr fence = OwnFence(stream).get();
  ASSERT_NE(fence, nullptr);
  stream.retire(fence);
  EXPECT_TRUE(stream.retired());
  EXPECT_EQ(stream.stream().value, HeapStream::kRetired) << "lookups skip a retired heap";
  EXPECT_EQ(OwnFence(stream).get(), fence) << "the retire fence, not a record on the stream";
  release();
  EXPECT_EQ(OwnFence(stream).get(), nullptr) << "settled: nothing left to wait for";
  const StreamHandle next{handle.value + 1};
  stream.bind(next);
  EXPECT_FALSE(stream.retired());
  EXPECT_EQ(stream.stream().value, next.value);
  EXPECT_EQ(stream.retire_fence(), nullptr);
}

// A reader that takes no lock sees the bound stream or the retired mark, never anything else.
using ConcurrentHeapStream = HeapPartsTest;
TEST_F(ConcurrentHeapStream, AReaderWithoutTheLockSeesOnlyWholeHandles) {
  HeapStream stream(*backend, *events, 0, handle);
  const StreamHandle other{handle.value + 1};
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> odd{0};
  std::thread reader([&] {
    while (!stop.load(std::memory_order_acquire)) {
      const std::uint64_t v = stream.stream().value;
      if (v != handle.value && v != other.value && v != HeapStream::kRetired) ++odd;
    }
  });
  for (int i = 0; i < 1000; ++i) {
    stream.retire(nullptr);
    stream.bind(i % 2 == 0 ? other : handle);
  }
  stop.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(odd.load(), 0u);
}

// --- HeapArenas ----------------------------------------------------------------------------------

struct HeapArenasTest : HeapPartsTest {
  PagePool pool{*backend, Location::gpu(0), page, std::size_t{64} * MiB};
  HeapArenas arenas{*backend, page, 0, 2 * page, 4 * page, QuietEpochs::kFirst};
  int cuts = 0;  // carve_in calls

  // The heap's cut, plainly: no block is set aside.
  struct Cutter {
    int& cuts;
    Block* carve_in(Arena& arena, std::size_t bytes) {
      ++cuts;
      return arena.carve(bytes);
    }
    [[nodiscard]] std::uint64_t epoch() const { return QuietEpochs::kFirst; }
  };
  Arena& first(HeapArenas::SizeClass c) { return *arenas.set()[c].front(); }
  Block* place(std::size_t bytes, Arena*& where) {
    Cutter cutter{cuts};
    return arenas.place(bytes, where, pool, cutter);
  }
};

TEST_F(HeapArenasTest, ReservesAFirstRangePerClassAndGrowsAClassThatIsOutOfRoom) {
  EXPECT_EQ(arenas.count(), 2u);
  EXPECT_TRUE(arenas.contains(first(HeapArenas::kLarge).base()));
  Arena* where = nullptr;
  Block* block = place(8 * page, where);
  ASSERT_NE(block, nullptr);
  EXPECT_EQ(cuts, 1) << "the first large range was tried, and had no room";
  EXPECT_EQ(arenas.count(), 3u);
  EXPECT_NE(where, &first(HeapArenas::kLarge));
  EXPECT_EQ(where->bytes(), 8 * page) << "as large as the request, above the first range";
  EXPECT_TRUE(arenas.contains(block->addr));
  EXPECT_EQ(&arenas.arena_of(*block), where);
}

TEST_F(HeapArenasTest, TheSteadyStateTakesAMappedSpotInTheFirstRangeAndCutsNowhereElse) {
  Arena& large = first(HeapArenas::kLarge);
  Arena* where = nullptr;
  Block* fresh = place(2 * page, where);
  ASSERT_NE(fresh, nullptr);
  EXPECT_EQ(cuts, 1) << "its pages would be mapped: the heap's cut decides";
  large.release(fresh);
  for (std::size_t i = 0; i < 2; ++i) large.page(i).mapped = true;
  Block* steady = place(2 * page, where);
  ASSERT_NE(steady, nullptr);
  EXPECT_EQ(cuts, 1) << "mapped already: one lookup, no cut";
  EXPECT_EQ(where, &large);
  EXPECT_EQ(steady->addr, large.base());
  large.release(steady);
  for (std::size_t i = 0; i < 2; ++i) large.page(i).mapped = false;
}

TEST_F(HeapArenasTest, ASmallBlockThatWouldNeedAFreshPageGoesOnTheLargeClassesMappedFreeSpace) {
  Arena& large = first(HeapArenas::kLarge);
  Arena* where = nullptr;
  Block* alone = place(4096, where);
  ASSERT_NE(alone, nullptr);
  EXPECT_EQ(where, &first(HeapArenas::kSmall)) << "nothing mapped anywhere: its own class";
  where->release(alone);
  large.page(0).mapped = true;
  Block* over = place(4096, where);
  ASSERT_NE(over, nullptr);
  EXPECT_EQ(where, &large) << "the large class's mapped page holds it at no cost";
  EXPECT_EQ(large.unmapped_pages(over->addr, over->size), 0u);
  large.release(over);
  large.page(0).mapped = false;
}

// --- PageSupply ----------------------------------------------------------------------------------

struct PageSupplyTest : HeapPartsTest {
  DeviceCounters counters;
  AccessGrants grants{1, 0, [](int, int) { return false; }};
  PagePool pool{*backend, Location::gpu(0), page, std::size_t{64} * MiB};
  Tiers tiers{*backend, HarvestOptions{}};
  HeapStream stream{*backend, *events, 0, handle};
  HeapArenas arenas{*backend, page, 0, 8 * page, 16 * page, QuietEpochs::kFirst};
  PageTable table{{*backend, counters, grants, 0}};
  LiveIndex live;
  PageSupply supply{{arenas, table, live, stream, pool, tiers, 0}};
  Arena& large = *arenas.set()[HeapArenas::kLarge].front();

  PageSupplyTest() { tiers.add_device(pool); }
  // Three blocks of two pages, at pages [0, 2), [2, 4) and [4, 6); the first mapped and freed.
  Block* setup_spare() {
    Block* spare = large.carve(2 * page);
    (void)large.carve(2 * page);
    Block* wanting = large.carve(2 * page);
    std::vector<Page> pages;
    EXPECT_EQ(pool.acquire(2, pages), 2u);
    table.map_pages(large, 0, 2, pages, handle);
    supply.release_block(spare);
    return wanting;
  }
  ~PageSupplyTest() override {
    release();
    table.settle_retiring(true);
    std::vector<Page> pages;
    arenas.for_each([&](Arena& arena) {
      for (std::size_t i = 0; i < arena.page_count(); ++i) {
        if (arena.page(i).owned()) pages.push_back(table.unmap_page(arena, i));
      }
    });
    pool.put(pages);
  }
};

TEST_F(PageSupplyTest, ANewBlockTakesQuietSparePagesBeforeFreshChunks) {
  setup_spare();
  ASSERT_EQ(pool.held_bytes(), 2 * page);
  std::vector<Page> pages;
  std::vector<Page> stash;
  ASSERT_EQ(table.prepare_pages(large, 4, 6), 2u);
  EXPECT_EQ(supply.gather(large, 4, 6, 2, pages, stash, true), 0u);
  EXPECT_EQ(pages.size(), 2u);
  EXPECT_EQ(pool.held_bytes(), 2 * page) << "no fresh chunk";
  EXPECT_FALSE(large.page(0).mapped) << "quiet: its old address went at once";
  EXPECT_TRUE(large.gave_spare(0));
  EXPECT_FALSE(table.retiring());
  table.map_pages(large, 4, 6, pages, handle);
}

TEST_F(PageSupplyTest, AnAddressThatGaveItsPageAwayBeforeGetsAFreshOne) {
  setup_spare();
  large.mark_gave_spare(4);
  large.mark_gave_spare(5);
  std::vector<Page> pages;
  std::vector<Page> stash;
  EXPECT_EQ(supply.gather(large, 4, 6, 2, pages, stash, true), 0u);
  EXPECT_EQ(pool.held_bytes(), 4 * page) << "two fresh chunks: pages no longer trade places";
  EXPECT_TRUE(large.page(0).owned()) << "the spare pages stay";
  table.map_pages(large, 4, 6, pages, handle);
}

TEST_F(PageSupplyTest, WithoutFreshChunksItTakesOnlyThePoolsKeptPages) {
  setup_spare();
  std::vector<Page> pages;
  std::vector<Page> stash;
  EXPECT_EQ(supply.gather(large, 4, 6, 2, pages, stash, false), 2u);
  EXPECT_TRUE(pages.empty());
  EXPECT_TRUE(large.page(0).owned()) << "spare pages are for the caller's next try";
  EXPECT_EQ(pool.held_bytes(), 2 * page);
}

TEST_F(PageSupplyTest, FreeSpaceIsSpareOnlyOnceTheEpochItWasFreedInHasEnded) {
  hold();
  setup_spare();  // freed while work is queued
  std::vector<Page> out;
  {
    OwnFence own(stream);
    EXPECT_EQ(supply.reclaim(2, out, own, PageSupply::Take::spare), 0u) << "not quiet yet";
  }
  const std::uint64_t epoch = supply.epoch();
  supply.end_epoch();
  EXPECT_EQ(supply.epoch(), epoch + 1);
  release();  // the ended epoch's fence completes
  hold();     // busy again: only the epoch says the space is quiet
  {
    OwnFence own(stream);
    EXPECT_EQ(supply.reclaim(2, out, own, PageSupply::Take::spare), 2u);
  }
  EXPECT_FALSE(large.page(0).mapped);
  EXPECT_FALSE(table.retiring()) << "quiet pages leave no address retiring";
  pool.put(out);
}

TEST_F(PageSupplyTest, PagesTakenForAnotherUserKeepTheirOldAddressWhileQueuedWorkMayTouchIt) {
  hold();
  setup_spare();
  std::vector<Page> out;
  {
    OwnFence own(stream);
    EXPECT_EQ(supply.reclaim(8, out, own, PageSupply::Take::any), 2u);
  }
  EXPECT_TRUE(table.retiring());
  supply.settle_retiring(false);
  EXPECT_TRUE(large.page(0).retiring) << "its work is held";
  release();
  supply.settle_retiring(false);
  EXPECT_FALSE(table.retiring());
  EXPECT_FALSE(large.page(0).mapped);
  pool.put(out);
}

TEST_F(PageSupplyTest, AtShutdownEveryPageIsUnmappedAndGoesBackToItsPool) {
  Block* wanting = setup_spare();
  std::vector<Page> out;
  {
    OwnFence own(stream);
    ASSERT_EQ(supply.reclaim(1, out, own, PageSupply::Take::any), 1u);
  }
  pool.put(out);
  std::vector<Page> pages;
  ASSERT_EQ(pool.acquire(2, pages), 2u);
  table.map_pages(large, 4, 6, pages, handle);
  ASSERT_EQ(pool.kept_pages(), 0u);
  const std::size_t unmaps = counters.page_unmaps.load();
  supply.unmap_all();
  EXPECT_EQ(pool.kept_pages(), 3u) << "the free page and the live block's two";
  EXPECT_EQ(counters.page_unmaps.load(), unmaps + 3);
  for (std::size_t i = 0; i < large.page_count(); ++i) EXPECT_FALSE(large.page(i).mapped) << i;
  large.release(wanting);
}

}  // namespace
}  // namespace salus::memory
