// SimBackend: construction, teardown, topology, introspection and the DeviceBackend calls, which
// go to SimMemory (memory) or SimStreams (streams, events). Async copies and fills (which need
// both) and simulated kernels live in sim_backend_work.cpp.
#include "cuda/sim_backend.hpp"

#include "cuda/backend_checks.hpp"
#include "cuda/sim_compute.hpp"

namespace salus::sim {

SimBackend::SimBackend(SimConfig config)
    : config_(std::move(config)),
      memory_(config_),
      streams_(static_cast<int>(config_.devices.size()), config_.priorities, birth_) {
  const auto count = config_.devices.size();
  links_.assign(count, std::vector<std::optional<SimLinkConfig>>(count));
  for (const auto& link : config_.links) {
    links_[static_cast<std::size_t>(link.a)][static_cast<std::size_t>(link.b)] = link;
    links_[static_cast<std::size_t>(link.b)][static_cast<std::size_t>(link.a)] = link;
  }
  for (std::size_t i = 0; i < count; ++i) {
    engines_.push_back(std::make_unique<ComputeEngine>(config_.contention));
  }
}

SimBackend::~SimBackend() {
  // Workers may still touch mapped memory and run on the engines, so they go first (in a forked
  // child, which has none of them, they are leaked); the reservations' and memfds' owners then
  // unmap and close everything when the members are destroyed.
  streams_.shutdown();
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

std::size_t SimBackend::do_free_memory(int device) const {
  return memory_.free_memory(device);
}

std::size_t SimBackend::do_granularity(Location where) const {
  return memory_.granularity(where);
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
  return memory_.access_of(va, device);
}

std::optional<Location> SimBackend::location_of(DevicePtr va) const {
  return memory_.location_of(va);
}

std::size_t SimBackend::chunk_bytes(Location where) const {
  if (!where.is_host()) check_device(where.index, "chunk_bytes");
  return memory_.chunk_bytes(where);
}

std::size_t SimBackend::mapped_bytes() const {
  return memory_.mapped_bytes();
}

std::size_t SimBackend::reserved_bytes() const {
  return memory_.reserved_bytes();
}

// --- memory: SimMemory's ---------------------------------------------------------------------

ChunkHandle SimBackend::do_create_chunk(Location where, std::size_t bytes) {
  check_process("this simulated GPU's memory");  // shared with the parent: not the child's to carve
  return memory_.create_chunk(where, bytes);
}

void SimBackend::do_release_chunk(ChunkHandle chunk) {
  memory_.release_chunk(chunk);
}

SharedChunk SimBackend::do_export_chunk(ChunkHandle chunk) {
  check_process("this simulated GPU's memory");
  return memory_.export_chunk(chunk);
}

ChunkHandle SimBackend::do_import_chunk(Location where, const SharedChunk& shared) {
  // A forked child imports through a SimBackend of its own (this one's locks may be held).
  check_process("this simulated GPU's memory");
  return memory_.import_chunk(where, shared);
}

DevicePtr SimBackend::do_reserve_address(std::size_t bytes, std::size_t alignment) {
  return memory_.reserve_address(bytes, alignment);
}

void SimBackend::do_free_address(DevicePtr base, std::size_t bytes) {
  memory_.free_address(base, bytes);
}

void SimBackend::do_map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
                        std::size_t chunk_offset) {
  memory_.map(va, bytes, chunk, chunk_offset);
}

void SimBackend::do_unmap(DevicePtr va, std::size_t bytes) {
  memory_.unmap(va, bytes);
}

void SimBackend::do_set_access(DevicePtr va, std::size_t bytes,
                               std::span<const AccessGrant> grants) {
  memory_.set_access(va, bytes, grants);
}

// --- streams and events: SimStreams' ---------------------------------------------------------

StreamHandle SimBackend::do_create_stream(int device, int priority) {
  return streams_.create_stream(device, priority);
}

void SimBackend::do_destroy_stream(StreamHandle stream) {
  streams_.destroy_stream(stream);
}

void SimBackend::do_synchronize_stream(StreamHandle stream) {
  streams_.stream(stream, 0)->synchronize();
}

void SimBackend::do_validate_stream(StreamHandle stream, int device) {
  streams_.validate_stream(stream, device);
}

bool SimBackend::do_query_stream(StreamHandle stream, int device) {
  return streams_.stream(stream, device)->idle();
}

bool SimBackend::do_stream_known_idle(StreamHandle stream, int device) {
  return streams_.stream(stream, device)->idle_now();
}

void SimBackend::do_launch_host_func(StreamHandle stream, std::function<void()> fn) {
  streams_.stream(stream, 0)->push([fn = std::move(fn)](std::stop_token) { fn(); });
}

EventHandle SimBackend::do_create_event(int device) {
  return streams_.create_event(device, false);
}

EventHandle SimBackend::do_create_timing_event(int device) {
  return streams_.create_event(device, true);
}

void SimBackend::do_destroy_event(EventHandle event) {
  streams_.destroy_event(event);
}

void SimBackend::do_record_event(EventHandle event, StreamHandle stream) {
  (void)streams_.record_event(event, stream);
}

bool SimBackend::do_record_pending(EventHandle event, StreamHandle stream) {
  return streams_.record_event(event, stream);
}

bool SimBackend::do_query_event(EventHandle event) {
  return streams_.query_event(event);
}

void SimBackend::do_synchronize_event(EventHandle event) {
  streams_.synchronize_event(event);
}

void SimBackend::do_stream_wait_event(StreamHandle stream, EventHandle event, int device) {
  streams_.stream_wait_event(stream, event, device);
}

EventHandle SimBackend::do_create_shareable_event(int device) {
  return streams_.create_shareable_event(device);
}

SharedEvent SimBackend::do_export_event(EventHandle event) {
  return streams_.export_event(event);
}

EventHandle SimBackend::do_import_event(int device, const SharedEvent& shared) {
  return streams_.import_event(device, shared);
}

double SimBackend::do_elapsed_seconds(EventHandle start, EventHandle end) {
  return streams_.elapsed_seconds(start, end);
}

}  // namespace salus::sim
