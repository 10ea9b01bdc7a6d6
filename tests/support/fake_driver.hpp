// A fake CUDA driver: fills a cuda::DriverApi with plain functions that act on the one current
// FakeDriver. It models what the device layer and the memory manager rely on (devices, VMM chunks,
// reservations, mappings, per-device access, streams, events, host functions, P2P attributes),
// records every call in order and injects failures, so the CUDA backend runs without a GPU.
//
// Usage:
//   salus::test::FakeDriver fake(salus::test::FakeDriverConfig::uniform(4));
//   auto backend = std::make_shared<salus::cuda::CudaBackend>(fake.api());
//
// A FakeDriver is its own RAII guard: constructing it makes it current (only one may live at a
// time), destroying it uninstalls it, after which the table's functions return
// CUDA_ERROR_DEINITIALIZED. It is thread-safe. Host functions run as on a GPU: in stream order,
// asynchronously, one at a time on a thread of the fake's, outside its lock; a driver call from
// inside one is a violation (see fake_driver_host.cpp). Destroying the fake runs those still
// queued.
//
// Streams are in-order queues, so that tests can catch memory reused under queued GPU work:
//  - The test enqueues "kernels" touching a range (enqueue_work); a kernel stays unfinished until
//    the test finishes it (finish_work, finish_all_work) or the host waits for it (below).
//  - An item completes only after every earlier item on its stream. Copies (cuMemcpyAsync), stream
//    waits (cuStreamWaitEvent, which wait for the event's captured work) and event records
//    complete on their own as soon as what they follow has. Without kernels or held events,
//    everything therefore completes as soon as it is enqueued.
//  - cuEventRecord captures the stream's work so far: the event is complete once that is (never
//    recorded, or recorded on an idle stream: complete). cuEventQuery says CUDA_ERROR_NOT_READY
//    while it is pending.
//  - The fake GPU has a clock that only the test moves (advance_clock). A record completes at the
//    clock's reading then, and cuEventElapsedTime reports the clock time between two completed
//    records: CUDA_ERROR_NOT_READY while one is pending, CUDA_ERROR_INVALID_HANDLE for an event
//    never recorded or created with CU_EVENT_DISABLE_TIMING, as the driver does.
//  - cuEventSynchronize and cuStreamSynchronize model the host waiting until the GPU got there:
//    what they wait for completes at once, with everything it depends on. Nothing in the fake
//    ever blocks, so neither a wait nor tearing the fake down can hang on unfinished work.
//  - The legacy stream (nullptr) is ordered against streams created without
//    CU_STREAM_NON_BLOCKING, as with the driver; Salus creates only non-blocking streams.
//  - Bytes are modelled sparsely, as 64-bit words the test writes and reads through a mapped
//    address (write_word, read_word): they live in the physical chunk mapped there, so they follow
//    the chunk through remaps, and a copy (cuMemcpyAsync) carries the words of its source range
//    to its destination when the copy completes, from the chunks mapped under both ranges when it
//    was enqueued (as the GPU's copy engine would). Words never written read as 0.
//  - Host functions (cuLaunchHostFunc) are items too: each runs on the fake's host-function thread
//    once what precedes it has finished, and later items wait for it; host waits
//    (cuStreamSynchronize, cuEventSynchronize, finish_all_work) block until those they cover ran.
//  - A destroyed stream's handle is no stream: using it is a violation (a real driver may have
//    given the handle to a new stream). Stream capture is modelled (begin_capture below).
//  - Kernels and copies reference the virtual range they were enqueued against and the physical
//    chunks mapped under it at that moment. cuMemUnmap or cuMemAddressFree of a range, or
//    cuMemRelease of a chunk, that unfinished work references is recorded as a violation (the call
//    still succeeds: the driver does not check either). Mapping one chunk at a second address and
//    unmapping the first once its work has finished is fine.
//
// Sharing chunks (cuMemExportToShareableHandle, cuMemImportFromShareableHandle) uses real file
// descriptors, so that they can be passed around (dup, SCM_RIGHTS, fork) like the driver's:
//  - Every exported descriptor is an open of one file, as the driver's are (seen on an H100,
//    driver 580: four exports, one file by fstat): st_dev and st_ino are the same for all and
//    says nothing of which memory a descriptor names (a receiver that merged descriptors by file
//    would map one allocation for many). The first export of an allocation opens that file anew
//    and sets the new description's position to a serial of the allocation's; every export
//    returns a duplicate of that description (the caller closes it), which keeps its position
//    through dup, SCM_RIGHTS and fork. An import finds the allocation by that position and gives
//    a new handle for it (or, with
//    import_returns_held_handle, the allocation's own handle once more while that is live: the
//    driver promises neither). Each handle needs its own cuMemRelease; the allocation is freed
//    once every handle is released and the last mapping is gone. Mappings, bytes and chunk_at()
//    name the allocation (cuMemCreate's handle) whichever handle mapped it.
//  - Export needs a device allocation created with CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
//    (else CUDA_ERROR_INVALID_VALUE, as for a handle type the allocation was not made for) and
//    that handle type (else CUDA_ERROR_NOT_SUPPORTED). Import of a descriptor that stands for no
//    live allocation is CUDA_ERROR_INVALID_VALUE.
//  - Interprocess events (cuIpcGetEventHandle, cuIpcOpenEventHandle) follow CUDA's rules: an
//    event is not opened in the process that exported it (CUDA_ERROR_INVALID_CONTEXT; one fake
//    is one process, see ipc_open_own_events), and destroyed events' handles are reused, so a
//    handle kept past its event's destruction may name another event: opening it, or using an
//    event opened before its source was destroyed, is recorded as a violation (undefined with
//    CUDA).
//  - Unlike the driver, an exported descriptor does not keep its allocation alive: once every
//    handle is released and nothing is mapped, the allocation is gone and importing a descriptor
//    exported earlier fails.
#pragma once

#include <cuda.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cuda/driver_api.hpp"
#include "salus/device.hpp"
#include "salus/sim.hpp"

namespace salus::test {

struct FakeDeviceConfig {
  std::string name = "Salus Fake GPU";
  std::size_t memory_bytes = 16 * GiB;
  // What other processes hold of it (their contexts and allocations): cuMemCreate and
  // cuMemGetInfo count it as used.
  std::size_t used_elsewhere = 0;
  std::size_t granularity = 2 * MiB;  // MINIMUM
  // RECOMMENDED: larger than MINIMUM, as on real GPUs, so that code mixing the two is caught.
  // 0: four times `granularity`.
  std::size_t recommended_granularity = 0;
  // cuDeviceGetAttribute. HOST_NUMA_ID (-1: a system without NUMA) and the HOST_NUMA support
  // attribute exist from driver 12.2 on, HOST support from 13.0 on (older drivers answer
  // CUDA_ERROR_INVALID_VALUE, as they do for an attribute they do not know).
  int host_numa_id = 0;
  bool vmm = true;           // VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: cuMemCreate on it works
  bool host_numa_vmm = true;  // HOST_NUMA_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED (known from 12.4)
  bool host_vmm = true;       // HOST_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
  // GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED: else cuMemCreate with the RDMA flag is
  // CUDA_ERROR_INVALID_VALUE.
  bool gpu_direct_rdma_vmm = true;
  // HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: else cuMemCreate requesting the handle type is
  // CUDA_ERROR_NOT_SUPPORTED.
  bool posix_fd = true;
  bool ipc_events = true;  // IPC_EVENT_SUPPORTED
  // cuDeviceGetUuid; all zero: made from the device's index ("FAKE" and the index).
  std::array<std::uint8_t, 16> uuid{};
};

// What cuDeviceGetP2PAttribute reports for an ordered pair of distinct devices.
struct FakePeerConfig {
  bool access = true;
  int performance_rank = 0;
  bool native_atomics = true;  // the backend reads this as "NVLink"
};

struct FakeDriverConfig {
  std::vector<FakeDeviceConfig> devices = std::vector<FakeDeviceConfig>(2);
  bool host_chunks = true;  // false: host granularity and host cuMemCreate are NOT_SUPPORTED
  std::size_t host_memory_bytes = 64 * GiB;
  std::size_t host_granularity = 2 * MiB;
  FakePeerConfig peers;  // every pair, unless FakeDriver::set_peer says otherwise
  int least_priority = 0;
  int greatest_priority = -5;
  // cuMemcpyAsync fails with CUDA_ERROR_INVALID_VALUE unless both ranges are mapped.
  bool check_copy_ranges = true;
  // Calls on a stream or event handle (record, query, synchronize, wait, is-capturing) answer
  // CUDA_ERROR_INVALID_CONTEXT on a thread with no current context. Off by default: the handle
  // names its context. On, it plays a driver that wants one anyway.
  bool handle_calls_need_context = false;
  // cuMemImportFromShareableHandle of an allocation whose own handle is live returns that handle
  // (with one more reference to release) instead of a new one: the driver promises neither.
  bool import_returns_held_handle = false;
  // One FakeDriver is one process, and CUDA refuses cuIpcOpenEventHandle in the process that
  // exported the event (CUDA_ERROR_INVALID_CONTEXT): so does the fake, unless a test has the one
  // fake play two processes (an exporter and an importer) and says so here.
  bool ipc_open_own_events = false;
  // cuDriverGetVersion. Below 13000 (e.g. 12040), host chunks as CU_MEM_LOCATION_TYPE_HOST are
  // refused with CUDA_ERROR_INVALID_VALUE (cuMemCreate, cuMemGetAllocationGranularity); below
  // 12020 HOST_NUMA is too.
  int driver_version = 13000;

  static FakeDriverConfig uniform(int count, std::size_t memory_bytes = 16 * GiB,
                                  std::size_t granularity = 2 * MiB);
};

// One driver call as the fake saw it. `args` are the call's input arguments in the driver's order,
// as integers (pointers and handles by value, output pointers left out), except:
//   cuMemSetAccess: {va, size, count, then per descriptor: location type, location id, flags}
//   cuMemCreate:    {size, location type, location id, flags, requested handle types,
//                    gpuDirectRDMACapable}
//   cuMemGetAllocationGranularity: {location type, location id, option}
//   cuLaunchHostFunc: {stream}
// `context_device` is the device of the thread's current context when the call was made (-1 for
// none): it shows whether the backend bound the right device.
struct FakeCall {
  std::string name;
  std::vector<std::uint64_t> args;
  CUresult result = CUDA_SUCCESS;
  int context_device = -1;
};

class FakeDriver {
 public:
  explicit FakeDriver(FakeDriverConfig config = {});
  ~FakeDriver();
  FakeDriver(const FakeDriver&) = delete;
  FakeDriver& operator=(const FakeDriver&) = delete;
  FakeDriver(FakeDriver&&) = delete;
  FakeDriver& operator=(FakeDriver&&) = delete;

  // The table every fake entry point is in. cuGetErrorName works (and is not recorded) even with
  // no FakeDriver installed.
  [[nodiscard]] cuda::DriverApi api() const;
  [[nodiscard]] static FakeDriver* current() noexcept;

  // --- steering ---
  // The (skip+1)-th next call of `call` (a base name, e.g. "cuMemMap") returns `code` without
  // doing anything. Several injections queue up; each fires once.
  void fail_next(std::string call, CUresult code, int skip = 0);
  // From now on every call fails with probability `rate` (0 turns it off), drawn from a generator
  // seeded with `seed`: calls that take a resource (cuMemCreate, cuMemAddressReserve,
  // cuStreamCreateWithPriority, cuEventCreate) with CUDA_ERROR_OUT_OF_MEMORY, the others with
  // CUDA_ERROR_UNKNOWN. Calls named in `exempt` never fail this way. fail_next injections come
  // first. The failed call does nothing, as with fail_next.
  void fail_randomly(double rate, std::uint64_t seed, std::vector<std::string> exempt = {});
  // A sticky error, as after a kernel fault (CUDA_ERROR_ILLEGAL_ADDRESS): the (skip+1)-th next
  // call of `call` ("" for the very next call of any name) and every call after it fail with
  // `code`, doing nothing. cuGetErrorName still works.
  void fail_sticky(std::string call, CUresult code, int skip = 0);
  // Failures fail_randomly injected so far, in all, and per call name.
  [[nodiscard]] std::uint64_t random_failures() const;
  [[nodiscard]] std::vector<std::pair<std::string, std::uint64_t>> random_failures_by_call() const;
  // Stops (false) or resumes recording calls for calls(): a long run would keep millions.
  void record_calls(bool record);
  void set_peer(int from, int to, FakePeerConfig peer);
  // While held, each cuEventRecord also enqueues a marker that stays unfinished (and with it the
  // event and later work on that stream) until complete_events(), cuEventSynchronize on the event,
  // cuStreamSynchronize on its stream, or finish_all_work(): a busy GPU without explicit kernels.
  void hold_events(bool hold);
  // Releases every held marker; each completes once the work before it has.
  void complete_events();
  // Moves the fake GPU's clock on (see the top of this file).
  void advance_clock(double milliseconds);

  // --- queued work (see the top of this file) ---
  // Enqueues a kernel on `stream` (nullptr or StreamHandle{0}: the legacy stream) that reads and
  // writes [va, va + bytes), which must be mapped. Returns its id (ids start at 1 and grow).
  // Throws std::invalid_argument for an unknown stream or an unmapped range. Not a driver call:
  // it is not recorded among calls().
  std::uint64_t enqueue_work(CUstream stream, DevicePtr va, std::size_t bytes);
  std::uint64_t enqueue_work(StreamHandle stream, DevicePtr va, std::size_t bytes);
  // The GPU got to kernel `id`: it finishes, and with it everything it had to wait for (earlier
  // work on its stream, the work of events it waited on); then whatever that unblocks. Unknown or
  // finished ids are ignored.
  void finish_work(std::uint64_t id);
  // The GPU drains: every queued item finishes, held markers included, and every host function
  // runs (this waits for them).
  void finish_all_work();
  // Waits until every host function that is ready has run.
  void drain_host_functions();
  // The application captures a graph on `stream` (cuStreamBeginCapture/EndCapture): while it
  // does, cuStreamQuery and cuStreamSynchronize on it fail with
  // CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, cuStreamWaitEvent into it fails with
  // CUDA_ERROR_STREAM_CAPTURE_ISOLATION, each a violation that invalidates the capture;
  // cuStreamIsCapturing reports it. end_capture: false when the capture was invalidated.
  void begin_capture(StreamHandle stream);
  bool end_capture(StreamHandle stream);
  [[nodiscard]] bool work_finished(std::uint64_t id) const;
  // Unfinished kernels and copies.
  [[nodiscard]] std::size_t pending_work() const;
  // Each: the call, its range or chunk, and the unfinished work item (with its stream) that
  // still referenced it, in the order they happened. Also work without access: a kernel
  // (enqueue_work) on a stream of device D needs D's read_write access to its whole range, a
  // copy (cuMemcpyAsync) on such a stream D's read access to its source and read_write to its
  // destination (the legacy stream: the device of the calling thread's context, unchecked
  // without one). A mapping alone grants nothing, as with the driver.
  [[nodiscard]] std::vector<std::string> violations() const;
  void clear_violations();

  // --- bytes (see the top of this file) ---
  // `va` must be 8-byte aligned and mapped; else std::invalid_argument. Not driver calls.
  void write_word(DevicePtr va, std::uint64_t value);
  [[nodiscard]] std::uint64_t read_word(DevicePtr va) const;

  // --- what happened ---
  [[nodiscard]] std::vector<FakeCall> calls() const;
  [[nodiscard]] std::vector<FakeCall> calls(std::string_view name) const;
  // Names in order; without the cuCtxGetCurrent/cuCtxSetCurrent noise unless asked for.
  [[nodiscard]] std::vector<std::string> call_names(bool with_context_calls = false) const;
  [[nodiscard]] std::size_t count(std::string_view name) const;
  void clear_calls();

  // --- state ---
  [[nodiscard]] Access access_of(DevicePtr va, int device) const;  // none where unmapped
  // The chunk mapped at the page holding `va` and where it lives; nullopt where unmapped.
  struct MappedChunk {
    std::uint64_t handle = 0;
    Location where;
  };
  [[nodiscard]] std::optional<MappedChunk> chunk_at(DevicePtr va) const;
  [[nodiscard]] std::size_t mapped_bytes() const;
  // Allocations some handle still refers to (created or imported, and not released).
  [[nodiscard]] std::size_t live_chunks() const;
  [[nodiscard]] std::size_t used_bytes(Location where) const;  // physical bytes still allocated
  [[nodiscard]] std::size_t reserved_bytes() const;
  [[nodiscard]] std::size_t live_streams() const;
  [[nodiscard]] std::size_t live_events() const;
  [[nodiscard]] int retained_contexts(int device) const;  // primary-context retain count
  [[nodiscard]] bool initialized() const;

  class State;  // defined in fake_driver_state.hpp

 private:
  std::unique_ptr<State> state_;
};

// The driver's error name for the codes the fake uses ("CUDA_ERROR_OUT_OF_MEMORY"), else nullptr.
[[nodiscard]] const char* fake_error_name(CUresult code) noexcept;

}  // namespace salus::test
