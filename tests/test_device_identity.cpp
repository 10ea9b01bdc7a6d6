// A process connected to salusd is refused when it does not mean the daemon's GPUs by the
// daemon's numbers (remote/device_identity.hpp): matched by the driver's UUIDs, here the fake
// driver's, as a process with another CUDA_VISIBLE_DEVICES would see them.
#include <gtest/gtest.h>

#include "cuda/cuda_backend.hpp"
#include "remote/device_identity.hpp"
#include "salus/sim.hpp"
#include "support/expect_throw.hpp"
#include "support/fake_driver.hpp"

namespace salus {
namespace {

using test::FakeDriver;
using test::FakeDriverConfig;

constexpr DeviceUuid kA = {0xa0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};
constexpr DeviceUuid kB = {0xb0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15};

remote::Welcome daemon_sees(std::initializer_list<DeviceUuid> uuids) {
  remote::Welcome w;
  for (const DeviceUuid& u : uuids) w.device_uuids[w.device_count++] = u;
  return w;
}

FakeDriverConfig gpus(std::initializer_list<DeviceUuid> uuids) {
  FakeDriverConfig config = FakeDriverConfig::uniform(static_cast<int>(uuids.size()), 1 * GiB);
  std::size_t i = 0;
  for (const DeviceUuid& u : uuids) config.devices[i++].uuid = u;
  return config;
}

TEST(DeviceIdentity, TheDriversUuidIsTheDevicesProperty) {
  FakeDriver fake(gpus({kA, kB}));
  cuda::CudaBackend backend(fake.api());
  EXPECT_EQ(backend.properties(1).uuid, kB);
  EXPECT_EQ(to_string(kA), "GPU-a0010203-0405-0607-0809-0a0b0c0d0e0f");
}

TEST(DeviceIdentity, TheDaemonsGpusInItsOrderAreAccepted) {
  FakeDriver fake(gpus({kA, kB}));
  cuda::CudaBackend backend(fake.api());
  EXPECT_NO_THROW(remote::check_same_devices(daemon_sees({kA, kB}), backend));
  EXPECT_NO_THROW(remote::check_same_devices(daemon_sees({kA}), backend))
      << "a daemon sharing fewer GPUs: its numbers are still this process's";
}

TEST(DeviceIdentity, AnotherOrderIsRefusedNamingBothGpus) {
  FakeDriver fake(gpus({kB, kA}));  // CUDA_VISIBLE_DEVICES=1,0 here, 0,1 in the daemon
  cuda::CudaBackend backend(fake.api());
  test_support::expect_throw_with<InvalidArgument>(
      [&] { remote::check_same_devices(daemon_sees({kA, kB}), backend); },
      "salusd's GPU 0 is GPU-a0010203-0405-0607-0809-0a0b0c0d0e0f, this process's GPU 0 is "
      "GPU-b0010203");
}

TEST(DeviceIdentity, FewerGpusThanTheDaemonsAreRefused) {
  FakeDriver fake(gpus({kA}));
  cuda::CudaBackend backend(fake.api());
  test_support::expect_throw_with<InvalidArgument>(
      [&] { remote::check_same_devices(daemon_sees({kA, kB}), backend); },
      "salusd shares 2 GPUs, this process sees 1");
}

TEST(DeviceIdentity, SimulatedDevicesAreTheSameInEveryProcess) {
  const auto daemon = make_sim_backend(SimConfig::uniform(2));
  const auto client = make_sim_backend(SimConfig::uniform(2));
  remote::Welcome w = daemon_sees({daemon->properties(0).uuid, daemon->properties(1).uuid});
  EXPECT_NO_THROW(remote::check_same_devices(w, *client));
  EXPECT_NE(daemon->properties(0).uuid, daemon->properties(1).uuid);
}

}  // namespace
}  // namespace salus
