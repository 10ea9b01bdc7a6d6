// PageTable alone, on the simulated backend: what it maps and unmaps, what it counts, and that a
// page handed to a new user stays mapped at its old address while work queued there may still
// touch it. It takes the parts of a device it uses (backend, counters, grants), so no DeviceHeap
// or StreamHeap is built here.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <vector>

#include "memory/device_counters.hpp"
#include "memory/event_pool.hpp"
#include "memory/fence.hpp"
#include "memory/page_table.hpp"
#include "salus/error.hpp"
#include "salus/sim.hpp"
#include "support/stream_gate.hpp"

namespace salus::memory {
namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t kPages = 8;

class PageTableTest : public ::testing::Test {
 protected:
  PageTableTest()
      : backend_(make_sim_backend(SimConfig::uniform(1, 64 * MiB))),
        page_(backend_->granularity(Location::gpu(0))),
        grants_(1, 0, [](int, int) { return false; }),
        table_({*backend_, counters_, grants_, 0}),
        arena_(backend_->reserve_address(kPages * page_, page_), kPages * page_, page_) {}

  ~PageTableTest() override {
    table_.settle_retiring(true);
    for (std::size_t i = 0; i < kPages; ++i) {
      if (arena_.page(i).owned()) (void)table_.unmap_page(arena_, i);
    }
    for (const ChunkHandle chunk : chunks_) backend_->release_chunk(chunk);
    backend_->free_address(arena_.base(), arena_.bytes());
  }

  // `n` fresh pages of device 0, as the pool hands them out.
  std::vector<Page> fresh_pages(std::size_t n) {
    std::vector<Page> pages;
    for (std::size_t i = 0; i < n; ++i) {
      chunks_.push_back(backend_->create_chunk(Location::gpu(0), page_));
      pages.push_back({chunks_.back(), nullptr, Location::gpu(0)});
    }
    return pages;
  }

  std::size_t mapped_slots() {
    std::size_t n = 0;
    for (std::size_t i = 0; i < kPages; ++i) n += arena_.page(i).mapped ? 1 : 0;
    return n;
  }

  std::shared_ptr<DeviceBackend> backend_;
  std::size_t page_;
  DeviceCounters counters_;
  AccessGrants grants_;
  PageTable table_;
  Arena arena_;
  std::vector<ChunkHandle> chunks_;
};

TEST_F(PageTableTest, MapsTheUnmappedPagesOfARangeAndCountsEach) {
  std::vector<Page> pages = fresh_pages(4);
  const ChunkHandle last = pages.back().chunk;
  table_.map_pages(arena_, 2, 6, pages, StreamHandle{0});
  EXPECT_TRUE(pages.empty());
  EXPECT_EQ(mapped_slots(), 4u);
  EXPECT_EQ(arena_.page(2).chunk.value, last.value);  // taken from the back, in page order
  EXPECT_EQ(counters_.page_maps.load(), 4u);
  EXPECT_EQ(counters_.mapped.load(), 4 * page_);
  EXPECT_EQ(arena_.mapped_high(), 6u);
  // Mapped pages are skipped: a second call over the range maps only what is missing.
  std::vector<Page> more = fresh_pages(2);
  table_.map_pages(arena_, 0, 6, more, StreamHandle{0});
  EXPECT_TRUE(more.empty());
  EXPECT_EQ(counters_.page_maps.load(), 6u);
  EXPECT_EQ(mapped_slots(), 6u);
}

TEST_F(PageTableTest, TooFewPagesForTheRangeMapNoneAndLoseNone) {
  std::vector<Page> pages = fresh_pages(2);
  EXPECT_THROW(table_.map_pages(arena_, 0, 3, pages, StreamHandle{0}), InvalidArgument);
  EXPECT_EQ(pages.size(), 2u);
  EXPECT_EQ(mapped_slots(), 0u);
  EXPECT_EQ(counters_.mapped.load(), 0u);
}

TEST_F(PageTableTest, AMapThatFailsHalfwayPutsEveryPageBackUnmapped) {
  std::vector<Page> pages = fresh_pages(2);
  // Mapped third (the back goes first): a chunk the backend never made.
  pages.insert(pages.begin(), Page{ChunkHandle{12345}, nullptr, Location::gpu(0)});
  EXPECT_THROW(table_.map_pages(arena_, 0, 3, pages, StreamHandle{0}), Error);
  EXPECT_EQ(pages.size(), 3u);
  EXPECT_EQ(mapped_slots(), 0u);
  EXPECT_EQ(counters_.mapped.load(), 0u);
  EXPECT_EQ(counters_.page_unmaps.load(), counters_.page_maps.load());
  // The good pages map again once the bad one is gone.
  std::erase_if(pages, [](const Page& p) { return p.chunk.value == 12345; });
  table_.map_pages(arena_, 0, 2, pages, StreamHandle{0});
  EXPECT_EQ(mapped_slots(), 2u);
}

TEST_F(PageTableTest, APageHandedOffWithNoWorkQueuedIsUnmappedAtOnce) {
  std::vector<Page> pages = fresh_pages(1);
  table_.map_pages(arena_, 0, 1, pages, StreamHandle{0});
  const Page given = table_.hand_off(arena_, 0, nullptr);
  EXPECT_EQ(given.fence, nullptr);
  EXPECT_FALSE(arena_.page(0).mapped);
  EXPECT_FALSE(table_.retiring());
  EXPECT_EQ(counters_.page_unmaps.load(), 1u);
  EXPECT_EQ(counters_.deferred_unmaps.load(), 0u);
  chunks_.clear();  // given away: the new user releases it
  backend_->release_chunk(given.chunk);
}

TEST_F(PageTableTest, APageHandedOffBehindQueuedWorkStaysMappedUntilThatWorkEnds) {
  std::vector<Page> pages = fresh_pages(1);
  table_.map_pages(arena_, 0, 1, pages, StreamHandle{0});
  const StreamHandle stream = backend_->create_stream(0, 0);
  std::atomic<bool> done{false};
  std::promise<void> gate = test_support::block_stream(*backend_, stream, done);
  auto events = EventPool::make(backend_, 0);
  const StreamHandle streams[] = {stream};
  const FencePtr work = Fence::after(*events, streams);
  ASSERT_NE(work, nullptr);

  const Page given = table_.hand_off(arena_, 0, work);
  ASSERT_NE(given.fence, nullptr);  // the new user orders its work after the old
  EXPECT_TRUE(arena_.page(0).mapped);
  EXPECT_TRUE(arena_.page(0).retiring);
  EXPECT_FALSE(arena_.page(0).owned());
  EXPECT_EQ(counters_.mapped.load(), 0u);  // no longer this arena's
  EXPECT_EQ(counters_.retiring.load(), page_);
  EXPECT_EQ(counters_.deferred_unmaps.load(), 1u);
  table_.settle_retiring(false);  // the work has not ended: the address keeps the page
  EXPECT_TRUE(table_.retiring());
  EXPECT_EQ(counters_.page_unmaps.load(), 0u);

  gate.set_value();
  table_.settle_retiring(true);
  EXPECT_TRUE(done.load());  // unmapped only after the work that might touch it
  EXPECT_FALSE(table_.retiring());
  EXPECT_FALSE(arena_.page(0).mapped);
  EXPECT_EQ(counters_.page_unmaps.load(), 1u);
  EXPECT_EQ(counters_.retiring.load(), 0u);
  backend_->synchronize_stream(stream);
  backend_->destroy_stream(stream);
  chunks_.clear();
  backend_->release_chunk(given.chunk);
}

}  // namespace
}  // namespace salus::memory
