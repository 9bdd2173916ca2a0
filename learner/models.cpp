#include <fastlearn/learner/models.h>

#include <torch/torch.h>

namespace fastlearn::models {

torch::nn::Sequential simple_cnn(std::int64_t classes, std::int64_t in_channels) {
  auto conv = [](std::int64_t in, std::int64_t out) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(2).padding(1));
  };
  return torch::nn::Sequential(conv(in_channels, 32), torch::nn::ReLU(), conv(32, 64), torch::nn::ReLU(), conv(64, 64),
                               torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(64 * 4 * 4, classes));
}

}  // namespace fastlearn::models
