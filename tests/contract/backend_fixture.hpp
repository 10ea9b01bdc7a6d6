// Contract suites: one invariant written once, run on every backend.
//
// A contract suite is a value-parameterized GoogleTest suite (TEST_P) whose parameter is a
// BackendFixture: a name and a factory making a BackendHarness, which owns a DeviceBackend and
// offers the few things a test needs that each backend does its own way (making a stream the way a
// framework does, writing and checking bytes, the physical bytes the backend holds, the fake
// driver's violations). Each suite is instantiated over contract_backends(), so every test runs on
// the simulated backend, on the CUDA backend over the fake driver (tests/support/fake_driver) and
// on the backend of a process connected to salusd (RemoteBackend, with an in-process daemon).
// What only one backend can show (the fake driver's call log, sim timing) stays in that backend's
// own tests/test_*.cpp file.
//
// Adding a backend: derive a BackendHarness, give it a factory and add a BackendFixture for it to
// contract_backends() below; every contract suite then runs on it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>

#include <bit>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"
#include "support/framework_streams.hpp"
#include "support/memory_fixture.hpp"
#include "support/stream_work.hpp"

namespace salus::testing::contract {

// One backend under test, with the helpers a contract test needs from it.
class BackendHarness {
 public:
  virtual ~BackendHarness() = default;
  [[nodiscard]] virtual std::shared_ptr<DeviceBackend> backend() const = 0;
  // A second backend instance over the same devices, as another process would have one: a fresh
  // SimBackend with pools of its own, or another CudaBackend over the same fake driver.
  [[nodiscard]] virtual std::shared_ptr<DeviceBackend> peer_backend() const = 0;

  // A stream made the way a framework makes its own, unknown to Salus; and its destruction.
  virtual StreamHandle outside_stream(int device) = 0;
  virtual void destroy_stream(StreamHandle stream) = 0;

  // Writes a pattern derived from `seed` into [ptr, ptr + bytes), and checks it is still there
  // (every byte on the simulated backend, sample words on the fake driver's sparse memory).
  virtual void fill(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) = 0;
  [[nodiscard]] virtual bool check(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) const = 0;
  // Whether [ptr, ptr + bytes) reads as zeroes (the same bytes or words as check reads).
  [[nodiscard]] virtual bool zeroed(DevicePtr ptr, std::size_t bytes) const = 0;

  // Physical bytes the backend holds at `where` (chunks created and not released).
  [[nodiscard]] virtual std::size_t chunk_bytes(Location where) const = 0;

  // --- work queued on the GPU (stream-safety contracts) ---
  // A kernel queued on `stream` over [ptr, ptr + bytes) that stamps `key`; `slow`: the GPU gets to
  // it late. On the sim a host function that first sleeps (slow) and stamps the memory: an
  // unmapped page kills the process, a page handed on shows as wrong stamps. On the fake an
  // unfinished kernel: releasing memory under it is a violation. Returns its id.
  virtual std::uint64_t enqueue_work(StreamHandle stream, DevicePtr ptr, std::size_t bytes,
                                     std::uint64_t key, bool slow) = 0;
  // Starts counting host waits (the fake: clears its call log).
  virtual void mark() {}
  // Host waits since mark(); nullopt where the backend cannot tell (the sim).
  [[nodiscard]] virtual std::optional<std::size_t> host_waits() const { return std::nullopt; }
  // The work `earlier` is still queued (the fake; the sim's slow kernel cannot be asked).
  virtual void expect_still_queued(std::uint64_t earlier) { (void)earlier; }
  // The work `later` runs after `earlier` on the GPU. The fake finishes `later` and expects
  // `earlier` done with it; the sim shows it after drain(): `later`'s stamps survive.
  virtual void expect_runs_after(std::uint64_t later, std::uint64_t earlier) {
    (void)later;
    (void)earlier;
  }
  // The GPU gets through all queued work on `streams` and the default stream, and every item found
  // its own bytes.
  virtual void drain(std::span<const StreamHandle> streams) = 0;
  // After drain(): stamped words of [ptr, ptr + bytes) not holding `key` (the fake keeps no
  // bytes for its kernels: 0).
  [[nodiscard]] virtual std::size_t bad_stamps(DevicePtr ptr, std::size_t bytes,
                                               std::uint64_t key) const {
    (void)ptr, (void)bytes, (void)key;
    return 0;
  }
  // Nothing mapped or held by the backend any more (the fake: no mapping, no live chunk).
  virtual void expect_nothing_held() {}

  // The test just made `uses` calls that name a destroyed stream (the application's mistake):
  // the fake driver records each as a violation, expected here and then forgotten.
  virtual void expect_destroyed_stream_uses(std::size_t uses) { (void)uses; }
  // Nothing went wrong under the library (the fake driver: no violations, which are then
  // forgotten so that a later check reports only new ones). `when` says what was going on.
  virtual void expect_no_violations(const std::string& when = "") { (void)when; }
  // The GPU drains its queued work (before tearing down).
  virtual void finish_all_work() {}
  // Whether GPU chunks come one page at a time: a process connected to salusd, whose pages are the
  // daemon's, each its own allocation. A bigger create_chunk is then NotSupported, and the tests
  // that need one skip (SALUS_SKIP_ON_ONE_PAGE_CHUNKS).
  [[nodiscard]] virtual bool one_page_chunks() const { return false; }
};

// In a contract test, once the harness is built: skips it where GPU chunks are one page.
#define SALUS_SKIP_ON_ONE_PAGE_CHUNKS()                                                     \
  if (harness->one_page_chunks())                                                         \
  GTEST_SKIP() << GetParam().name << " makes GPU chunks of one page (a bigger one is refused " \
               << "as NotSupported: ChunksOfSeveralPagesAreMadeOrRefusedAsNotSupported)"

// What every harness over a simulated GPU shares: the bytes are host memory, every one of them
// checked, and queued work is a host function on the stream (sim_ is the backend whose streams
// and addresses the tests use: the one under test, or the local backend a RemoteBackend wraps).
class SimMemoryHarness : public BackendHarness {
 public:
  explicit SimMemoryHarness(std::shared_ptr<sim::SimBackend> sim) : sim_(std::move(sim)) {}
  StreamHandle outside_stream(int device) override { return sim_->create_stream(device, 0); }
  void destroy_stream(StreamHandle stream) override { sim_->destroy_stream(stream); }
  void fill(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) override {
    fill_pattern(ptr, bytes, seed);
  }
  [[nodiscard]] bool check(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) const override {
    return check_pattern(ptr, bytes, seed);
  }
  [[nodiscard]] bool zeroed(DevicePtr ptr, std::size_t bytes) const override {
    const auto* p = reinterpret_cast<const unsigned char*>(ptr);
    return std::all_of(p, p + bytes, [](unsigned char b) { return b == 0; });
  }

  // Long enough that the host is done with the reusing operation well before the work runs.
  static constexpr std::chrono::milliseconds kSlowKernel{200};
  std::uint64_t enqueue_work(StreamHandle stream, DevicePtr ptr, std::size_t bytes,
                             std::uint64_t key, bool slow) override {
    work_.touch(*sim_, stream, {{ptr, bytes}},
                stamp_once(key, slow ? std::chrono::microseconds(kSlowKernel)
                                     : std::chrono::microseconds(0)));
    return work_.enqueued();
  }
  void drain(std::span<const StreamHandle> streams) override {
    for (const StreamHandle s : streams) sim_->synchronize_stream(s);
    sim_->synchronize_stream({});
    EXPECT_TRUE(work_.all_finished())
        << work_.finished() << " of " << work_.enqueued() << " items finished";
    EXPECT_EQ(work_.mismatches(), 0u) << "queued work found foreign or stale bytes, first in block "
                                      << std::hex << work_.first_bad();
  }
  [[nodiscard]] std::size_t bad_stamps(DevicePtr ptr, std::size_t bytes,
                                       std::uint64_t key) const override {
    return count_bad_stamps({ptr, bytes}, key);
  }

 protected:
  std::shared_ptr<sim::SimBackend> sim_;

 private:
  StreamWork work_;
};

class SimHarness final : public SimMemoryHarness {
 public:
  explicit SimHarness(SimConfig config) : SimMemoryHarness(make_sim(std::move(config))) {}
  [[nodiscard]] std::shared_ptr<DeviceBackend> backend() const override { return sim_; }
  [[nodiscard]] std::shared_ptr<DeviceBackend> peer_backend() const override {
    return make_sim(sim_->config());
  }
  [[nodiscard]] std::size_t chunk_bytes(Location where) const override {
    return sim_->chunk_bytes(where);
  }
};

class FakeCudaHarness final : public BackendHarness {
 public:
  explicit FakeCudaHarness(test::FakeDriverConfig config)
      : fake_(std::move(config)),
        api_(fake_.api()),
        cuda_(std::make_shared<cuda::CudaBackend>(api_)) {}
  ~FakeCudaHarness() override { fake_.finish_all_work(); }

  [[nodiscard]] std::shared_ptr<DeviceBackend> backend() const override { return cuda_; }
  [[nodiscard]] std::shared_ptr<DeviceBackend> peer_backend() const override {
    return std::make_shared<cuda::CudaBackend>(api_);
  }
  [[nodiscard]] test::FakeDriver& fake() { return fake_; }

  // Through the driver, in the device's primary context, as a framework does.
  StreamHandle outside_stream(int device) override { return driver_framework_stream(api_, device); }
  void destroy_stream(StreamHandle stream) override {
    EXPECT_EQ(api_.cuStreamDestroy(std::bit_cast<CUstream>(stream.value)), CUDA_SUCCESS);
  }

  // The fake's memory is sparse 64-bit words: the first, a middle and the last whole word.
  void fill(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) override {
    for (const std::size_t at : sample_offsets(bytes)) fake_.write_word(ptr + at, word(seed, at));
  }
  [[nodiscard]] bool check(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) const override {
    for (const std::size_t at : sample_offsets(bytes)) {
      if (fake_.read_word(ptr + at) != word(seed, at)) return false;
    }
    return true;
  }
  [[nodiscard]] bool zeroed(DevicePtr ptr, std::size_t bytes) const override {
    for (const std::size_t at : sample_offsets(bytes)) {
      if (fake_.read_word(ptr + at) != 0) return false;
    }
    return true;
  }
  [[nodiscard]] std::size_t chunk_bytes(Location where) const override {
    return fake_.used_bytes(where);
  }

  void expect_destroyed_stream_uses(std::size_t uses) override {
    const std::vector<std::string> violations = fake_.violations();
    EXPECT_EQ(violations.size(), uses);
    for (const std::string& v : violations) {
      EXPECT_NE(v.find("destroyed"), std::string::npos) << v;
    }
    fake_.clear_violations();
  }
  void expect_no_violations(const std::string& when = "") override {
    const std::vector<std::string> violations = fake_.violations();
    // One per page: the first few tell the story.
    constexpr std::size_t kShown = 4;
    std::string listed;
    for (std::size_t i = 0; i < violations.size() && i < kShown; ++i)
      listed += "\n  " + violations[i];
    if (violations.size() > kShown) {
      listed += "\n  ... and " + std::to_string(violations.size() - kShown) + " more";
    }
    EXPECT_TRUE(violations.empty()) << violations.size() << " violations " << when << ":" << listed;
    fake_.clear_violations();
  }

  std::uint64_t enqueue_work(StreamHandle stream, DevicePtr ptr, std::size_t bytes,
                             std::uint64_t key, bool slow) override {
    (void)key, (void)slow;  // every fake kernel waits for the test
    return fake_.enqueue_work(stream, ptr, bytes);
  }
  void mark() override { fake_.clear_calls(); }
  [[nodiscard]] std::optional<std::size_t> host_waits() const override {
    return fake_.count("cuEventSynchronize") + fake_.count("cuStreamSynchronize");
  }
  void expect_still_queued(std::uint64_t earlier) override {
    EXPECT_FALSE(fake_.work_finished(earlier)) << "the host waited for the earlier kernel";
  }
  void expect_runs_after(std::uint64_t later, std::uint64_t earlier) override {
    fake_.finish_work(later);
    EXPECT_TRUE(fake_.work_finished(earlier)) << "the later work must run after the earlier";
  }
  void drain(std::span<const StreamHandle> streams) override {
    (void)streams;
    fake_.finish_all_work();
    EXPECT_EQ(fake_.pending_work(), 0u);
  }
  void expect_nothing_held() override {
    EXPECT_EQ(fake_.mapped_bytes(), 0u);
    EXPECT_EQ(fake_.live_chunks(), 0u);
  }
  void finish_all_work() override { fake_.finish_all_work(); }

 private:
  static std::vector<std::size_t> sample_offsets(std::size_t bytes) {
    if (bytes < 8) return {};
    const std::size_t last = (bytes - 8) / 8 * 8;
    return {0, last / 16 * 8, last};
  }
  static std::uint64_t word(std::uint64_t seed, std::size_t at) {
    return (seed * 0x9E3779B97F4A7C15ull | 1) ^ at;
  }

  test::FakeDriver fake_;
  cuda::DriverApi api_;
  std::shared_ptr<cuda::CudaBackend> cuda_;
};

// A process connected to salusd: a RemoteBackend over a simulated GPU of its own, its pages from a
// daemon (Coordinator and Server) running in this process on another simulated GPU
// (contract/remote_harness.cpp).
std::unique_ptr<BackendHarness> make_remote_harness(int devices, std::size_t bytes);

// A backend to run contract suites on: `make(devices, bytes per device)`.
struct BackendFixture {
  std::string name;
  std::function<std::unique_ptr<BackendHarness>(int devices, std::size_t bytes)> make;
};

// Its name in test listings (gtest finds PrintTo by ADL), rather than a dump of its bytes.
inline void PrintTo(const BackendFixture& fixture, std::ostream* os) {
  *os << fixture.name;
}

inline const std::vector<BackendFixture>& contract_backends() {
  static const std::vector<BackendFixture> backends = {
      {"Sim",
       [](int devices, std::size_t bytes) -> std::unique_ptr<BackendHarness> {
         return std::make_unique<SimHarness>(SimConfig::uniform(devices, bytes));
       }},
      {"CudaFake",
       [](int devices, std::size_t bytes) -> std::unique_ptr<BackendHarness> {
         test::FakeDriverConfig config = test::FakeDriverConfig::uniform(devices, bytes);
         config.ipc_open_own_events = true;  // one backend plays both processes of a fence
         return std::make_unique<FakeCudaHarness>(std::move(config));
       }},
      {"Remote", make_remote_harness},
  };
  return backends;
}

// INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::ValuesIn(contract_backends()),
//                          ContractBackendName);
inline std::string ContractBackendName(const ::testing::TestParamInfo<BackendFixture>& info) {
  return info.param.name;
}

// The base of a contract suite: a backend made by build(), and a memory manager over it.
class ContractTest : public ::testing::TestWithParam<BackendFixture> {
 protected:
  void build(int devices, std::size_t bytes, MemoryOptions options = {}) {
    memory.reset();
    harness.reset();
    harness = GetParam().make(devices, bytes);
    backend = harness->backend();
    memory = std::make_unique<MemoryManager>(backend, std::move(options));
  }
  void TearDown() override {
    if (harness) harness->finish_all_work();
    memory.reset();
    backend.reset();
    harness.reset();
  }

  DevicePtr alloc(std::size_t bytes, int device = 0, JobId job = kUnattributedJob,
                  Lifetime lifetime = Lifetime::persistent, StreamHandle stream = {}) {
    return memory->allocate({bytes, device, stream, job, lifetime});
  }

  std::unique_ptr<BackendHarness> harness;
  std::shared_ptr<DeviceBackend> backend;
  std::unique_ptr<MemoryManager> memory;
};

}  // namespace salus::testing::contract
