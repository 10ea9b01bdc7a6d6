// Harvesting on the CUDA backend, over the fake driver (two devices with peer access, host VMM
// chunks): every page mapped into a device's range, whether it lives on the device, a peer or the
// host, gets cuMemSetAccess read-write for that device right after its cuMemMap, also after every
// page move; and a driver call failing in the middle of a move surfaces as a DeviceError naming it
// while every page stays mapped where it was, with its access, and the accounting unchanged.
//
// The fake models mappings and access but not bytes: "the block's bytes are intact" is checked as
// "each page still maps the chunk it mapped before" (the chunk holds the bytes).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>

#include "cuda/cuda_backend.hpp"
#include "memory/safe_points.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using test::FakeCall;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

MemoryOptions harvesting(std::vector<std::size_t> limits, std::size_t reserve) {
  MemoryOptions options;
  options.device_limits = std::move(limits);
  options.harvest.spill = SpillPolicy::peer_then_host;
  options.harvest.lend_reserve_bytes = reserve;
  options.harvest.recall_wait = 0ms;
  return options;
}

class HarvestCudaFake : public ::testing::Test {
 protected:
  HarvestCudaFake()
      : fake_(FakeDriverConfig::uniform(2, 64 * MiB)),
        backend_(std::make_shared<cuda::CudaBackend>(fake_.api())) {}

  void build(MemoryOptions options) {
    memory_ = std::make_unique<MemoryManager>(backend_, std::move(options));
  }

  // Every cuMemMap must be followed by a cuMemSetAccess covering the mapped range that grants
  // read-write to `device` (when given; peers may be granted too), before the range is unmapped. Returns how many maps there were.
  std::size_t expect_access_after_every_map(std::optional<int> device) {
    std::vector<std::pair<std::uint64_t, std::uint64_t>> pending;  // mapped, awaiting access
    std::size_t maps = 0;
    for (const FakeCall& call : fake_.calls()) {
      if (call.result != CUDA_SUCCESS) continue;
      if (call.name == "cuMemMap") {
        pending.emplace_back(call.args[0], call.args[1]);
        ++maps;
      } else if (call.name == "cuMemSetAccess") {
        const std::uint64_t va = call.args[0], size = call.args[1], count = call.args[2];
        std::size_t granted = 0;
        bool grants_device = !device.has_value();
        for (std::uint64_t i = 0; i < count; ++i) {
          const auto* d = &call.args[3 + 3 * i];
          EXPECT_EQ(d[0], CU_MEM_LOCATION_TYPE_DEVICE);
          if (d[2] == CU_MEM_ACCESS_FLAGS_PROT_NONE) continue;
          EXPECT_EQ(d[2], CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
          if (device && d[1] == static_cast<std::uint64_t>(*device)) grants_device = true;
          ++granted;
        }
        // The range's device, and the peers that can reach the page (PeerAccessOnCudaFake).
        EXPECT_GE(granted, 1u) << "cuMemSetAccess at " << std::hex << va << " grants nobody";
        EXPECT_TRUE(grants_device) << "cuMemSetAccess at " << std::hex << va
                                   << " leaves out the range's device";
        std::erase_if(pending, [&](const auto& r) {
          return r.first >= va && r.first + r.second <= va + size;
        });
      } else if (call.name == "cuMemUnmap") {
        EXPECT_TRUE(std::none_of(pending.begin(), pending.end(), [&](const auto& r) {
          return r.first == call.args[0];
        })) << "a range was unmapped before it ever got access";
        std::erase_if(pending, [&](const auto& r) { return r.first == call.args[0]; });
      }
    }
    EXPECT_TRUE(pending.empty()) << pending.size() << " mapped ranges never got access";
    return maps;
  }

  // Page -> the chunk mapped there, for every page under [ptr, ptr + bytes).
  std::map<DevicePtr, FakeDriver::MappedChunk> pages_of(DevicePtr ptr, std::size_t bytes) {
    std::map<DevicePtr, FakeDriver::MappedChunk> out;
    for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
      const auto chunk = fake_.chunk_at(page);
      EXPECT_TRUE(chunk.has_value()) << std::hex << page << " is unmapped";
      if (chunk) out[page] = *chunk;
    }
    return out;
  }

  void expect_read_write(DevicePtr ptr, std::size_t bytes, int device) {
    for (DevicePtr page = ptr / kPage * kPage; page < ptr + bytes; page += kPage) {
      EXPECT_EQ(fake_.access_of(page, device), Access::read_write) << std::hex << page;
      // The peer reaches every page here (a peer link both ways, or host memory): granted too.
      EXPECT_EQ(fake_.access_of(page, 1 - device), Access::read_write) << std::hex << page;
    }
  }

  FakeDriver fake_;
  std::shared_ptr<cuda::CudaBackend> backend_;
  std::unique_ptr<MemoryManager> memory_;  // last: goes before the backend and the fake
};

TEST_F(HarvestCudaFake, BorrowedPeerAndHostPagesGetReadWriteForTheOwningDevice) {
  // Device 1 lends two pages beyond its 4 MiB reserve; the rest spills to host chunks.
  build(harvesting({8 * MiB, 8 * MiB}, 4 * MiB));
  const JobId job = memory_->register_job("spilling");
  std::vector<std::pair<DevicePtr, std::size_t>> blocks;
  for (std::size_t bytes : {8 * MiB, 3 * MiB + 1, 5 * MiB, std::size_t{300}}) {
    blocks.emplace_back(memory_->allocate({bytes, 0, {}, job}), bytes);
  }
  std::map<DevicePtr, FakeDriver::MappedChunk> pages;  // neighbouring blocks may share a page
  for (const auto& [ptr, bytes] : blocks) {
    expect_read_write(ptr, bytes, 0);
    pages.merge(pages_of(ptr, bytes));
  }
  std::map<std::string, std::size_t> by_place;
  for (const auto& [page, chunk] : pages) ++by_place[to_string(chunk.where)];
  EXPECT_EQ(by_place[to_string(Location::gpu(0))], 4u);
  EXPECT_EQ(by_place[to_string(Location::gpu(1))], 2u);
  // The 300-byte block goes on the partly used last page of the 3 MiB + 1 block rather than on a
  // page of its own in the small arena (a fresh page would be needed there).
  EXPECT_EQ(by_place[to_string(Location::host())], 3u) << "3 pages, the 300 bytes among them";
  const DeviceMemoryStats d0 = memory_->device_stats(0);
  EXPECT_EQ(d0.borrowed_peer, 4 * MiB);
  EXPECT_EQ(d0.borrowed_host, 6 * MiB);
  EXPECT_EQ(memory_->device_stats(1).lent, 4 * MiB);
  std::size_t host_creates = 0;
  for (const FakeCall& call : fake_.calls("cuMemCreate")) {
    if (call.args[1] != CU_MEM_LOCATION_TYPE_DEVICE) ++host_creates;
  }
  EXPECT_EQ(host_creates, 3u) << "host pages are host VMM chunks";
  EXPECT_EQ(expect_access_after_every_map(0), 9u);
  memory_->release_job(job);
  memory_->trim();
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_EQ(fake_.mapped_bytes(), 0u);
}

TEST_F(HarvestCudaFake, EveryRemapOfADemoteActivateCycleGetsAccessAgain) {
  build(harvesting({16 * MiB, 16 * MiB}, 0));
  const JobId job = memory_->register_job("cycling");
  const JobId other = memory_->register_job("other");
  std::vector<std::pair<DevicePtr, std::size_t>> blocks;
  for (std::size_t bytes : {4 * MiB, 2 * MiB + 512, std::size_t{300}}) {
    blocks.emplace_back(memory_->allocate({bytes, 0, {}, job}), bytes);
  }
  const auto pages_at = [&](Location where) {
    std::map<DevicePtr, FakeDriver::MappedChunk> pages;  // neighbouring blocks may share a page
    for (const auto& [ptr, bytes] : blocks) pages.merge(pages_of(ptr, bytes));
    return static_cast<std::size_t>(
        std::count_if(pages.begin(), pages.end(),
                      [&](const auto& entry) { return entry.second.where == where; }));
  };
  // Four pages: the 300-byte block shares the 2 MiB + 512 block's last page (no fresh page for it).
  constexpr std::size_t kPages = 4;
  ASSERT_EQ(pages_at(Location::gpu(0)), kPages);
  memory::set_job_quiescent(*memory_, job);

  for (int cycle = 0; cycle < 2; ++cycle) {
    SCOPED_TRACE(::testing::Message() << "cycle " << cycle);
    fake_.clear_calls();
    EXPECT_EQ(memory::demote(*memory_, job, 0), kPages * kPage);
    EXPECT_EQ(pages_at(Location::gpu(1)), kPages);
    for (const auto& [ptr, bytes] : blocks) expect_read_write(ptr, bytes, 0);
    // The pages staged in the mover's window, then mapped in place.
    EXPECT_EQ(expect_access_after_every_map(0), 2 * kPages);
    EXPECT_GE(fake_.count("cuMemcpyAsync"), kPages) << "every page's bytes are copied";

    // Device 1 wants its memory back: the pages go home (device 0 has room), get access again,
    // and the lender's own pages get access for device 1.
    fake_.clear_calls();
    const DevicePtr lender = memory_->allocate({16 * MiB, 1, {}, other});
    EXPECT_EQ(pages_at(Location::gpu(1)), 0u);
    EXPECT_EQ(pages_at(Location::gpu(0)), kPages);
    for (const auto& [ptr, bytes] : blocks) expect_read_write(ptr, bytes, 0);
    expect_read_write(lender, 16 * MiB, 1);
    EXPECT_GE(expect_access_after_every_map(std::nullopt), 2 * kPages + 8u);
    memory_->deallocate(lender);
    memory_->trim();

    // Once more to the host, then home at activation.
    fake_.clear_calls();
    for (const auto& [ptr, bytes] : blocks) memory_->remap(ptr, Location::host());
    EXPECT_EQ(pages_at(Location::host()), kPages);
    EXPECT_EQ(memory::activate_job(*memory_, job), kPages * kPage);
    EXPECT_EQ(pages_at(Location::gpu(0)), kPages);
    for (const auto& [ptr, bytes] : blocks) expect_read_write(ptr, bytes, 0);
    EXPECT_GE(expect_access_after_every_map(0), 4 * kPages);
    memory::set_job_quiescent(*memory_, job);
  }
  // An explicit remap to the host and back.
  fake_.clear_calls();
  memory_->remap(blocks[0].first, Location::host());
  memory_->remap(blocks[0].first, Location::gpu(0));
  expect_read_write(blocks[0].first, blocks[0].second, 0);
  EXPECT_EQ(expect_access_after_every_map(0), 8u);
  memory_->release_job(job);
  memory_->release_job(other);
  memory_->trim();
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_EQ(fake_.mapped_bytes(), 0u);
}

// A driver call fails part-way through a demote. `skip` counts earlier calls of the same name in
// that demote: its one round moves three pages, staged in a window first (a map, an access and a
// copy each), then put in place one by one (unmap the staging slot, unmap the page, map the new
// chunk, set access).
struct MoveFailure {
  const char* call;
  int skip;
  const char* where;
};

void PrintTo(const MoveFailure& f, std::ostream* os) {
  *os << f.call << " " << f.where;
}

class HarvestCudaFakeMoveFailures : public HarvestCudaFake,
                                    public ::testing::WithParamInterface<MoveFailure> {};

TEST_P(HarvestCudaFakeMoveFailures, AFailedMoveIsNamedAndLosesNothing) {
  const MoveFailure failure = GetParam();
  build(harvesting({8 * MiB, 16 * MiB}, 0));
  const JobId job = memory_->register_job("moving");
  const JobId bystander = memory_->register_job("bystander");
  const DevicePtr big = memory_->allocate({4 * MiB, 0, {}, job});
  const DevicePtr small = memory_->allocate({300, 0, {}, job});
  const DevicePtr theirs = memory_->allocate({2 * MiB, 0, {}, bystander});
  memory::set_job_quiescent(*memory_, job);

  const auto big_pages = pages_of(big, 4 * MiB);
  const auto small_pages = pages_of(small, 300);
  const DeviceMemoryStats d0 = memory_->device_stats(0);
  const DeviceMemoryStats d1 = memory_->device_stats(1);
  const JobMemoryStats before = memory_->job_stats(job);
  const std::size_t mapped = fake_.mapped_bytes();

  fake_.clear_calls();
  fake_.fail_next(failure.call, CUDA_ERROR_INVALID_VALUE, failure.skip);
  try {
    (void)memory::demote(*memory_, job, 0);
    ADD_FAILURE() << "the demote should fail when " << failure.call << " fails";
  } catch (const DeviceError& e) {
    EXPECT_EQ(e.call(), failure.call) << e.what();
    EXPECT_EQ(e.status(), "CUDA_ERROR_INVALID_VALUE");
  }
  // Every page maps the chunk it mapped before (where its bytes are), with its access.
  EXPECT_EQ(memory_->find(big)->ptr, big);
  EXPECT_EQ(memory_->find(small)->ptr, small);
  for (const auto& [page, chunk] : big_pages) EXPECT_EQ(fake_.chunk_at(page)->handle, chunk.handle);
  for (const auto& [page, chunk] : small_pages) {
    EXPECT_EQ(fake_.chunk_at(page)->handle, chunk.handle);
  }
  expect_read_write(big, 4 * MiB, 0);
  expect_read_write(small, 300, 0);
  expect_read_write(theirs, 2 * MiB, 0);
  EXPECT_EQ(fake_.mapped_bytes(), mapped) << "a staging page was left mapped";
  const DeviceMemoryStats a0 = memory_->device_stats(0);
  const DeviceMemoryStats a1 = memory_->device_stats(1);
  EXPECT_EQ(a0.allocated, d0.allocated);
  EXPECT_EQ(a0.mapped, d0.mapped);
  EXPECT_EQ(a0.borrowed_peer, d0.borrowed_peer);
  EXPECT_EQ(a0.borrowed_host, d0.borrowed_host);
  EXPECT_EQ(a0.pages_moved, d0.pages_moved);
  EXPECT_EQ(a1.lent, d1.lent) << "pages lent for the failed move must go back";
  const JobMemoryStats after = memory_->job_stats(job);
  EXPECT_EQ(after.in_use, before.in_use);
  for (std::size_t t = 0; t < kTierCount; ++t) {
    EXPECT_EQ(after.in_use_by_tier[t], before.in_use_by_tier[t]) << to_string(static_cast<Tier>(t));
  }

  // The manager and its page mover still work: the demote succeeds now, and the pages come home.
  fake_.clear_calls();
  EXPECT_EQ(memory::demote(*memory_, job, 0), 3 * kPage);
  EXPECT_EQ(expect_access_after_every_map(0), 6u);
  EXPECT_EQ(fake_.chunk_at(big)->where, Location::gpu(1));
  EXPECT_EQ(memory::activate_job(*memory_, job), 3 * kPage);
  EXPECT_EQ(fake_.chunk_at(big)->where, Location::gpu(0));
  expect_read_write(big, 4 * MiB, 0);
  memory_->release_job(job);
  memory_->release_job(bystander);
  memory_->trim();
  EXPECT_EQ(fake_.live_chunks(), 0u) << "a chunk leaked (or is still mapped somewhere)";
  EXPECT_EQ(fake_.mapped_bytes(), 0u);
  EXPECT_EQ(fake_.used_bytes(Location::gpu(0)) + fake_.used_bytes(Location::gpu(1)) +
                fake_.used_bytes(Location::host()),
            0u);
}

INSTANTIATE_TEST_SUITE_P(HarvestCudaFake, HarvestCudaFakeMoveFailures,
                         ::testing::Values(MoveFailure{"cuMemMap", 0, "staging"},
                                           MoveFailure{"cuMemSetAccess", 0, "staging"},
                                           MoveFailure{"cuMemcpyAsync", 0, "staging"},
                                           MoveFailure{"cuMemUnmap", 1, "in_place"},
                                           MoveFailure{"cuMemMap", 3, "in_place"},
                                           MoveFailure{"cuMemSetAccess", 3, "in_place"}),
                         [](const ::testing::TestParamInfo<MoveFailure>& info) {
                           return std::string(info.param.call) + "_" + info.param.where;
                         });

// The second page of a round fails to go in place: the first one has moved, and the accounting
// says so; the rest stay where they were.
TEST_F(HarvestCudaFake, APartlyFailedMoveCountsThePagesThatMoved) {
  build(harvesting({8 * MiB, 16 * MiB}, 0));
  const JobId job = memory_->register_job("moving");
  const DevicePtr big = memory_->allocate({6 * MiB, 0, {}, job});
  const auto before = pages_of(big, 6 * MiB);
  const std::size_t mapped = fake_.mapped_bytes();
  memory::set_job_quiescent(*memory_, job);
  fake_.fail_next("cuMemMap", CUDA_ERROR_INVALID_VALUE, 3 + 1);  // 3 staged, page 0 in place
  EXPECT_THROW((void)memory::demote(*memory_, job, 0), DeviceError);
  const auto after = pages_of(big, 6 * MiB);
  std::size_t moved = 0;
  for (const auto& [page, chunk] : after) {
    if (chunk.handle != before.at(page).handle) {
      ++moved;
      EXPECT_EQ(chunk.where, Location::gpu(1));
    }
  }
  EXPECT_EQ(moved, 1u);
  expect_read_write(big, 6 * MiB, 0);
  EXPECT_EQ(fake_.mapped_bytes(), mapped);
  const DeviceMemoryStats d0 = memory_->device_stats(0);
  EXPECT_EQ(d0.pages_moved, 1u);
  EXPECT_EQ(d0.borrowed_peer, kPage);
  EXPECT_EQ(memory_->device_stats(1).lent, kPage);
  const JobMemoryStats stats = memory_->job_stats(job);
  EXPECT_EQ(stats.in_use_by_tier[static_cast<std::size_t>(Tier::peer)], kPage);
  EXPECT_EQ(stats.in_use_by_tier[static_cast<std::size_t>(Tier::local)], 2 * kPage);
  EXPECT_EQ(memory::demote(*memory_, job, 0), 2 * kPage) << "the rest moves on the next try";
  EXPECT_EQ(memory_->device_stats(1).lent, 3 * kPage);
  memory_->release_job(job);
  memory_->trim();
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_EQ(fake_.mapped_bytes(), 0u);
}

// Bringing pages home fails: activation is best effort (the failure is logged), so the job is
// active with its pages where they were, all mapped with access, and a later activation retries.
TEST_F(HarvestCudaFake, AFailedFetchStillActivatesTheJobWithUsablePages) {
  build(harvesting({8 * MiB, 16 * MiB}, 0));
  const JobId job = memory_->register_job("waking");
  const DevicePtr big = memory_->allocate({4 * MiB, 0, {}, job});
  memory::set_job_quiescent(*memory_, job);
  ASSERT_EQ(memory::demote(*memory_, job, 0), 2 * kPage);
  fake_.fail_next("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, 2);  // page 0's access in place
  EXPECT_EQ(memory::activate_job(*memory_, job), 0u) << "nothing came home";
  std::size_t failed = 0;
  for (const FakeCall& call : fake_.calls("cuMemSetAccess")) failed += call.result != CUDA_SUCCESS;
  EXPECT_EQ(failed, 1u) << "the injected failure happened";
  const JobMemoryStats stats = memory_->job_stats(job);
  EXPECT_FALSE(stats.quiescent);
  EXPECT_EQ(stats.activations, 1u);
  expect_read_write(big, 4 * MiB, 0);
  for (const auto& [page, chunk] : pages_of(big, 4 * MiB)) {
    EXPECT_EQ(chunk.where, Location::gpu(1)) << "the round failed on its first page";
  }
  EXPECT_EQ(memory_->device_stats(0).borrowed_peer, 2 * kPage);
  EXPECT_EQ(memory_->device_stats(1).lent, 2 * kPage);
  // Quiescent and active again: this time they come home.
  memory::set_job_quiescent(*memory_, job);
  EXPECT_EQ(memory::activate_job(*memory_, job), 2 * kPage);
  EXPECT_EQ(memory_->device_stats(1).lent, 0u);
  memory_->release_job(job);
  memory_->trim();
  EXPECT_EQ(fake_.live_chunks(), 0u);
}

}  // namespace
}  // namespace salus::testing
