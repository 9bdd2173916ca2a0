#pragma once
// The online surrogate of online_step and torchscript_step: the MLP width-hidden-hidden-width with ReLUs, as
// bench/python/online_step.py and torchscript_surrogate.py build it in PyTorch (the same parameter names).
#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

namespace bench {

inline torch::nn::Sequential surrogate_mlp(std::int64_t width, std::int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(width, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, width));
}

/// The 16 batches the surrogate learns from, in turn: `batch` rows of `width` values from torch's generator, and their
/// tanh as the targets.
inline std::pair<std::vector<at::Tensor>, std::vector<at::Tensor>> surrogate_batches(std::int64_t batch,
                                                                                     std::int64_t width) {
  std::vector<at::Tensor> xs, ys;
  for (int i = 0; i < 16; ++i) {
    xs.push_back(torch::randn({batch, width}));
    ys.push_back(torch::tanh(xs.back()));
  }
  return {xs, ys};
}

}  // namespace bench
