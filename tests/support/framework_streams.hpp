// Helpers for tests of streams a framework makes itself (outside Salus's scheduler), shared by
// the contract suites and the backend-specific framework-stream tests.
#pragma once

#include <gtest/gtest.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "cuda/driver_api.hpp"
#include "salus/memory.hpp"

namespace salus::testing {

// A stream the way a framework makes it: through the driver, in the device's primary context,
// leaving the thread's current context as it was.
inline StreamHandle driver_framework_stream(const cuda::DriverApi& api, int device) {
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUcontext previous = nullptr;
  EXPECT_EQ(api.cuDeviceGet(&dev, device), CUDA_SUCCESS);
  EXPECT_EQ(api.cuDevicePrimaryCtxRetain(&ctx, dev), CUDA_SUCCESS);
  EXPECT_EQ(api.cuCtxGetCurrent(&previous), CUDA_SUCCESS);
  EXPECT_EQ(api.cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  CUstream stream = nullptr;
  EXPECT_EQ(api.cuStreamCreateWithPriority(&stream, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  EXPECT_EQ(api.cuCtxSetCurrent(previous), CUDA_SUCCESS);
  EXPECT_EQ(api.cuDevicePrimaryCtxRelease(dev), CUDA_SUCCESS);
  return StreamHandle{std::bit_cast<std::uint64_t>(stream)};
}

// The device's statistics agree with the blocks a test holds (`live`, `each` bytes each), and so
// does `job`'s view of the device.
inline void expect_balanced(MemoryManager& memory, int device, const std::vector<DevicePtr>& live,
                            std::size_t each, JobId job = kUnattributedJob) {
  const DeviceMemoryStats d = memory.device_stats(device);
  EXPECT_EQ(d.allocated, live.size() * each);
  EXPECT_EQ(d.by_class[0].blocks + d.by_class[1].blocks, live.size());
  EXPECT_EQ(d.allocations - d.frees, live.size());
  const JobMemoryStats j = memory.job_stats(job);
  EXPECT_EQ(j.in_use_by_device[static_cast<std::size_t>(device)], live.size() * each);
}

}  // namespace salus::testing
