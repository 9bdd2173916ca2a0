#pragma once
// The online surrogate of online_step and torchscript_step: the MLP width-hidden-hidden-width with ReLUs, as
// bench/python/online_step.py and torchscript_surrogate.py build it in PyTorch (the same parameter names).
#include <torch/torch.h>

#include <cstdint>

namespace bench {

inline torch::nn::Sequential surrogate_mlp(std::int64_t width, std::int64_t hidden) {
  return torch::nn::Sequential(torch::nn::Linear(width, hidden), torch::nn::ReLU(), torch::nn::Linear(hidden, hidden),
                               torch::nn::ReLU(), torch::nn::Linear(hidden, width));
}

}  // namespace bench
