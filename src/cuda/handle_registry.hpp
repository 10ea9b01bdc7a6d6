// Which device each handle the CUDA backend made belongs to (chunks, streams, events), and the
// driver's stand-ins for handles. Part of the CUDA backend (cuda_backend.hpp).
#pragma once

#include <cuda.h>

#include <bit>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "cuda/driver_api.hpp"
#include "cuda/primary_contexts.hpp"
#include "salus/device.hpp"

namespace salus::cuda {

// Handles are the driver's pointers as integers: stable, unique while live, and 0 is never a
// created stream (it is the legacy default stream).
inline CUstream to_cu(StreamHandle stream) {
  return std::bit_cast<CUstream>(stream.value);
}
inline CUevent to_cu(EventHandle event) {
  return std::bit_cast<CUevent>(event.value);
}

// The driver's stand-ins for the default stream: valid on every device, never created.
inline bool is_default_stream(StreamHandle stream) {
  return stream.value == 0 || stream.value == std::bit_cast<std::uint64_t>(CU_STREAM_LEGACY) ||
         stream.value == std::bit_cast<std::uint64_t>(CU_STREAM_PER_THREAD);
}

// Owns the backend's record of the handles it made or imported: each chunk's location, size and
// driver references, each stream's and event's device, and which events are shareable. A handle
// is listed once the driver gave it, and forgotten once the driver agreed to release it. A handle
// the driver gave that cannot be listed (bad_alloc) is given back to the driver at once.
//
// Thread-safe. Lock rule: every public method takes mu_ (and nothing else) for its lookup or
// update; driver calls (giving a handle back, asking the driver about a stream this backend did
// not make) and the contexts' own lock come only after it is released.
//
// The DriverApi and the PrimaryContexts must outlive this object.
class HandleRegistry {
 public:
  struct Chunk {
    Location where;
    std::size_t bytes = 0;
    // The driver's references behind this handle value, one cuMemRelease each: 1, plus one per
    // import that returned a handle already held (the driver does not promise a new one).
    int references = 1;
  };

  HandleRegistry(const DriverApi& api, const PrimaryContexts& contexts)
      : api_(api), contexts_(contexts) {}

  // --- chunks ---
  // The chunk behind `chunk`, or nullopt for a handle never listed or already released.
  [[nodiscard]] std::optional<Chunk> find_chunk(ChunkHandle chunk) const;
  // Lists a handle cuMemCreate or cuMemImportFromShareableHandle just gave (one more reference
  // when it is listed already); cuMemRelease's it again if even that fails (bad_alloc).
  ChunkHandle adopt_chunk(CUmemGenericAllocationHandle handle, Location where, std::size_t bytes);
  // After the driver released one reference: the chunk is forgotten with its last one.
  void drop_chunk_reference(ChunkHandle chunk);

  // --- streams ---
  // Lists a stream cuStreamCreateWithPriority just made on `device` (cuStreamDestroy's it again
  // if that fails).
  StreamHandle adopt_stream(int device, CUstream stream);
  // The device `stream` (or, for handle 0 and the legacy and per-thread default streams,
  // `fallback`) belongs to. Streams this backend did not create (a framework's) are looked up
  // through the driver (cuStreamGetCtx) every time. InvalidArgument if the driver does not know
  // it, or if its context is no device's primary context.
  [[nodiscard]] int device_of(StreamHandle stream, int fallback = 0) const;
  void forget_stream(StreamHandle stream);

  // --- events ---
  // Lists an event the driver made or opened on `device`, as shareable (exportable) or not
  // (cuEventDestroy's it again if the listing fails).
  EventHandle adopt_event(int device, CUevent event, bool shareable = false);
  // InvalidArgument for an event this backend did not list.
  [[nodiscard]] int device_of(EventHandle event) const;
  [[nodiscard]] bool shareable(EventHandle event) const;
  void forget_event(EventHandle event);

 private:
  // The device of a stream this backend did not make, as the driver tells.
  [[nodiscard]] int device_of_foreign(StreamHandle stream) const;

  const DriverApi& api_;
  const PrimaryContexts& contexts_;

  mutable std::mutex mu_;  // guards the maps below
  std::unordered_map<std::uint64_t, Chunk> chunks_;
  std::unordered_map<std::uint64_t, int> streams_;
  std::unordered_map<std::uint64_t, int> events_;
  std::unordered_set<std::uint64_t> shareable_events_;  // made by create_shareable_event
};

}  // namespace salus::cuda
