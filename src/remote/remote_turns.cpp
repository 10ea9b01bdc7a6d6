#include "remote/remote_turns.hpp"

#include <fmt/format.h>

#include <algorithm>

namespace salus::remote {

TurnConnection::TurnConnection(const DaemonLink& link, std::uint64_t daemon_job)
    : path_(link.socket_path()), channel_(connect_to(path_)) {
  const AttachTurns attach{link.welcome().session, link.welcome().token, daemon_job};
  const std::uint64_t seq = next_seq_++;
  (void)exchange(encode(MessageType::attach_turns, seq, attach), "attach_turns", seq);
}

Received TurnConnection::call(MessageType type, const JobCall& body) {
  std::lock_guard lock(mu_);
  const std::uint64_t seq = next_seq_++;
  return exchange(encode(type, seq, body), to_string(type), seq);
}

Received TurnConnection::call(MessageType type, const EndIteration& body) {
  std::lock_guard lock(mu_);
  const std::uint64_t seq = next_seq_++;
  return exchange(encode(type, seq, body), to_string(type), seq);
}

Received TurnConnection::exchange(std::span<const std::byte> record, std::string_view what,
                                  std::uint64_t seq) {
  std::optional<Received> reply;
  try {
    channel_.send(record);
    reply = channel_.receive();
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
  if (!reply) throw salusd_gone(path_, "its connection closed");
  // One call at a time on this socket: another answer than this call's is a daemon's bug.
  if (reply->record.header.seq != seq) {
    throw ProtocolError(fmt::format("{}: the answer is to call {}, not to this call ({})", what,
                                    reply->record.header.seq, seq));
  }
  if (reply->record.type() == MessageType::failure) {
    throw_failure(body_as<Failure>(reply->record), what);
  }
  return std::move(*reply);
}

void RemoteTurns::add(JobId job, const JobSpec& spec) {
  AddJob body;
  set_name(body.name, spec.name);
  body.kind = static_cast<std::uint32_t>(spec.kind);
  body.priority = spec.priority;
  body.device = spec.device;
  body.expected_iterations = spec.expected_iterations;
  body.persistent_hint = spec.hints.persistent_bytes;
  body.ephemeral_hint = spec.hints.ephemeral_peak_bytes;
  body.iteration_seconds_hint = spec.hints.iteration_seconds;
  body.limit_total = spec.limits.total == kUnlimited ? 0 : spec.limits.total;
  const JobAdded added = body_as<JobAdded>(link_->call(MessageType::add_job, body).record);
  std::shared_ptr<TurnConnection> turns;
  try {
    turns = std::make_shared<TurnConnection>(*link_, added.job);
  } catch (...) {
    try {
      (void)link_->call(MessageType::finish_job, JobCall{added.job, -1, 0, 0});
    } catch (const std::exception&) {
      // The daemon is gone: it holds nothing of the job.
    }
    throw;
  }
  std::lock_guard lock(mu_);
  jobs_[job] = Entry{added.job, std::move(turns), false};
}

RemoteTurns::Entry RemoteTurns::entry(JobId job) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) throw UnknownJob(job);
  return it->second;
}

void RemoteTurns::set_holding(JobId job, bool holding) {
  std::lock_guard lock(mu_);
  if (auto it = jobs_.find(job); it != jobs_.end()) it->second.holding = holding;
}

bool RemoteTurns::acquire(JobId job,
                          std::optional<std::chrono::steady_clock::time_point> deadline) {
  const Entry e = entry(job);
  if (e.holding) return true;
  JobCall call{e.daemon_job, -1, 0, 0};
  if (deadline) {
    const auto left = *deadline - std::chrono::steady_clock::now();
    call.timeout_ns = std::max<std::int64_t>(
        0, std::chrono::duration_cast<std::chrono::nanoseconds>(left).count());
  }
  const Turn turn = body_as<Turn>(e.turns->call(MessageType::begin_iteration, call).record);
  if (turn.admitted != 0) set_holding(job, true);
  return turn.admitted != 0;
}

void RemoteTurns::release(JobId job, const MeasuredMemory* measured) {
  const Entry e = entry(job);
  if (!e.holding) return;
  set_holding(job, false);
  const EndIteration end{JobCall{e.daemon_job, -1, 0, 0}, report_of(measured)};
  (void)e.turns->call(MessageType::end_iteration, end);
}

void RemoteTurns::withdraw(JobId job) {
  const Entry e = entry(job);
  if (e.holding) {
    release(job, nullptr);  // granted after the wait ran out: it goes back as an empty iteration
    return;
  }
  (void)e.turns->call(MessageType::withdraw, JobCall{e.daemon_job, -1, 0, 0});
}

void RemoteTurns::finish(JobId job, bool cancelled) noexcept {
  std::uint64_t daemon_job = 0;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    daemon_job = it->second.daemon_job;
    // A cancel keeps the entry: a thread still waiting for the turn finds it and gets the
    // daemon's answer (cancelled). A leave is final.
    if (!cancelled) jobs_.erase(it);
  }
  try {
    (void)link_->call(MessageType::finish_job, JobCall{daemon_job, -1, cancelled ? 1u : 0u, 0});
  } catch (const std::exception&) {
    // The daemon is gone or already forgot the job: either way it holds nothing of it.
  }
}

}  // namespace salus::remote
