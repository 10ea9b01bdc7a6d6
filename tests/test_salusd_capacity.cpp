// What salusd takes of a GPU it shares with other programs (issue 33, item 5): its capacity is
// what the device has free when it starts less a reserve, never the device's total; pages nobody
// took for a while go back to the driver; and its status says what was left to the others. On the
// CUDA backend over the fake driver, whose devices can hold memory of other processes
// (FakeDeviceConfig::used_elsewhere) that cuMemGetInfo and cuMemCreate count.
#include <gtest/gtest.h>

#include <thread>

#include "cuda/cuda_backend.hpp"
#include "daemon/coordinator.hpp"
#include "daemon/page_bank.hpp"
#include "remote/protocol.hpp"
#include "support/expect_throw.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;

constexpr std::size_t kPage = 2 * MiB;

struct Fixture {
  explicit Fixture(std::size_t elsewhere, std::size_t memory = 1 * GiB)
      : fake(config(memory, elsewhere)) {}
  static FakeDriverConfig config(std::size_t memory, std::size_t elsewhere) {
    FakeDriverConfig c = FakeDriverConfig::uniform(1, memory);
    c.devices[0].used_elsewhere = elsewhere;
    return c;
  }
  FakeDriver fake;
  std::shared_ptr<cuda::CudaBackend> backend = std::make_shared<cuda::CudaBackend>(fake.api());
};

daemon::CoordinatorOptions with_reserve(std::size_t reserve, std::size_t limit = 0) {
  daemon::CoordinatorOptions o;
  o.reserve_bytes = reserve;
  o.device_limit_bytes = limit;
  return o;
}

TEST(SalusdCapacity, CapacityIsWhatWasFreeAtStartLessTheReserve) {
  Fixture f(300 * MiB);  // another program's context and tensors
  daemon::Coordinator coordinator(f.backend, with_reserve(100 * MiB));
  // 1 GiB - 300 MiB used elsewhere - 100 MiB reserve; the old capacity was the total, 1 GiB.
  EXPECT_EQ(coordinator.device_use(0).capacity_bytes, 1 * GiB - 400 * MiB);
  EXPECT_EQ(coordinator.device_use(0).made_bytes, 0u) << "pages are made on demand";
}

TEST(SalusdCapacity, TheLimitCapsTheCapacityAndTheReserveStillHolds) {
  Fixture f(300 * MiB);
  EXPECT_EQ(daemon::Coordinator(f.backend, with_reserve(100 * MiB, 256 * MiB))
                .device_use(0).capacity_bytes, 256 * MiB);
  // A limit beyond what is free less the reserve gets what is free less the reserve.
  EXPECT_EQ(daemon::Coordinator(f.backend, with_reserve(100 * MiB, 900 * MiB))
                .device_use(0).capacity_bytes, 1 * GiB - 400 * MiB);
}

TEST(SalusdCapacity, AReserveThatLeavesNothingIsRefusedNamingTheNumbers) {
  Fixture f(900 * MiB);
  test_support::expect_throw_with<InvalidArgument>(
      [&] { daemon::Coordinator c(f.backend, with_reserve(200 * MiB)); },
      "124 MiB free of 1024 MiB, and 200 MiB are kept");
}

TEST(SalusdCapacity, FreePagesIdleLongEnoughGoBackToTheDriverAndFencedOnesStay) {
  Fixture f(0);
  daemon::PageBank bank(*f.backend, 0, kPage, 64 * kPage);
  const std::vector<std::uint64_t> ids = bank.grant(1, 6);
  ASSERT_EQ(ids.size(), 6u);
  ASSERT_EQ(f.fake.used_bytes(Location::gpu(0)), 6 * kPage);
  const auto fence = std::make_shared<daemon::PageBank::Fence>();
  bank.take_back({ids[0], ids[1]});                                      // settled
  bank.take_back({ids[2]}, remote::GiveFence::fenced, fence);            // behind work
  const auto later = daemon::PageBank::Clock::now() + std::chrono::seconds(10);
  bank.take_back({ids[3]});  // freed "now": not idle at `later - 30 s`

  EXPECT_TRUE(bank.take_idle(later, std::chrono::seconds(30)).empty()) << "nothing is idle yet";
  const std::vector<ChunkHandle> idle = bank.take_idle(later, std::chrono::seconds(5));
  EXPECT_EQ(idle.size(), 3u) << "the settled pages; the fenced one stays";
  for (const ChunkHandle chunk : idle) f.backend->release_chunk(chunk);
  EXPECT_EQ(f.fake.used_bytes(Location::gpu(0)), 3 * kPage);
  EXPECT_EQ(bank.made_pages(), 3u);
  EXPECT_EQ(bank.released_idle_pages(), 3u);
  EXPECT_EQ(bank.fenced_pages(), 1u);
  EXPECT_EQ(bank.inconsistency(), "");
  // The bank makes pages again up to its capacity, and grants the fenced one first (oldest last).
  const std::vector<std::uint64_t> again = bank.grant(2, 4);
  ASSERT_EQ(again.size(), 4u);
  EXPECT_EQ(again[0], ids[2]) << "the free page that stayed is granted before new ones are made";
  EXPECT_EQ(bank.inconsistency(), "");
  bank.take_back(again);
  bank.take_back({ids[4], ids[5]});
}

TEST(SalusdCapacity, TheCoordinatorReleasesIdlePagesWithoutItsLockAndSaysSoInItsStatus) {
  Fixture f(300 * MiB);
  daemon::CoordinatorOptions o = with_reserve(100 * MiB);
  o.idle_release = std::chrono::milliseconds(1);
  daemon::Coordinator coordinator(f.backend, o);
  EXPECT_EQ(coordinator.release_idle_pages(), 0u);
  const std::string before = coordinator.status_table();
  EXPECT_NE(before.find("left to others MiB"), std::string::npos) << before;
  EXPECT_NE(before.find("724.0"), std::string::npos) << "free at start, 1024 - 300 MiB:\n" << before;
}

// With --group, users share one daemon. What another user runs is not this user's to read: the
// status shows its pages, not its pid, process name or job names (issue 34, item 7). Root sees
// everything.
TEST(SalusdStatus, AnotherUsersPidAndNamesAreHiddenFromAUserAndShownToRoot) {
  Fixture f(0);
  daemon::Coordinator coordinator(f.backend, with_reserve(0));
  std::string last_reply;
  const auto sender = [&](std::span<const std::byte> record, std::span<const int>) {
    last_reply.assign(reinterpret_cast<const char*>(record.data()) + sizeof(remote::Header),
                      record.size() - sizeof(remote::Header));
  };
  const auto call = [&](daemon::SessionId s, remote::MessageType type, std::uint64_t seq,
                        std::span<const std::byte> body) {
    remote::Received r;
    const std::vector<std::byte> bytes = remote::encode_body(type, seq, body);
    r.record.header = remote::decode_header(bytes);
    r.record.body.assign(bytes.begin() + sizeof(remote::Header), bytes.end());
    coordinator.handle(s, std::move(r));
  };
  const auto open = [&](pid_t pid, uid_t uid, const char* process, const char* job) {
    const daemon::SessionId s = coordinator.open_session({pid, uid, 100}, sender);
    remote::Hello hello;
    remote::set_name(hello.name, process);
    call(s, remote::MessageType::hello, 1, std::as_bytes(std::span(&hello, 1)));
    remote::AddJob add;
    remote::set_name(add.name, job);
    call(s, remote::MessageType::add_job, 2, std::as_bytes(std::span(&add, 1)));
    return s;
  };
  const auto status_for = [&](daemon::SessionId s) {
    call(s, remote::MessageType::status, 9, {});
    return last_reply;
  };
  const daemon::SessionId alice = open(4242, 1000, "alice-train", "alice-job");
  const daemon::SessionId bob = open(4343, 1001, "bob-train", "bob-job");
  const daemon::SessionId root = open(4444, 0, "root-tool", "root-job");

  const std::string seen_by_bob = status_for(bob);
  for (const char* secret : {"alice-train", "alice-job", "4242", "root-tool", "root-job", "4444"}) {
    EXPECT_EQ(seen_by_bob.find(secret), std::string::npos) << secret << " in\n" << seen_by_bob;
  }
  EXPECT_NE(seen_by_bob.find("bob-job"), std::string::npos) << seen_by_bob;
  EXPECT_NE(seen_by_bob.find("(another user)"), std::string::npos) << seen_by_bob;

  const std::string seen_by_root = status_for(root);
  for (const char* shown : {"alice-train", "alice-job", "4242", "bob-train", "4343"}) {
    EXPECT_NE(seen_by_root.find(shown), std::string::npos) << shown << " missing in\n"
                                                           << seen_by_root;
  }
  for (const daemon::SessionId s : {alice, bob, root}) coordinator.close_session(s);
}

}  // namespace
}  // namespace salus
