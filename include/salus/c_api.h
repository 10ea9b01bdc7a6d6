/* The C ABI of Salus: the one stable door for frameworks and other languages.
 *
 * A runtime owns the GPUs' memory and streams; jobs register with it and bracket each iteration
 * with salus_job_begin_iteration / salus_job_end_iteration, and their memory is attributed to
 * them (per job and per lifetime class) however it is allocated.
 *
 * Conventions
 *  - Every call returns a salus_status; on failure the calling thread's salus_last_error() names
 *    what was wrong (and a successful call clears it). No call aborts the process, and a failed
 *    call changes nothing.
 *  - Structs that cross the ABI start with `struct_size`: set it to sizeof the struct (the
 *    *_init functions do), so the struct can grow in later versions without breaking callers.
 *  - Jobs are named by id (uint32_t). Ids are never reused; 0 names no job.
 *  - Streams are native handles: a CUstream on the CUDA backend (the same value the driver and
 *    PyTorch use); on the simulated backend an opaque handle from salus_stream_create or
 *    salus_job_begin_iteration. NULL is the device's default stream. A handle that is no stream
 *    of the runtime's backend is refused with SALUS_ERROR_INVALID_ARGUMENT (on CUDA the driver is
 *    asked; a dangling CUstream is the caller's bug, as it is for the driver itself).
 *
 * Thread safety: every call may be made from any thread. salus_job_begin_iteration blocks until
 * the device's policy admits the job; salus_job_cancel may be called from another thread to wake
 * it (salus_job_try_begin_iteration waits at most a given time, for callers that must stay
 * responsive).
 *
 * fork(): a runtime belongs to the process that made it. In a forked child every call on a
 * runtime made before fork() (and its jobs) returns SALUS_ERROR_NOT_SUPPORTED, and destroying it
 * there frees nothing (the parent's stream threads and GPU context are not in the child). A
 * runtime made in the child works; the default runtime in a child is a new one, made on first
 * use. */
#ifndef SALUS_C_API_H
#define SALUS_C_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "salus/export.hpp"
#include "salus/stats_fields.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Every enum ends with a *_FORCE_INT value: it makes the enum int-sized and any int a valid value
 * of it, so that a value the caller got wrong is checked and refused, never undefined. */

/* ---- Version, status and errors ------------------------------------------------------------- */

#define SALUS_C_API_VERSION_MAJOR 1
/* 1: salus_device_stats carries every field. 2: salus_job_stats too (appended to 1.1's, whose
 * struct_size is still accepted). 3: salus_runtime_connect. 4: salus_runtime_options'
 * allocation_wait_ms (appended; 1.3's struct_size is still accepted). 5: salus_job_stats' `turns`
 * (appended; 1.1's and 1.4's struct_size are still accepted). */
#define SALUS_C_API_VERSION_MINOR 5

typedef enum salus_status {
  SALUS_OK = 0,
  SALUS_ERROR_INVALID_ARGUMENT = 1, /* NULL, bad size, unknown device or stream, wrong state... */
  SALUS_ERROR_OUT_OF_MEMORY = 2,    /* a budget or the device cannot meet the request now */
  SALUS_ERROR_DEVICE = 3,           /* a driver (or simulator) call failed */
  SALUS_ERROR_NOT_SUPPORTED = 4,    /* not in this build or on this backend (e.g. no GPU) */
  SALUS_ERROR_UNKNOWN_JOB = 5,      /* never added, or it left */
  SALUS_ERROR_INTERNAL = 6,
  SALUS_ERROR_CANCELLED = 7, /* the job was cancelled */
  SALUS_STATUS_FORCE_INT = 0x7fffffff
} salus_status;

/* (major << 16) | minor of the C ABI the library implements. */
SALUS_API uint32_t salus_c_api_version(void);
/* The library's version, e.g. "0.1.0". */
SALUS_API const char* salus_version_string(void);
/* The message of the calling thread's last failed call ("" after a successful one). */
SALUS_API const char* salus_last_error(void);
/* "SALUS_OK", "SALUS_ERROR_OUT_OF_MEMORY", ... */
SALUS_API const char* salus_status_name(salus_status status);

/* ---- Logging --------------------------------------------------------------------------------- */

/* Salus writes its messages (memory still live at shutdown, a driver call that failed...) to
 * standard error, never to standard output, or to the callback installed below. The level starts
 * from the environment variable SALUS_LOG_LEVEL (trace, debug, info, warn, error, critical or
 * off; any case), else SALUS_LOG_WARN: a library speaks only when something needs its user's
 * attention. An unknown SALUS_LOG_LEVEL is reported on standard error and the default applies.
 * Salus never touches spdlog's default logger, which belongs to the program. */
typedef enum salus_log_level {
  SALUS_LOG_TRACE = 0,
  SALUS_LOG_DEBUG = 1,
  SALUS_LOG_INFO = 2,
  SALUS_LOG_WARN = 3,
  SALUS_LOG_ERROR = 4,
  SALUS_LOG_CRITICAL = 5,
  SALUS_LOG_OFF = 6, /* as a level to set: nothing is logged */
  SALUS_LOG_LEVEL_FORCE_INT = 0x7fffffff
} salus_log_level;

/* Messages below `level` are dropped. Overrides SALUS_LOG_LEVEL. */
SALUS_API salus_status salus_set_log_level(salus_log_level level);
SALUS_API salus_status salus_get_log_level(salus_log_level* out);

/* Receives each message that passes the level, instead of standard error: its level, its text
 * (NUL-terminated, valid during the call; no time stamp or "salus" prefix) and `user_data`. It is
 * called on the thread that logs, which may hold Salus's internal locks or be a stream's worker
 * thread: it must return quickly and must not call any salus_* function. One message at a time
 * reaches it. */
typedef void (*salus_log_callback)(salus_log_level level, const char* message, void* user_data);
/* Installs `callback` (NULL: standard error again). When it returns, the previous callback is
 * not running and is never called again. */
SALUS_API salus_status salus_set_log_callback(salus_log_callback callback, void* user_data);

/* ---- Runtimes --------------------------------------------------------------------------------- */

typedef struct salus_runtime salus_runtime;

typedef enum salus_backend_kind {
  SALUS_BACKEND_AUTO = 0, /* CUDA where a GPU is present, else the simulated backend */
  SALUS_BACKEND_CUDA = 1,
  SALUS_BACKEND_SIM = 2,
  SALUS_BACKEND_FORCE_INT = 0x7fffffff
} salus_backend_kind;

/* Peer links between simulated GPUs. */
typedef enum salus_sim_topology {
  SALUS_SIM_NO_LINKS = 0,    /* no peer access */
  SALUS_SIM_NVLINK_MESH = 1, /* every pair linked by NVLink */
  SALUS_SIM_TWO_ISLANDS = 2, /* two NVLink meshes of half the devices each, joined over PCIe */
  SALUS_SIM_PCIE_ONLY = 3,   /* every pair reaches the other over PCIe */
  SALUS_SIM_TOPOLOGY_FORCE_INT = 0x7fffffff
} salus_sim_topology;

/* What a device does when its own memory runs out. */
typedef enum salus_spill_policy {
  SALUS_SPILL_NONE = 0,          /* the allocation fails with SALUS_ERROR_OUT_OF_MEMORY */
  SALUS_SPILL_HOST_ONLY = 1,     /* idle jobs' pages, then new pages, go to host memory */
  SALUS_SPILL_PEER_THEN_HOST = 2, /* ... to idle memory of peers first, best link first */
  SALUS_SPILL_FORCE_INT = 0x7fffffff
} salus_spill_policy;

/* The most simulated GPUs a runtime holds (salus::kMaxSimDevices). */
#define SALUS_MAX_SIM_DEVICES 1024
/* "Not set": the library's default applies. */
#define SALUS_DEFAULT_SIZE ((size_t)-1)
#define SALUS_MAX_DEVICE_LIMITS 16

typedef struct salus_runtime_options {
  size_t struct_size;
  salus_backend_kind backend;
  /* Simulated backend (and AUTO without a GPU). */
  int sim_device_count; /* default 1, at most SALUS_MAX_SIM_DEVICES; SALUS_SIM_TWO_ISLANDS needs
                           an even count */
  size_t sim_device_memory_bytes; /* default 1 GiB */
  salus_sim_topology sim_topology;
  /* Scheduling: "fifo", "srtf", "fair" (default), "pack", "priority", "memory_aware". */
  const char* policy;
  /* Memory. device_limits[d]: bytes Salus may hold on device d, 0 = all of it. */
  size_t device_limits[SALUS_MAX_DEVICE_LIMITS];
  salus_spill_policy spill;
  size_t lend_reserve_bytes; /* each device keeps this for itself; default 1/8 of its limit */
  size_t host_limit_bytes;   /* host memory for spilled pages; default unlimited */
  /* 1.4 (grows at the end only: a caller built against 1.3 sets struct_size to its sizeof, which
   * is offsetof(salus_runtime_options, allocation_wait_ms), and gets the default). How long an
   * allocation the device refuses may wait for other jobs' iterations to free memory before it
   * fails with SALUS_ERROR_OUT_OF_MEMORY: milliseconds; 0: as long as one runs;
   * SALUS_DEFAULT_WAIT: the library's default (a minute). Other negative values are refused. */
  int64_t allocation_wait_ms;
} salus_runtime_options;
#define SALUS_DEFAULT_WAIT ((int64_t)-1)

/* Defaults: AUTO backend, one 1 GiB simulated GPU without links, policy "fair", no spilling. */
SALUS_API void salus_runtime_options_init(salus_runtime_options* options);
/* options may be NULL (the defaults). */
SALUS_API salus_status salus_runtime_create(const salus_runtime_options* options,
                                            salus_runtime** out);
/* Shorthands: `device_count` simulated GPUs of `device_memory_bytes` each, no links; the CUDA
 * backend (SALUS_ERROR_NOT_SUPPORTED without a GPU). */
SALUS_API salus_status salus_runtime_create_sim(int device_count, size_t device_memory_bytes,
                                                salus_runtime** out);
SALUS_API salus_status salus_runtime_create_cuda(salus_runtime** out);
/* 1.3. A runtime whose jobs take turns with the jobs of every process connected to the salusd at
 * `socket_path` (NULL or "": $SALUS_SOCKET, else the per-user default), and whose GPU pages come
 * from it. Every other call keeps its meaning. SALUS_ERROR_DEVICE when the daemon cannot be
 * reached or refuses, and from any later call that needs it once it is gone. */
SALUS_API salus_status salus_runtime_connect(const char* socket_path, salus_runtime** out);
/* Cancels every job still present (a thread waiting in begin_iteration wakes with
 * SALUS_ERROR_CANCELLED) and frees everything. NULL is ignored. The default runtime is not
 * destroyed this way: the call is ignored and salus_last_error says so (see
 * salus_default_runtime_shutdown). */
SALUS_API void salus_runtime_destroy(salus_runtime* runtime);
SALUS_API salus_status salus_runtime_device_count(const salus_runtime* runtime, int* out);
/* The backend's name ("cuda" or "sim"). */
SALUS_API const char* salus_runtime_backend_name(const salus_runtime* runtime);
/* Chrome trace-event JSON of iterations and page moves (Perfetto opens it). */
SALUS_API salus_status salus_runtime_write_trace(const salus_runtime* runtime, const char* path);

/* The process's one default runtime, shared with the C++ salus::Runtime::default_runtime().
 * init makes it with `options` (NULL = defaults); it fails with SALUS_ERROR_INVALID_ARGUMENT if
 * it exists already. salus_default_runtime() makes it with the defaults on first use and returns
 * NULL only if that fails (see salus_last_error). shutdown destroys it: pointers to it, jobs in it
 * and its memory are gone; the next use makes a new one. */
SALUS_API salus_status salus_default_runtime_init(const salus_runtime_options* options);
SALUS_API salus_runtime* salus_default_runtime(void);
SALUS_API void salus_default_runtime_shutdown(void);

/* ---- Jobs ------------------------------------------------------------------------------------ */

typedef enum salus_job_kind {
  SALUS_JOB_TRAINING = 0,
  SALUS_JOB_INFERENCE = 1,
  SALUS_JOB_KIND_FORCE_INT = 0x7fffffff
} salus_job_kind;

typedef struct salus_job_spec {
  size_t struct_size;
  const char* name; /* required, copied */
  salus_job_kind kind;
  int priority; /* larger is more urgent */
  int device;
  uint64_t expected_iterations; /* 0 = unknown */
  /* Starting points for the profiler (0 = unknown). */
  size_t hint_persistent_bytes;
  size_t hint_ephemeral_peak_bytes;
  double hint_iteration_seconds;
  /* Memory budgets, 0 = unlimited. */
  size_t limit_total_bytes;
  size_t limit_persistent_bytes;
  size_t limit_ephemeral_bytes;
  /* Nonzero: the job's blocks are held by a framework's objects (tensors) that may outlive it.
   * Leaving or a cancel then frees nothing they hold: the blocks stay valid, charged to nobody,
   * until salus_deallocate; no address is reused under a live tensor. */
  int blocks_outlive_job;
} salus_job_spec;

typedef enum salus_job_state {
  SALUS_JOB_IDLE = 0,
  SALUS_JOB_WAITING = 1,
  SALUS_JOB_RUNNING = 2,
  SALUS_JOB_LEFT = 3,
  SALUS_JOB_CANCELLED = 4,
  SALUS_JOB_STATE_FORCE_INT = 0x7fffffff
} salus_job_state;

/* Live bytes of one class: the fields of SALUS_CLASS_BYTES_FIELDS (salus/stats_fields.h). */
typedef struct salus_class_bytes {
#define SALUS_STATS_MEMBER(type, name, what) type name;
  SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
} salus_class_bytes;

/* One job's memory: the fields of SALUS_JOB_MEMORY_STATS_FIELDS (salus/stats_fields.h, where
 * each is described). */
typedef struct salus_job_memory_stats {
#define SALUS_STATS_MEMBER(type, name, what) type name;
  SALUS_JOB_MEMORY_STATS_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
} salus_job_memory_stats;

/* One job's turns and profile: the fields of SALUS_JOB_TURN_STATS_FIELDS, then those of
 * SALUS_JOB_PROFILE_FIELDS (salus/stats_fields.h, where each is described). */
typedef struct salus_job_turn_stats {
#define SALUS_STATS_MEMBER(type, name, what) type name;
  SALUS_JOB_TURN_STATS_FIELDS(SALUS_STATS_MEMBER)
  SALUS_JOB_PROFILE_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
} salus_job_turn_stats;

/* Tiers a page may be on, seen from the device whose range maps it: [0] that GPU, [1] a peer GPU,
 * [2] host memory (salus::Tier). */
#define SALUS_TIER_COUNT 3

/* Grows at the end only: the fields before `memory` are those of 1.0 and 1.1, where they always
 * were. A caller built against 1.0 or 1.1 sets struct_size to its sizeof, which is
 * offsetof(salus_job_stats, memory), and gets those fields; nothing past it is written. */
typedef struct salus_job_stats {
  size_t struct_size;
  uint32_t job;
  int device;
  int lane; /* -1 until admitted */
  salus_job_state state;
  uint64_t iterations;
  double attained_seconds; /* GPU time received */
  double waiting_seconds;  /* time blocked in begin_iteration */
  double max_wait_seconds;
  double iteration_seconds; /* profiled GPU time of one iteration */
  /* Live memory (all devices) by class, and peaks. */
  size_t persistent_in_use, ephemeral_in_use;
  size_t persistent_peak, ephemeral_peak;
  size_t persistent_blocks, ephemeral_blocks;
  size_t in_use, peak;
  uint64_t promoted_bytes; /* ephemeral bytes that outlived an iteration */
  /* The profiler's view: resident bytes between iterations, and one iteration's peak. */
  size_t profile_persistent_bytes, profile_ephemeral_peak_bytes;
  /* 1 while the job is at a safe point (waiting for its turn): its pages may move between tiers. */
  int quiescent;
  /* Its live bytes whose pages are on a peer GPU or in host memory right now. */
  size_t on_peer_bytes, on_host_bytes;
  /* 1.2. Its memory: every field of SALUS_JOB_MEMORY_STATS_FIELDS (in_use, peak, promoted_bytes
   * and quiescent repeat the fields above), its live bytes by class (the persistent_* and
   * ephemeral_* fields above, and any SALUS_CLASS_BYTES_FIELDS adds), and by the tier of their
   * pages (SALUS_TIER_COUNT). */
  salus_job_memory_stats memory;
  salus_class_bytes persistent, ephemeral;
  size_t in_use_by_tier[SALUS_TIER_COUNT];
  /* 1.5. Its turns and profile from their field lists (they repeat iterations..iteration_seconds
   * and profile_*_bytes above): a field added to a list reaches C here. A caller built against
   * 1.2-1.4 sets struct_size to offsetof(salus_job_stats, turns), and gets what it had. */
  salus_job_turn_stats turns;
} salus_job_stats;

/* name, kind TRAINING, priority 0, device 0, everything else 0. */
SALUS_API void salus_job_spec_init(salus_job_spec* spec);
SALUS_API salus_status salus_job_add(salus_runtime* runtime, const salus_job_spec* spec,
                                     uint32_t* job);
/* Blocks until the policy admits the job; *stream (may be NULL) receives the native stream its
 * work must go on. SALUS_ERROR_CANCELLED if the job is cancelled while waiting. */
SALUS_API salus_status salus_job_begin_iteration(salus_runtime* runtime, uint32_t job,
                                                 void** stream);
/* As salus_job_begin_iteration, but waits at most `timeout_seconds` (>= 0; 0 only asks).
 * *begun (required) is 1 when the iteration began (*stream as above), 0 when the time ran out
 * first: the job then keeps waiting in its place in the queue with no thread in the wait. Call
 * this (or salus_job_begin_iteration) again to go on waiting, or salus_job_withdraw to stop. One
 * thread at a time may wait for a job's turn (SALUS_ERROR_INVALID_ARGUMENT otherwise). */
SALUS_API salus_status salus_job_try_begin_iteration(salus_runtime* runtime, uint32_t job,
                                                     double timeout_seconds, void** stream,
                                                     int* begun);
/* Ends the wait that salus_job_try_begin_iteration left pending: the job is idle again and
 * queued nowhere. A turn the policy granted meanwhile is handed back at once, unused (no
 * iteration counts). SALUS_OK and nothing happens when the job is not waiting;
 * SALUS_ERROR_INVALID_ARGUMENT inside an iteration (end it instead) or while a thread waits in
 * begin_iteration for the job (salus_job_cancel wakes that one). */
SALUS_API salus_status salus_job_withdraw(salus_runtime* runtime, uint32_t job);
/* Lets the next job in at once; ephemeral blocks that survive are promoted to persistent. */
SALUS_API salus_status salus_job_end_iteration(salus_runtime* runtime, uint32_t job);
/* From any thread: frees everything the job holds and wakes it if it waits; its later calls
 * return SALUS_ERROR_CANCELLED (its statistics stay readable until it leaves). */
SALUS_API salus_status salus_job_cancel(salus_runtime* runtime, uint32_t job);
/* The job is done: frees everything it holds; its id is retired (later use: UNKNOWN_JOB). */
SALUS_API salus_status salus_job_leave(salus_runtime* runtime, uint32_t job);
/* out->struct_size must be set: sizeof(salus_job_stats), or 1.1's size (see salus_job_stats). */
SALUS_API salus_status salus_job_get_stats(salus_runtime* runtime, uint32_t job,
                                           salus_job_stats* out);

/* ---- Memory ---------------------------------------------------------------------------------- */

/* Persistent: lives across iterations. Ephemeral: one iteration. AUTO: ephemeral inside the
 * job's iteration, persistent outside (and for unattributed memory). */
typedef enum salus_lifetime {
  SALUS_PERSISTENT = 0,
  SALUS_EPHEMERAL = 1,
  SALUS_LIFETIME_AUTO = 2,
  SALUS_LIFETIME_FORCE_INT = 0x7fffffff
} salus_lifetime;

/* As `job`: attribute the memory automatically (see salus_allocate). */
#define SALUS_JOB_AUTO 0u

/* Allocates `size` bytes on `device`, used first on `stream`. Charged to `job` when it is not
 * SALUS_JOB_AUTO; else to the job `stream` is bound to (a job's iteration stream while its
 * iteration runs, or a stream bound with salus_stream_bind); else to the calling thread's
 * current job (salus_set_current_job, or else the job inside an iteration on this thread); else
 * unattributed. The block's frees and reuse are ordered on `stream`. */
SALUS_API salus_status salus_allocate(salus_runtime* runtime, size_t size, int device,
                                      void* stream, uint32_t job, salus_lifetime lifetime,
                                      void** out);
/* Frees a block. Its memory is reused only after the work enqueued on its stream (and on the
 * streams named by salus_record_stream) before this call has finished. `size` is the size asked
 * for at allocation or 0 when unknown; `device` must be the block's device. */
SALUS_API salus_status salus_deallocate(salus_runtime* runtime, void* ptr, size_t size,
                                        int device);
/* The block at `ptr` is also used on `stream` (PyTorch's record_stream): its free waits for
 * that stream's work too. */
SALUS_API salus_status salus_record_stream(salus_runtime* runtime, void* ptr, void* stream);
/* The calling thread's current job in this runtime (SALUS_JOB_AUTO clears it). */
SALUS_API salus_status salus_set_current_job(salus_runtime* runtime, uint32_t job);
SALUS_API salus_status salus_get_current_job(salus_runtime* runtime, uint32_t* job);
/* Allocations on a framework's `stream` of `device` are charged to `job` (until unbound or the
 * job leaves), and the job's memory is ordered against the work enqueued on it. */
SALUS_API salus_status salus_stream_bind(salus_runtime* runtime, int device, void* stream,
                                         uint32_t job);
SALUS_API salus_status salus_stream_unbind(salus_runtime* runtime, int device, void* stream);
/* Streams made outside the scheduler, as a framework makes its own: a native stream of `device`
 * that the caller owns. destroy retires the stream's memory first (its cached pages go back to
 * the device behind its queued work; blocks still live on it stay valid). */
SALUS_API salus_status salus_stream_create(salus_runtime* runtime, int device, int priority,
                                           void** stream);
SALUS_API salus_status salus_stream_destroy(salus_runtime* runtime, int device, void* stream);
/* For a stream the framework made itself and is about to destroy: retire its memory as above.
 * Retiring (or destroying) a stream also ends its binding to a job (salus_stream_bind). */
SALUS_API salus_status salus_stream_retire(salus_runtime* runtime, int device, void* stream);
/* Returns cached, unused pages to the devices; *released_bytes (may be NULL) says how many. */
SALUS_API salus_status salus_trim(salus_runtime* runtime, size_t* released_bytes);

/* One device's memory: the fields of SALUS_DEVICE_STATS_FIELDS (salus/stats_fields.h, where each
 * is described), and its live bytes by class. */
typedef struct salus_device_stats {
  size_t struct_size;
#define SALUS_STATS_MEMBER(type, name, what) type name;
  SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_MEMBER)
#undef SALUS_STATS_MEMBER
  salus_class_bytes persistent, ephemeral;
} salus_device_stats;

/* out->struct_size must be set. */
SALUS_API salus_status salus_get_device_stats(const salus_runtime* runtime, int device,
                                              salus_device_stats* out);

/* ---- PyTorch's CUDAPluggableAllocator shape -------------------------------------------------- */

/* On the default runtime, attributed as salus_allocate with SALUS_JOB_AUTO and
 * SALUS_LIFETIME_AUTO. malloc returns NULL on failure (the reason is in salus_last_error). */
SALUS_API void* salus_malloc(ssize_t size, int device, void* stream);
SALUS_API void salus_free(void* ptr, ssize_t size, int device, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* SALUS_C_API_H */
