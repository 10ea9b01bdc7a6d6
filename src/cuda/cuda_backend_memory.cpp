// CudaBackend: physical chunks and virtual address ranges (the driver's VMM API).
#include <fmt/format.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "cuda/backend_checks.hpp"
#include "cuda/cuda_backend.hpp"

namespace salus::cuda {

namespace {

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

HandleRegistry::Chunk CudaBackend::chunk_info(ChunkHandle chunk) const {
  const std::optional<HandleRegistry::Chunk> info = handles_.find_chunk(chunk);
  if (!info) throw InvalidArgument(fmt::format("unknown chunk handle {:#x}", chunk.value));
  return *info;
}

ChunkHandle CudaBackend::do_create_chunk(Location where, std::size_t bytes) {
  const CUmemAllocationProp prop = caps_.allocation_prop(where);

  const auto scope = bind_for(where);
  CUmemGenericAllocationHandle handle = 0;
  SALUS_CU(api_, cuMemCreate, &handle, bytes, &prop, 0);
  return handles_.adopt_chunk(handle, where, bytes);
}

void CudaBackend::do_release_chunk(ChunkHandle chunk) {
  const HandleRegistry::Chunk info = chunk_info(chunk);
  const auto scope = bind_for(info.where);
  SALUS_CU(api_, cuMemRelease, chunk.value);
  // Forgotten only once the driver agreed, so a failed release can be retried.
  handles_.drop_chunk_reference(chunk);
}

SharedChunk CudaBackend::do_export_chunk(ChunkHandle chunk) {
  const std::optional<HandleRegistry::Chunk> info = handles_.find_chunk(chunk);
  if (!info) {
    throw InvalidArgument(fmt::format(
        "export_chunk: unknown chunk {:#x} (never created or already released)", chunk.value));
  }
  if (info->where.is_host()) {
    // The driver refuses handle types for host allocations: they are no IPC memory.
    throw NotSupported(
        fmt::format("export_chunk: chunk {:#x} lies in host memory; only device chunks are shared",
                    chunk.value));
  }
  if (!caps_.device(info->where.index).posix_fd) {
    throw NotSupported(
        fmt::format("export_chunk: device {} cannot export memory as POSIX file descriptors",
                    info->where.index));
  }
  if (api_.cuMemExportToShareableHandle == nullptr) {
    throw NotSupported("export_chunk: the CUDA driver has no cuMemExportToShareableHandle");
  }
  const auto scope = contexts_.bind(info->where.index);
  int fd = -1;
  SALUS_CU(api_, cuMemExportToShareableHandle, &fd, chunk.value,
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0);
  return SharedChunk{fd, 0, info->bytes};
}

ChunkHandle CudaBackend::do_import_chunk(Location where, const SharedChunk& shared) {
  if (shared.offset != 0) {
    throw InvalidArgument(fmt::format(
        "import_chunk: offset {:#x}: a CUDA file descriptor shares one whole allocation (offset 0)",
        shared.offset));
  }
  if (api_.cuMemImportFromShareableHandle == nullptr) {
    throw NotSupported("import_chunk: the CUDA driver has no cuMemImportFromShareableHandle");
  }
  const auto scope = contexts_.bind(where.index);
  CUmemGenericAllocationHandle handle = 0;
  // The driver reads the descriptor and does not close it: it stays the caller's.
  SALUS_CU(api_, cuMemImportFromShareableHandle, &handle,
           reinterpret_cast<void*>(static_cast<std::uintptr_t>(shared.fd)),
           CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  return handles_.adopt_chunk(handle, where, shared.bytes);
}

DevicePtr CudaBackend::do_reserve_address(std::size_t bytes, std::size_t alignment) {
  // One address space for all devices: any context will do, and none is retained for it.
  const auto scope = contexts_.bind(contexts_.any_retained());
  CUdeviceptr base = 0;
  SALUS_CU(api_, cuMemAddressReserve, &base, bytes, alignment, CUdeviceptr{0}, 0);
  return static_cast<DevicePtr>(base);
}

void CudaBackend::do_free_address(DevicePtr base, std::size_t bytes) {
  const auto scope = contexts_.bind(contexts_.any_retained());
  SALUS_CU(api_, cuMemAddressFree, static_cast<CUdeviceptr>(base), bytes);
}

void CudaBackend::do_map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                         std::size_t chunk_offset) {
  const HandleRegistry::Chunk info = chunk_info(chunk);
  detail::check_map_in_chunk(va, bytes, chunk, chunk_offset, info.bytes,
                             caps_.granularity(info.where));
  const auto scope = bind_for(info.where);
  SALUS_CU(api_, cuMemMap, static_cast<CUdeviceptr>(va), bytes, chunk_offset, chunk.value, 0);
}

void CudaBackend::do_unmap(DevicePtr va, std::size_t bytes) {
  const auto scope = contexts_.bind(contexts_.any_retained());
  SALUS_CU(api_, cuMemUnmap, static_cast<CUdeviceptr>(va), bytes);
}

void CudaBackend::do_set_access(DevicePtr va, std::size_t bytes,
                                std::span<const AccessGrant> grants) {
  std::vector<CUmemAccessDesc> descs;
  descs.reserve(grants.size());
  for (const AccessGrant& grant : grants) {
    CUmemAccessDesc desc{};
    desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    desc.location.id = caps_.device(grant.device).device;
    desc.flags = to_cu_flags(grant.access);
    descs.push_back(desc);
  }
  if (descs.empty()) return;  // nothing to replace; the driver would reject a count of 0
  const auto scope = contexts_.bind(contexts_.any_retained());
  SALUS_CU(api_, cuMemSetAccess, static_cast<CUdeviceptr>(va), bytes, descs.data(), descs.size());
}

}  // namespace salus::cuda
