// Allocates and frees on a simulated GPU through the installed headers and library, once through
// the C++ API and once through the C ABI. Exit status 0 means the install is usable.
#include <salus/c_api.h>

#include <cstdio>
#include <cstring>
#include <salus/memory.hpp>
#include <salus/sim.hpp>

int main() {
  try {
    salus::MemoryManager memory(salus::make_sim_backend(salus::SimConfig::uniform(1, salus::GiB)));
    const salus::JobId job = memory.register_job("consumer");
    const salus::DevicePtr ptr = memory.allocate({.bytes = 3 * salus::MiB, .job = job});
    std::memset(reinterpret_cast<void*>(ptr), 0x42, 3 * salus::MiB);  // sim memory is host memory
    memory.deallocate(ptr);
    memory.release_job(job);
  } catch (const salus::Error& e) {
    std::fprintf(stderr, "C++ API: %s\n", e.what());
    return 1;
  }

  salus_runtime* runtime = nullptr;
  void* block = nullptr;
  if (salus_runtime_create_sim(1, 1u << 30, &runtime) != SALUS_OK ||
      salus_allocate(runtime, 4096, 0, nullptr, SALUS_JOB_AUTO, SALUS_EPHEMERAL, &block) !=
          SALUS_OK ||
      salus_deallocate(runtime, block, 4096, 0) != SALUS_OK) {
    std::fprintf(stderr, "C ABI: %s\n", salus_last_error());
    salus_runtime_destroy(runtime);
    return 1;
  }
  salus_runtime_destroy(runtime);
  std::puts("salus install consumer: ok");
  return 0;
}
