// salusd's page bank over the CUDA backend (fake driver): a batch of pages must reach the
// importing process as that many distinct allocations. Every descriptor the driver exports looks
// like one file (fake_driver.hpp, "Sharing chunks"), so a bank that merged descriptors by file
// would hand out one physical page for a whole batch; the first GPU run did exactly that.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <set>
#include <sys/stat.h>

#include "cuda/cuda_backend.hpp"
#include "daemon/page_bank.hpp"
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

}  // namespace
}  // namespace salus
