/* The C ABI of Salus: create/destroy a runtime, register jobs, allocate and free.
 *
 * Every call returns a salus_status (or NULL for the malloc-shaped helpers); the message of the
 * calling thread's last failure is salus_last_error(). No call aborts the process.
 *
 * salus_malloc / salus_free have the shape of PyTorch's pluggable-allocator hook and act on the
 * process's default runtime, created on first use (CUDA when a GPU is present, otherwise one
 * simulated GPU) unless salus_default_runtime_init_* chose one first. */
#ifndef SALUS_C_API_H
#define SALUS_C_API_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "salus/export.hpp"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct salus_runtime salus_runtime;

typedef enum salus_status {
  SALUS_OK = 0,
  SALUS_ERROR_INVALID_ARGUMENT = 1,
  SALUS_ERROR_OUT_OF_MEMORY = 2,
  SALUS_ERROR_DEVICE = 3,
  SALUS_ERROR_NOT_SUPPORTED = 4,
  SALUS_ERROR_UNKNOWN_JOB = 5,
  SALUS_ERROR_INTERNAL = 6,
  SALUS_ERROR_CANCELLED = 7
} salus_status;

/* The last value widens the enum to int, so any int a C caller passes is a valid value to check. */
typedef enum salus_lifetime {
  SALUS_PERSISTENT = 0,
  SALUS_EPHEMERAL = 1,
  SALUS_LIFETIME_FORCE_INT = 0x7fffffff
} salus_lifetime;

/* Memory that no registered job claimed is charged to job 0. */
#define SALUS_UNATTRIBUTED_JOB 0u

typedef struct salus_device_stats {
  size_t limit, allocated, peak_allocated, reserved, peak_reserved;
  size_t persistent_in_use, ephemeral_in_use;
  uint64_t allocations, frees, out_of_memory;
} salus_device_stats;

SALUS_API const char* salus_last_error(void);
SALUS_API const char* salus_status_name(salus_status status);

/* `device_count` simulated GPUs of `device_memory_bytes` each, no peer links. */
SALUS_API salus_status salus_runtime_create_sim(int device_count, size_t device_memory_bytes,
                                                salus_runtime** out);
SALUS_API salus_status salus_runtime_create_cuda(salus_runtime** out);
/* NULL is accepted and ignored. */
SALUS_API void salus_runtime_destroy(salus_runtime* runtime);
SALUS_API salus_status salus_runtime_device_count(const salus_runtime* runtime, int* out);

SALUS_API salus_status salus_job_register(salus_runtime* runtime, const char* name,
                                          size_t limit_bytes /* 0 = unlimited */, uint32_t* job);
SALUS_API salus_status salus_job_release(salus_runtime* runtime, uint32_t job);
SALUS_API salus_status salus_job_promote_ephemeral(salus_runtime* runtime, uint32_t job,
                                                   size_t* promoted_bytes);

/* `stream` is the framework's stream (a CUstream on CUDA); NULL is the default stream. */
SALUS_API salus_status salus_allocate(salus_runtime* runtime, size_t size, int device,
                                      void* stream, uint32_t job, salus_lifetime lifetime,
                                      void** out);
/* `size` is the size asked for at allocation, or 0 when unknown (then it is not checked). */
SALUS_API salus_status salus_deallocate(salus_runtime* runtime, void* ptr, size_t size,
                                        int device);
SALUS_API salus_status salus_trim(salus_runtime* runtime, size_t* released_bytes);
SALUS_API salus_status salus_get_device_stats(const salus_runtime* runtime, int device,
                                              salus_device_stats* out);

/* The default runtime. init fails with INVALID_ARGUMENT if one already exists. */
SALUS_API salus_status salus_default_runtime_init_sim(int device_count, size_t device_memory_bytes);
SALUS_API salus_status salus_default_runtime_init_auto(void);
SALUS_API salus_runtime* salus_default_runtime(void);
SALUS_API void salus_default_runtime_shutdown(void);

/* PyTorch CUDAPluggableAllocator shape; unattributed, persistent. NULL on failure. */
SALUS_API void* salus_malloc(ssize_t size, int device, void* stream);
SALUS_API void salus_free(void* ptr, ssize_t size, int device, void* stream);

#ifdef __cplusplus
}
#endif

#endif /* SALUS_C_API_H */
