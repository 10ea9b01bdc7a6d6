// Deterministic allocation workloads shared by the micro-benchmarks. Each one is generated once,
// from a fixed seed, so Salus and its baseline replay exactly the same requests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace salus::bench {

// Request sizes drawn from a deep-learning-like mix, 256 B to 64 MiB, each a multiple of 4 (fp32
// tensors). Three log-uniform bands with weights chosen to resemble a CNN's tensor population:
//   45%  256 B .. 64 KiB   biases, norm scales/shifts, running stats, scalars, index tensors
//   40%  64 KiB .. 4 MiB   activations of late layers, small and medium weights
//   15%  4 MiB .. 64 MiB   large weights (conv/fc), early-layer activations, workspaces
std::vector<std::size_t> dl_size_mix(std::size_t count, std::uint64_t seed);

// Small requests only, 8 B .. 4 KiB, log-uniform, each a multiple of 4: scalars, biases, norm
// parameters, index tensors and small staging buffers (issue 12's small-size mix). Salus rounds
// each to its 512 B block alignment, so there are only eight block sizes, and no page is mapped in
// the steady state: what is timed is the allocator's bookkeeping alone.
std::vector<std::size_t> small_size_mix(std::size_t count, std::uint64_t seed);

// One step of the random-allocations workload: allocate `size`, or free the live block at index
// `victim` (the live set is a vector; the freed slot is filled by the last live block).
struct RandomOp {
  bool allocate = true;
  std::size_t size = 0;
  std::size_t victim = 0;
};

struct RandomWorkload {
  std::size_t prefill_live = 0;      // blocks allocated (untimed) before the ops start
  std::vector<std::size_t> prefill;  // their sizes
  std::vector<RandomOp> ops;         // ends with as many live blocks as it started with,
                                     // so it can be replayed in a loop
};

// Up to `window` live blocks; each op allocates or frees with equal odds (forced at the bounds).
RandomWorkload random_workload(std::size_t ops, std::size_t window, std::uint64_t seed);

// A training trace: tensors identified by slot, allocated and freed in the order a framework would.
struct TraceOp {
  enum class Kind : std::uint8_t { allocate, free, end_iteration };
  Kind kind = Kind::allocate;
  std::uint32_t slot = 0;
  std::size_t bytes = 0;
  bool persistent = false;
};

struct Trace {
  std::vector<TraceOp> ops;
  std::uint32_t slots = 0;
};

// ResNet-50-like (bottleneck blocks, batch norm after every convolution) or VGG16-like (few, large
// tensors), fp32, NCHW at 224x224. Per iteration: input batch; forward allocates each layer's
// output (plus a short-lived convolution workspace); backward walks the layers in reverse,
// allocating the input gradient and parameter gradients and freeing the layer's saved output and
// its output gradient; the optimizer step (SGD with momentum) allocates momentum buffers in the
// first iteration only, then all gradients are freed (set_to_none, as PyTorch does by default).
// Weights and batch-norm buffers are allocated once, before the first iteration.
enum class Model : std::uint8_t { resnet50, vgg16 };
Trace training_trace(Model model, int batch, int iterations);

}  // namespace salus::bench
