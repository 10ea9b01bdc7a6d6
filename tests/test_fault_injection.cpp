// Fault injection at scale: the fake CUDA driver fails a random driver call at a chosen rate while
// a seeded random mix of memory operations (allocate and free on several streams, record-stream,
// queued kernels, promotion, safe points, demotion, prefetch, remap, trim, jobs coming and going)
// runs over 4 devices with harvesting on (peers, then the host). After every operation:
//  - an operation that failed threw a typed salus::Error; a DeviceError names the driver call and
//    its status; a failed allocate or free changed nothing (the block is there, or not, as before);
//  - no page was unmapped or released under unfinished work (the fake records violations);
//  - accounting balances: each job's bytes by class and each device's allocated bytes equal the
//    model's live blocks, no device holds more than its limit, and the pages Salus says it holds
//    are the chunks the driver says exist, device by device and on the host;
//  - whenever the GPU has drained, every live block's bytes (words stamped at its first and last
//    word and at each page boundary inside it) read back through its pointer, wherever its pages
//    moved.
// At the end, with injection off, every job is released and trimmed: no chunk, mapping,
// reservation, stream or event is left in the driver.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_backend.hpp"
#include "memory/safe_points.hpp"
#include "salus/memory.hpp"
#include "support/fake_driver.hpp"

namespace salus::testing {
namespace {

using namespace std::chrono_literals;
using test::FakeDriver;
using test::FakeDriverConfig;

constexpr int kDevices = 4;
constexpr int kStreamsPerDevice = 2;  // besides the default stream
constexpr std::size_t kPage = 2 * MiB;
constexpr std::size_t kDeviceLimit = 24 * MiB;
constexpr std::size_t kMaxJobs = 6;

// Calls that fail on a real driver only for a caller's bug or once the context is lost for good
// (a sticky error, after which nothing in the process can use the GPU): giving resources back,
// binding the context, and waiting for or asking about earlier work (they report the failure of
// that work, which poisons the context). Every call that can fail in a correct program is
// injected: creating chunks, ranges, streams and events, mapping, granting access, copying,
// recording events and making streams wait for them.
const std::vector<std::string> kNeverFail = {
    "cuMemUnmap",      "cuMemRelease",       "cuMemAddressFree",   "cuStreamDestroy",
    "cuEventDestroy",  "cuCtxGetCurrent",    "cuCtxSetCurrent",    "cuDevicePrimaryCtxRelease",
    "cuStreamSynchronize", "cuEventSynchronize", "cuStreamQuery",  "cuEventQuery"};

struct FaultCase {
  double rate;
  std::uint64_t seed;
  int operations;
};

void PrintTo(const FaultCase& c, std::ostream* os) {
  *os << "rate " << c.rate << ", seed " << c.seed << ", " << c.operations << " operations";
}

struct Block {
  std::size_t bytes = 0;
  JobId job;
  int device = 0;
  StreamHandle stream;
  Lifetime lifetime = Lifetime::persistent;
  std::uint64_t stamp = 0;  // 0: not stamped (allocated while the GPU had work queued)
};

struct JobModel {
  JobId id;
  bool quiescent = false;
};

// What the operations threw, by kind; a DeviceError by the driver call it names.
struct Failures {
  std::map<std::string, std::uint64_t> device_errors;
  std::uint64_t out_of_memory = 0;
  std::uint64_t total() const {
    std::uint64_t n = out_of_memory;
    for (const auto& [call, count] : device_errors) n += count;
    return n;
  }
};

FakeDriverConfig driver_config() {
  FakeDriverConfig config = FakeDriverConfig::uniform(kDevices, 64 * MiB);
  config.host_memory_bytes = 1 * GiB;
  return config;
}

MemoryOptions harvesting_options() {
  MemoryOptions options;
  options.device_limits.assign(kDevices, kDeviceLimit);
  options.harvest.spill = SpillPolicy::peer_then_host;
  options.harvest.lend_reserve_bytes = 8 * MiB;
  options.harvest.host_limit_bytes = 96 * MiB;
  options.harvest.move_batch_pages = 3;  // several rounds per move, so a move can fail halfway
  options.harvest.recall_wait = 0ms;     // one thread: no borrower reaches a safe point meanwhile
  return options;
}

class FaultInjection : public ::testing::TestWithParam<FaultCase> {
 protected:
  FaultInjection()
      : fake_(driver_config()),
        backend_(std::make_shared<cuda::CudaBackend>(fake_.api())),
        rng_(GetParam().seed) {
    fake_.record_calls(false);  // a run makes millions of calls
    memory_ = std::make_unique<MemoryManager>(backend_, harvesting_options());
    for (int d = 0; d < kDevices; ++d) {
      streams_.emplace_back();
      for (int s = 0; s < kStreamsPerDevice; ++s) streams_.back().emplace_back(backend_, d);
    }
    for (std::size_t j = 0; j < 4; ++j) add_job();
  }

  ~FaultInjection() override {
    memory_.reset();  // before the streams and the backend it uses
    streams_.clear();
  }

  template <class T>
  T uniform(T lo, T hi) {
    if constexpr (std::is_floating_point_v<T>) {
      return std::uniform_real_distribution<T>(lo, hi)(rng_);
    } else {
      return std::uniform_int_distribution<T>(lo, hi)(rng_);
    }
  }
  bool chance(double p) { return uniform(0.0, 1.0) < p; }

  StreamHandle stream_on(int device) {
    const int pick = uniform(0, kStreamsPerDevice);
    return pick == 0 ? StreamHandle{} : streams_[device][pick - 1].handle();
  }
  JobModel& some_job() { return jobs_[uniform<std::size_t>(0, jobs_.size() - 1)]; }
  std::map<DevicePtr, Block>::iterator some_block() {
    auto it = blocks_.begin();
    std::advance(it, uniform<std::size_t>(0, blocks_.size() - 1));
    return it;
  }

  // Runs `op`; a typed failure is counted, anything else fails the test. Returns whether it
  // succeeded.
  template <class Op>
  bool attempt(const char* what, Op&& op) {
    last_op_ = what;
    try {
      op();
      return true;
    } catch (const DeviceError& e) {
      EXPECT_TRUE(e.call().starts_with("cu")) << what << ": DeviceError names no driver call: "
                                              << e.what();
      EXPECT_FALSE(e.status().empty()) << what << ": " << e.what();
      EXPECT_NE(e.status_code(), 0) << what << ": " << e.what();
      ++failures_.device_errors[e.call()];
      last_error_ = e.what();
    } catch (const OutOfMemory& e) {
      ++failures_.out_of_memory;
      last_error_ = e.what();
      last_oom_reason_ = e.info().reason;
    } catch (const std::exception& e) {
      ADD_FAILURE() << what << " threw something other than DeviceError or OutOfMemory: "
                    << e.what();
    }
    return false;
  }

  // --- the operations --------------------------------------------------------------------------

  void add_job() {
    JobId id;
    if (attempt("register_job", [&] { id = memory_->register_job("job"); })) {
      jobs_.push_back({id, false});
    }
  }

  void release_job() {
    const std::size_t index = uniform<std::size_t>(0, jobs_.size() - 1);
    const JobId id = jobs_[index].id;
    if (!attempt("release_job", [&] { memory_->release_job(id); })) {
      // A failed release leaves the job registered with the blocks it has not freed yet.
      EXPECT_NO_THROW((void)memory_->job_stats(id)) << "a failed release_job retired the job";
      std::erase_if(blocks_, [&](const auto& entry) {
        return entry.second.job == id && !memory_->find(entry.first).has_value();
      });
      return;
    }
    std::erase_if(blocks_, [&](const auto& entry) { return entry.second.job == id; });
    jobs_.erase(jobs_.begin() + static_cast<std::ptrdiff_t>(index));
  }

  std::size_t draw_size() {
    const int u = uniform(0, 99);
    if (u < 15) return uniform<std::size_t>(2 * MiB, 7 * MiB);
    if (u < 50) return uniform<std::size_t>(64 * KiB, 2 * MiB);
    return uniform<std::size_t>(1, 64 * KiB);
  }

  void allocate() {
    const JobModel& job = some_job();
    const int device = uniform(0, kDevices - 1);
    Block block{0, job.id, device, stream_on(device),
                chance(0.5) ? Lifetime::ephemeral : Lifetime::persistent, 0};
    const std::size_t requested = draw_size();
    DevicePtr ptr = 0;
    const std::uint64_t refused = injected("cuMemCreate");
    last_oom_reason_.clear();
    const bool ok = attempt("allocate", [&] {
      ptr = memory_->allocate({requested, device, block.stream, job.id, block.lifetime});
    });
    if (!ok) {
      // Out of memory because the driver refused a resource: the error says so, naming the call
      // (a chunk, or what a new stream's heap needs first: an event, an address range).
      if (!last_oom_reason_.empty() && injected("cuMemCreate") > refused) {
        EXPECT_NE(last_oom_reason_.find("the driver refused cu"), std::string::npos)
            << last_oom_reason_;
      }
      return;
    }
    const std::optional<BlockInfo> info = memory_->find(ptr);
    ASSERT_TRUE(info.has_value()) << "allocate returned an unknown block";
    block.bytes = info->bytes;
    ASSERT_GE(block.bytes, requested);
    if (fake_.pending_work() == 0) {  // host writes are ordered only against a drained GPU
      block.stamp = ++stamps_;
      for_each_word(ptr, block.bytes, [&](DevicePtr at) { fake_.write_word(at, word(block, at)); });
    }
    ASSERT_TRUE(blocks_.emplace(ptr, block).second) << "allocate returned a live block's pointer";
  }

  void deallocate() {
    const auto it = some_block();
    if (attempt("deallocate", [&] { memory_->deallocate(it->first); })) {
      blocks_.erase(it);
    } else {
      EXPECT_TRUE(memory_->find(it->first).has_value()) << "a failed free freed the block: " << last_error_;
    }
  }

  void record_stream() {
    const auto it = some_block();
    attempt("record_stream_use",
            [&] { memory_->record_stream_use(it->first, stream_on(it->second.device)); });
  }

  // A kernel that touches a live block of an active job, left unfinished for a while.
  void enqueue_kernel() {
    const auto it = some_block();
    const JobModel* job = model_of(it->second.job);
    if (job == nullptr || job->quiescent) return;  // quiescent jobs promise not to enqueue
    fake_.enqueue_work(it->second.stream, it->first, it->second.bytes);
  }

  void promote() {
    const JobId id = some_job().id;
    if (!attempt("promote_ephemeral", [&] { memory_->promote_ephemeral(id); })) return;
    for (auto& [ptr, block] : blocks_) {
      if (block.job == id) block.lifetime = Lifetime::persistent;
    }
  }

  void safe_point() {
    JobModel& job = some_job();
    if (!job.quiescent) {
      if (attempt("set_job_quiescent", [&] { memory::set_job_quiescent(*memory_, job.id); })) {
        job.quiescent = true;
      }
      return;
    }
    if (chance(0.3)) attempt("prefetch", [&] { memory::prefetch(*memory_, job.id); });
    // Activation brings pages home as far as it can; a failed move leaves them where they are,
    // and the job is active either way (it will run).
    attempt("activate_job", [&] { (void)memory::activate_job(*memory_, job.id); });
    job.quiescent = false;
  }

  void demote() {
    const JobModel& job = some_job();
    if (!job.quiescent) return;
    const int device = uniform(0, kDevices - 1);
    attempt("demote", [&] { (void)memory::demote(*memory_, job.id, device); });
  }

  void remap() {
    const auto it = some_block();
    const JobModel* job = model_of(it->second.job);
    if (job == nullptr || job->quiescent) return;
    const int to = uniform(0, kDevices);
    const Location where = to == kDevices ? Location::host() : Location::gpu(to);
    attempt("remap", [&] { memory_->remap(it->first, where); });
  }

  void trim() {
    if (chance(0.5)) {
      attempt("trim", [&] { (void)memory_->trim(); });
    } else {
      const int device = uniform(0, kDevices - 1);
      attempt("trim(device)", [&] { (void)memory_->trim(device); });
    }
  }

  void add_job_stream() {
    const JobModel& job = some_job();
    if (job.quiescent) return;
    const int device = uniform(0, kDevices - 1);
    attempt("add_job_stream", [&] { memory_->add_job_stream(job.id, device, stream_on(device)); });
  }

  void step() {
    const int u = uniform(0, 99);
    if (u < 34) return allocate();
    if (blocks_.empty()) return;
    if (u < 64) return deallocate();
    if (u < 72) return enqueue_kernel();
    if (u < 75) return record_stream();
    if (u < 77) return promote();
    if (u < 84) return safe_point();
    if (u < 88) return demote();
    if (u < 91) return remap();
    if (u < 94) return trim();
    if (u < 97) return add_job_stream();
    if (u < 99) return jobs_.size() < kMaxJobs ? add_job() : release_job();
    if (jobs_.size() > 1) release_job();
  }

  // --- the checks ------------------------------------------------------------------------------

  std::uint64_t injected(std::string_view call) const {
    for (const auto& [name, n] : fake_.random_failures_by_call()) {
      if (name == call) return n;
    }
    return 0;
  }

  JobModel* model_of(JobId id) {
    const auto it = std::find_if(jobs_.begin(), jobs_.end(), [&](auto& j) { return j.id == id; });
    return it != jobs_.end() ? &*it : nullptr;
  }

  // The stamped words of a block: its first and last word and each page boundary inside it.
  template <class F>
  static void for_each_word(DevicePtr ptr, std::size_t bytes, F&& f) {
    f(ptr);
    for (DevicePtr page = (ptr / kPage + 1) * kPage; page < ptr + bytes; page += kPage) f(page);
    if (bytes > 8) f(ptr + bytes - 8);
  }
  static std::uint64_t word(const Block& block, DevicePtr at) {
    return block.stamp * 0x9E3779B97F4A7C15ull ^ at;
  }

  void check_bytes() {
    for (const auto& entry : blocks_) {
      const DevicePtr ptr = entry.first;
      const Block& block = entry.second;
      if (block.stamp == 0) continue;
      for_each_word(ptr, block.bytes, [&](DevicePtr at) {
        const auto chunk = fake_.chunk_at(at);
        ASSERT_TRUE(chunk.has_value()) << "live block " << std::hex << ptr << " (" << std::dec
                                       << block.bytes << " bytes) is unmapped at " << std::hex
                                       << at << " after " << last_op_ << ": " << last_error_;
        ASSERT_EQ(fake_.read_word(at), word(block, at))
            << "block " << std::hex << ptr << " lost its bytes at " << at << " after "
            << last_op_;
      });
    }
  }

  void check_accounting() {
    std::map<std::uint32_t, std::array<std::size_t, kLifetimeCount>> by_job;
    std::array<std::size_t, kDevices> by_device{};
    for (const auto& [ptr, block] : blocks_) {
      by_job[block.job.value][static_cast<std::size_t>(block.lifetime)] += block.bytes;
      by_device[static_cast<std::size_t>(block.device)] += block.bytes;
    }
    for (const JobModel& job : jobs_) {
      const JobMemoryStats s = memory_->job_stats(job.id);
      for (std::size_t c = 0; c < kLifetimeCount; ++c) {
        ASSERT_EQ(s.by_class[c].in_use, by_job[job.id.value][c])
            << "job " << job.id.value << ", class " << to_string(static_cast<Lifetime>(c));
      }
    }
    std::size_t held_on_devices = 0;
    std::size_t reserved = 0;
    for (int d = 0; d < kDevices; ++d) {
      const DeviceMemoryStats s = memory_->device_stats(d);
      ASSERT_EQ(s.allocated, by_device[static_cast<std::size_t>(d)]) << "device " << d;
      ASSERT_LE(s.reserved, s.limit) << "device " << d;
      ASSERT_LE(fake_.used_bytes(Location::gpu(d)), s.limit) << "device " << d;
      held_on_devices += fake_.used_bytes(Location::gpu(d));
      reserved += s.reserved;
    }
    ASSERT_EQ(held_on_devices, reserved) << "the driver's device chunks against Salus's pages";
    // stats() reports every job that ever was: only now and then, to keep the run linear.
    if (++accounting_checks_ % 64 == 0) {
      ASSERT_EQ(fake_.used_bytes(Location::host()), memory_->stats().host_spill_bytes);
    }
  }

  void check_no_violations() {
    const std::vector<std::string> violations = fake_.violations();
    ASSERT_TRUE(violations.empty()) << violations.front();
  }

  void release_everything() {
    fake_.fail_randomly(0.0, 0);
    fake_.finish_all_work();
    for (const JobModel& job : jobs_) {
      if (job.quiescent) (void)memory::activate_job(*memory_, job.id);
      memory_->release_job(job.id);
    }
    jobs_.clear();
    blocks_.clear();
    (void)memory_->trim();
    for (int d = 0; d < kDevices; ++d) {
      const DeviceMemoryStats s = memory_->device_stats(d);
      EXPECT_EQ(s.allocated, 0u) << "device " << d;
      EXPECT_EQ(s.reserved, 0u) << "device " << d;
      EXPECT_EQ(s.lent + s.borrowed_peer + s.borrowed_host, 0u) << "device " << d;
    }
    memory_.reset();
    streams_.clear();
  }

  FakeDriver fake_;
  std::shared_ptr<cuda::CudaBackend> backend_;
  std::vector<std::vector<Stream>> streams_;  // per device
  std::unique_ptr<MemoryManager> memory_;
  std::mt19937_64 rng_;
  std::vector<JobModel> jobs_;
  std::map<DevicePtr, Block> blocks_;
  std::uint64_t stamps_ = 0;
  Failures failures_;
  std::string last_error_;  // of the last failed operation
  std::string last_oom_reason_;
  std::string last_op_;
  std::uint64_t accounting_checks_ = 0;
};

TEST_P(FaultInjection, EveryFailureIsTypedAndNothingIsLostCorruptedOrLeaked) {
  const FaultCase& c = GetParam();
  fake_.fail_randomly(c.rate, c.seed, kNeverFail);
  std::uint64_t drained_checks = 0;
  for (int op = 0; op < c.operations; ++op) {
    SCOPED_TRACE("operation " + std::to_string(op));
    step();
    if (::testing::Test::HasFailure()) break;
    check_no_violations();
    if (chance(0.5)) {
      fake_.finish_all_work();
      check_bytes();
      ++drained_checks;
    }
    check_accounting();
    if (::testing::Test::HasFailure()) break;
  }
  const std::uint64_t injected = fake_.random_failures();
  std::uint64_t pages_moved = 0;
  for (int d = 0; d < kDevices; ++d) pages_moved += memory_->device_stats(d).pages_moved;
  release_everything();
  EXPECT_GT(pages_moved, 100u) << "harvesting hardly moved a page: the run did not exercise it";
  EXPECT_EQ(fake_.live_chunks(), 0u);
  EXPECT_EQ(fake_.mapped_bytes(), 0u);
  EXPECT_EQ(fake_.reserved_bytes(), 0u);
  EXPECT_EQ(fake_.live_streams(), 0u);
  EXPECT_EQ(fake_.live_events(), 0u);
  EXPECT_TRUE(fake_.violations().empty());
  // The run really exercised failures: the driver failed calls, and operations surfaced them.
  if (c.rate > 0) {
    EXPECT_GT(injected, static_cast<std::uint64_t>(c.operations * c.rate / 10));
    EXPECT_GE(failures_.device_errors.size(), 5u) << "failures surfaced from few driver calls";
  }
  std::string surfaced;
  for (const auto& [call, n] : failures_.device_errors) surfaced += " " + call + ":" + std::to_string(n);
  std::cout << "[ fault injection ] rate " << c.rate << ": " << injected
            << " driver calls failed; operations saw " << failures_.total() << " failures ("
            << failures_.out_of_memory << " OutOfMemory; DeviceError by call:" << surfaced
            << "); " << pages_moved << " pages moved between tiers; bytes checked at "
            << drained_checks << " drained points\n";
}

INSTANTIATE_TEST_SUITE_P(Rates, FaultInjection,
                         ::testing::Values(FaultCase{0.0, 3, 20'000},  // the control
                                           FaultCase{0.01, 1, 100'000},
                                           FaultCase{0.10, 2, 100'000}),
                         [](const auto& info) {
                           return "Rate" + std::to_string(static_cast<int>(info.param.rate * 100)) +
                                  "Percent";
                         });

}  // namespace
}  // namespace salus::testing
