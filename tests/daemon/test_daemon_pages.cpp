// DaemonPages alone (remote/daemon_pages.hpp): the GPU pages a connected process holds, taken
// from a real salusd in batches and given back in batches, with no memory manager above them.
#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "remote/daemon_pages.hpp"
#include "salus/sim.hpp"

#include "daemon/salusd_fixture.hpp"

namespace salusd_test {
namespace {

using salus::ChunkHandle;
using salus::Location;
using salus::MiB;

using PagesFromSalusd = Salusd;
using ConcurrentPagesFromSalusd = Salusd;

struct Client {
  explicit Client(const std::string& socket)
      : link(std::make_shared<salus::remote::DaemonLink>(socket)),
        local(salus::make_sim_backend(salus::SimConfig::uniform(1, 1 * salus::GiB))),
        pages(local, link, 2 * MiB) {}
  std::shared_ptr<salus::remote::DaemonLink> link;
  std::shared_ptr<salus::DeviceBackend> local;
  salus::remote::DaemonPages pages;
};

TEST_F(PagesFromSalusd, OneRoundTripBringsABatchThatServesTheNextTakes) {
  start_daemon({"--memory", "64MiB"});  // 32 pages
  Client c(socket_);
  std::vector<ChunkHandle> taken{c.pages.take(0)};
  EXPECT_EQ(c.pages.held(0), 16u) << "the first take fetched a batch of 16";
  EXPECT_EQ(c.pages.in_use(0), 1u);
  for (int i = 1; i < 16; ++i) taken.push_back(c.pages.take(0));
  EXPECT_EQ(c.pages.held(0), 16u) << "the batch served 15 more takes with no fetch";
  taken.push_back(c.pages.take(0));
  EXPECT_EQ(c.pages.held(0), 32u) << "the 17th fetched the next batch";
  EXPECT_EQ(c.pages.in_use(0), 17u);
  for (const ChunkHandle chunk : taken) EXPECT_TRUE(c.pages.release(chunk));
  EXPECT_EQ(c.pages.in_use(0), 0u);
}

TEST_F(PagesFromSalusd, ReleasedPagesStayHeldUntilGivenBack) {
  start_daemon({"--memory", "32MiB"});  // 16 pages: one batch takes them all
  Client c(socket_);
  const ChunkHandle a = c.pages.take(0);
  const ChunkHandle b = c.pages.take(0);
  EXPECT_TRUE(c.pages.release(a));
  EXPECT_EQ(c.pages.held(0), 16u) << "a released page waits for the next batch back";
  EXPECT_EQ(c.pages.in_use(0), 1u);
  EXPECT_EQ(c.pages.give_back(0), 15u) << "the released page and the 14 spare ones";
  EXPECT_EQ(c.pages.held(0), 1u);
  // The daemon has the 15 again: a second client gets them in one batch, and not the one still
  // in use.
  Client other(socket_);
  std::vector<ChunkHandle> theirs;
  for (int i = 0; i < 15; ++i) theirs.push_back(other.pages.take(0));
  EXPECT_EQ(other.pages.held(0), 15u);
  EXPECT_TRUE(c.pages.release(b));
  EXPECT_EQ(c.pages.give_back(0), 1u);
  EXPECT_NO_THROW(theirs.push_back(other.pages.take(0))) << "now it is theirs to take";
  EXPECT_EQ(other.pages.held(0), 16u);
  for (const ChunkHandle chunk : theirs) EXPECT_TRUE(other.pages.release(chunk));
}

TEST_F(PagesFromSalusd, AChunkThatIsNotTheDaemonsIsLeftToTheCaller) {
  start_daemon({"--memory", "32MiB"});
  Client c(socket_);
  const ChunkHandle own = c.local->create_chunk(Location::gpu(0), 2 * MiB);
  EXPECT_FALSE(c.pages.release(own));
  EXPECT_EQ(c.pages.take_arrival(own), nullptr);
  EXPECT_NO_THROW(c.local->release_chunk(own)) << "still held: DaemonPages did not release it";
  EXPECT_EQ(c.pages.held(0), 0u) << "and asked the daemon for nothing";
}

TEST_F(PagesFromSalusd, PagesGivenBackBehindFinishedWorkGoBackSettled) {
  start_daemon({"--memory", "32MiB"});
  Client c(socket_);
  std::vector<ChunkHandle> chunks{c.pages.take(0), c.pages.take(0)};
  const salus::StreamHandle stream = c.local->create_stream(0, 0);
  auto done = std::make_shared<const salus::Event>(c.local, 0);
  c.local->record_event(done->handle(), stream);
  done->synchronize();
  const std::vector<std::shared_ptr<const salus::Event>> work{done};
  c.pages.release_after(chunks, work);
  EXPECT_EQ(c.pages.in_use(0), 0u);
  EXPECT_EQ(c.pages.fences().own_opened(), 0u);
  EXPECT_EQ(c.pages.give_back(0), 16u) << "both as released pages, with the 14 spare";
  c.local->destroy_stream(stream);
}

// Threads take and release pages at once, some releasing through release_after: each page is
// counted once, and every page comes home.
TEST_F(ConcurrentPagesFromSalusd, ThreadsTakingAndReleasingKeepOneCount) {
  start_daemon({"--memory", "256MiB"});  // 128 pages
  Client c(socket_);
  constexpr int kThreads = 4;
  constexpr int kRounds = 60;
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(static_cast<unsigned>(t) + 1);
      std::vector<ChunkHandle> mine;
      for (int r = 0; r < kRounds; ++r) {
        const int n = 1 + static_cast<int>(rng() % 6);
        for (int i = 0; i < n; ++i) mine.push_back(c.pages.take(0));
        const auto keep = static_cast<std::size_t>(rng() % 3);
        while (mine.size() > keep) {
          if (!c.pages.release(mine.back())) failures.fetch_add(1);
          mine.pop_back();
        }
      }
      if (!mine.empty()) c.pages.release_after(mine, {});
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0) << "every page taken was known as the daemon's";
  EXPECT_EQ(c.pages.in_use(0), 0u);
  const std::size_t held = c.pages.held(0);
  EXPECT_EQ(c.pages.give_back(0), held) << "every held page went home";
  EXPECT_EQ(c.pages.held(0), 0u);
}

}  // namespace
}  // namespace salusd_test
