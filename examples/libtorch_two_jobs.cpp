// Two libtorch training jobs sharing one simulated GPU through Salus.
//
//   libtorch_two_jobs [--policy fair] [--iterations 40]
//
// salus::torch::enable_cpu makes c10's CPU allocator Salus: every tensor lives in the simulated
// GPU's memory and is charged to the job the allocating thread works for. Each job is a thread:
// it builds its model and optimizer inside a JobScope (persistent memory), then runs every
// training step inside Job::Iteration (it waits for the job's turn; what the step allocates is
// ephemeral). The arithmetic runs on the job's own thread, over tensors that free their memory
// when they are destroyed (JobSpec::blocks_outlive_job).
//
// Built only where cmake/SalusTorch.cmake finds the torch wheel (target salus_torch).
#include <torch/torch.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>
#include <memory>
#include <mutex>
#include <salus/runtime.hpp>
#include <salus/sim.hpp>
#include <salus/torch.hpp>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

// y = sin(3x) + noise, fitted by a small MLP.
struct Regression : torch::nn::Module {
  Regression() {
    net = register_module("net", torch::nn::Sequential(torch::nn::Linear(1, 64), torch::nn::Tanh(),
                                                        torch::nn::Linear(64, 64),
                                                        torch::nn::Tanh(), torch::nn::Linear(64, 1)));
  }
  torch::Tensor loss(torch::Generator& gen) {
    const torch::Tensor x = torch::rand({128, 1}, gen) * 4 - 2;
    const torch::Tensor y = torch::sin(3 * x) + 0.05 * torch::randn({128, 1}, gen);
    return torch::mse_loss(net->forward(x), y);
  }
  torch::nn::Sequential net{nullptr};
};

// Next-token prediction on sequences that count up by a per-sequence step.
struct CountingLm : torch::nn::Module {
  static constexpr int kVocab = 64;
  CountingLm() {
    embed = register_module("embed", torch::nn::Embedding(kVocab, 32));
    gru = register_module("gru", torch::nn::GRU(torch::nn::GRUOptions(32, 64).batch_first(true)));
    out = register_module("out", torch::nn::Linear(64, kVocab));
  }
  torch::Tensor loss(torch::Generator& gen) {
    const torch::Tensor start = torch::randint(kVocab, {16, 1}, gen, torch::kLong);
    const torch::Tensor step = torch::randint(1, 4, {16, 1}, gen, torch::kLong);
    const torch::Tensor seq = torch::remainder(start + step * torch::arange(25), kVocab);
    const torch::Tensor input = seq.slice(1, 0, 24);
    const torch::Tensor target = seq.slice(1, 1, 25);
    const torch::Tensor hidden = std::get<0>(gru->forward(embed->forward(input)));
    return torch::cross_entropy_loss(out->forward(hidden).reshape({-1, kVocab}),
                                     target.reshape({-1}));
  }
  torch::nn::Embedding embed{nullptr};
  torch::nn::GRU gru{nullptr};
  torch::nn::Linear out{nullptr};
};

struct Result {
  std::string name;
  std::vector<float> losses;
  salus::JobStats stats;
  std::string error;
};

template <typename Model>
void train(salus::Runtime& runtime, int iterations, double lr, std::uint64_t seed, Result& result) {
  try {
    at::set_num_threads(1);
    salus::JobSpec spec;
    spec.name = result.name;
    spec.kind = salus::JobKind::training;
    spec.expected_iterations = static_cast<std::uint64_t>(iterations);
    spec.blocks_outlive_job = true;  // tensors free their memory whenever they are destroyed
    salus::Job job = runtime.add_job(std::move(spec));
    {
      // Every tensor this thread allocates from here on is the job's.
      const salus::torch::JobScope scope(job.id(), /*device=*/0);
      torch::manual_seed(seed);
      torch::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
      auto model = std::make_shared<Model>();  // weights: persistent (outside an iteration)
      torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(lr));
      for (int i = 0; i < iterations; ++i) {
        const salus::Job::Iteration iteration = job.iteration();  // waits for the job's turn
        const torch::Tensor loss = model->loss(gen);  // activations: ephemeral
        optimizer.zero_grad();
        loss.backward();
        optimizer.step();  // Adam's state, made in the first step, is promoted to persistent
        result.losses.push_back(loss.item<float>());
      }
      result.stats = job.stats();
    }  // the model and optimizer are freed here, before the job leaves
    job.leave();
  } catch (const std::exception& e) {
    result.error = e.what();
  }
}

double mib(std::size_t bytes) {
  return static_cast<double>(bytes) / static_cast<double>(salus::MiB);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Two libtorch training jobs sharing one simulated GPU through Salus"};
  std::string policy = "fair";
  int iterations = 40;
  app.add_option("--policy", policy,
                 "fifo, srtf, fair, pack, priority or memory_aware (default fair)");
  app.add_option("--iterations", iterations, "training iterations per job (default 40)")
      ->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);

  try {
    at::set_num_threads(1);

    salus::RuntimeOptions options;
    options.policy = policy;
    auto runtime = std::make_shared<salus::Runtime>(
        salus::make_sim_backend(salus::SimConfig::uniform(1, 2 * salus::GiB)), std::move(options));
    salus::torch::enable_cpu(runtime);
    std::printf("libtorch on Salus: policy %s, one simulated GPU, %d iterations per job\n",
                std::string(runtime->policy()).c_str(), iterations);

    std::vector<Result> results(2);
    results[0].name = "mlp-regression";
    results[1].name = "gru-lm";
    {
      std::vector<std::jthread> threads;
      threads.emplace_back(
          [&] { train<Regression>(*runtime, iterations, 1e-2, 1, results[0]); });
      threads.emplace_back([&] { train<CountingLm>(*runtime, iterations, 1e-2, 2, results[1]); });
    }  // joined here

    int status = 0;
    std::printf("\n%-15s %6s %8s %8s %10s %10s %9s %9s\n", "job", "iters", "GPU s", "wait s",
                "persist", "eph peak", "loss[0]", "loss[-1]");
    for (const Result& r : results) {
      if (!r.error.empty() || r.losses.empty()) {
        std::fprintf(stderr, "job %s failed: %s\n", r.name.c_str(), r.error.c_str());
        status = 1;
        continue;
      }
      std::printf("%-15s %6llu %8.3f %8.3f %7.2f MiB %6.2f MiB %9.4f %9.4f\n", r.name.c_str(),
                  static_cast<unsigned long long>(r.stats.iterations), r.stats.attained_seconds,
                  r.stats.waiting_seconds, mib(r.stats.persistent_bytes),
                  mib(r.stats.ephemeral_peak_bytes), r.losses.front(), r.losses.back());
    }
    for (const Result& r : results) {
      std::printf("%s losses:", r.name.c_str());
      for (std::size_t i = 0; i < r.losses.size(); i += 5) std::printf(" %.4f", r.losses[i]);
      std::printf("\n");
    }
    const auto counters = salus::torch::counters();
    std::printf("salus_torch: %llu allocations, %llu frees, %llu failed frees\n",
                static_cast<unsigned long long>(counters.allocations),
                static_cast<unsigned long long>(counters.frees),
                static_cast<unsigned long long>(counters.failed_frees));
    salus::torch::disable();
    return status;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
