// Contract suites: one invariant written once, run on every backend.
//
// A contract suite is a value-parameterized GoogleTest suite (TEST_P) whose parameter is a
// BackendFixture: a name and a factory making a BackendHarness, which owns a DeviceBackend and
// offers the few things a test needs that each backend does its own way (making a stream the way a
// framework does, writing and checking bytes, the physical bytes the backend holds, the fake
// driver's violations). Each suite is instantiated over contract_backends(), so every test runs on
// the simulated backend and on the CUDA backend over the fake driver (tests/support/fake_driver).
// What only one backend can show (the fake driver's call log, sim timing) stays in that backend's
// own tests/test_*.cpp file.
//
// Adding a backend: derive a BackendHarness, give it a factory and add a BackendFixture for it to
// contract_backends() below; every contract suite then runs on it.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"
#include "support/memory_fixture.hpp"

namespace salus::testing::contract {

// One backend under test, with the helpers a contract test needs from it.
class BackendHarness {
 public:
  virtual ~BackendHarness() = default;
  [[nodiscard]] virtual std::shared_ptr<DeviceBackend> backend() const = 0;

  // A stream made the way a framework makes its own, unknown to Salus; and its destruction.
  virtual StreamHandle outside_stream(int device) = 0;
  virtual void destroy_stream(StreamHandle stream) = 0;

  // Writes a pattern derived from `seed` into [ptr, ptr + bytes), and checks it is still there
  // (every byte on the simulated backend, sample words on the fake driver's sparse memory).
  virtual void fill(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) = 0;
  [[nodiscard]] virtual bool check(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) const = 0;

  // Physical bytes the backend holds at `where` (chunks created and not released).
  [[nodiscard]] virtual std::size_t chunk_bytes(Location where) const = 0;

  // The test just made `uses` calls that name a destroyed stream (the application's mistake):
  // the fake driver records each as a violation, expected here and then forgotten.
  virtual void expect_destroyed_stream_uses(std::size_t uses) { (void)uses; }
  // Nothing went wrong under the library (the fake driver: no violations).
  virtual void expect_no_violations() {}
  // The GPU drains its queued work (before tearing down).
  virtual void finish_all_work() {}
};

class SimHarness final : public BackendHarness {
 public:
  explicit SimHarness(SimConfig config) : sim_(make_sim(std::move(config))) {}
  [[nodiscard]] std::shared_ptr<DeviceBackend> backend() const override { return sim_; }
  StreamHandle outside_stream(int device) override { return sim_->create_stream(device, 0); }
  void destroy_stream(StreamHandle stream) override { sim_->destroy_stream(stream); }
  void fill(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) override {
    fill_pattern(ptr, bytes, seed);
  }
  [[nodiscard]] bool check(DevicePtr ptr, std::size_t bytes, std::uint64_t seed) const override {
    return check_pattern(ptr, bytes, seed);
  }
  [[nodiscard]] std::size_t chunk_bytes(Location where) const override {
    return sim_->chunk_bytes(where);
  }

 private:
  std::shared_ptr<sim::SimBackend> sim_;
};

class FakeCudaHarness final : public BackendHarness {
 public:
  explicit FakeCudaHarness(test::FakeDriverConfig config)
      : fake_(std::move(config)), api_(fake_.api()), cuda_(std::make_shared<cuda::CudaBackend>(api_)) {}
  ~FakeCudaHarness() override { fake_.finish_all_work(); }

  [[nodiscard]] std::shared_ptr<DeviceBackend> backend() const override { return cuda_; }
  [[nodiscard]] test::FakeDriver& fake() { return fake_; }

  // Through the driver, in the device's primary context, as a framework does.
  StreamHandle outside_stream(int device) override {
    CUdevice dev = 0;
    CUcontext ctx = nullptr;
    CUcontext previous = nullptr;
    EXPECT_EQ(api_.cuDeviceGet(&dev, device), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuCtxGetCurrent(&previous), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    CUstream stream = nullptr;
    EXPECT_EQ(api_.cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuCtxSetCurrent(previous), CUDA_SUCCESS);
    EXPECT_EQ(api_.cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
    return StreamHandle{std::bit_cast<std::uint64_t>(stream)};
  }
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
  void expect_no_violations() override {
    const auto violations = fake_.violations();
    EXPECT_TRUE(violations.empty()) << violations.size() << " violations, first: "
                                    << (violations.empty() ? "" : violations.front());
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

// A backend to run contract suites on: `make(devices, bytes per device)`.
struct BackendFixture {
  std::string name;
  std::function<std::unique_ptr<BackendHarness>(int devices, std::size_t bytes)> make;
};

inline const std::vector<BackendFixture>& contract_backends() {
  static const std::vector<BackendFixture> backends = {
      {"Sim",
       [](int devices, std::size_t bytes) -> std::unique_ptr<BackendHarness> {
         return std::make_unique<SimHarness>(SimConfig::uniform(devices, bytes));
       }},
      {"CudaFake",
       [](int devices, std::size_t bytes) -> std::unique_ptr<BackendHarness> {
         return std::make_unique<FakeCudaHarness>(test::FakeDriverConfig::uniform(devices, bytes));
       }},
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
