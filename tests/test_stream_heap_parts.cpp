// Parts of a stream heap, alone: which free space is quiet (QuietEpochs) and the address ranges
// published for lock-free lookups (AddressRanges). The heap itself is tested through the memory
// manager and the contract suites.
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "memory/address_ranges.hpp"
#include "memory/event_pool.hpp"
#include "memory/fence.hpp"
#include "memory/quiet_epochs.hpp"
#include "salus/sim.hpp"
#include "support/stream_gate.hpp"

namespace salus::memory {
namespace {

// --- QuietEpochs ---------------------------------------------------------------------------------

// A fence after work held at a gate the test opens: not done until then.
struct QuietEpochsBehindWork : ::testing::Test {
  std::shared_ptr<DeviceBackend> backend =
      make_sim_backend(SimConfig::uniform(1, std::size_t{64} << 20));
  StreamHandle stream = backend->create_stream(0, 0);
  std::shared_ptr<EventPool> events = EventPool::make(backend, 0);
  std::atomic<bool> done{false};
  std::promise<void> gate = test_support::block_stream(*backend, stream, done);
  bool opened = false;

  void open() {
    if (!std::exchange(opened, true)) gate.set_value();
  }
  FencePtr fence() {
    const StreamHandle streams[] = {stream};
    return Fence::after(*events, streams);
  }
  ~QuietEpochsBehindWork() override {
    open();
    backend->synchronize_stream(stream);
    backend->destroy_stream(stream);
  }
};

TEST(QuietEpochs, AnEpochThatEndsWithNothingQueuedMakesAllFreedSoFarQuiet) {
  QuietEpochs epochs;
  const std::uint64_t first = epochs.current();
  EXPECT_FALSE(epochs.quiet(first)) << "nothing ended yet";
  ASSERT_TRUE(epochs.end(nullptr));
  EXPECT_EQ(epochs.current(), first + 1);
  EXPECT_TRUE(epochs.quiet(first));
  EXPECT_FALSE(epochs.quiet(epochs.current())) << "what is freed now is not";
}

TEST_F(QuietEpochsBehindWork, AnEpochIsQuietOnceItsFenceHasCompletedAndNotBefore) {
  QuietEpochs epochs;
  const std::uint64_t first = epochs.current();
  const FencePtr work = fence();
  ASSERT_NE(work, nullptr);
  ASSERT_TRUE(epochs.end(work));
  epochs.poll();
  EXPECT_FALSE(epochs.quiet(first)) << "its work is held";
  EXPECT_EQ(epochs.pending(), 1u);
  open();
  backend->synchronize_stream(stream);
  epochs.poll();
  EXPECT_TRUE(epochs.quiet(first));
  EXPECT_EQ(epochs.pending(), 0u);
  EXPECT_FALSE(epochs.quiet(epochs.current()));
}

TEST_F(QuietEpochsBehindWork, AtMostKMaxFencesWaitAndAnEpochPastThemGoesOn) {
  QuietEpochs epochs;
  const FencePtr work = fence();
  for (std::size_t i = 0; i < QuietEpochs::kMaxFences; ++i) ASSERT_TRUE(epochs.end(work));
  const std::uint64_t now = epochs.current();
  EXPECT_FALSE(epochs.end(work)) << "a ninth fence would grow without bound";
  EXPECT_EQ(epochs.current(), now) << "the epoch goes on: its frees wait for a later fence";
  EXPECT_TRUE(epochs.end(nullptr)) << "an idle stream ends it whatever is pending";
  EXPECT_TRUE(epochs.quiet(now));
  EXPECT_EQ(epochs.pending(), 0u);
}

// --- AddressRanges -------------------------------------------------------------------------------

TEST(AddressRanges, AnAddressIsInARangeFromItsBaseUpToItsEnd) {
  AddressRanges ranges;
  EXPECT_FALSE(ranges.contains(0x1000));
  ranges.add(0x1000, 0x100);
  ranges.add(0x8000, 0x10);
  EXPECT_EQ(ranges.count(), 2u);
  EXPECT_TRUE(ranges.contains(0x1000));
  EXPECT_TRUE(ranges.contains(0x10ff));
  EXPECT_FALSE(ranges.contains(0x1100)) << "the end is outside";
  EXPECT_FALSE(ranges.contains(0xfff));
  EXPECT_TRUE(ranges.contains(0x800f));
  EXPECT_FALSE(ranges.full());
  for (std::size_t i = 2; i < AddressRanges::kMax; ++i) ranges.add(0x100000 * (i + 1), 1);
  EXPECT_TRUE(ranges.full());
}

// A reader that takes no lock sees every range the count it read covers, whole.
TEST(AddressRangesConcurrency, AReaderSeesEveryPublishedRangeWhole) {
  AddressRanges ranges;
  const auto base = [](std::size_t i) { return DevicePtr{0x100000} * (i + 1); };
  std::atomic<bool> stop{false};
  std::atomic<std::size_t> misses{0};
  std::atomic<std::size_t> reads{0};
  std::thread reader([&] {
    while (!stop.load(std::memory_order_acquire)) {
      const std::size_t n = ranges.count();
      for (std::size_t i = 0; i < n; ++i) {
        if (!ranges.contains(base(i)) || !ranges.contains(base(i) + 0xfff)) ++misses;
      }
      ++reads;
    }
  });
  for (std::size_t i = 0; i < AddressRanges::kMax; ++i) {
    ranges.add(base(i), 0x1000);
    std::this_thread::yield();
  }
  const std::size_t seen = reads.load();
  while (reads.load() < seen + 2) std::this_thread::yield();  // a whole read after the last add
  stop.store(true, std::memory_order_release);
  reader.join();
  EXPECT_EQ(misses.load(), 0u);
  EXPECT_EQ(ranges.count(), AddressRanges::kMax);
}

}  // namespace
}  // namespace salus::memory
