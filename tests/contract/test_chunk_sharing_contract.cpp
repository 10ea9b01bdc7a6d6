// Sharing physical chunks (export_chunk, import_chunk), the contract every backend keeps (see
// contract/backend_fixture.hpp for what a contract suite is): an exported chunk imported into the
// same backend or into a second instance (as another process would) is the same memory, bytes
// written through one mapping read through the other; the importer's handle is a chunk like any
// other; releasing it, even while mapped, never frees or changes the exporter's memory; and an
// import counts against no capacity. Bad arguments: test_backend_arguments.cpp. Crossing a real
// process boundary (fork) and the descriptor budget: test_sim_sharing.cpp; the driver calls:
// test_cuda_sharing_fake.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <memory>

#include "contract/backend_fixture.hpp"

namespace salus::testing::contract {
namespace {

constexpr Location kGpu0 = Location::gpu(0);

class ChunkSharingContract : public ContractTest {
 protected:
  void SetUp() override {
    build(2, 64 * MiB);
    page = backend->granularity(kGpu0);
  }

  // Reserves `bytes`, maps [chunk_offset, +bytes) of `chunk` there, read-write for device 0.
  static DevicePtr map_rw(DeviceBackend& on, ChunkHandle chunk, std::size_t bytes,
                          std::size_t chunk_offset = 0) {
    const DevicePtr va = on.reserve_address(bytes, 0);
    on.map(va, bytes, chunk, chunk_offset);
    const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
    on.set_access(va, bytes, grant);
    return va;
  }
  static void unmap_free(DeviceBackend& on, DevicePtr va, std::size_t bytes) {
    on.unmap(va, bytes);
    on.free_address(va, bytes);
  }

  // Export a two-page chunk of `backend`, import it into `importer`, and check the contract.
  void round_trip(DeviceBackend& importer) {
    const ChunkHandle chunk = backend->create_chunk(kGpu0, 2 * page);
    const std::size_t held = harness->chunk_bytes(kGpu0);
    const SharedChunk shared = backend->export_chunk(chunk);
    ASSERT_GE(shared.fd, 0);
    EXPECT_EQ(shared.bytes, 2 * page);
    const ChunkHandle imported = importer.import_chunk(kGpu0, shared);
    ::close(shared.fd);  // the import keeps what it needs
    EXPECT_EQ(harness->chunk_bytes(kGpu0), held) << "an import counts against no capacity";

    const DevicePtr a = map_rw(*backend, chunk, 2 * page);
    const DevicePtr b = map_rw(importer, imported, 2 * page);
    ASSERT_NE(a, b);
    // Page by page: the fake driver keeps sample words of each range filled, not every byte.
    harness->fill(a, page, 11);
    harness->fill(a + page, page, 13);
    EXPECT_TRUE(harness->check(b, page, 11)) << "the import is not the exported memory";
    EXPECT_TRUE(harness->check(b + page, page, 13));
    harness->fill(b + page, page, 12);
    EXPECT_TRUE(harness->check(a + page, page, 12)) << "bytes do not flow back to the exporter";
    // The imported chunk maps like any other: part of it, at an offset.
    const DevicePtr c = map_rw(importer, imported, page, page);
    EXPECT_TRUE(harness->check(c, page, 12));
    unmap_free(importer, c, page);

    // The importer lets go first, while mapped: its mapping stays whole until unmapped, and its
    // last unmap frees nothing of the exporter's.
    importer.release_chunk(imported);
    EXPECT_TRUE(harness->check(b, page, 11)) << "released while mapped: still mapped";
    unmap_free(importer, b, 2 * page);
    EXPECT_TRUE(harness->check(a, page, 11)) << "the importer's release freed exported memory";
    EXPECT_TRUE(harness->check(a + page, page, 12));
    EXPECT_EQ(harness->chunk_bytes(kGpu0), held);
    EXPECT_THROW(importer.release_chunk(imported), InvalidArgument) << "released twice";

    unmap_free(*backend, a, 2 * page);
    backend->release_chunk(chunk);
    harness->expect_no_violations("sharing a chunk");
  }

  std::size_t page = 0;
};

TEST_P(ChunkSharingContract, AnImportIntoTheSameBackendIsTheExportedMemory) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  round_trip(*backend);
  harness->expect_nothing_held();
}

TEST_P(ChunkSharingContract, AnImportIntoAnotherBackendIsTheExportedMemory) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  {
    const std::shared_ptr<DeviceBackend> peer = harness->peer_backend();
    round_trip(*peer);
  }
  harness->expect_nothing_held();
}

TEST_P(ChunkSharingContract, EveryImportIsAHandleOfItsOwn) {
  const std::shared_ptr<DeviceBackend> peer = harness->peer_backend();
  const ChunkHandle chunk = backend->create_chunk(kGpu0, page);
  const SharedChunk first = backend->export_chunk(chunk);
  const SharedChunk second = backend->export_chunk(chunk);
  EXPECT_NE(first.fd, second.fd) << "each export is a new descriptor";
  const ChunkHandle x = peer->import_chunk(kGpu0, first);
  const ChunkHandle y = peer->import_chunk(kGpu0, second);
  ::close(first.fd);
  ::close(second.fd);
  const DevicePtr a = map_rw(*backend, chunk, page);
  const DevicePtr vx = map_rw(*peer, x, page);
  harness->fill(a, page, 5);
  EXPECT_TRUE(harness->check(vx, page, 5));
  // One import let go of, the other (and the exporter's own handle) still maps the memory.
  peer->release_chunk(x);
  unmap_free(*peer, vx, page);
  const DevicePtr vy = map_rw(*peer, y, page);
  EXPECT_TRUE(harness->check(vy, page, 5));
  unmap_free(*peer, vy, page);
  peer->release_chunk(y);
  // A chunk imported and released is exported again as before.
  const SharedChunk again = backend->export_chunk(chunk);
  EXPECT_GE(again.fd, 0);
  ::close(again.fd);
  unmap_free(*backend, a, page);
  backend->release_chunk(chunk);
  harness->expect_no_violations("importing one chunk twice");
}

// salusd zeroes a page before another user gets it (fill_async): through an import, as salusd
// holds no mapping of its own clients' pages, and in stream order, after work queued before it.
TEST_P(ChunkSharingContract, AFillZeroesItsRangeAloneInStreamOrder) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  const ChunkHandle chunk = backend->create_chunk(kGpu0, 2 * page);
  const SharedChunk shared = backend->export_chunk(chunk);
  const std::shared_ptr<DeviceBackend> daemon = harness->peer_backend();
  const ChunkHandle imported = daemon->import_chunk(kGpu0, shared);
  ::close(shared.fd);
  const DevicePtr a = map_rw(*backend, chunk, 2 * page);
  const DevicePtr b = map_rw(*daemon, imported, 2 * page);
  harness->fill(a, page, 21);
  harness->fill(a + page, page, 22);
  const StreamHandle stream = daemon->create_stream(0, 0);
  daemon->copy_async(b, b + page, page, stream);  // queued before the fill: the fill wins
  daemon->fill_async(b, 0, page, stream);
  daemon->synchronize_stream(stream);
  EXPECT_TRUE(harness->zeroed(a, page)) << "the filled page is not zero";
  EXPECT_TRUE(harness->check(a + page, page, 22)) << "the fill went past its range";
  EXPECT_NO_THROW(daemon->fill_async(b, 0, 0, stream)) << "0 bytes: nothing to do";
  daemon->destroy_stream(stream);
  unmap_free(*daemon, b, 2 * page);
  daemon->release_chunk(imported);
  unmap_free(*backend, a, 2 * page);
  backend->release_chunk(chunk);
}

INSTANTIATE_TEST_SUITE_P(Backends, ChunkSharingContract, ::testing::ValuesIn(contract_backends()),
                         ContractBackendName);

}  // namespace
}  // namespace salus::testing::contract
