#include "remote/protocol.hpp"

#include <fmt/format.h>

#include <algorithm>

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
    case MessageType::end_iteration:
    case MessageType::withdraw:
    case MessageType::finish_job:
      return {sizeof(JobCall)};
    case MessageType::turn:
      return {sizeof(Turn)};
    case MessageType::take_pages:
    case MessageType::reclaim:
      return {sizeof(PageCount)};
    case MessageType::pages:
      return {sizeof(PageCount), sizeof(PageEntry)};
    case MessageType::give_pages:
      return {sizeof(PageCount), sizeof(std::uint64_t)};
    case MessageType::status:
    case MessageType::done:
      return {0};
    case MessageType::status_text:
      return {0, 1};
    case MessageType::failure:
      return {sizeof(Failure)};
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

template <class T, class E>
T list_body(const Record& record, std::vector<E>& entries) {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_copyable_v<E>);
  if (record.body.size() < sizeof(T)) {
    throw ProtocolError(fmt::format("{}: body of {} bytes is shorter than its head",
                                    to_string(record.type()), record.body.size()));
  }
  T head;
  std::memcpy(&head, record.body.data(), sizeof(T));
  const std::size_t rest = record.body.size() - sizeof(T);
  if (head.count > kMaxPagesPerBatch || rest != std::size_t{head.count} * sizeof(E)) {
    throw ProtocolError(fmt::format("{}: {} entries in {} bytes (at most {} a batch)",
                                    to_string(record.type()), head.count, rest,
                                    kMaxPagesPerBatch));
  }
  entries.resize(head.count);
  if (head.count > 0) std::memcpy(entries.data(), record.body.data() + sizeof(T), rest);
  return head;
}

template PageCount list_body<PageCount, PageEntry>(const Record&, std::vector<PageEntry>&);
template PageCount list_body<PageCount, std::uint64_t>(const Record&, std::vector<std::uint64_t>&);

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
