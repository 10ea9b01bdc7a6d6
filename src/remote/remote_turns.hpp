// A connected runtime's turn gate: each job is also a job of salusd, whose policy decides when
// its iterations run relative to the jobs of other processes.
//
// Each job's turns go on a connection of their own (attach_turns), whose records travel through
// shared memory (turn_rings.hpp): the job's thread writes its call and watches for the answer
// itself, with no reader thread between (the session's link has one, for its many callers), and
// salusd's turn loop answers. The session's link keeps the rest: adding the job, cancelling it
// (which reaches a thread waiting on the turn connection through the daemon), finishing it.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "iteration_sched/turn_gate.hpp"
#include "remote/daemon_link.hpp"
#include "remote/fence_pool.hpp"
#include "remote/turn_channel.hpp"

namespace salus::remote {

// One job's turn connection: a call at a time (its lock is held from send to answer). An
// iteration's end is posted, not called: the daemon acts on it in order, and its answer is read
// before the next call's (a failure then is that call's error, naming end_iteration), so a job
// that ends its turn goes on at once and the next process's wake-up is the only one on the
// switch's path.
class TurnConnection {
 public:
  // Connects and attaches to `link`'s session as `daemon_job`; throws what the daemon refused.
  // `spin`: RuntimeOptions::turn_spin (see receive_answer; off where the process may use one
  // CPU only).
  TurnConnection(const DaemonLink& link, std::uint64_t daemon_job,
                 std::chrono::microseconds spin = {});
  // Sends `type` for the job and waits for the answer: a Failure is thrown as its typed error,
  // the daemon's absence as DeviceError SALUSD_GONE.
  Received call(MessageType type, const JobCall& body);
  // Sends the end of an iteration without waiting for its answer (see above), with the
  // descriptors its fence needs.
  void post(const EndIteration& body, std::span<const int> fds = {});
  // Reads the answer to a posted end, if one is outstanding, so that the daemon has acted on it
  // before what the job says next on another connection (its leave, on the session's link). A
  // call in flight on another thread settles it itself: this then returns at once.
  void settle();

 private:
  // With mu_ held: sends a record (a failure to is the daemon's absence).
  void send(std::span<const std::byte> record, std::span<const int> fds = {});
  // With mu_ held: reads the answer to a posted end, if one is outstanding.
  void settle_posted();
  // With mu_ held: the answer to call `seq`, asked at `asked` (see TurnChannel::receive: it is
  // watched for around the time salusd says it is due, twice spin_ either side, so that it finds
  // the thread awake: a sleeping thread woken through the kernel costs 20-50 us on a VM).
  Received receive_answer(std::string_view what, std::uint64_t seq,
                          std::chrono::steady_clock::time_point asked);

  const std::string path_;
  std::mutex mu_;  // one call at a time
  std::optional<TurnChannel> channel_;  // set once attached
  std::uint64_t next_seq_ = 1;
  std::optional<std::uint64_t> posted_;  // the seq of a posted end whose answer is unread
  const std::chrono::microseconds spin_;
};

// The GPU is ordered at a turn as well (daemon/turn_fences.hpp): an iteration's end goes with an
// interprocess event recorded on the job's stream (from `backend`'s fence pool), and a turn that
// comes with another process's waits for it before its work (order_after). That wait is the
// host's, bounded by the turn's fence_wait_ms, and not the stream's: a stream made to wait for
// another process's event could not be let go if that event never completed.
class RemoteTurns final : public TurnGate {
 public:
  // `backend`: this process's, whose fence pool and streams the turns' fences use (null: no GPU
  // order at turns, for tests of the turns alone).
  RemoteTurns(std::shared_ptr<DaemonLink> link, std::shared_ptr<DeviceBackend> backend,
              FencePool* fences, std::chrono::microseconds spin = {})
      : link_(std::move(link)), backend_(std::move(backend)), fences_(fences), spin_(spin) {}

  void add(JobId job, const JobSpec& spec) override;
  bool acquire(JobId job, std::optional<std::chrono::steady_clock::time_point> deadline) override;
  void order_after(JobId job, StreamHandle stream) override;
  void release(JobId job, const MeasuredMemory* measured, const GpuTime* gpu) override;
  void withdraw(JobId job) override;
  void finish(JobId job, bool cancelled) noexcept override;

 private:
  struct Entry {
    std::uint64_t daemon_job = 0;
    int device = 0;
    std::shared_ptr<TurnConnection> turns;
    bool holding = false;  // the daemon granted a turn that has not gone back
    std::shared_ptr<const Event> after;  // the turn's previous holder's end, until order_after
    std::chrono::steady_clock::time_point after_until{};  // how long order_after waits for it
    std::optional<StreamHandle> stream;  // where the turn's work goes (order_after), until release
  };
  // The fence of a Turn, opened (null when none, or when its process has exited).
  std::shared_ptr<const Event> open_fence(int device, const Turn& turn, const Received& answer);
  // An interprocess event recorded on `stream` now, from the pool (null without one); the
  // pool's fences whose records have completed go back to it first.
  FencePool::Fence* fence_after(int device, StreamHandle stream);
  // The job's entry (a copy: the connection stays while a call uses it); UnknownJob when it has
  // none.
  Entry entry(JobId job) const;

  const std::shared_ptr<DaemonLink> link_;
  const std::shared_ptr<DeviceBackend> backend_;
  FencePool* const fences_;  // the backend's (it outlives this)
  const std::chrono::microseconds spin_;
  mutable std::mutex mu_;  // guards jobs_ and in_flight_; never held across a driver or daemon call
  std::unordered_map<JobId, Entry> jobs_;
  std::vector<FencePool::Fence*> in_flight_;  // recorded at an end, back to the pool once passed
};

}  // namespace salus::remote
