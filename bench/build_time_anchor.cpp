// The anchor of build_time: the Fashion-MNIST training app of apps/examples/fashion_mnist.cpp written in plain
// LibTorch, as a user without fastlearn would (torch::data's MNIST reader over the uncompressed IDX files,
// the same small CNN, torch::optim::AdamW, a test accuracy). Only its compile and link time is measured;
// it also runs:  build_time_anchor DIR_WITH_UNCOMPRESSED_IDX [epochs]
#include <torch/torch.h>

#include <cstdio>
#include <string>

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: build_time_anchor DIR_WITH_UNCOMPRESSED_IDX [epochs]\n");
    return 2;
  }
  const std::string dir = argv[1];
  const int epochs = argc > 2 ? std::stoi(argv[2]) : 1;
  torch::manual_seed(0);
  auto conv = [](int in, int out) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(2).padding(1));
  };
  torch::nn::Sequential model(conv(1, 32), torch::nn::ReLU(), conv(32, 64), torch::nn::ReLU(), conv(64, 64),
                              torch::nn::ReLU(), torch::nn::Flatten(), torch::nn::Linear(64 * 4 * 4, 10));
  auto normalize = torch::data::transforms::Normalize<>(0.2860, 0.3530);
  auto train = torch::data::datasets::MNIST(dir).map(normalize).map(torch::data::transforms::Stack<>());
  auto test = torch::data::datasets::MNIST(dir, torch::data::datasets::MNIST::Mode::kTest)
                  .map(normalize)
                  .map(torch::data::transforms::Stack<>());
  auto train_loader = torch::data::make_data_loader<torch::data::samplers::RandomSampler>(std::move(train), 128);
  auto test_loader = torch::data::make_data_loader(std::move(test), 256);
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(3e-3).betas({0.9, 0.99}).eps(1e-5));
  for (int epoch = 0; epoch < epochs; ++epoch) {
    model->train();
    for (auto& batch : *train_loader) {
      auto loss = torch::nn::functional::cross_entropy(model->forward(batch.data), batch.target);
      opt.zero_grad();
      loss.backward();
      opt.step();
    }
    torch::NoGradGuard no_grad;
    model->eval();
    std::int64_t correct = 0, total = 0;
    for (auto& batch : *test_loader) {
      correct += model->forward(batch.data).argmax(1).eq(batch.target).sum().item<std::int64_t>();
      total += batch.target.size(0);
    }
    std::printf("epoch %d: test accuracy %.2f%%\n", epoch,
                100.0 * static_cast<double>(correct) / static_cast<double>(total));
  }
  return 0;
}
