/* A C program that uses Salus through the installed header only: two training jobs take turns on
 * one simulated GPU under the "fair" policy, then a training and an inference job share one under
 * "priority". Each job runs in its own thread, allocates on the stream that begin_iteration hands
 * it, writes its memory, and the program checks the per-job statistics. Exit status 0: all good. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <salus/c_api.h>

#define MIB ((size_t)1 << 20)
#define ITERATIONS 6

static int failures = 0;

#define CHECK(cond, ...)                                      \
  do {                                                        \
    if (!(cond)) {                                            \
      fprintf(stderr, "FAILED %s:%d: ", __FILE__, __LINE__);  \
      fprintf(stderr, __VA_ARGS__);                           \
      fprintf(stderr, " [%s]\n", salus_last_error());         \
      ++failures;                                             \
    }                                                         \
  } while (0)

struct worker {
  salus_runtime* runtime;
  uint32_t job;
  size_t activation_bytes;
  pthread_mutex_t* mu;
  int* inside; /* jobs inside an iteration right now, guarded by mu */
  int overlaps;
  void* weights;
};

static void* run(void* arg) {
  struct worker* w = arg;
  /* Weights: persistent, allocated before the first iteration. */
  CHECK(salus_allocate(w->runtime, 4 * MIB, 0, NULL, w->job, SALUS_LIFETIME_AUTO, &w->weights) ==
            SALUS_OK,
        "weights of job %u", w->job);
  for (int i = 0; i < ITERATIONS; ++i) {
    void* stream = NULL;
    if (salus_job_begin_iteration(w->runtime, w->job, &stream) != SALUS_OK) {
      CHECK(0, "begin_iteration of job %u", w->job);
      return NULL;
    }
    pthread_mutex_lock(w->mu);
    if (++*w->inside > 1) ++w->overlaps;
    pthread_mutex_unlock(w->mu);
    /* Activations: ephemeral, on the job's stream, charged to the job through the stream. */
    void* act = NULL;
    if (salus_allocate(w->runtime, w->activation_bytes, 0, stream, SALUS_JOB_AUTO,
                       SALUS_LIFETIME_AUTO, &act) == SALUS_OK) {
      memset(act, (int)w->job, w->activation_bytes); /* simulated GPU memory is host memory */
      CHECK(((unsigned char*)act)[w->activation_bytes - 1] == (unsigned char)w->job, "bytes");
      CHECK(salus_deallocate(w->runtime, act, w->activation_bytes, 0) == SALUS_OK, "free");
    } else {
      CHECK(0, "activations of job %u", w->job);
    }
    pthread_mutex_lock(w->mu);
    --*w->inside;
    pthread_mutex_unlock(w->mu);
    CHECK(salus_job_end_iteration(w->runtime, w->job) == SALUS_OK, "end_iteration");
  }
  return NULL;
}

static uint32_t add_job(salus_runtime* runtime, const char* name, salus_job_kind kind,
                        int priority) {
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = name;
  spec.kind = kind;
  spec.priority = priority;
  spec.expected_iterations = ITERATIONS;
  uint32_t job = 0;
  CHECK(salus_job_add(runtime, &spec, &job) == SALUS_OK, "add %s", name);
  return job;
}

/* Runs two jobs in two threads on a one-GPU runtime with `policy`; checks their statistics. */
static void share(const char* policy, salus_job_kind second_kind, int expect_turns) {
  salus_runtime_options options;
  salus_runtime_options_init(&options);
  options.backend = SALUS_BACKEND_SIM;
  options.sim_device_memory_bytes = 128 * MIB;
  options.policy = policy;
  salus_runtime* runtime = NULL;
  if (salus_runtime_create(&options, &runtime) != SALUS_OK) {
    CHECK(0, "create a runtime with policy %s", policy);
    return;
  }
  pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  int inside = 0;
  struct worker workers[2] = {
      {runtime, add_job(runtime, "first", SALUS_JOB_TRAINING, 0), 8 * MIB, &mu, &inside, 0, NULL},
      {runtime, add_job(runtime, "second", second_kind, 5), 16 * MIB, &mu, &inside, 0, NULL}};
  pthread_t threads[2];
  for (int i = 0; i < 2; ++i) pthread_create(&threads[i], NULL, run, &workers[i]);
  for (int i = 0; i < 2; ++i) pthread_join(threads[i], NULL);

  for (int i = 0; i < 2; ++i) {
    struct worker* w = &workers[i];
    if (expect_turns) CHECK(w->overlaps == 0, "%s: iterations overlapped", policy);
    salus_job_stats s;
    memset(&s, 0, sizeof s);
    s.struct_size = sizeof s;
    CHECK(salus_job_get_stats(runtime, w->job, &s) == SALUS_OK, "stats");
    CHECK(s.iterations == ITERATIONS, "%s: job %u ran %llu iterations", policy, w->job,
          (unsigned long long)s.iterations);
    CHECK(s.persistent_in_use == 4 * MIB, "%s: persistent %zu", policy, s.persistent_in_use);
    CHECK(s.ephemeral_in_use == 0, "%s: ephemeral %zu", policy, s.ephemeral_in_use);
    CHECK(s.ephemeral_peak == w->activation_bytes, "%s: ephemeral peak %zu", policy,
          s.ephemeral_peak);
    CHECK(s.state == SALUS_JOB_IDLE, "%s: state %d", policy, (int)s.state);
    /* 1.2: the job's memory, made from SALUS_JOB_MEMORY_STATS_FIELDS, by class and by tier. */
    CHECK(s.memory.in_use == s.in_use && s.memory.peak == s.peak, "%s: memory", policy);
    CHECK(s.persistent.in_use == 4 * MIB && s.ephemeral.peak == w->activation_bytes,
          "%s: by class %zu %zu", policy, s.persistent.in_use, s.ephemeral.peak);
    CHECK(s.in_use_by_tier[0] == 4 * MIB, "%s: on its GPU %zu", policy, s.in_use_by_tier[0]);
    CHECK(salus_deallocate(runtime, w->weights, 4 * MIB, 0) == SALUS_OK, "free weights");
    CHECK(salus_job_leave(runtime, w->job) == SALUS_OK, "leave");
  }
  salus_device_stats d;
  memset(&d, 0, sizeof d);
  d.struct_size = sizeof d;
  CHECK(salus_get_device_stats(runtime, 0, &d) == SALUS_OK, "device stats");
  CHECK(d.allocated == 0, "%s: %zu bytes still allocated", policy, d.allocated);
  CHECK(d.allocations == 2 + 2 * ITERATIONS, "%s: %llu allocations", policy,
        (unsigned long long)d.allocations);
  salus_runtime_destroy(runtime);
}

int main(void) {
  printf("salus %s, C ABI %u.%u\n", salus_version_string(), salus_c_api_version() >> 16,
         salus_c_api_version() & 0xffff);
  share("fair", SALUS_JOB_TRAINING, 1);
  share("priority", SALUS_JOB_INFERENCE, 1);
  if (failures != 0) {
    fprintf(stderr, "%d checks failed\n", failures);
    return 1;
  }
  printf("two jobs under fair and two under priority: all checks passed\n");
  return 0;
}
