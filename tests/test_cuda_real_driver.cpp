// The CUDA backend on a real driver and GPU: skipped where there is none (every CI machine), run
// by scripts/gpu_check.sh (ctest -R Cuda) on a GPU machine. What the fake driver models of the
// driver is checked here against the driver itself.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <iostream>
#include <memory>
#include <set>
#include <vector>

#include "salus/cuda.hpp"
#include "salus/device.hpp"
#include "salus/error.hpp"

namespace salus {
namespace {

std::shared_ptr<DeviceBackend> real_backend() {
  try {
    auto backend = make_cuda_backend();
    if (backend->device_count() > 0) return backend;
  } catch (const Error&) {
    // No driver or no GPU.
  }
  return nullptr;
}

// Exported pages: what their descriptors look like (the fake models every export as one file,
// fake_driver.hpp), and that each imported page is memory of its own, its bytes those the other
// mapping wrote.
TEST(CudaRealDriver, ExportedPagesAreDistinctMemoryWhateverTheirDescriptorsLookLike) {
  const auto backend = real_backend();
  if (!backend) GTEST_SKIP() << "no CUDA driver or GPU here";
  if (!backend->properties(0).shareable_handles) GTEST_SKIP() << "GPU 0 exports no descriptors";
  const std::size_t page = backend->granularity(Location::gpu(0));
  const StreamHandle stream = backend->create_stream(0, 0);
  const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
  constexpr int kPages = 4;
  std::set<std::pair<dev_t, ino_t>> files;
  std::vector<ChunkHandle> created, imported;
  std::vector<DevicePtr> writer, reader;
  for (int i = 0; i < kPages; ++i) {
    created.push_back(backend->create_chunk(Location::gpu(0), page));
    const SharedChunk shared = backend->export_chunk(created.back());
    struct stat st {};
    ASSERT_EQ(::fstat(shared.fd, &st), 0);
    files.insert({st.st_dev, st.st_ino});
    imported.push_back(backend->import_chunk(Location::gpu(0), shared));
    ::close(shared.fd);
    for (auto [chunk, list] : {std::pair{created.back(), &writer}, {imported.back(), &reader}}) {
      const DevicePtr va = backend->reserve_address(page, 0);
      backend->map(va, page, chunk, 0);
      backend->set_access(va, page, grant);
      list->push_back(va);
    }
  }
  std::cout << "[ info ] " << kPages << " exported descriptors are " << files.size()
            << " distinct file(s) by fstat\n";
  // Write each page through its creator's mapping, read it through the importer's.
  std::vector<std::vector<std::uint32_t>> out(kPages, std::vector<std::uint32_t>(page / 4));
  std::vector<std::vector<std::uint32_t>> back(kPages, std::vector<std::uint32_t>(page / 4));
  for (int i = 0; i < kPages; ++i) {
    for (std::size_t w = 0; w < out[i].size(); ++w) out[i][w] = 0x9e3779b9u * static_cast<std::uint32_t>(i + 1) + static_cast<std::uint32_t>(w);
    backend->copy_async(writer[i], reinterpret_cast<DevicePtr>(out[i].data()), page, stream);
  }
  for (int i = 0; i < kPages; ++i) {
    backend->copy_async(reinterpret_cast<DevicePtr>(back[i].data()), reader[i], page, stream);
  }
  backend->synchronize_stream(stream);
  for (int i = 0; i < kPages; ++i) EXPECT_EQ(back[i], out[i]) << "page " << i;
  for (int i = 0; i < kPages; ++i) {
    for (DevicePtr va : {writer[i], reader[i]}) {
      backend->unmap(va, page);
      backend->free_address(va, page);
    }
    backend->release_chunk(imported[i]);
    backend->release_chunk(created[i]);
  }
  backend->destroy_stream(stream);
}

}  // namespace
}  // namespace salus
