// Memory through the C ABI: attributed allocation, stream-ordered frees, the framework's streams,
// statistics, and PyTorch's pluggable-allocator hooks.
#include <fmt/format.h>

#include "capi/capi.hpp"
#include "salus/memory.hpp"

using salus::capi::class_bytes;
using salus::capi::guarded;
using salus::capi::invalid;
using salus::capi::require;
using salus::capi::stream_of;

namespace {

// `lifetime` is the int the caller passed (see salus_allocate).
std::optional<salus::Lifetime> lifetime_of(int lifetime) {
  switch (lifetime) {
    case SALUS_PERSISTENT: return salus::Lifetime::persistent;
    case SALUS_EPHEMERAL: return salus::Lifetime::ephemeral;
    case SALUS_LIFETIME_AUTO: return std::nullopt;
    default: break;
  }
  throw salus::InvalidArgument(fmt::format(
      "salus_allocate: lifetime {} is not SALUS_PERSISTENT, SALUS_EPHEMERAL or SALUS_LIFETIME_AUTO",
      lifetime));
}

// An explicit job that this handle cancelled is reported as cancelled, not unknown (the
// scheduler forgets a job once it is cancelled; the handle keeps it until it leaves).
[[noreturn]] void rethrow_for_job(const salus_runtime& runtime, std::uint32_t job) {
  if (job != SALUS_JOB_AUTO) {
    std::shared_ptr<salus::Job> handle;
    {
      std::shared_lock lock(runtime.jobs_mu);
      auto it = runtime.jobs.find(job);
      if (it != runtime.jobs.end()) handle = it->second;
    }
    if (handle && handle->stats().state == salus::JobState::cancelled) {
      throw salus::JobCancelled(handle->name());
    }
  }
  throw;
}

void check_device(const salus_runtime& runtime, int device, const char* call) {
  const int n = runtime.runtime->device_count();
  if (device < 0 || device >= n) {
    throw salus::InvalidArgument(
        fmt::format("{}: device {} does not exist (the runtime has {} devices)", call, device, n));
  }
}

}  // namespace

salus_class_bytes salus::capi::class_bytes(const ClassBytes& from) {
  salus_class_bytes out{};
#define SALUS_STATS_COPY_CLASS(type, name, what) out.name = from.name;
  SALUS_CLASS_BYTES_FIELDS(SALUS_STATS_COPY_CLASS)
#undef SALUS_STATS_COPY_CLASS
  return out;
}

extern "C" {

salus_status salus_allocate(salus_runtime* runtime, size_t size, int device, void* stream,
                            uint32_t job, salus_lifetime lifetime, void** out) {
  // Read as an int before anything copies it as the enum (the lambda's use of a captured
  // `lifetime` would): an out-of-range value must not be held as one (see enum_value).
  const int lifetime_value = salus::capi::enum_value(lifetime);
  return guarded([&] {
    require(runtime, "salus_allocate: runtime");
    require(out, "salus_allocate: out");
    const auto life = lifetime_of(lifetime_value);
    try {
      const salus::DevicePtr ptr =
          runtime->runtime->allocate(size, device, stream_of(stream), salus::JobId{job}, life);
      *out = reinterpret_cast<void*>(ptr);
    } catch (const salus::UnknownJob&) {
      rethrow_for_job(*runtime, job);
    }
  });
}

salus_status salus_deallocate(salus_runtime* runtime, void* ptr, size_t size, int device) {
  return guarded([&] {
    require(runtime, "salus_deallocate: runtime");
    require(ptr, "salus_deallocate: ptr");
    runtime->runtime->deallocate(reinterpret_cast<salus::DevicePtr>(ptr), size, device);
  });
}

salus_status salus_record_stream(salus_runtime* runtime, void* ptr, void* stream) {
  return guarded([&] {
    require(runtime, "salus_record_stream: runtime");
    require(ptr, "salus_record_stream: ptr");
    runtime->runtime->record_stream(reinterpret_cast<salus::DevicePtr>(ptr), stream_of(stream));
  });
}

salus_status salus_set_current_job(salus_runtime* runtime, uint32_t job) {
  return guarded([&] {
    require(runtime, "salus_set_current_job: runtime");
    runtime->runtime->set_current_job(salus::JobId{job});
  });
}

salus_status salus_get_current_job(salus_runtime* runtime, uint32_t* job) {
  return guarded([&] {
    require(runtime, "salus_get_current_job: runtime");
    require(job, "salus_get_current_job: job");
    *job = runtime->runtime->current_job().value;
  });
}

salus_status salus_stream_bind(salus_runtime* runtime, int device, void* stream, uint32_t job) {
  return guarded([&] {
    require(runtime, "salus_stream_bind: runtime");
    if (job == SALUS_JOB_AUTO) throw salus::InvalidArgument("salus_stream_bind: job is 0 (no job)");
    try {
      runtime->runtime->bind_stream(device, stream_of(stream), salus::JobId{job});
    } catch (const salus::UnknownJob&) {
      rethrow_for_job(*runtime, job);
    }
  });
}

salus_status salus_stream_unbind(salus_runtime* runtime, int device, void* stream) {
  return guarded([&] {
    require(runtime, "salus_stream_unbind: runtime");
    runtime->runtime->unbind_stream(device, stream_of(stream));
  });
}

salus_status salus_stream_create(salus_runtime* runtime, int device, int priority,
                                 void** stream) {
  return guarded([&] {
    require(runtime, "salus_stream_create: runtime");
    require(stream, "salus_stream_create: stream");
    check_device(*runtime, device, "salus_stream_create");
    const salus::StreamHandle s = runtime->runtime->backend().create_stream(device, priority);
    *stream = reinterpret_cast<void*>(static_cast<std::uintptr_t>(s.value));
  });
}

salus_status salus_stream_retire(salus_runtime* runtime, int device, void* stream) {
  return guarded([&] {
    require(runtime, "salus_stream_retire: runtime");
    require(stream, "salus_stream_retire: stream (the default stream is never retired)");
    check_device(*runtime, device, "salus_stream_retire");
    runtime->runtime->retire_stream(device, stream_of(stream));
  });
}

salus_status salus_stream_destroy(salus_runtime* runtime, int device, void* stream) {
  return guarded([&] {
    require(runtime, "salus_stream_destroy: runtime");
    require(stream, "salus_stream_destroy: stream (the default stream is never destroyed)");
    check_device(*runtime, device, "salus_stream_destroy");
    runtime->runtime->backend().validate_stream(stream_of(stream), device);
    runtime->runtime->retire_stream(device, stream_of(stream));
    runtime->runtime->backend().destroy_stream(stream_of(stream));
  });
}

salus_status salus_trim(salus_runtime* runtime, size_t* released_bytes) {
  return guarded([&] {
    require(runtime, "salus_trim: runtime");
    const std::size_t released = runtime->runtime->memory().trim();
    if (released_bytes != nullptr) *released_bytes = released;
  });
}

salus_status salus_get_device_stats(const salus_runtime* runtime, int device,
                                    salus_device_stats* out) {
  return guarded([&] {
    require(runtime, "salus_get_device_stats: runtime");
    require(out, "salus_get_device_stats: out");
    salus::capi::require_struct_size(out->struct_size, sizeof(salus_device_stats),
                                     "salus_device_stats", "salus_get_device_stats");
    check_device(*runtime, device, "salus_get_device_stats");
    const salus::DeviceMemoryStats s = runtime->runtime->memory().device_stats(device);
    salus_device_stats d{};
    d.struct_size = sizeof(salus_device_stats);
#define SALUS_STATS_COPY(type, name, what) d.name = s.name;
    SALUS_DEVICE_STATS_FIELDS(SALUS_STATS_COPY)
    d.persistent = class_bytes(s.by_class[static_cast<std::size_t>(salus::Lifetime::persistent)]);
    d.ephemeral = class_bytes(s.by_class[static_cast<std::size_t>(salus::Lifetime::ephemeral)]);
#undef SALUS_STATS_COPY
    *out = d;
  });
}

void* salus_malloc(ssize_t size, int device, void* stream) {
  salus_runtime* runtime = salus_default_runtime();
  if (runtime == nullptr) return nullptr;
  if (size < 0) {
    invalid(fmt::format("salus_malloc: size {} is negative", size));
    return nullptr;
  }
  void* out = nullptr;
  const salus_status status = salus_allocate(runtime, static_cast<size_t>(size), device, stream,
                                             SALUS_JOB_AUTO, SALUS_LIFETIME_AUTO, &out);
  return status == SALUS_OK ? out : nullptr;
}

void salus_free(void* ptr, ssize_t size, int device, void* /*stream: blocks return to their own*/) {
  if (ptr == nullptr) return;
  salus_runtime* runtime = salus_default_runtime();
  if (runtime == nullptr) return;
  // The hook cannot report failure; the message stays in salus_last_error().
  (void)salus_deallocate(runtime, ptr, size < 0 ? 0 : static_cast<size_t>(size), device);
}

}  // extern "C"
