// Fuzz target: the input is a program of C ABI calls on a simulated NVLink mesh with spilling on
// (small GPUs and a small host limit, so that pages spill to peers and host and allocations run
// out of memory). After every call the target checks the answer against its own model
// (c_api_model.hpp): the status, the last error, that a failure changed nothing, that no two
// live blocks overlap, that every live block's bytes read back, and that job and device
// statistics balance. Any inconsistency aborts with a message.
//
// salus_job_begin_iteration is called on the main thread only where the policy admits the job at
// once (Model::admits_at_once); else, where the job will start when the running one ends, on one
// more thread (Waiter), which the main thread joins after the call that frees the device. Nowhere
// else: the call would block forever.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "c_api_model.hpp"
#include "c_api_streams.hpp"
#include "capi/capi.hpp"
#include "fuzz_input.hpp"
#include "salus/c_api.h"
#include "salus/runtime.hpp"
#include "salus/sim.hpp"

namespace salus::fuzz {
namespace {

const char* const kPolicies[] = {"fair", "srtf", "priority"};  // the single-lane policies

class Program {
 public:
  explicit Program(FuzzInput& in) : in_(in) {}

  // The runtime is made in C++ and wrapped in a C handle (as the C ABI tests with a backend of
  // their own do), for two options the C ABI does not carry:
  //  - how long an allocation waits for a safe point before it fails. By default 2 s, and in a
  //    single-threaded program with no job waiting for its turn no safe point ever comes, so
  //    each out-of-memory took 2 s;
  //  - how long an allocation the device refuses waits for other iterations to end. By default
  //    a minute, and here the main thread ends every iteration, also one that a Waiter began and
  //    handed over: an allocation behind it waits out the whole limit (with no limit it waited
  //    for good: regressions/fuzz_c_api/allocation_behind_a_handed_over_iteration).
  // The C ABI's own option handling is fuzz_runtime_options' part.
  void create() {
    const int devices = 2 + static_cast<int>(in_.below(3));
    const std::size_t memory = (in_.chance(50) ? 32 : 64) * kMiB;
    salus::RuntimeOptions options;
    options.policy = kPolicies[in_.below(3)];
    salus::HarvestOptions& harvest = options.memory.harvest;
    harvest.spill = salus::SpillPolicy::peer_then_host;
    harvest.lend_reserve_bytes = 0;  // every peer lends all its free memory: the budget is exact
    harvest.host_limit_bytes = (std::size_t{8} << in_.below(3)) * kMiB;  // 8, 16 or 32 MiB
    harvest.recall_wait = std::chrono::milliseconds(20);
    options.allocation_wait_limit = std::chrono::milliseconds(20);
    try {
      m_.runtime = salus::capi::wrap(std::make_shared<salus::Runtime>(
          salus::make_sim_backend(salus::SimConfig::nvlink_mesh(devices, memory)), options));
    } catch (const std::exception& e) {
      fail(std::string("making the runtime: ") + e.what());
    }
    m_.devices = devices;
    // A device's scheduler admits against what it can reach: its limit, what every peer of the
    // mesh lends (all of its limit, with no reserve) and the host limit.
    m_.budget = harvest.host_limit_bytes;
    for (int d = 0; d < devices; ++d) m_.budget += m_.device_stats(d, "create").limit;
  }

  void destroy() {
    if (std::getenv("SALUS_FUZZ_VERBOSE") != nullptr) {  // how far the program got into tiering
      for (int d = 0; d < m_.devices; ++d) {
        const salus_device_stats s = m_.device_stats(d, "destroy");
        std::fprintf(stderr,
                     "tiers: device %d lent %zu borrowed_peer %zu borrowed_host %zu "
                     "pages_moved %llu out_of_memory %llu\n",
                     d, s.lent, s.borrowed_peer, s.borrowed_host,
                     static_cast<unsigned long long>(s.pages_moved),
                     static_cast<unsigned long long>(s.out_of_memory));
      }
    }
    for (auto& [device, waiter] : waiters_) {
      describe_call(
          format_call("salus_job_cancel(job %u) of a waiter, before destroy", waiter->job));
      FUZZ_CHECK(salus_job_cancel(m_.runtime, waiter->job) == SALUS_OK, salus_last_error());
      waiter->join();
      FUZZ_CHECK(waiter->status == SALUS_ERROR_CANCELLED, waiter->error);
    }
    waiters_.clear();
    salus_runtime_destroy(m_.runtime);
    m_.runtime = nullptr;
  }

  void step() {
    switch (in_.below(16)) {
      case 0:
        add_job();
        break;
      case 1:
        begin_iteration();
        break;
      case 2:
        end_iteration();
        break;
      case 3:
        cancel_or_leave();
        break;
      case 4:
      case 5:
      case 6:
        allocate();
        break;
      case 7:
      case 8:
        deallocate();
        break;
      case 9:
        streams_.record_stream();
        break;
      case 10:
        streams_.create_stream();
        break;
      case 11:
        streams_.destroy_or_retire_stream();
        break;
      case 12:
        streams_.bind_or_unbind();
        break;
      case 13:
        current_job();
        break;
      case 14:
        trim();
        break;
      default:
        stats();
        break;
    }
  }

  Model& model() { return m_; }

 private:
  std::uint32_t pick_job_id() { return m_.pick_job_id(in_); }
  int pick_device(bool& valid) { return m_.pick_device(in_, valid); }
  void* pick_stream(int device) { return m_.pick_stream(in_, device); }
  void* invalid_stream() { return m_.invalid_stream(in_); }

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
      case 0:
        spec.name = nullptr;
        valid = false;
        break;
      case 1:
        spec.struct_size = sizeof spec + 8 * (1 + in_.below(4));
        valid = false;
        break;
      case 2:
        spec.kind = static_cast<salus_job_kind>(2 + in_.byte());
        valid = false;
        break;
      case 3:
        spec.hint_iteration_seconds = -1.0;
        valid = false;
        break;
      case 4:
        name.clear();
        spec.name = name.c_str();
        valid = false;
        break;
      default:
        break;
    }
    describe_call(
        format_call(
            "salus_job_add(device %d, kind %d, hints %zu/%zu, limits %zu/%zu/%zu, outlive %d)",
            spec.device, static_cast<int>(spec.kind), spec.hint_persistent_bytes,
            spec.hint_ephemeral_peak_bytes, spec.limit_total_bytes, spec.limit_persistent_bytes,
            spec.limit_ephemeral_bytes, spec.blocks_outlive_job) +
        (valid ? "" : " [invalid]"));
    const Snapshot before = m_.snapshot("salus_job_add");
    std::uint32_t id = 0;
    const salus_status st = salus_job_add(m_.runtime, &spec, &id);
    // Hints beyond what the device can ever give (its own memory, peers' and the host's) are
    // refused: such a job could never be admitted.
    const bool never_fits =
        spec.hint_persistent_bytes > m_.budget ||
        spec.hint_ephemeral_peak_bytes > m_.budget - spec.hint_persistent_bytes;
    m_.expect(st,
              {!valid ? SALUS_ERROR_INVALID_ARGUMENT
                      : never_fits ? SALUS_ERROR_OUT_OF_MEMORY : SALUS_OK},
              "salus_job_add", before);
    if (st == SALUS_OK) {
      FUZZ_CHECK(id != 0 && m_.job(id) == nullptr, "salus_job_add: a new id");
      m_.jobs.push_back({id, spec.device, spec.blocks_outlive_job != 0, JobState::idle, nullptr});
    }
    m_.check_all("salus_job_add");
  }

  salus_status gone_status(std::uint32_t id) { return m_.gone_status(id); }

  void begin_iteration() {
    const std::uint32_t id = pick_job_id();
    JobModel* j = m_.job(id);
    salus_status want = gone_status(id);
    if (want == SALUS_OK) {
      if (j->state == JobState::running || j->state == JobState::waiting) {
        want = SALUS_ERROR_INVALID_ARGUMENT;
      } else if (!m_.admits_at_once(*j, "begin check")) {
        wait_behind_running(*j);  // on a thread of its own, or not at all
        return;
      }
    }
    describe_call(format_call("salus_job_begin_iteration(job %u)", id));
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

  // Begins `j`'s iteration on a Waiter's thread, where a job runs on its device now and every job
  // of the device is admitted: it starts when that job ends, is cancelled or leaves. At most one
  // waiter per device. While it waits the job is quiescent, so its pages may move between tiers:
  // the other calls meanwhile are what exercises harvesting (lending, borrowing, demotion).
  void wait_behind_running(JobModel& j) {
    if (waiters_.contains(j.device) || m_.running_on(j.device) == nullptr ||
        !m_.all_admitted(j.device, 0, "wait check") || !in_.chance(60)) {
      return;  // it would wait for its turn, and nothing else would ever end the wait
    }
    describe_call(format_call("salus_job_begin_iteration(job %u) on a thread, behind job %u", j.id,
                              m_.running_on(j.device)->id));
    auto waiter = std::make_unique<Waiter>(m_.runtime, j.id);
    // The state and the safe point are read one after the other: wait for both.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    for (;;) {
      const salus_job_stats s = m_.job_stats(j.id, "waiting for the waiter");
      if (s.state == SALUS_JOB_WAITING && s.quiescent) break;
      if (std::chrono::steady_clock::now() > deadline) {
        salus_job_cancel(m_.runtime, j.id);
        waiter->join();
        fail(format_call("job %u never waited: its begin returned %s ", j.id,
                         salus_status_name(waiter->status)) +
             waiter->error);
      }
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    j.state = JobState::waiting;
    waiters_.emplace(j.device, std::move(waiter));
    m_.check_all("salus_job_begin_iteration on a thread");
  }

  // After a call on `id` succeeded: a waiter behind it (or the waiter itself, cancelled or gone)
  // returns, and is joined. `was_running`: `id` ran on `device` before the call.
  void settle_waiter(int device, std::uint32_t id, bool was_running, bool left) {
    const auto it = waiters_.find(device);
    if (it == waiters_.end()) return;
    Waiter& w = *it->second;
    if (w.job == id) {
      w.join();
      // Cancelled: woken with CANCELLED. Gone: its begin fails, saying why.
      FUZZ_CHECK(
          left ? w.status != SALUS_OK : w.status == SALUS_ERROR_CANCELLED,
          format_call("the waiter's begin returned %s: ", salus_status_name(w.status)) + w.error);
      FUZZ_CHECK(!w.error.empty(), "the waiter's failed begin left a message");
    } else if (was_running) {
      w.join();  // the device is free: the waiter starts
      FUZZ_CHECK(w.status == SALUS_OK && w.stream != nullptr,
                 format_call("job %u ended, but its waiter's begin returned %s: ", id,
                             salus_status_name(w.status)) +
                     w.error);
      JobModel* waiting = m_.job(w.job);
      waiting->state = JobState::running;
      waiting->iteration_stream = w.stream;
    } else {
      return;
    }
    waiters_.erase(it);
  }

  void end_iteration() {
    const std::uint32_t id = pick_job_id();
    JobModel* j = m_.job(id);
    salus_status want = gone_status(id);
    if (want == SALUS_OK && j->state != JobState::running) want = SALUS_ERROR_INVALID_ARGUMENT;
    // With a waiter behind it, its end must keep every job of the device admitted: else the
    // waiter would wait for good.
    if (want == SALUS_OK && waiters_.contains(j->device) &&
        !m_.all_admitted(j->device, id, "end check")) {
      return;
    }
    describe_call(format_call("salus_job_end_iteration(job %u)", id));
    const Snapshot before = m_.snapshot("salus_job_end_iteration");
    const salus_status st = salus_job_end_iteration(m_.runtime, id);
    m_.expect(st, {want}, "salus_job_end_iteration", before);
    if (st == SALUS_OK) {
      j->state = JobState::idle;
      settle_waiter(j->device, id, true, false);
    }
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
    describe_call(format_call("%s(job %u)", call, id));
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
      const int device = j->device;
      const bool was_running = j->state == JobState::running;
      release_blocks_of(*j);
      j->state = JobState::cancelled;
      j->iteration_stream = nullptr;
      if (leave) {
        m_.left_jobs.push_back(id);
        std::erase_if(m_.jobs, [&](const JobModel& x) { return x.id == id; });
      }
      settle_waiter(device, id, was_running, leave);
    }
    m_.check_all(call);
  }

  // ---- memory -----------------------------------------------------------------------------------

  std::size_t pick_size() {
    switch (in_.below(10)) {
      case 0:
        return 1 + in_.below(512);
      case 1:
      case 2:
        return 1 + in_.bits(2);  // up to 64 KiB
      case 3:
      case 4:
        return 1 + (in_.bits(3) % kMiB);  // up to 1 MiB
      case 5:
      case 6:
        return 1 + (in_.bits(3) % (8 * kMiB));  // up to 8 MiB
      case 7:
        return (1 + in_.below(16)) * 2 * kMiB;  // whole pages
      case 8:
        return 1 + (in_.bits(4) % (48 * kMiB));  // most of a device
      default:
        return 1 + in_.below(4096);
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
      case 0:
        size = 0;
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
        break;
      case 1:  // an absurd size: out of memory, or refused as more than a block can be
        size = in_.chance(50) ? SIZE_MAX - in_.byte() : std::size_t{1} << (40 + in_.below(20));
        faults.push_back(SALUS_ERROR_OUT_OF_MEMORY);
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
        break;
      case 2:
        lifetime = 3 + in_.byte();
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
        break;
      case 3:
        stream = invalid_stream();
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
        break;
      case 4:
        out_arg = nullptr;
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);
        break;
      default:
        break;
    }
    const JobModel* owner = job == SALUS_JOB_AUTO ? nullptr : m_.job(job);
    if (job != SALUS_JOB_AUTO) {
      if (owner == nullptr) {
        faults.push_back(SALUS_ERROR_UNKNOWN_JOB);
      } else if (owner->state == JobState::cancelled) {
        faults.push_back(SALUS_ERROR_CANCELLED);
      } else if (owner->device != device) {
        faults.push_back(SALUS_ERROR_INVALID_ARGUMENT);  // a job is charged on its own device only
      }
    }
    if (!faults.empty() && job == SALUS_JOB_AUTO && current_job_ != SALUS_JOB_AUTO) {
      // The thread's current job may be looked up first (see below).
      faults.insert(faults.end(),
                    {SALUS_ERROR_UNKNOWN_JOB, SALUS_ERROR_CANCELLED, SALUS_ERROR_INVALID_ARGUMENT});
    }
    describe_call(
        format_call("salus_allocate(size %zu, device %d, stream %p, job %u, lifetime %d, out %p)",
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
      m_.expect(st,
                {SALUS_OK, SALUS_ERROR_OUT_OF_MEMORY, SALUS_ERROR_CANCELLED,
                 SALUS_ERROR_UNKNOWN_JOB, SALUS_ERROR_INVALID_ARGUMENT},
                "salus_allocate", before);
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
    Block b{ptr,    size, (size + kBlockAlignment - 1) / kBlockAlignment * kBlockAlignment,
            device, 0,    m_.next_seed++};
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
    if (const JobModel* o = m_.job(charged); o != nullptr && o->state == JobState::waiting) {
      b.seed = 0;  // its job is quiescent: its pages may move while we would write
    }
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
        const Block& b =
            std::next(m_.blocks.begin(), static_cast<long>(in_.below(m_.blocks.size())))->second;
        if (b.bytes > kBlockAlignment) ptr = b.ptr + kBlockAlignment;
      }
      if (m_.blocks.contains(ptr)) return;
      describe_call(format_call("salus_deallocate(%p) of no block", reinterpret_cast<void*>(ptr)));
      const salus_status st = salus_deallocate(m_.runtime, reinterpret_cast<void*>(ptr), 0,
                                               static_cast<int>(in_.below(2)));
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
      case 0:
        size = b.requested + 4096 * (1 + in_.below(4));
        want = SALUS_ERROR_INVALID_ARGUMENT;
        break;
      case 1:
        device =
            (b.device + 1 + static_cast<int>(in_.below(static_cast<std::size_t>(m_.devices) - 1))) %
            m_.devices;
        want = SALUS_ERROR_INVALID_ARGUMENT;
        break;
      default:
        break;
    }
    describe_call(format_call(
        "salus_deallocate(%p, size %zu, device %d) of a block of %zu bytes on device %d",
        reinterpret_cast<void*>(b.ptr), size, device, b.requested, b.device));
    const salus_status st =
        salus_deallocate(m_.runtime, reinterpret_cast<void*>(b.ptr), size, device);
    m_.expect(st, {want}, "salus_deallocate", before);
    if (st == SALUS_OK) {
      m_.blocks.erase(it);
      m_.freed.push_back(b.ptr);
      if (m_.freed.size() > 64) m_.freed.erase(m_.freed.begin());
    }
    m_.check_all("salus_deallocate");
  }

  // ---- the rest ---------------------------------------------------------------------------------

  void current_job() {
    const Snapshot before = m_.snapshot("salus_set_current_job");
    if (in_.chance(30)) {
      std::uint32_t job = 0;
      m_.expect(salus_get_current_job(m_.runtime, &job), {SALUS_OK}, "salus_get_current_job",
                before);
      return;
    }
    const std::uint32_t id = in_.chance(20) ? SALUS_JOB_AUTO : pick_job_id();
    const JobModel* j = m_.job(id);
    describe_call(format_call("salus_set_current_job(job %u)", id));
    const salus_status st = salus_set_current_job(m_.runtime, id);
    if (id == SALUS_JOB_AUTO || (j != nullptr && j->state != JobState::cancelled)) {
      m_.expect(st, {SALUS_OK}, "salus_set_current_job", before);
      current_job_ = id;
    } else {
      m_.expect(st, {SALUS_ERROR_UNKNOWN_JOB, SALUS_ERROR_CANCELLED}, "salus_set_current_job",
                before);
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
    m_.expect(st, {m_.job(id) != nullptr ? SALUS_OK : SALUS_ERROR_UNKNOWN_JOB},
              "salus_job_get_stats", before);
    if (st == SALUS_OK) FUZZ_CHECK(s.job == id, "salus_job_get_stats: the job asked for");
  }

  FuzzInput& in_;
  Model m_;
  StreamCalls streams_{in_, m_};
  std::uint32_t current_job_ = SALUS_JOB_AUTO;      // the thread's, as salus_set_current_job set it
  std::map<int, std::unique_ptr<Waiter>> waiters_;  // by device
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
