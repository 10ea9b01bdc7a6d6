// Sharing simulated chunks where only the simulator can show it: across a real process boundary
// (a forked child imports the descriptor it inherited into a SimBackend of its own and writes
// through it; the parent reads), the descriptors an importer keeps (one per exported file, however
// many chunks of it), and the descriptors it refuses. What both backends share:
// contract/test_chunk_sharing_contract.cpp. (Not under TSan, like test_fork.cpp: it forks.)
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "support/expect_throw.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using salus::test_support::expect_throw_with;

constexpr Location kGpu0 = Location::gpu(0);

std::size_t open_descriptors() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    ++n;
  }
  return n;
}

// Small pages, so that hundreds of chunks fit a small device.
SimConfig small_pages(int devices) {
  SimConfig config = SimConfig::uniform(devices, 32 * MiB);
  for (SimDeviceConfig& d : config.devices) d.granularity = 64 * 1024;
  return config;
}

DevicePtr map_rw(DeviceBackend& on, ChunkHandle chunk, std::size_t bytes) {
  const DevicePtr va = on.reserve_address(bytes, 0);
  on.map(va, bytes, chunk, 0);
  const std::array<AccessGrant, 1> grant{{{0, Access::read_write}}};
  on.set_access(va, bytes, grant);
  return va;
}

void unmap_free(DeviceBackend& on, DevicePtr va, std::size_t bytes) {
  on.unmap(va, bytes);
  on.free_address(va, bytes);
}

// In a child, gtest's assertions would go nowhere: a failed check exits with its line number.
#define CHILD_CHECK(cond)         \
  do {                            \
    if (!(cond)) return __LINE__; \
  } while (false)

// Runs `child` in a forked child (which leaves with _exit) and returns its exit code; a child that
// does not finish within 20 s is killed and fails the test.
int in_child(const std::function<int()>& child) {
  const pid_t pid = ::fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork failed";
    return -1;
  }
  if (pid == 0) {
    int code = 255;
    try {
      code = child();
    } catch (const std::exception& e) {
      std::fprintf(stderr, "child threw: %s\n", e.what());
      code = 254;
    }
    ::_exit(code);  // no static destructors, no gtest: the child is done
  }
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      ADD_FAILURE() << "the child hung";
      return -1;
    }
    std::this_thread::sleep_for(5ms);
  }
  if (!WIFEXITED(status)) {
    ADD_FAILURE() << "the child died of signal " << WTERMSIG(status);
    return -1;
  }
  return WEXITSTATUS(status);
}

TEST(SimSharing, AForkedChildWritesThroughItsImportAndTheParentReads) {
  const std::shared_ptr<sim::SimBackend> parent = make_sim(SimConfig::uniform(1, 64 * MiB));
  const std::size_t page = parent->granularity(kGpu0);
  const ChunkHandle chunk = parent->create_chunk(kGpu0, 2 * page);
  const SharedChunk shared = parent->export_chunk(chunk);
  const DevicePtr va = map_rw(*parent, chunk, 2 * page);
  fill_pattern(va, page, 1);

  const int code = in_child([&] {
    // The parent's backend is the parent's (its locks and threads are not here): a child imports
    // into one of its own, from the descriptor it inherited.
    bool refused = false;
    try {
      (void)parent->import_chunk(kGpu0, shared);
    } catch (const NotSupported&) {
      refused = true;
    }
    CHILD_CHECK(refused);
    const std::shared_ptr<sim::SimBackend> mine = make_sim(SimConfig::uniform(1, 64 * MiB));
    const ChunkHandle imported = mine->import_chunk(kGpu0, shared);
    const DevicePtr at = map_rw(*mine, imported, 2 * page);
    CHILD_CHECK(check_pattern(at, page, 1));  // the parent's bytes
    fill_pattern(at + page, page, 2);
    mine->release_chunk(imported);  // while mapped: the mapping stays until unmapped
    unmap_free(*mine, at, 2 * page);
    CHILD_CHECK(mine->chunk_bytes(kGpu0) == 0);
    return 0;
  });
  EXPECT_EQ(code, 0) << "the child failed at line " << code;
  EXPECT_TRUE(check_pattern(va + page, page, 2)) << "the child's bytes did not reach the parent";
  EXPECT_TRUE(check_pattern(va, page, 1)) << "the child's release changed the parent's bytes";
  ::close(shared.fd);
  unmap_free(*parent, va, 2 * page);
  parent->release_chunk(chunk);
  EXPECT_EQ(parent->chunk_bytes(kGpu0), 0u);
}

// An event another process exported completes when that process exits with its record still
// queued (its work is gone with it), before anyone reaps it: a waiter must not hang on a zombie.
TEST(SimSharing, AnEventOfAProcessThatExitedCountsAsComplete) {
  int to_parent[2], to_child[2];
  ASSERT_EQ(::pipe(to_parent), 0);
  ASSERT_EQ(::pipe(to_child), 0);
  const pid_t child = ::fork();
  if (child == 0) {
    const std::shared_ptr<sim::SimBackend> mine = make_sim(SimConfig::uniform(1, 64 * MiB));
    const StreamHandle stream = mine->create_stream(0, 0);
    mine->launch_host_func(stream, [] { std::this_thread::sleep_for(30s); });
    const EventHandle event = mine->create_shareable_event(0);
    mine->record_event(event, stream);  // queued behind 30 s of work
    const SharedEvent shared = mine->export_event(event);
    char go = 0;
    if (::write(to_parent[1], &shared.fd, sizeof(shared.fd)) != sizeof(shared.fd) ||
        ::read(to_child[0], &go, 1) != 1) {
      ::_exit(2);
    }
    ::_exit(0);  // with the record still queued
  }
  int fd_there = -1;
  ASSERT_EQ(::read(to_parent[0], &fd_there, sizeof(fd_there)), static_cast<ssize_t>(sizeof(int)));
  const std::string path = fmt::format("/proc/{}/fd/{}", child, fd_there);
  const int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
  ASSERT_GE(fd, 0) << path;
  const std::shared_ptr<sim::SimBackend> parent = make_sim(SimConfig::uniform(1, 64 * MiB));
  SharedEvent shared;
  shared.fd = fd;
  const EventHandle opened = parent->import_event(0, shared);
  ::close(fd);
  EXPECT_FALSE(parent->query_event(opened)) << "complete while its work is queued";
  const char go = 1;
  ASSERT_EQ(::write(to_child[1], &go, 1), 1);
  // Not reaped yet: a zombie, which kill(pid, 0) still finds.
  const auto started = std::chrono::steady_clock::now();
  parent->synchronize_event(opened);
  EXPECT_LT(std::chrono::steady_clock::now() - started, 10s);
  EXPECT_TRUE(parent->query_event(opened));
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  parent->destroy_event(opened);
  for (int end : {to_parent[0], to_parent[1], to_child[0], to_child[1]}) ::close(end);
}

TEST(SimSharing, ImportsKeepOneDescriptorPerExportedFile) {
  const std::shared_ptr<sim::SimBackend> exporter = make_sim(small_pages(2));
  const std::shared_ptr<sim::SimBackend> importer = make_sim(small_pages(2));
  const std::size_t page = exporter->granularity(kGpu0);
  constexpr int kPages = 300;
  std::vector<ChunkHandle> created;
  for (int i = 0; i < kPages; ++i) created.push_back(exporter->create_chunk(kGpu0, page));
  const ChunkHandle other = exporter->create_chunk(Location::gpu(1), page);

  const std::size_t before = open_descriptors();
  std::vector<ChunkHandle> imported;
  for (const ChunkHandle chunk : created) {
    const SharedChunk shared = exporter->export_chunk(chunk);
    imported.push_back(importer->import_chunk(kGpu0, shared));
    ::close(shared.fd);
  }
  EXPECT_LE(open_descriptors(), before + 1) << kPages << " pages of one pool, one descriptor";
  const SharedChunk shared = exporter->export_chunk(other);
  const ChunkHandle from_other = importer->import_chunk(kGpu0, shared);
  ::close(shared.fd);
  EXPECT_LE(open_descriptors(), before + 2) << "a second pool is a second file";
  EXPECT_EQ(importer->chunk_bytes(kGpu0), 0u) << "imports count against no capacity";

  // Each import is its own chunk: the last one maps the last page exported.
  const DevicePtr mine = map_rw(*exporter, created.back(), page);
  const DevicePtr theirs = map_rw(*importer, imported.back(), page);
  fill_pattern(mine, page, 9);
  EXPECT_TRUE(check_pattern(theirs, page, 9));
  unmap_free(*importer, theirs, page);
  unmap_free(*exporter, mine, page);

  for (const ChunkHandle chunk : imported) importer->release_chunk(chunk);
  EXPECT_LE(open_descriptors(), before + 1);
  importer->release_chunk(from_other);
  EXPECT_EQ(open_descriptors(), before) << "the last chunk of a file closes it";
  for (const ChunkHandle chunk : created) exporter->release_chunk(chunk);
  exporter->release_chunk(other);
}

TEST(SimSharing, AReleasedImportKeepsItsFileUntilTheLastUnmap) {
  const std::shared_ptr<sim::SimBackend> exporter = make_sim(SimConfig::uniform(1, 64 * MiB));
  const std::shared_ptr<sim::SimBackend> importer = make_sim(SimConfig::uniform(1, 64 * MiB));
  const std::size_t page = exporter->granularity(kGpu0);
  const ChunkHandle chunk = exporter->create_chunk(kGpu0, page);
  const std::size_t before = open_descriptors();
  const SharedChunk shared = exporter->export_chunk(chunk);
  const ChunkHandle imported = importer->import_chunk(kGpu0, shared);
  ::close(shared.fd);
  const DevicePtr va = map_rw(*importer, imported, page);
  importer->release_chunk(imported);
  EXPECT_EQ(open_descriptors(), before + 1) << "still mapped";
  expect_throw_with<InvalidArgument>([&] { (void)importer->export_chunk(imported); },
                                     "unknown chunk");
  unmap_free(*importer, va, page);
  EXPECT_EQ(open_descriptors(), before);
  exporter->release_chunk(chunk);
}

TEST(SimSharing, AnImportIsExportedOnwardAsTheSameFile) {
  const std::shared_ptr<sim::SimBackend> a = make_sim(SimConfig::uniform(1, 64 * MiB));
  const std::shared_ptr<sim::SimBackend> b = make_sim(SimConfig::uniform(1, 64 * MiB));
  const std::size_t page = a->granularity(kGpu0);
  const ChunkHandle first = a->create_chunk(kGpu0, page);
  const ChunkHandle chunk = a->create_chunk(kGpu0, page);  // at an offset of its pool
  const SharedChunk shared = a->export_chunk(chunk);
  EXPECT_EQ(shared.offset, page);
  const ChunkHandle imported = b->import_chunk(kGpu0, shared);
  const SharedChunk onward = b->export_chunk(imported);
  struct stat one {};
  struct stat two {};
  ASSERT_EQ(::fstat(shared.fd, &one), 0);
  ASSERT_EQ(::fstat(onward.fd, &two), 0);
  EXPECT_EQ(one.st_ino, two.st_ino);
  EXPECT_EQ(onward.offset, shared.offset);
  EXPECT_EQ(onward.bytes, shared.bytes);
  ::close(shared.fd);
  ::close(onward.fd);
  b->release_chunk(imported);
  a->release_chunk(chunk);
  a->release_chunk(first);
}

TEST(SimSharing, DescriptorsHoldingNoSharedMemoryAreRefused) {
  const std::shared_ptr<sim::SimBackend> sim = make_sim(SimConfig::uniform(1, 64 * MiB));
  const std::size_t page = sim->granularity(kGpu0);
  const ChunkHandle chunk = sim->create_chunk(kGpu0, page);
  const SharedChunk shared = sim->export_chunk(chunk);
  const std::size_t before = open_descriptors();

  const int event = ::eventfd(0, EFD_CLOEXEC);
  expect_throw_with<InvalidArgument>([&] { (void)sim->import_chunk(kGpu0, {event, 0, page}); },
                                     "no exported memory");
  ::close(event);
  expect_throw_with<InvalidArgument>([&] { (void)sim->import_chunk(kGpu0, {event, 0, page}); },
                                     fmt::format("file descriptor {} is not open", event));
  const std::string path = fmt::format("/proc/self/fd/{}", shared.fd);
  const int read_only = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(read_only, 0);
  expect_throw_with<InvalidArgument>(
      [&] { (void)sim->import_chunk(kGpu0, {read_only, shared.offset, page}); },
      "reading and writing");
  ::close(read_only);
  // The device's file is 64 MiB: a chunk past its end is no chunk of it.
  expect_throw_with<InvalidArgument>(
      [&] { (void)sim->import_chunk(kGpu0, {shared.fd, 64 * MiB, page}); },
      "outside the shared file of 67108864 bytes");
  EXPECT_EQ(open_descriptors(), before) << "a refused import keeps nothing";

  ::close(shared.fd);
  sim->release_chunk(chunk);
  EXPECT_EQ(sim->chunk_bytes(kGpu0), 0u);
}

// An imported event is mapped and read for as long as it lives. A sender that could shrink the
// file afterwards would kill the importer with SIGBUS (issue 34, item 7: a client gave pages back
// with such a fence, and the next process crashed): exported events are sealed at their size, and
// an event file without that seal is refused.
TEST(SimSharing, AnEventFileThatCouldShrinkIsRefusedAndAnExportedOneCannotShrink) {
  const std::shared_ptr<sim::SimBackend> sim = make_sim(SimConfig::uniform(1, 64 * MiB));
  const EventHandle event = sim->create_shareable_event(0);
  const SharedEvent shared = sim->export_event(event);
  EXPECT_NE(::ftruncate(shared.fd, 0), 0) << "the exported event's size is sealed";
  EXPECT_EQ(errno, EPERM);

  // A copy of a real event's bytes in a file of the right size, but unsealed.
  const int forged = ::memfd_create("forged-event", MFD_CLOEXEC);
  ASSERT_GE(forged, 0);
  std::array<char, 4096> bytes{};
  ASSERT_EQ(::pread(shared.fd, bytes.data(), bytes.size(), 0), 4096);
  ASSERT_EQ(::pwrite(forged, bytes.data(), bytes.size(), 0), 4096);
  const std::size_t before = open_descriptors();
  expect_throw_with<InvalidArgument>([&] { (void)sim->import_event(0, {forged, {}}); },
                                     "not sealed against shrinking");
  EXPECT_EQ(open_descriptors(), before) << "a refused import keeps nothing";

  const EventHandle opened = sim->import_event(0, shared);  // the sealed one is taken
  EXPECT_TRUE(sim->query_event(opened));
  sim->destroy_event(opened);
  ::close(forged);
  ::close(shared.fd);
  sim->destroy_event(event);
}

}  // namespace
}  // namespace salus::testing
