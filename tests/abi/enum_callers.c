/* See enum_callers.h. Compiled as C: these casts of any int to an enum are well defined here. */
#include "abi/enum_callers.h"

#include <stddef.h>

salus_status allocate_with_lifetime(salus_runtime* runtime, int lifetime, void** out) {
  return salus_allocate(runtime, 4096, 0, NULL, SALUS_JOB_AUTO, (salus_lifetime)lifetime, out);
}

salus_status set_log_level_to(int level) {
  return salus_set_log_level((salus_log_level)level);
}

const char* status_name_of(int status) {
  return salus_status_name((salus_status)status);
}

salus_status add_job_of_kind(salus_runtime* runtime, int kind, uint32_t* job) {
  salus_job_spec spec;
  salus_job_spec_init(&spec);
  spec.name = "enum";
  spec.kind = (salus_job_kind)kind;
  return salus_job_add(runtime, &spec, job);
}

salus_status create_runtime_with(int backend, int topology, int spill, int as_default,
                                 salus_runtime** out) {
  salus_runtime_options o;
  salus_runtime_options_init(&o);
  o.backend = (salus_backend_kind)backend;
  o.sim_device_count = 2; /* even, so that every topology is possible */
  o.sim_device_memory_bytes = (size_t)64 << 20;
  o.sim_topology = (salus_sim_topology)topology;
  o.spill = (salus_spill_policy)spill;
  if (as_default) return salus_default_runtime_init(&o);
  return salus_runtime_create(&o, out);
}
