// The memory manager: Salus owns the process's GPU memory.
//
// Physical memory is held in pages of the device granularity; every stream gets virtual ranges
// (one per size class, and more when those run out of room), and blocks are carved from them
// best-fit. A block's pages need not be physically contiguous,
// and a page can be remapped without its address changing. Freed blocks are cached (still mapped)
// and reused in stream order; pages are unmapped only under pressure or by trim().
//
// Frees are stream-ordered, as in PyTorch's caching allocator: a block may be freed on the host
// while work that uses it is still queued. No page is unmapped, moved, released or handed to
// another stream before the work enqueued ahead of its free (on the block's stream, on streams
// named by record_stream_use, and on the job's streams from add_job_stream) has finished. A new
// user waits for that work on the GPU, not on the host; see DeviceMemoryStats::deferred_unmaps.
//
// Every allocation belongs to a job and a lifetime class; accounting and budgets are per job and
// class, and per device.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "salus/device.hpp"
#include "salus/export.hpp"
#include "salus/job_id.hpp"
#include "salus/stats_fields.h"

namespace salus {

namespace memory {
class SafePoints;
class Curves;
}  // namespace memory

// Persistent: lives across iterations (weights, optimizer state). Ephemeral: one iteration
// (activations, workspaces).
enum class Lifetime : std::uint8_t { persistent = 0, ephemeral = 1 };
inline constexpr std::size_t kLifetimeCount = 2;
[[nodiscard]] SALUS_API const char* to_string(Lifetime lifetime) noexcept;

inline constexpr std::size_t kUnlimited = std::numeric_limits<std::size_t>::max();

struct JobMemoryLimits {
  std::size_t total = kUnlimited;  // all devices, both classes
  std::size_t persistent = kUnlimited;
  std::size_t ephemeral = kUnlimited;
};

struct AllocationRequest {
  std::size_t bytes = 0;
  int device = 0;
  StreamHandle stream{};  // the stream that will use the block first
  JobId job = kUnattributedJob;
  Lifetime lifetime = Lifetime::persistent;
  // The host reads and writes the block as soon as it has it (a CPU consumer, such as PyTorch's
  // CPU tensors over a simulated GPU), outside any stream's order: it is handed out only once no
  // work queued on `stream` or behind the block's pages may still touch it.
  bool host_access = false;
};

// Where a page lives, seen from the device whose address range maps it.
enum class Tier : std::uint8_t { local = 0, peer = 1, host = 2 };
inline constexpr std::size_t kTierCount = 3;
[[nodiscard]] SALUS_API const char* to_string(Tier tier) noexcept;

// What a device does when its own pages run out (after reclaiming its cached free pages).
enum class SpillPolicy : std::uint8_t {
  none,            // the allocation fails with OutOfMemory
  host_only,       // pages of idle jobs, then new pages, go to host memory
  peer_then_host,  // ... to idle memory of peers, best link first, then to host memory
};
[[nodiscard]] SALUS_API const char* to_string(SpillPolicy policy) noexcept;

// Memory harvesting: devices lend idle pages to peers; pages move between tiers only at safe
// points, which the runtime marks: a job's pages may move while it waits in begin_iteration for
// its turn, never while it runs. A job is active from registration, so under a MemoryManager
// alone no job's pages move between tiers (new allocations may still take pages from lenders).
struct HarvestOptions {
  SpillPolicy spill = SpillPolicy::none;
  // Bytes each device keeps for itself and never lends; unset = 1/8 of its limit.
  std::optional<std::size_t> lend_reserve_bytes;
  // Host memory Salus may hold for spilled pages.
  std::size_t host_limit_bytes = kUnlimited;
  // Pages moved per round; a round holds the lock of the stream heap it moves pages of.
  std::size_t move_batch_pages = 32;
  // How long an allocation waits for running jobs that borrowed this device's pages to reach a
  // safe point before it fails with OutOfMemory.
  std::chrono::milliseconds recall_wait{2000};
};

// Who keeps allocations out of a CUDA graph capture. Salus serves none while the allocation's
// stream captures: memory handed to a capture would have to stay the graph's for as long as the
// graph lives, and the fences Salus keeps would query the capturing stream, which invalidates
// the capture.
enum class CaptureGuard : std::uint8_t {
  // Salus asks the driver whether the allocation's stream is capturing: one cuStreamIsCapturing
  // per allocation on CUDA (none on a default stream, nor on the simulated backend).
  salus_asks,
  // The framework refuses captures before they begin, so Salus asks nothing: no driver call.
  // salus::torch::enable_cuda sets it, since PyTorch tells its allocator of every capture before
  // it begins (CUDAAllocator::beginAllocateToPool), and Salus's allocator refuses there.
  framework_refuses,
};
[[nodiscard]] SALUS_API const char* to_string(CaptureGuard guard) noexcept;

struct MemoryOptions {
  // Physical bytes Salus may hold on each device; 0 = the device's total memory minus
  // `device_headroom_bytes`. A device with no entry uses 0.
  std::vector<std::size_t> device_limits;
  std::size_t device_headroom_bytes = 0;
  // Virtual address space first reserved per stream for large blocks, as a multiple of the
  // device's limit (VA is cheap). A stream whose ranges run out of room reserves another, so
  // address space never decides whether an allocation fits.
  std::size_t va_factor = 4;
  HarvestOptions harvest;
  CaptureGuard capture_guard = CaptureGuard::salus_asks;
};

// Live bytes of one class: SALUS_CLASS_BYTES_FIELDS (salus/stats_fields.h).
struct ClassBytes {
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
};

// One job's memory: the fields of SALUS_JOB_MEMORY_STATS_FIELDS (salus/stats_fields.h, where each
// is described), and the members no scalar holds, written here. Add a scalar there, not here: C
// and Python follow.
struct JobMemoryStats {
  JobId job;
  std::string name;
  bool alive = true;
  ClassBytes by_class[kLifetimeCount];
  std::vector<std::size_t> in_use_by_device;  // both classes
  // Live block bytes by the tier of the pages under them (a page shared by several blocks counts
  // for each, by their overlap with it).
  std::size_t in_use_by_tier[kTierCount] = {};
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
};

// One device's memory: the fields of SALUS_DEVICE_STATS_FIELDS (salus/stats_fields.h, where each
// is described), and the live bytes by class. Add a field there, not here: C and Python follow.
struct DeviceMemoryStats {
#define SALUS_STATS_MEMBER(type, name, what) type name = 0;
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
  ClassBytes by_class[kLifetimeCount];
};

struct MemoryStats {
  std::vector<DeviceMemoryStats> devices;
  std::vector<JobMemoryStats> jobs;
  std::size_t host_spill_bytes = 0;  // host pages Salus holds for spilling (mapped or kept)
  // Host memory is a tier (the backend offers host chunks); how the driver is asked for them is
  // DeviceProperties::host_chunk_location.
  bool host_tier_available = false;
};

// Why pages moved.
enum class MoveReason : std::uint8_t { demote, recall, fetch, prefetch, remap };
[[nodiscard]] SALUS_API const char* to_string(MoveReason reason) noexcept;

// One round of page moves, as reported to a move observer.
struct MoveRecord {
  MoveReason reason = MoveReason::remap;
  int device = 0;  // whose address range the pages are mapped in
  Location from;
  Location to;
  std::size_t pages = 0;
  std::size_t bytes = 0;
  double seconds = 0.0;  // from the first copy enqueued to the last page remapped
  std::chrono::steady_clock::time_point finished;
};

// A peer a device may borrow pages from, best first (NVLink before PCIe, then the driver's rank,
// then bandwidth).
struct Lender {
  int device = 0;
  PeerLink link;
};

// A block as the allocator sees it (for diagnostics and tests).
struct BlockInfo {
  DevicePtr ptr = 0;
  std::size_t bytes = 0;      // block size (request rounded up)
  std::size_t requested = 0;  // what the caller asked for
  int device = 0;
  StreamHandle stream{};
  JobId job;
  Lifetime lifetime = Lifetime::persistent;
};

class SALUS_API MemoryManager {
 public:
  // Block sizes are multiples of this; it is also the alignment of every pointer handed out.
  static constexpr std::size_t kBlockAlignment = 512;

  explicit MemoryManager(std::shared_ptr<DeviceBackend> backend, MemoryOptions options = {});
  ~MemoryManager();
  MemoryManager(const MemoryManager&) = delete;
  MemoryManager& operator=(const MemoryManager&) = delete;

  [[nodiscard]] DeviceBackend& backend() const noexcept;
  [[nodiscard]] int device_count() const noexcept;

  // Jobs. Ids are never reused. release_job frees every block the job still holds, on every
  // device, and retires the id; its later use is UnknownJob.
  JobId register_job(std::string name, JobMemoryLimits limits = {});
  void set_job_limits(JobId job, JobMemoryLimits limits);
  void release_job(JobId job);
  // Retires the job like release_job, but its live blocks stay valid: they become unattributed
  // persistent blocks, freed by whoever holds them (a framework's tensors that outlive the job).
  void orphan_job(JobId job);
  // Moves the job's live ephemeral blocks to the persistent class (call at iteration end);
  // returns the bytes moved.
  std::size_t promote_ephemeral(JobId job);

  // Throws InvalidArgument (size 0, size beyond the device, unknown device), UnknownJob, or
  // OutOfMemory (a budget or the device cannot hold it; nothing changes).
  [[nodiscard]] DevicePtr allocate(const AllocationRequest& request);
  // Throws InvalidArgument for a pointer that is not a live block's start (unknown pointer,
  // double free). The block becomes reusable at once on its stream, and on other streams only
  // behind an event.
  void deallocate(DevicePtr ptr);
  // As above, checking the caller's view of the block (C ABI / PyTorch hook shape).
  void deallocate(DevicePtr ptr, std::size_t bytes, int device);
  // As above, checking each field of `check` that is set, under the lock that frees the block: a
  // thread of one job cannot free another's block, even one that reused an address the job had.
  struct FreeCheck {
    std::optional<std::size_t> bytes;  // the size asked for at allocation (or the block's size)
    std::optional<int> device;
    std::optional<JobId> job;
  };
  // Returns what it freed, so that a caller that accounts by class (the scheduler's memory
  // curves) needs no lookup of its own.
  struct FreedBlockInfo {
    std::size_t bytes = 0;  // block size, as charged
    int device = 0;
    JobId job;
    Lifetime lifetime = Lifetime::persistent;
  };
  FreedBlockInfo deallocate(DevicePtr ptr, const FreeCheck& check);

  // Marks that `stream` also uses the block: on free, its reuse waits for that stream's work too.
  void record_stream_use(DevicePtr ptr, StreamHandle stream);
  // The job enqueues work on `stream` of `device`, besides the streams it allocates on. Two
  // effects: its memory there is ordered against that stream from now on (frees, moves and
  // reuse wait for the work enqueued on it so far); and the stream waits, on the GPU, for the
  // work so far on every other stream where the job has blocks (a block is ready in the order of
  // the stream it was allocated on, and it may have been another job's just before). Call it each
  // time the job starts enqueuing on `stream`; the Runtime does at every iteration start.
  void add_job_stream(JobId job, int device, StreamHandle stream);
  // Call before destroying `stream` of `device` (any stream allocated on, a framework's own
  // included). The work enqueued on it so far is fenced; its cached free pages go back to the
  // device behind that fence; its live blocks stay valid and may be freed later (their reuse then
  // waits for the fence). Nothing is recorded on the stream afterwards. Once its last block is
  // freed, its address ranges serve the next new stream on the device, so streams may come and
  // go forever. A live stream of `device` with no heap here is a no-op. Stream 0 (the default
  // stream), a handle that is no live stream, and another device's stream throw InvalidArgument
  // naming the handle; nothing changes then.
  void retire_stream(int device, StreamHandle stream);

  [[nodiscard]] std::optional<BlockInfo> find(DevicePtr ptr) const;

  // Returns unused physical pages to the device. Waits on the host for stream work that may still
  // touch them (work enqueued before their blocks were freed). Returns the bytes released.
  std::size_t trim();
  std::size_t trim(int device);
  // As trim, with a hysteresis: releases the GPU pages that nothing has used since the previous
  // trim_idle, and keeps those freed since for the next call. So a framework that empties its
  // cache every step (torch.cuda.empty_cache) keeps the pages its steps use, and gives up, one
  // call later, those they stopped using; salusd asks for the rest when another process needs
  // it. Host pages are left to trim().
  std::size_t trim_idle();

  // Moves the physical pages under [ptr, ptr + bytes) of a live block to fresh chunks at `where`;
  // the address and the bytes stay. Ordered after all work submitted so far (synchronous).
  void remap(DevicePtr ptr, Location where);

  // What `device`'s jobs can hold at most: its limit, plus (with spilling) what its lenders may
  // lend beyond their reserves and the host limit. Saturates at kUnlimited.
  [[nodiscard]] std::size_t reachable_bytes(int device) const;
  // The peers `device` may borrow from, best first.
  [[nodiscard]] std::vector<Lender> lenders(int device) const;
  // Changes MemoryOptions::capture_guard (a framework's glue sets it as it takes allocations
  // over); allocations after the call follow it.
  void set_capture_guard(CaptureGuard guard);
  [[nodiscard]] CaptureGuard capture_guard() const;
  // Called after every round of page moves (from the thread that moved them).
  void set_move_observer(std::function<void(const MoveRecord&)> observer);

  [[nodiscard]] MemoryStats stats() const;
  [[nodiscard]] DeviceMemoryStats device_stats(int device) const;
  [[nodiscard]] JobMemoryStats job_stats(JobId job) const;
  void reset_peaks();

 private:
  // The runtime's safe-point controls (internal: src/memory/safe_points.hpp) are an interface the
  // Impl implements; this accessor hands it out. Not exported, and declared for ordinary lookup
  // only in that internal header.
  friend memory::SafePoints& safe_points(MemoryManager& memory) noexcept;
  friend memory::Curves& memory_curves(MemoryManager& memory) noexcept;  // memory/curves.hpp
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace salus
