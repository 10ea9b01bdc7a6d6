// Internal: argument checks that DeviceBackend's public functions make once for every backend
// (src/cuda/device_backend.cpp), and the one a backend makes itself once it knows the chunk
// (map), so that both backends word their errors alike. Each throws InvalidArgument naming
// the bad value.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

#include "salus/device.hpp"

namespace salus::detail {

// `device` lies in [0, count); the message names the index, the count and `backend`.
void check_device_index(std::string_view what, int device, int count, std::string_view backend);

// `bytes` is a positive multiple of `granularity`.
void check_size(std::string_view what, std::size_t bytes, std::size_t granularity);

// `value` (an address or offset, `which` names it) is a multiple of `granularity`.
void check_aligned(std::string_view what, std::string_view which, std::uint64_t value,
                   std::size_t granularity);

// map, once the backend knows the chunk: the address, size and offset are multiples of the
// chunk's own granularity, and [chunk_offset, chunk_offset + bytes) lies inside its bytes.
void check_map_in_chunk(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                        std::size_t chunk_offset, std::size_t chunk_bytes, std::size_t granularity);

}  // namespace salus::detail
