// Internal: the simulated-GPU backend behind salus::make_sim_backend (see salus/sim.hpp).
//
// A facade over two parts, each with its own lock: SimMemory (sim_memory.hpp: physical pools,
// chunks, reservations, mappings, access, chunk sharing) and SimStreams (sim_streams.hpp: stream
// threads, events, shareable events, the shutdown). SimBackend keeps the config, the links, the
// compute engines and the fork check of memory calls, and joins the parts where one operation
// needs both: an async copy or fill asks SimMemory whether its ranges are usable (and where they
// lie, to time the copy) and only then, with SimMemory's lock released, enqueues on a stream.
// Neither part's lock is ever held while calling into the other.
//
// Tests and the layers above may downcast the DeviceBackend to SimBackend for introspection.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string_view>
#include <vector>

#include "cuda/process_fork.hpp"
#include "cuda/sim_memory.hpp"
#include "cuda/sim_status.hpp"
#include "cuda/sim_streams.hpp"
#include "salus/device.hpp"
#include "salus/sim.hpp"

namespace salus::sim {

// Throws InvalidArgument naming the first inconsistency in `config`.
void validate_config(const SimConfig& config);

class ComputeEngine;

class SimBackend final : public DeviceBackend {
 public:
  explicit SimBackend(SimConfig config);  // expects a validated config
  SimBackend(const SimBackend&) = delete;
  SimBackend& operator=(const SimBackend&) = delete;
  ~SimBackend() override;

  // Simulated compute (salus::launch_sim_kernel, salus::sim_device_activity check the arguments).
  void launch_kernel(StreamHandle stream, int device, double seconds, double occupancy);
  [[nodiscard]] SimDeviceActivity activity(int device);

  // Introspection (tests, layers above). Out-of-range devices raise InvalidArgument.
  // Access that `device` was granted to the mapped page holding `va`; none when unmapped.
  [[nodiscard]] Access access_of(DevicePtr va, int device) const;
  // Physical location of the mapped page holding `va`; nullopt when unmapped.
  [[nodiscard]] std::optional<Location> location_of(DevicePtr va) const;
  // Physical bytes held by chunks at `where`, including released chunks still mapped somewhere;
  // imported chunks are the exporter's and not counted.
  [[nodiscard]] std::size_t chunk_bytes(Location where) const;
  [[nodiscard]] std::size_t mapped_bytes() const;
  [[nodiscard]] std::size_t reserved_bytes() const;
  [[nodiscard]] const SimConfig& config() const noexcept { return config_; }

 private:
  // DeviceBackend (its public functions have checked the arguments; see salus/device.hpp).
  [[nodiscard]] std::string_view do_name() const noexcept override { return "sim"; }
  [[nodiscard]] int do_device_count() const override;
  [[nodiscard]] DeviceProperties do_properties(int device) const override;
  [[nodiscard]] std::size_t do_free_memory(int device) const override;
  [[nodiscard]] std::size_t do_granularity(Location where) const override;
  [[nodiscard]] std::size_t do_address_granularity() const noexcept override {
    return memory_.address_granularity();
  }
  [[nodiscard]] PeerLink do_peer_link(int from, int to) const override;

  ChunkHandle do_create_chunk(Location where, std::size_t bytes) override;
  void do_release_chunk(ChunkHandle chunk) override;
  SharedChunk do_export_chunk(ChunkHandle chunk) override;
  ChunkHandle do_import_chunk(Location where, const SharedChunk& shared) override;

  DevicePtr do_reserve_address(std::size_t bytes, std::size_t alignment) override;
  void do_free_address(DevicePtr base, std::size_t bytes) override;
  void do_map(DevicePtr va, std::size_t bytes, ChunkHandle chunk,
              std::size_t chunk_offset) override;
  void do_unmap(DevicePtr va, std::size_t bytes) override;
  void do_set_access(DevicePtr va, std::size_t bytes,
                     std::span<const AccessGrant> grants) override;

  [[nodiscard]] StreamPriorityRange do_stream_priority_range(int device) const override;
  StreamHandle do_create_stream(int device, int priority) override;
  void do_destroy_stream(StreamHandle stream) override;
  void do_synchronize_stream(StreamHandle stream) override;
  void do_validate_stream(StreamHandle stream, int device) override;
  [[nodiscard]] bool do_query_stream(StreamHandle stream, int device) override;
  [[nodiscard]] bool do_stream_known_idle(StreamHandle stream, int device) override;
  EventHandle do_create_event(int device) override;
  void do_destroy_event(EventHandle event) override;
  void do_record_event(EventHandle event, StreamHandle stream) override;
  bool do_record_pending(EventHandle event, StreamHandle stream) override;
  [[nodiscard]] bool do_query_event(EventHandle event) override;
  void do_synchronize_event(EventHandle event) override;
  void do_stream_wait_event(StreamHandle stream, EventHandle event, int device) override;
  EventHandle do_create_shareable_event(int device) override;
  [[nodiscard]] SharedEvent do_export_event(EventHandle event) override;
  EventHandle do_import_event(int device, const SharedEvent& shared) override;
  void do_launch_host_func(StreamHandle stream, std::function<void()> fn) override;
  void do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                     StreamHandle stream) override;
  void do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                     StreamHandle stream) override;
  EventHandle do_create_timing_event(int device) override;
  [[nodiscard]] double do_elapsed_seconds(EventHandle start, EventHandle end) override;

  [[nodiscard]] double copy_bandwidth_gbps(std::optional<Location> dst,
                                           std::optional<Location> src) const;
  // For the introspection and compute calls below DeviceBackend (whose own calls it checked).
  void check_device(int device, const char* what) const;
  // Throws NotSupported in a forked child: the memory is shared with the parent, not the
  // child's to carve (SimStreams checks its own calls).
  void check_process(const char* what) const;

  const SimConfig config_;
  const process::Birth birth_ = process::birth_now();
  std::vector<std::vector<std::optional<SimLinkConfig>>> links_;  // [from][to]

  SimMemory memory_;
  // One compute engine per device (sim_compute.hpp), each with its own lock; the vector itself
  // is fixed at construction.
  std::vector<std::unique_ptr<ComputeEngine>> engines_;
  // Last: the destructor shuts it down first, as stream tasks touch mapped memory and engines.
  SimStreams streams_;
};

}  // namespace salus::sim
