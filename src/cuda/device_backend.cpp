// DeviceBackend's public functions: each checks its arguments once, for every backend, and then
// calls the backend's do_<name> (see the list above the class in salus/device.hpp).
#include <fmt/format.h>

#include <bit>
#include <cstdint>
#include <utility>

#include "waits/blocking.hpp"
#include "cuda/backend_checks.hpp"
#include "salus/device.hpp"

namespace salus {

namespace detail {

void check_device_index(std::string_view what, int device, int count, std::string_view backend) {
  if (device < 0 || device >= count) {
    throw InvalidArgument(fmt::format("{}: device {} out of range (the {} backend has {} devices)",
                                      what, device, backend, count));
  }
}

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

void check_map_in_chunk(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                        std::size_t chunk_offset, std::size_t chunk_bytes,
                        std::size_t granularity) {
  check_aligned("map", "address", va, granularity);
  check_size("map", bytes, granularity);
  check_aligned("map", "chunk offset", chunk_offset, granularity);
  if (chunk_offset > chunk_bytes || bytes > chunk_bytes - chunk_offset) {
    throw InvalidArgument(fmt::format("map: [{}, {}) lies outside chunk {:#x} of {} bytes",
                                      chunk_offset, chunk_offset + bytes, chunk.value,
                                      chunk_bytes));
  }
}

}  // namespace detail

// --- shared checks ----------------------------------------------------------------------------

void DeviceBackend::check_device(int device, std::string_view what) const {
  const int count = do_device_count();
  if (device >= 0 && device < count) return;  // the name is only wanted for the message
  detail::check_device_index(what, device, count, do_name());
}

void DeviceBackend::check_location(Location where, std::string_view what) const {
  switch (where.kind) {
    case LocationKind::device:
      check_device(where.index, what);
      return;
    case LocationKind::host:
      if (where.index < 0) {
        throw InvalidArgument(
            fmt::format("{}: {} names no host NUMA node", what, to_string(where)));
      }
      return;
  }
  throw InvalidArgument(fmt::format("{}: unknown location kind {} (index {})", what,
                                    static_cast<int>(where.kind), where.index));
}

std::size_t DeviceBackend::check_range(std::string_view what, DevicePtr va,
                                       std::size_t bytes) const {
  const std::size_t granularity = do_address_granularity();
  detail::check_aligned(what, "address", va, granularity);
  detail::check_size(what, bytes, granularity);
  if (bytes > UINTPTR_MAX - va) {
    throw InvalidArgument(
        fmt::format("{}: [{:#x}, +{}) wraps around the address space", what, va, bytes));
  }
  return granularity;
}

void DeviceBackend::check_event(EventHandle event, std::string_view what) {
  if (event.value == 0) {
    throw InvalidArgument(fmt::format("{}: event handle 0 is no event", what));
  }
}

// --- queries ----------------------------------------------------------------------------------

DeviceProperties DeviceBackend::properties(int device) const {
  check_device(device, "properties");
  return do_properties(device);
}

std::size_t DeviceBackend::free_memory(int device) const {
  check_device(device, "free_memory");
  return do_free_memory(device);
}

std::size_t DeviceBackend::granularity(Location where) const {
  check_location(where, "granularity");
  return do_granularity(where);
}

PeerLink DeviceBackend::peer_link(int from, int to) const {
  check_device(from, "peer_link (from)");
  check_device(to, "peer_link (to)");
  return do_peer_link(from, to);
}

// --- memory -----------------------------------------------------------------------------------

ChunkHandle DeviceBackend::create_chunk(Location where, std::size_t bytes) {
  check_location(where, "create_chunk");
  const std::size_t page = do_granularity(where);  // NotSupported where there are no such chunks
  if (bytes == 0 || bytes % page != 0) {
    throw InvalidArgument(fmt::format(
        "create_chunk: {} bytes on {} is not a positive multiple of its granularity ({} bytes)",
        bytes, to_string(where), page));
  }
  return do_create_chunk(where, bytes);
}

void DeviceBackend::release_chunk(ChunkHandle chunk) {
  if (chunk.value == 0) throw InvalidArgument("release_chunk: chunk handle 0 is no chunk");
  do_release_chunk(chunk);
}

SharedChunk DeviceBackend::export_chunk(ChunkHandle chunk) {
  if (chunk.value == 0) throw InvalidArgument("export_chunk: chunk handle 0 is no chunk");
  return do_export_chunk(chunk);
}

ChunkHandle DeviceBackend::import_chunk(Location where, const SharedChunk& shared) {
  check_location(where, "import_chunk");
  if (where.is_host()) {
    // Host chunks are no IPC memory on CUDA (cuMemCreate refuses handle types for them).
    throw InvalidArgument(
        fmt::format("import_chunk: {} is no GPU; only device chunks are shared", to_string(where)));
  }
  if (shared.fd < 0) {
    throw InvalidArgument(
        fmt::format("import_chunk: file descriptor {} is no descriptor", shared.fd));
  }
  const std::size_t page = do_granularity(where);
  if (shared.bytes == 0 || shared.bytes % page != 0) {
    throw InvalidArgument(fmt::format(
        "import_chunk: {} bytes on {} is not a positive multiple of its granularity ({} bytes)",
        shared.bytes, to_string(where), page));
  }
  detail::check_aligned("import_chunk", "offset", shared.offset, page);
  if (shared.offset > UINT64_MAX - shared.bytes) {
    throw InvalidArgument(
        fmt::format("import_chunk: [{:#x}, +{}) wraps around", shared.offset, shared.bytes));
  }
  return do_import_chunk(where, shared);
}

std::shared_ptr<const Event> DeviceBackend::take_arrival(ChunkHandle chunk) {
  if (chunk.value == 0) throw InvalidArgument("take_arrival: chunk handle 0 is no chunk");
  return do_take_arrival(chunk);
}

void DeviceBackend::release_chunks_after(std::span<const ChunkHandle> chunks,
                                         std::span<const std::shared_ptr<const Event>> work) {
  for (const ChunkHandle chunk : chunks) {
    if (chunk.value == 0) throw InvalidArgument("release_chunks_after: chunk handle 0 is no chunk");
  }
  for (const auto& event : work) {
    if (event == nullptr || event->handle().value == 0) {
      throw InvalidArgument("release_chunks_after: a null event is no work to wait for");
    }
  }
  if (!chunks.empty()) do_release_chunks_after(chunks, work);
}

// A backend of this process's own: the memory is free for its next user only once the work is
// done, so wait here.
void DeviceBackend::do_release_chunks_after(std::span<const ChunkHandle> chunks,
                                            std::span<const std::shared_ptr<const Event>> work) {
  for (const auto& event : work) event->synchronize();
  for (const ChunkHandle chunk : chunks) do_release_chunk(chunk);
}

DevicePtr DeviceBackend::reserve_address(std::size_t bytes, std::size_t alignment) {
  detail::check_size("reserve_address", bytes, do_address_granularity());
  if (alignment != 0 && !std::has_single_bit(alignment)) {
    throw InvalidArgument(
        fmt::format("reserve_address: alignment {} is neither 0 nor a power of two", alignment));
  }
  return do_reserve_address(bytes, alignment);
}

void DeviceBackend::free_address(DevicePtr base, std::size_t bytes) {
  check_range("free_address", base, bytes);
  do_free_address(base, bytes);
}

void DeviceBackend::map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                        std::size_t chunk_offset) {
  const std::size_t granularity = check_range("map", va, bytes);
  detail::check_aligned("map", "chunk offset", chunk_offset, granularity);
  if (chunk.value == 0) throw InvalidArgument("map: chunk handle 0 is no chunk");
  do_map(va, bytes, chunk, chunk_offset);
}

void DeviceBackend::unmap(DevicePtr va, std::size_t bytes) {
  check_range("unmap", va, bytes);
  do_unmap(va, bytes);
}

void DeviceBackend::set_access(DevicePtr va, std::size_t bytes,
                               std::span<const AccessGrant> grants) {
  check_range("set_access", va, bytes);
  for (const AccessGrant& grant : grants) {
    check_device(grant.device, "set_access");
    switch (grant.access) {
      case Access::none:
      case Access::read:
      case Access::read_write:
        continue;
    }
    throw InvalidArgument(fmt::format("set_access: unknown access value {} for device {}",
                                      static_cast<int>(grant.access), grant.device));
  }
  do_set_access(va, bytes, grants);
}

// --- streams ----------------------------------------------------------------------------------

StreamPriorityRange DeviceBackend::stream_priority_range(int device) const {
  check_device(device, "stream_priority_range");
  return do_stream_priority_range(device);
}

StreamHandle DeviceBackend::create_stream(int device, int priority) {
  check_device(device, "create_stream");
  return do_create_stream(device, priority);
}

void DeviceBackend::destroy_stream(StreamHandle stream) {
  if (stream.value == 0) {
    throw InvalidArgument("destroy_stream: stream handle 0 is the default stream, owned by nobody");
  }
  do_destroy_stream(stream);
}

void DeviceBackend::synchronize_stream(StreamHandle stream) {
  waits::before_blocking();
  do_synchronize_stream(stream);
}

void DeviceBackend::validate_stream(StreamHandle stream, int device) {
  check_device(device, "validate_stream");
  do_validate_stream(stream, device);
}

bool DeviceBackend::stream_known_idle(StreamHandle stream, int device) {
  check_device(device, "stream_known_idle");
  return do_stream_known_idle(stream, device);
}

bool DeviceBackend::query_stream(StreamHandle stream, int device) {
  check_device(device, "query_stream");
  return do_query_stream(stream, device);
}

void DeviceBackend::launch_host_func(StreamHandle stream, std::function<void()> fn) {
  if (!fn) throw InvalidArgument("launch_host_func: empty function");
  do_launch_host_func(stream, std::move(fn));
}

void DeviceBackend::copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                               StreamHandle stream) {
  if (bytes == 0) return;  // nothing to order
  do_copy_async(dst, src, bytes, stream);
}

void DeviceBackend::fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                               StreamHandle stream) {
  if (bytes == 0) return;  // nothing to order
  do_fill_async(dst, value, bytes, stream);
}

// --- events -----------------------------------------------------------------------------------

EventHandle DeviceBackend::create_event(int device) {
  check_device(device, "create_event");
  return do_create_event(device);
}

EventHandle DeviceBackend::create_timing_event(int device) {
  check_device(device, "create_timing_event");
  return do_create_timing_event(device);
}

void DeviceBackend::destroy_event(EventHandle event) {
  check_event(event, "destroy_event");
  do_destroy_event(event);
}

void DeviceBackend::record_event(EventHandle event, StreamHandle stream) {
  check_event(event, "record_event");
  do_record_event(event, stream);
}

bool DeviceBackend::record_pending(EventHandle event, StreamHandle stream) {
  check_event(event, "record_pending");
  return do_record_pending(event, stream);
}

bool DeviceBackend::query_event(EventHandle event) {
  check_event(event, "query_event");
  return do_query_event(event);
}

void DeviceBackend::synchronize_event(EventHandle event) {
  check_event(event, "synchronize_event");
  waits::before_blocking();
  do_synchronize_event(event);
}

EventHandle DeviceBackend::create_shareable_event(int device) {
  check_device(device, "create_shareable_event");
  return do_create_shareable_event(device);
}

SharedEvent DeviceBackend::export_event(EventHandle event) {
  check_event(event, "export_event");
  return do_export_event(event);
}

EventHandle DeviceBackend::import_event(int device, const SharedEvent& shared) {
  check_device(device, "import_event");
  return do_import_event(device, shared);
}

void DeviceBackend::stream_wait_event(StreamHandle stream, EventHandle event, int device) {
  check_event(event, "stream_wait_event");
  check_device(device, "stream_wait_event");
  do_stream_wait_event(stream, event, device);
}

double DeviceBackend::elapsed_seconds(EventHandle start, EventHandle end) {
  check_event(start, "elapsed_seconds (start)");
  check_event(end, "elapsed_seconds (end)");
  return do_elapsed_seconds(start, end);
}

}  // namespace salus
