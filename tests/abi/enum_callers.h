/* C ABI calls with an enum argument or field given as any int, the way a C caller may give it.
 * In C an enum converts from any int; in C++ a value outside the enumerators' range is undefined
 * even to hold (UBSan's -fsanitize=enum), so the C++ tests pass ints to these C functions and the
 * enums are made only here. */
#ifndef SALUS_TESTS_ABI_ENUM_CALLERS_H
#define SALUS_TESTS_ABI_ENUM_CALLERS_H

#include "salus/c_api.h"

#ifdef __cplusplus
extern "C" {
#endif

/* salus_allocate of 4096 bytes on device 0's default stream, unattributed. */
salus_status allocate_with_lifetime(salus_runtime* runtime, int lifetime, void** out);
salus_status set_log_level_to(int level);
const char* status_name_of(int status);
/* salus_job_add of a job named "enum" with spec.kind = kind. */
salus_status add_job_of_kind(salus_runtime* runtime, int kind, uint32_t* job);
/* salus_runtime_create (or, with `as_default`, salus_default_runtime_init) of one simulated GPU
 * of 64 MiB with these enum fields. */
salus_status create_runtime_with(int backend, int topology, int spill, int as_default,
                                 salus_runtime** out);

#ifdef __cplusplus
}
#endif

#endif /* SALUS_TESTS_ABI_ENUM_CALLERS_H */
