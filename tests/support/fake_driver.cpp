// FakeDriver's public face: installation, the DriverApi table of forwarding functions, queries.
#include "support/fake_driver.hpp"

#include <atomic>
#include <bit>
#include <stdexcept>
#include <utility>

#include "support/fake_driver_state.hpp"

namespace salus::test {

namespace {

std::atomic<FakeDriver*> g_current{nullptr};
std::atomic<FakeDriver::State*> g_state{nullptr};

// Every table entry forwards to the installed fake, or reports a torn-down driver.
template <class Fn>
CUresult forward(Fn&& fn) {
  FakeDriver::State* state = g_state.load();
  return state != nullptr ? std::forward<Fn>(fn)(*state) : CUDA_ERROR_DEINITIALIZED;
}

CUresult fake_cuGetErrorName(CUresult error, const char** str) {
  const char* name = fake_error_name(error);
  if (str != nullptr) *str = name;
  return name != nullptr ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

// The driver declares these with CUDAAPI (empty on Linux) and C++ types only, so plain functions
// with the same parameter lists fit the table's members.
CUresult fake_cuInit(unsigned flags) {
  return forward([&](auto& s) { return s.init(flags); });
}
CUresult fake_cuDeviceGetCount(int* count) {
  return forward([&](auto& s) { return s.device_get_count(count); });
}
CUresult fake_cuDeviceGet(CUdevice* device, int ordinal) {
  return forward([&](auto& s) { return s.device_get(device, ordinal); });
}
CUresult fake_cuDeviceGetName(char* name, int len, CUdevice device) {
  return forward([&](auto& s) { return s.device_get_name(name, len, device); });
}
CUresult fake_cuDeviceGetUuid(CUuuid* uuid, CUdevice device) {
  return forward([&](auto& s) { return s.device_get_uuid(uuid, device); });
}
CUresult fake_cuDeviceTotalMem(std::size_t* bytes, CUdevice device) {
  return forward([&](auto& s) { return s.device_total_mem(bytes, device); });
}
CUresult fake_cuMemGetInfo(std::size_t* free, std::size_t* total) {
  return forward([&](auto& s) { return s.mem_get_info(free, total); });
}
CUresult fake_cuDeviceGetP2PAttribute(int* value, CUdevice_P2PAttribute attrib, CUdevice src,
                                      CUdevice dst) {
  return forward([&](auto& s) { return s.device_get_p2p_attribute(value, attrib, src, dst); });
}
CUresult fake_cuDevicePrimaryCtxRetain(CUcontext* context, CUdevice device) {
  return forward([&](auto& s) { return s.primary_ctx_retain(context, device); });
}
CUresult fake_cuDevicePrimaryCtxRelease(CUdevice device) {
  return forward([&](auto& s) { return s.primary_ctx_release(device); });
}
CUresult fake_cuCtxGetCurrent(CUcontext* context) {
  return forward([&](auto& s) { return s.ctx_get_current(context); });
}
CUresult fake_cuCtxSetCurrent(CUcontext context) {
  return forward([&](auto& s) { return s.ctx_set_current(context); });
}
CUresult fake_cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  return forward([&](auto& s) { return s.ctx_get_stream_priority_range(least, greatest); });
}
CUresult fake_cuMemGetAllocationGranularity(std::size_t* granularity,
                                            const CUmemAllocationProp* prop,
                                            CUmemAllocationGranularity_flags option) {
  return forward(
      [&](auto& s) { return s.mem_get_allocation_granularity(granularity, prop, option); });
}
CUresult fake_cuMemCreate(CUmemGenericAllocationHandle* handle, std::size_t size,
                          const CUmemAllocationProp* prop, unsigned long long flags) {
  return forward([&](auto& s) { return s.mem_create(handle, size, prop, flags); });
}
CUresult fake_cuMemRelease(CUmemGenericAllocationHandle handle) {
  return forward([&](auto& s) { return s.mem_release(handle); });
}
CUresult fake_cuMemAddressReserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                                  CUdeviceptr addr, unsigned long long flags) {
  return forward([&](auto& s) { return s.mem_address_reserve(ptr, size, alignment, addr, flags); });
}
CUresult fake_cuMemAddressFree(CUdeviceptr ptr, std::size_t size) {
  return forward([&](auto& s) { return s.mem_address_free(ptr, size); });
}
CUresult fake_cuMemMap(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                       CUmemGenericAllocationHandle handle, unsigned long long flags) {
  return forward([&](auto& s) { return s.mem_map(ptr, size, offset, handle, flags); });
}
CUresult fake_cuMemUnmap(CUdeviceptr ptr, std::size_t size) {
  return forward([&](auto& s) { return s.mem_unmap(ptr, size); });
}
CUresult fake_cuMemSetAccess(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                             std::size_t count) {
  return forward([&](auto& s) { return s.mem_set_access(ptr, size, desc, count); });
}
CUresult fake_cuStreamCreateWithPriority(CUstream* stream, unsigned flags, int priority) {
  return forward([&](auto& s) { return s.stream_create_with_priority(stream, flags, priority); });
}
CUresult fake_cuStreamDestroy(CUstream stream) {
  return forward([&](auto& s) { return s.stream_destroy(stream); });
}
CUresult fake_cuStreamSynchronize(CUstream stream) {
  return forward([&](auto& s) { return s.stream_synchronize(stream); });
}
CUresult fake_cuStreamQuery(CUstream stream) {
  return forward([&](auto& s) { return s.stream_query(stream); });
}
CUresult fake_cuStreamGetCtx(CUstream stream, CUcontext* context) {
  return forward([&](auto& s) { return s.stream_get_ctx(stream, context); });
}
CUresult fake_cuStreamWaitEvent(CUstream stream, CUevent event, unsigned flags) {
  return forward([&](auto& s) { return s.stream_wait_event(stream, event, flags); });
}
CUresult fake_cuEventCreate(CUevent* event, unsigned flags) {
  return forward([&](auto& s) { return s.event_create(event, flags); });
}
CUresult fake_cuEventDestroy(CUevent event) {
  return forward([&](auto& s) { return s.event_destroy(event); });
}
CUresult fake_cuEventRecord(CUevent event, CUstream stream) {
  return forward([&](auto& s) { return s.event_record(event, stream); });
}
CUresult fake_cuEventQuery(CUevent event) {
  return forward([&](auto& s) { return s.event_query(event); });
}
CUresult fake_cuEventSynchronize(CUevent event) {
  return forward([&](auto& s) { return s.event_synchronize(event); });
}
CUresult fake_cuEventElapsedTime(float* milliseconds, CUevent start, CUevent end) {
  return forward([&](auto& s) { return s.event_elapsed_time(milliseconds, start, end); });
}
CUresult fake_cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent event) {
  return forward([&](auto& s) { return s.ipc_get_event_handle(handle, event); });
}
CUresult fake_cuIpcOpenEventHandle(CUevent* event, CUipcEventHandle handle) {
  return forward([&](auto& s) { return s.ipc_open_event_handle(event, handle); });
}
CUresult fake_cuLaunchHostFunc(CUstream stream, CUhostFn fn, void* user_data) {
  return forward([&](auto& s) { return s.launch_host_func(stream, fn, user_data); });
}
CUresult fake_cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream) {
  return forward([&](auto& s) { return s.memcpy_async(dst, src, bytes, stream); });
}
CUresult fake_cuMemsetD8Async(CUdeviceptr dst, unsigned char value, std::size_t bytes,
                              CUstream stream) {
  return forward([&](auto& s) { return s.memset_async(dst, value, bytes, stream); });
}
CUresult fake_cuStreamIsCapturing(CUstream stream, CUstreamCaptureStatus* status) {
  return forward([&](auto& s) { return s.stream_is_capturing(stream, status); });
}

CUresult fake_cuMemExportToShareableHandle(void* shareable, CUmemGenericAllocationHandle handle,
                                           CUmemAllocationHandleType type,
                                           unsigned long long flags) {
  return forward(
      [&](auto& s) { return s.mem_export_to_shareable_handle(shareable, handle, type, flags); });
}
CUresult fake_cuMemImportFromShareableHandle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                             CUmemAllocationHandleType type) {
  return forward(
      [&](auto& s) { return s.mem_import_from_shareable_handle(handle, os_handle, type); });
}

CUresult fake_cuDeviceGetAttribute(int* value, CUdevice_attribute attrib, CUdevice device) {
  return forward([&](auto& s) { return s.device_get_attribute(value, attrib, device); });
}
CUresult fake_cuDriverGetVersion(int* version) {
  return forward([&](auto& s) { return s.driver_get_version(version); });
}

}  // namespace

FakeDriverConfig FakeDriverConfig::uniform(int count, std::size_t memory_bytes,
                                           std::size_t granularity) {
  FakeDriverConfig config;
  FakeDeviceConfig device;
  device.memory_bytes = memory_bytes;
  device.granularity = granularity;
  config.devices.assign(static_cast<std::size_t>(count), device);
  return config;
}

FakeDriver::FakeDriver(FakeDriverConfig config)
    : state_(std::make_unique<State>(std::move(config))) {
  FakeDriver* expected = nullptr;
  if (!g_current.compare_exchange_strong(expected, this)) {
    throw std::logic_error("FakeDriver: another fake driver is installed");
  }
  g_state.store(state_.get());
}

FakeDriver::~FakeDriver() {
  g_state.store(nullptr);
  g_current.store(nullptr);
}

FakeDriver* FakeDriver::current() noexcept {
  return g_current.load();
}

cuda::DriverApi FakeDriver::api() const {
  cuda::DriverApi api;
  // Member names go through cuda.h's versioning macros exactly as in the backend.
#define SALUS_FAKE_FILL(name) api.name = &fake_##name;
  SALUS_CUDA_DRIVER_ENTRIES(SALUS_FAKE_FILL)
  SALUS_CUDA_OPTIONAL_DRIVER_ENTRIES(SALUS_FAKE_FILL)
#undef SALUS_FAKE_FILL
  return api;
}

void FakeDriver::fail_next(std::string call, CUresult code, int skip) {
  state_->fail_next(std::move(call), code, skip);
}
void FakeDriver::fail_sticky(std::string call, CUresult code, int skip) {
  state_->fail_sticky(std::move(call), code, skip);
}
void FakeDriver::fail_randomly(double rate, std::uint64_t seed, std::vector<std::string> exempt) {
  state_->fail_randomly(rate, seed, std::move(exempt));
}
std::uint64_t FakeDriver::random_failures() const {
  return state_->random_failures();
}
std::vector<std::pair<std::string, std::uint64_t>> FakeDriver::random_failures_by_call() const {
  return state_->random_failures_by_call();
}
void FakeDriver::record_calls(bool record) {
  state_->record_calls(record);
}
void FakeDriver::write_word(DevicePtr va, std::uint64_t value) {
  state_->write_word(va, value);
}
std::uint64_t FakeDriver::read_word(DevicePtr va) const {
  return state_->read_word(va);
}
void FakeDriver::set_peer(int from, int to, FakePeerConfig peer) {
  state_->set_peer(from, to, peer);
}
void FakeDriver::hold_events(bool hold) {
  state_->hold_events(hold);
}
void FakeDriver::complete_events() {
  state_->complete_events();
}
void FakeDriver::advance_clock(double milliseconds) {
  state_->advance_clock(milliseconds);
}
std::uint64_t FakeDriver::enqueue_work(CUstream stream, DevicePtr va, std::size_t bytes) {
  return state_->enqueue_work(stream, va, bytes);
}
std::uint64_t FakeDriver::enqueue_work(StreamHandle stream, DevicePtr va, std::size_t bytes) {
  // A StreamHandle of the CUDA backend is the driver's CUstream as an integer (0: legacy).
  return state_->enqueue_work(std::bit_cast<CUstream>(stream.value), va, bytes);
}
void FakeDriver::finish_work(std::uint64_t id) {
  state_->finish_work(id);
}
void FakeDriver::finish_all_work() {
  state_->finish_all_work();
}
void FakeDriver::drain_host_functions() {
  state_->drain_host_functions();
}
void FakeDriver::begin_capture(StreamHandle stream) {
  state_->begin_capture(std::bit_cast<CUstream>(stream.value));
}
bool FakeDriver::end_capture(StreamHandle stream) {
  return state_->end_capture(std::bit_cast<CUstream>(stream.value));
}
bool FakeDriver::work_finished(std::uint64_t id) const {
  return state_->work_finished(id);
}
std::size_t FakeDriver::pending_work() const {
  return state_->pending_work();
}
std::vector<std::string> FakeDriver::violations() const {
  return state_->violations();
}
void FakeDriver::clear_violations() {
  state_->clear_violations();
}

std::vector<FakeCall> FakeDriver::calls() const {
  return state_->calls();
}

std::vector<FakeCall> FakeDriver::calls(std::string_view name) const {
  std::vector<FakeCall> out;
  for (FakeCall& call : state_->calls()) {
    if (call.name == name) out.push_back(std::move(call));
  }
  return out;
}

std::vector<std::string> FakeDriver::call_names(bool with_context_calls) const {
  std::vector<std::string> out;
  for (FakeCall& call : state_->calls()) {
    if (!with_context_calls && (call.name == "cuCtxGetCurrent" || call.name == "cuCtxSetCurrent")) {
      continue;
    }
    out.push_back(std::move(call.name));
  }
  return out;
}

std::size_t FakeDriver::count(std::string_view name) const {
  return calls(name).size();
}
void FakeDriver::clear_calls() {
  state_->clear_calls();
}
Access FakeDriver::access_of(DevicePtr va, int device) const {
  return state_->access_of(va, device);
}
std::optional<FakeDriver::MappedChunk> FakeDriver::chunk_at(DevicePtr va) const {
  return state_->mapped_chunk(va);
}
std::size_t FakeDriver::mapped_bytes() const {
  return state_->mapped_bytes();
}
std::size_t FakeDriver::live_chunks() const {
  return state_->live_chunks();
}
std::size_t FakeDriver::used_bytes(Location where) const {
  return state_->used_bytes(where);
}
std::size_t FakeDriver::reserved_bytes() const {
  return state_->reserved_bytes();
}
std::size_t FakeDriver::live_streams() const {
  return state_->live_streams();
}
std::size_t FakeDriver::live_events() const {
  return state_->live_events();
}
int FakeDriver::retained_contexts(int device) const {
  return state_->retained_contexts(device);
}
bool FakeDriver::initialized() const {
  return state_->initialized();
}

const char* fake_error_name(CUresult code) noexcept {
  switch (code) {
#define SALUS_FAKE_ERROR(e) \
  case e:                   \
    return #e;
    SALUS_FAKE_ERROR(CUDA_SUCCESS)
    SALUS_FAKE_ERROR(CUDA_ERROR_INVALID_VALUE)
    SALUS_FAKE_ERROR(CUDA_ERROR_OUT_OF_MEMORY)
    SALUS_FAKE_ERROR(CUDA_ERROR_NOT_INITIALIZED)
    SALUS_FAKE_ERROR(CUDA_ERROR_DEINITIALIZED)
    SALUS_FAKE_ERROR(CUDA_ERROR_NO_DEVICE)
    SALUS_FAKE_ERROR(CUDA_ERROR_INVALID_DEVICE)
    SALUS_FAKE_ERROR(CUDA_ERROR_INVALID_CONTEXT)
    SALUS_FAKE_ERROR(CUDA_ERROR_CONTEXT_IS_DESTROYED)
    SALUS_FAKE_ERROR(CUDA_ERROR_ALREADY_MAPPED)
    SALUS_FAKE_ERROR(CUDA_ERROR_NOT_MAPPED)
    SALUS_FAKE_ERROR(CUDA_ERROR_INVALID_HANDLE)
    SALUS_FAKE_ERROR(CUDA_ERROR_NOT_FOUND)
    SALUS_FAKE_ERROR(CUDA_ERROR_NOT_READY)
    SALUS_FAKE_ERROR(CUDA_ERROR_ILLEGAL_ADDRESS)
    SALUS_FAKE_ERROR(CUDA_ERROR_LAUNCH_FAILED)
    SALUS_FAKE_ERROR(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED)
    SALUS_FAKE_ERROR(CUDA_ERROR_NOT_PERMITTED)
    SALUS_FAKE_ERROR(CUDA_ERROR_NOT_SUPPORTED)
    SALUS_FAKE_ERROR(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
    SALUS_FAKE_ERROR(CUDA_ERROR_STREAM_CAPTURE_ISOLATION)
    SALUS_FAKE_ERROR(CUDA_ERROR_UNKNOWN)
#undef SALUS_FAKE_ERROR
    default:
      return nullptr;
  }
}

}  // namespace salus::test
