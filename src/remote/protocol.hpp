// The wire protocol between salusd and its clients.
//
// One message is one SOCK_SEQPACKET record: a fixed Header, then the body of its type. Bodies are
// fixed-size structs of fixed-width fields; the two page lists are a fixed part followed by
// `count` entries. File descriptors (pages) ride on the record as SCM_RIGHTS.
//
// Why structs and not a serialization library (CBOR, protobuf, flatbuffers): every message is a
// handful of integers and one short name, both ends are this library at one version on one
// machine (the daemon refuses any other version at hello), and the decoder must be small enough to
// fuzz to exhaustion. A struct is checked by its exact size, one bounds check per string and the
// page count; there is no parse tree to get wrong. The same reasons made the C ABI use sized structs.
// Both ends are one host, so the byte order is the host's.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "iteration_sched/turn_gate.hpp"

#include "salus/error.hpp"

namespace salus::remote {

inline constexpr std::uint32_t kMagic = 0x5341'4C53;  // "SLAS" in memory order: a salus record
// 2: pages travel with the interprocess fences of the work they may still be under.
// 3: a job's turns may go on a connection of their own (attach_turns).
// 4: end_iteration carries the job's memory as its process measured it (EndIteration).
// 5: turns carry interprocess fences; Welcome carries the GPUs' UUIDs.
// 6: end_iteration carries the job's GPU time as its process measured it.
// 7: a turn connection's records go through shared memory (remote/turn_rings.hpp); its socket
//    carries descriptors and wake-ups.
inline constexpr std::uint16_t kProtocolVersion = 8;
inline constexpr std::size_t kMaxRecordBytes = 32 * 1024;
// Pages per batch: SCM_RIGHTS carries at most 253 descriptors a record (SCM_MAX_FD), and a batch of
// simulated pages carries one per page and one per fence (at most one a page).
inline constexpr std::uint32_t kMaxPagesPerBatch = 120;
inline constexpr std::size_t kMaxDevices = 16;
inline constexpr std::size_t kNameBytes = 64;
inline constexpr std::size_t kMessageBytes = 480;

enum class MessageType : std::uint16_t {
  hello = 1,        // client -> daemon, first: Hello
  welcome,          // reply: Welcome
  add_job,          // AddJob -> JobAdded
  job_added,
  begin_iteration,  // JobCall (timeout_ns < 0: wait as long as it takes) -> Turn
  turn,
  end_iteration,    // EndIteration -> Done
  withdraw,         // JobCall -> Done
  finish_job,       // JobCall (flag: cancelled) -> Done
  take_pages,       // PageCount -> PagesHead, entries, fences (one descriptor per page)
  pages,
  give_pages,       // GiveHead, ids, a fence when fenced -> Done
  reclaim,          // daemon -> client, unasked (seq 0): PageCount it would like back
  status,           // empty -> StatusText
  status_text,
  done,             // empty
  failure,          // Failure: the request was refused
  // The first and only record of a job's turn connection that is not a turn call: AttachTurns ->
  // Done. The connection then carries that job's begin_iteration, end_iteration and withdraw,
  // each answered by salusd's turn loop. Its answer (Done) carries one descriptor: the shared
  // memory the connection's records go through from then on (remote/turn_rings.hpp).
  attach_turns,
  // Empty, on a turn connection's socket only: the receiver slept there, and a record waits for
  // it in shared memory.
  wake,
};
inline constexpr std::uint16_t kLastMessageType = static_cast<std::uint16_t>(MessageType::wake);

[[nodiscard]] std::string_view to_string(MessageType type) noexcept;

struct Header {
  std::uint32_t magic = kMagic;
  std::uint16_t version = kProtocolVersion;
  std::uint16_t type = 0;
  std::uint64_t seq = 0;  // a reply carries its request's; an unasked message 0
  std::uint32_t body_bytes = 0;
  std::uint32_t reserved = 0;
};

struct Hello {
  std::uint32_t pid = 0;  // for the log only: the daemon believes SO_PEERCRED
  std::uint32_t reserved = 0;
  std::array<char, kNameBytes> name{};
};

enum class BackendKind : std::uint32_t { sim = 0, cuda = 1 };

// What a waiting process does with its pages when another one needs them (salusd --spill).
enum class Spill : std::uint32_t { none = 0, host = 1 };

struct Welcome {
  std::uint32_t device_count = 0;
  BackendKind backend = BackendKind::sim;
  std::uint64_t page_bytes = 0;
  Spill spill = Spill::none;
  std::uint32_t reserved = 0;
  std::uint64_t process_limit_bytes = 0;  // 0: none
  std::array<std::uint64_t, kMaxDevices> device_bytes{};
  std::array<char, kNameBytes> policy{};
  // What a turn connection of this process names to join its session (AttachTurns). The token is
  // a secret of the session: another process of the same user cannot guess it.
  std::uint64_t session = 0;
  std::uint64_t token = 0;
  // Each device's UUID as the daemon's driver names it: a process must mean the same GPUs by the
  // same numbers (check_same_devices).
  std::array<std::array<std::uint8_t, 16>, kMaxDevices> device_uuids{};
};

struct AddJob {
  std::array<char, kNameBytes> name{};
  std::uint32_t kind = 0;  // JobKind
  std::int32_t priority = 0;
  std::int32_t device = 0;
  std::uint32_t reserved = 0;
  std::uint64_t expected_iterations = 0;
  std::uint64_t persistent_hint = 0;
  std::uint64_t ephemeral_hint = 0;
  double iteration_seconds_hint = 0.0;
  std::uint64_t limit_total = 0;  // 0: none
};

struct JobAdded {
  std::uint64_t job = 0;  // the daemon's id of the job
};

struct JobCall {
  std::uint64_t job = 0;
  std::int64_t timeout_ns = -1;
  std::uint32_t flag = 0;
  std::uint32_t reserved = 0;
};

// What a job's process measured of its memory (its profile after the iteration), so that the
// daemon's policies plan with it (pack's lanes, memory_aware's offsets): the daemon measures
// nothing itself, each process carving its own blocks. curve_samples 0: no shape (flat at the
// peak); known 0: nothing measured yet.
inline constexpr std::size_t kCurveSamples = 64;
struct MemoryReport {
  std::uint64_t persistent_bytes = 0;
  std::uint64_t ephemeral_peak_bytes = 0;
  double curve_seconds = 0.0;
  std::uint32_t curve_samples = 0;
  std::uint32_t known = 0;
  std::array<std::uint64_t, kCurveSamples> curve{};
};

// GPU work a page may still be under, as it travels: an interprocess event
// (DeviceBackend::export_event). CUDA: its handle bytes; simulated: its descriptor, `fd_index`
// among the record's.
struct FenceEntry {
  std::array<std::byte, 64> handle{};
  std::int32_t fd_index = -1;  // -1: no descriptor (CUDA)
  std::uint32_t reserved = 0;
};

// An iteration's end. `fenced` 1: `fence` is an interprocess event recorded on the job's stream
// after the iteration's work (its descriptor, for simulated events, travels with the record), so
// that the next holder of the turn's lane queues its work after it: the turn is the GPU's too.
// 2 (kSettled): the job's stream had nothing queued, so the lane has nothing to wait for. 0: the
// process says nothing (no interprocess events, or the turn was not used).
inline constexpr std::uint32_t kFenced = 1;
inline constexpr std::uint32_t kSettled = 2;
// `gpu_timed` 1: the process times the job's iterations on the GPU (timing events), and
// `gpu_seconds` is the GPU time of its `gpu_iterations` iterations whose work has finished since
// its previous end; the daemon charges that instead of the host time between begin and end.
struct EndIteration {
  JobCall call;
  MemoryReport memory;
  std::uint32_t fenced = 0;
  std::uint32_t gpu_timed = 0;
  FenceEntry fence;
  std::uint32_t gpu_iterations = 0;
  std::uint32_t reserved = 0;
  double gpu_seconds = 0.0;
};

// A job's turn connection joins its process's session. The daemon also checks that the peer is
// the session's own process (SO_PEERCRED pid), and that the job is the session's.
struct AttachTurns {
  std::uint64_t session = 0;
  std::uint64_t token = 0;
  std::uint64_t job = 0;
};

// A turn granted (or not). `fenced` 1: `fence` is the end of the last iteration another process
// ran in the lane, which has not completed yet: the job's work waits for it before it starts, for
// at most `fence_wait_ms` from the turn's arrival (what is left of the daemon's --fence-wait since
// that end). Past that the work goes on beside the other's: a fence that never completes (a
// crafted one, or a hung process's) stalls its lane's next holder for a bounded time only.
struct Turn {
  std::uint64_t job = 0;
  std::uint32_t admitted = 0;  // 0: the timeout passed first
  std::uint32_t fenced = 0;
  FenceEntry fence;
  std::uint32_t fence_wait_ms = 0;
  std::uint32_t reserved = 0;
};

struct PageCount {
  std::int32_t device = 0;
  std::uint32_t count = 0;
};

// A page id names its device in the top byte (the daemon numbers each device's pages apart).
constexpr std::uint64_t page_id(int device, std::uint64_t serial) {
  return (static_cast<std::uint64_t>(device) << 56) | (serial & ((std::uint64_t{1} << 56) - 1));
}
constexpr int device_of_page(std::uint64_t id) { return static_cast<int>(id >> 56); }

// One page of a Pages message: page `id` lies at `offset` of descriptor `fd_index` of the record;
// `fence`, when not 0, is 1 + the index of the fence (below) of the work it may still be under.
struct PageEntry {
  std::uint64_t id = 0;
  std::uint64_t offset = 0;
  std::uint32_t fd_index = 0;
  std::uint32_t fence = 0;
};

// The head of a Pages message: `count` PageEntry follow, then `fences` FenceEntry.
struct PagesHead {
  std::int32_t device = 0;
  std::uint32_t count = 0;
  std::uint32_t fences = 0;
  std::uint32_t reserved = 0;
};

// What pages given back may still be under.
enum class GiveFence : std::uint32_t {
  settled = 0,    // nothing: the fence they came with has passed too
  fenced = 1,     // the work of the FenceEntry that follows the ids
  untouched = 2,  // never used here: the fence they came with (if any) still holds
};

// The head of a GivePages message: `count` page ids follow, then a FenceEntry when fenced.
struct GiveHead {
  std::int32_t device = 0;
  std::uint32_t count = 0;
  GiveFence fence = GiveFence::settled;
  std::uint32_t reserved = 0;
};

struct Failure {
  std::uint32_t code = 0;  // salus::Errc
  std::uint32_t reserved = 0;
  std::array<char, kMessageBytes> message{};
};

// A protocol violation: what was wrong with a record. The daemon answers it with a Failure or
// drops the client; a client treats it as the daemon's failure.
class ProtocolError : public InvalidArgument {
 public:
  using InvalidArgument::InvalidArgument;
};

// A record as received: its header, its body bytes and the descriptors that came with it.
struct Record {
  Header header;
  std::vector<std::byte> body;
  [[nodiscard]] MessageType type() const { return static_cast<MessageType>(header.type); }
};

// Checks a received record's header against its length: magic, version, a known type, and a body
// of the size its type allows. Throws ProtocolError naming what is wrong.
Header decode_header(std::span<const std::byte> record);

// The body of `record` as T, which must be its exact size (ProtocolError otherwise).
template <class T>
T body_as(const Record& record) {
  static_assert(std::is_trivially_copyable_v<T>);
  T out;
  if (record.body.size() != sizeof(T)) {
    throw ProtocolError(std::string(to_string(record.type())) + ": body of " +
                        std::to_string(record.body.size()) + " bytes, expected " +
                        std::to_string(sizeof(T)));
  }
  std::memcpy(&out, record.body.data(), sizeof(T));
  return out;
}

// A Pages message: checks the counts (at most kMaxPagesPerBatch pages, as many fences), the body's
// size, and that each page's fence names one of the fences; ProtocolError otherwise.
PagesHead pages_body(const Record& record, std::vector<PageEntry>& entries,
                     std::vector<FenceEntry>& fences);
std::vector<std::byte> encode_pages(std::uint64_t seq, const PagesHead& head,
                                    std::span<const PageEntry> entries,
                                    std::span<const FenceEntry> fences);
// A GivePages message: the ids, and `fence` when the head says fenced; ProtocolError for a count
// past the batch limit, an unknown fence mode or a body of the wrong size.
GiveHead give_body(const Record& record, std::vector<std::uint64_t>& ids, FenceEntry& fence);
std::vector<std::byte> give_pages_body(const GiveHead& head, std::span<const std::uint64_t> ids,
                                       const FenceEntry* fence);

// A fixed-size name field as a string: it must hold a NUL (ProtocolError naming `what`).
std::string name_of(std::span<const char> field, std::string_view what);
// Copies `text` into a fixed-size field, cut to fit with its NUL.
void set_name(std::span<char> field, std::string_view text);

// Encodes a record: header (seq, type, body size) and body.
std::vector<std::byte> encode_body(MessageType type, std::uint64_t seq,
                                  std::span<const std::byte> body);
template <class T>
  requires std::is_trivially_copyable_v<T>
std::vector<std::byte> encode(MessageType type, std::uint64_t seq, const T& body) {
  return encode_body(type, seq, std::as_bytes(std::span(&body, 1)));
}
// A Failure for `code` and `message`; and back again, as the typed exception it stands for.
Failure failure_of(Errc code, std::string_view message);

// A job's measured memory on the wire, and back: nullopt when nothing was measured; a report
// whose curve claims more samples than it has room for, or a duration that is not a finite
// non-negative number, is a ProtocolError.
MemoryReport report_of(const MeasuredMemory* measured);
std::optional<MeasuredMemory> measured_of(const MemoryReport& report);
// The GPU time an end reports (nullopt: none, the process times on the host); ProtocolError for
// a time that is not a finite, non-negative number.
std::optional<GpuTime> gpu_time_of(const EndIteration& end);
[[noreturn]] void throw_failure(const Failure& failure, std::string_view call);

}  // namespace salus::remote
