#include "daemon/coordinator.hpp"
#include "daemon/session.hpp"
#include "iteration_sched/runtime_access.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <atomic>
#include <random>

namespace salus::daemon {

using remote::MessageType;

namespace {

RuntimeOptions runtime_options(const CoordinatorOptions& o) {
  RuntimeOptions r;
  r.policy = o.policy;
  // The iterations run in the clients: the daemon sees their host time, and counts it as the
  // GPU time the fair policy shares out.
  r.host_compute = true;
  return r;
}

}  // namespace

Coordinator::Coordinator(std::shared_ptr<DeviceBackend> backend, CoordinatorOptions options)
    : backend_(std::move(backend)),
      options_(std::move(options)),
      runtime_(RuntimeAccess::make(backend_, runtime_options(options_),
                                   {.gate = nullptr, .memory_profiles = MemoryProfiles::reported})),
      page_bytes_(backend_->granularity(Location::gpu(0))),
      trace_(RuntimeAccess::trace(*runtime_)),
      pages_(backend_, trace_, page_bytes_, devices(), options_),
      exits_(backend_, options_.exit_wait),
      turns_(backend_, pages_, options_.fence_wait, options_.spill) {}

std::vector<PageLedger::Device> Coordinator::devices() const {
  std::vector<PageLedger::Device> out;
  for (int d = 0; d < backend_->device_count(); ++d) {
    const std::size_t free = backend_->free_memory(d);
    out.push_back({free, device_capacity(d, free)});
  }
  return out;
}

// What the daemon hands out of device `d`: what is free less the reserve, and at most the limit.
// Nothing free beyond the reserve is no daemon at all: said here, not at the first client's OOM.
std::size_t Coordinator::device_capacity(int d, std::size_t free) const {
  const std::size_t total = backend_->properties(d).total_memory;
  if (free < options_.reserve_bytes + page_bytes_) {  // not one page
    throw InvalidArgument(fmt::format(
        "salusd: device {} has {:.0f} MiB free of {:.0f} MiB, and {:.0f} MiB are kept for other "
        "programs (--reserve): nothing is left to hand out", d, free / 1048576.0,
        total / 1048576.0, options_.reserve_bytes / 1048576.0));
  }
  std::size_t capacity = free - options_.reserve_bytes;
  if (options_.device_limit_bytes != 0) capacity = std::min(capacity, options_.device_limit_bytes);
  spdlog::info("device {}: hands out up to {:.0f} MiB ({:.0f} MiB free of {:.0f} MiB at start, "
               "{:.0f} MiB reserved for other programs{})", d, capacity / 1048576.0,
               free / 1048576.0, total / 1048576.0, options_.reserve_bytes / 1048576.0,
               options_.device_limit_bytes != 0 ? ", --memory caps it" : "");
  return capacity;
}

Coordinator::~Coordinator() {
  stop();  // no process's exit is waited for now
  for (const SessionId id : sessions_.ids()) close_session(id);
}

SessionId Coordinator::open_session(const remote::PeerCredentials& peer, Sender send,
                                    Hinter hint) {
  auto s = std::make_shared<Session>();
  s->token = std::random_device{}() | (std::uint64_t{std::random_device{}()} << 32);
  s->peer = peer;
  if (!hint) {
    hint = [send](std::span<const std::byte> record) {
      send(record, {});
      return true;
    };
  }
  s->send = std::move(send);
  if (peer.pid != ::getpid()) {
    // Fails (ESRCH) when the process is gone already: wait_for_exit then finds it gone.
    s->pidfd = remote::UniqueFd(static_cast<int>(::syscall(SYS_pidfd_open, peer.pid, 0)));
  }
  const SessionId id = sessions_.add(s);
  // Before its id is returned: no record can reach the session until then.
  pages_.open(id, peer.pid, peer.uid, std::move(hint));
  turns_.open(id);
  return id;
}

void Coordinator::stop() { exits_.stop(); }

void Coordinator::reply(Session& s, MessageType type, std::uint64_t seq,
                        std::span<const std::byte> body, std::span<const int> fds) {
  if (seq == 0) return;  // posted: nobody waits for an answer
  try {
    s.send(remote::encode_body(type, seq, body), fds);
  } catch (const std::exception& e) {
    // The process is gone; its connection's reader notices and closes the session.
    spdlog::debug("session {}: reply {} lost: {}", s.id, to_string(type), e.what());
  }
}

void Coordinator::fail(Session& s, std::uint64_t seq, const std::exception& e) {
  const auto* error = dynamic_cast<const Error*>(&e);
  const remote::Failure f =
      remote::failure_of(error != nullptr ? error->code() : Errc::device_error, e.what());
  reply(s, MessageType::failure, seq, std::as_bytes(std::span(&f, 1)));
}

void Coordinator::handle(SessionId id, remote::Received received) {
  const std::shared_ptr<Session> s = sessions_.find(id);
  const remote::Record& record = received.record;
  sessions_.check_greeted(*s, record.type());
  if (!received.fds.empty() && record.type() != MessageType::give_pages) {
    throw remote::ProtocolError(fmt::format("a client's {} carried {} descriptors",
                                            to_string(record.type()), received.fds.size()));
  }
  try {
    if (record.type() == MessageType::give_pages) return on_give_pages(*s, received);
    dispatch(s, record);
  } catch (const remote::ProtocolError&) {
    throw;
  } catch (const std::exception& e) {
    fail(*s, record.header.seq, e);
  }
}

void Coordinator::dispatch(const std::shared_ptr<Session>& s, const remote::Record& record) {
  switch (record.type()) {
    case MessageType::hello:
      return on_hello(*s, record);
    case MessageType::add_job:
      return on_add_job(*s, record);
    case MessageType::begin_iteration:
      return on_begin(s, record);
    case MessageType::end_iteration:
    case MessageType::withdraw:
    case MessageType::finish_job:
      return on_job_call(*s, record);
    case MessageType::take_pages:
      return on_take_pages(s, record);
    case MessageType::status: {
      std::string text = status_table(s->id);
      constexpr std::size_t kRoom = remote::kMaxRecordBytes - sizeof(remote::Header);
      if (text.size() > kRoom) text = text.substr(0, kRoom - 16) + "\n... (cut)\n";
      return reply(*s, MessageType::status_text, record.header.seq, std::as_bytes(std::span(text)));
    }
    case MessageType::attach_turns:
      throw remote::ProtocolError("attach_turns opens a connection of its own, not a session's");
    default:
      throw remote::ProtocolError(
          fmt::format("a client may not send {}", to_string(record.type())));
  }
}

void Coordinator::on_hello(Session& s, const remote::Record& record) {
  const auto hello = remote::body_as<remote::Hello>(record);
  pages_.name(s.id, sessions_.greet(s, hello));
  remote::Welcome w;
  w.device_count = static_cast<std::uint32_t>(pages_.device_count());
  w.backend = backend_->name() == "cuda" ? remote::BackendKind::cuda : remote::BackendKind::sim;
  w.page_bytes = page_bytes_;
  w.process_limit_bytes = options_.process_limit_bytes;
  w.spill = options_.spill;
  for (std::size_t d = 0; d < static_cast<std::size_t>(pages_.device_count()) &&
                          d < remote::kMaxDevices; ++d) {
    w.device_bytes[d] = pages_.capacity_bytes(static_cast<int>(d));
    w.device_uuids[d] = backend_->properties(static_cast<int>(d)).uuid;
  }
  remote::set_name(w.policy, runtime_->policy());
  w.session = s.id;
  w.token = s.token;
  spdlog::info("session {}: '{}' pid {} uid {} connected", s.id, s.name, s.peer.pid, s.peer.uid);
  reply(s, MessageType::welcome, record.header.seq, std::as_bytes(std::span(&w, 1)));
}

void Coordinator::on_add_job(Session& s, const remote::Record& record) {
  const auto a = remote::body_as<remote::AddJob>(record);
  JobSpec spec;
  spec.name = remote::name_of(a.name, "job name");
  if (a.kind > static_cast<std::uint32_t>(JobKind::inference)) {
    throw InvalidArgument(fmt::format("add_job: job kind {} is not training (0) or inference (1)",
                                      a.kind));
  }
  spec.kind = static_cast<JobKind>(a.kind);
  spec.priority = a.priority;
  spec.device = a.device;
  spec.expected_iterations = a.expected_iterations;
  spec.hints = {a.persistent_hint, a.ephemeral_hint, a.iteration_seconds_hint};
  if (a.limit_total != 0) spec.limits.total = a.limit_total;
  sessions_.check_job_room(s);
  auto job = std::make_shared<Job>(runtime_->add_job(std::move(spec)));
  // Its turn connection's waits have no thread in them: the turn loop hears of their changes.
  RuntimeAccess::on_wake(*job, [this, key = job.get()] {
    if (turn_listener_) turn_listener_(key);
  });
  const remote::JobAdded added{job->id().value};
  // Its limit first: the ledger's grants see it once its turns can ask (they need the job).
  pages_.job_added(s.id, added.job, a.limit_total);
  sessions_.add_job(s, added.job, job);
  spdlog::info("session {}: job '{}' (id {}) added", s.id, job->name(), added.job);
  reply(s, MessageType::job_added, record.header.seq, std::as_bytes(std::span(&added, 1)));
}

void Coordinator::on_job_call(Session& s, const remote::Record& record) {
  const bool end = record.type() == MessageType::end_iteration;
  const auto call = end ? remote::body_as<remote::EndIteration>(record).call
                        : remote::body_as<remote::JobCall>(record);
  std::shared_ptr<Job> job = sessions_.job_of(s, call.job);
  switch (record.type()) {
    case MessageType::end_iteration:
    case MessageType::withdraw:
      turns_.end(s.id, *job, record);
      break;
    default:  // finish_job
      if (call.flag != 0) {
        job->cancel();
      } else {
        job->leave();
        sessions_.remove_job(s, call.job);
        pages_.job_left(s.id, call.job, job.get());
      }
      break;
  }
  reply(s, MessageType::done, record.header.seq, {});
}

}  // namespace salus::daemon
