/* A C client of salusd, through the C ABI only (salus/c_api.h): connects, adds one job, and runs
 * iterations that allocate, fill and check an activation, logging when each ran (as
 * salus_client.cpp does, so that the tests read both alike).
 *   salus_c_client SOCKET NAME ITERATIONS LOG
 * Exit status: 0 done; 2 a byte was wrong; 3 an error (salus_last_error on stderr). */
#define _POSIX_C_SOURCE 199309L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "salus/c_api.h"

#define MIB ((size_t)1 << 20)

static FILE* g_log;

static void note(const char* what, int iteration) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  fprintf(g_log, "%.6f %s %d\n", (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9, what, iteration);
  fflush(g_log);
}

static int fail(const char* call) {
  fprintf(stderr, "salus_c_client: %s: %s\n", call, salus_last_error());
  fprintf(g_log, "0 error %s\n", salus_last_error());
  return 3;
}

int main(int argc, char** argv) {
  if (argc != 5) return 3;
  const int iterations = atoi(argv[3]);
  g_log = fopen(argv[4], "a");
  if (g_log == NULL) return 3;
  salus_runtime* rt = NULL;
  if (salus_runtime_connect(argv[1], &rt) != SALUS_OK) return fail("salus_runtime_connect");
  const int simulated = strcmp(salus_runtime_backend_name(rt), "sim") == 0;
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = argv[2];
  uint32_t job = 0;
  if (salus_job_add(rt, &spec, &job) != SALUS_OK) return fail("salus_job_add");
  for (int it = 0; it < iterations; ++it) {
    void* stream = NULL;
    if (salus_job_begin_iteration(rt, job, &stream) != SALUS_OK) return fail("begin_iteration");
    note("begin", it);
    void* act = NULL;
    if (salus_allocate(rt, 4 * MIB, 0, stream, SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &act) !=
        SALUS_OK) {
      return fail("salus_allocate");
    }
    /* Simulated GPU memory is host memory: filled and checked from here (on a GPU, only the
     * turns are checked). */
    if (simulated) memset(act, it + 1, 4 * MIB);
    struct timespec pause = {0, 10 * 1000 * 1000};
    nanosleep(&pause, NULL);
    for (size_t i = 0; simulated && i < 4 * MIB; i += 4093) {
      if (((unsigned char*)act)[i] != (unsigned char)(it + 1)) return 2;
    }
    if (salus_deallocate(rt, act, 4 * MIB, 0) != SALUS_OK) return fail("salus_deallocate");
    note("end", it);
    if (salus_job_end_iteration(rt, job) != SALUS_OK) return fail("end_iteration");
  }
  if (salus_job_leave(rt, job) != SALUS_OK) return fail("salus_job_leave");
  salus_runtime_destroy(rt);
  fprintf(g_log, "0 done\n");
  return 0;
}
