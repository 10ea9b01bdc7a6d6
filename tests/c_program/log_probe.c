/* A C program whose standard output is its result, as a user's tool that prints data: it leaves a
 * block allocated when it destroys its runtime, so Salus has a warning to give ("blocks still live
 * at shutdown"), and prints "result 42". tests/abi/test_c_api_logging.cpp runs it with several
 * SALUS_LOG_LEVEL values and checks where the warning went. Exit status 0 unless a call failed. */
#include <stdio.h>

#include <salus/c_api.h>

int main(void) {
  salus_runtime* runtime = NULL;
  void* block = NULL;
  if (salus_runtime_create_sim(1, (size_t)64 << 20, &runtime) != SALUS_OK ||
      salus_allocate(runtime, 4096, 0, NULL, SALUS_JOB_AUTO, SALUS_PERSISTENT, &block) !=
          SALUS_OK) {
    fprintf(stderr, "log_probe: %s\n", salus_last_error());
    return 1;
  }
  salus_runtime_destroy(runtime); /* the block is still live: Salus warns */
  printf("result 42\n");
  return 0;
}
