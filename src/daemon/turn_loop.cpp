#include "daemon/turn_loop.hpp"

#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <vector>

#include "iteration_sched/runtime_access.hpp"
#include "waits/cpu_relax.hpp"
#include "waits/cpus.hpp"

namespace salus::daemon {

using Clock = std::chrono::steady_clock;
using remote::MessageType;

namespace {

constexpr double kWeight = 0.25;  // of the newest interval in a connection's moving averages

// Whether `record` grants a turn (a Turn that admits).
bool grants(const std::vector<std::byte>& record) {
  remote::Header h;
  if (record.size() != sizeof(h) + sizeof(remote::Turn)) return false;
  std::memcpy(&h, record.data(), sizeof(h));
  if (static_cast<MessageType>(h.type) != MessageType::turn) return false;
  remote::Turn t;
  std::memcpy(&t, record.data() + sizeof(h), sizeof(t));
  return t.admitted != 0;
}

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

Clock::duration duration(double s) {
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
}

void average(double& into, double sample) {
  into = into < 0 ? sample : (1 - kWeight) * into + kWeight * sample;
}

}  // namespace

// What other threads hand the loop. Its mutex is a leaf: nothing is called while it is held.
struct TurnLoop::Inbox {
  struct Attached {
    std::shared_ptr<remote::Channel> socket;
    Coordinator::TurnLink link;
    remote::TurnRings rings;
  };

  std::mutex mu;
  std::vector<Attached> attached;
  std::vector<const Job*> woken;
  bool stopping = false;
  bool asleep = false;  // the loop sleeps in epoll: a post then writes `event`
  // Moves at every post, after it: the loop, spinning, watches it instead of taking the lock.
  std::atomic<std::uint64_t> posts{0};
  remote::UniqueFd event{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};

  template <class Fn>
  void post(Fn&& fn) {
    bool wake = false;
    {
      std::lock_guard lock(mu);
      fn();
      wake = asleep;
    }
    posts.fetch_add(1, std::memory_order_release);
    if (wake) {
      const std::uint64_t one = 1;
      (void)!::write(event.get(), &one, sizeof(one));
    }
  }
};

class TurnLoop::Loop {
 public:
  Loop(Coordinator& coordinator, std::shared_ptr<Inbox> inbox, std::chrono::microseconds spin)
      : coordinator_(coordinator), inbox_(std::move(inbox)),
        spin_(waits::usable_cpus() > 1 ? spin : std::chrono::microseconds{}),
        epoll_(::epoll_create1(EPOLL_CLOEXEC)) {
    if (epoll_.get() < 0 || inbox_->event.get() < 0) {
      sim::throw_errno("epoll_create1", errno, "salusd's turn loop");
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 0;  // the inbox
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, inbox_->event.get(), &ev) != 0) {
      sim::throw_errno("epoll_ctl", errno, "salusd's turn loop");
    }
  }

  // Serves until the inbox says stop; then hangs up every connection.
  void run();

 private:
  struct Connection {
    Connection(std::uint64_t i, std::shared_ptr<remote::Channel> s, remote::TurnRings rings,
               Coordinator::TurnLink l)
        : id(i), socket(s), channel(std::move(s), std::move(rings)), link(std::move(l)) {}

    std::uint64_t id = 0;
    std::shared_ptr<remote::Channel> socket;
    remote::TurnChannel channel;
    Coordinator::TurnLink link;
    std::optional<Coordinator::WaitingTurn> waiting;  // a begin whose turn is not there yet
    bool dead = false;                                 // dropped: swept after the pass
    // When its process got its turn (while it holds it), and when it last ended one (until its
    // next begin); how long its turns and the gaps between them have lately lasted (-1: not
    // yet). The loop watches for what is due.
    std::optional<Clock::time_point> granted_at;
    std::optional<Clock::time_point> ended_at;
    double turn_seconds = -1;
    double gap_seconds = -1;
    // While it waits: when its turn is expected (as the daemon's scheduler says; its process
    // reads it from the ring and watches for the turn then), and whether its process, asleep,
    // was woken ahead of it.
    std::optional<Clock::time_point> due;
    bool woken_ahead = false;
  };

  // Takes what other threads posted; false once the loop is to stop.
  bool take_inbox();
  // Answers the waiting begins of `jobs`' connections that can be answered now.
  void serve_woken(const std::set<const Job*>& jobs);
  // Handles what waits in every connection's ring; true when anything did.
  bool serve_rings();
  // Answers the waiting begins whose deadline has passed (not admitted); true when any was.
  bool serve_deadlines(Clock::time_point now);
  void handle(Connection& c, remote::Received& received);
  void answer(Connection& c, Coordinator::Reply& reply);
  void drop(Connection& c, std::string_view why);
  void sweep();
  // Tells each waiting connection's process when its turn is expected (TurnRings::set_due).
  void update_dues();
  // Whether a connection's turn end (or next begin) is due now, give or take spin_; else when the
  // first one will be, or a deadline or recheck falls, in `next`.
  // A waiting process asleep when its turn is near is woken then, ahead of it.
  bool due(Clock::time_point now, std::optional<Clock::time_point>& next);
  // Sleeps until a connection's socket or the inbox has something, or `until`.
  void sleep(std::optional<Clock::time_point> until);
  // Waits at most `timeout` for the sockets (-1: as long as it takes) and reads what came.
  void poll_sockets(const timespec* timeout);

  Coordinator& coordinator_;
  const std::shared_ptr<Inbox> inbox_;
  const std::chrono::microseconds spin_;
  remote::UniqueFd epoll_;
  std::map<std::uint64_t, std::unique_ptr<Connection>> connections_;
  std::uint64_t next_id_ = 1;
  std::uint64_t posts_seen_ = 0;
  std::optional<Clock::time_point> next_recheck_;
};

void TurnLoop::Loop::run() {
  unsigned idle = 0;
  for (;;) {
    try {
      if (!take_inbox()) break;
      const auto now = Clock::now();
      bool worked = serve_rings();
      worked = serve_deadlines(now) || worked;
      if (next_recheck_ && now >= *next_recheck_) {
        next_recheck_ = RuntimeAccess::recheck(coordinator_.runtime());
        worked = true;
      }
      sweep();
      if (worked) update_dues();
      if (worked || inbox_->posts.load(std::memory_order_acquire) != posts_seen_) {
        idle = 0;
        continue;
      }
      std::optional<Clock::time_point> next;
      if (due(now, next)) {
        waits::cpu_relax();
        if (++idle % 64 == 0) {
          ::sched_yield();  // the process whose end is due may share this CPU
          const timespec zero{};
          poll_sockets(&zero);  // hang-ups, and descriptors' records, while spinning
        }
        continue;
      }
      idle = 0;
      sleep(next);
    } catch (const std::exception& e) {
      // Nothing that one connection does may end the loop: each call's failure is its own.
      spdlog::error("salusd's turn loop: {}", e.what());
    }
  }
  for (auto& [id, c] : connections_) c->socket->shutdown();
  connections_.clear();
}

bool TurnLoop::Loop::take_inbox() {
  std::vector<Inbox::Attached> attached;
  std::vector<const Job*> woken;
  {
    std::lock_guard lock(inbox_->mu);
    if (inbox_->stopping) return false;
    attached.swap(inbox_->attached);
    woken.swap(inbox_->woken);
    posts_seen_ = inbox_->posts.load(std::memory_order_relaxed);
  }
  for (Inbox::Attached& a : attached) {
    const std::uint64_t id = next_id_++;
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, a.socket->fd(), &ev) != 0) {
      spdlog::warn("job '{}': its turn connection could not be watched (errno {}): dropped",
                   a.link.job->name(), errno);
      a.socket->shutdown();
      continue;
    }
    connections_.emplace(
        id, std::make_unique<Connection>(id, a.socket, std::move(a.rings), std::move(a.link)));
  }
  if (!woken.empty()) {
    serve_woken(std::set<const Job*>(woken.begin(), woken.end()));
    // A decision may have asked to be made again later (memory-aware plans): when, is here.
    next_recheck_ = RuntimeAccess::recheck(coordinator_.runtime());
  }
  return true;
}

void TurnLoop::Loop::serve_woken(const std::set<const Job*>& jobs) {
  for (auto& [id, c] : connections_) {
    if (c->dead || !c->waiting || !jobs.contains(c->link.job.get())) continue;
    if (std::optional<Coordinator::Reply> reply = coordinator_.retry_turn(c->link, *c->waiting)) {
      c->waiting.reset();
      answer(*c, *reply);
    }
  }
}

bool TurnLoop::Loop::serve_rings() {
  bool worked = false;
  for (auto& [id, c] : connections_) {
    try {
      // A few records a pass: one connection cannot keep the others waiting.
      for (int n = 0; n < 4 && !c->dead; ++n) {
        std::optional<remote::Received> received = c->channel.try_receive();
        if (!received) break;
        worked = true;
        handle(*c, *received);
      }
    } catch (const std::exception& e) {
      // A record the protocol refuses ends its connection only, as on the session's.
      drop(*c, e.what());
    }
  }
  return worked;
}

bool TurnLoop::Loop::serve_deadlines(Clock::time_point now) {
  bool worked = false;
  for (auto& [id, c] : connections_) {
    if (c->dead || !c->waiting || !c->waiting->deadline || now < *c->waiting->deadline) continue;
    if (std::optional<Coordinator::Reply> reply = coordinator_.retry_turn(c->link, *c->waiting)) {
      c->waiting.reset();
      answer(*c, *reply);
      worked = true;
    }
  }
  return worked;
}

void TurnLoop::Loop::handle(Connection& c, remote::Received& received) {
  const MessageType type = received.record.type();
  const auto now = Clock::now();
  if (type == MessageType::begin_iteration && c.ended_at) {
    average(c.gap_seconds, seconds(now - *c.ended_at));
    c.ended_at.reset();
  }
  if (type == MessageType::end_iteration) {
    if (c.granted_at) average(c.turn_seconds, seconds(now - *c.granted_at));
    c.granted_at.reset();
    c.ended_at = now;
  }
  // The next job's turn goes out from inside the end, before the ended iteration's bookkeeping.
  Coordinator::TurnResult result =
      coordinator_.turn_call(c.link, received, [this] { (void)take_inbox(); });
  if (result.waiting) c.waiting = std::move(result.waiting);
  if (result.reply && !c.dead) answer(c, *result.reply);
}

void TurnLoop::Loop::answer(Connection& c, Coordinator::Reply& reply) {
  // An answered wait is no longer due, and says so before the answer goes: a process that has its
  // turn must not find it still marked due (Salusd.AWaitingProcessIsToldWhenItsTurnIsDue).
  if (c.due) {
    c.due.reset();
    c.channel.rings().set_due(std::nullopt);
  }
  std::vector<int> fds;
  for (const remote::UniqueFd& fd : reply.fds) fds.push_back(fd.get());
  try {
    c.channel.send(reply.record, fds);
  } catch (const std::exception& e) {
    drop(c, e.what());
    return;
  }
  if (grants(reply.record)) c.granted_at = Clock::now();
}

void TurnLoop::Loop::drop(Connection& c, std::string_view why) {
  if (c.dead) return;
  // The process hung up (or broke the protocol): its session's connection says what it means.
  spdlog::debug("turn connection of job {} ended: {}", c.link.job_id, why);
  c.dead = true;
  (void)::epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, c.socket->fd(), nullptr);
  c.socket->shutdown();
}

void TurnLoop::Loop::update_dues() {
  for (auto& [id, c] : connections_) {
    if (c->dead || !c->waiting) continue;
    const std::optional<Clock::time_point> due = RuntimeAccess::expected_turn(*c->link.job);
    if (due == c->due) continue;
    c->due = due;
    c->woken_ahead = false;
    c->channel.rings().set_due(due);
  }
}

void TurnLoop::Loop::sweep() {
  std::erase_if(connections_, [](const auto& entry) { return entry.second->dead; });
}

bool TurnLoop::Loop::due(Clock::time_point now, std::optional<Clock::time_point>& next) {
  auto sooner = [&next](Clock::time_point t) {
    if (!next || t < *next) next = t;
  };
  bool spinning = false;
  const auto spin = std::chrono::duration_cast<Clock::duration>(spin_);
  for (auto& [id, c] : connections_) {
    if (c->waiting && c->waiting->deadline) sooner(*c->waiting->deadline);
    if (spin_.count() == 0 || c->dead) continue;
    if (c->waiting && c->due && !c->woken_ahead) {
      // Its process watches from twice `spin` before (TurnChannel::receive).
      const auto wake_at = *c->due - 2 * spin;
      if (now < wake_at) {
        sooner(wake_at);
      } else {
        c->woken_ahead = true;
        if (c->channel.rings().peer_asleep()) c->channel.wake_peer();
      }
    }
    std::optional<Clock::time_point> at;
    if (c->granted_at && c->turn_seconds >= 0) {
      at = *c->granted_at + duration(c->turn_seconds);
    } else if (c->ended_at && c->gap_seconds >= 0 && !c->waiting) {
      at = *c->ended_at + duration(c->gap_seconds);
    }
    if (!at) continue;
    if (now < *at - spin) {
      sooner(*at - spin);
    } else if (now <= *at + spin) {
      spinning = true;
    }
  }
  if (next_recheck_) sooner(*next_recheck_);
  return spinning;
}

void TurnLoop::Loop::sleep(std::optional<Clock::time_point> until) {
  // Each ring marked asleep, so that a process that writes from now on wakes the loop over its
  // socket; a ring written to meanwhile keeps the loop awake.
  std::vector<Connection*> marked;
  auto unmark = [&] {
    for (Connection* c : marked) c->channel.rings().wake();
  };
  for (auto& [id, c] : connections_) {
    if (!c->channel.rings().sleep_if_empty()) {
      unmark();
      return;
    }
    marked.push_back(c.get());
  }
  {
    std::lock_guard lock(inbox_->mu);
    if (inbox_->stopping || !inbox_->attached.empty() || !inbox_->woken.empty() ||
        inbox_->posts.load(std::memory_order_relaxed) != posts_seen_) {
      unmark();
      return;
    }
    inbox_->asleep = true;
  }
  timespec timeout{};
  const timespec* wait = nullptr;
  if (until) {
    const auto left = std::max(*until - Clock::now(), Clock::duration::zero());
    const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(left).count();
    timeout.tv_sec = static_cast<time_t>(ns / 1'000'000'000);
    timeout.tv_nsec = static_cast<long>(ns % 1'000'000'000);
    wait = &timeout;
  }
  poll_sockets(wait);
  {
    std::lock_guard lock(inbox_->mu);
    inbox_->asleep = false;
  }
  unmark();
}

void TurnLoop::Loop::poll_sockets(const timespec* timeout) {
  std::array<epoll_event, 32> events{};
  const int n = ::epoll_pwait2(epoll_.get(), events.data(), static_cast<int>(events.size()),
                               timeout, nullptr);
  if (n < 0) {
    if (errno == EINTR) return;
    sim::throw_errno("epoll_pwait2", errno, "salusd's turn loop");
  }
  for (int i = 0; i < n; ++i) {
    const std::uint64_t id = events[static_cast<std::size_t>(i)].data.u64;
    if (id == 0) {
      std::uint64_t count = 0;
      (void)!::read(inbox_->event.get(), &count, sizeof(count));
      continue;
    }
    const auto it = connections_.find(id);
    if (it == connections_.end() || it->second->dead) continue;
    try {
      if (!it->second->channel.drain_socket()) drop(*it->second, "its socket closed");
    } catch (const std::exception& e) {
      drop(*it->second, e.what());
    }
  }
}

TurnLoop::TurnLoop(Coordinator& coordinator, std::chrono::microseconds spin)
    : inbox_(std::make_shared<Inbox>()),
      loop_(std::make_unique<Loop>(coordinator, inbox_, spin)) {
  coordinator.set_turn_listener([weak = std::weak_ptr<Inbox>(inbox_)](const Job* job) {
    if (auto inbox = weak.lock()) inbox->post([&] { inbox->woken.push_back(job); });
  });
  thread_ = std::thread([this] { loop_->run(); });
}

TurnLoop::~TurnLoop() {
  stop();
  if (thread_.joinable()) thread_.join();
}

void TurnLoop::serve(std::shared_ptr<remote::Channel> socket, Coordinator::TurnLink link,
                     remote::TurnRings rings) {
  inbox_->post([&] {
    inbox_->attached.push_back({std::move(socket), std::move(link), std::move(rings)});
  });
}

void TurnLoop::stop() {
  inbox_->post([&] { inbox_->stopping = true; });
  // The loop may be spinning (no write then): it reads `stopping` at its next pass.
  const std::uint64_t one = 1;
  (void)!::write(inbox_->event.get(), &one, sizeof(one));
}

}  // namespace salus::daemon
