// Tests of the simulated-GPU backend: config, memory (chunks, mapping, access, remap), streams,
// events, copies (throttled too), topology, shutdown and concurrency.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <future>
#include <latch>
#include <limits>
#include <numeric>
#include <thread>
#include <vector>

#include "cuda/sim_backend.hpp"
#include "salus/sim.hpp"
#include "support/expect_throw.hpp"

namespace salus::sim {
namespace {

using namespace std::chrono_literals;

constexpr std::size_t kPage = 2 * MiB;

// ThreadSanitizer makes a 64 MiB memcpy slower than the simulated link, so upper time bounds
// only hold without it.
#if defined(__SANITIZE_THREAD__)
constexpr bool kSlowMemcpy = true;
#else
constexpr bool kSlowMemcpy = false;
#endif

using salus::test_support::expect_throw_with;

std::shared_ptr<SimBackend> make(SimConfig config) {
  auto backend = std::dynamic_pointer_cast<SimBackend>(make_sim_backend(std::move(config)));
  EXPECT_NE(backend, nullptr);
  return backend;
}

SimConfig small_config(int devices = 2) {
  SimConfig config = SimConfig::uniform(devices, 64 * MiB);
  config.host_memory_bytes = 64 * MiB;
  return config;
}

void grant_all(SimBackend& b, DevicePtr va, std::size_t bytes, Access access = Access::read_write) {
  std::vector<AccessGrant> grants;
  for (int d = 0; d < b.device_count(); ++d) grants.push_back({d, access});
  b.set_access(va, bytes, grants);
}

// A reserved range with a fresh chunk mapped read-write for every device.
struct Mapped {
  DevicePtr va = 0;
  ChunkHandle chunk;
  std::size_t bytes = 0;
  std::byte* ptr() const { return reinterpret_cast<std::byte*>(va); }
};

Mapped map_new(SimBackend& b, Location where, std::size_t bytes) {
  Mapped m{b.reserve_address(bytes, 0), b.create_chunk(where, bytes), bytes};
  b.map(m.va, bytes, m.chunk, 0);
  grant_all(b, m.va, bytes);
  return m;
}

void fill_pattern(std::byte* p, std::size_t bytes, unsigned seed) {
  for (std::size_t i = 0; i < bytes; i += 4096)
    p[i] = std::byte(static_cast<unsigned char>(i / 4096 + seed));
}

bool has_pattern(const std::byte* p, std::size_t bytes, unsigned seed) {
  for (std::size_t i = 0; i < bytes; i += 4096) {
    if (p[i] != std::byte(static_cast<unsigned char>(i / 4096 + seed))) return false;
  }
  return true;
}

TEST(SimConfig, RejectsInconsistentConfigs) {
  expect_throw_with<InvalidArgument>([] { (void)make_sim_backend(SimConfig{}); }, "no devices");
  auto zero = small_config();
  zero.devices[1].memory_bytes = 0;
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(zero); }, "device 1");
  auto zero_host = small_config();
  zero_host.host_memory_bytes = 0;
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(zero_host); },
                                     "host has zero memory");
  auto sub_page = small_config();
  sub_page.devices[0].granularity = 1000;
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(sub_page); }, "granularity 1000");
  auto not_pow2 = small_config();
  not_pow2.devices[0].granularity = 3 * 4096;
  not_pow2.devices[0].memory_bytes = 3 * 4096 * 100;
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(not_pow2); }, "power of two");
  auto unknown = small_config();
  unknown.links.push_back({0, 7});
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(unknown); }, "unknown device 7");
  auto self = small_config();
  self.links.push_back({1, 1});
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(self); }, "self-link");
}

// One cap on the count, shared with the C ABI (SALUS_MAX_SIM_DEVICES) and Python; a count of
// billions (a size given as a count) is refused before a device is made, not after minutes.
TEST(SimConfig, RefusesMoreDevicesThanTheCap) {
  EXPECT_EQ(SimConfig::uniform(kMaxSimDevices, MiB).devices.size(),
            static_cast<std::size_t>(kMaxSimDevices));
  for (int count : {kMaxSimDevices + 1, std::numeric_limits<int>::max()}) {
    expect_throw_with<InvalidArgument>([&] { (void)SimConfig::uniform(count); },
                                       fmt::format("{} devices; at most 1024", count));
    expect_throw_with<InvalidArgument>([&] { (void)SimConfig::nvlink_mesh(count); }, "at most");
    expect_throw_with<InvalidArgument>([&] { (void)SimConfig::pcie_only(count); }, "at most");
  }
  expect_throw_with<InvalidArgument>([&] { (void)SimConfig::two_islands(kMaxSimDevices); },
                                     "2048 devices");
  SimConfig many = SimConfig::uniform(kMaxSimDevices, 2 * MiB);
  many.devices.push_back(many.devices.back());
  expect_throw_with<InvalidArgument>([&] { (void)make_sim_backend(many); }, "1025 devices");
}

TEST(SimTopology, PresetsDescribeTheirLinks) {
  auto mesh = make(SimConfig::nvlink_mesh(4, 64 * MiB));
  for (int a = 0; a < 4; ++a) {
    for (int c = 0; c < 4; ++c) {
      const PeerLink link = mesh->peer_link(a, c);
      EXPECT_EQ(link.kind, a == c ? LinkKind::self : LinkKind::nvlink) << a << "->" << c;
      EXPECT_TRUE(link.can_access);
    }
  }
  EXPECT_DOUBLE_EQ(mesh->peer_link(0, 3).bandwidth_gbps, 50.0);

  auto islands = make(SimConfig::two_islands(4, 64 * MiB));
  ASSERT_EQ(islands->device_count(), 8);
  EXPECT_EQ(islands->peer_link(0, 3).kind, LinkKind::nvlink);
  EXPECT_EQ(islands->peer_link(5, 7).kind, LinkKind::nvlink);
  EXPECT_EQ(islands->peer_link(1, 6).kind, LinkKind::pcie);
  EXPECT_EQ(islands->peer_link(6, 1).kind, LinkKind::pcie);
  EXPECT_TRUE(islands->peer_link(6, 1).can_access);
  EXPECT_GT(islands->peer_link(6, 1).performance_rank, islands->peer_link(6, 5).performance_rank);

  auto pcie = make(SimConfig::pcie_only(3, 64 * MiB));
  const PeerLink p = pcie->peer_link(2, 0);
  EXPECT_EQ(p.kind, LinkKind::pcie);
  EXPECT_TRUE(p.can_access);
  EXPECT_NEAR(p.bandwidth_gbps, 12.0, 1.0);

  auto uniform = make(small_config());
  EXPECT_EQ(uniform->peer_link(0, 1).kind, LinkKind::none);
  EXPECT_FALSE(uniform->peer_link(0, 1).can_access);
  EXPECT_EQ(uniform->properties(1).total_memory, 64 * MiB);
  EXPECT_EQ(uniform->properties(1).granularity, kPage);
  EXPECT_EQ(uniform->granularity(Location::host()), kPage);
}

TEST(SimMemory, ChunksExhaustCapacityAndCoalesce) {
  auto b = make(small_config());
  const ChunkHandle big = b->create_chunk(Location::gpu(0), 48 * MiB);
  try {
    (void)b->create_chunk(Location::gpu(0), 32 * MiB);
    ADD_FAILURE() << "expected out of memory";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.call(), "cuMemCreate");
    EXPECT_EQ(e.status(), "CUDA_ERROR_OUT_OF_MEMORY");
    EXPECT_TRUE(e.is_out_of_memory());
  }
  // The failure left the pool intact: the remaining 16 MiB is still there, and only there.
  const ChunkHandle rest = b->create_chunk(Location::gpu(0), 16 * MiB);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(0)), 64 * MiB);
  EXPECT_THROW((void)b->create_chunk(Location::gpu(0), kPage), DeviceError);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(1)), 0u);
  b->release_chunk(big);
  b->release_chunk(rest);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(0)), 0u);
  // Coalesced free extents serve the whole device again.
  b->release_chunk(b->create_chunk(Location::gpu(0), 64 * MiB));
  b->release_chunk(b->create_chunk(Location::host(), 64 * MiB));
}

// Sizes and devices: contract/test_backend_arguments.cpp.
TEST(SimMemory, RejectsBadChunkRequests) {
  auto b = make(small_config());
  expect_throw_with<InvalidArgument>([&] { (void)b->create_chunk(Location::host(1), kPage); },
                                     "host NUMA node 0");
  const ChunkHandle c = b->create_chunk(Location::gpu(1), kPage);
  b->release_chunk(c);
  expect_throw_with<InvalidArgument>([&] { b->release_chunk(c); }, "unknown chunk");
  EXPECT_THROW(b->release_chunk(ChunkHandle{12345}), InvalidArgument);
}

TEST(SimMemory, MappedBytesReadBackAfterSetAccess) {
  auto b = make(small_config());
  const Mapped m = map_new(*b, Location::gpu(0), 4 * MiB);
  fill_pattern(m.ptr(), m.bytes, 7);
  EXPECT_TRUE(has_pattern(m.ptr(), m.bytes, 7));
  EXPECT_EQ(b->location_of(m.va + 3 * MiB), Location::gpu(0));
  EXPECT_EQ(b->mapped_bytes(), 4 * MiB);
  EXPECT_EQ(b->location_of(m.va + 4 * MiB), std::nullopt);
  b->free_address(m.va, m.bytes);  // unmaps what is still mapped
  EXPECT_EQ(b->mapped_bytes(), 0u);
  b->release_chunk(m.chunk);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(0)), 0u);
}

TEST(SimMemory, RemapOntoAnotherChunkKeepsAddressAndBytes) {
  auto b = make(small_config());
  const std::size_t bytes = 4 * MiB;
  const Mapped old = map_new(*b, Location::gpu(0), bytes);
  fill_pattern(old.ptr(), bytes, 42);
  std::byte* const pointer = old.ptr();

  // Migrate to device 1: copy through a temporary mapping, then swap the backing at old.va.
  const ChunkHandle moved = b->create_chunk(Location::gpu(1), bytes);
  const DevicePtr tmp = b->reserve_address(bytes, 0);
  b->map(tmp, bytes, moved, 0);
  grant_all(*b, tmp, bytes);
  b->copy_async(tmp, old.va, bytes, StreamHandle{});
  b->synchronize_stream(StreamHandle{});
  b->unmap(tmp, bytes);
  b->free_address(tmp, bytes);
  b->unmap(old.va, bytes);
  b->release_chunk(old.chunk);
  b->map(old.va, bytes, moved, 0);
  grant_all(*b, old.va, bytes);

  EXPECT_EQ(reinterpret_cast<std::byte*>(old.va), pointer);
  EXPECT_TRUE(has_pattern(pointer, bytes, 42));
  EXPECT_EQ(b->location_of(old.va), Location::gpu(1));
  EXPECT_EQ(b->chunk_bytes(Location::gpu(0)), 0u);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(1)), bytes);
  // Writes through the old pointer now land in the new chunk.
  pointer[0] = std::byte{0x5a};
  b->unmap(old.va, bytes);
  b->map(old.va, bytes, moved, 0);
  grant_all(*b, old.va, bytes, Access::read);
  EXPECT_EQ(pointer[0], std::byte{0x5a});
}

TEST(SimMemory, AccessIsPerDeviceAndForgottenOnUnmap) {
  auto b = make(small_config(3));
  const DevicePtr va = b->reserve_address(2 * kPage, 0);
  const ChunkHandle c = b->create_chunk(Location::gpu(0), 2 * kPage);
  b->map(va, 2 * kPage, c, 0);
  EXPECT_EQ(b->access_of(va, 0), Access::none);  // fresh mappings are inaccessible
  const std::array<AccessGrant, 2> grants{{{0, Access::read_write}, {1, Access::read}}};
  b->set_access(va, 2 * kPage, grants);
  EXPECT_EQ(b->access_of(va + kPage, 0), Access::read_write);
  EXPECT_EQ(b->access_of(va, 1), Access::read);
  EXPECT_EQ(b->access_of(va, 2), Access::none);
  // Unlisted devices keep their access; listed ones are replaced, page by page.
  const std::array<AccessGrant, 1> revoke{{{1, Access::none}}};
  b->set_access(va + kPage, kPage, revoke);
  EXPECT_EQ(b->access_of(va + kPage, 1), Access::none);
  EXPECT_EQ(b->access_of(va, 1), Access::read);
  EXPECT_EQ(b->access_of(va + kPage, 0), Access::read_write);
  expect_throw_with<InvalidArgument>([&] { (void)b->access_of(va, 3); }, "device 3");
  b->unmap(va, 2 * kPage);
  EXPECT_EQ(b->access_of(va, 0), Access::none);
  b->map(va, 2 * kPage, c, 0);
  EXPECT_EQ(b->access_of(va, 0), Access::none);
  EXPECT_EQ(b->access_of(va + kPage, 0), Access::none);
  b->free_address(va, 2 * kPage);
  b->release_chunk(c);
}

TEST(SimMemory, ReleaseWhileMappedIsDeferredToLastUnmap) {
  auto b = make(small_config());
  const Mapped m = map_new(*b, Location::gpu(1), 2 * kPage);
  fill_pattern(m.ptr(), m.bytes, 3);
  b->release_chunk(m.chunk);
  EXPECT_TRUE(has_pattern(m.ptr(), m.bytes, 3));  // still mapped, still alive
  EXPECT_EQ(b->chunk_bytes(Location::gpu(1)), 2 * kPage);
  EXPECT_THROW(b->map(m.va, kPage, m.chunk, 0), InvalidArgument);
  EXPECT_THROW(b->release_chunk(m.chunk), InvalidArgument);
  b->unmap(m.va, kPage);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(1)), 2 * kPage);
  b->unmap(m.va + kPage, kPage);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(1)), 0u);
  b->free_address(m.va, m.bytes);
}

// What the sim's bookkeeping refuses; alignment, sizes and the chunk's bounds:
// contract/test_backend_arguments.cpp.
TEST(SimMemory, RejectsBadMappingRequests) {
  auto b = make(small_config());
  const DevicePtr va = b->reserve_address(4 * kPage, 0);
  const ChunkHandle c = b->create_chunk(Location::gpu(0), 2 * kPage);
  EXPECT_THROW(b->map(va + 3 * kPage, 2 * kPage, c, 0), InvalidArgument);  // past the reservation
  EXPECT_THROW(b->map(va, kPage, ChunkHandle{999}, 0), InvalidArgument);   // unknown chunk
  expect_throw_with<InvalidArgument>([&] { b->map(va - 64 * kPage, kPage, c, 0); },
                                     "not inside one reservation");
  b->map(va + kPage, 2 * kPage, c, 0);
  expect_throw_with<InvalidArgument>([&] { b->map(va, 2 * kPage, c, 0); }, "overlaps");
  expect_throw_with<InvalidArgument>([&] { b->map(va + 2 * kPage, kPage, c, kPage); }, "overlaps");
  EXPECT_THROW(b->unmap(va, kPage), InvalidArgument);               // never mapped
  EXPECT_THROW(b->unmap(va + kPage, 3 * kPage), InvalidArgument);   // runs past the mapping
  EXPECT_THROW(b->set_access(va, 2 * kPage, {}), InvalidArgument);  // partly unmapped
  expect_throw_with<InvalidArgument>([&] { b->free_address(va + kPage, 3 * kPage); },
                                     "not a reservation");
  EXPECT_THROW(b->free_address(va, 2 * kPage), InvalidArgument);  // wrong size
  // Nothing above disturbed the good mapping.
  EXPECT_EQ(b->mapped_bytes(), 2 * kPage);
  b->unmap(va + kPage, 2 * kPage);
  EXPECT_EQ(b->mapped_bytes(), 0u);
  EXPECT_THROW(b->unmap(va + kPage, 2 * kPage), InvalidArgument);  // double unmap
  b->free_address(va, 4 * kPage);
  EXPECT_THROW(b->free_address(va, 4 * kPage), InvalidArgument);
  b->release_chunk(c);
}

TEST(SimMemory, ReserveHonoursAlignment) {
  auto b = make(small_config());
  const DevicePtr va = b->reserve_address(kPage, 64 * MiB);
  EXPECT_EQ(va % (64 * MiB), 0u);
  EXPECT_EQ(b->reserved_bytes(), kPage);
  b->free_address(va, kPage);
  EXPECT_EQ(b->reserved_bytes(), 0u);
}

TEST(SimStream, RunsTasksInFifoOrder) {
  auto b = make(small_config());
  const StreamHandle s = b->create_stream(1, 0);
  std::vector<int> seen;
  for (int i = 0; i < 500; ++i) b->launch_host_func(s, [&seen, i] { seen.push_back(i); });
  b->synchronize_stream(s);
  std::vector<int> expected(500);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(seen, expected);
  b->destroy_stream(s);
}

// The default stream is a handle of 0 on every device: a wait names the device whose default
// stream waits, whatever device the event belongs to.
TEST(SimStream, DefaultStreamOfTheNamedDeviceWaitsForAnotherDevicesEvent) {
  auto b = make(small_config());
  ASSERT_GE(b->device_count(), 2);
  const StreamHandle a = b->create_stream(0, 0);
  std::latch gate(1);
  b->launch_host_func(a, [&] { gate.wait(); });
  const EventHandle e = b->create_event(0);
  b->record_event(e, a);
  b->stream_wait_event(StreamHandle{}, e, 1);
  const EventHandle f = b->create_event(1);
  b->record_event(f, StreamHandle{});  // device 1's default stream, behind the wait
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(b->query_event(f)) << "device 1's default stream ran ahead of the event";
  EXPECT_FALSE(b->query_stream(StreamHandle{}, 1));
  EXPECT_TRUE(b->query_stream(StreamHandle{}, 0)) << "device 0's default stream was made to wait";
  EXPECT_FALSE(b->query_stream(a, 0));
  gate.count_down();
  b->synchronize_event(f);
  EXPECT_TRUE(b->query_event(e));
  b->synchronize_stream(a);  // e's marker has run; the stream counts it done just after
  EXPECT_TRUE(b->query_stream(a, 0));
  b->destroy_event(e);
  b->destroy_event(f);
  b->destroy_stream(a);
}

TEST(SimStream, WaitOnEventOrdersWorkAcrossStreams) {
  auto b = make(small_config());
  const StreamHandle a = b->create_stream(0, 0);
  const StreamHandle c = b->create_stream(0, -1);
  const EventHandle e = b->create_event(0);
  EXPECT_TRUE(b->query_event(e));  // never recorded counts as complete
  std::latch gate(1);
  std::atomic<int> order{0};
  int a_step = -1;
  int c_step = -1;
  b->launch_host_func(a, [&] {
    gate.wait();
    a_step = order++;
  });
  b->record_event(e, a);
  b->stream_wait_event(c, e, 0);
  b->launch_host_func(c, [&] { c_step = order++; });
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(b->query_event(e));
  EXPECT_EQ(order.load(), 0);  // c must not run ahead of a's blocked work
  gate.count_down();
  b->synchronize_stream(c);
  EXPECT_EQ(a_step, 0);
  EXPECT_EQ(c_step, 1);
  EXPECT_TRUE(b->query_event(e));
  b->synchronize_event(e);
  b->destroy_event(e);
  EXPECT_THROW((void)b->query_event(e), InvalidArgument);
  b->destroy_stream(a);
  b->destroy_stream(c);
}

TEST(SimStream, LaterRecordDoesNotMoveAnEarlierWait) {
  auto b = make(small_config());
  const StreamHandle first = b->create_stream(0, 0);
  const StreamHandle second = b->create_stream(0, 0);
  const StreamHandle waiter = b->create_stream(0, 0);
  const EventHandle e = b->create_event(0);
  std::latch hold_first(1);
  std::latch hold_second(1);
  b->launch_host_func(first, [&] { hold_first.wait(); });
  b->record_event(e, first);
  b->stream_wait_event(waiter, e, 0);
  std::promise<void> ran;
  b->launch_host_func(waiter, [&] { ran.set_value(); });
  b->launch_host_func(second, [&] { hold_second.wait(); });
  b->record_event(e, second);  // a later record the earlier wait must ignore
  hold_first.count_down();
  EXPECT_EQ(ran.get_future().wait_for(5s), std::future_status::ready);
  EXPECT_FALSE(b->query_event(e));  // the event now tracks the second record
  hold_second.count_down();
  b->synchronize_event(e);
  EXPECT_TRUE(b->query_event(e));
}

TEST(SimStream, HostFunctionExceptionDoesNotKillTheStream) {
  auto b = make(small_config());
  const StreamHandle s = b->create_stream(0, 0);
  bool after = false;
  b->launch_host_func(s, [] { throw std::runtime_error("expected by the test"); });
  b->launch_host_func(s, [] { throw 17; });
  b->launch_host_func(s, [&] { after = true; });
  b->synchronize_stream(s);
  EXPECT_TRUE(after);
}

TEST(SimStream, HandlesPrioritiesAndBadHandles) {
  auto b = make(small_config());
  EXPECT_EQ(b->stream_priority_range(0).least, 0);
  EXPECT_EQ(b->stream_priority_range(0).greatest, -2);
  const StreamHandle urgent = b->create_stream(0, -100);  // clamped, not refused
  const StreamHandle lazy = b->create_stream(1, 100);
  EXPECT_NE(urgent, lazy);
  b->destroy_stream(urgent);
  expect_throw_with<InvalidArgument>([&] { b->destroy_stream(urgent); }, "unknown stream");
  EXPECT_THROW(b->synchronize_stream(urgent), InvalidArgument);
  EXPECT_THROW(b->launch_host_func(urgent, [] {}), InvalidArgument);
  EXPECT_THROW(b->record_event(EventHandle{77}, lazy), InvalidArgument);
  const StreamHandle fresh = b->create_stream(0, 0);
  EXPECT_GT(fresh.value, lazy.value);  // handles are never reused
  b->destroy_stream(lazy);
  b->destroy_stream(fresh);
}

TEST(SimStream, DestroyLetsQueuedWorkFinish) {
  auto b = make(small_config());
  const StreamHandle s = b->create_stream(0, 0);
  std::atomic<int> done{0};
  for (int i = 0; i < 10; ++i) {
    b->launch_host_func(s, [&] {
      std::this_thread::sleep_for(1ms);
      ++done;
    });
  }
  b->destroy_stream(s);
  EXPECT_EQ(done.load(), 10);
}

TEST(SimCopy, CopiesBetweenDevicesAndHost) {
  auto b = make(small_config());
  const std::size_t bytes = 2 * kPage;
  const Mapped d0 = map_new(*b, Location::gpu(0), bytes);
  const Mapped d1 = map_new(*b, Location::gpu(1), bytes);
  const Mapped pinned = map_new(*b, Location::host(), bytes);
  std::vector<std::byte> src(bytes);
  std::vector<std::byte> dst(bytes);
  fill_pattern(src.data(), bytes, 9);
  const StreamHandle s = b->create_stream(0, 0);
  const auto host = [](std::vector<std::byte>& v) { return reinterpret_cast<DevicePtr>(v.data()); };
  b->copy_async(d0.va, host(src), bytes, s);
  b->copy_async(d1.va, d0.va, bytes, s);
  b->copy_async(pinned.va, d1.va, bytes, s);
  b->copy_async(host(dst), pinned.va, bytes, s);
  b->synchronize_stream(s);
  EXPECT_TRUE(has_pattern(d1.ptr(), bytes, 9));
  EXPECT_EQ(std::memcmp(src.data(), dst.data(), bytes), 0);
  EXPECT_EQ(b->location_of(pinned.va), Location::host());
}

TEST(SimCopy, RejectsInaccessibleRanges) {
  auto b = make(small_config());
  const Mapped ok = map_new(*b, Location::gpu(0), kPage);
  const DevicePtr va = b->reserve_address(2 * kPage, 0);
  const ChunkHandle c = b->create_chunk(Location::gpu(1), kPage);
  b->map(va, kPage, c, 0);
  auto expect_invalid = [&](DevicePtr dst, DevicePtr src, std::size_t bytes) {
    try {
      b->copy_async(dst, src, bytes, StreamHandle{});
      ADD_FAILURE() << "expected cuMemcpyAsync to fail";
    } catch (const DeviceError& e) {
      EXPECT_EQ(e.call(), "cuMemcpyAsync");
      EXPECT_EQ(e.status(), "CUDA_ERROR_INVALID_VALUE");
    }
  };
  expect_invalid(ok.va, va, kPage);                 // mapped but no access yet
  expect_invalid(va + kPage, ok.va, kPage);         // reserved, never mapped
  expect_invalid(ok.va, ok.va + kPage / 2, kPage);  // runs off the end of the mapping
  grant_all(*b, va, kPage, Access::read);
  expect_invalid(va, ok.va, kPage);  // read-only destination
  b->copy_async(ok.va, va, kPage, StreamHandle{});
  b->synchronize_stream(StreamHandle{});
}

TEST(SimCopy, ThrottledCopiesTakeLinkTime) {
  SimConfig config = SimConfig::nvlink_mesh(2, 128 * MiB, 2.0);
  config.host_memory_bytes = 64 * MiB;
  config.host_link_bandwidth_gbps = 1.0;
  config.throttle_copies = true;
  auto b = make(config);
  const std::size_t bytes = 64 * MiB;
  const Mapped d0 = map_new(*b, Location::gpu(0), bytes);
  const Mapped d1 = map_new(*b, Location::gpu(1), bytes);
  std::vector<std::byte> host(bytes, std::byte{1});
  std::memset(d0.ptr(), 0, bytes);  // fault the pages in now, not during the timed copy
  std::memset(d1.ptr(), 0, bytes);
  const StreamHandle s = b->create_stream(0, 0);

  auto time_copy = [&](DevicePtr dst, DevicePtr src, std::size_t n) {
    const auto start = std::chrono::steady_clock::now();
    b->copy_async(dst, src, n, s);
    b->synchronize_stream(s);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  const double host_seconds = time_copy(d0.va, reinterpret_cast<DevicePtr>(host.data()), bytes);
  EXPECT_GE(host_seconds, 0.064);
  const double throughput = static_cast<double>(bytes) / host_seconds / 1e9;
  EXPECT_LE(throughput, 1.0);
  if (!kSlowMemcpy) {
    EXPECT_GE(throughput, 0.8);
  }
  EXPECT_EQ(d0.ptr()[bytes - 1], std::byte{1});

  // Device to device rides the 2 GB/s NVLink: 16 MiB takes >= 8.4 ms, well under the host link.
  const double peer_seconds = time_copy(d1.va, d0.va, 16 * MiB);
  EXPECT_GE(peer_seconds, 16.0 * MiB / 2e9);
  if (!kSlowMemcpy) {
    EXPECT_LT(peer_seconds, 16.0 * MiB / 1e9);
  }
}

TEST(SimShutdown, DestroyingWithPendingWaitsDoesNotHang) {
  auto b = make(small_config());
  const StreamHandle a = b->create_stream(0, 0);
  const StreamHandle c = b->create_stream(0, 0);
  const EventHandle e = b->create_event(0);
  // A deadlock only shutdown can break: a's host function waits for c's, which waits (through the
  // event) for a's host function to finish.
  std::atomic<bool> released{false};
  b->launch_host_func(a, [&] {
    const auto give_up = std::chrono::steady_clock::now() + 10s;
    while (!released && std::chrono::steady_clock::now() < give_up)
      std::this_thread::sleep_for(1ms);
  });
  b->record_event(e, a);
  b->stream_wait_event(c, e, 0);
  b->launch_host_func(c, [&] { released = true; });
  std::this_thread::sleep_for(20ms);
  EXPECT_FALSE(released);
  auto destroyed =
      std::async(std::launch::async, [backend = std::move(b)]() mutable { backend.reset(); });
  EXPECT_EQ(destroyed.wait_for(5s), std::future_status::ready);
  EXPECT_TRUE(released);
}

TEST(SimConcurrency, ParallelMapUnmapLeavesNothingBehind) {
  auto b = make(small_config());
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      try {
        for (int i = 0; i < 40; ++i) {
          const Location where = (i % 3 == 2) ? Location::host() : Location::gpu((t + i) % 2);
          const std::size_t bytes = kPage * (1 + (i % 2));
          const Mapped m = map_new(*b, where, bytes);
          m.ptr()[bytes - 1] = std::byte(static_cast<unsigned char>(t * 40 + i));
          if (m.ptr()[bytes - 1] != std::byte(static_cast<unsigned char>(t * 40 + i)) ||
              b->location_of(m.va) != where) {
            ++failures;
          }
          b->unmap(m.va, bytes);
          if (i % 2 == 0) b->release_chunk(m.chunk);
          b->free_address(m.va, bytes);
          if (i % 2 == 1) b->release_chunk(m.chunk);
        }
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << ": " << e.what();
        ++failures;
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(0)), 0u);
  EXPECT_EQ(b->chunk_bytes(Location::gpu(1)), 0u);
  EXPECT_EQ(b->chunk_bytes(Location::host()), 0u);
  EXPECT_EQ(b->mapped_bytes(), 0u);
  EXPECT_EQ(b->reserved_bytes(), 0u);
}

TEST(SimConcurrency, ManyThreadsEnqueueAndRecord) {
  auto b = make(small_config());
  const StreamHandle s = b->create_stream(0, 0);
  std::atomic<int> ran{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      const StreamHandle mine = b->create_stream(1, 0);
      const EventHandle e = b->create_event(1);
      for (int i = 0; i < 50; ++i) {
        b->launch_host_func(mine, [&] { ++ran; });
        b->record_event(e, mine);
        b->stream_wait_event(s, e, 0);
        b->launch_host_func(s, [&] { ++ran; });
      }
      b->synchronize_event(e);
      b->destroy_event(e);
      b->destroy_stream(mine);
    });
  }
  for (auto& thread : threads) thread.join();
  b->synchronize_stream(s);
  EXPECT_EQ(ran.load(), 400);
}

}  // namespace
}  // namespace salus::sim
