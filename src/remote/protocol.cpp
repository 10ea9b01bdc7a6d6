#include "remote/protocol.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

namespace salus::remote {
namespace {

// The body sizes a type allows: exactly `fixed`, or `fixed` plus a multiple of `entry`.
struct BodyShape {
  std::size_t fixed = 0;
  std::size_t entry = 0;  // 0: no list
};

BodyShape shape_of(MessageType type) {
  switch (type) {
    case MessageType::hello:
      return {sizeof(Hello)};
    case MessageType::welcome:
      return {sizeof(Welcome)};
    case MessageType::add_job:
      return {sizeof(AddJob)};
    case MessageType::job_added:
      return {sizeof(JobAdded)};
    case MessageType::begin_iteration:
    case MessageType::withdraw:
    case MessageType::finish_job:
      return {sizeof(JobCall)};
    case MessageType::end_iteration:
      return {sizeof(EndIteration)};
    case MessageType::turn:
      return {sizeof(Turn)};
    case MessageType::take_pages:
    case MessageType::reclaim:
      return {sizeof(PageCount)};
    case MessageType::pages:
      return {sizeof(PagesHead), 1};  // two lists: pages_body checks the rest
    case MessageType::give_pages:
      return {sizeof(GiveHead), 1};  // ids and a fence: give_body checks the rest
    case MessageType::status:
    case MessageType::done:
    case MessageType::wake:
      return {0};
    case MessageType::status_text:
      return {0, 1};
    case MessageType::failure:
      return {sizeof(Failure)};
    case MessageType::attach_turns:
      return {sizeof(AttachTurns)};
  }
  return {};
}

}  // namespace

std::string_view to_string(MessageType type) noexcept {
  switch (type) {
    case MessageType::hello: return "hello";
    case MessageType::welcome: return "welcome";
    case MessageType::add_job: return "add_job";
    case MessageType::job_added: return "job_added";
    case MessageType::begin_iteration: return "begin_iteration";
    case MessageType::turn: return "turn";
    case MessageType::end_iteration: return "end_iteration";
    case MessageType::withdraw: return "withdraw";
    case MessageType::finish_job: return "finish_job";
    case MessageType::take_pages: return "take_pages";
    case MessageType::pages: return "pages";
    case MessageType::give_pages: return "give_pages";
    case MessageType::reclaim: return "reclaim";
    case MessageType::status: return "status";
    case MessageType::status_text: return "status_text";
    case MessageType::done: return "done";
    case MessageType::failure: return "failure";
    case MessageType::attach_turns: return "attach_turns";
    case MessageType::wake: return "wake";
  }
  return "unknown";
}

Header decode_header(std::span<const std::byte> record) {
  Header h;
  if (record.size() < sizeof(Header)) {
    throw ProtocolError(fmt::format("a record of {} bytes is shorter than a header ({} bytes)",
                                    record.size(), sizeof(Header)));
  }
  std::memcpy(&h, record.data(), sizeof(Header));
  if (h.magic != kMagic) throw ProtocolError(fmt::format("bad magic {:#x}", h.magic));
  if (h.version != kProtocolVersion) {
    throw ProtocolError(fmt::format("protocol version {} (this side speaks {})", h.version,
                                    kProtocolVersion));
  }
  if (h.type == 0 || h.type > kLastMessageType) {
    throw ProtocolError(fmt::format("unknown message type {}", h.type));
  }
  const std::size_t body = record.size() - sizeof(Header);
  if (h.body_bytes != body) {
    throw ProtocolError(fmt::format("header says {} body bytes, the record has {}", h.body_bytes,
                                    body));
  }
  const auto type = static_cast<MessageType>(h.type);
  const BodyShape shape = shape_of(type);
  const bool fits = shape.entry == 0 ? body == shape.fixed
                                     : body >= shape.fixed && (body - shape.fixed) % shape.entry == 0;
  if (!fits) {
    throw ProtocolError(
        fmt::format("{}: a body of {} bytes does not fit its type", to_string(type), body));
  }
  return h;
}

namespace {

template <class T>
T head_of(const Record& record) {
  if (record.body.size() < sizeof(T)) {
    throw ProtocolError(fmt::format("{}: body of {} bytes is shorter than its head",
                                    to_string(record.type()), record.body.size()));
  }
  T head;
  std::memcpy(&head, record.body.data(), sizeof(T));
  return head;
}

template <class E>
void copy_out(const Record& record, std::size_t at, std::size_t n, std::vector<E>& out) {
  out.resize(n);
  if (n > 0) std::memcpy(out.data(), record.body.data() + at, n * sizeof(E));
}

template <class T>
void append(std::vector<std::byte>& body, std::span<const T> items) {
  const auto bytes = std::as_bytes(items);
  body.insert(body.end(), bytes.begin(), bytes.end());
}

}  // namespace

PagesHead pages_body(const Record& record, std::vector<PageEntry>& entries,
                     std::vector<FenceEntry>& fences) {
  const auto head = head_of<PagesHead>(record);
  const std::size_t rest = record.body.size() - sizeof(PagesHead);
  if (head.count > kMaxPagesPerBatch || head.fences > head.count ||
      rest != std::size_t{head.count} * sizeof(PageEntry) +
                  std::size_t{head.fences} * sizeof(FenceEntry)) {
    throw ProtocolError(fmt::format("pages: {} pages and {} fences in {} bytes (at most {} a "
                                    "batch, no more fences than pages)",
                                    head.count, head.fences, rest, kMaxPagesPerBatch));
  }
  copy_out(record, sizeof(PagesHead), head.count, entries);
  copy_out(record, sizeof(PagesHead) + head.count * sizeof(PageEntry), head.fences, fences);
  for (const PageEntry& e : entries) {
    if (e.fence > head.fences) {
      throw ProtocolError(
          fmt::format("pages: page {} names fence {} of {}", e.id, e.fence, head.fences));
    }
  }
  return head;
}

std::vector<std::byte> encode_pages(std::uint64_t seq, const PagesHead& head,
                                    std::span<const PageEntry> entries,
                                    std::span<const FenceEntry> fences) {
  std::vector<std::byte> body(sizeof(PagesHead));
  std::memcpy(body.data(), &head, sizeof(PagesHead));
  append(body, entries);
  append(body, fences);
  return encode_body(MessageType::pages, seq, body);
}

GiveHead give_body(const Record& record, std::vector<std::uint64_t>& ids, FenceEntry& fence) {
  const auto head = head_of<GiveHead>(record);
  const std::size_t rest = record.body.size() - sizeof(GiveHead);
  if (head.fence != GiveFence::settled && head.fence != GiveFence::fenced &&
      head.fence != GiveFence::untouched) {
    throw ProtocolError(fmt::format("give_pages: unknown fence mode {}",
                                    static_cast<std::uint32_t>(head.fence)));
  }
  const std::size_t fence_bytes = head.fence == GiveFence::fenced ? sizeof(FenceEntry) : 0;
  if (head.count > kMaxPagesPerBatch ||
      rest != std::size_t{head.count} * sizeof(std::uint64_t) + fence_bytes) {
    throw ProtocolError(fmt::format("give_pages: {} ids in {} bytes (at most {} a batch)",
                                    head.count, rest, kMaxPagesPerBatch));
  }
  copy_out(record, sizeof(GiveHead), head.count, ids);
  if (fence_bytes != 0) {
    std::memcpy(&fence, record.body.data() + sizeof(GiveHead) + head.count * sizeof(std::uint64_t),
                sizeof(FenceEntry));
  }
  return head;
}

std::vector<std::byte> give_pages_body(const GiveHead& head, std::span<const std::uint64_t> ids,
                                       const FenceEntry* fence) {
  std::vector<std::byte> body(sizeof(GiveHead));
  std::memcpy(body.data(), &head, sizeof(GiveHead));
  append(body, ids);
  if (fence != nullptr) append(body, std::span(fence, 1));
  return body;
}

std::string name_of(std::span<const char> field, std::string_view what) {
  const auto end = std::find(field.begin(), field.end(), '\0');
  if (end == field.end()) {
    throw ProtocolError(fmt::format("{}: no terminating NUL in {} bytes", what, field.size()));
  }
  return std::string(field.begin(), end);
}

void set_name(std::span<char> field, std::string_view text) {
  std::fill(field.begin(), field.end(), '\0');
  const std::size_t n = std::min(text.size(), field.size() - 1);
  std::copy_n(text.begin(), n, field.begin());
}

std::vector<std::byte> encode_body(MessageType type, std::uint64_t seq,
                                   std::span<const std::byte> body) {
  Header h;
  h.type = static_cast<std::uint16_t>(type);
  h.seq = seq;
  h.body_bytes = static_cast<std::uint32_t>(body.size());
  std::vector<std::byte> out(sizeof(Header) + body.size());
  std::memcpy(out.data(), &h, sizeof(Header));
  if (!body.empty()) std::memcpy(out.data() + sizeof(Header), body.data(), body.size());
  return out;
}

MemoryReport report_of(const MeasuredMemory* measured) {
  MemoryReport r;
  if (measured == nullptr) return r;
  r.known = 1;
  r.persistent_bytes = measured->persistent_bytes;
  r.ephemeral_peak_bytes = measured->ephemeral_peak_bytes;
  r.curve_seconds = measured->curve.duration_seconds;
  // Both ends sample kCurveSamples buckets; a longer curve keeps its highest level per bucket.
  const auto& bytes = measured->curve.bytes;
  const std::size_t n = std::min(bytes.size(), kCurveSamples);
  r.curve_samples = static_cast<std::uint32_t>(n);
  for (std::size_t i = 0; i < bytes.size(); ++i) {
    const std::size_t b = i * n / bytes.size();
    r.curve[b] = std::max<std::uint64_t>(r.curve[b], bytes[i]);
  }
  return r;
}

std::optional<MeasuredMemory> measured_of(const MemoryReport& report) {
  if (report.known == 0) return std::nullopt;
  if (report.curve_samples > kCurveSamples) {
    throw ProtocolError(fmt::format("a memory report of {} curve samples (at most {})",
                                    report.curve_samples, kCurveSamples));
  }
  if (!std::isfinite(report.curve_seconds) || report.curve_seconds < 0.0) {
    throw ProtocolError(fmt::format("a memory report's curve lasts {} s", report.curve_seconds));
  }
  MeasuredMemory m;
  m.persistent_bytes = report.persistent_bytes;
  m.ephemeral_peak_bytes = report.ephemeral_peak_bytes;
  m.curve.duration_seconds = report.curve_seconds;
  m.curve.bytes.assign(report.curve.begin(), report.curve.begin() + report.curve_samples);
  return m;
}

std::optional<GpuTime> gpu_time_of(const EndIteration& end) {
  if (end.gpu_timed == 0) return std::nullopt;
  if (!std::isfinite(end.gpu_seconds) || end.gpu_seconds < 0.0) {
    throw ProtocolError(fmt::format("an end_iteration reports {} s of GPU time", end.gpu_seconds));
  }
  return GpuTime{end.gpu_seconds, end.gpu_iterations};
}

Failure failure_of(Errc code, std::string_view message) {
  Failure f;
  f.code = static_cast<std::uint32_t>(code);
  set_name(f.message, message);
  return f;
}

void throw_failure(const Failure& failure, std::string_view call) {
  std::string message = name_of(failure.message, "failure message");
  const std::string text = fmt::format("salusd refused {}: {}", call, message);
  switch (static_cast<Errc>(failure.code)) {
    case Errc::invalid_argument:
      throw InvalidArgument(text);
    case Errc::not_supported:
      throw NotSupported(text);
    case Errc::cancelled:
      throw Error(Errc::cancelled, text);
    case Errc::unknown_job:
      throw Error(Errc::unknown_job, text);
    case Errc::out_of_memory:
      throw Error(Errc::out_of_memory, text);
    case Errc::device_error:
      break;
  }
  throw DeviceError("salusd", "SALUSD_FAILURE", 0, text);
}

}  // namespace salus::remote
