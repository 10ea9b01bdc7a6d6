// Internals of the fake driver: the modelled driver state and one method per entry point. Only
// fake_driver*.cpp include this.
#pragma once

#include <cuda.h>

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <utility>
#include <vector>

#include "support/fake_driver.hpp"

namespace salus::test {

// True on the fake's host-function thread while it runs a host function.
[[nodiscard]] bool on_host_function_thread() noexcept;

class FakeDriver::State {
 public:
  explicit State(FakeDriverConfig config);
  ~State();  // host functions still queued run first (the GPU drains)
  State(const State&) = delete;
  State& operator=(const State&) = delete;

  // Entry points (driver semantics; outputs through pointers).
  CUresult init(unsigned flags);
  CUresult device_get_count(int* count);
  CUresult device_get(CUdevice* device, int ordinal);
  CUresult device_get_name(char* name, int len, CUdevice device);
  CUresult device_get_uuid(CUuuid* uuid, CUdevice device);
  CUresult device_total_mem(std::size_t* bytes, CUdevice device);
  CUresult mem_get_info(std::size_t* free, std::size_t* total);
  CUresult device_get_p2p_attribute(int* value, CUdevice_P2PAttribute attrib, CUdevice src,
                                    CUdevice dst);
  CUresult primary_ctx_retain(CUcontext* context, CUdevice device);
  CUresult primary_ctx_release(CUdevice device);
  CUresult ctx_get_current(CUcontext* context);
  CUresult ctx_set_current(CUcontext context);
  CUresult ctx_get_stream_priority_range(int* least, int* greatest);
  CUresult mem_get_allocation_granularity(std::size_t* granularity, const CUmemAllocationProp* prop,
                                          CUmemAllocationGranularity_flags option);
  CUresult mem_create(CUmemGenericAllocationHandle* handle, std::size_t size,
                      const CUmemAllocationProp* prop, unsigned long long flags);
  CUresult mem_release(CUmemGenericAllocationHandle handle);
  CUresult mem_address_reserve(CUdeviceptr* ptr, std::size_t size, std::size_t alignment,
                               CUdeviceptr addr, unsigned long long flags);
  CUresult mem_address_free(CUdeviceptr ptr, std::size_t size);
  CUresult mem_map(CUdeviceptr ptr, std::size_t size, std::size_t offset,
                   CUmemGenericAllocationHandle handle, unsigned long long flags);
  CUresult mem_unmap(CUdeviceptr ptr, std::size_t size);
  CUresult mem_set_access(CUdeviceptr ptr, std::size_t size, const CUmemAccessDesc* desc,
                          std::size_t count);
  // Sharing (fake_driver_sharing.cpp).
  CUresult mem_export_to_shareable_handle(void* shareable, CUmemGenericAllocationHandle handle,
                                          CUmemAllocationHandleType type, unsigned long long flags);
  CUresult mem_import_from_shareable_handle(CUmemGenericAllocationHandle* handle, void* os_handle,
                                            CUmemAllocationHandleType type);
  CUresult stream_create_with_priority(CUstream* stream, unsigned flags, int priority);
  CUresult stream_destroy(CUstream stream);
  CUresult stream_synchronize(CUstream stream);
  CUresult stream_query(CUstream stream);
  CUresult stream_get_ctx(CUstream stream, CUcontext* context);
  CUresult stream_wait_event(CUstream stream, CUevent event, unsigned flags);
  CUresult event_create(CUevent* event, unsigned flags);
  CUresult event_destroy(CUevent event);
  CUresult event_record(CUevent event, CUstream stream);
  CUresult event_query(CUevent event);
  CUresult event_synchronize(CUevent event);
  CUresult event_elapsed_time(float* milliseconds, CUevent start, CUevent end);
  CUresult ipc_get_event_handle(CUipcEventHandle* handle, CUevent event);
  CUresult ipc_open_event_handle(CUevent* event, CUipcEventHandle handle);
  CUresult launch_host_func(CUstream stream, CUhostFn fn, void* user_data);
  CUresult memcpy_async(CUdeviceptr dst, CUdeviceptr src, std::size_t bytes, CUstream stream);
  // Models zeroes only (bytes are sparse words): another value is CUDA_ERROR_NOT_SUPPORTED.
  CUresult memset_async(CUdeviceptr dst, unsigned char value, std::size_t bytes, CUstream stream);
  CUresult stream_is_capturing(CUstream stream, CUstreamCaptureStatus* status);

  // Host functions and capture (fake_driver_host.cpp).
  void drain_host_functions();
  void begin_capture(CUstream stream);
  bool end_capture(CUstream stream);
  CUresult device_get_attribute(int* value, CUdevice_attribute attrib, CUdevice device);
  CUresult driver_get_version(int* version);

  // Steering and queries behind FakeDriver's public API.
  void fail_next(std::string call, CUresult code, int skip);
  void fail_randomly(double rate, std::uint64_t seed, std::vector<std::string> exempt);
  void fail_sticky(std::string call, CUresult code, int skip);
  [[nodiscard]] std::uint64_t random_failures() const;
  [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> random_failures_by_call() const;
  void record_calls(bool record);
  void write_word(CUdeviceptr va, std::uint64_t value);
  [[nodiscard]] std::uint64_t read_word(CUdeviceptr va) const;
  void set_peer(int from, int to, FakePeerConfig peer);
  void hold_events(bool hold);
  void complete_events();
  void advance_clock(double milliseconds);
  std::uint64_t enqueue_work(CUstream stream, CUdeviceptr va, std::size_t bytes);
  void finish_work(std::uint64_t id);
  void finish_all_work();
  [[nodiscard]] bool work_finished(std::uint64_t id) const;
  [[nodiscard]] std::size_t pending_work() const;
  [[nodiscard]] std::vector<std::string> violations() const;
  void clear_violations();
  [[nodiscard]] std::vector<FakeCall> calls() const;
  void clear_calls();
  [[nodiscard]] Access access_of(DevicePtr va, int device) const;
  [[nodiscard]] std::optional<FakeDriver::MappedChunk> mapped_chunk(DevicePtr va) const;
  [[nodiscard]] std::size_t mapped_bytes() const;
  [[nodiscard]] std::size_t live_chunks() const;
  [[nodiscard]] std::size_t used_bytes(Location where) const;
  [[nodiscard]] std::size_t reserved_bytes() const;
  [[nodiscard]] std::size_t live_streams() const;
  [[nodiscard]] std::size_t live_events() const;
  [[nodiscard]] int retained_contexts(int device) const;
  [[nodiscard]] bool initialized() const;

 private:
  // One allocation, kept under the handle cuMemCreate gave. It is freed once no handle refers to
  // it and the last mapping goes, as the driver does.
  struct Chunk {
    std::size_t size = 0;
    bool host = false;
    int device = 0;  // when not host
    int mappings = 0;
    // References to cuMemCreate's handle: 1, plus each import that gave it back
    // (import_returns_held_handle). 0: that handle is released.
    int references = 1;
    int imports = 0;          // handles of its own that imports gave (aliases_)
    bool exportable = false;  // created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
    // Its own open description of the export file, positioned at export_serial; every export of
    // it is a duplicate. -1 until the first export.
    int export_fd = -1;
    std::uint64_t export_serial = 0;
    [[nodiscard]] bool released() const { return references == 0; }
  };
  struct Mapping {
    std::size_t size = 0;
    CUmemGenericAllocationHandle handle = 0;  // the allocation
    std::size_t offset = 0;                   // into the chunk
    CUmemGenericAllocationHandle via = 0;     // the handle cuMemMap was given (an import's own)
  };
  struct Event {
    int device = 0;
    std::uint64_t captured = 0;  // the item its last record captured; 0: none (complete)
    bool timing = false;         // created without CU_EVENT_DISABLE_TIMING
    bool recorded = false;
    bool interprocess = false;   // created with CU_EVENT_INTERPROCESS
    std::uintptr_t source = 0;   // opened by cuIpcOpenEventHandle: the event it stands for
    std::uint64_t serial = 0;    // this event's, never reused (its handle is)
    std::uint64_t source_serial = 0;  // the source's when it was opened
  };
  // One entry of a stream's queue (fake_driver_work.cpp).
  enum class ItemKind : std::uint8_t { kernel, copy, wait, record, host };
  struct Span {  // memory an item touches, as it was mapped when the item was enqueued
    CUdeviceptr va = 0;
    std::size_t bytes = 0;
    std::vector<CUmemGenericAllocationHandle> chunks;
    // Per chunk, the handle of the mapping it was reached through: two handles of one allocation
    // are two processes' views of one page (salusd's clients), whose work must be ordered.
    std::vector<CUmemGenericAllocationHandle> via;
  };
  // Part of a copy: bytes from one chunk to another, resolved when the copy was enqueued.
  struct CopyPiece {
    CUmemGenericAllocationHandle src = 0;
    std::size_t src_offset = 0;
    CUmemGenericAllocationHandle dst = 0;
    std::size_t dst_offset = 0;
    std::size_t bytes = 0;
  };
  struct Item {
    ItemKind kind = ItemKind::kernel;
    CUstream stream = nullptr;
    // Items it completes after; all of them were enqueued before it (so have smaller ids).
    std::vector<std::uint64_t> after;
    std::vector<Span> spans;
    bool held = false;               // a hold_events marker not yet released
    std::vector<CopyPiece> pieces;   // a copy's bytes, carried when it completes
    CUhostFn fn = nullptr;           // a host function's
    void* user_data = nullptr;
    bool dispatched = false;         // handed to the host-function thread
  };
  // fail_randomly's state.
  struct RandomFailures {
    double rate = 0.0;
    std::mt19937_64 rng;
    std::set<std::string, std::less<>> exempt;
    std::map<std::string, std::uint64_t, std::less<>> injected;  // per call
  };
  struct Failure {
    std::string call;
    CUresult code = CUDA_SUCCESS;
    int skip = 0;
    bool sticky = false;  // fail_sticky: every later call fails too
  };

  // Records the call, applies an injected failure or the initialization check, else runs `body`;
  // all under the lock.
  CUresult run(std::string_view name, std::vector<std::uint64_t> args,
               const std::function<CUresult()>& body);
  // The code of an injected failure for this call (fail_next, then fail_randomly), or success.
  CUresult injected(std::string_view name);
  CUresult random_failure(std::string_view name);
  [[nodiscard]] int device_count() const { return static_cast<int>(config_.devices.size()); }
  [[nodiscard]] bool valid_device(int device) const {
    return device >= 0 && device < device_count();
  }
  [[nodiscard]] int current_device() const;  // -1: no valid current context
  // FakeDriverConfig::handle_calls_need_context, and the thread has no current context.
  [[nodiscard]] bool lacks_context() const {
    return config_.handle_calls_need_context && current_device() < 0;
  }
  [[nodiscard]] CUcontext context_of(int device) const;
  // nullptr (legacy) is valid. A destroyed stream's handle is not, and using it is a violation:
  // a real driver may have handed the handle to a new stream meanwhile.
  [[nodiscard]] bool valid_stream(CUstream stream);
  // A call that capture forbids on a capturing stream: it fails and the capture is invalidated.
  [[nodiscard]] bool breaks_capture(CUstream stream);
  [[nodiscard]] const FakePeerConfig& peer(int from, int to) const;
  [[nodiscard]] std::optional<std::size_t> granularity_of(const CUmemLocation& location) const;
  // Whether this driver version and device accept `location` for VMM chunks: CUDA_SUCCESS, or
  // what cuMemCreate and cuMemGetAllocationGranularity answer.
  [[nodiscard]] CUresult location_status(const CUmemLocation& location) const;
  // Whether the device named in a cuMemCreate prop supports its handle types and RDMA flag.
  [[nodiscard]] CUresult check_export(const CUmemAllocationProp& prop) const;
  // The device whose work runs on `stream`; -1 when unknown (legacy stream without a context).
  [[nodiscard]] int device_of_stream(CUstream stream) const;
  // Records a violation unless `device` holds at least `needed` on every page of the range.
  void check_access(const std::string& what, int device, CUdeviceptr va, std::size_t bytes,
                    CUmemAccess_flags needed);
  [[nodiscard]] bool range_reserved(CUdeviceptr ptr, std::size_t size) const;
  [[nodiscard]] bool range_mapped(CUdeviceptr ptr, std::size_t size) const;
  [[nodiscard]] bool range_unmapped(CUdeviceptr ptr, std::size_t size) const;
  [[nodiscard]] const Chunk* chunk_at(CUdeviceptr page) const;
  // The allocation a live handle (cuMemCreate's, or an import's) refers to; 0 for no live handle.
  [[nodiscard]] CUmemGenericAllocationHandle allocation_of(
      CUmemGenericAllocationHandle handle) const;
  void free_chunk_if_done(CUmemGenericAllocationHandle handle);
  // Closes an allocation's export memfd (fake_driver_sharing.cpp).
  int open_export();
  void forget_export(Chunk& chunk);

  // The queue model (fake_driver_work.cpp); all with the lock held.
  [[nodiscard]] bool finished(std::uint64_t id) const { return !items_.contains(id); }
  // Appends an item to `stream`'s queue (after its last item, and for the legacy stream after
  // every blocking stream's, and the other way round), also after `also` when non-zero; returns
  // its id. Auto-completing items whose predecessors are done finish at once.
  std::uint64_t enqueue(ItemKind kind, CUstream stream, std::vector<Span> spans,
                        std::uint64_t also = 0, bool held = false,
                        std::vector<CopyPiece> pieces = {});
  // Finishes every auto-completing item (not a kernel, not held) whose predecessors are done.
  void settle();
  // Erases a finished item; a record's completion time is kept for cuEventElapsedTime.
  std::map<std::uint64_t, Item>::iterator retire(std::map<std::uint64_t, Item>::iterator it);
  // The host waited for `id`: it finishes with everything it follows, transitively.
  void complete(std::uint64_t id);
  // The host waited for `stream`'s work so far (the legacy stream's includes blocking streams').
  void complete_stream(CUstream stream);
  [[nodiscard]] Span span_of(CUdeviceptr va, std::size_t bytes) const;
  [[nodiscard]] std::string describe(std::uint64_t id) const;
  // Records a violation for every unfinished item referencing [ptr, ptr + size) (`call` names
  // the call), or chunk `handle`.
  void check_range(std::string_view call, CUdeviceptr ptr, std::size_t size);
  void check_chunk(CUmemGenericAllocationHandle handle);
  // A kernel or copy about to be enqueued (`item`, not yet listed): records a violation for each
  // allocation it reaches through one handle while unfinished work reaches it through another
  // and is not among what the item follows: a page used before its interprocess fence.
  void check_views(const Item& item);
  // The event `event` stands for: an opened interprocess event's source (while it lives), else
  // itself; events_.end() for none.
  std::map<std::uintptr_t, Event>::iterator event_of(CUevent event);
  // A handle for a new event: a destroyed one's if any (the driver reuses them), else a new one.
  std::uintptr_t new_event_handle();
  // Host functions (fake_driver_host.cpp): a ready one goes to the host-function thread, which
  // runs them one at a time, outside the lock, and then finishes their items.
  void dispatch(std::uint64_t id, Item& item);
  void host_loop();
  // After a host wait's call: blocks (without the lock) until `ids` are finished, for the host
  // functions among what they follow have to run first.
  void wait_finished(const std::vector<std::uint64_t>& ids);
  [[nodiscard]] std::vector<std::uint64_t> stream_tails(CUstream stream) const;
  // The bytes model (fake_driver_bytes.cpp): the chunk and offset mapped at `va`; a copy's
  // pieces; carrying a completed copy's words.
  [[nodiscard]] std::optional<std::pair<CUmemGenericAllocationHandle, std::size_t>> resolve(
      CUdeviceptr va) const;
  [[nodiscard]] std::vector<CopyPiece> copy_pieces(CUdeviceptr dst, CUdeviceptr src,
                                                   std::size_t bytes) const;
  void carry_words(const std::vector<CopyPiece>& pieces);

  FakeDriverConfig config_;
  std::uint64_t generation_;  // tells this driver's contexts from those of an earlier fake
  std::size_t page_;          // smallest granularity: the unit of the page tables below

  mutable std::mutex mutex_;
  bool initialized_ = false;
  std::vector<FakeCall> calls_;
  bool record_calls_ = true;
  std::deque<Failure> failures_;
  CUresult sticky_ = CUDA_SUCCESS;  // once set, every call fails with it
  RandomFailures random_;
  // Words written (write_word) or copied into each chunk: chunk -> offset -> value.
  std::map<CUmemGenericAllocationHandle, std::map<std::size_t, std::uint64_t>> words_;
  std::map<std::pair<int, int>, FakePeerConfig> peer_overrides_;
  std::vector<int> retained_;
  std::map<CUmemGenericAllocationHandle, Chunk> chunks_;
  CUmemGenericAllocationHandle next_handle_ = 0x1000;
  // Handles imports gave that are not cuMemCreate's: handle -> allocation.
  std::map<CUmemGenericAllocationHandle, CUmemGenericAllocationHandle> aliases_;
  // The one file every exported descriptor is an open of (the driver's control device stands
  // for all its exports the same way), its (st_dev, st_ino), and the exported allocations by the
  // position of their description in it, which imports look descriptors up by.
  int export_file_ = -1;
  std::pair<std::uint64_t, std::uint64_t> export_file_id_{};
  std::uint64_t next_export_serial_ = 1;
  std::map<std::uint64_t, CUmemGenericAllocationHandle> exports_;
  std::vector<std::size_t> device_used_;
  std::size_t host_used_ = 0;
  std::map<CUdeviceptr, std::size_t> reservations_;  // base -> size
  CUdeviceptr next_va_ = 0x2000'0000'0000;
  std::map<CUdeviceptr, Mapping> mappings_;                      // start -> mapping
  std::map<CUdeviceptr, std::vector<CUmemAccess_flags>> pages_;  // mapped page -> per device
  std::map<std::uintptr_t, int> streams_;                        // stream -> device
  std::set<std::uintptr_t> blocking_streams_;  // created without CU_STREAM_NON_BLOCKING
  std::map<std::uintptr_t, Event> events_;
  std::uintptr_t next_object_ = 0x10000;
  // Handles of destroyed events, given to the next ones made: the driver reuses handles, so an
  // interprocess handle kept past its event's destruction may name another event.
  std::vector<std::uintptr_t> free_event_handles_;
  std::uint64_t next_event_serial_ = 1;
  bool hold_events_ = false;
  double clock_ms_ = 0.0;  // the fake GPU's clock (advance_clock)
  // Completion times of finished records that an event's last record captured (item -> ms).
  std::map<std::uint64_t, double> record_times_;
  std::map<std::uint64_t, Item> items_;            // unfinished items, in enqueue order
  std::uint64_t next_item_ = 1;                    // ids are never reused
  std::map<std::uintptr_t, std::uint64_t> tails_;  // stream (0: legacy) -> its last item
  std::vector<std::string> violations_;
  std::string_view call_;  // the entry point running now (for violations)
  std::set<std::uintptr_t> destroyed_streams_;
  std::map<std::uintptr_t, bool> capturing_;  // stream -> capture still valid

  std::deque<std::uint64_t> host_queue_;  // ready host functions, in the order they became so
  bool host_busy_ = false;                // the thread runs one now
  bool stopping_ = false;
  std::condition_variable host_cv_;  // the queue grew, or an item finished
  std::thread host_thread_;          // last: starts once everything above exists
};

}  // namespace salus::test
