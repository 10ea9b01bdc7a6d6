// Turns: a job's begin_iteration, end_iteration and withdraw, from the session's connection (a
// begin waits on a worker thread) or from the job's own turn connection, which salusd's turn loop
// serves (daemon/turn_loop.hpp): a begin there never waits on a thread; the loop asks again when
// the job's wait changes (RuntimeAccess::on_wake).
//
// One switch between processes: the giver's end reaches the loop (which watches for it when it
// is due), which ends the daemon job's iteration; the next job's turn is noted by its on_wake and
// sent by the loop at once, before the ended iteration's bookkeeping, to the next process, which
// watches for it when it is due. No thread is woken through the kernel on that path.
#include "daemon/coordinator.hpp"
#include "daemon/session.hpp"

#include <fcntl.h>
#include <sys/stat.h>

#include <algorithm>
#include <limits>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "iteration_sched/runtime_access.hpp"

namespace salus::daemon {

using remote::MessageType;

std::pair<remote::Turn, remote::UniqueFd> Coordinator::take_turn(Session& s, Job& job,
                                                                   const remote::JobCall& call) {
  std::optional<StreamHandle> lane;
  if (call.timeout_ns < 0) {
    lane = job.begin_iteration();
  } else {
    lane = job.try_begin_iteration(std::chrono::nanoseconds(call.timeout_ns));
  }
  return granted(s, job, call, lane);
}

std::pair<remote::Turn, remote::UniqueFd> Coordinator::granted(
    Session& s, Job& job, const remote::JobCall& call, std::optional<StreamHandle> lane) {
  remote::Turn turn{call.job, lane ? 1u : 0u, 0, {}};
  remote::UniqueFd fd;
  if (!lane) return {turn, std::move(fd)};
  {
    std::lock_guard lock(mu_);
    s.in_turn.insert(&job);  // its process may give pages back at the turn's end
  }
  // The lane's last iteration, if another process ran it: this one's work goes after it.
  const std::shared_ptr<const PageBank::Fence> fence = turn_fences_.began(&job, lane->value, s.id);
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

std::optional<std::chrono::milliseconds> Coordinator::fence_wait_left(
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
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(
      fence.given_at + options_.fence_wait - std::chrono::steady_clock::now());
  if (left.count() > 0) return left;
  spdlog::warn("job '{}': the last iteration of its lane (session {}) has not completed in {} ms: "
               "the turn goes without waiting for it",
               job.name(), fence.from, options_.fence_wait.count());
  return std::nullopt;
}

std::shared_ptr<PageBank::Fence> Coordinator::end_fence(const Session& s,
                                                        remote::Received& received) {
  const auto end = remote::body_as<remote::EndIteration>(received.record);
  const bool with_fd = end.fenced == remote::kFenced && end.fence.fd_index >= 0;
  if (received.fds.size() != (with_fd ? 1u : 0u) || (with_fd && end.fence.fd_index != 0)) {
    throw remote::ProtocolError(fmt::format(
        "an end_iteration carried {} descriptors, its fence {}", received.fds.size(),
        with_fd ? "one (index 0)" : "none"));
  }
  if (end.fenced != remote::kFenced) return nullptr;
  auto fence = std::make_shared<PageBank::Fence>();
  fence->entry = end.fence;
  fence->from = s.id;
  if (with_fd) fence->fd = std::move(received.fds.front());
  return fence;
}

void Coordinator::check_turn_fence(Session& s, Job& job, PageBank::Fence& fence) {
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
    if (const auto it = s.checked_fences.find(key); it != s.checked_fences.end()) {
      fence.opened = it->second;  // the same event, recorded again: it says how that record is
      return;
    }
  }
  fence.opened = check_fence(job.stats().device, fence, "end_iteration");
  std::lock_guard lock(mu_);
  if (s.checked_fences.size() >= 256) s.checked_fences.clear();  // a pool is a few events
  s.checked_fences.emplace(std::move(key), fence.opened);
}

std::optional<MeasuredMemory> Coordinator::planned_memory(const remote::Record& end) const {
  auto measured = remote::measured_of(remote::body_as<remote::EndIteration>(end).memory);
  if (options_.spill != remote::Spill::none) return std::nullopt;
  return measured;
}

Coordinator::EndReport Coordinator::end_report(const remote::Record& end) const {
  return {planned_memory(end), remote::gpu_time_of(remote::body_as<remote::EndIteration>(end))};
}

void Coordinator::give_turn(Session& s, Job& job, MessageType type, const EndReport& report,
                            std::shared_ptr<const PageBank::Fence> fence, bool settled,
                            const std::function<void()>& between) {
  {
    std::lock_guard lock(mu_);
    s.in_turn.erase(&job);
  }
  // Before the end: it wakes the lane's next job, whose turn carries the fence.
  turn_fences_.ended(&job, std::move(fence), settled);
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

void Coordinator::on_begin(const std::shared_ptr<Session>& s, const remote::Record& record) {
  const auto call = remote::body_as<remote::JobCall>(record);
  std::shared_ptr<Job> job = job_of(*s, call.job);
  const std::uint64_t seq = record.header.seq;
  s->spawn([this, s, job, call, seq] {
    try {
      const auto [turn, fd] = take_turn(*s, *job, call);
      const int fds[1] = {fd.get()};
      reply(*s, MessageType::turn, seq, std::as_bytes(std::span(&turn, 1)),
            std::span(fds, fd.get() >= 0 ? 1 : 0));
    } catch (const std::exception& e) {
      fail(*s, seq, e);
    }
  });
}

Coordinator::TurnLink Coordinator::attach_turns(const remote::PeerCredentials& peer,
                                                const remote::Record& attach,
                                                std::function<void()> hang_up) {
  const auto a = remote::body_as<remote::AttachTurns>(attach);
  std::lock_guard lock(mu_);
  auto it = sessions_.find(a.session);
  // One answer for every wrong session: which sessions exist is none of the asker's business.
  if (it == sessions_.end() || it->second->token != a.token || it->second->closing) {
    throw InvalidArgument(fmt::format("attach_turns: no open session {} with that token",
                                      a.session));
  }
  const std::shared_ptr<Session>& s = it->second;
  if (peer.pid != s->peer.pid || peer.uid != s->peer.uid) {
    throw InvalidArgument(fmt::format("attach_turns: session {} is pid {}'s, not pid {}'s", s->id,
                                      s->peer.pid, peer.pid));
  }
  auto job = s->jobs.find(a.job);
  if (job == s->jobs.end()) throw UnknownJob(JobId{static_cast<std::uint32_t>(a.job)});
  s->hang_ups.push_back(std::move(hang_up));
  return TurnLink{s, job->second, a.job};
}

namespace {

Coordinator::Reply failure_reply(std::uint64_t seq, const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  return {remote::encode(MessageType::failure, seq,
                         remote::failure_of(error != nullptr ? error->code() : Errc::device_error,
                                            e.what())),
          {}};
}

}  // namespace

Coordinator::TurnResult Coordinator::turn_call(const TurnLink& link, remote::Received& received,
                                               const std::function<void()>& between) {
  const remote::Record& record = received.record;
  const MessageType type = record.type();
  if (type != MessageType::begin_iteration && type != MessageType::end_iteration &&
      type != MessageType::withdraw) {
    throw remote::ProtocolError(
        fmt::format("a turn connection may not carry {}", to_string(type)));
  }
  const bool end = type == MessageType::end_iteration;
  const auto call = end ? remote::body_as<remote::EndIteration>(record).call
                        : remote::body_as<remote::JobCall>(record);
  if (call.job != link.job_id) {
    throw remote::ProtocolError(fmt::format("the turn connection of job {} named job {}",
                                            link.job_id, call.job));
  }
  if (!end && !received.fds.empty()) {
    throw remote::ProtocolError(fmt::format("a turn connection's {} carried {} descriptors",
                                            to_string(type), received.fds.size()));
  }
  const std::uint64_t seq = record.header.seq;
  if (type == MessageType::begin_iteration) {
    WaitingTurn waiting{seq, call, std::nullopt};
    if (call.timeout_ns >= 0) {
      const auto now = std::chrono::steady_clock::now();
      const auto left = std::chrono::nanoseconds(call.timeout_ns);
      // A deadline past the clock's range waits as long as an untimed begin.
      if (left < std::chrono::steady_clock::time_point::max() - now) {
        waiting.deadline = now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(left);
      }
    }
    std::optional<Reply> reply = retry_turn(link, waiting);
    if (reply) return {std::move(reply), std::nullopt};
    return {std::nullopt, waiting};
  }
  std::shared_ptr<PageBank::Fence> fence = end ? end_fence(*link.session, received) : nullptr;
  const bool settled =
      end && remote::body_as<remote::EndIteration>(record).fenced == remote::kSettled;
  // A malformed report is the connection's end (a ProtocolError), as a malformed record is.
  const EndReport report = end ? end_report(record) : EndReport{};
  try {
    if (fence) check_turn_fence(*link.session, *link.job, *fence);  // the turn stays its own
    give_turn(*link.session, *link.job, type, report, std::move(fence), settled, between);
    return {Reply{remote::encode_body(MessageType::done, seq, {}), {}}, std::nullopt};
  } catch (const std::exception& e) {
    return {failure_reply(seq, e), std::nullopt};
  }
}

std::optional<Coordinator::Reply> Coordinator::retry_turn(const TurnLink& link,
                                                          const WaitingTurn& waiting) {
  try {
    // Asks without waiting: a job whose turn is not there yet stays in its place in the queue.
    const std::optional<StreamHandle> lane = link.job->try_begin_iteration({});
    const bool expired = waiting.deadline && std::chrono::steady_clock::now() >= *waiting.deadline;
    if (!lane && !expired) return std::nullopt;
    auto [turn, fd] = granted(*link.session, *link.job, waiting.call, lane);
    Reply out{remote::encode(MessageType::turn, waiting.seq, turn), {}};
    if (fd.get() >= 0) out.fds.push_back(std::move(fd));
    return out;
  } catch (const std::exception& e) {
    return failure_reply(waiting.seq, e);
  }
}

}  // namespace salus::daemon
