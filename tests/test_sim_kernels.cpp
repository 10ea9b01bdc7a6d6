// Simulated kernels on the sim backend: kernels of different streams that run at once share the
// device as the contention model says (processor sharing by default, time slicing, none), the
// device's activity counters add up, and bad input is refused with a clear error.
//
// Kernel durations are read with timing events on the kernel's stream (the stream's busy clock),
// which the compute engine advances by the exact time each kernel took: a worker thread that
// wakes late on a loaded machine does not stretch them. Tolerances cover the few milliseconds by
// which two streams may start their kernels apart.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "salus/sim.hpp"
#include "support/fake_driver.hpp"
#include "support/expect_throw.hpp"

namespace salus {
namespace {

using namespace std::chrono_literals;

constexpr double kTolerance = 0.015;  // seconds

using salus::test_support::expect_throw_with;

std::shared_ptr<DeviceBackend> sim(const std::string& contention = "processor_sharing",
                                   int devices = 1) {
  SimConfig config = SimConfig::uniform(devices, 64 * MiB);
  config.host_memory_bytes = 64 * MiB;
  config.contention = make_contention_model(contention);
  return make_sim_backend(std::move(config));
}

// A kernel bracketed by timing events on its stream.
struct TimedKernel {
  Event start;
  Event end;
  // Seconds the kernel took (waits until it is done).
  [[nodiscard]] double seconds() const {
    end.synchronize();
    return end.seconds_since(start);
  }
};

TimedKernel timed_kernel(const std::shared_ptr<DeviceBackend>& backend, StreamHandle stream,
                         double seconds, double occupancy) {
  TimedKernel k{Event(backend, 0, EventTiming::enabled), Event(backend, 0, EventTiming::enabled)};
  k.start.record(stream);
  launch_sim_kernel(*backend, stream, 0, seconds, occupancy);
  k.end.record(stream);
  return k;
}

// Two kernels of `seconds` at `occupancy` on two streams at once; the seconds each took.
std::pair<double, double> two_at_once(const std::string& contention, double seconds,
                                      double occupancy) {
  auto backend = sim(contention);
  Stream a(backend, 0);
  Stream b(backend, 0);
  const TimedKernel ka = timed_kernel(backend, a.handle(), seconds, occupancy);
  const TimedKernel kb = timed_kernel(backend, b.handle(), seconds, occupancy);
  return {ka.seconds(), kb.seconds()};
}

TEST(SimKernels, AloneAKernelTakesItsSeconds) {
  auto backend = sim();
  Stream s(backend, 0);
  const auto wall_start = std::chrono::steady_clock::now();
  const TimedKernel k = timed_kernel(backend, s.handle(), 0.05, 1.0);
  EXPECT_NEAR(k.seconds(), 0.05, 1e-6);  // exact: nothing else ran
  // The stream really was busy that long: what follows the kernel runs after it.
  EXPECT_GE(std::chrono::steady_clock::now() - wall_start, 50ms);
}

TEST(SimKernels, ProcessorSharingTwoFullKernelsEachTakeTwiceAsLong) {
  const auto [a, b] = two_at_once("processor_sharing", 0.2, 1.0);
  EXPECT_NEAR(a, 0.4, kTolerance);
  EXPECT_NEAR(b, 0.4, kTolerance);
}

TEST(SimKernels, ProcessorSharingTwoHalfKernelsRunAtFullSpeed) {
  const auto [a, b] = two_at_once("processor_sharing", 0.2, 0.5);
  EXPECT_NEAR(a, 0.2, kTolerance);
  EXPECT_NEAR(b, 0.2, kTolerance);
}

TEST(SimKernels, ProcessorSharingStaggeredStartsFollowTheHandComputedTimeline) {
  auto backend = sim();
  Stream a(backend, 0);
  Stream b(backend, 0);
  const TimedKernel ka = timed_kernel(backend, a.handle(), 0.2, 1.0);
  // B starts about 0.1 s later: its stream first runs host work (which its busy clock skips).
  backend->launch_host_func(b.handle(), [] { std::this_thread::sleep_for(100ms); });
  const TimedKernel kb = timed_kernel(backend, b.handle(), 0.2, 1.0);
  const double a_seconds = ka.seconds();
  const double b_seconds = kb.seconds();
  // The actual stagger: events of two streams measure wall time between them.
  const double stagger = kb.start.seconds_since(ka.start);
  ASSERT_GE(stagger, 0.095);
  ASSERT_LT(stagger, 0.19);
  // A runs alone for `stagger` (doing that much work), then both at half speed: A's remaining
  // 0.2 - stagger takes twice that, so A ends at 0.4 - stagger. By then B has done
  // (0.4 - 2 * stagger) / 2 = 0.2 - stagger and finishes the last `stagger` alone, at 0.4.
  EXPECT_NEAR(a_seconds, 0.4 - stagger, kTolerance);
  EXPECT_NEAR(b_seconds, 0.4 - stagger, kTolerance);
  // With a stagger of 0.1 s: 0.3 s each, where a model without contention would say 0.2 s.
  EXPECT_GT(a_seconds, 0.25);
}

TEST(SimKernels, TimeSlicingHalvesEvenSmallKernels) {
  // Occupancies of 0.3 would fit side by side, but time slices run one kernel at a time.
  const auto [a, b] = two_at_once("time_slicing", 0.2, 0.3);
  EXPECT_NEAR(a, 0.4, kTolerance);
  EXPECT_NEAR(b, 0.4, kTolerance);
}

TEST(SimKernels, NoContentionRunsEveryKernelAtFullSpeed) {
  const auto [a, b] = two_at_once("none", 0.2, 1.0);
  EXPECT_NEAR(a, 0.2, kTolerance);
  EXPECT_NEAR(b, 0.2, kTolerance);
}

TEST(SimKernels, ANullModelMeansProcessorSharing) {
  SimConfig config = SimConfig::uniform(1, 64 * MiB);
  config.host_memory_bytes = 64 * MiB;
  ASSERT_EQ(config.contention, nullptr);
  auto backend = make_sim_backend(std::move(config));
  Stream a(backend, 0);
  Stream b(backend, 0);
  const TimedKernel ka = timed_kernel(backend, a.handle(), 0.1, 1.0);
  const TimedKernel kb = timed_kernel(backend, b.handle(), 0.1, 1.0);
  EXPECT_NEAR(ka.seconds(), 0.2, kTolerance);
  EXPECT_NEAR(kb.seconds(), 0.2, kTolerance);
}

// Three overlapping kernels with staggered starts that saturate the device at times.
SimDeviceActivity run_mix(const std::shared_ptr<DeviceBackend>& backend) {
  struct Piece {
    double seconds, occupancy;
    std::chrono::milliseconds delay;
  };
  const std::vector<Piece> mix{{0.10, 0.6, 0ms}, {0.15, 0.7, 30ms}, {0.08, 0.5, 60ms}};
  std::vector<Stream> streams;
  for (const Piece& p : mix) {
    streams.emplace_back(backend, 0);
    const StreamHandle s = streams.back().handle();
    backend->launch_host_func(s, [d = p.delay] { std::this_thread::sleep_for(d); });
    launch_sim_kernel(*backend, s, 0, p.seconds, p.occupancy);
  }
  for (const Stream& s : streams) s.synchronize();
  return sim_device_activity(*backend, 0);
}

TEST(SimKernels, ProcessorSharingConservesWork) {
  const SimDeviceActivity a = run_mix(sim("processor_sharing"));
  EXPECT_EQ(a.kernels, 3u);
  EXPECT_NEAR(a.work_seconds, 0.10 * 0.6 + 0.15 * 0.7 + 0.08 * 0.5, 1e-9);
  // A saturated device delivers one device-second per second: every bit of work shows up.
  EXPECT_NEAR(a.utilization_seconds, a.work_seconds, 0.02 * a.work_seconds);
  EXPECT_GE(a.busy_seconds, a.utilization_seconds);
  EXPECT_LT(a.busy_seconds, 0.10 + 0.15 + 0.08);
}

TEST(SimKernels, WithoutContentionAnOverfullDeviceCountsLessUtilizationThanWork) {
  // The optimistic model lets 1.3 devices' worth of occupancy run at once; utilization is capped
  // at the whole device, so it falls short of the work: the model is not conserving.
  const SimDeviceActivity a = run_mix(sim("none"));
  EXPECT_EQ(a.kernels, 3u);
  EXPECT_LT(a.utilization_seconds, 0.97 * a.work_seconds);
}

TEST(SimKernels, ActivityCountsOnlyTimeWithAKernelRunning) {
  auto backend = sim();
  const SimDeviceActivity before = sim_device_activity(*backend, 0);
  EXPECT_EQ(before.kernels, 0u);
  EXPECT_EQ(before.busy_seconds, 0.0);
  Stream s(backend, 0);
  launch_sim_kernel(*backend, s.handle(), 0, 0.04, 0.5);
  backend->launch_host_func(s.handle(), [] { std::this_thread::sleep_for(60ms); });
  launch_sim_kernel(*backend, s.handle(), 0, 0.0, 1.0);  // empty: completes at once
  s.synchronize();
  const SimDeviceActivity a = sim_device_activity(*backend, 0);
  EXPECT_EQ(a.kernels, 2u);
  EXPECT_NEAR(a.busy_seconds, 0.04, 1e-6);
  EXPECT_NEAR(a.utilization_seconds, 0.02, 1e-6);
  EXPECT_NEAR(a.work_seconds, 0.02, 1e-9);
}

TEST(SimKernels, DevicesDoNotShareCompute) {
  auto backend = sim("processor_sharing", 2);
  Stream on0(backend, 0);
  Stream on1(backend, 1);
  TimedKernel k0{Event(backend, 0, EventTiming::enabled), Event(backend, 0, EventTiming::enabled)};
  TimedKernel k1{Event(backend, 1, EventTiming::enabled), Event(backend, 1, EventTiming::enabled)};
  k0.start.record(on0.handle());
  launch_sim_kernel(*backend, on0.handle(), 0, 0.1, 1.0);
  k0.end.record(on0.handle());
  k1.start.record(on1.handle());
  launch_sim_kernel(*backend, on1.handle(), 1, 0.1, 1.0);
  k1.end.record(on1.handle());
  EXPECT_NEAR(k0.seconds(), 0.1, kTolerance);
  EXPECT_NEAR(k1.seconds(), 0.1, kTolerance);
  EXPECT_EQ(sim_device_activity(*backend, 1).kernels, 1u);
}

TEST(SimKernels, ShutdownCutsARunningKernelShort) {
  auto backend = sim();
  const StreamHandle s = backend->create_stream(0, 0);
  launch_sim_kernel(*backend, s, 0, 60.0, 1.0);
  std::this_thread::sleep_for(20ms);  // the kernel is running now
  const auto start = std::chrono::steady_clock::now();
  backend.reset();  // the last reference: streams stop, the kernel's wait gives up
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5s);
}

TEST(SimKernels, BadInputIsRefusedWithAClearError) {
  auto backend = sim("processor_sharing", 2);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  for (const double seconds : {-0.1, nan, inf}) {
    expect_throw_with<InvalidArgument>(
        [&] { launch_sim_kernel(*backend, StreamHandle{0}, 0, seconds, 1.0); },
        "seconds must be finite and not negative");
  }
  for (const double occupancy : {0.0, -0.5, 1.5, nan}) {
    expect_throw_with<InvalidArgument>(
        [&] { launch_sim_kernel(*backend, StreamHandle{0}, 0, 0.01, occupancy); },
        "launch_sim_kernel: occupancy must be in (0, 1]");
  }
  expect_throw_with<InvalidArgument>(
      [&] { launch_sim_kernel(*backend, StreamHandle{0}, 2, 0.01, 1.0); }, "device 2");
  expect_throw_with<InvalidArgument>(
      [&] { launch_sim_kernel(*backend, StreamHandle{999}, 0, 0.01, 1.0); }, "unknown stream");
  Stream on1(backend, 1);
  expect_throw_with<InvalidArgument>(
      [&] { launch_sim_kernel(*backend, on1.handle(), 0, 0.01, 1.0); }, "belongs to device 1");
  expect_throw_with<InvalidArgument>([&] { (void)sim_device_activity(*backend, -1); }, "device -1");
  EXPECT_EQ(sim_device_activity(*backend, 0).kernels, 0u);  // nothing was enqueued
}

TEST(SimKernels, OtherBackendsHaveNoSimulatedKernels) {
  test::FakeDriver fake(test::FakeDriverConfig::uniform(1));
  cuda::CudaBackend backend(fake.api());
  expect_throw_with<InvalidArgument>(
      [&] { launch_sim_kernel(backend, StreamHandle{0}, 0, 0.01, 1.0); },
      "launch_sim_kernel: backend 'cuda' has no simulated kernels");
  expect_throw_with<InvalidArgument>(
      [&] { (void)sim_device_activity(backend, 0); },
      "sim_device_activity: backend 'cuda' has no simulated kernels");
}

}  // namespace
}  // namespace salus
