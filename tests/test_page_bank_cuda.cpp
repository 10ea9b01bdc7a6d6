// salusd's page bank over the CUDA backend (fake driver): a batch of pages must reach the
// importing process as that many distinct allocations. Every descriptor the driver exports looks
// like one file (fake_driver.hpp, "Sharing chunks"), so a bank that merged descriptors by file
// would hand out one physical page for a whole batch; the first GPU run did exactly that.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <set>
#include <sys/stat.h>

#include "cuda/cuda_backend.hpp"
#include "daemon/page_bank.hpp"
#include "daemon/scrubber.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

TEST(PageBankCuda, EachPageOfABatchIsAnAllocationOfItsOwn) {
  FakeDriver fake(FakeDriverConfig::uniform(1, 1 * GiB));
  cuda::CudaBackend backend(fake.api());
  daemon::PageBank bank(backend, 0, kPage, 16 * kPage);
  const std::vector<std::uint64_t> ids = bank.grant(1, 6);
  ASSERT_EQ(ids.size(), 6u);
  daemon::PageBank::Batch batch = bank.export_pages(ids);
  ASSERT_EQ(batch.entries.size(), ids.size());

  // The descriptors all look like one file, as the driver's do.
  std::set<std::pair<dev_t, ino_t>> files;
  for (const auto& fd : batch.fds) {
    struct stat st {};
    ASSERT_EQ(::fstat(fd.get(), &st), 0);
    files.insert({st.st_dev, st.st_ino});
  }
  EXPECT_EQ(files.size(), 1u) << "the fake's exports should share one inode, as the driver's do";

  // Imported (as a client does), mapped and written: each page is memory of its own.
  std::set<CUmemGenericAllocationHandle> allocations;
  std::vector<std::pair<ChunkHandle, DevicePtr>> mapped;
  for (std::size_t i = 0; i < batch.entries.size(); ++i) {
    const remote::PageEntry& e = batch.entries[i];
    ASSERT_LT(e.fd_index, batch.fds.size());
    const ChunkHandle chunk =
        backend.import_chunk(Location::gpu(0), {batch.fds[e.fd_index].get(), e.offset, kPage});
    const DevicePtr va = backend.reserve_address(kPage, 0);
    backend.map(va, kPage, chunk, 0);
    const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
    backend.set_access(va, kPage, grant);
    allocations.insert(fake.chunk_at(va)->handle);
    fake.write_word(va, 0x1000 + i);
    mapped.emplace_back(chunk, va);
  }
  EXPECT_EQ(allocations.size(), ids.size()) << "pages of one batch share an allocation";
  for (std::size_t i = 0; i < mapped.size(); ++i) {
    EXPECT_EQ(fake.read_word(mapped[i].second), 0x1000 + i) << "page " << i << " was overwritten";
  }
  for (const auto& [chunk, va] : mapped) {
    backend.unmap(va, kPage);
    backend.free_address(va, kPage);
    backend.release_chunk(chunk);
  }
}

// Zeroing a page for another user on CUDA (daemon/scrubber.hpp): on the daemon's stream, after a
// wait for the page's last fence, one cuMemsetD8Async of the page, then a record of the fence the
// next holder waits for; the last holder's words are gone once it has run. A second zeroing of
// the same page maps nothing again.
TEST(PageBankCuda, APageForAnotherUserIsZeroedOnTheGpuAfterItsLastFence) {
  FakeDriverConfig config = FakeDriverConfig::uniform(1, 1 * GiB);
  config.ipc_open_own_events = true;  // the one fake plays the daemon and its clients
  FakeDriver fake(config);
  const auto daemon = std::make_shared<cuda::CudaBackend>(fake.api());
  daemon::PageBank bank(*daemon, 0, kPage, 4 * kPage);
  const std::uint64_t id = bank.grant(1, 1).front();
  daemon::PageBank::Batch batch = bank.export_pages({id});

  // The last holder (another process: a backend of its own) writes the page and records a fence.
  cuda::CudaBackend holder(fake.api());
  const ChunkHandle imported =
      holder.import_chunk(Location::gpu(0), {batch.fds.front().get(), 0, kPage});
  const DevicePtr va = holder.reserve_address(kPage, 0);
  holder.map(va, kPage, imported, 0);
  const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
  holder.set_access(va, kPage, grant);
  fake.write_word(va, 0x1234);
  const StreamHandle stream = holder.create_stream(0, 0);
  const EventHandle work = holder.create_shareable_event(0);
  holder.record_event(work, stream);
  const SharedEvent shared = holder.export_event(work);
  auto fence = std::make_shared<daemon::PageBank::Fence>();
  fence->entry.handle = shared.handle;

  {
    daemon::Scrubber scrubber(daemon);
    fake.clear_calls();
    const daemon::PageBank::FencePtr zeroed = scrubber.scrub(0, {{bank.chunk_of(id), fence}}, kPage);
    const std::vector<std::string> names = fake.call_names();
    const auto at = [&](std::string_view name) {
      return std::find(names.begin(), names.end(), name) - names.begin();
    };
    ASSERT_LT(at("cuStreamWaitEvent"), at("cuMemsetD8Async"));
    ASSERT_LT(at("cuMemsetD8Async"), at("cuEventRecord"));
    EXPECT_EQ(fake.count("cuMemsetD8Async"), 1u);
    ASSERT_NE(zeroed, nullptr);
    EXPECT_EQ(zeroed->fd.get(), -1) << "a CUDA fence is its handle alone";

    const EventHandle opened = holder.import_event(0, {-1, zeroed->entry.handle});
    holder.synchronize_event(opened);
    EXPECT_EQ(fake.read_word(va), 0u) << "the last holder's word survived the zeroing";
    holder.destroy_event(opened);

    fake.clear_calls();
    (void)scrubber.scrub(0, {{bank.chunk_of(id), nullptr}}, kPage);
    EXPECT_EQ(fake.count("cuMemMap"), 0u) << "the page stays mapped for its next zeroing";
    EXPECT_EQ(fake.count("cuStreamWaitEvent"), 0u) << "no fence, no wait";
    scrubber.forget(bank.chunk_of(id));
  }
  holder.destroy_event(work);
  holder.destroy_stream(stream);
  holder.unmap(va, kPage);
  holder.free_address(va, kPage);
  holder.release_chunk(imported);
  EXPECT_TRUE(fake.violations().empty()) << fake.violations().front();
}

}  // namespace
}  // namespace salus
