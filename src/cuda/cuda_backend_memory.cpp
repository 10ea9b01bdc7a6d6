// CudaBackend: physical chunks and virtual address ranges (the driver's VMM API).
#include <fmt/format.h>

#include <bit>
#include <string_view>
#include <vector>

#include "cuda/cuda_backend.hpp"

namespace salus::cuda {

namespace {

// Checks before the driver sees the request, so that a caller's mistake reads as InvalidArgument
// naming the numbers rather than as an opaque CUDA_ERROR_INVALID_VALUE.
void check_size(std::string_view what, std::size_t bytes, std::size_t granularity) {
  if (bytes == 0 || bytes % granularity != 0) {
    throw InvalidArgument(
        fmt::format("{}: {} bytes is not a positive multiple of the granularity ({} bytes)", what,
                    bytes, granularity));
  }
}

void check_aligned(std::string_view what, std::string_view which, std::uint64_t value,
                   std::size_t granularity) {
  if (value % granularity != 0) {
    throw InvalidArgument(fmt::format("{}: {} {:#x} is not aligned to the granularity ({} bytes)",
                                      what, which, value, granularity));
  }
}

CUmemAccess_flags to_cu_flags(Access access) {
  switch (access) {
    case Access::none:
      return CU_MEM_ACCESS_FLAGS_PROT_NONE;
    case Access::read:
      return CU_MEM_ACCESS_FLAGS_PROT_READ;
    case Access::read_write:
      return CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  throw InvalidArgument(
      fmt::format("set_access: unknown access value {}", static_cast<int>(access)));
}

}  // namespace

CudaBackend::ChunkInfo CudaBackend::chunk_info(ChunkHandle chunk) const {
  const std::scoped_lock lock(mutex_);
  const auto it = chunks_.find(chunk.value);
  if (it == chunks_.end()) {
    throw InvalidArgument(fmt::format("unknown chunk handle {:#x}", chunk.value));
  }
  return it->second;
}

ChunkHandle CudaBackend::create_chunk(Location where, std::size_t bytes) {
  const std::size_t page = granularity(where);  // validates the location
  check_size("create_chunk", bytes, page);
  const CUmemAllocationProp prop = allocation_prop(where);

  const auto scope = bind(where.is_host() ? any_device() : where.index);
  CUmemGenericAllocationHandle handle = 0;
  SALUS_CU(api_, cuMemCreate, &handle, bytes, &prop, 0);
  try {
    const std::scoped_lock lock(mutex_);
    chunks_.emplace(handle, ChunkInfo{where, bytes});
  } catch (...) {
    api_.cuMemRelease(handle);  // only bad_alloc can land here; do not leak device memory
    throw;
  }
  return ChunkHandle{handle};
}

void CudaBackend::release_chunk(ChunkHandle chunk) {
  const ChunkInfo info = chunk_info(chunk);
  const auto scope = bind(info.where.is_host() ? any_device() : info.where.index);
  SALUS_CU(api_, cuMemRelease, chunk.value);
  // Forgotten only once the driver agreed, so a failed release can be retried.
  const std::scoped_lock lock(mutex_);
  chunks_.erase(chunk.value);
}

DevicePtr CudaBackend::reserve_address(std::size_t bytes, std::size_t alignment) {
  check_size("reserve_address", bytes, address_granularity());
  if (alignment != 0 && !std::has_single_bit(alignment)) {
    throw InvalidArgument(
        fmt::format("reserve_address: alignment {} is neither 0 nor a power of two", alignment));
  }
  // One address space for all devices: any context will do, and none is retained for it.
  const auto scope = bind(any_device());
  CUdeviceptr base = 0;
  SALUS_CU(api_, cuMemAddressReserve, &base, bytes, alignment, CUdeviceptr{0}, 0);
  return static_cast<DevicePtr>(base);
}

void CudaBackend::free_address(DevicePtr base, std::size_t bytes) {
  check_aligned("free_address", "base", base, address_granularity());
  check_size("free_address", bytes, address_granularity());
  const auto scope = bind(any_device());
  SALUS_CU(api_, cuMemAddressFree, static_cast<CUdeviceptr>(base), bytes);
}

void CudaBackend::map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                      std::size_t chunk_offset) {
  const ChunkInfo info = chunk_info(chunk);
  const std::size_t page = granularity(info.where);
  check_aligned("map", "address", va, page);
  check_size("map", bytes, page);
  check_aligned("map", "chunk offset", chunk_offset, page);
  if (chunk_offset > info.bytes || bytes > info.bytes - chunk_offset) {
    throw InvalidArgument(fmt::format("map: [{}, {}) lies outside chunk {:#x} of {} bytes",
                                      chunk_offset, chunk_offset + bytes, chunk.value, info.bytes));
  }
  const auto scope = bind(info.where.is_host() ? any_device() : info.where.index);
  SALUS_CU(api_, cuMemMap, static_cast<CUdeviceptr>(va), bytes, chunk_offset, chunk.value, 0);
}

void CudaBackend::unmap(DevicePtr va, std::size_t bytes) {
  check_aligned("unmap", "address", va, address_granularity());
  check_size("unmap", bytes, address_granularity());
  const auto scope = bind(any_device());
  SALUS_CU(api_, cuMemUnmap, static_cast<CUdeviceptr>(va), bytes);
}

void CudaBackend::set_access(DevicePtr va, std::size_t bytes, std::span<const AccessGrant> grants) {
  check_aligned("set_access", "address", va, address_granularity());
  check_size("set_access", bytes, address_granularity());
  std::vector<CUmemAccessDesc> descs;
  descs.reserve(grants.size());
  for (const AccessGrant& grant : grants) {
    check_device(grant.device, "set_access");
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = devices_[static_cast<std::size_t>(grant.device)].device;
    desc.flags = to_cu_flags(grant.access);
    descs.push_back(desc);
  }
  if (descs.empty()) return;  // nothing to replace; the driver would reject a count of 0
  const auto scope = bind(any_device());
  SALUS_CU(api_, cuMemSetAccess, static_cast<CUdeviceptr>(va), bytes, descs.data(), descs.size());
}

}  // namespace salus::cuda
