// Fuzz target: the input is a program of C ABI calls on a simulated NVLink mesh with spilling on
// (small GPUs and a small host limit, so that pages spill to peers and host and allocations run
// out of memory). After every call the target checks the answer against its own model
// (c_api_model.hpp): the status, the last error, that a failure changed nothing, that no two
// live blocks overlap, that every live block's bytes read back, and that job and device
// statistics balance. Any inconsistency aborts with a message.
//
// The target is single-threaded, so it calls salus_job_begin_iteration only where the policy
// admits the job at once (Model::admits_at_once); anywhere else the call would block forever.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <set>
#include <string>
#include <vector>

#include "c_api_model.hpp"
#include "fuzz_input.hpp"
#include "salus/c_api.h"

namespace salus::fuzz {
namespace {

// printf-style formatting for the call descriptions.
template <class... Args>
std::string fmt(const char* format, Args... args) {
  char buf[256];
  std::snprintf(buf, sizeof buf, format, args...);
  return buf;
}

const char* const kPolicies[] = {"fair", "srtf", "priority"};  // the single-lane policies
const void* const kBogusStream = reinterpret_cast<void*>(std::uintptr_t{0x5a1e5});

class Program {
 public:
  explicit Program(FuzzInput& in) : in_(in) {}

  bool create() {
    salus_runtime_options o;
    salus_runtime_options_init(&o);
    o.backend = SALUS_BACKEND_SIM;
    o.sim_device_count = 2 + static_cast<int>(in_.below(3));
    o.sim_device_memory_bytes = (in_.chance(50) ? 32 : 64) * kMiB;
    o.sim_topology = SALUS_SIM_NVLINK_MESH;
    o.spill = SALUS_SPILL_PEER_THEN_HOST;
    o.lend_reserve_bytes = 0;  // every peer lends all its free memory: the budget below is exact
    o.host_limit_bytes = (std::size_t{8} << in_.below(3)) * kMiB;  // 8, 16 or 32 MiB
    o.policy = kPolicies[in_.below(3)];
    m_.devices = o.sim_device_count;
    if (salus_runtime_create(&o, &m_.runtime) != SALUS_OK) {
      fail(std::string("salus_runtime_create: ") + salus_last_error());
    }
    // A device's scheduler admits against what it can reach: its memory, what every peer of the
    // mesh lends (all of it, with no reserve) and the host limit.
    m_.budget = o.host_limit_bytes + static_cast<std::size_t>(m_.devices) * o.sim_device_memory_bytes;
    return true;
  }

  void destroy() {
    if (std::getenv("SALUS_FUZZ_VERBOSE") != nullptr) {  // how far the program got into tiering
      for (int d = 0; d < m_.devices; ++d) {
        const salus_device_stats s = m_.device_stats(d, "destroy");
        std::fprintf(stderr, "tiers: device %d lent %zu borrowed_peer %zu borrowed_host %zu "
                     "pages_moved %llu out_of_memory %llu\n", d, s.lent, s.borrowed_peer,
                     s.borrowed_host, static_cast<unsigned long long>(s.pages_moved),
                     static_cast<unsigned long long>(s.out_of_memory));
      }
    }
    salus_runtime_destroy(m_.runtime);
    m_.runtime = nullptr;
  }

  void step() {
    switch (in_.below(16)) {
      case 0: add_job(); break;
      case 1: begin_iteration(); break;
      case 2: end_iteration(); break;
      case 3: cancel_or_leave(); break;
      case 4:
      case 5:
      case 6: allocate(); break;
      case 7:
      case 8: deallocate(); break;
      case 9: record_stream(); break;
      case 10: create_stream(); break;
      case 11: destroy_or_retire_stream(); break;
      case 12: bind_or_unbind(); break;
      case 13: current_job(); break;
      case 14: trim(); break;
      default: stats(); break;
    }
  }

  Model& model() { return m_; }

 private:
  // A job id: mostly one the model knows, sometimes one that left or was never made.
  std::uint32_t pick_job_id() {
    const std::size_t k = in_.below(8);
    if (k == 0 && !m_.left_jobs.empty()) return m_.left_jobs[in_.below(m_.left_jobs.size())];
    if (k == 1) return 100000 + in_.byte();
    if (m_.jobs.empty()) return 100000;
    return m_.jobs[in_.below(m_.jobs.size())].id;
  }

  // A device index: mostly valid.
  int pick_device(bool& valid) {
    const std::size_t k = in_.below(16);
    valid = k != 0;
    if (k == 0) return in_.chance(50) ? -1 : m_.devices + static_cast<int>(in_.below(3));
    return static_cast<int>(in_.below(static_cast<std::size_t>(m_.devices)));
  }

  // A valid stream of `device`: the default, one made by salus_stream_create, or the iteration
  // stream of one of its jobs.
  void* pick_stream(int device) {
    std::vector<void*> options{nullptr};
    for (const StreamModel& s : m_.streams) {
      if (s.device == device) options.push_back(s.handle);
    }
    for (const JobModel& j : m_.jobs) {
      if (j.device == device && j.iteration_stream != nullptr) options.push_back(j.iteration_stream);
    }
    return options[in_.below(options.size())];
  }

  void* invalid_stream() {
    if (!m_.destroyed_streams.empty() && in_.chance(50)) {
      return m_.destroyed_streams[in_.below(m_.destroyed_streams.size())];
    }
    return const_cast<void*>(kBogusStream);
  }

  // ---- jobs -------------------------------------------------------------------------------------

  void add_job() {
    if (m_.jobs.size() >= 8) return;
    salus_job_spec spec;
    salus_job_spec_init(&spec);
    bool valid = true;
    std::string name = "job" + std::to_string(m_.jobs.size() + m_.left_jobs.size());
    spec.name = name.c_str();
    spec.kind = in_.chance(50) ? SALUS_JOB_TRAINING : SALUS_JOB_INFERENCE;
    spec.priority = static_cast<int>(in_.bits(1)) - 128;
    spec.device = pick_device(valid);
    spec.expected_iterations = in_.below(4) * 10;
    static constexpr std::size_t kHints[] = {0, 0, kMiB, 8 * kMiB, std::size_t{1} << 30, SIZE_MAX};
    spec.hint_persistent_bytes = kHints[in_.below(6)];
    spec.hint_ephemeral_peak_bytes = kHints[in_.below(6)];
    spec.hint_iteration_seconds = in_.below(3) * 0.01;
    static constexpr std::size_t kLimits[] = {0, 0, 0, 64 * 1024, kMiB, 16 * kMiB};
    spec.limit_total_bytes = kLimits[in_.below(6)];
    spec.limit_persistent_bytes = kLimits[in_.below(6)];
    spec.limit_ephemeral_bytes = kLimits[in_.below(6)];
    spec.blocks_outlive_job = in_.chance(25) ? 1 : 0;
    switch (in_.below(12)) {  // at most one more fault per call
      case 0: spec.name = nullptr; valid = false; break;
      case 1: spec.struct_size = sizeof spec + 8 * (1 + in_.below(4)); valid = false; break;
      case 2: spec.kind = static_cast<salus_job_kind>(2 + in_.byte()); valid = false; break;
      case 3: spec.hint_iteration_seconds = -1.0; valid = false; break;
      case 4: name.clear(); spec.name = name.c_str(); valid = false; break;
      default: break;
    }
    describe_call(fmt("salus_job_add(device %d, kind %d, hints %zu/%zu, limits %zu/%zu/%zu, outlive %d)",
                      spec.device, static_cast<int>(spec.kind), spec.hint_persistent_bytes,
                      spec.hint_ephemeral_peak_bytes, spec.limit_total_bytes,
                      spec.limit_persistent_bytes, spec.limit_ephemeral_bytes,
                      spec.blocks_outlive_job) + (valid ? "" : " [invalid]"));
    const Snapshot before = m_.snapshot("salus_job_add");
    std::uint32_t id = 0;
    const salus_status st = salus_job_add(m_.runtime, &spec, &id);
    m_.expect(st, {valid ? SALUS_OK : SALUS_ERROR_INVALID_ARGUMENT}, "salus_job_add", before);
    if (st == SALUS_OK) {
      FUZZ_CHECK(id != 0 && m_.job(id) == nullptr, "salus_job_add: a new id");
      m_.jobs.push_back({id, spec.device, spec.blocks_outlive_job != 0, JobState::idle, nullptr});
    }
    m_.check_all("salus_job_add");
  }

  // The status every job call gives a job that cannot take it: gone or cancelled.
  salus_status gone_status(std::uint32_t id) {
    const JobModel* j = m_.job(id);
    if (j == nullptr) return SALUS_ERROR_UNKNOWN_JOB;
    return j->state == JobState::cancelled ? SALUS_ERROR_CANCELLED : SALUS_OK;
  }

  void begin_iteration() {
    const std::uint32_t id = pick_job_id();
    JobModel* j = m_.job(id);
    salus_status want = gone_status(id);
    if (want == SALUS_OK) {
      if (j->state == JobState::running) {
        want = SALUS_ERROR_INVALID_ARGUMENT;
      } else if (!m_.admits_at_once(*j, "begin check")) {
        return;  // it would wait for its turn, and nothing else would ever end the wait
      }
    }
    describe_call(fmt("salus_job_begin_iteration(job %u)", id));
    const Snapshot before = m_.snapshot("salus_job_begin_iteration");
    void* stream = nullptr;
    const salus_status st = salus_job_begin_iteration(m_.runtime, id, &stream);
    m_.expect(st, {want}, "salus_job_begin_iteration", before);
    if (st == SALUS_OK) {
      FUZZ_CHECK(stream != nullptr, "an iteration runs on a lane stream, not the default");
      j->state = JobState::running;
      j->iteration_stream = stream;
    }
    m_.check_all("salus_job_begin_iteration");
  }

  void end_iteration() {
    const std::uint32_t id = pick_job_id();
    JobModel* j = m_.job(id);
    salus_status want = gone_status(id);
    if (want == SALUS_OK && j->state != JobState::running) want = SALUS_ERROR_INVALID_ARGUMENT;
    describe_call(fmt("salus_job_end_iteration(job %u)", id));
    const Snapshot before = m_.snapshot("salus_job_end_iteration");
    const salus_status st = salus_job_end_iteration(m_.runtime, id);
    m_.expect(st, {want}, "salus_job_end_iteration", before);
    if (st == SALUS_OK) j->state = JobState::idle;
    m_.check_all("salus_job_end_iteration");
  }

  // The job's blocks after it is cancelled or leaves: freed, or (blocks_outlive_job) kept and
  // charged to nobody.
  void release_blocks_of(const JobModel& j) {
    for (auto it = m_.blocks.begin(); it != m_.blocks.end();) {
      if (it->second.job != j.id) {
        ++it;
      } else if (j.outlive) {
        it->second.job = 0;
        ++it;
      } else {
        m_.freed.push_back(it->first);
        it = m_.blocks.erase(it);
      }
    }
  }

  void cancel_or_leave() {
    const bool leave = in_.chance(50);
    const std::uint32_t id = pick_job_id();
    JobModel* j = m_.job(id);
    const char* call = leave ? "salus_job_leave" : "salus_job_cancel";
    describe_call(fmt("%s(job %u)", call, id));
    const Snapshot before = m_.snapshot(call);
    const salus_status st =
        leave ? salus_job_leave(m_.runtime, id) : salus_job_cancel(m_.runtime, id);
    if (j == nullptr) {
      m_.expect(st, {SALUS_ERROR_UNKNOWN_JOB}, call, before);
    } else if (!leave && j->state == JobState::cancelled) {
      m_.expect(st, {SALUS_OK, SALUS_ERROR_CANCELLED}, call, before);  // cancelling again
    } else {
      m_.expect(st, {SALUS_OK}, call, before);
    }
    if (st == SALUS_OK) {
      release_blocks_of(*j);
      if (leave && j->state == JobState::cancelled) cancelled_then_left_.insert(id);
      j->state = JobState::cancelled;
      j->iteration_stream = nullptr;
      if (leave) {
        m_.left_jobs.push_back(id);
        std::erase_if(m_.jobs, [&](const JobModel& x) { return x.id == id; });
      }
    }
    m_.check_all(call);
  }

  // ---- memory -----------------------------------------------------------------------------------

  std::size_t pick_size() {
    switch (in_.below(10)) {
      case 0: return 1 + in_.below(512);
      case 1:
      case 2: return 1 + in_.bits(2);                        // up to 64 KiB
      case 3:
      case 4: return 1 + (in_.bits(3) % kMiB);               // up to 1 MiB
      case 5:
      case 6: return 1 + (in_.bits(3) % (8 * kMiB));         // up to 8 MiB
      case 7: return (1 + in_.below(16)) * 2 * kMiB;         // whole pages
      case 8: return 1 + (in_.bits(4) % (48 * kMiB));        // most of a device
      default: return 1 + in_.below(4096);
    }
  }

  void allocate() {
    if (m_.blocks.size() >= 48) return;
    bool valid_device = true;
    const int device = pick_device(valid_device);
    std::size_t size = pick_size();
    void* stream = valid_device ? pick_stream(device) : nullptr;
    std::uint32_t job = SALUS_JOB_AUTO;
    if (in_.chance(60)) job = pick_job_id();
    int lifetime = static_cast<int>(in_.below(3));
    void* out = nullptr;
    void** out_arg = &out;
    // What is wrong with the call, each with its status; with several, the order in which the
    // C ABI checks them is not promised, so any of theirs is right.
    std::vector<salus_status> faults;
    if (!valid_device) faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
    switch (in_.below(14)) {
      case 0: size = 0; faults.push_back(SALUS_ERROR_INVALID_ARGUMENT); break;
      case 1:  // an absurd size: out of memory, or refused as more than a block can be
        size = in_.chance(50) ? SIZE_MAX - in_.byte() : std::size_t{1} << (40 + in_.below(20));
        faults.push_back(SALUS_ERROR_OUT_OF_MEMORY);
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
        break;
      case 2: lifetime = 3 + in_.byte(); faults.push_back(SALUS_ERROR_INVALID_ARGUMENT); break;
      case 3: stream = invalid_stream(); faults.push_back(SALUS_ERROR_INVALID_ARGUMENT); break;
      case 4: out_arg = nullptr; faults.push_back(SALUS_ERROR_INVALID_ARGUMENT); break;
      default: break;
    }
    const JobModel* owner = job == SALUS_JOB_AUTO ? nullptr : m_.job(job);
    if (job != SALUS_JOB_AUTO) {
      if (owner == nullptr) {
        faults.push_back(SALUS_ERROR_UNKNOWN_JOB);
        // The C++ runtime still calls a job that was cancelled before it left "cancelled", where
        // the header promises UNKNOWN_JOB for any id that left (see the report of issue 12).
        if (cancelled_then_left_.contains(job)) faults.push_back(SALUS_ERROR_CANCELLED);
      } else if (owner->state == JobState::cancelled) {
        faults.push_back(SALUS_ERROR_CANCELLED);
      } else if (owner->device != device) {
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);  // a job is charged on its own device only
      }
    }
    if (!faults.empty() && job == SALUS_JOB_AUTO && current_job_ != SALUS_JOB_AUTO) {
      // The thread's current job may be looked up first (see below).
      faults.insert(faults.end(), {SALUS_ERROR_UNKNOWN_JOB, SALUS_ERROR_CANCELLED,
                                   SALUS_ERROR_INVALID_ARGUMENT});
    }
    describe_call(fmt("salus_allocate(size %zu, device %d, stream %p, job %u, lifetime %d, out %p)",
                      size, device, stream, job, lifetime, static_cast<void*>(out_arg)) +
                  (faults.empty() ? "" : " [faulty]"));
    const Snapshot before = m_.snapshot("salus_allocate");
    const salus_status st = salus_allocate(m_.runtime, size, device, stream, job,
                                           static_cast<salus_lifetime>(lifetime), out_arg);
    if (!faults.empty()) {
      FUZZ_CHECK(std::find(faults.begin(), faults.end(), st) != faults.end(),
                 std::string("salus_allocate returned ") + salus_status_name(st) + ": " +
                     salus_last_error());
      m_.expect(st, {st}, "salus_allocate", before);
    } else if (job == SALUS_JOB_AUTO && current_job_ != SALUS_JOB_AUTO) {
      // The thread's current job (salus_set_current_job) is charged, and it stays set when the
      // job is cancelled or leaves: the call then names that job (UNKNOWN_JOB or CANCELLED); on
      // another device than the job's it is refused (Runtime::Impl::job), where the job inside an
      // iteration on this thread would leave the block unattributed instead.
      m_.expect(st, {SALUS_OK, SALUS_ERROR_OUT_OF_MEMORY, SALUS_ERROR_CANCELLED,
                     SALUS_ERROR_UNKNOWN_JOB, SALUS_ERROR_INVALID_ARGUMENT}, "salus_allocate", before);
    } else {
      // Attribution by a bound stream to a job that was cancelled meanwhile is refused.
      m_.expect(st, {SALUS_OK, SALUS_ERROR_OUT_OF_MEMORY, SALUS_ERROR_CANCELLED}, "salus_allocate",
                before);
      FUZZ_CHECK(st != SALUS_ERROR_CANCELLED || job == SALUS_JOB_AUTO, salus_last_error());
    }
    if (st == SALUS_OK) record_block(out, size, device, job, before);
    m_.check_all("salus_allocate");
  }

  // A new block: where it is, whom it is charged to (the one job whose in_use grew by its size,
  // or nobody), and its pattern.
  void record_block(void* out, std::size_t size, int device, std::uint32_t job,
                    const Snapshot& before) {
    const auto ptr = reinterpret_cast<std::uintptr_t>(out);
    FUZZ_CHECK(ptr != 0 && ptr % kBlockAlignment == 0, "salus_allocate: an aligned pointer");
    Block b{ptr, size, (size + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment, device, 0,
            m_.next_seed++};
    std::uint32_t charged = 0;
    for (std::size_t i = 0; i < m_.jobs.size(); ++i) {
      const std::size_t now = m_.job_stats(m_.jobs[i].id, "salus_allocate").in_use;
      if (now == before.job_in_use[i]) continue;
      FUZZ_CHECK(charged == 0 && now == before.job_in_use[i] + b.bytes,
                 "salus_allocate: one job is charged the block's bytes");
      charged = m_.jobs[i].id;
    }
    FUZZ_CHECK(job == SALUS_JOB_AUTO || charged == job,
               "salus_allocate: charged to job " + std::to_string(charged) + ", not the one named");
    b.job = charged;
    write_pattern(b);
    m_.blocks.emplace(ptr, b);
  }

  void deallocate() {
    const Snapshot before = m_.snapshot("salus_deallocate");
    if (m_.blocks.empty() || in_.chance(15)) {
      // Not a live block: freed before (and not handed out again), inside a block, or unknown.
      int local = 0;
      std::uintptr_t ptr = reinterpret_cast<std::uintptr_t>(&local);
      if (!m_.freed.empty() && in_.chance(50)) {
        ptr = m_.freed[in_.below(m_.freed.size())];
      } else if (!m_.blocks.empty() && in_.chance(50)) {
        const Block& b = std::next(m_.blocks.begin(), static_cast<long>(in_.below(m_.blocks.size())))->second;
        if (b.bytes > kBlockAlignment) ptr = b.ptr + kBlockAlignment;
      }
      if (m_.blocks.contains(ptr)) return;
      describe_call(fmt("salus_deallocate(%p) of no block", reinterpret_cast<void*>(ptr)));
      const salus_status st =
          salus_deallocate(m_.runtime, reinterpret_cast<void*>(ptr), 0, static_cast<int>(in_.below(2)));
      m_.expect(st, {SALUS_ERROR_INVALID_ARGUMENT}, "salus_deallocate (not a block)", before);
      m_.check_all("salus_deallocate (not a block)");
      return;
    }
    auto it = std::next(m_.blocks.begin(), static_cast<long>(in_.below(m_.blocks.size())));
    const Block b = it->second;
    std::size_t size = in_.chance(50) ? b.requested : 0;
    int device = b.device;
    salus_status want = SALUS_OK;
    switch (in_.below(10)) {
      case 0: size = b.requested + 4096 * (1 + in_.below(4)); want = SALUS_ERROR_INVALID_ARGUMENT; break;
      case 1: device = (b.device + 1 + static_cast<int>(in_.below(static_cast<std::size_t>(m_.devices) - 1))) % m_.devices;
              want = SALUS_ERROR_INVALID_ARGUMENT; break;
      default: break;
    }
    describe_call(fmt("salus_deallocate(%p, size %zu, device %d) of a block of %zu bytes on device %d",
                      reinterpret_cast<void*>(b.ptr), size, device, b.requested, b.device));
    const salus_status st = salus_deallocate(m_.runtime, reinterpret_cast<void*>(b.ptr), size, device);
    m_.expect(st, {want}, "salus_deallocate", before);
    if (st == SALUS_OK) {
      m_.blocks.erase(it);
      m_.freed.push_back(b.ptr);
      if (m_.freed.size() > 64) m_.freed.erase(m_.freed.begin());
    }
    m_.check_all("salus_deallocate");
  }

  void record_stream() {
    if (m_.blocks.empty()) return;
    const Block& b = std::next(m_.blocks.begin(), static_cast<long>(in_.below(m_.blocks.size())))->second;
    void* stream = pick_stream(b.device);
    salus_status want = SALUS_OK;
    void* ptr = reinterpret_cast<void*>(b.ptr);
    switch (in_.below(8)) {
      case 0: stream = invalid_stream(); want = SALUS_ERROR_INVALID_ARGUMENT; break;
      case 1: ptr = reinterpret_cast<void*>(b.ptr + 8); want = SALUS_ERROR_INVALID_ARGUMENT; break;
      case 2: ptr = nullptr; want = SALUS_ERROR_INVALID_ARGUMENT; break;
      default: break;
    }
    describe_call(fmt("salus_record_stream(%p, stream %p)", ptr, stream));
    const Snapshot before = m_.snapshot("salus_record_stream");
    m_.expect(salus_record_stream(m_.runtime, ptr, stream), {want}, "salus_record_stream", before);
    m_.check_all("salus_record_stream");
  }

  // ---- streams ----------------------------------------------------------------------------------

  void create_stream() {
    if (m_.streams.size() >= 8) return;
    bool valid = true;
    const int device = pick_device(valid);
    describe_call(fmt("salus_stream_create(device %d)", device));
    const Snapshot before = m_.snapshot("salus_stream_create");
    void* stream = nullptr;
    const salus_status st =
        salus_stream_create(m_.runtime, device, static_cast<int>(in_.below(3)) - 1, &stream);
    m_.expect(st, {valid ? SALUS_OK : SALUS_ERROR_INVALID_ARGUMENT}, "salus_stream_create", before);
    if (st == SALUS_OK) {
      FUZZ_CHECK(stream != nullptr, "salus_stream_create: a stream");
      m_.streams.push_back({stream, device, 0});
    }
    m_.check_all("salus_stream_create");
  }

  void destroy_or_retire_stream() {
    const bool destroy = in_.chance(60);
    const char* call = destroy ? "salus_stream_destroy" : "salus_stream_retire";
    const Snapshot before = m_.snapshot(call);
    if (m_.streams.empty() || in_.chance(20)) {
      void* stream = in_.chance(50) ? nullptr : invalid_stream();
      describe_call(fmt("%s(device 0, stream %p) of no stream", call, stream));
      const salus_status st = destroy ? salus_stream_destroy(m_.runtime, 0, stream)
                                      : salus_stream_retire(m_.runtime, 0, stream);
      // Retiring a handle the backend does not know retires nothing: it may pass.
      m_.expect(st, {SALUS_ERROR_INVALID_ARGUMENT, destroy || stream == nullptr ? SALUS_ERROR_INVALID_ARGUMENT : SALUS_OK}, call, before);
      m_.check_all(call);
      return;
    }
    const std::size_t k = in_.below(m_.streams.size());
    const StreamModel s = m_.streams[k];
    describe_call(fmt("%s(device %d, stream %p)", call, s.device, s.handle));
    const salus_status st = destroy ? salus_stream_destroy(m_.runtime, s.device, s.handle)
                                    : salus_stream_retire(m_.runtime, s.device, s.handle);
    m_.expect(st, {SALUS_OK}, call, before);
    if (destroy) {
      m_.streams.erase(m_.streams.begin() + static_cast<long>(k));
      m_.destroyed_streams.push_back(s.handle);
    }
    m_.check_all(call);
  }

  void bind_or_unbind() {
    if (m_.streams.empty()) return;
    StreamModel& s = m_.streams[in_.below(m_.streams.size())];
    if (in_.chance(40)) {
      describe_call(fmt("salus_stream_unbind(device %d, stream %p) bound to %u", s.device, s.handle,
                        s.bound_job));
      const Snapshot before = m_.snapshot("salus_stream_unbind");
      const salus_status st = salus_stream_unbind(m_.runtime, s.device, s.handle);
      const JobModel* bound = m_.job(s.bound_job);
      if (s.bound_job == 0) {
        m_.expect(st, {SALUS_ERROR_INVALID_ARGUMENT}, "salus_stream_unbind", before);
      } else if (bound == nullptr || bound->state == JobState::cancelled) {
        // The binding ended with its job (left), or may have (cancelled).
        m_.expect(st, {SALUS_OK, SALUS_ERROR_INVALID_ARGUMENT}, "salus_stream_unbind", before);
      } else {
        m_.expect(st, {SALUS_OK}, "salus_stream_unbind", before);
      }
      s.bound_job = 0;
      m_.check_all("salus_stream_unbind");
      return;
    }
    if (s.bound_job != 0) return;  // rebinding is not modelled
    const std::uint32_t id = in_.chance(10) ? 0 : pick_job_id();
    const JobModel* j = m_.job(id);
    salus_status want = id == 0 ? SALUS_ERROR_INVALID_ARGUMENT : gone_status(id);
    if (want == SALUS_OK && j->device != s.device) want = SALUS_ERROR_INVALID_ARGUMENT;
    // (As in allocate: an id cancelled before it left may still be called cancelled.)
    const salus_status also = cancelled_then_left_.contains(id) ? SALUS_ERROR_CANCELLED : want;
    describe_call(fmt("salus_stream_bind(device %d, stream %p, job %u)", s.device, s.handle, id));
    const Snapshot before = m_.snapshot("salus_stream_bind");
    const salus_status st = salus_stream_bind(m_.runtime, s.device, s.handle, id);
    m_.expect(st, {want, also}, "salus_stream_bind", before);
    if (st == SALUS_OK) s.bound_job = id;
    m_.check_all("salus_stream_bind");
  }

  // ---- the rest ---------------------------------------------------------------------------------

  void current_job() {
    const Snapshot before = m_.snapshot("salus_set_current_job");
    if (in_.chance(30)) {
      std::uint32_t job = 0;
      m_.expect(salus_get_current_job(m_.runtime, &job), {SALUS_OK}, "salus_get_current_job", before);
      return;
    }
    const std::uint32_t id = in_.chance(20) ? SALUS_JOB_AUTO : pick_job_id();
    const JobModel* j = m_.job(id);
    describe_call(fmt("salus_set_current_job(job %u)", id));
    const salus_status st = salus_set_current_job(m_.runtime, id);
    if (id == SALUS_JOB_AUTO || (j != nullptr && j->state != JobState::cancelled)) {
      m_.expect(st, {SALUS_OK}, "salus_set_current_job", before);
      current_job_ = id;
    } else {
      m_.expect(st, {SALUS_ERROR_UNKNOWN_JOB, SALUS_ERROR_CANCELLED}, "salus_set_current_job", before);
    }
    m_.check_all("salus_set_current_job");
  }

  void trim() {
    describe_call("salus_trim");
    const Snapshot before = m_.snapshot("salus_trim");
    std::size_t released = SIZE_MAX;
    m_.expect(salus_trim(m_.runtime, in_.chance(20) ? nullptr : &released), {SALUS_OK},
              "salus_trim", before);
    FUZZ_CHECK(released == SIZE_MAX || released < kSane, "salus_trim: released bytes wrapped");
    m_.check_all("salus_trim");
  }

  void stats() {
    describe_call("salus_get_device_stats / salus_job_get_stats");
    const Snapshot before = m_.snapshot("stats");
    bool valid = true;
    const int device = pick_device(valid);
    salus_device_stats d{};
    d.struct_size = in_.chance(10) ? sizeof d - 8 : sizeof d;
    valid = valid && d.struct_size == sizeof d;
    m_.expect(salus_get_device_stats(m_.runtime, device, &d),
              {valid ? SALUS_OK : SALUS_ERROR_INVALID_ARGUMENT}, "salus_get_device_stats", before);
    const std::uint32_t id = pick_job_id();
    salus_job_stats s{};
    s.struct_size = sizeof s;
    const salus_status st = salus_job_get_stats(m_.runtime, id, &s);
    m_.expect(st, {m_.job(id) != nullptr ? SALUS_OK : SALUS_ERROR_UNKNOWN_JOB}, "salus_job_get_stats",
              before);
    if (st == SALUS_OK) FUZZ_CHECK(s.job == id, "salus_job_get_stats: the job asked for");
  }

  FuzzInput& in_;
  Model m_;
  std::uint32_t current_job_ = SALUS_JOB_AUTO;  // the thread's, as salus_set_current_job set it
  std::set<std::uint32_t> cancelled_then_left_;
};

}  // namespace
}  // namespace salus::fuzz

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  salus::fuzz::FuzzInput in(data, size);
  salus::fuzz::Program program(in);
  program.create();
  // A bounded program: each step is a C ABI call plus a full check of the model.
  for (int steps = 0; steps < 200 && !in.empty(); ++steps) program.step();
  program.destroy();
  return 0;
}
