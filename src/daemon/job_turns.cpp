// One switch between processes: the giver's end reaches the turn loop (which watches for it when
// it is due), which ends the daemon job's iteration; the next job's turn is noted by its on_wake
// and sent by the loop at once, before the ended iteration's bookkeeping, to the next process,
// which watches for it when it is due. No thread is woken through the kernel on that path.
#include "daemon/job_turns.hpp"

#include <fcntl.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>

#include "iteration_sched/runtime_access.hpp"

namespace salus::daemon {

using remote::MessageType;

namespace {

JobTurns::Reply failure_reply(std::uint64_t seq, const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  return {remote::encode(
              MessageType::failure, seq,
              remote::failure_of(error != nullptr ? error->code() : Errc::device_error, e.what())),
          {}};
}

// A begin's wait: when it stops waiting (its timeout), or never.
std::optional<std::chrono::steady_clock::time_point> deadline_of(const remote::JobCall& call) {
  if (call.timeout_ns < 0) return std::nullopt;
  const auto now = std::chrono::steady_clock::now();
  const auto left = std::chrono::nanoseconds(call.timeout_ns);
  // A deadline past the clock's range waits as long as an untimed begin.
  if (left >= std::chrono::steady_clock::time_point::max() - now) return std::nullopt;
  return now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
}

}  // namespace

std::shared_ptr<const Event> check_fence(const std::shared_ptr<DeviceBackend>& backend, int device,
                                         const PageBank::Fence& fence, std::string_view what) {
  // The pages' next holder imports the fence and waits for it. What it cannot import would fail
  // that process, not this one's sender; a file its sender could still shrink would crash it
  // (SIGBUS). So a fence goes on only once it opened here.
  SharedEvent shared;
  shared.fd = fence.fd.get();
  shared.handle = fence.entry.handle;
  EventHandle opened;
  try {
    opened = backend->import_event(device, shared);
  } catch (const Error& e) {
    throw InvalidArgument(fmt::format(
        "{}: its fence is no event of device {} that another process could wait for, so it is "
        "refused{}: {}",
        what, device, what == "give_pages" ? " and the pages stay this process's" : "", e.what()));
  }
  return std::make_shared<const Event>(backend, opened);
}

JobTurns::JobTurns(std::shared_ptr<DeviceBackend> backend, PageLedger& pages,
                   std::chrono::milliseconds fence_wait, remote::Spill spill)
    : backend_(std::move(backend)), pages_(pages), fence_wait_(fence_wait), spill_(spill) {}

void JobTurns::open(SessionId session) {
  std::lock_guard lock(mu_);
  checked_[session];
}

void JobTurns::forget(SessionId session) {
  {
    std::lock_guard lock(mu_);
    checked_.erase(session);
  }
  fences_.forget(session);  // after mu_: a leaf lock of its own
}

JobTurns::Granted JobTurns::begin(SessionId session, Job& job, const remote::JobCall& call) {
  std::optional<StreamHandle> lane;
  if (call.timeout_ns < 0) {
    lane = job.begin_iteration();
  } else {
    lane = job.try_begin_iteration(std::chrono::nanoseconds(call.timeout_ns));
  }
  return granted(session, job, call, lane);
}

JobTurns::Granted JobTurns::granted(SessionId session, Job& job, const remote::JobCall& call,
                                    std::optional<StreamHandle> lane) {
  remote::Turn turn{call.job, lane ? 1u : 0u, 0, {}};
  remote::UniqueFd fd;
  if (!lane) return {turn, std::move(fd)};
  pages_.turn_began(session, &job);  // its process may give pages back at the turn's end
  // The lane's last iteration, if another process ran it: this one's work goes after it.
  const std::shared_ptr<const PageBank::Fence> fence = fences_.began(&job, lane->value, session);
  if (!fence) return {turn, std::move(fd)};
  const std::optional<std::chrono::milliseconds> wait = fence_wait_left(job, *fence);
  if (!wait) return {turn, std::move(fd)};
  turn.fenced = 1;
  turn.fence = fence->entry;
  turn.fence.fd_index = -1;
  turn.fence_wait_ms = static_cast<std::uint32_t>(
      std::min<std::int64_t>(wait->count(), std::numeric_limits<std::uint32_t>::max()));
  if (fence->fd.get() >= 0) {
    fd = remote::UniqueFd(::fcntl(fence->fd.get(), F_DUPFD_CLOEXEC, 0));
    if (fd.get() < 0) {
      // Without its descriptor the fence cannot travel: the turn goes without it (the next
      // process may then overlap the tail of the last one's work, as before fences).
      spdlog::warn("job '{}': a turn fence's descriptor could not be duplicated", job.name());
      turn.fenced = 0;
    } else {
      turn.fence.fd_index = 0;
    }
  }
  return {turn, std::move(fd)};
}

std::optional<std::chrono::milliseconds> JobTurns::fence_wait_left(
    const Job& job, const PageBank::Fence& fence) const {
  bool completed = false;
  if (fence.opened) {
    try {
      completed = fence.opened->query();
    } catch (const Error& e) {
      // Its process has gone, and its work with it (forget drops its fences soon after).
      spdlog::debug("job '{}': a turn fence could not be asked, taken as passed: {}", job.name(),
                    e.what());
      completed = true;
    }
  }
  if (completed) return std::nullopt;
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(fence.given_at + fence_wait_ -
                                                                 std::chrono::steady_clock::now());
  if (left.count() > 0) return left;
  spdlog::warn(
      "job '{}': the last iteration of its lane (session {}) has not completed in {} ms: "
      "the turn goes without waiting for it",
      job.name(), fence.from, fence_wait_.count());
  return std::nullopt;
}

std::shared_ptr<PageBank::Fence> JobTurns::end_fence(SessionId session,
                                                     remote::Received& received) {
  const auto end = remote::body_as<remote::EndIteration>(received.record);
  const bool with_fd = end.fenced == remote::kFenced && end.fence.fd_index >= 0;
  if (received.fds.size() != (with_fd ? 1u : 0u) || (with_fd && end.fence.fd_index != 0)) {
    throw remote::ProtocolError(fmt::format("an end_iteration carried {} descriptors, its fence {}",
                                            received.fds.size(),
                                            with_fd ? "one (index 0)" : "none"));
  }
  if (end.fenced != remote::kFenced) return nullptr;
  auto fence = std::make_shared<PageBank::Fence>();
  fence->entry = end.fence;
  fence->from = session;
  if (with_fd) fence->fd = std::move(received.fds.front());
  return fence;
}

void JobTurns::check_turn_fence(SessionId session, Job& job, PageBank::Fence& fence) {
  fence.given_at = std::chrono::steady_clock::now();
  // Identity: the file (its seals cannot change once sealed) or the handle's bytes.
  std::string key(reinterpret_cast<const char*>(fence.entry.handle.data()),
                  fence.entry.handle.size());
  if (fence.fd.get() >= 0) {
    struct stat st {};
    if (::fstat(fence.fd.get(), &st) == 0) key = fmt::format("file {}:{}", st.st_dev, st.st_ino);
  }
  {
    std::lock_guard lock(mu_);
    const auto process = checked_.find(session);
    if (process != checked_.end()) {
      if (const auto it = process->second.find(key); it != process->second.end()) {
        fence.opened = it->second;  // the same event, recorded again: it says how that record is
        return;
      }
    }
  }
  fence.opened = check_fence(backend_, job.stats().device, fence, "end_iteration");
  std::lock_guard lock(mu_);
  const auto process = checked_.find(session);
  if (process == checked_.end()) return;  // gone meanwhile: nothing to cache it for
  if (process->second.size() >= 256) process->second.clear();  // a pool is a few events
  process->second.emplace(std::move(key), fence.opened);
}

JobTurns::EndReport JobTurns::end_report(const remote::Record& end) const {
  const auto body = remote::body_as<remote::EndIteration>(end);
  auto measured = remote::measured_of(body.memory);
  if (spill_ != remote::Spill::none) measured = std::nullopt;
  return {measured, remote::gpu_time_of(body)};
}

void JobTurns::give_turn(SessionId session, Job& job, MessageType type, const EndReport& report,
                         std::shared_ptr<const PageBank::Fence> fence, bool settled,
                         const std::function<void()>& between) {
  pages_.turn_ended(session, &job);
  // Before the end: it wakes the lane's next job, whose turn carries the fence.
  fences_.ended(&job, std::move(fence), settled);
  if (type == MessageType::end_iteration) {
    // First, so that the decisions end_iteration makes plan with it.
    if (const auto& measured = report.memory) {
      spdlog::debug("job '{}': persistent {} bytes, ephemeral peak {} bytes", job.name(),
                    measured->persistent_bytes, measured->ephemeral_peak_bytes);
      RuntimeAccess::report_memory(job, *measured);
    }
    // The GPU's time, not the host's between begin and end: the work a process queues runs on
    // after its turn has gone back.
    if (const auto& gpu = report.gpu) {
      spdlog::debug("job '{}': {} iteration(s) took {:.6f} s of GPU time", job.name(),
                    gpu->iterations, gpu->seconds);
      RuntimeAccess::report_gpu_time(job, *gpu);
    }
    RuntimeAccess::end_iteration(job, between);
  } else {
    job.withdraw();
    if (between) between();
  }
}

void JobTurns::end(SessionId session, Job& job, const remote::Record& record) {
  // On the session's connection an end carries no fence (descriptors travel with give_pages
  // only there): the lane's next turn has nothing to wait for.
  const bool end = record.type() == MessageType::end_iteration;
  give_turn(session, job, record.type(), end ? end_report(record) : EndReport{}, nullptr, false);
}

JobTurns::TurnResult JobTurns::call(SessionId session, Job& job, std::uint64_t job_id,
                                    remote::Received& received,
                                    const std::function<void()>& between) {
  const remote::Record& record = received.record;
  const MessageType type = record.type();
  if (type != MessageType::begin_iteration && type != MessageType::end_iteration &&
      type != MessageType::withdraw) {
    throw remote::ProtocolError(fmt::format("a turn connection may not carry {}", to_string(type)));
  }
  const bool end = type == MessageType::end_iteration;
  const auto call = end ? remote::body_as<remote::EndIteration>(record).call
                        : remote::body_as<remote::JobCall>(record);
  if (call.job != job_id) {
    throw remote::ProtocolError(
        fmt::format("the turn connection of job {} named job {}", job_id, call.job));
  }
  if (!end && !received.fds.empty()) {
    throw remote::ProtocolError(fmt::format("a turn connection's {} carried {} descriptors",
                                            to_string(type), received.fds.size()));
  }
  const std::uint64_t seq = record.header.seq;
  if (type == MessageType::begin_iteration) {
    const WaitingTurn waiting{seq, call, deadline_of(call)};
    std::optional<Reply> reply = try_turn(session, job, waiting);
    if (reply) return {std::move(reply), std::nullopt};
    return {std::nullopt, waiting};
  }
  std::shared_ptr<PageBank::Fence> fence = end ? end_fence(session, received) : nullptr;
  const bool settled =
      end && remote::body_as<remote::EndIteration>(record).fenced == remote::kSettled;
  // A malformed report is the connection's end (a ProtocolError), as a malformed record is.
  const EndReport report = end ? end_report(record) : EndReport{};
  try {
    if (fence) check_turn_fence(session, job, *fence);  // the turn stays its own
    give_turn(session, job, type, report, std::move(fence), settled, between);
    return {Reply{remote::encode_body(MessageType::done, seq, {}), {}}, std::nullopt};
  } catch (const std::exception& e) {
    return {failure_reply(seq, e), std::nullopt};
  }
}

std::optional<JobTurns::Reply> JobTurns::retry(SessionId session, Job& job,
                                               const WaitingTurn& waiting) {
  return try_turn(session, job, waiting);
}

std::optional<JobTurns::Reply> JobTurns::try_turn(SessionId session, Job& job,
                                                  const WaitingTurn& waiting) {
  try {
    // Asks without waiting: a job whose turn is not there yet stays in its place in the queue.
    const std::optional<StreamHandle> lane = job.try_begin_iteration({});
    const bool expired = waiting.deadline && std::chrono::steady_clock::now() >= *waiting.deadline;
    if (!lane && !expired) return std::nullopt;
    auto [turn, fd] = granted(session, job, waiting.call, lane);
    Reply out{remote::encode(MessageType::turn, waiting.seq, turn), {}};
    if (fd.get() >= 0) out.fds.push_back(std::move(fd));
    return out;
  } catch (const std::exception& e) {
    return failure_reply(waiting.seq, e);
  }
}

}  // namespace salus::daemon
