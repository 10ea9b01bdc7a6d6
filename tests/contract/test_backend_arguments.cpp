// Bad arguments to DeviceBackend, the contract every backend keeps (see
// contract/backend_fixture.hpp for what a contract suite is): DeviceBackend's public functions
// check their arguments once for every backend (the list above the class in salus/device.hpp), so
// each case here is written once and must fail alike on both: the typed error, a message naming the
// bad value, and a backend that still works afterwards with nothing changed. What only one backend
// can show (the fake driver saw no call, the sim's host NUMA nodes) stays in
// test_cuda_backend_fake.cpp and test_sim_backend.cpp.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <string_view>
#include <typeinfo>

#include "contract/backend_fixture.hpp"

namespace salus::testing::contract {
namespace {

constexpr int kDevices = 2;

// `call` throws E whose message names every one of `needles`.
template <class E = InvalidArgument>
void expect_refused(const std::function<void()>& call, std::initializer_list<std::string> needles) {
  try {
    call();
    ADD_FAILURE() << "expected " << typeid(E).name() << " naming " << *needles.begin();
  } catch (const E& e) {
    const std::string_view message = e.what();
    for (const std::string& needle : needles) {
      EXPECT_NE(message.find(needle), std::string_view::npos)
          << "'" << message << "' does not name '" << needle << "'";
    }
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected " << typeid(E).name() << ", got " << typeid(e).name() << ": "
                  << e.what();
  }
}

class BackendArgumentsContract : public ContractTest {
 protected:
  void SetUp() override {
    build(kDevices, 64 * MiB);
    page = backend->granularity(Location::gpu(0));
    for (std::size_t i = 0; i < kWatched.size(); ++i)
      held_before[i] = harness->chunk_bytes(kWatched[i]);
  }

  // A reserved range of 4 pages with a 2-page chunk mapped read-write at its second page and
  // filled with a pattern: what a refused call must leave alone.
  void map_good() {
    va = backend->reserve_address(4 * page, 0);
    chunk = backend->create_chunk(Location::gpu(0), 2 * page);
    backend->map(va + page, 2 * page, chunk, 0);
    const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
    backend->set_access(va + page, 2 * page, grant);
    harness->fill(va + page, 2 * page, 7);
  }
  void unmap_good() {
    EXPECT_TRUE(harness->check(va + page, 2 * page, 7)) << "a refused call changed the mapping";
    backend->unmap(va + page, 2 * page);
    backend->free_address(va, 4 * page);
    backend->release_chunk(chunk);
  }

  // Nothing held that was not held before, and memory, streams and events still work.
  void expect_backend_works() {
    for (std::size_t i = 0; i < kWatched.size(); ++i) {
      EXPECT_EQ(harness->chunk_bytes(kWatched[i]), held_before[i]) << to_string(kWatched[i]);
    }
    const DevicePtr at = backend->reserve_address(page, 0);
    const ChunkHandle c = backend->create_chunk(Location::gpu(1), page);
    backend->map(at, page, c, 0);
    const std::array<AccessGrant, 2> grants{{{0, Access::read_write}, {1, Access::read_write}}};
    backend->set_access(at, page, grants);
    harness->fill(at, page, 3);
    EXPECT_TRUE(harness->check(at, page, 3));
    backend->unmap(at, page);
    backend->free_address(at, page);
    backend->release_chunk(c);
    const StreamHandle s = backend->create_stream(1, 0);
    const EventHandle e = backend->create_event(1);
    backend->record_event(e, s);
    backend->synchronize_event(e);
    EXPECT_TRUE(backend->query_event(e));
    backend->destroy_event(e);
    backend->destroy_stream(s);
    harness->expect_no_violations("after refused calls");
  }

  std::size_t page = 0;
  static constexpr std::array<Location, 3> kWatched{Location::gpu(0), Location::gpu(1),
                                                    Location::host()};
  std::array<std::size_t, 3> held_before{};
  DevicePtr va = 0;
  ChunkHandle chunk{};
};

TEST_P(BackendArgumentsContract, DeviceIndicesOutOfRangeNameTheIndexAndTheCount) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  map_good();
  const StreamHandle stream = backend->create_stream(0, 0);
  const EventHandle event = backend->create_event(0);
  const std::string count = fmt::format("{} devices", kDevices);
  for (const int bad : {kDevices, -1, 1000}) {
    const std::string index = fmt::format("device {}", bad);
    auto& b = *backend;
    expect_refused([&] { (void)b.properties(bad); }, {"properties", index, count});
    expect_refused([&] { (void)b.granularity(Location::gpu(bad)); }, {"granularity", index});
    expect_refused([&] { (void)b.create_chunk(Location::gpu(bad), page); },
                   {"create_chunk", index});
    expect_refused([&] { (void)b.peer_link(0, bad); }, {"peer_link (to)", index, count});
    expect_refused([&] { (void)b.peer_link(bad, 0); }, {"peer_link (from)", index, count});
    expect_refused([&] { (void)b.stream_priority_range(bad); }, {"stream_priority_range", index});
    expect_refused([&] { (void)b.create_stream(bad, 0); }, {"create_stream", index, count});
    expect_refused([&] { b.validate_stream({}, bad); }, {"validate_stream", index});
    expect_refused([&] { (void)b.query_stream({}, bad); }, {"query_stream", index});
    expect_refused([&] { (void)b.create_event(bad); }, {"create_event", index, count});
    expect_refused([&] { (void)b.create_timing_event(bad); }, {"create_timing_event", index});
    expect_refused([&] { b.stream_wait_event({}, event, bad); }, {"stream_wait_event", index});
    // One bad grant refuses the whole call: the good grant before it is not applied either.
    const std::array<AccessGrant, 2> grants{{{1, Access::read}, {bad, Access::read}}};
    expect_refused([&] { b.set_access(va + page, 2 * page, grants); }, {"set_access", index});
  }
  backend->destroy_event(event);
  backend->destroy_stream(stream);
  unmap_good();
  expect_backend_works();
}

TEST_P(BackendArgumentsContract, LocationsOfNoKindOrNoNodeAreRefused) {
  const Location no_node = Location::host(-1);
  expect_refused([&] { (void)backend->granularity(no_node); }, {"granularity", "host:-1"});
  expect_refused([&] { (void)backend->create_chunk(no_node, page); }, {"create_chunk", "host:-1"});
  const Location no_kind{static_cast<LocationKind>(7), 0};
  expect_refused([&] { (void)backend->granularity(no_kind); }, {"unknown location kind 7"});
  expect_refused([&] { (void)backend->create_chunk(no_kind, page); }, {"unknown location kind 7"});
  expect_backend_works();
}

TEST_P(BackendArgumentsContract, ChunkSizesMustBePositiveMultiplesOfTheGranularity) {
  const std::string granularity = std::to_string(page);
  for (const std::size_t bytes : {std::size_t{0}, page + 4096, page / 2}) {
    for (const Location where : {Location::gpu(1), Location::host()}) {
      expect_refused(
          [&] { (void)backend->create_chunk(where, bytes); },
          {"create_chunk", fmt::format("{} bytes", bytes), to_string(where), granularity});
    }
  }
  expect_backend_works();
}

// A chunk of several pages: made whole, or (a process connected to salusd, whose GPU pages are
// the daemon's, one allocation each) refused as NotSupported naming the page size, with nothing
// taken from the daemon. The host tier is the process's own either way.
TEST_P(BackendArgumentsContract, ChunksOfSeveralPagesAreMadeOrRefusedAsNotSupported) {
  if (harness->one_page_chunks()) {
    expect_refused<NotSupported>([&] { (void)backend->create_chunk(Location::gpu(0), 2 * page); },
                                 {"create_chunk", std::to_string(page), std::to_string(2 * page)});
  } else {
    backend->release_chunk(backend->create_chunk(Location::gpu(0), 2 * page));
  }
  backend->release_chunk(backend->create_chunk(Location::host(), 2 * page));
  expect_backend_works();
}

TEST_P(BackendArgumentsContract, ReservationsNeedGranularSizesAndPowerOfTwoAlignments) {
  const std::string granularity = std::to_string(page);
  expect_refused([&] { (void)backend->reserve_address(0, 0); },
                 {"reserve_address", "0 bytes", granularity});
  expect_refused([&] { (void)backend->reserve_address(page + 4096, 0); },
                 {"reserve_address", fmt::format("{} bytes", page + 4096), granularity});
  expect_refused([&] { (void)backend->reserve_address(page, 3 * page); },
                 {"reserve_address", fmt::format("alignment {}", 3 * page), "power of two"});
  expect_backend_works();
}

TEST_P(BackendArgumentsContract, RangesMustBeAlignedGranularAndNotWrap) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  map_good();
  auto& b = *backend;
  const std::string odd = fmt::format("{:#x}", va + page + 4096);
  const std::array<AccessGrant, 1> grant{{{0, Access::read}}};
  expect_refused([&] { b.map(va + page + 4096, page, chunk, 0); }, {"map", "address", odd});
  expect_refused([&] { b.map(va, page + 4096, chunk, 0); },
                 {"map", fmt::format("{} bytes", page + 4096)});
  expect_refused([&] { b.map(va, 0, chunk, 0); }, {"map", "0 bytes"});
  expect_refused([&] { b.map(va, page, chunk, 4096); }, {"map", "chunk offset 0x1000"});
  expect_refused([&] { b.map(va, page, ChunkHandle{}, 0); }, {"map", "chunk handle 0"});
  const DevicePtr top = UINTPTR_MAX / page * page;
  expect_refused([&] { b.map(top, 2 * page, chunk, 0); },
                 {"map", fmt::format("{:#x}", top), "wraps"});
  expect_refused([&] { b.unmap(va + page + 4096, page); }, {"unmap", odd});
  expect_refused([&] { b.unmap(va + page, 0); }, {"unmap", "0 bytes"});
  expect_refused([&] { b.unmap(va + page, page + 1); },
                 {"unmap", fmt::format("{} bytes", page + 1)});
  expect_refused([&] { b.set_access(va + page + 4096, page, grant); }, {"set_access", odd});
  expect_refused([&] { b.set_access(va + page, 0, grant); }, {"set_access", "0 bytes"});
  expect_refused([&] { b.free_address(va + 4096, 4 * page); },
                 {"free_address", fmt::format("{:#x}", va + 4096)});
  expect_refused([&] { b.free_address(va, 0); }, {"free_address", "0 bytes"});
  expect_refused([&] { b.release_chunk(ChunkHandle{}); }, {"release_chunk", "chunk handle 0"});
  unmap_good();
  expect_backend_works();
}

// Checked by each backend once it has found the chunk, in the words of check_map_in_chunk.
TEST_P(BackendArgumentsContract, MappingsMustLieInsideTheChunk) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  map_good();
  const std::string size = fmt::format("{} bytes", 2 * page);
  expect_refused([&] { backend->map(va, 3 * page, chunk, 0); }, {"map", "outside chunk", size});
  expect_refused([&] { backend->map(va, page, chunk, 2 * page); },
                 {"map", fmt::format("[{}, {})", 2 * page, 3 * page), size});
  unmap_good();
  expect_backend_works();
}

TEST_P(BackendArgumentsContract, GrantsNeedAKnownAccess) {
  SALUS_SKIP_ON_ONE_PAGE_CHUNKS();
  map_good();
  const std::array<AccessGrant, 1> bad{{{1, static_cast<Access>(9)}}};
  expect_refused([&] { backend->set_access(va + page, 2 * page, bad); },
                 {"set_access", "unknown access value 9", "device 1"});
  unmap_good();
  expect_backend_works();
}

TEST_P(BackendArgumentsContract, NullHandlesAndEmptyFunctionsAreRefused) {
  auto& b = *backend;
  const StreamHandle stream = b.create_stream(0, 0);
  const EventHandle event = b.create_timing_event(0);
  expect_refused([&] { b.destroy_stream({}); }, {"destroy_stream", "default stream"});
  expect_refused([&] { b.launch_host_func(stream, {}); }, {"launch_host_func", "empty function"});
  const std::string null_event = "event handle 0";
  expect_refused([&] { b.record_event({}, stream); }, {"record_event", null_event});
  expect_refused([&] { (void)b.query_event({}); }, {"query_event", null_event});
  expect_refused([&] { b.synchronize_event({}); }, {"synchronize_event", null_event});
  expect_refused([&] { b.destroy_event({}); }, {"destroy_event", null_event});
  expect_refused([&] { b.stream_wait_event(stream, {}, 0); }, {"stream_wait_event", null_event});
  expect_refused([&] { (void)b.elapsed_seconds({}, event); }, {"(start)", null_event});
  expect_refused([&] { (void)b.elapsed_seconds(event, {}); }, {"(end)", null_event});
  // A copy of nothing orders nothing: no backend looks at its stream or addresses.
  EXPECT_NO_THROW(b.copy_async(0, 0, 0, StreamHandle{0xdead}));
  b.destroy_event(event);
  b.destroy_stream(stream);
  expect_backend_works();
}

// Sharing: each import case hands in a real exported descriptor with one thing wrong.
TEST_P(BackendArgumentsContract, SharingRefusesNullUnknownAndMisshapenChunks) {
  auto& b = *backend;
  const ChunkHandle good = b.create_chunk(Location::gpu(0), page);
  const SharedChunk shared = b.export_chunk(good);
  const auto with = [&](auto change) {
    SharedChunk bad = shared;
    change(bad);
    return bad;
  };
  expect_refused([&] { (void)b.export_chunk({}); }, {"export_chunk", "chunk handle 0"});
  expect_refused([&] { (void)b.export_chunk(ChunkHandle{0xdead0}); }, {"export_chunk", "0xdead0"});
  const ChunkHandle gone = b.create_chunk(Location::gpu(1), page);
  b.release_chunk(gone);
  expect_refused([&] { (void)b.export_chunk(gone); },
                 {"export_chunk", fmt::format("{:#x}", gone.value)});
  const ChunkHandle host = b.create_chunk(Location::host(), b.granularity(Location::host()));
  expect_refused<NotSupported>([&] { (void)b.export_chunk(host); },
                               {"export_chunk", "host memory"});
  b.release_chunk(host);

  const auto import = [&](Location where, const SharedChunk& s) {
    return [&b, where, s] { (void)b.import_chunk(where, s); };
  };
  expect_refused(import(Location::gpu(0), with([](SharedChunk& s) { s.fd = -1; })),
                 {"import_chunk", "file descriptor -1"});
  for (const std::size_t bytes : {std::size_t{0}, page + 4096, page / 2}) {
    expect_refused(import(Location::gpu(0), with([&](SharedChunk& s) { s.bytes = bytes; })),
                   {"import_chunk", fmt::format("{} bytes", bytes), std::to_string(page)});
  }
  expect_refused(import(Location::gpu(0), with([](SharedChunk& s) { s.offset = 4096; })),
                 {"import_chunk", "offset 0x1000"});
  expect_refused(import(Location::gpu(kDevices), shared),
                 {"import_chunk", fmt::format("device {}", kDevices)});
  expect_refused(import(Location::host(), shared), {"import_chunk", "host:0", "no GPU"});
  ::close(shared.fd);
  b.release_chunk(good);
  expect_backend_works();
}

INSTANTIATE_TEST_SUITE_P(Backends, BackendArgumentsContract,
                         ::testing::ValuesIn(contract_backends()), ContractBackendName);

}  // namespace
}  // namespace salus::testing::contract
