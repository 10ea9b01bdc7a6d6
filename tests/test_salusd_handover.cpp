// What a page carries from one process to the next (issue 34, item 7), on the coordinator over a
// simulated GPU whose pages the test maps as a process would:
//  - its bytes: a page that goes to another user is zeroed first (with --group, users share a
//    daemon, and pages kept their last holder's bytes). The zeroing runs on the GPU after the
//    last holder's work on the page (its fence), so even bytes that work writes after the page
//    was given back never reach the next user; a page that stays with its user is not zeroed (a
//    hand-over between one user's processes costs nothing more);
//  - its fence: a page given back behind work goes to another process once that work has
//    completed, waited for at most --fence-wait after the give-back; past that it is withheld,
//    so work that never completes (a crafted fence) stalls nobody.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <future>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "daemon/coordinator.hpp"
#include "remote/protocol.hpp"
#include "salus/sim.hpp"

namespace salus {
namespace {

using remote::MessageType;
using namespace std::chrono_literals;

// One process of user `uid`, driven by hand: each call waits for its reply, and a grant keeps
// its pages' descriptors and fences as a client would.
class Process {
 public:
  Process(daemon::Coordinator& coordinator, std::uint32_t uid) : coordinator_(coordinator) {
    id_ = coordinator.open_session(
        {::getpid(), uid, 100}, [this](std::span<const std::byte> record, std::span<const int> fds) {
          on_reply(record, fds);
        });
    remote::Hello hello;
    remote::set_name(hello.name, "scrub-test");
    call(MessageType::hello, std::as_bytes(std::span(&hello, 1)));
  }
  ~Process() { coordinator_.close_session(id_); }

  // Takes `count` pages and maps them; returns their addresses here.
  std::vector<unsigned char*> take(std::uint32_t count, std::size_t page_bytes) {
    const remote::PageCount want{0, count};
    call(MessageType::take_pages, std::as_bytes(std::span(&want, 1)));
    EXPECT_EQ(last_type_, MessageType::pages);
    std::vector<unsigned char*> mapped;
    for (const remote::PageEntry& e : entries_) {
      void* p = ::mmap(nullptr, page_bytes, PROT_READ | PROT_WRITE, MAP_SHARED,
                       fds_.at(e.fd_index).get(), static_cast<off_t>(e.offset));
      EXPECT_NE(p, MAP_FAILED);
      mapped.push_back(static_cast<unsigned char*>(p));
      maps_.emplace_back(p, page_bytes);
    }
    return mapped;
  }
  // The fence the last grant's first page came with, as an event of `on`; nullopt when there
  // was none.
  std::optional<EventHandle> grant_fence(DeviceBackend& on) const {
    if (entries_.empty() || entries_.front().fence == 0) return std::nullopt;
    const remote::FenceEntry& f = fences_.at(entries_.front().fence - 1);
    SharedEvent shared;
    shared.handle = f.handle;
    shared.fd = f.fd_index >= 0 ? fds_.at(static_cast<std::size_t>(f.fd_index)).get() : -1;
    return on.import_event(0, shared);
  }
  std::size_t distinct_fences() const { return fences_.size(); }
  std::vector<std::uint64_t> page_ids() const {
    std::vector<std::uint64_t> ids;
    for (const remote::PageEntry& e : entries_) ids.push_back(e.id);
    return ids;
  }
  // Gives back the last grant's pages: behind `fence` (an exported event's descriptor and handle)
  // or, with none, as settled.
  void give_back(const SharedEvent* fence) {
    std::vector<std::uint64_t> ids;
    for (const remote::PageEntry& e : entries_) ids.push_back(e.id);
    remote::GiveHead head;
    head.count = static_cast<std::uint32_t>(ids.size());
    remote::FenceEntry entry;
    std::vector<int> fds;
    if (fence != nullptr) {
      head.fence = remote::GiveFence::fenced;
      entry.handle = fence->handle;
      entry.fd_index = 0;
      fds.push_back(fence->fd);
    }
    call(MessageType::give_pages,
         remote::give_pages_body(head, ids, fence != nullptr ? &entry : nullptr), fds);
    EXPECT_EQ(last_type_, MessageType::done) << failure_;
  }
  void unmap() {
    for (const auto& [p, bytes] : maps_) ::munmap(p, bytes);
    maps_.clear();
  }

 private:
  void call(MessageType type, std::span<const std::byte> body, const std::vector<int>& fds = {}) {
    remote::Received r;
    const std::uint64_t seq = next_seq_++;
    const std::vector<std::byte> bytes = remote::encode_body(type, seq, body);
    r.record.header = remote::decode_header(bytes);
    r.record.body.assign(bytes.begin() + sizeof(remote::Header), bytes.end());
    for (const int fd : fds) r.fds.emplace_back(::dup(fd));
    coordinator_.handle(id_, std::move(r));
    std::unique_lock lock(mu_);
    ASSERT_TRUE(replied_.wait_for(lock, 30s, [&] { return answered_ == seq; }))
        << "no reply to " << remote::to_string(type);
  }
  void on_reply(std::span<const std::byte> record, std::span<const int> fds) {
    remote::Record r;
    r.header = remote::decode_header(record);
    r.body.assign(record.begin() + sizeof(remote::Header), record.end());
    std::lock_guard lock(mu_);
    last_type_ = r.type();
    if (last_type_ == MessageType::pages) {
      entries_.clear();
      fences_.clear();
      (void)remote::pages_body(r, entries_, fences_);
      fds_.clear();
      for (const int fd : fds) fds_.emplace_back(::dup(fd));  // the daemon closes its own
    } else if (last_type_ == MessageType::failure) {
      failure_ = remote::body_as<remote::Failure>(r).message.data();
    }
    answered_ = r.header.seq;
    replied_.notify_all();
  }

  daemon::Coordinator& coordinator_;
  daemon::SessionId id_ = 0;
  std::uint64_t next_seq_ = 1;
  std::mutex mu_;
  std::condition_variable replied_;
  std::uint64_t answered_ = 0;
  MessageType last_type_{};
  std::string failure_;
  std::vector<remote::PageEntry> entries_;
  std::vector<remote::FenceEntry> fences_;
  std::vector<remote::UniqueFd> fds_;
  std::vector<std::pair<void*, std::size_t>> maps_;
};

bool all_bytes(const std::vector<unsigned char*>& pages, std::size_t bytes, unsigned char value) {
  for (const unsigned char* p : pages) {
    for (std::size_t i = 0; i < bytes; ++i) {
      if (p[i] != value) return false;
    }
  }
  return true;
}

TEST(SalusdScrub, APageThatGoesToAnotherUserIsZeroedAfterItsLastHoldersWork) {
  const std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  daemon::Coordinator coordinator(backend, {});
  const std::size_t page = backend->granularity(Location::gpu(0));
  constexpr std::uint32_t kAlice = 1001, kBob = 1002;

  // Alice writes her pages, and gives them back while work of hers that writes them again is
  // still queued (behind a fence she exports).
  Process alice(coordinator, kAlice);
  const std::vector<unsigned char*> hers = alice.take(2, page);
  for (unsigned char* p : hers) std::memset(p, 0xab, page);
  const StreamHandle stream = backend->create_stream(0, 0);
  backend->launch_host_func(stream, [hers, page] {
    std::this_thread::sleep_for(100ms);  // the GPU gets there late
    for (unsigned char* p : hers) std::memset(p, 0xcd, page);
  });
  const EventHandle her_work = backend->create_shareable_event(0);
  backend->record_event(her_work, stream);
  const SharedEvent shared = backend->export_event(her_work);
  alice.give_back(&shared);
  EXPECT_EQ(coordinator.zeroed_pages(), 0u);

  // Bob gets them (the free list is last-in-first-out), zeroed once his stream waited for the
  // fence they came with.
  Process bob(coordinator, kBob);
  const std::vector<unsigned char*> his = bob.take(2, page);
  EXPECT_EQ(coordinator.zeroed_pages(), 2u);
  ASSERT_EQ(bob.distinct_fences(), 1u) << "a batch zeroed together comes with one fence";
  const std::optional<EventHandle> zeroing = bob.grant_fence(*backend);
  ASSERT_TRUE(zeroing) << "a zeroed page comes with the zeroing's fence";
  backend->synchronize_event(*zeroing);
  backend->synchronize_stream(stream);  // and alice's work has run too, whenever it ran
  EXPECT_TRUE(all_bytes(his, page, 0)) << "another user's bytes reached bob";
  backend->destroy_event(*zeroing);

  // A page that stays with its user is not zeroed: bob's second process sees his bytes.
  for (unsigned char* p : his) std::memset(p, 0x5a, page);
  bob.give_back(nullptr);
  Process bobs_other(coordinator, kBob);
  const std::vector<unsigned char*> same_user = bobs_other.take(2, page);
  EXPECT_EQ(coordinator.zeroed_pages(), 2u) << "a page that stays with its user was zeroed";
  EXPECT_TRUE(all_bytes(same_user, page, 0x5a));

  alice.unmap();
  bob.unmap();
  bobs_other.unmap();
  ::close(shared.fd);
  backend->destroy_event(her_work);
  backend->destroy_stream(stream);
}

TEST(SalusdFenceWait, PagesBehindWorkThatDoesNotCompleteInTimeAreWithheldNotHandedOn) {
  const std::shared_ptr<DeviceBackend> backend = make_sim_backend(SimConfig::uniform(1, 64 * MiB));
  daemon::CoordinatorOptions options;
  options.fence_wait = 200ms;  // a bound on the daemon's wait, not a timing the test asserts
  daemon::Coordinator coordinator(backend, options);
  const std::size_t page = backend->granularity(Location::gpu(0));
  constexpr std::uint32_t kUser = 1001;

  // Alice gives two pages back behind work that does not complete until the test lets it.
  Process alice(coordinator, kUser);
  (void)alice.take(2, page);
  const std::vector<std::uint64_t> hers = alice.page_ids();
  const StreamHandle stream = backend->create_stream(0, 0);
  std::promise<void> let_go;
  std::shared_future<void> released = let_go.get_future().share();
  backend->launch_host_func(stream, [released] { released.wait(); });
  const EventHandle her_work = backend->create_shareable_event(0);
  backend->record_event(her_work, stream);
  const SharedEvent shared = backend->export_event(her_work);
  alice.give_back(&shared);

  // Bob's ask does not get them: they are withheld once the bound has passed, and he gets two
  // other pages, with no fence to wait for.
  Process bob(coordinator, kUser);
  (void)bob.take(2, page);
  for (const std::uint64_t id : bob.page_ids()) {
    EXPECT_EQ(std::count(hers.begin(), hers.end(), id), 0) << "a page behind work that had not "
                                                              "completed in time was handed on";
  }
  EXPECT_EQ(bob.distinct_fences(), 0u);
  EXPECT_EQ(coordinator.device_use(0).withheld_bytes, 2 * page);
  EXPECT_EQ(coordinator.inconsistency(), "");

  // Once the work completes, the daemon's tick frees them, and they go on settled.
  let_go.set_value();
  backend->synchronize_stream(stream);
  (void)coordinator.release_idle_pages();
  EXPECT_EQ(coordinator.device_use(0).withheld_bytes, 0u);
  Process carol(coordinator, kUser);
  (void)carol.take(2, page);
  std::vector<std::uint64_t> hers_sorted = hers, carols = carol.page_ids();
  std::sort(hers_sorted.begin(), hers_sorted.end());
  std::sort(carols.begin(), carols.end());
  EXPECT_EQ(carols, hers_sorted);
  EXPECT_EQ(carol.distinct_fences(), 0u) << "completed work leaves nothing to wait for";
  EXPECT_EQ(coordinator.inconsistency(), "");

  alice.unmap();
  bob.unmap();
  carol.unmap();
  ::close(shared.fd);
  backend->destroy_event(her_work);
  backend->destroy_stream(stream);
}

}  // namespace
}  // namespace salus
