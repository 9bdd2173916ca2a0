// Synchronous distributed SGD as in the PyTorch tutorial "Writing distributed applications": the
// training set is partitioned (the same seeded shuffle on every rank, one contiguous part each), every
// rank trains the same model on its part with batch 128 / world_size, and after each backward the
// gradients are averaged with all_reduce, so all replicas take identical steps.
//   fastlearn launch --nproc-per-node 2 build/bin/distributed_sgd [--epochs N] [--data DIR]
#include <fastlearn/comm/collectives.h>
#include <fastlearn/data/idx.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace fl = fastlearn;

namespace {

// Rank `rank`'s part of a seeded permutation of `n` items split into `parts` nearly equal parts.
at::Tensor partition(std::int64_t n, int parts, int rank, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto order = torch::randperm(n, gen, torch::kLong);
  return order.tensor_split(parts)[static_cast<std::size_t>(rank)];
}

void average_gradients(torch::nn::Module& model) {
  for (auto& p : model.parameters()) {
    if (p.grad().defined()) fl::all_reduce(p.grad(), fl::ReduceOp::avg);
  }
}

}  // namespace

int main(int argc, char** argv) {
  try {
    int epochs = 1;
    std::string dir = "/usr/share/datasets/fashion-mnist";
    for (int i = 1; i + 1 < argc; i += 2) {
      const std::string flag = argv[i];
      if (flag == "--epochs")
        epochs = std::stoi(argv[i + 1]);
      else if (flag == "--data")
        dir = argv[i + 1];
      else
        throw std::invalid_argument("unknown option " + flag + " (use --epochs N, --data DIR)");
    }
    fl::DistribCtx ctx;
    const int rank = fl::rank(), world = fl::world_size();
    // The backend's device: a GPU per rank with NCCL, the CPU with Gloo.
    const auto device = fl::distrib_device();
    auto images = fl::read_idx(dir + "/train-images-idx3-ubyte.gz").unsqueeze(1).to(device, torch::kFloat32).div_(255);
    auto labels = fl::read_idx(dir + "/train-labels-idx1-ubyte.gz").to(device, torch::kLong);
    images = (images - 0.2860) / 0.3530;
    auto mine = partition(images.size(0), world, rank, 1234);
    const std::int64_t bs = 128 / world;

    torch::manual_seed(0);  // the same initial weights on every rank
    auto model = fl::models::simple_cnn(10);
    model->to(device);
    torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.5));
    for (int epoch = 0; epoch < epochs; ++epoch) {
      double epoch_loss = 0;
      std::int64_t batches = 0;
      auto order = mine.index_select(0, torch::randperm(mine.size(0), torch::kLong)).to(device);
      for (std::int64_t start = 0; start + bs <= order.size(0); start += bs) {
        auto idx = order.slice(0, start, start + bs);
        auto loss = torch::nn::functional::cross_entropy(model->forward(images.index_select(0, idx)),
                                                         labels.index_select(0, idx));
        opt.zero_grad();
        loss.backward();
        average_gradients(*model);
        opt.step();
        epoch_loss += loss.item<double>();  // a host sync per batch: fine for a tutorial
        ++batches;
      }
      fmt::print("rank {} epoch {}: loss {:.4f} over {} batches of {}\n", rank, epoch, epoch_loss / batches, batches,
                 bs);
    }
    // Every replica holds the same weights: check with an all_reduce of their differences to rank 0's.
    auto flat = torch::cat({model->parameters()[0].detach().flatten(), model->parameters().back().detach().flatten()});
    auto reference = flat.clone();
    fl::broadcast(reference, 0);
    auto mismatch = (flat - reference).abs().max();
    fl::all_reduce(mismatch, fl::ReduceOp::max);
    fmt::print("rank {}: replicas identical: {}\n", rank, mismatch.item<double>() == 0.0 ? "yes" : "NO");
    return mismatch.item<double>() == 0.0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::cerr << "distributed_sgd: error: " << e.what() << "\n";
    return 1;
  }
}
