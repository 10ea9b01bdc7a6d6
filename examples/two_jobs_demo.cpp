// Two training jobs sharing two GPUs through one Salus memory manager.
//
// Each job trains data-parallel (one replica per GPU, as DistributedDataParallel would) and the
// two jobs take turns at iteration granularity, as Salus schedules them. What to look for in the
// output: every job's weights stay resident (persistent), while the activation memory that one
// job frees at the end of its iteration is handed straight to the other job, so each GPU's peak
// reserved memory is close to sum(persistent) + max(ephemeral peak), not the sum of the peaks.
//
//   two_jobs_demo [--cuda] [--iterations N]
//
// By default the GPUs are simulated (host memory), so the demo runs anywhere and can check every
// byte it writes. --cuda uses the real GPUs instead (patterns are not checked there: device
// memory is not host-addressable).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <salus/cuda.hpp>
#include <salus/memory.hpp>
#include <salus/sim.hpp>
#include <string>
#include <utility>
#include <vector>

namespace {

using salus::MiB;

// A network reduced to what the allocator sees: per layer, the weights and the activation that
// forward saves for backward (fp32, so bytes = 4 * elements).
struct Layer {
  std::size_t weight_bytes;
  std::size_t activation_bytes;
};

struct Model {
  std::string name;
  std::vector<Layer> layers;
};

constexpr std::size_t kFloat = 4;

// 3x3 convolutions, channels growing while the image shrinks, then two fully connected layers.
Model vgg_like(std::size_t batch) {
  Model model{"vgg-like", {}};
  std::size_t in = 3;
  for (auto [channels, hw] : {std::pair<std::size_t, std::size_t>{64, 112},
                              {128, 56},
                              {256, 28},
                              {256, 28},
                              {512, 14},
                              {512, 14},
                              {512, 7},
                              {512, 7}}) {
    model.layers.push_back({9 * in * channels * kFloat, batch * channels * hw * hw * kFloat});
    in = channels;
  }
  model.layers.push_back({512 * 3 * 3 * 1024 * kFloat, batch * 1024 * kFloat});
  model.layers.push_back({1024 * 1000 * kFloat, batch * 1000 * kFloat});
  return model;
}

// Bottleneck-style: many layers, mostly 1x1 convolutions, a wide final stage.
Model resnet_like(std::size_t batch) {
  Model model{"resnet-like", {}};
  model.layers.push_back({49 * 3 * 64 * kFloat, batch * 64 * 56 * 56 * kFloat});
  std::size_t in = 64;
  for (auto [width, hw] :
       {std::pair<std::size_t, std::size_t>{64, 56}, {128, 28}, {256, 14}, {512, 7}}) {
    for (int block = 0; block < 2; ++block) {
      model.layers.push_back({in * width * kFloat, batch * width * hw * hw * kFloat});
      model.layers.push_back({9 * width * width * kFloat, batch * width * hw * hw * kFloat});
      model.layers.push_back({width * 4 * width * kFloat, batch * 4 * width * hw * hw * kFloat});
      in = 4 * width;
    }
  }
  model.layers.push_back({2048 * 1000 * kFloat, batch * 1000 * kFloat});
  return model;
}

// One job: its model, and the blocks it keeps between iterations (per GPU replica).
struct Job {
  Model model;
  salus::JobId id;
  unsigned char tag;  // every byte this job writes; a wrong byte means memory was shared wrongly
  std::vector<std::vector<salus::DevicePtr>> weights;   // [device][layer]
  std::vector<std::vector<salus::DevicePtr>> momentum;  // [device][layer], made in step one
  // What this job alone would need on each GPU: its own live bytes there, and their peak.
  std::vector<std::size_t> live;
  std::vector<std::size_t> peak;
};

class Trainer {
 public:
  Trainer(salus::MemoryManager& memory, bool host_addressable)
      : memory_(memory), check_bytes_(host_addressable) {}

  salus::DevicePtr allocate(Job& job, int device, std::size_t bytes, salus::Lifetime life) {
    // Stream 0 is the device's default stream; a framework would pass the stream it computes on.
    const salus::DevicePtr ptr = memory_.allocate(
        {.bytes = bytes, .device = device, .stream = {}, .job = job.id, .lifetime = life});
    if (check_bytes_) std::memset(reinterpret_cast<void*>(ptr), job.tag, bytes);
    const auto d = static_cast<std::size_t>(device);
    job.live[d] += bytes;
    job.peak[d] = std::max(job.peak[d], job.live[d]);
    return ptr;
  }

  void verify_and_free(Job& job, int device, salus::DevicePtr ptr, std::size_t bytes) {
    if (check_bytes_) {
      const auto* p = reinterpret_cast<const unsigned char*>(ptr);
      for (std::size_t i = 0; i < bytes; ++i) {
        if (p[i] != job.tag) {
          std::fprintf(stderr, "%s: byte %zu of block %#zx changed\n", job.model.name.c_str(), i,
                       static_cast<std::size_t>(ptr));
          std::exit(1);
        }
      }
    }
    memory_.deallocate(ptr);
    job.live[static_cast<std::size_t>(device)] -= bytes;
  }

  // Weights live for the whole job: allocated outside any iteration, hence persistent.
  void load_weights(Job& job, int devices) {
    job.weights.resize(static_cast<std::size_t>(devices));
    job.momentum.resize(static_cast<std::size_t>(devices));
    job.live.assign(static_cast<std::size_t>(devices), 0);
    job.peak.assign(static_cast<std::size_t>(devices), 0);
    for (int d = 0; d < devices; ++d) {
      for (const Layer& layer : job.model.layers) {
        job.weights[d].push_back(allocate(job, d, layer.weight_bytes, salus::Lifetime::persistent));
      }
    }
  }

  // One training iteration of one replica. Everything allocated inside is ephemeral: the
  // allocator cannot know yet which of it will survive the iteration.
  void iteration(Job& job, int device) {
    const auto& layers = job.model.layers;
    const auto eph = salus::Lifetime::ephemeral;
    // Forward: activations pile up, one per layer, and are kept for backward.
    std::vector<salus::DevicePtr> saved;
    for (const Layer& layer : layers)
      saved.push_back(allocate(job, device, layer.activation_bytes, eph));
    // Backward: in reverse, each layer's activation is consumed and freed, a weight gradient made.
    std::vector<salus::DevicePtr> grads(layers.size());
    for (std::size_t i = layers.size(); i-- > 0;) {
      grads[i] = allocate(job, device, layers[i].weight_bytes, eph);
      verify_and_free(job, device, saved[i], layers[i].activation_bytes);
    }
    // Optimizer step: SGD with momentum creates its state on the first step. It survives the
    // iteration, and promote_ephemeral (below, in main) moves it to the persistent class.
    auto& momentum = job.momentum[static_cast<std::size_t>(device)];
    if (momentum.empty()) {
      for (const Layer& layer : layers)
        momentum.push_back(allocate(job, device, layer.weight_bytes, eph));
    }
    for (std::size_t i = 0; i < layers.size(); ++i)
      verify_and_free(job, device, grads[i], layers[i].weight_bytes);
  }

  // The job leaves: check and free what it kept.
  void finish(Job& job) {
    for (std::size_t d = 0; d < job.weights.size(); ++d) {
      const int device = static_cast<int>(d);
      for (std::size_t i = 0; i < job.model.layers.size(); ++i) {
        verify_and_free(job, device, job.weights[d][i], job.model.layers[i].weight_bytes);
        verify_and_free(job, device, job.momentum[d][i], job.model.layers[i].weight_bytes);
      }
    }
  }

 private:
  salus::MemoryManager& memory_;
  bool check_bytes_;
};

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(MiB);
}

void print_jobs(const salus::MemoryStats& stats, int devices) {
  std::printf("\nPer job and class (MiB)\n");
  std::printf("%-14s %-11s %9s %9s %7s", "job", "class", "current", "peak", "blocks");
  for (int d = 0; d < devices; ++d) std::printf("   gpu%d now", d);
  std::printf("\n");
  for (const salus::JobMemoryStats& job : stats.jobs) {
    if (job.peak == 0) continue;  // e.g. the unattributed job: nothing outside our two jobs
    for (auto life : {salus::Lifetime::persistent, salus::Lifetime::ephemeral}) {
      const salus::ClassBytes& c = job.by_class[static_cast<std::size_t>(life)];
      std::printf("%-14s %-11s %9.1f %9.1f %7zu", job.name.c_str(), salus::to_string(life),
                  mib(c.in_use), mib(c.peak), c.blocks);
      // The device split is per job (both classes), so it goes on the first row only.
      for (int d = 0; d < devices; ++d) {
        if (life == salus::Lifetime::persistent &&
            d < static_cast<int>(job.in_use_by_device.size())) {
          std::printf(" %10.1f", mib(job.in_use_by_device[static_cast<std::size_t>(d)]));
        } else {
          std::printf(" %10s", "");
        }
      }
      std::printf("\n");
    }
    std::printf("%-14s %-11s %9.1f %9.1f   promoted %.1f MiB\n", "", "total", mib(job.in_use),
                mib(job.peak), mib(static_cast<std::size_t>(job.promoted_bytes)));
  }
}

void print_devices(const salus::MemoryStats& stats) {
  std::printf("\nPer device (MiB, counts)\n");
  std::printf("%-4s %8s %9s %8s %9s %8s %8s %7s %7s %7s %7s %6s\n", "gpu", "limit", "allocated",
              "peak", "reserved", "peak rs", "mapped", "cached", "allocs", "frees", "maps",
              "x-strm");
  for (const salus::DeviceMemoryStats& d : stats.devices) {
    std::printf("%-4d %8.0f %9.1f %8.1f %9.1f %8.1f %8.1f %7.1f %7llu %7llu %7llu %6llu\n",
                d.device, mib(d.limit), mib(d.allocated), mib(d.peak_allocated), mib(d.reserved),
                mib(d.peak_reserved), mib(d.mapped), mib(d.cached),
                static_cast<unsigned long long>(d.allocations),
                static_cast<unsigned long long>(d.frees),
                static_cast<unsigned long long>(d.page_maps),
                static_cast<unsigned long long>(d.cross_stream_reuses));
  }
}

}  // namespace

int main(int argc, char** argv) {
  bool use_cuda = false;
  int iterations = 3;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--cuda") {
      use_cuda = true;
    } else if (arg == "--iterations" && i + 1 < argc) {
      iterations = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--cuda] [--iterations N]\n", argv[0]);
      return 2;
    }
  }

  try {
    std::shared_ptr<salus::DeviceBackend> backend;
    if (use_cuda) {
      if (!salus::cuda_available()) {
        std::fprintf(stderr,
                     "--cuda: no usable CUDA driver or GPU on this machine "
                     "(run without --cuda to use simulated GPUs)\n");
        return 1;
      }
      backend = salus::make_cuda_backend();
    } else {
      // Two 2 GiB GPUs joined by NVLink, backed by host memory.
      backend = salus::make_sim_backend(salus::SimConfig::nvlink_mesh(2, 2 * salus::GiB));
    }
    const int devices = std::min(backend->device_count(), 2);
    std::printf("Backend: %s, %d device(s): %s\n", std::string(backend->name()).c_str(), devices,
                backend->properties(0).name.c_str());

    salus::MemoryManager memory(backend);
    Trainer trainer(memory, /*host_addressable=*/!use_cuda);
    std::vector<Job> jobs;
    jobs.push_back({vgg_like(8), memory.register_job("vgg-like"), 0xA5, {}, {}, {}, {}});
    jobs.push_back({resnet_like(8), memory.register_job("resnet-like"), 0x5A, {}, {}, {}, {}});
    for (Job& job : jobs) trainer.load_weights(job, devices);

    // Iteration-granularity sharing: the jobs take turns, each running one iteration on all of
    // its replicas, then the next job goes. No job's weights move in between.
    for (int it = 0; it < iterations; ++it) {
      for (Job& job : jobs) {
        for (int d = 0; d < devices; ++d) trainer.iteration(job, d);
        // At iteration end, whatever ephemeral memory survived (the momentum) becomes persistent.
        const std::size_t promoted = memory.promote_ephemeral(job.id);
        std::printf("iteration %d  %-12s done, %.1f MiB promoted to persistent\n", it,
                    job.model.name.c_str(), mib(promoted));
      }
    }

    const salus::MemoryStats stats = memory.stats();
    print_jobs(stats, devices);
    print_devices(stats);

    // The point of sharing: a GPU holds both jobs for less than their peaks added up, which is
    // what each job would need on a GPU of its own (or with its own caching allocator).
    std::printf("\n");
    for (int d = 0; d < devices; ++d) {
      std::size_t dedicated = 0;
      for (const Job& job : jobs) dedicated += job.peak[static_cast<std::size_t>(d)];
      std::printf(
          "gpu%d: the jobs' own peaks add up to %.1f MiB; shared, Salus reserved at most "
          "%.1f MiB\n",
          d, mib(dedicated), mib(stats.devices[static_cast<std::size_t>(d)].peak_reserved));
    }

    for (Job& job : jobs) trainer.finish(job);
    for (Job& job : jobs) memory.release_job(job.id);
    std::printf("All blocks %sfreed; %.1f MiB returned by trim.\n", use_cuda ? "" : "verified and ",
                mib(memory.trim()));
    return 0;
  } catch (const salus::Error& e) {
    std::fprintf(stderr, "salus error (%s): %s\n", salus::to_string(e.code()), e.what());
    return 1;
  }
}
