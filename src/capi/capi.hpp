// What the C ABI's translation units share: the runtime handle behind `salus_runtime*`, and the
// wrapper that turns every exception into a status and a thread-local message.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <cstring>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

#include "salus/c_api.h"
#include "salus/error.hpp"
#include "salus/runtime.hpp"

// A runtime as the C ABI hands it out: the C++ Runtime and the jobs added through the C ABI,
// which C names by id (the Job handles own them: leaving drops the handle).
struct salus_runtime {
  explicit salus_runtime(std::shared_ptr<salus::Runtime> rt) : runtime(std::move(rt)) {}
  ~salus_runtime();

  // The job added through this handle, or throws UnknownJob (never added here, or it left).
  [[nodiscard]] std::shared_ptr<salus::Job> job(std::uint32_t id) const;

  const std::shared_ptr<salus::Runtime> runtime;
  mutable std::shared_mutex jobs_mu;
  std::unordered_map<std::uint32_t, std::shared_ptr<salus::Job>> jobs;  // guarded by jobs_mu
};

namespace salus::capi {

// The calling thread's last error message.
void set_last_error(std::string message);
void clear_last_error();

salus_status status_of(Errc code);

// Runs `body`, turning every exception into a status and a message: nothing crosses the ABI.
template <class F>
salus_status guarded(F&& body) noexcept {
  try {
    body();
    clear_last_error();
    return SALUS_OK;
  } catch (const Error& e) {
    set_last_error(e.what());
    return status_of(e.code());
  } catch (const std::bad_alloc&) {
    set_last_error("host memory exhausted");
    return SALUS_ERROR_OUT_OF_MEMORY;
  } catch (const std::exception& e) {
    set_last_error(e.what());
    return SALUS_ERROR_INTERNAL;
  } catch (...) {
    set_last_error("unknown C++ exception");
    return SALUS_ERROR_INTERNAL;
  }
}

// Sets the message and returns SALUS_ERROR_INVALID_ARGUMENT.
salus_status invalid(std::string message);

// Throws InvalidArgument naming `what` (e.g. "salus_job_add: spec") when `ptr` is NULL.
void require(const void* ptr, const char* what);

// Throws InvalidArgument unless `given` is the size of the struct this library knows (`type`
// names it) or `earlier`, where not 0: the size it had in an earlier version, which the call
// accepts (it then fills that many bytes).
void require_struct_size(std::size_t given, std::size_t expected, const char* type,
                         const char* call, std::initializer_list<std::size_t> earlier = {});

// The C struct of a ClassBytes: the fields of SALUS_CLASS_BYTES_FIELDS.
salus_class_bytes class_bytes(const ClassBytes& from);

// The int a C caller stored in an enum field or argument. The C ABI's enums take any int (see
// c_api.h), but in C++ an enum whose enumerators are all >= 0 cannot hold a negative value:
// reading one as the enum is undefined (UBSan's -fsanitize=enum; found by fuzz_runtime_options).
// So the C ABI reads its enums' bytes as an int and compares ints. An enum argument passed by
// value is read so first thing, before a lambda or a function takes it: each copy of it as the
// enum is such a read.
template <class Enum>
int enum_value(const Enum& field) noexcept {
  static_assert(sizeof(Enum) == sizeof(int));
  int value = 0;
  std::memcpy(&value, &field, sizeof value);
  return value;
}

inline StreamHandle stream_of(const void* native) {
  return StreamHandle{reinterpret_cast<std::uintptr_t>(native)};
}

// Wraps an existing C++ runtime in a C handle (tests use it to reach a backend of their own,
// such as the fake CUDA driver). The caller owns the result (salus_runtime_destroy).
salus_runtime* wrap(std::shared_ptr<Runtime> runtime);

}  // namespace salus::capi
