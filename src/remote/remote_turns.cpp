#include "remote/remote_turns.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "log/log.hpp"
#include "waits/cpus.hpp"

namespace salus::remote {

TurnConnection::TurnConnection(const DaemonLink& link, std::uint64_t daemon_job,
                               std::chrono::microseconds spin)
    : path_(link.socket_path()), spin_(waits::usable_cpus() > 1 ? spin : std::chrono::microseconds{}) {
  auto socket = std::make_shared<Channel>(connect_to(path_));
  const AttachTurns attach{link.welcome().session, link.welcome().token, daemon_job};
  std::optional<Received> reply;
  try {
    socket->send(encode(MessageType::attach_turns, 1, attach));
    reply = socket->receive();
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
  if (!reply) throw salusd_gone(path_, "it hung up at attach_turns");
  if (reply->record.type() == MessageType::failure) {
    throw_failure(body_as<Failure>(reply->record), "attach_turns");
  }
  if (reply->record.type() != MessageType::done || reply->fds.size() != 1) {
    throw ProtocolError(fmt::format("attach_turns was answered with {} and {} descriptors, not "
                                    "done and its shared memory",
                                    to_string(reply->record.type()), reply->fds.size()));
  }
  channel_.emplace(std::move(socket), TurnRings::adopt(std::move(reply->fds.front())));
}

Received TurnConnection::call(MessageType type, const JobCall& body) {
  std::lock_guard lock(mu_);
  settle_posted();
  const std::uint64_t seq = next_seq_++;
  const auto asked = std::chrono::steady_clock::now();
  send(encode(type, seq, body));
  return receive_answer(to_string(type), seq, asked);
}

void TurnConnection::post(const EndIteration& body, std::span<const int> fds) {
  std::lock_guard lock(mu_);
  settle_posted();
  const std::uint64_t seq = next_seq_++;
  send(encode(MessageType::end_iteration, seq, body), fds);
  posted_ = seq;
}

void TurnConnection::settle() {
  std::unique_lock lock(mu_, std::try_to_lock);
  if (lock.owns_lock()) settle_posted();
}

void TurnConnection::settle_posted() {
  if (const std::optional<std::uint64_t> seq = std::exchange(posted_, std::nullopt)) {
    (void)receive_answer(to_string(MessageType::end_iteration), *seq,
                         std::chrono::steady_clock::now());
  }
}

void TurnConnection::send(std::span<const std::byte> record, std::span<const int> fds) {
  try {
    channel_->send(record, fds);
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
}

Received TurnConnection::receive_answer(std::string_view what, std::uint64_t seq,
                                        std::chrono::steady_clock::time_point asked) {
  std::optional<Received> reply;
  try {
    reply = channel_->receive(asked, 2 * spin_);
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw salusd_gone(path_, e.what());
  }
  if (!reply) throw salusd_gone(path_, "its connection closed");
  // One call at a time on this connection: another answer than this call's is a daemon's bug.
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
  jobs_[job] = Entry{added.job, spec.device, std::move(turns), false, nullptr, {}, std::nullopt};
}

RemoteTurns::Entry RemoteTurns::entry(JobId job) const {
  std::lock_guard lock(mu_);
  auto it = jobs_.find(job);
  if (it == jobs_.end()) throw UnknownJob(job);
  return it->second;
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
  const Received answer = e.turns->call(MessageType::begin_iteration, call);
  const Turn turn = body_as<Turn>(answer.record);
  if (turn.admitted == 0) return false;
  std::shared_ptr<const Event> after = open_fence(e.device, turn, answer);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(turn.fence_wait_ms);
  std::lock_guard lock(mu_);
  if (auto it = jobs_.find(job); it != jobs_.end()) {
    it->second.holding = true;
    it->second.after = std::move(after);
    it->second.after_until = until;
  }
  return true;
}

std::shared_ptr<const Event> RemoteTurns::open_fence(int device, const Turn& turn,
                                                     const Received& answer) {
  if (turn.fenced == 0 || fences_ == nullptr) return nullptr;
  const std::int32_t index = turn.fence.fd_index;
  if (index >= static_cast<std::int32_t>(answer.fds.size())) {
    throw ProtocolError(fmt::format("a turn's fence names descriptor {} of {}", index,
                                    answer.fds.size()));
  }
  SharedEvent shared;
  shared.handle = turn.fence.handle;
  shared.fd = index >= 0 ? answer.fds[static_cast<std::size_t>(index)].get() : -1;
  try {
    return fences_->open(device, shared);
  } catch (const Error& e) {
    // Its process has exited, and its work with it (an exporter never destroys what it
    // exported: see FencePool).
    log::debug("a turn's fence could not be opened, taken as passed: {}", e.what());
    return nullptr;
  }
}

void RemoteTurns::order_after(JobId job, StreamHandle stream) {
  std::shared_ptr<const Event> after;
  std::chrono::steady_clock::time_point until;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) throw UnknownJob(job);
    after = std::exchange(it->second.after, nullptr);
    until = it->second.after_until;
    it->second.stream = stream;
  }
  if (!after || wait_for_fence(*after, until)) return;
  log::warn("job {}: the work of its lane's last iteration, in another process, has not completed "
            "within salusd's --fence-wait: this turn's work goes on beside it",
            job.value);
}

FencePool::Fence* RemoteTurns::fence_after(int device, StreamHandle stream) {
  if (fences_ == nullptr || !backend_) return nullptr;
  std::vector<FencePool::Fence*> checking;
  {
    std::lock_guard lock(mu_);
    checking.swap(in_flight_);
  }
  std::vector<FencePool::Fence*> pending;
  for (FencePool::Fence* f : checking) {
    bool passed = false;
    try {
      passed = f->event->query();
    } catch (const Error&) {
      // Asked again at the next end.
    }
    if (passed) {
      fences_->recycle(*f);
    } else {
      pending.push_back(f);
    }
  }
  FencePool::Fence* fence = nullptr;
  try {
    fence = &fences_->acquire(device);
    backend_->record_event(fence->event->handle(), stream);
    pending.push_back(fence);
  } catch (const NotSupported&) {
    fence = nullptr;  // no interprocess events here: the turn carries no GPU order
  } catch (...) {
    if (fence != nullptr) pending.push_back(fence);  // recycled once it reads complete
    std::lock_guard lock(mu_);
    in_flight_.insert(in_flight_.end(), pending.begin(), pending.end());
    throw;
  }
  std::lock_guard lock(mu_);
  in_flight_.insert(in_flight_.end(), pending.begin(), pending.end());
  return fence;
}

void RemoteTurns::release(JobId job, const MeasuredMemory* measured, const GpuTime* gpu) {
  std::optional<StreamHandle> stream;
  Entry e;
  {
    std::lock_guard lock(mu_);
    auto it = jobs_.find(job);
    if (it == jobs_.end()) throw UnknownJob(job);
    if (!it->second.holding) return;
    it->second.holding = false;
    it->second.after = nullptr;  // granted but not begun here: nothing of this turn waits for it
    stream = std::exchange(it->second.stream, std::nullopt);
    e = it->second;
  }
  EndIteration end{JobCall{e.daemon_job, -1, 0, 0}, report_of(measured), 0, 0, {}};
  if (gpu != nullptr) {
    end.gpu_timed = 1;
    end.gpu_iterations = gpu->iterations;
    end.gpu_seconds = gpu->seconds;
  }
  std::vector<int> fds;
  // A stream with nothing queued needs no fence (the common case of a job that synchronized, and
  // the switch benchmark's empty iterations): one query instead of an event to record here and
  // to open in the next process.
  if (stream && backend_ && fences_ != nullptr && backend_->query_stream(*stream, e.device)) {
    end.fenced = kSettled;
    stream.reset();
  }
  // After the iteration's work on its stream: the lane's next turn waits for it on the GPU.
  if (const FencePool::Fence* fence = stream ? fence_after(e.device, *stream) : nullptr) {
    end.fenced = kFenced;
    end.fence.handle = fence->shared.handle;
    end.fence.fd_index = fence->shared.fd >= 0 ? 0 : -1;
    if (fence->shared.fd >= 0) fds.push_back(fence->shared.fd);
  }
  e.turns->post(end, fds);
}

void RemoteTurns::withdraw(JobId job) {
  const Entry e = entry(job);
  if (e.holding) {
    release(job, nullptr, nullptr);  // granted after the wait ran out: it goes back as an empty iteration
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
