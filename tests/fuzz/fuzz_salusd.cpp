// Fuzz target: salusd's message decoder and state machine. The input is a conversation of up to
// three clients with one coordinator (a daemon without its sockets, on two simulated GPUs): each
// record is either raw bytes or a well-formed message of a chosen type with fields drawn from the
// input (ids of its own or another client's jobs and pages, counts at and past the limits, names
// without their NUL). A record that breaks the protocol drops its client, as the server does; any
// other refusal must be a well-formed failure reply. Checked: every reply the coordinator sends
// decodes; a page batch names only descriptors it carries; after every record the page banks are
// consistent (each page free or held by exactly one client); nothing crashes or hangs. Jobs' turn
// connections too: attaches right and wrong, and their calls.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "daemon/coordinator.hpp"
#include "fuzz_input.hpp"
#include "remote/protocol.hpp"
#include "salus/sim.hpp"

#include <spdlog/spdlog.h>

namespace {

using salus::fuzz::FuzzInput;
using namespace salus::remote;
using salus::daemon::Coordinator;
using salus::daemon::SessionId;

constexpr std::size_t kMiB = std::size_t{1} << 20;

// A coordinator per input: each conversation starts from a fresh daemon, so a finding replays
// alone (and nothing is left for the leak checker at exit).
std::unique_ptr<Coordinator> make_coordinator() {
  static const bool quiet = [] {
    spdlog::set_level(spdlog::level::err);  // a dropped client is the point here, not news
    return true;
  }();
  (void)quiet;
  salus::daemon::CoordinatorOptions o;
  o.reclaim_wait = std::chrono::milliseconds(0);
  o.exit_wait = std::chrono::milliseconds(0);
  o.process_limit_bytes = 24 * kMiB;
  return std::make_unique<Coordinator>(
      salus::make_sim_backend(salus::SimConfig::uniform(2, 32 * kMiB)), o);
}

// What the clients were told: job ids and page ids, to name (and misname) in later records.
struct Client {
  SessionId session = 0;
  std::uint64_t seq = 1;
};
struct Seen {
  std::mutex mu;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sessions;  // (session, token) welcomed
  std::vector<std::uint64_t> jobs;
  std::vector<std::uint64_t> pages;  // granted to someone at some point
};

Coordinator::Sender sender(const std::shared_ptr<Seen>& seen) {
  return [seen](std::span<const std::byte> record, std::span<const int> fds) {
    Record r;
    try {
      r.header = decode_header(record);
    } catch (const std::exception& e) {
      salus::fuzz::fail(std::string("the coordinator sent a record that does not decode: ") + e.what());
    }
    r.body.assign(record.begin() + sizeof(Header), record.end());
    std::lock_guard lock(seen->mu);
    if (r.type() == MessageType::job_added) seen->jobs.push_back(body_as<JobAdded>(r).job);
    if (r.type() == MessageType::welcome) {
      const auto w = body_as<Welcome>(r);
      seen->sessions.emplace_back(w.session, w.token);
    }
    if (r.type() == MessageType::pages) {
      std::vector<PageEntry> entries;
      std::vector<FenceEntry> fences;
      try {
        (void)pages_body(r, entries, fences);
      } catch (const std::exception& e) {
        salus::fuzz::fail(std::string("the coordinator sent pages that do not decode: ") + e.what());
      }
      for (const PageEntry& e : entries) {
        if (e.fd_index >= fds.size()) salus::fuzz::fail("a page names a descriptor not sent");
        seen->pages.push_back(e.id);
      }
      for (const FenceEntry& f : fences) {
        if (f.fd_index >= static_cast<std::int32_t>(fds.size())) {
          salus::fuzz::fail("a fence names a descriptor not sent");
        }
      }
    }
    if (r.type() == MessageType::failure) (void)name_of(body_as<Failure>(r).message, "failure");
  };
}

std::uint64_t pick_id(FuzzInput& in, const std::vector<std::uint64_t>& known) {
  if (!known.empty() && in.chance(80)) return known[in.below(known.size())];
  return in.bits(in.below(9));
}

// A well-formed record of a type drawn from the input.
// An end_iteration's memory report: none, a plausible one, or one with a bad curve (too many
// samples, a duration that is no number) that the daemon must refuse as a protocol error.
EndIteration end_of(FuzzInput& in, const JobCall& call) {
  EndIteration end{};
  end.call = call;
  MemoryReport& m = end.memory;
  m.known = static_cast<std::uint32_t>(in.below(2));
  m.persistent_bytes = in.chance(90) ? in.below(8) * kMiB : in.bits(8);
  m.ephemeral_peak_bytes = in.chance(90) ? in.below(8) * kMiB : in.bits(8);
  m.curve_seconds = in.chance(95) ? static_cast<double>(in.below(100)) / 1000.0
                                  : (in.chance(50) ? -1.0 : std::nan(""));
  m.curve_samples = static_cast<std::uint32_t>(in.chance(95) ? in.below(kCurveSamples + 1)
                                                              : in.bits(4));
  for (std::uint32_t i = 0; i < std::min<std::uint32_t>(m.curve_samples, kCurveSamples); ++i) {
    m.curve[i] = in.below(8) * kMiB;
  }
  return end;
}

std::vector<std::byte> structured(FuzzInput& in, Client& c, Seen& seen) {
  const auto type = static_cast<MessageType>(1 + in.below(kLastMessageType));
  std::vector<std::uint64_t> jobs, pages;
  {
    std::lock_guard lock(seen.mu);
    jobs = seen.jobs;
    pages = seen.pages;
  }
  const std::uint64_t seq = in.chance(90) ? c.seq++ : 0;
  switch (type) {
    case MessageType::hello: {
      Hello h;
      set_name(h.name, in.text(8));
      if (in.chance(5)) std::memset(h.name.data(), 'x', h.name.size());  // no NUL
      return encode(type, seq, h);
    }
    case MessageType::add_job: {
      AddJob a;
      set_name(a.name, in.chance(10) ? "" : "job" + in.text(4));
      a.kind = static_cast<std::uint32_t>(in.below(3));
      a.priority = static_cast<std::int32_t>(in.bits(1)) - 128;
      a.device = static_cast<std::int32_t>(in.below(4)) - 1;
      a.persistent_hint = in.chance(90) ? in.below(8) * kMiB : in.bits(8);
      a.ephemeral_hint = in.chance(90) ? in.below(8) * kMiB : in.bits(8);
      a.limit_total = in.chance(80) ? 0 : in.bits(8);
      return encode(type, seq, a);
    }
    case MessageType::begin_iteration:
    case MessageType::end_iteration:
    case MessageType::withdraw:
    case MessageType::finish_job: {
      JobCall call{pick_id(in, jobs), in.chance(50) ? std::int64_t{0} : static_cast<std::int64_t>(in.below(3)) * 1000000 - 1,
                   static_cast<std::uint32_t>(in.below(2)), 0};
      // An unbounded wait could block a worker for good behind a job that never ends: bounded.
      if (call.timeout_ns < 0) call.timeout_ns = 1000000;
      if (type == MessageType::end_iteration) return encode(type, seq, end_of(in, call));
      return encode(type, seq, call);
    }
    case MessageType::take_pages:
    case MessageType::reclaim:
      return encode(type, seq, PageCount{static_cast<std::int32_t>(in.below(4)) - 1,
                                         static_cast<std::uint32_t>(in.chance(90) ? in.below(8) : in.bits(4))});
    case MessageType::give_pages: {
      std::vector<std::uint64_t> ids(in.below(6));
      for (auto& id : ids) id = pick_id(in, pages);
      // Settled, fenced (a CUDA-like fence: handle bytes, no descriptor), untouched, or unknown.
      const auto mode = static_cast<GiveFence>(in.chance(90) ? in.below(3) : in.bits(2));
      const GiveHead head{static_cast<std::int32_t>(in.below(3)) - 1,
                          static_cast<std::uint32_t>(in.chance(90) ? ids.size() : in.bits(4)),
                          mode, 0};
      FenceEntry fence;
      for (auto& b : fence.handle) b = static_cast<std::byte>(in.byte());
      fence.fd_index = in.chance(90) ? -1 : static_cast<std::int32_t>(in.below(3));
      return encode_body(type, seq,
                         give_pages_body(head, ids, mode == GiveFence::fenced ? &fence : nullptr));
    }
    default: {
      std::vector<std::byte> body(in.below(64));
      for (auto& b : body) b = static_cast<std::byte>(in.byte());
      return encode_body(type, seq, body);
    }
  }
}

std::vector<std::byte> raw(FuzzInput& in) {
  std::vector<std::byte> r(in.below(96));
  for (auto& b : r) b = static_cast<std::byte>(in.byte());
  if (r.size() >= sizeof(Header) && in.chance(70)) {  // mostly a believable header
    Header h;
    h.type = static_cast<std::uint16_t>(in.below(kLastMessageType + 2));
    h.seq = 1;
    h.body_bytes = static_cast<std::uint32_t>(in.chance(80) ? r.size() - sizeof(Header) : in.bits(4));
    std::memcpy(r.data(), &h, sizeof(h));
  }
  return r;
}

// A job's turn connection: an attach (mostly with a welcomed session's token, sometimes with
// another session's, a wrong token or a job that is not the session's), then a few turn calls,
// mostly for its job, waits bounded. A refusal must be an Error; a record the connection may not
// carry a ProtocolError, which ends only the connection.
void turn_connection(FuzzInput& in, Coordinator& coord, Seen& seen,
                     const salus::remote::PeerCredentials& me) {
  std::vector<std::pair<std::uint64_t, std::uint64_t>> sessions;
  std::vector<std::uint64_t> jobs;
  {
    std::lock_guard lock(seen.mu);
    sessions = seen.sessions;
    jobs = seen.jobs;
  }
  AttachTurns a;
  if (!sessions.empty() && in.chance(90)) {
    const auto& [session, token] = sessions[in.below(sessions.size())];
    a.session = session;
    a.token = in.chance(90) ? token : in.bits(8);
  } else {
    a.session = in.below(5);
    a.token = in.bits(8);
  }
  a.job = pick_id(in, jobs);
  Coordinator::TurnLink link;
  try {
    Record r;
    r.header = decode_header(encode(MessageType::attach_turns, 1, a));
    r.body.resize(sizeof(a));
    std::memcpy(r.body.data(), &a, sizeof(a));
    link = coord.attach_turns(me, r, [] {});
  } catch (const salus::Error&) {
    return;
  }
  for (int i = 0, n = static_cast<int>(in.below(6)); i < n && !in.empty(); ++i) {
    const MessageType types[] = {MessageType::begin_iteration, MessageType::end_iteration,
                                 MessageType::withdraw, MessageType::finish_job};
    const MessageType type = types[in.below(in.chance(90) ? 3 : 4)];
    // Bounded, as on the session's connection: nothing else would end a wait behind a job that
    // never ends its iteration.
    const JobCall call{in.chance(90) ? link.job_id : pick_id(in, jobs),
                       static_cast<std::int64_t>(in.below(3)) * 500000, 0, 0};
    try {
      Received r;
      const std::vector<std::byte> bytes =
          type == MessageType::end_iteration
              ? encode(type, static_cast<std::uint64_t>(i) + 2, end_of(in, call))
              : encode(type, static_cast<std::uint64_t>(i) + 2, call);
      r.record.header = decode_header(bytes);
      r.record.body.assign(bytes.begin() + sizeof(Header), bytes.end());
      // A begin whose turn is not there yet waits with no thread (the turn loop asks again
      // when its wait changes): nothing to read then.
      Coordinator::TurnResult result = coord.turn_call(link, r);
      if (!result.reply && !result.waiting) salus::fuzz::fail("a turn call came to nothing");
      if (!result.reply) {
        result.reply = coord.retry_turn(link, *result.waiting);
        if (!result.reply) continue;
      }
      const Header h = decode_header(result.reply->record);
      if (h.seq != static_cast<std::uint64_t>(i) + 2) salus::fuzz::fail("a turn reply's seq is not its call's");
    } catch (const ProtocolError&) {
      return;  // the server hangs up this connection only
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  FuzzInput in(data, size);
  const std::unique_ptr<Coordinator> owner = make_coordinator();
  Coordinator& coord = *owner;
  auto seen = std::make_shared<Seen>();
  std::vector<Client> clients(1 + in.below(3));
  const salus::remote::PeerCredentials me{::getpid(), ::getuid(), ::getgid()};
  auto open = [&](Client& c) {
    c.session = coord.open_session(me, sender(seen));
    c.seq = 1;
  };
  for (Client& c : clients) {
    open(c);
    if (in.chance(90)) {  // most conversations start right
      Hello h;
      set_name(h.name, "fuzz");
      Received r;
      r.record.header = decode_header(encode(MessageType::hello, c.seq++, h));
      r.record.body.resize(sizeof(h));
      std::memcpy(r.record.body.data(), &h, sizeof(h));
      coord.handle(c.session, std::move(r));
    }
  }
  for (int step = 0; step < 48 && !in.empty(); ++step) {
    Client& c = clients[in.below(clients.size())];
    if (in.chance(8)) {
      turn_connection(in, coord, *seen, me);
      if (std::string why = coord.inconsistency(); !why.empty()) salus::fuzz::fail(why);
      continue;
    }
    const std::vector<std::byte> bytes = in.chance(75) ? structured(in, c, *seen) : raw(in);
    salus::fuzz::describe_call(salus::fuzz::format_call("session %llu: %zu bytes",
                                                        static_cast<unsigned long long>(c.session), bytes.size()));
    try {
      Received r;
      r.record.header = decode_header(bytes);
      r.record.body.assign(bytes.begin() + sizeof(Header), bytes.end());
      coord.handle(c.session, std::move(r));
    } catch (const ProtocolError&) {
      coord.close_session(c.session);  // as the server drops a client that breaks the protocol
      open(c);
    }
    if (std::string why = coord.inconsistency(); !why.empty()) salus::fuzz::fail(why);
  }
  for (Client& c : clients) coord.close_session(c.session);
  if (std::string why = coord.inconsistency(); !why.empty()) salus::fuzz::fail(why);
  if (coord.device_use(0).granted_bytes != 0 || coord.device_use(1).granted_bytes != 0) {
    salus::fuzz::fail("pages still granted after every client left");
  }
  return 0;
}
