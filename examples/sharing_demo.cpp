// Four jobs sharing one GPU at iteration granularity, under a scheduling policy of your choice.
//
//   sharing_demo [--policy fair] [--iterations 100] [--trace salus_trace.json]
//                [--contention processor_sharing] [--cuda]
//
// Two training jobs (VGG-like and ResNet-like), an inference service answering requests, and a
// hyper-parameter trial that arrives late and leaves after a fixed number of steps. Each job is a
// thread that brackets every iteration with Job::iteration(): that is the only change a training
// loop needs. Salus decides which iteration runs next; the weights of every job stay resident, so
// a switch costs no checkpoint.
//
// The GPU is simulated by default (host threads play the streams), so "GPU work" is a simulated
// kernel: it keeps part of the device busy for a while, and kernels of jobs that run at once share
// the device (processor sharing). Memory is never touched. With --cuda, where this demo has no
// real kernels to run, a host function that sleeps on the job's stream stands in. Magnitudes follow
// measured workloads (VGG11 and ResNet-50 at batch 25, GoogLeNet for the trial) with time scaled
// down about 4x and memory about 2x, so a run takes a few seconds.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <exception>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <salus/cuda.hpp>
#include <salus/runtime.hpp>
#include <salus/sim.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using namespace std::chrono_literals;
using salus::DevicePtr;
using salus::MiB;
using Micros = std::chrono::microseconds;

// A network as the scheduler sees it: how much stays resident, how much each layer's forward
// pass keeps for backward, and how long each layer keeps the GPU busy.
struct Model {
  std::size_t weight_bytes;      // persistent (allocated before the first iteration)
  std::size_t activation_bytes;  // per layer, ephemeral: alive from forward to backward
  int layers;
  Micros forward_per_layer;  // backward takes twice as long, as it usually does
  // Share of the GPU its kernels keep busy when alone. Assumed, not measured: large batches of
  // big convolutions fill the GPU, small inference batches leave most of it idle.
  double occupancy;
};

struct Workload {
  std::string name;
  salus::JobKind kind;
  int priority;
  Model model;
  int iterations;             // for inference: 0 = serve until the long training jobs finish
  Micros arrival;             // when the job shows up after the start
  Micros request_interval;    // inference: host time between requests
  bool long_running = false;  // the inference service stays up while such jobs remain
};

// Counts a long-running job out when its thread ends, however it ends.
struct CountOut {
  std::atomic<int>* remaining;
  ~CountOut() {
    if (remaining != nullptr) --*remaining;
  }
};

// A kernel of that duration (when alone) on the stream: a simulated one on the sim backend; on a
// real GPU a host function that sleeps stands in for it.
void gpu_work(salus::DeviceBackend& backend, salus::StreamHandle stream, Micros duration,
              double occupancy) {
  if (backend.name() == "sim") {
    salus::launch_sim_kernel(backend, stream, 0, std::chrono::duration<double>(duration).count(),
                             occupancy);
    return;
  }
  backend.launch_host_func(stream, [duration] { std::this_thread::sleep_for(duration); });
}

// Waits until the stream has run everything enqueued so far, as `loss.item()` does in PyTorch.
// Reading the result inside the iteration makes the iteration span in the trace cover the job's
// GPU time, and keeps a thread from queueing unbounded work ahead of the GPU.
void read_result(salus::DeviceBackend& backend, salus::StreamHandle stream) {
  std::promise<void> done;
  backend.launch_host_func(stream, [&done] { done.set_value(); });
  done.get_future().wait();
}

// One training step: activations pile up through forward, each is freed as backward consumes it.
// The optimizer's momentum is made during the first step; Salus promotes it to persistent at the
// iteration's end because it survives.
void train_step(salus::Job& job, salus::DeviceBackend& backend, const Model& model,
                std::vector<DevicePtr>& momentum) {
  auto iteration = job.iteration();  // blocks until the policy gives this job the GPU
  std::vector<DevicePtr> saved;
  for (int layer = 0; layer < model.layers; ++layer) {
    saved.push_back(job.allocate(model.activation_bytes));
    gpu_work(backend, iteration.stream(), model.forward_per_layer, model.occupancy);
  }
  while (!saved.empty()) {
    gpu_work(backend, iteration.stream(), 2 * model.forward_per_layer, model.occupancy);
    // Freed right after enqueueing: Salus reuses the block in stream order, so this is safe.
    job.deallocate(saved.back());
    saved.pop_back();
  }
  if (momentum.empty()) momentum.push_back(job.allocate(model.weight_bytes));
  read_result(backend, iteration.stream());
}

// One inference request: a small activation and a short forward pass.
void serve_request(salus::Job& job, salus::DeviceBackend& backend, const Model& model) {
  auto iteration = job.iteration();
  const DevicePtr activation = job.allocate(model.activation_bytes);
  for (int layer = 0; layer < model.layers; ++layer) {
    gpu_work(backend, iteration.stream(), model.forward_per_layer, model.occupancy);
  }
  job.deallocate(activation);
  read_result(backend, iteration.stream());
}

std::vector<Workload> workloads(int iterations) {
  using salus::JobKind;
  // VGG11: few layers, heavy weights (mostly the fully connected ones), large activations.
  // ResNet-50-like: many cheap layers, light weights. GoogLeNet-sized trial: small and short.
  return {
      {"vgg-train",
       JobKind::training,
       0,
       {256 * MiB, 96 * MiB, 11, 600us, 0.9},
       iterations,
       0us,
       0us,
       true},
      {"resnet-train",
       JobKind::training,
       0,
       {48 * MiB, 40 * MiB, 24, 380us, 0.7},
       iterations,
       0us,
       0us,
       true},
      {"infer-svc", JobKind::inference, 10, {48 * MiB, 16 * MiB, 8, 150us, 0.3}, 0, 0us, 15ms},
      {"hp-trial",
       JobKind::training,
       0,
       {14 * MiB, 24 * MiB, 12, 200us, 0.4},
       std::max(1, iterations / 3),
       300ms,
       0us},
  };
}

// Hints seed the profiler (admission needs a guess before the first iteration); measured values
// replace them as the job runs.
salus::JobSpec job_spec(const Workload& w) {
  const auto layers = static_cast<std::size_t>(w.model.layers);
  return {.name = w.name,
          .kind = w.kind,
          .priority = w.priority,
          .expected_iterations = static_cast<std::uint64_t>(w.iterations),
          .hints = {.persistent_bytes = 2 * w.model.weight_bytes,
                    .ephemeral_peak_bytes = layers * w.model.activation_bytes},
          .limits = {}};
}

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(MiB);
}

void print_summary(salus::Runtime& runtime, double wall_seconds) {
  std::printf("\n%-13s %-9s %4s %6s %10s %10s %9s %9s %8s %8s\n", "job", "kind", "lane", "iters",
              "gpu time", "waiting", "max wait", "iter (p)", "persist", "eph peak");
  std::printf("%-13s %-9s %4s %6s %10s %10s %9s %9s %8s %8s\n", "", "", "", "", "s", "s", "ms",
              "ms", "MiB", "MiB");
  for (const salus::JobStats& s : runtime.job_stats()) {
    std::printf("%-13s %-9s %4d %6llu %10.3f %10.3f %9.2f %9.2f %8.0f %8.0f\n", s.name.c_str(),
                salus::to_string(s.kind), s.lane, static_cast<unsigned long long>(s.iterations),
                s.attained_seconds, s.waiting_seconds, s.max_wait_seconds * 1e3,
                s.iteration_seconds * 1e3, mib(s.persistent_bytes), mib(s.ephemeral_peak_bytes));
  }
  // Sharing pays off in memory when the GPU held less than the jobs would on GPUs of their own.
  std::size_t own_gpus = 0;
  for (const salus::JobStats& s : runtime.job_stats()) {
    own_gpus += s.persistent_bytes + s.ephemeral_peak_bytes;
  }
  const salus::DeviceMemoryStats device = runtime.memory().device_stats(0);
  std::printf("\ngpu0: peak allocated %.0f MiB, peak reserved %.0f MiB of %.0f MiB; wall %.1f s\n",
              mib(device.peak_allocated), mib(device.peak_reserved), mib(device.limit),
              wall_seconds);
  std::printf("      each job on a GPU of its own would need %.0f MiB in all\n", mib(own_gpus));
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Four jobs (two training, one inference, one trial) sharing one GPU with Salus"};
  std::string policy = "fair";
  int iterations = 100;
  std::string trace_path = "salus_trace.json";
  bool use_cuda = false;
  std::string contention = "processor_sharing";
  app.add_option("--policy", policy,
                 "fifo, srtf, fair, pack, priority or memory_aware (default fair)");
  app.add_option("--iterations", iterations, "training iterations per long job (default 100)")
      ->check(CLI::PositiveNumber);
  app.add_option("--trace", trace_path, "Chrome trace output (default salus_trace.json)");
  app.add_option("--contention", contention,
                 "how kernels of jobs running at once share the simulated GPU: processor_sharing "
                 "(default), time_slicing or none");
  app.add_flag("--cuda", use_cuda, "use the real GPU 0 instead of a simulated one");
  CLI11_PARSE(app, argc, argv);

  try {
    std::shared_ptr<salus::DeviceBackend> backend;
    if (use_cuda) {
      if (!salus::cuda_available()) {
        std::fprintf(stderr,
                     "--cuda: no usable CUDA driver or GPU here (drop --cuda to simulate)\n");
        return 1;
      }
      backend = salus::make_cuda_backend();
    } else {
      salus::SimConfig config = salus::SimConfig::uniform(1, 4 * salus::GiB);
      // An unknown model name fails here, with a message that lists the known ones.
      config.contention = salus::make_contention_model(contention);
      backend = salus::make_sim_backend(std::move(config));
    }
    // An unknown policy name fails here, with a message that lists the known ones.
    salus::RuntimeOptions options;
    options.policy = policy;
    salus::Runtime runtime(backend, std::move(options));
    std::printf("Salus sharing demo: policy %s on %s (%s%s%s)\n",
                std::string(runtime.policy()).c_str(), backend->properties(0).name.c_str(),
                std::string(backend->name()).c_str(), use_cuda ? "" : ", contention ",
                use_cuda ? "" : contention.c_str());

    const std::vector<Workload> all = workloads(iterations);
    std::atomic<int> long_jobs_left = 0;
    for (const Workload& w : all) long_jobs_left += w.long_running ? 1 : 0;
    std::mutex error_mu;
    std::string first_error;
    const auto start = std::chrono::steady_clock::now();
    {
      std::vector<std::jthread> threads;
      for (const Workload& w : all) {
        // Jobs there from the start register here, in the order listed: FIFO runs jobs in
        // arrival order, and threads racing to register would make that order random (with the
        // inference service first, FIFO would serve it alone until the training jobs end,
        // which they then never do).
        std::optional<salus::Job> registered;
        if (w.arrival == Micros{0}) registered.emplace(runtime.add_job(job_spec(w)));
        threads.emplace_back([&, w, registered = std::move(registered)]() mutable {
          const CountOut count_out{w.long_running ? &long_jobs_left : nullptr};
          try {
            if (!registered) {
              std::this_thread::sleep_for(w.arrival);
              registered.emplace(runtime.add_job(job_spec(w)));
            }
            salus::Job& job = *registered;
            // Weights: allocated outside any iteration, so they are persistent.
            std::vector<DevicePtr> weights{job.allocate(w.model.weight_bytes)};
            std::vector<DevicePtr> momentum;
            if (w.kind == salus::JobKind::inference) {
              for (int r = 0; w.iterations == 0 ? long_jobs_left > 0 : r < w.iterations; ++r) {
                serve_request(job, *backend, w.model);
                std::this_thread::sleep_for(w.request_interval);  // until the next request
              }
            } else {
              for (int i = 0; i < w.iterations; ++i) train_step(job, *backend, w.model, momentum);
            }
            job.leave();  // frees weights and momentum, lets the others use the room
          } catch (const std::exception& e) {
            std::lock_guard lock(error_mu);
            if (first_error.empty()) first_error = w.name + ": " + e.what();
          }
        });
      }
    }  // jthreads join here
    const double wall =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (!first_error.empty()) {
      std::fprintf(stderr, "a job failed: %s\n", first_error.c_str());
      return 1;
    }

    print_summary(runtime, wall);
    runtime.write_trace(trace_path);
    std::printf(
        "\nTrace: %s (one span per iteration, rows per lane, memory counters). Open it at\n"
        "https://ui.perfetto.dev (Open trace file) or in Chrome at chrome://tracing (Load).\n",
        trace_path.c_str());
    return 0;
  } catch (const salus::Error& e) {
    std::fprintf(stderr, "salus: %s\n", e.what());
    return 1;
  }
}
