// Events another process can wait for (create_shareable_event, export_event, import_event), the
// contract every backend keeps, and what they are for: a page handed to another process behind
// work still queued on it. One backend plays both processes (the simulated backend and the fake
// driver both open their own exports; CUDA itself refuses that, which gpu_check's cross-process
// tests cover on a real GPU). The fake driver's check that a page is not used before its
// interprocess fence: test_cuda_sharing_fake.cpp.
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <memory>

#include "contract/backend_fixture.hpp"

namespace salus::testing::contract {
namespace {

constexpr Location kGpu0 = Location::gpu(0);

class EventSharingContract : public ContractTest {
 protected:
  void SetUp() override {
    build(1, 64 * MiB);
    page = backend->granularity(kGpu0);
  }
  DevicePtr map_rw(ChunkHandle chunk) {
    const DevicePtr va = backend->reserve_address(page, 0);
    backend->map(va, page, chunk, 0);
    const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
    backend->set_access(va, page, grant);
    return va;
  }
  void unmap_free(DevicePtr va) {
    backend->unmap(va, page);
    backend->free_address(va, page);
  }
  // A shareable event recorded on `stream` now, and the same event as the other side opens it.
  std::pair<EventHandle, EventHandle> shared_after(StreamHandle stream) {
    const EventHandle made = backend->create_shareable_event(0);
    backend->record_event(made, stream);
    const SharedEvent shared = backend->export_event(made);
    const EventHandle opened = backend->import_event(0, shared);
    if (shared.fd >= 0) ::close(shared.fd);  // the import keeps what it needs
    return {made, opened};
  }

  std::size_t page = 0;
};

TEST_P(EventSharingContract, AnOpenedEventCompletesWithTheExportersWork) {
  const ChunkHandle chunk = backend->create_chunk(kGpu0, page);
  const DevicePtr va = map_rw(chunk);
  const StreamHandle stream = harness->outside_stream(0);
  const std::uint64_t work = harness->enqueue_work(stream, va, page, 1, true);
  const auto [made, opened] = shared_after(stream);
  EXPECT_FALSE(backend->query_event(opened)) << "complete before the exporter's work";
  harness->expect_still_queued(work);
  harness->drain(std::array{stream});
  EXPECT_TRUE(backend->query_event(opened));
  backend->synchronize_event(opened);  // returns at once
  backend->destroy_event(opened);
  backend->destroy_event(made);
  harness->destroy_stream(stream);
  unmap_free(va);
  backend->release_chunk(chunk);
  harness->expect_no_violations("waiting for an opened event");
}

// The case salusd's pages are: process A gives a page back while its work on it is still queued;
// process B maps the page (its own import) and waits for A's interprocess event before its own
// work. B's work runs after A's, and what B wrote is what the page holds.
TEST_P(EventSharingContract, APageHandedOnBehindQueuedWorkIsUsedAfterThatWork) {
  const ChunkHandle chunk = backend->create_chunk(kGpu0, page);
  const SharedChunk exported = backend->export_chunk(chunk);
  const ChunkHandle theirs = backend->import_chunk(kGpu0, exported);
  ::close(exported.fd);
  const DevicePtr a = map_rw(chunk);
  const DevicePtr b = map_rw(theirs);
  const StreamHandle sa = harness->outside_stream(0);
  const StreamHandle sb = harness->outside_stream(0);
  const std::uint64_t first = harness->enqueue_work(sa, a, page, 1, true);
  const auto [made, opened] = shared_after(sa);
  backend->stream_wait_event(sb, opened, 0);
  const std::uint64_t second = harness->enqueue_work(sb, b, page, 2, false);
  harness->expect_still_queued(first);
  harness->expect_runs_after(second, first);
  harness->drain(std::array{sa, sb});
  EXPECT_EQ(harness->bad_stamps(b, page, 2), 0u) << "the giver's late work overwrote the page";
  harness->expect_no_violations("a page handed on behind an interprocess event");
  backend->destroy_event(opened);
  backend->destroy_event(made);
  harness->destroy_stream(sa);
  harness->destroy_stream(sb);
  unmap_free(a);
  unmap_free(b);
  backend->release_chunk(theirs);
  backend->release_chunk(chunk);
}

TEST_P(EventSharingContract, OnlyAShareableEventExportsAndGarbageImportsNothing) {
  const EventHandle plain = backend->create_event(0);
  EXPECT_THROW((void)backend->export_event(plain), InvalidArgument);
  backend->destroy_event(plain);
  SharedEvent garbage;
  garbage.handle.fill(std::byte{0x5a});
  EXPECT_THROW((void)backend->import_event(0, garbage), Error);
  // Still whole afterwards.
  const EventHandle made = backend->create_shareable_event(0);
  const SharedEvent shared = backend->export_event(made);
  const EventHandle opened = backend->import_event(0, shared);
  if (shared.fd >= 0) ::close(shared.fd);
  EXPECT_TRUE(backend->query_event(opened)) << "never recorded: complete";
  backend->destroy_event(opened);
  backend->destroy_event(made);
}

INSTANTIATE_TEST_SUITE_P(Backends, EventSharingContract, ::testing::ValuesIn(contract_backends()),
                         ContractBackendName);

}  // namespace
}  // namespace salus::testing::contract
