#include "workloads.hpp"

#include <algorithm>
#include <cmath>
#include <random>

namespace salus::bench {
namespace {

constexpr std::size_t kFloat = 4;  // bytes per fp32 element

// Hand-rolled distributions: std::uniform_real_distribution is not guaranteed to give the same
// numbers across standard libraries, and the workloads must be identical wherever they run.
double unit(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

std::size_t log_uniform(std::mt19937_64& rng, double lo, double hi) {
  const double bytes = std::exp(std::log(lo) + unit(rng) * (std::log(hi) - std::log(lo)));
  const auto elements = static_cast<std::size_t>(bytes) / kFloat;
  return std::max<std::size_t>(elements, 1) * kFloat;
}

std::size_t draw_size(std::mt19937_64& rng) {
  const double band = unit(rng);
  if (band < 0.45) return log_uniform(rng, 256.0, 64.0 * 1024);
  if (band < 0.85) return log_uniform(rng, 64.0 * 1024, 4.0 * 1024 * 1024);
  return log_uniform(rng, 4.0 * 1024 * 1024, 64.0 * 1024 * 1024);
}

std::size_t draw_small_size(std::mt19937_64& rng) {
  return log_uniform(rng, 8.0, 4.0 * 1024);
}

// One layer of a network as the allocator sees it.
struct Layer {
  std::vector<std::size_t> params;   // trainable: each gets a gradient and a momentum buffer
  std::vector<std::size_t> buffers;  // persistent, not trained (batch-norm running statistics)
  std::size_t output = 0;            // saved for backward
  std::size_t workspace = 0;         // scratch that lives only while the layer runs
};

class Network {
 public:
  explicit Network(int batch) : batch_(static_cast<std::size_t>(batch)) {}

  void conv(int cin, int cout, int kernel, int out_hw, bool bias = false) {
    Layer layer;
    layer.params.push_back(as(kernel) * as(kernel) * as(cin) * as(cout) * kFloat);
    if (bias) layer.params.push_back(as(cout) * kFloat);
    layer.output = activation(cout, out_hw);
    // Spatial convolutions get a cuDNN-style workspace; 1x1 convolutions are plain GEMMs.
    layer.workspace = kernel > 1 ? layer.output / 2 : 0;
    layers_.push_back(std::move(layer));
  }
  void batch_norm(int channels, int hw) {
    const std::size_t vec = as(channels) * kFloat;
    layers_.push_back({{vec, vec}, {vec, vec}, activation(channels, hw), 0});
  }
  // Pooling, residual additions: an output and nothing else.
  void elementwise(int channels, int hw) {
    layers_.push_back({{}, {}, activation(channels, hw), 0});
  }
  void linear(int in, int out) {
    layers_.push_back(
        {{as(in) * as(out) * kFloat, as(out) * kFloat}, {}, batch_ * as(out) * kFloat, 0});
  }

  [[nodiscard]] const std::vector<Layer>& layers() const { return layers_; }
  [[nodiscard]] std::size_t input_bytes() const { return activation(3, 224); }

 private:
  static std::size_t as(int v) { return static_cast<std::size_t>(v); }
  [[nodiscard]] std::size_t activation(int channels, int hw) const {
    return batch_ * as(channels) * as(hw) * as(hw) * kFloat;
  }
  std::size_t batch_;
  std::vector<Layer> layers_;
};

Network resnet50(int batch) {
  Network net(batch);
  net.conv(3, 64, 7, 112);
  net.batch_norm(64, 112);
  net.elementwise(64, 56);  // max pool
  int in = 64;
  const int blocks[] = {3, 4, 6, 3};
  for (int stage = 0; stage < 4; ++stage) {
    const int width = 64 << stage;
    const int out = 4 * width;
    const int hw = 56 >> stage;
    for (int b = 0; b < blocks[stage]; ++b) {
      net.conv(in, width, 1, hw);
      net.batch_norm(width, hw);
      net.conv(width, width, 3, hw);
      net.batch_norm(width, hw);
      net.conv(width, out, 1, hw);
      net.batch_norm(out, hw);
      if (b == 0) {  // projection shortcut
        net.conv(in, out, 1, hw);
        net.batch_norm(out, hw);
      }
      net.elementwise(out, hw);  // residual add
      in = out;
    }
  }
  net.elementwise(2048, 1);  // global average pool
  net.linear(2048, 1000);
  return net;
}

Network vgg16(int batch) {
  Network net(batch);
  const int config[] = {64, 64,  0,   128, 128, 0,   256, 256, 256,
                        0,  512, 512, 512, 0,   512, 512, 512, 0};
  int in = 3;
  int hw = 224;
  for (int channels : config) {
    if (channels == 0) {
      hw /= 2;
      net.elementwise(in, hw);  // max pool
      continue;
    }
    net.conv(in, channels, 3, hw, /*bias=*/true);
    in = channels;
  }
  net.linear(512 * 7 * 7, 4096);
  net.linear(4096, 4096);
  net.linear(4096, 1000);
  return net;
}

// Emits a trace while handing out slot numbers.
class TraceWriter {
 public:
  std::uint32_t allocate(std::size_t bytes, bool persistent) {
    const std::uint32_t slot = trace_.slots++;
    trace_.ops.push_back({TraceOp::Kind::allocate, slot, bytes, persistent});
    return slot;
  }
  void free(std::uint32_t slot) { trace_.ops.push_back({TraceOp::Kind::free, slot, 0, false}); }
  void end_iteration() { trace_.ops.push_back({TraceOp::Kind::end_iteration, 0, 0, false}); }
  Trace take() { return std::move(trace_); }

 private:
  Trace trace_;
};

}  // namespace

std::vector<std::size_t> dl_size_mix(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> sizes(count);
  for (auto& size : sizes) size = draw_size(rng);
  return sizes;
}

std::vector<std::size_t> small_size_mix(std::size_t count, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<std::size_t> sizes(count);
  for (auto& size : sizes) size = draw_small_size(rng);
  return sizes;
}

RandomWorkload random_workload(std::size_t ops, std::size_t window, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  RandomWorkload workload;
  workload.prefill_live = window / 2;
  for (std::size_t i = 0; i < workload.prefill_live; ++i)
    workload.prefill.push_back(draw_size(rng));
  std::size_t live = workload.prefill_live;
  auto emit_free = [&] {
    workload.ops.push_back({false, 0, static_cast<std::size_t>(rng() % live)});
    --live;
  };
  auto emit_allocate = [&] {
    workload.ops.push_back({true, draw_size(rng), 0});
    ++live;
  };
  for (std::size_t i = 0; i < ops; ++i) {
    const bool allocate = live == 0 || (live < window && (rng() & 1) != 0);
    allocate ? emit_allocate() : emit_free();
  }
  // Return to the starting population so the sequence can loop.
  while (live > workload.prefill_live) emit_free();
  while (live < workload.prefill_live) emit_allocate();
  return workload;
}

Trace training_trace(Model model, int batch, int iterations) {
  const Network net = model == Model::resnet50 ? resnet50(batch) : vgg16(batch);
  const auto& layers = net.layers();
  TraceWriter out;

  std::vector<std::uint32_t> weights;
  for (const Layer& layer : layers) {
    for (std::size_t bytes : layer.params) weights.push_back(out.allocate(bytes, true));
    for (std::size_t bytes : layer.buffers) weights.push_back(out.allocate(bytes, true));
  }

  std::vector<std::uint32_t> momentum;
  for (int iteration = 0; iteration < iterations; ++iteration) {
    const std::uint32_t input = out.allocate(net.input_bytes(), false);

    std::vector<std::uint32_t> saved(layers.size());
    for (std::size_t i = 0; i < layers.size(); ++i) {
      const std::uint32_t workspace =
          layers[i].workspace ? out.allocate(layers[i].workspace, false) : UINT32_MAX;
      saved[i] = out.allocate(layers[i].output, false);
      if (workspace != UINT32_MAX) out.free(workspace);
    }

    // Loss: a scalar, and the gradient of the logits.
    const std::uint32_t loss = out.allocate(kFloat, false);
    std::uint32_t grad = out.allocate(layers.back().output, false);
    out.free(loss);

    std::vector<std::uint32_t> param_grads;
    for (std::size_t i = layers.size(); i-- > 0;) {
      const Layer& layer = layers[i];
      const std::uint32_t workspace =
          layer.workspace ? out.allocate(layer.workspace, false) : UINT32_MAX;
      // The network input needs no gradient.
      const std::uint32_t grad_in = i > 0 ? out.allocate(layers[i - 1].output, false) : UINT32_MAX;
      for (std::size_t bytes : layer.params) param_grads.push_back(out.allocate(bytes, false));
      if (workspace != UINT32_MAX) out.free(workspace);
      out.free(grad);
      out.free(saved[i]);
      grad = grad_in;
    }
    out.free(input);

    // Optimizer step: momentum buffers appear in the first step and outlive the iteration.
    if (iteration == 0) {
      for (const Layer& layer : layers) {
        for (std::size_t bytes : layer.params) momentum.push_back(out.allocate(bytes, false));
      }
    }
    for (std::uint32_t slot : param_grads) out.free(slot);
    out.end_iteration();
  }

  for (std::uint32_t slot : momentum) out.free(slot);
  for (std::uint32_t slot : weights) out.free(slot);
  return out.take();
}

}  // namespace salus::bench
