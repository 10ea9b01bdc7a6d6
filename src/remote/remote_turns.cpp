#include "remote/remote_turns.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "waits/cpu_relax.hpp"

namespace salus::remote {

namespace {

constexpr double kWaitWeight = 0.25;  // weight of the newest turn in recent_wait_

}  // namespace

TurnConnection::TurnConnection(const DaemonLink& link, std::uint64_t daemon_job,
                               std::chrono::microseconds spin)
    : path_(link.socket_path()), channel_(connect_to(path_)), spin_(spin) {
  const AttachTurns attach{link.welcome().session, link.welcome().token, daemon_job};
  const std::uint64_t seq = next_seq_++;
  (void)exchange(encode(MessageType::attach_turns, seq, attach), "attach_turns", seq);
}

Received TurnConnection::call(MessageType type, const JobCall& body) {
  std::lock_guard lock(mu_);
  settle_posted();
  const std::uint64_t seq = next_seq_++;
  if (type != MessageType::begin_iteration) return exchange(encode(type, seq, body), to_string(type), seq);
  try {
    channel_.send(encode(type, seq, body));
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
  const auto asked = std::chrono::steady_clock::now();
  wait_for_answer(asked);
  Received answer = receive_answer(to_string(type), seq);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - asked).count();
  recent_wait_ = (1 - kWaitWeight) * recent_wait_ + kWaitWeight * waited;
  return answer;
}

void TurnConnection::wait_for_answer(std::chrono::steady_clock::time_point asked) {
  const double spin = std::chrono::duration<double>(spin_).count();
  if (spin <= 0.0 || recent_wait_ > spin) return;
  const auto until = asked + 2 * spin_;
  for (unsigned i = 1; !channel_.readable(); ++i) {
    waits::cpu_relax();
    if (i % 8 == 0 && std::chrono::steady_clock::now() >= until) return;
  }
}

void TurnConnection::post(const EndIteration& body) {
  std::lock_guard lock(mu_);
  settle_posted();
  const std::uint64_t seq = next_seq_++;
  try {
    channel_.send(encode(MessageType::end_iteration, seq, body));
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
  posted_ = seq;
}

void TurnConnection::settle() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) settle_posted();
}

void TurnConnection::settle_posted() {
  if (const std::optional<std::uint64_t> seq = std::exchange(posted_, std::nullopt)) {
    (void)receive_answer(to_string(MessageType::end_iteration), *seq);
  }
}

Received TurnConnection::exchange(std::span<const std::byte> record, std::string_view what,
                                  std::uint64_t seq) {
  try {
    channel_.send(record);
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
  return receive_answer(what, seq);
}

Received TurnConnection::receive_answer(std::string_view what, std::uint64_t seq) {
  std::optional<Received> reply;
  try {
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
    turns = std::make_shared<TurnConnection>(*link_, added.job, spin_);
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
  e.turns->post(end);
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
  std::shared_ptr<TurnConnection> turns;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) return;
    daemon_job = it->second.daemon_job;
    // A cancel keeps the entry: a thread still waiting for the turn finds it and gets the
    // daemon's answer (cancelled). A leave is final.
    if (!cancelled) {
      turns = std::move(it->second.turns);
      jobs_.erase(it);
    }
  }
  try {
    // The last iteration's posted end goes before the leave: the two travel on different
    // connections, and a daemon that read the leave first would never count that iteration.
    if (turns) turns->settle();
  } catch (const std::exception&) {
    // Its failure names an iteration that is over; the leave below still goes.
  }
  try {
    (void)link_->call(MessageType::finish_job, JobCall{daemon_job, -1, cancelled ? 1u : 0u, 0});
  } catch (const std::exception&) {
    // The daemon is gone or already forgot the job: either way it holds nothing of it.
  }
}

}  // namespace salus::remote
