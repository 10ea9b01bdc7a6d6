// The device backend of a process connected to salusd: this process's own backend (its streams,
// events, address space, copies and host memory) with the GPU's physical pages taken from the
// daemon (DaemonPages, which owns them and their lock). Everything above sees ordinary chunk
// handles. This class holds no state of its own beyond what it was built with: every call goes to
// the local backend or to the pages.
#pragma once

#include <cstdint>
#include <memory>

#include "remote/daemon_link.hpp"
#include "remote/daemon_pages.hpp"
#include "remote/fence_pool.hpp"
#include "salus/device.hpp"

namespace salus::remote {

class RemoteBackend final : public DeviceBackend {
 public:
  RemoteBackend(std::shared_ptr<DeviceBackend> local, std::shared_ptr<DaemonLink> link);
  ~RemoteBackend() override;

  // Gives the daemon every page of `device` this process holds but does not use (those fetched
  // and not yet handed out, and those released since the last batch). Returns the pages given.
  std::size_t give_back(int device);
  // Pages held from the daemon, on `device`: handed out plus waiting to be.
  [[nodiscard]] std::size_t held_pages(int device) const { return pages_.held(device); }
  // Of those, the pages handed out as chunks and not released: what the memory manager holds.
  [[nodiscard]] std::size_t pages_in_use(int device) const { return pages_.in_use(device); }
  [[nodiscard]] DaemonLink& link() const { return *link_; }
  // The events pages went back behind, and the opening of those that came with granted pages.
  [[nodiscard]] const FencePool& fences() const { return pages_.fences(); }
  [[nodiscard]] FencePool& fences() { return pages_.fences(); }
  // Fences of granted pages that could not be opened (taken as passed).
  [[nodiscard]] std::uint64_t unopened_fences() const { return pages_.unopened_fences(); }

 private:
  std::string_view do_name() const noexcept override { return local_->name(); }
  int do_device_count() const override { return local_->device_count(); }
  DeviceProperties do_properties(int device) const override { return local_->properties(device); }
  std::size_t do_free_memory(int device) const override { return local_->free_memory(device); }
  std::size_t do_granularity(Location where) const override { return local_->granularity(where); }
  std::size_t do_address_granularity() const noexcept override { return address_granularity_; }
  PeerLink do_peer_link(int from, int to) const override { return local_->peer_link(from, to); }
  ChunkHandle do_create_chunk(Location where, std::size_t bytes) override;
  void do_release_chunk(ChunkHandle chunk) override;
  std::shared_ptr<const Event> do_take_arrival(ChunkHandle chunk) override;
  [[nodiscard]] bool do_defers_release() const noexcept override { return true; }
  void do_release_chunks_after(std::span<const ChunkHandle> chunks,
                               std::span<const std::shared_ptr<const Event>> work) override;
  EventHandle do_create_shareable_event(int device) override {
    return local_->create_shareable_event(device);
  }
  SharedEvent do_export_event(EventHandle event) override { return local_->export_event(event); }
  EventHandle do_import_event(int device, const SharedEvent& shared) override {
    return local_->import_event(device, shared);
  }
  SharedChunk do_export_chunk(ChunkHandle chunk) override { return local_->export_chunk(chunk); }
  ChunkHandle do_import_chunk(Location where, const SharedChunk& shared) override {
    return local_->import_chunk(where, shared);
  }
  DevicePtr do_reserve_address(std::size_t bytes, std::size_t alignment) override {
    return local_->reserve_address(bytes, alignment);
  }
  void do_free_address(DevicePtr base, std::size_t bytes) override {
    local_->free_address(base, bytes);
  }
  void do_map(DevicePtr va, std::size_t bytes, ChunkHandle chunk, std::size_t offset) override {
    local_->map(va, bytes, chunk, offset);
  }
  void do_unmap(DevicePtr va, std::size_t bytes) override { local_->unmap(va, bytes); }
  void do_set_access(DevicePtr va, std::size_t bytes,
                     std::span<const AccessGrant> grants) override {
    local_->set_access(va, bytes, grants);
  }
  StreamPriorityRange do_stream_priority_range(int device) const override {
    return local_->stream_priority_range(device);
  }
  StreamHandle do_create_stream(int device, int priority) override {
    return local_->create_stream(device, priority);
  }
  void do_destroy_stream(StreamHandle stream) override { local_->destroy_stream(stream); }
  void do_synchronize_stream(StreamHandle stream) override { local_->synchronize_stream(stream); }
  void do_validate_stream(StreamHandle stream, int device) override {
    local_->validate_stream(stream, device);
  }
  bool do_stream_capturing(StreamHandle stream) override {
    return local_->stream_capturing(stream);
  }
  bool do_stream_known_idle(StreamHandle stream, int device) override {
    return local_->stream_known_idle(stream, device);
  }
  bool do_query_stream(StreamHandle stream, int device) override {
    return local_->query_stream(stream, device);
  }
  EventHandle do_create_event(int device) override { return local_->create_event(device); }
  void do_destroy_event(EventHandle event) override { local_->destroy_event(event); }
  bool do_record_pending(EventHandle event, StreamHandle stream) override {
    return local_->record_pending(event, stream);
  }
  void do_record_event(EventHandle event, StreamHandle stream) override {
    local_->record_event(event, stream);
  }
  bool do_query_event(EventHandle event) override { return local_->query_event(event); }
  void do_synchronize_event(EventHandle event) override { local_->synchronize_event(event); }
  void do_stream_wait_event(StreamHandle stream, EventHandle event, int device) override {
    local_->stream_wait_event(stream, event, device);
  }
  void do_launch_host_func(StreamHandle stream, std::function<void()> fn) override {
    local_->launch_host_func(stream, std::move(fn));
  }
  EventHandle do_create_timing_event(int device) override {
    return local_->create_timing_event(device);
  }
  double do_elapsed_seconds(EventHandle start, EventHandle end) override {
    return local_->elapsed_seconds(start, end);
  }
  void do_copy_async(DevicePtr dst, DevicePtr src, std::size_t bytes,
                     StreamHandle stream) override {
    local_->copy_async(dst, src, bytes, stream);
  }
  void do_fill_async(DevicePtr dst, std::uint8_t value, std::size_t bytes,
                     StreamHandle stream) override {
    local_->fill_async(dst, value, bytes, stream);
  }
  DeviceBackend& do_underlying() noexcept override { return local_->underlying(); }

  const std::shared_ptr<DeviceBackend> local_;
  const std::shared_ptr<DaemonLink> link_;
  const std::size_t address_granularity_;
  const std::size_t page_bytes_;
  DaemonPages pages_;  // has its own lock
};

}  // namespace salus::remote
