// SimBackend: construction, teardown, topology and introspection. Memory lives in sim_memory.cpp,
// streams and events in sim_streams.cpp.
#include "cuda/sim_backend.hpp"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>

#include "cuda/backend_checks.hpp"
#include "cuda/sim_compute.hpp"

namespace salus::sim {
namespace {

UniqueFd make_memfd(const std::string& name, std::size_t bytes) {
  UniqueFd fd{::memfd_create(name.c_str(), MFD_CLOEXEC)};
  if (fd.get() < 0) throw_errno("memfd_create", errno, name);
  // ftruncate leaves the file sparse: untouched simulated memory costs no host memory.
  if (::ftruncate(fd.get(), static_cast<off_t>(bytes)) != 0) throw_errno("ftruncate", errno, name);
  return fd;
}

}  // namespace

SimBackend::SimBackend(SimConfig config) : config_(std::move(config)) {
  const auto count = config_.devices.size();
  links_.assign(count, std::vector<std::optional<SimLinkConfig>>(count));
  for (const auto& link : config_.links) {
    links_[static_cast<std::size_t>(link.a)][static_cast<std::size_t>(link.b)] = link;
    links_[static_cast<std::size_t>(link.b)][static_cast<std::size_t>(link.a)] = link;
  }
  auto add_pool = [this](Location where, std::size_t capacity, std::size_t granularity) {
    Pool pool;
    pool.where = where;
    pool.fd = make_memfd(fmt::format("salus-sim-{}", to_string(where)), capacity);
    pool.capacity = capacity;
    pool.granularity = granularity;
    pool.free_extents.emplace(0, capacity);
    pools_.push_back(std::move(pool));
  };
  for (std::size_t i = 0; i < count; ++i) {
    add_pool(Location::gpu(static_cast<int>(i)), config_.devices[i].memory_bytes,
             config_.devices[i].granularity);
  }
  add_pool(Location::host(), config_.host_memory_bytes, config_.host_granularity);
  address_granularity_ = pools_.front().granularity;
  for (const Pool& pool : pools_) {
    address_granularity_ = std::min(address_granularity_, pool.granularity);
  }
  default_streams_.resize(count);
  stream_tasks_ = std::make_unique<std::atomic<std::uint64_t>[]>(count);
  for (std::size_t i = 0; i < count; ++i) {
    engines_.push_back(std::make_unique<ComputeEngine>(config_.contention));
  }
}

SimBackend::~SimBackend() {
  if (process::inherited(birth_)) {
    // A forked child has none of the stream threads: joining them would wait forever. The
    // streams are leaked; the child's copies of the mappings and descriptors go as usual.
    auto* leaked = new std::vector<std::shared_ptr<Stream>>();
    for (auto& [id, stream] : streams_) leaked->push_back(std::move(stream));
    for (auto& stream : default_streams_) leaked->push_back(std::move(stream));
    return;
  }
  // Workers may still touch mapped memory, so they go first; the reservations' and memfds' owners
  // then unmap and close everything when the members are destroyed.
  shutdown_streams();
}

void SimBackend::check_process(const char* what) const {
  process::check_not_inherited(birth_, what);
}

int SimBackend::do_device_count() const {
  return static_cast<int>(config_.devices.size());
}

void SimBackend::check_device(int device, const char* what) const {
  detail::check_device_index(what, device, device_count(), name());
}

DeviceProperties SimBackend::do_properties(int device) const {
  const auto& d = config_.devices[static_cast<std::size_t>(device)];
  DeviceProperties props;
  props.name = d.name;
  props.total_memory = d.memory_bytes;
  props.granularity = d.granularity;
  props.host_chunks = true;  // the simulator always has its host pool
  props.host_chunk_location = "sim";
  // The same in every process, as a GPU's is: "SIM" and the index.
  props.uuid = {'S', 'I', 'M', 0, 0, 0, 0, 0, 0, 0, 0, 0,
                static_cast<std::uint8_t>(device >> 24), static_cast<std::uint8_t>(device >> 16),
                static_cast<std::uint8_t>(device >> 8), static_cast<std::uint8_t>(device)};
  return props;
}

// A GPU location's device is in range (DeviceBackend checked it, or chunk_bytes did).
std::size_t SimBackend::pool_index(Location where) const {
  if (where.is_host()) {
    // The simulator has one host memory pool; other NUMA nodes do not exist.
    if (where.index != 0) {
      throw InvalidArgument(
          fmt::format("{}: the sim backend only has host NUMA node 0", to_string(where)));
    }
    return pools_.size() - 1;
  }
  return static_cast<std::size_t>(where.index);
}

std::size_t SimBackend::do_free_memory(int device) const {
  std::lock_guard lock(mem_mutex_);
  const Pool& pool = pools_[pool_index(Location::gpu(device))];
  return pool.capacity - pool.used;
}

std::size_t SimBackend::do_granularity(Location where) const {
  return pools_[pool_index(where)].granularity;
}

PeerLink SimBackend::do_peer_link(int from, int to) const {
  if (from == to) return {LinkKind::self, true, 0, config_.local_bandwidth_gbps};
  const auto& link = links_[static_cast<std::size_t>(from)][static_cast<std::size_t>(to)];
  if (!link) return {LinkKind::none, false, 0, 0.0};
  return {link->kind, true, link->performance_rank, link->bandwidth_gbps};
}

StreamPriorityRange SimBackend::do_stream_priority_range(int /*device*/) const {
  return config_.priorities;
}

Access SimBackend::access_of(DevicePtr va, int device) const {
  check_device(device, "access_of");
  std::lock_guard lock(mem_mutex_);
  const Page* page = page_at(va);
  return page ? page->access[static_cast<std::size_t>(device)] : Access::none;
}

std::optional<Location> SimBackend::location_of(DevicePtr va) const {
  std::lock_guard lock(mem_mutex_);
  return physical_location(va);
}

std::size_t SimBackend::chunk_bytes(Location where) const {
  if (!where.is_host()) check_device(where.index, "chunk_bytes");
  std::lock_guard lock(mem_mutex_);
  return pools_[pool_index(where)].used;
}

std::size_t SimBackend::mapped_bytes() const {
  std::lock_guard lock(mem_mutex_);
  return mapped_bytes_;
}

std::size_t SimBackend::reserved_bytes() const {
  std::lock_guard lock(mem_mutex_);
  std::size_t total = 0;
  for (const auto& [base, range] : reservations_) total += range.bytes();
  return total;
}

}  // namespace salus::sim
