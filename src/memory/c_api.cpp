#include "salus/c_api.h"

#include <mutex>
#include <new>
#include <string>

#include "salus/cuda.hpp"
#include "salus/memory.hpp"
#include "salus/sim.hpp"

struct salus_runtime {
  std::shared_ptr<salus::DeviceBackend> backend;
  std::unique_ptr<salus::MemoryManager> memory;
};

namespace {

thread_local std::string last_error;

salus_status status_of(const salus::Error& e) {
  switch (e.code()) {
    case salus::Errc::invalid_argument: return SALUS_ERROR_INVALID_ARGUMENT;
    case salus::Errc::out_of_memory: return SALUS_ERROR_OUT_OF_MEMORY;
    case salus::Errc::device_error: return SALUS_ERROR_DEVICE;
    case salus::Errc::not_supported: return SALUS_ERROR_NOT_SUPPORTED;
    case salus::Errc::unknown_job: return SALUS_ERROR_UNKNOWN_JOB;
    case salus::Errc::cancelled: return SALUS_ERROR_CANCELLED;
  }
  return SALUS_ERROR_INTERNAL;
}

// Runs `body`, turning every exception into a status and a message: nothing crosses the ABI.
template <class F>
salus_status guarded(F&& body) {
  try {
    body();
    last_error.clear();
    return SALUS_OK;
  } catch (const salus::Error& e) {
    last_error = e.what();
    return status_of(e);
  } catch (const std::bad_alloc&) {
    last_error = "host memory exhausted";
    return SALUS_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    last_error = e.what();
    return SALUS_ERROR_INTERNAL;
  }
}

salus_status invalid(const char* message) {
  last_error = message;
  return SALUS_ERROR_INVALID_ARGUMENT;
}

std::unique_ptr<salus_runtime> make_runtime(std::shared_ptr<salus::DeviceBackend> backend) {
  auto runtime = std::make_unique<salus_runtime>();
  runtime->memory = std::make_unique<salus::MemoryManager>(backend);
  runtime->backend = std::move(backend);
  return runtime;
}

salus::SimConfig sim_config(int device_count, std::size_t bytes) {
  if (device_count <= 0) throw salus::InvalidArgument("device_count must be positive");
  return salus::SimConfig::uniform(device_count, bytes);
}

// The process's one default runtime.
struct DefaultRuntime {
  std::mutex mu;
  std::unique_ptr<salus_runtime> runtime;
};
DefaultRuntime& default_runtime() {
  static DefaultRuntime instance;
  return instance;
}

salus_status init_default(std::shared_ptr<salus::DeviceBackend> (*make)(int, std::size_t), int n,
                          std::size_t bytes) {
  DefaultRuntime& d = default_runtime();
  std::lock_guard lock(d.mu);
  if (d.runtime) return invalid("the default runtime already exists");
  return guarded([&] { d.runtime = make_runtime(make(n, bytes)); });
}

}  // namespace

extern "C" {

const char* salus_last_error(void) { return last_error.c_str(); }

const char* salus_status_name(salus_status status) {
  switch (status) {
    case SALUS_OK: return "SALUS_OK";
    case SALUS_ERROR_INVALID_ARGUMENT: return "SALUS_ERROR_INVALID_ARGUMENT";
    case SALUS_ERROR_OUT_OF_MEMORY: return "SALUS_ERROR_OUT_OF_MEMORY";
    case SALUS_ERROR_DEVICE: return "SALUS_ERROR_DEVICE";
    case SALUS_ERROR_NOT_SUPPORTED: return "SALUS_ERROR_NOT_SUPPORTED";
    case SALUS_ERROR_UNKNOWN_JOB: return "SALUS_ERROR_UNKNOWN_JOB";
    case SALUS_ERROR_INTERNAL: return "SALUS_ERROR_INTERNAL";
    case SALUS_ERROR_CANCELLED: return "SALUS_ERROR_CANCELLED";
  }
  return "SALUS_ERROR_UNKNOWN_STATUS";
}

salus_status salus_runtime_create_sim(int device_count, size_t device_memory_bytes,
                                      salus_runtime** out) {
  if (out == nullptr) return invalid("salus_runtime_create_sim: out is NULL");
  return guarded([&] {
    *out = make_runtime(salus::make_sim_backend(sim_config(device_count, device_memory_bytes)))
               .release();
  });
}

salus_status salus_runtime_create_cuda(salus_runtime** out) {
  if (out == nullptr) return invalid("salus_runtime_create_cuda: out is NULL");
  return guarded([&] { *out = make_runtime(salus::make_cuda_backend()).release(); });
}

void salus_runtime_destroy(salus_runtime* runtime) {
  // Adopts the pointer that create released to the caller.
  std::unique_ptr<salus_runtime> owned(runtime);
}

salus_status salus_runtime_device_count(const salus_runtime* runtime, int* out) {
  if (runtime == nullptr || out == nullptr) return invalid("salus_runtime_device_count: NULL argument");
  *out = runtime->memory->device_count();
  return SALUS_OK;
}

salus_status salus_job_register(salus_runtime* runtime, const char* name, size_t limit_bytes,
                                uint32_t* job) {
  if (runtime == nullptr || name == nullptr || job == nullptr) {
    return invalid("salus_job_register: NULL argument");
  }
  return guarded([&] {
    salus::JobMemoryLimits limits;
    if (limit_bytes != 0) limits.total = limit_bytes;
    *job = runtime->memory->register_job(name, limits).value;
  });
}

salus_status salus_job_release(salus_runtime* runtime, uint32_t job) {
  if (runtime == nullptr) return invalid("salus_job_release: runtime is NULL");
  return guarded([&] { runtime->memory->release_job(salus::JobId{job}); });
}

salus_status salus_job_promote_ephemeral(salus_runtime* runtime, uint32_t job,
                                         size_t* promoted_bytes) {
  if (runtime == nullptr) return invalid("salus_job_promote_ephemeral: runtime is NULL");
  return guarded([&] {
    const std::size_t bytes = runtime->memory->promote_ephemeral(salus::JobId{job});
    if (promoted_bytes) *promoted_bytes = bytes;
  });
}

salus_status salus_allocate(salus_runtime* runtime, size_t size, int device, void* stream,
                            uint32_t job, salus_lifetime lifetime, void** out) {
  if (runtime == nullptr || out == nullptr) return invalid("salus_allocate: NULL argument");
  if (lifetime != SALUS_PERSISTENT && lifetime != SALUS_EPHEMERAL) {
    return invalid("salus_allocate: lifetime must be SALUS_PERSISTENT or SALUS_EPHEMERAL");
  }
  return guarded([&] {
    salus::AllocationRequest request;
    request.bytes = size;
    request.device = device;
    request.stream = salus::StreamHandle{reinterpret_cast<std::uintptr_t>(stream)};
    request.job = salus::JobId{job};
    request.lifetime = static_cast<salus::Lifetime>(lifetime);
    *out = reinterpret_cast<void*>(runtime->memory->allocate(request));
  });
}

salus_status salus_deallocate(salus_runtime* runtime, void* ptr, size_t size, int device) {
  if (runtime == nullptr) return invalid("salus_deallocate: runtime is NULL");
  if (ptr == nullptr) return invalid("salus_deallocate: ptr is NULL");
  return guarded([&] {
    const auto p = reinterpret_cast<salus::DevicePtr>(ptr);
    if (size != 0) {
      runtime->memory->deallocate(p, size, device);
      return;
    }
    // Size 0: the caller does not know it; the device is still checked.
    const auto block = runtime->memory->find(p);
    if (block && block->device != device) {
      throw salus::InvalidArgument("salus_deallocate: pointer lives on another device");
    }
    runtime->memory->deallocate(p);
  });
}

salus_status salus_trim(salus_runtime* runtime, size_t* released_bytes) {
  if (runtime == nullptr) return invalid("salus_trim: runtime is NULL");
  return guarded([&] {
    const std::size_t released = runtime->memory->trim();
    if (released_bytes) *released_bytes = released;
  });
}

salus_status salus_get_device_stats(const salus_runtime* runtime, int device,
                                    salus_device_stats* out) {
  if (runtime == nullptr || out == nullptr) return invalid("salus_get_device_stats: NULL argument");
  return guarded([&] {
    const salus::DeviceMemoryStats s = runtime->memory->device_stats(device);
    *out = {s.limit,
            s.allocated,
            s.peak_allocated,
            s.reserved,
            s.peak_reserved,
            s.by_class[0].in_use,
            s.by_class[1].in_use,
            s.allocations,
            s.frees,
            s.out_of_memory};
  });
}

salus_status salus_default_runtime_init_sim(int device_count, size_t device_memory_bytes) {
  return init_default(
      [](int n, std::size_t bytes) { return salus::make_sim_backend(sim_config(n, bytes)); },
      device_count, device_memory_bytes);
}

salus_status salus_default_runtime_init_auto(void) {
  return init_default(
      [](int, std::size_t) { return salus::make_default_backend(salus::SimConfig::uniform(1)); }, 1,
      0);
}

salus_runtime* salus_default_runtime(void) {
  DefaultRuntime& d = default_runtime();
  std::lock_guard lock(d.mu);
  if (!d.runtime) {
    guarded([&] { d.runtime = make_runtime(salus::make_default_backend(salus::SimConfig::uniform(1))); });
  }
  return d.runtime.get();
}

void salus_default_runtime_shutdown(void) {
  DefaultRuntime& d = default_runtime();
  std::lock_guard lock(d.mu);
  d.runtime.reset();
}

void* salus_malloc(ssize_t size, int device, void* stream) {
  salus_runtime* runtime = salus_default_runtime();
  if (runtime == nullptr) return nullptr;
  if (size < 0) {
    invalid("salus_malloc: negative size");
    return nullptr;
  }
  void* out = nullptr;
  const salus_status status = salus_allocate(runtime, static_cast<size_t>(size), device, stream,
                                             SALUS_UNATTRIBUTED_JOB, SALUS_PERSISTENT, &out);
  return status == SALUS_OK ? out : nullptr;
}

void salus_free(void* ptr, ssize_t size, int device, void* /*stream: blocks return to their own*/) {
  salus_runtime* runtime = salus_default_runtime();
  if (runtime == nullptr || ptr == nullptr) return;
  // The hook cannot report failure; the message stays in salus_last_error().
  salus_deallocate(runtime, ptr, size < 0 ? 0 : static_cast<size_t>(size), device);
}

}  // extern "C"
