// salus_torch_cuda: PyTorch's CUDA allocator object for Salus (libsalus_torch_cuda, built where
// the torch wheel has its CUDA libraries and the CUDA headers are found; not in sanitizer builds).
//
// It is PyTorch's pluggable allocator over salus_torch_cuda_malloc/free (salus/torch.hpp), with
// what the plain pluggable allocator lacks answered by Salus:
//  - Tensor.record_stream: the block is also used on that stream (Runtime::record_stream): its
//    memory reaches another stream only behind that stream's work.
//  - torch.cuda.memory_allocated / max_memory_allocated / memory_reserved / memory_stats: Salus's
//    statistics for the device (MemoryManager::device_stats). Salus has no small and large pools:
//    only the "all" figures are filled. Requested and active bytes are the allocated bytes (Salus
//    counts block sizes; a freed block is reused in stream order, never "active" while free).
//    The peak number of blocks is not kept: it reads as the current number.
//  - torch.cuda.reset_peak_memory_stats(device): Salus resets its peaks, of every device (it keeps
//    one reset for all). reset_accumulated_memory_stats(device): Salus's counters cannot be reset,
//    so the glue keeps their values at the reset and reports what came after.
//  - torch.cuda.empty_cache(): Salus trims (returns unused pages of every device).
//  - CUDA graphs (torch.cuda.graph, CUDAGraph.capture_begin, torch.compile's "reduce-overhead",
//    torch.cuda.MemPool) are not supported: they route allocations to a private pool, which Salus
//    does not keep; starting one throws a c10::Error saying so, before any capture begins.
#pragma once

#include <memory>

#if defined(SALUS_TORCH_CUDA_BUILDING)
#define SALUS_TORCH_CUDA_API __attribute__((visibility("default")))
#else
#define SALUS_TORCH_CUDA_API
#endif

namespace c10::cuda::CUDACachingAllocator {
class CUDAAllocator;
}  // namespace c10::cuda::CUDACachingAllocator

namespace salus::torch {

// A new allocator object (the glue routes it to the runtime enable_cuda was given).
[[nodiscard]] SALUS_TORCH_CUDA_API std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>
make_cuda_allocator();

// Makes Salus's allocator PyTorch's CUDA allocator (c10::cuda::CUDACachingAllocator::get()), once
// per process: PyTorch keeps it afterwards, so a second call does nothing. Throws c10::Error when
// PyTorch's allocator is initialized already (CUDA was used before).
SALUS_TORCH_CUDA_API void install_cuda_allocator();

}  // namespace salus::torch
