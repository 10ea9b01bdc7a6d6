// The fake driver's semantics: enough of the real driver's rules that a backend or memory-manager
// bug (unaligned map, double map, partial unmap, access to an unmapped range, peer access where
// there is none, leaked chunks) fails here as it would on a GPU.
#include "support/fake_driver_state.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <utility>

namespace salus::test {

namespace {

std::atomic<std::uint64_t> g_generation{1};
// Like the driver's, the current context is per thread.
thread_local CUcontext t_current = nullptr;

std::uint64_t as_int(const void* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

}  // namespace

FakeDriver::State::State(FakeDriverConfig config)
    : config_(std::move(config)), generation_(g_generation.fetch_add(1)) {
  page_ = config_.host_chunks ? config_.host_granularity : ~std::size_t{0};
  for (const FakeDeviceConfig& device : config_.devices)
    page_ = std::min(page_, device.granularity);
  if (config_.devices.empty()) page_ = config_.host_granularity;
  retained_.assign(config_.devices.size(), 0);
  device_used_.assign(config_.devices.size(), 0);
  host_thread_ = std::thread([this] { host_loop(); });
}

CUresult FakeDriver::State::run(std::string_view name, std::vector<std::uint64_t> args,
                                const std::function<CUresult()>& body) {
  const std::scoped_lock lock(mutex_);
  const int device = current_device();  // when the call was made (before cuCtxSetCurrent acts)
  if (on_host_function_thread()) {
    // CUDA forbids any driver call from a host function (it may deadlock or fail).
    violations_.push_back(fmt::format("{} called from inside a host function", name));
    if (record_calls_) calls_.push_back(FakeCall{std::string(name), std::move(args),
                                                 CUDA_ERROR_NOT_PERMITTED, device});
    return CUDA_ERROR_NOT_PERMITTED;
  }
  call_ = name;
  CUresult rc = sticky_ != CUDA_SUCCESS ? sticky_ : injected(name);
  // cuDriverGetVersion is the one call that works before cuInit.
  if (rc == CUDA_SUCCESS && !initialized_ && name != "cuInit" && name != "cuDriverGetVersion") {
    rc = CUDA_ERROR_NOT_INITIALIZED;
  }
  if (rc == CUDA_SUCCESS) rc = body();
  if (record_calls_) {
    calls_.push_back(FakeCall{std::string(name), std::move(args), rc, device});
  }
  return rc;
}

CUresult FakeDriver::State::injected(std::string_view name) {
  const auto failure = std::find_if(failures_.begin(), failures_.end(), [&](const Failure& f) {
    return f.call == name || (f.sticky && f.call.empty());
  });
  if (failure == failures_.end()) return random_failure(name);
  if (failure->skip > 0) {
    --failure->skip;
    return random_failure(name);
  }
  const CUresult rc = failure->code;
  if (failure->sticky) sticky_ = rc;
  failures_.erase(failure);
  return rc;
}

CUresult FakeDriver::State::random_failure(std::string_view name) {
  if (random_.rate <= 0.0 || random_.exempt.contains(name)) return CUDA_SUCCESS;
  if (std::uniform_real_distribution<double>(0.0, 1.0)(random_.rng) >= random_.rate) {
    return CUDA_SUCCESS;
  }
  ++random_.injected[std::string(name)];
  const bool takes_resource = name == "cuMemCreate" || name == "cuMemAddressReserve" ||
                              name == "cuStreamCreateWithPriority" || name == "cuEventCreate";
  return takes_resource ? CUDA_ERROR_OUT_OF_MEMORY : CUDA_ERROR_UNKNOWN;
}

// --- helpers (called with the lock held) -----------------------------------------------------

CUcontext FakeDriver::State::context_of(int device) const {
  // An opaque value that is never dereferenced: generation and device packed into a pointer.
  return std::bit_cast<CUcontext>(
      static_cast<std::uintptr_t>((generation_ << 16) | static_cast<unsigned>(device + 1)));
}

int FakeDriver::State::current_device() const {
  const auto value = std::bit_cast<std::uintptr_t>(t_current);
  if (value == 0 || (value >> 16) != generation_) return -1;
  const int device = static_cast<int>(value & 0xffff) - 1;
  return valid_device(device) && retained_[static_cast<std::size_t>(device)] > 0 ? device : -1;
}

bool FakeDriver::State::valid_stream(CUstream stream) {
  const auto key = std::bit_cast<std::uintptr_t>(stream);
  if (stream == nullptr || streams_.contains(key)) return true;
  if (destroyed_streams_.contains(key)) {
    violations_.push_back(fmt::format("{} on stream {:#x}, which was destroyed", call_, key));
  }
  return false;
}

const FakePeerConfig& FakeDriver::State::peer(int from, int to) const {
  const auto it = peer_overrides_.find({from, to});
  return it != peer_overrides_.end() ? it->second : config_.peers;
}

CUresult FakeDriver::State::location_status(const CUmemLocation& location) const {
  switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (!valid_device(location.id)) return CUDA_ERROR_INVALID_DEVICE;
      return config_.devices[static_cast<std::size_t>(location.id)].vmm ? CUDA_SUCCESS
                                                                         : CUDA_ERROR_NOT_SUPPORTED;
    case CU_MEM_LOCATION_TYPE_HOST:
      // CUDA 12.x drivers know HOST only as a cuMemcpy/prefetch location, not for cuMemCreate.
      if (config_.driver_version < 13000) return CUDA_ERROR_INVALID_VALUE;
      return config_.host_chunks ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (config_.driver_version < 12020 || location.id < 0) return CUDA_ERROR_INVALID_VALUE;
      return config_.host_chunks ? CUDA_SUCCESS : CUDA_ERROR_NOT_SUPPORTED;
    default:
      return CUDA_ERROR_INVALID_VALUE;
  }
}

std::optional<std::size_t> FakeDriver::State::granularity_of(const CUmemLocation& location) const {
  switch (location.type) {
    case CU_MEM_LOCATION_TYPE_DEVICE:
      if (!valid_device(location.id)) return std::nullopt;
      return config_.devices[static_cast<std::size_t>(location.id)].granularity;
    case CU_MEM_LOCATION_TYPE_HOST:
    case CU_MEM_LOCATION_TYPE_HOST_NUMA:
      if (!config_.host_chunks) return std::nullopt;
      return config_.host_granularity;
    default:
      return std::nullopt;
  }
}

bool FakeDriver::State::range_reserved(CUdeviceptr ptr, std::size_t size) const {
  auto it = reservations_.upper_bound(ptr);
  if (it == reservations_.begin()) return false;
  --it;
  return ptr >= it->first && ptr + size <= it->first + it->second;
}

bool FakeDriver::State::range_mapped(CUdeviceptr ptr, std::size_t size) const {
  for (CUdeviceptr page = ptr - ptr % page_; page < ptr + size; page += page_) {
    if (!pages_.contains(page)) return false;
  }
  return true;
}

bool FakeDriver::State::range_unmapped(CUdeviceptr ptr, std::size_t size) const {
  const auto it = pages_.lower_bound(ptr);
  return it == pages_.end() || it->first >= ptr + size;
}

const FakeDriver::State::Chunk* FakeDriver::State::chunk_at(CUdeviceptr page) const {
  auto it = mappings_.upper_bound(page);
  if (it == mappings_.begin()) return nullptr;
  --it;
  if (page >= it->first + it->second.size) return nullptr;
  const auto chunk = chunks_.find(it->second.handle);
  return chunk != chunks_.end() ? &chunk->second : nullptr;
}

CUmemGenericAllocationHandle FakeDriver::State::allocation_of(
    CUmemGenericAllocationHandle handle) const {
  if (const auto alias = aliases_.find(handle); alias != aliases_.end()) return alias->second;
  const auto it = chunks_.find(handle);
  return it != chunks_.end() && !it->second.released() ? handle : 0;
}

void FakeDriver::State::free_chunk_if_done(CUmemGenericAllocationHandle handle) {
  const auto it = chunks_.find(handle);
  if (it == chunks_.end() || !it->second.released() || it->second.imports > 0 ||
      it->second.mappings > 0) {
    return;
  }
  forget_export(it->second);
  if (it->second.host) {
    host_used_ -= it->second.size;
  } else {
    device_used_[static_cast<std::size_t>(it->second.device)] -= it->second.size;
  }
  words_.erase(handle);
  chunks_.erase(it);
}

// --- devices and contexts --------------------------------------------------------------------

CUresult FakeDriver::State::init(unsigned flags) {
  return run("cuInit", {flags}, [&] {
    if (flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (config_.devices.empty()) return CUDA_ERROR_NO_DEVICE;  // a machine without a GPU
    initialized_ = true;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::device_get_count(int* count) {
  return run("cuDeviceGetCount", {}, [&] {
    if (count == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *count = device_count();
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::device_get(CUdevice* device, int ordinal) {
  return run("cuDeviceGet", {static_cast<std::uint64_t>(ordinal)}, [&] {
    if (device == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::device_get_uuid(CUuuid* uuid, CUdevice device) {
  return run("cuDeviceGetUuid", {static_cast<std::uint64_t>(device)}, [&] {
    if (uuid == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    std::array<std::uint8_t, 16> bytes = config_.devices[static_cast<std::size_t>(device)].uuid;
    if (bytes == std::array<std::uint8_t, 16>{}) {
      bytes = {'F', 'A', 'K', 'E', 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
               static_cast<std::uint8_t>(device)};
    }
    std::memcpy(uuid->bytes, bytes.data(), bytes.size());
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::device_get_name(char* name, int len, CUdevice device) {
  return run("cuDeviceGetName",
             {static_cast<std::uint64_t>(len), static_cast<std::uint64_t>(device)}, [&] {
               if (name == nullptr || len <= 0) return CUDA_ERROR_INVALID_VALUE;
               if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
               const std::string& full = config_.devices[static_cast<std::size_t>(device)].name;
               const std::size_t n = std::min(full.size(), static_cast<std::size_t>(len - 1));
               std::memcpy(name, full.data(), n);
               name[n] = '\0';
               return CUDA_SUCCESS;
             });
}

CUresult FakeDriver::State::device_total_mem(std::size_t* bytes, CUdevice device) {
  return run("cuDeviceTotalMem", {static_cast<std::uint64_t>(device)}, [&] {
    if (bytes == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = config_.devices[static_cast<std::size_t>(device)].memory_bytes;
    return CUDA_SUCCESS;
  });
}

// Like the driver's, it answers for the current context's device, and needs one.
CUresult FakeDriver::State::mem_get_info(std::size_t* free, std::size_t* total) {
  return run("cuMemGetInfo", {}, [&] {
    if (free == nullptr || total == nullptr) return CUDA_ERROR_INVALID_VALUE;
    const int device = current_device();
    if (device < 0) return CUDA_ERROR_INVALID_CONTEXT;
    const FakeDeviceConfig& d = config_.devices[static_cast<std::size_t>(device)];
    *total = d.memory_bytes;
    *free = d.memory_bytes - d.used_elsewhere - device_used_[static_cast<std::size_t>(device)];
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::device_get_p2p_attribute(int* value, CUdevice_P2PAttribute attrib,
                                                     CUdevice src, CUdevice dst) {
  return run("cuDeviceGetP2PAttribute",
             {static_cast<std::uint64_t>(attrib), static_cast<std::uint64_t>(src),
              static_cast<std::uint64_t>(dst)},
             [&] {
               if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
               if (!valid_device(src) || !valid_device(dst) || src == dst) {
                 return CUDA_ERROR_INVALID_DEVICE;
               }
               const FakePeerConfig& link = peer(src, dst);
               switch (attrib) {
                 case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED:
                   *value = link.access;
                   break;
                 case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
                   *value = link.performance_rank;
                   break;
                 case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED:
                   *value = link.access && link.native_atomics;
                   break;
                 default:
                   *value = 0;
                   break;
               }
               return CUDA_SUCCESS;
             });
}

CUresult FakeDriver::State::primary_ctx_retain(CUcontext* context, CUdevice device) {
  return run("cuDevicePrimaryCtxRetain", {static_cast<std::uint64_t>(device)}, [&] {
    if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    ++retained_[static_cast<std::size_t>(device)];
    *context = context_of(device);
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::primary_ctx_release(CUdevice device) {
  return run("cuDevicePrimaryCtxRelease", {static_cast<std::uint64_t>(device)}, [&] {
    if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
    int& count = retained_[static_cast<std::size_t>(device)];
    if (count == 0) return CUDA_ERROR_INVALID_CONTEXT;
    --count;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::ctx_get_current(CUcontext* context) {
  return run("cuCtxGetCurrent", {}, [&] {
    if (context == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *context = t_current;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::ctx_set_current(CUcontext context) {
  return run("cuCtxSetCurrent", {as_int(context)}, [&] {
    if (context != nullptr) {
      const auto value = std::bit_cast<std::uintptr_t>(context);
      const int device = static_cast<int>(value & 0xffff) - 1;
      // Restoring a foreign context (one the application made) is allowed, as with the driver;
      // one of ours must still be retained.
      if ((value >> 16) == generation_ &&
          (!valid_device(device) || retained_[static_cast<std::size_t>(device)] == 0)) {
        return CUDA_ERROR_INVALID_CONTEXT;
      }
    }
    t_current = context;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::ctx_get_stream_priority_range(int* least, int* greatest) {
  return run("cuCtxGetStreamPriorityRange", {}, [&] {
    if (current_device() < 0) return CUDA_ERROR_INVALID_CONTEXT;
    if (least != nullptr) *least = config_.least_priority;
    if (greatest != nullptr) *greatest = config_.greatest_priority;
    return CUDA_SUCCESS;
  });
}

CUresult FakeDriver::State::device_get_attribute(int* value, CUdevice_attribute attrib,
                                                 CUdevice device) {
  return run("cuDeviceGetAttribute",
             {static_cast<std::uint64_t>(attrib), static_cast<std::uint64_t>(device)}, [&] {
               if (value == nullptr) return CUDA_ERROR_INVALID_VALUE;
               if (!valid_device(device)) return CUDA_ERROR_INVALID_DEVICE;
               const FakeDeviceConfig& d = config_.devices[static_cast<std::size_t>(device)];
               const int version = config_.driver_version;
               switch (attrib) {
                 case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
                   *value = d.vmm;
                   return CUDA_SUCCESS;
                 case CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED:
                   *value = d.gpu_direct_rdma_vmm;
                   return CUDA_SUCCESS;
                 case CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED:
                   *value = d.posix_fd;
                   return CUDA_SUCCESS;
                 case CU_DEVICE_ATTRIBUTE_IPC_EVENT_SUPPORTED:
                   *value = d.ipc_events;
                   return CUDA_SUCCESS;
                 case CU_DEVICE_ATTRIBUTE_HOST_NUMA_ID:
                   if (version < 12020) return CUDA_ERROR_INVALID_VALUE;
                   *value = d.host_numa_id;
                   return CUDA_SUCCESS;
                 case CU_DEVICE_ATTRIBUTE_HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
                   // Modelled as younger than the HOST_NUMA location (12.2) itself.
                   if (version < 12040) return CUDA_ERROR_INVALID_VALUE;
                   *value = config_.host_chunks && d.host_numa_vmm;
                   return CUDA_SUCCESS;
                 case CU_DEVICE_ATTRIBUTE_HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED:
                   if (version < 13000) return CUDA_ERROR_INVALID_VALUE;
                   *value = config_.host_chunks && d.host_vmm;
                   return CUDA_SUCCESS;
                 default:
                   *value = 0;  // not modelled
                   return CUDA_SUCCESS;
               }
             });
}

CUresult FakeDriver::State::driver_get_version(int* version) {
  return run("cuDriverGetVersion", {}, [&] {
    if (version == nullptr) return CUDA_ERROR_INVALID_VALUE;
    *version = config_.driver_version;
    return CUDA_SUCCESS;
  });
}

// --- steering and queries --------------------------------------------------------------------

void FakeDriver::State::fail_sticky(std::string call, CUresult code, int skip) {
  const std::scoped_lock lock(mutex_);
  failures_.push_back(Failure{std::move(call), code, skip, true});
}

void FakeDriver::State::fail_next(std::string call, CUresult code, int skip) {
  const std::scoped_lock lock(mutex_);
  failures_.push_back(Failure{std::move(call), code, skip});
}

void FakeDriver::State::fail_randomly(double rate, std::uint64_t seed,
                                      std::vector<std::string> exempt) {
  const std::scoped_lock lock(mutex_);
  random_.rate = rate;
  random_.rng.seed(seed);
  random_.exempt = std::set<std::string, std::less<>>(exempt.begin(), exempt.end());
}

std::uint64_t FakeDriver::State::random_failures() const {
  const std::scoped_lock lock(mutex_);
  std::uint64_t total = 0;
  for (const auto& [call, n] : random_.injected) total += n;
  return total;
}

std::vector<std::pair<std::string, std::uint64_t>> FakeDriver::State::random_failures_by_call()
    const {
  const std::scoped_lock lock(mutex_);
  return {random_.injected.begin(), random_.injected.end()};
}

void FakeDriver::State::record_calls(bool record) {
  const std::scoped_lock lock(mutex_);
  record_calls_ = record;
}

void FakeDriver::State::set_peer(int from, int to, FakePeerConfig link) {
  const std::scoped_lock lock(mutex_);
  peer_overrides_[{from, to}] = link;
}

void FakeDriver::State::hold_events(bool hold) {
  const std::scoped_lock lock(mutex_);
  hold_events_ = hold;
}

void FakeDriver::State::complete_events() {
  const std::scoped_lock lock(mutex_);
  for (auto& [id, item] : items_) item.held = false;
  settle();
}

std::vector<FakeCall> FakeDriver::State::calls() const {
  const std::scoped_lock lock(mutex_);
  return calls_;
}

void FakeDriver::State::clear_calls() {
  const std::scoped_lock lock(mutex_);
  calls_.clear();
}

Access FakeDriver::State::access_of(DevicePtr va, int device) const {
  const std::scoped_lock lock(mutex_);
  const auto it = pages_.find(va - va % page_);
  if (it == pages_.end() || !valid_device(device)) return Access::none;
  switch (it->second[static_cast<std::size_t>(device)]) {
    case CU_MEM_ACCESS_FLAGS_PROT_READ:
      return Access::read;
    case CU_MEM_ACCESS_FLAGS_PROT_READWRITE:
      return Access::read_write;
    default:
      return Access::none;
  }
}

std::optional<FakeDriver::MappedChunk> FakeDriver::State::mapped_chunk(DevicePtr va) const {
  const std::scoped_lock lock(mutex_);
  auto it = mappings_.upper_bound(va);
  if (it == mappings_.begin()) return std::nullopt;
  --it;
  if (va >= it->first + it->second.size) return std::nullopt;
  const Chunk& chunk = chunks_.at(it->second.handle);
  return FakeDriver::MappedChunk{it->second.handle,
                                 chunk.host ? Location::host() : Location::gpu(chunk.device)};
}

std::size_t FakeDriver::State::mapped_bytes() const {
  const std::scoped_lock lock(mutex_);
  return pages_.size() * page_;
}

std::size_t FakeDriver::State::live_chunks() const {
  const std::scoped_lock lock(mutex_);
  return static_cast<std::size_t>(std::count_if(
      chunks_.begin(), chunks_.end(),
      [](const auto& entry) { return !entry.second.released() || entry.second.imports > 0; }));
}

std::size_t FakeDriver::State::used_bytes(Location where) const {
  const std::scoped_lock lock(mutex_);
  if (where.is_host()) return host_used_;
  return valid_device(where.index) ? device_used_[static_cast<std::size_t>(where.index)] : 0;
}

std::size_t FakeDriver::State::reserved_bytes() const {
  const std::scoped_lock lock(mutex_);
  std::size_t total = 0;
  for (const auto& [base, size] : reservations_) total += size;
  return total;
}

std::size_t FakeDriver::State::live_streams() const {
  const std::scoped_lock lock(mutex_);
  return streams_.size();
}

std::size_t FakeDriver::State::live_events() const {
  const std::scoped_lock lock(mutex_);
  return events_.size();
}

int FakeDriver::State::retained_contexts(int device) const {
  const std::scoped_lock lock(mutex_);
  return valid_device(device) ? retained_[static_cast<std::size_t>(device)] : 0;
}

bool FakeDriver::State::initialized() const {
  const std::scoped_lock lock(mutex_);
  return initialized_;
}

}  // namespace salus::test
