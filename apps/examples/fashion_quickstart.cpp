// A small real training run on Fashion-MNIST with plain LibTorch and fastlearn's IDX reader:
// a few hundred AdamW steps of a small CNN on CPU, then the test-set accuracy.
//   fashion_quickstart [DATA_DIR] [STEPS]   (default: $FASTLEARN_FASHION_MNIST or Debian's copy, 600)
#include <fastlearn/core/error.h>
#include <fastlearn/data/idx.h>
#include <fastlearn/learner/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

constexpr double kMean = 0.2860, kStd = 0.3530;  // Fashion-MNIST training-set pixel statistics

struct Split {
  torch::Tensor x, y;
};

Split load_split(const fs::path& dir, const std::string& prefix) {
  auto images = fl::read_idx(dir / (prefix + "-images-idx3-ubyte.gz"));
  auto labels = fl::read_idx(dir / (prefix + "-labels-idx1-ubyte.gz"));
  auto x = (images.unsqueeze(1).to(torch::kFloat32).div_(255.0) - kMean) / kStd;
  return {x, labels.to(torch::kLong)};
}

double accuracy(torch::nn::Sequential& model, const Split& data) {
  torch::NoGradGuard no_grad;
  model->eval();
  std::int64_t correct = 0;
  for (std::int64_t i = 0; i < data.x.size(0); i += 1000) {
    auto xb = data.x.slice(0, i, i + 1000);
    correct += model->forward(xb).argmax(1).eq(data.y.slice(0, i, i + 1000)).sum().item<std::int64_t>();
  }
  model->train();
  return static_cast<double>(correct) / static_cast<double>(data.x.size(0));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const char* env_dir = std::getenv("FASTLEARN_FASHION_MNIST");
    const fs::path dir = argc > 1 ? argv[1] : env_dir ? env_dir : "/usr/share/datasets/fashion-mnist";
    const int steps = argc > 2 ? std::stoi(argv[2]) : 600;
    constexpr int kBatch = 128;
    torch::manual_seed(0);

    const auto start = std::chrono::steady_clock::now();
    auto train = load_split(dir, "train");
    auto test = load_split(dir, "t10k");
    fmt::print("Fashion-MNIST from {}: {} train / {} test images\n", dir.string(), train.x.size(0), test.x.size(0));

    auto model = fl::models::simple_cnn(10);
    torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(2e-3).weight_decay(0.01));
    auto order = torch::randperm(train.x.size(0), torch::kLong);
    double smooth = 0.0;
    for (int step = 0, pos = 0; step < steps; ++step, pos += kBatch) {
      if (pos + kBatch > train.x.size(0)) {
        order = torch::randperm(train.x.size(0), torch::kLong);
        pos = 0;
      }
      auto idx = order.slice(0, pos, pos + kBatch);
      auto loss = torch::nn::functional::cross_entropy(model->forward(train.x.index_select(0, idx)),
                                                       train.y.index_select(0, idx));
      opt.zero_grad();
      loss.backward();
      opt.step();
      smooth = step == 0 ? loss.item<double>() : 0.98 * smooth + 0.02 * loss.item<double>();
      if ((step + 1) % 50 == 0 || step + 1 == steps) {
        const std::chrono::duration<double> t = std::chrono::steady_clock::now() - start;
        fmt::print("step {:4d}/{}  loss {:.4f}  ({:.1f}s)\n", step + 1, steps, smooth, t.count());
        std::fflush(stdout);
      }
    }
    const double acc = accuracy(model, test);
    const std::chrono::duration<double> total = std::chrono::steady_clock::now() - start;
    fmt::print("test accuracy {:.2f}% after {} steps of batch {} ({:.1f}s)\n", 100 * acc, steps, kBatch, total.count());
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_quickstart: error: " << e.what() << "\n";
    return 1;
  }
}
