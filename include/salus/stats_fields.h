/* Statistics, declared once. Each list below names the fields of one statistics struct as
 * X(type, name, what it counts). The C++ struct (salus/memory.hpp), the C struct (salus/c_api.h)
 * and the Python binding's conversion are made from the list; the Python dataclass is checked
 * against it (python_bindings/tests/test_stats_fields.py), and the C++ and C layouts are checked
 * in tests/test_stats_fields.cpp. A field added here reaches C++, C and the binding at once; one
 * added to a struct by hand, or missing from the dataclass, fails those tests.
 *
 * C-compatible: types are size_t, uint64_t, int and double. */
#ifndef SALUS_STATS_FIELDS_H
#define SALUS_STATS_FIELDS_H

#include <stddef.h> /* the lists name size_t and uint64_t where they are expanded */
#include <stdint.h>

/* Live bytes of one class (persistent or ephemeral). */
#define SALUS_CLASS_BYTES_FIELDS(X)                                                   \
  X(size_t, in_use, "live block bytes (requests rounded to the block alignment)")    \
  X(size_t, peak, "the most in_use has been")                                        \
  X(size_t, blocks, "live blocks")

/* One device's memory. Besides these, each struct carries the device's live bytes by class: C++
 * `by_class[kLifetimeCount]`, C and Python `persistent` and `ephemeral` (SALUS_CLASS_BYTES_FIELDS). */
#define SALUS_DEVICE_STATS_FIELDS(X)                                                           \
  X(int, device, "the device's index")                                                        \
  X(size_t, limit, "physical bytes Salus may hold")                                           \
  X(size_t, granularity, "page size")                                                         \
  X(size_t, allocated, "live block bytes")                                                    \
  X(size_t, peak_allocated, "the most allocated has been")                                    \
  X(size_t, reserved, "physical pages held (mapped or pooled), in bytes")                     \
  X(size_t, peak_reserved, "the most reserved has been")                                      \
  X(size_t, mapped, "of reserved, bytes mapped into the virtual ranges")                      \
  X(size_t, cached, "free bytes on mapped pages, ready for reuse")                            \
  X(uint64_t, allocations, "allocations so far")                                              \
  X(uint64_t, frees, "frees so far")                                                          \
  X(uint64_t, page_maps, "pages mapped so far")                                               \
  X(uint64_t, page_unmaps, "pages unmapped so far")                                           \
  X(uint64_t, chunk_creates, "physical chunks created so far")                                \
  X(uint64_t, chunk_releases, "physical chunks released so far")                              \
  X(uint64_t, cross_stream_reuses, "blocks handed to another stream behind an event")        \
  X(uint64_t, out_of_memory, "allocations refused for want of memory")                       \
  /* Harvesting: this device's pages mapped into other devices' ranges, and pages of peers   \
   * and of the host mapped into this device's ranges. */                                     \
  X(size_t, lent, "bytes of this device's pages mapped into other devices' ranges")          \
  X(size_t, borrowed_peer, "bytes of peers' pages mapped into this device's ranges")         \
  X(size_t, borrowed_host, "bytes of host pages mapped into this device's ranges")           \
  X(uint64_t, pages_moved, "pages under this device's ranges that changed tier")             \
  X(uint64_t, bytes_moved, "bytes of those pages")                                            \
  X(double, move_seconds, "wall time of those moves, copies and remapping included")         \
  X(uint64_t, recalled_pages, "this device's pages it took back from borrowers")             \
  /* Stream-ordered safety: pages handed to a new user while work enqueued before their free \
   * might still touch them (the new user waits for that work on the GPU, and the old address \
   * keeps the page mapped until it has finished). */                                         \
  X(uint64_t, deferred_unmaps, "pages handed on behind queued work")                          \
  X(size_t, retiring, "bytes still mapped at such old addresses now")                         \
  X(uint64_t, allocation_waits, "allocations that waited on the host for such work")         \
  X(size_t, stream_heaps, "streams with address ranges here, retired ones awaiting reuse too")

/* One job's memory, all devices. Besides these, each struct carries by hand what no scalar holds:
 * C++ JobMemoryStats `job`, `name`, `alive`, `by_class[kLifetimeCount]`, `in_use_by_device` and
 * `in_use_by_tier[kTierCount]`; C salus_job_stats (whose `memory` member is made from this list)
 * `persistent`, `ephemeral` (SALUS_CLASS_BYTES_FIELDS) and `in_use_by_tier[SALUS_TIER_COUNT]`;
 * Python JobMemory `persistent`, `ephemeral`, `in_use_by_device` and `in_use_by_tier`.
 * `quiescent` is an int (0 or 1), not a bool: the C ABI's flags are ints (salus_job_stats'
 * `quiescent` was one before this list), and C has no bool without stdbool.h. */
#define SALUS_JOB_MEMORY_STATS_FIELDS(X)                                                       \
  X(size_t, in_use, "live block bytes, all devices and both classes")                          \
  X(size_t, peak, "the most in_use has been")                                                  \
  X(uint64_t, promoted_bytes, "ephemeral bytes that outlived an iteration")                    \
  /* Harvesting: the job's pages move between tiers only while it is quiescent (at a safe      \
   * point the runtime marked: waiting in begin_iteration for its turn). */                    \
  X(int, quiescent, "1 while its pages may move between tiers, else 0")                        \
  X(uint64_t, activations, "safe points left: the job became active again")                    \
  X(uint64_t, activations_after_move,                                                          \
    "of those, the ones after some of its pages had moved down a tier while it was quiescent") \
  X(uint64_t, activations_waited,                                                              \
    "of those, the ones that waited for pages: to bring them home, or for a move in flight")   \
  X(uint64_t, fetched_bytes, "bytes brought home as it became active (it waited for them)")    \
  X(uint64_t, prefetched_bytes, "bytes brought home in the background (prefetch)")

/* One job's turns, as its device's scheduler counts them. salus::JobStats holds these, then
 * SALUS_JOB_PROFILE_FIELDS, between `state` and `memory_curve`; C salus_job_stats holds both lists
 * in its `turns` member (C ABI 1.5), and Python JobStats between `state` and `memory`. */
#define SALUS_JOB_TURN_STATS_FIELDS(X)                                                     \
  X(uint64_t, iterations, "iterations ended")                                               \
  X(double, attained_seconds, "GPU time received")                                          \
  X(double, waiting_seconds, "time spent blocked waiting for turns")                        \
  X(double, max_wait_seconds, "the longest single wait for a turn")

/* What the profiler has learned of a job: the spec's hints at first, then what its iterations
 * measured. */
#define SALUS_JOB_PROFILE_FIELDS(X)                                                        \
  X(double, iteration_seconds, "GPU time of one iteration (moving average)")                \
  X(size_t, persistent_bytes, "bytes it holds between iterations")                          \
  X(size_t, ephemeral_peak_bytes, "the largest ephemeral peak of its last iterations")

#endif /* SALUS_STATS_FIELDS_H */
