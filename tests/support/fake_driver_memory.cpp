// The fake driver's virtual memory management: chunks, reservations, mappings and access.
#include <fmt/format.h>

#include <bit>

#include "support/fake_driver_state.hpp"

namespace salus::test {

CUresult FakeDriver::State::mem_get_allocation_granularity(
    std::size_t* granularity, const CUmemAllocationProp* prop,
    CUmemAllocationGranularity_flags option) {
  std::vector<std::uint64_t> args;
  if (prop != nullptr) {
    args = {static_cast<std::uint64_t>(prop->location.type),
            static_cast<std::uint64_t>(prop->location.id)};
  }
  args.push_back(static_cast<std::uint64_t>(option));
  return run("cuMemGetAllocationGranularity", std::move(args), [&] {
    if (granularity == nullptr || prop == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult rc = location_status(prop->location); rc != CUDA_SUCCESS) return rc;
    const std::size_t page = *granularity_of(prop->location);
    if (option == CU_MEM_ALLOC_GRANULARITY_RECOMMENDED) {
      std::size_t recommended = 4 * page;
      if (prop->location.type == CU_MEM_LOCATION_TYPE_DEVICE) {
        const FakeDeviceConfig& d = config_.devices[static_cast<std::size_t>(prop->location.id)];
        if (d.recommended_granularity != 0) recommended = d.recommended_granularity;
      }
      *granularity = recommended;
    } else if (option == CU_MEM_ALLOC_GRANULARITY_MINIMUM) {
      *granularity = page;
    } else {
      return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::mem_create(CUmemGenericAllocationHandle* handle, std::size_t size,
                                       const CUmemAllocationProp* prop, unsigned long long flags) {
  std::vector<std::uint64_t> args{size};
  if (prop != nullptr) {
    args.push_back(static_cast<std::uint64_t>(prop->location.type));
    args.push_back(static_cast<std::uint64_t>(prop->location.id));
  }
  args.push_back(flags);
  if (prop != nullptr) {
    args.push_back(static_cast<std::uint64_t>(prop->requestedHandleTypes));
    args.push_back(static_cast<std::uint64_t>(prop->allocFlags.gpuDirectRDMACapable));
  }
  return run("cuMemCreate", std::move(args), [&] {
    if (handle == nullptr || prop == nullptr || flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED) return CUDA_ERROR_INVALID_VALUE;
    if (const CUresult rc = location_status(prop->location); rc != CUDA_SUCCESS) return rc;
    if (const CUresult rc = check_export(*prop); rc != CUDA_SUCCESS) return rc;
    const auto page = granularity_of(prop->location);
    if (size == 0 || size % *page != 0) return CUDA_ERROR_INVALID_VALUE;
    Chunk chunk;
    chunk.size = size;
    chunk.exportable = (static_cast<unsigned>(prop->requestedHandleTypes) &
                        static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) != 0;
    chunk.host = prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE;
    chunk.device = chunk.host ? 0 : prop->location.id;
    std::size_t& used =
        chunk.host ? host_used_ : device_used_[static_cast<std::size_t>(chunk.device)];
    const std::size_t capacity =
        chunk.host ? config_.host_memory_bytes
                   : config_.devices[static_cast<std::size_t>(chunk.device)].memory_bytes -
                         config_.devices[static_cast<std::size_t>(chunk.device)].used_elsewhere;
    if (size > capacity - used) return CUDA_ERROR_OUT_OF_MEMORY;
    used += size;
    *handle = next_handle_++;
    chunks_.emplace(*handle, chunk);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::check_export(const CUmemAllocationProp& prop) const {
  // Host allocations are no IPC memory: the driver refuses any handle type for them.
  if (prop.location.type != CU_MEM_LOCATION_TYPE_DEVICE) {
    return prop.requestedHandleTypes == CU_MEM_HANDLE_TYPE_NONE ? CUDA_SUCCESS
                                                                : CUDA_ERROR_INVALID_VALUE;
  }
  const FakeDeviceConfig& d = config_.devices[static_cast<std::size_t>(prop.location.id)];
  const unsigned types = static_cast<unsigned>(prop.requestedHandleTypes);
  if ((types & ~static_cast<unsigned>(CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)) != 0) {
    return CUDA_ERROR_NOT_SUPPORTED;  // Windows or fabric handles: not modelled
  }
  if (types != 0 && !d.posix_fd) return CUDA_ERROR_NOT_SUPPORTED;
  if (prop.allocFlags.gpuDirectRDMACapable != 0 && !d.gpu_direct_rdma_vmm) {
    return CUDA_ERROR_INVALID_VALUE;
  }
  return CUDA_SUCCESS;
}

CUresult FakeDriver::State::mem_release(CUmemGenericAllocationHandle handle) {
  return run("cuMemRelease", {handle}, [&] {
    const CUmemGenericAllocationHandle allocation = allocation_of(handle);
    if (allocation == 0) return CUDA_ERROR_INVALID_VALUE;
    Chunk& chunk = chunks_.at(allocation);
    if (const auto alias = aliases_.find(handle); alias != aliases_.end()) {
      aliases_.erase(alias);
      --chunk.imports;
    } else {
      --chunk.references;
    }
    // Work still using the memory matters once no handle is left to keep it.
    if (chunk.released() && chunk.imports == 0) check_chunk(allocation);
    free_chunk_if_done(allocation);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::mem_address_reserve(CUdeviceptr* ptr, std::size_t size,
                                                std::size_t alignment, CUdeviceptr addr,
                                                unsigned long long flags) {
  return run("cuMemAddressReserve", {size, alignment, addr, flags}, [&] {
    if (ptr == nullptr || flags != 0 || size == 0 || size % page_ != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (alignment == 0) alignment = page_;
    if (!std::has_single_bit(alignment)) return CUDA_ERROR_INVALID_VALUE;
    // The address hint is ignored, as the driver may. A guard page between reservations makes an
    // off-by-one in the caller land outside any reservation.
    const CUdeviceptr base = (next_va_ + alignment - 1) / alignment * alignment;
    next_va_ = base + size + page_;
    reservations_.emplace(base, size);
    *ptr = base;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::mem_address_free(CUdeviceptr ptr, std::size_t size) {
  return run("cuMemAddressFree", {ptr, size}, [&] {
    const auto it = reservations_.find(ptr);
    if (it == reservations_.end() || it->second != size) return CUDA_ERROR_INVALID_VALUE;
    if (!range_unmapped(ptr, size)) return CUDA_ERROR_INVALID_VALUE;  // still mapped
    check_range("cuMemAddressFree", ptr, size);
    reservations_.erase(it);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                                    CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return run("cuMemMap", {ptr, size, offset, handle, flags}, [&] {
    // Mappings name the allocation, whichever of its handles mapped it: bytes follow it.
    const CUmemGenericAllocationHandle allocation = allocation_of(handle);
    if (allocation == 0) return CUDA_ERROR_INVALID_HANDLE;
    Chunk& chunk = chunks_.at(allocation);
    const std::size_t page =
        chunk.host ? config_.host_granularity
                   : config_.devices[static_cast<std::size_t>(chunk.device)].granularity;
    if (flags != 0 || size == 0 || ptr % page != 0 || size % page != 0 || offset % page != 0 ||
        offset > chunk.size || size > chunk.size - offset) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!range_reserved(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
    if (!range_unmapped(ptr, size)) return CUDA_ERROR_ALREADY_MAPPED;
    mappings_.emplace(ptr, Mapping{size, allocation, offset, handle});
    for (CUdeviceptr p = ptr; p < ptr + size; p += page_) {
      // A fresh mapping is inaccessible until cuMemSetAccess, as with the driver.
      pages_.emplace(
          p, std::vector<CUmemAccess_flags>(config_.devices.size(), CU_MEM_ACCESS_FLAGS_PROT_NONE));
    }
    ++chunk.mappings;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::mem_unmap(CUdeviceptr ptr, std::size_t size) {
  return run("cuMemUnmap", {ptr, size}, [&] {
    if (size == 0 || ptr % page_ != 0 || size % page_ != 0) return CUDA_ERROR_INVALID_VALUE;
    // The range must consist of whole mappings: no gaps, no mapping cut in two.
    CUdeviceptr at = ptr;
    auto it = mappings_.find(ptr);
    std::vector<decltype(it)> covered;
    while (at < ptr + size) {
      if (it == mappings_.end() || it->first != at) return CUDA_ERROR_INVALID_VALUE;
      covered.push_back(it);
      at += it->second.size;
      ++it;
    }
    if (at != ptr + size) return CUDA_ERROR_INVALID_VALUE;
    check_range("cuMemUnmap", ptr, size);
    for (const auto& mapping : covered) {
      const CUmemGenericAllocationHandle handle = mapping->second.handle;
      for (CUdeviceptr p = mapping->first; p < mapping->first + mapping->second.size; p += page_) {
        pages_.erase(p);
      }
      mappings_.erase(mapping);
      --chunks_.at(handle).mappings;
      free_chunk_if_done(handle);
    }
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::mem_set_access(CUdeviceptr ptr, std::size_t size,
                                           const CUmemAccessDesc* desc, std::size_t count) {
  std::vector<std::uint64_t> args{ptr, size, count};
  for (std::size_t i = 0; desc != nullptr && i < count; ++i) {
    args.push_back(static_cast<std::uint64_t>(desc[i].location.type));
    args.push_back(static_cast<std::uint64_t>(desc[i].location.id));
    args.push_back(static_cast<std::uint64_t>(desc[i].flags));
  }
  return run("cuMemSetAccess", std::move(args), [&] {
    if (desc == nullptr || count == 0 || size == 0 || ptr % page_ != 0 || size % page_ != 0) {
      return CUDA_ERROR_INVALID_VALUE;
    }
    if (!range_mapped(ptr, size)) return CUDA_ERROR_INVALID_VALUE;
    for (std::size_t i = 0; i < count; ++i) {
      const CUmemAccessDesc& d = desc[i];
      if (d.location.type != CU_MEM_LOCATION_TYPE_DEVICE || !valid_device(d.location.id)) {
        return CUDA_ERROR_INVALID_DEVICE;
      }
      if (d.flags != CU_MEM_ACCESS_FLAGS_PROT_NONE && d.flags != CU_MEM_ACCESS_FLAGS_PROT_READ &&
          d.flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE) {
        return CUDA_ERROR_INVALID_VALUE;
      }
      if (d.flags == CU_MEM_ACCESS_FLAGS_PROT_NONE) continue;
      // A device may reach another device's memory only over a peer link.
      for (CUdeviceptr p = ptr; p < ptr + size; p += page_) {
        const Chunk* chunk = chunk_at(p);
        if (chunk != nullptr && !chunk->host && chunk->device != d.location.id &&
            !peer(d.location.id, chunk->device).access) {
          return CUDA_ERROR_INVALID_DEVICE;
        }
      }
    }
    for (CUdeviceptr p = ptr; p < ptr + size; p += page_) {
      std::vector<CUmemAccess_flags>& access = pages_.at(p);
      for (std::size_t i = 0; i < count; ++i) {
        access[static_cast<std::size_t>(desc[i].location.id)] = desc[i].flags;
      }
    }
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::memcpy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes,
                                         CUstream stream) {
  return run("cuMemcpyAsync",
             {dst, src, bytes, static_cast<std::uint64_t>(std::bit_cast<std::uintptr_t>(stream))},
             [&] {
               if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
               if (config_.check_copy_ranges && bytes > 0 &&
                   (!range_mapped(dst, bytes) || !range_mapped(src, bytes))) {
                 return CUDA_ERROR_INVALID_VALUE;
               }
               // What the copy touches until it completes (after the stream's earlier work),
               // and the words it carries then.
               if (bytes > 0) {
                 const int device = device_of_stream(stream);
                 const std::string what = fmt::format("copy on device {}", device);
                 check_access(what + " from", device, src, bytes, CU_MEM_ACCESS_FLAGS_PROT_READ);
                 check_access(what + " to", device, dst, bytes,
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
                 enqueue(ItemKind::copy, stream, {span_of(dst, bytes), span_of(src, bytes)}, 0,
                         false, copy_pieces(dst, src, bytes));
               }
               return CUDA_SUCCESS;
             });
}

CUresult FakeDriver::State::memset_async(CUdeviceptr dst, unsigned char value, std::size_t bytes,
                                         CUstream stream) {
  return run("cuMemsetD8Async",
             {dst, value, bytes, static_cast<std::uint64_t>(std::bit_cast<std::uintptr_t>(stream))},
             [&] {
               if (!valid_stream(stream)) return CUDA_ERROR_INVALID_HANDLE;
               if (value != 0) return CUDA_ERROR_NOT_SUPPORTED;
               if (config_.check_copy_ranges && bytes > 0 && !range_mapped(dst, bytes)) {
                 return CUDA_ERROR_INVALID_VALUE;
               }
               if (bytes > 0) {
                 // A copy of nothing: the words under the range are gone (read as 0) when it
                 // completes.
                 const int device = device_of_stream(stream);
                 check_access(fmt::format("fill on device {} of", device), device, dst, bytes,
                              CU_MEM_ACCESS_FLAGS_PROT_READWRITE);
                 std::vector<CopyPiece> pieces = copy_pieces(dst, dst, bytes);
                 for (CopyPiece& p : pieces) p.src = 0;
                 enqueue(ItemKind::copy, stream, {span_of(dst, bytes)}, 0, false, std::move(pieces));
               }
               return CUDA_SUCCESS;
             });
}

int FakeDriver::State::device_of_stream(CUstream stream) const {
  const auto it = streams_.find(std::bit_cast<std::uintptr_t>(stream));
  return it != streams_.end() ? it->second : current_device();
}

void FakeDriver::State::check_access(const std::string& what, int device, CUdeviceptr va,
                                     std::size_t bytes, CUmemAccess_flags needed) {
  if (device < 0 || bytes == 0) return;
  const auto enough = [&](CUmemAccess_flags has) {
    return needed == CU_MEM_ACCESS_FLAGS_PROT_READ
               ? has == CU_MEM_ACCESS_FLAGS_PROT_READ || has == CU_MEM_ACCESS_FLAGS_PROT_READWRITE
               : has == CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  };
  for (CUdeviceptr page = va - va % page_; page < va + bytes; page += page_) {
    const auto it = pages_.find(page);
    if (it == pages_.end()) continue;  // unmapped: the caller's own check
    if (!enough(it->second[static_cast<std::size_t>(device)])) {
      violations_.push_back(fmt::format(
          "{} [{:#x}, +{:#x}) without device {}'s {} access at page {:#x} (a fault on a GPU)",
          what, va, bytes, device,
          needed == CU_MEM_ACCESS_FLAGS_PROT_READ ? "read" : "read_write", page));
      return;
    }
  }
}

}  // namespace salus::test
