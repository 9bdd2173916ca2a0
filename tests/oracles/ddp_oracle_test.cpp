// Oracle: on 2 ranks the GradReducer's averaged gradients equal those of PyTorch's own
// DistributedDataParallel (Gloo, run by torchrun in Python) for the same model, weights and batches.
// Runs when Python torch and safetensors are present.
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>

#include "support/build_paths.h"
#include "support/multiprocess.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

TEST(DdpOracle, AveragedGradientsEqualPyTorchDdp) {
  const std::string python = FASTLEARN_PYTHON;
  const auto dir = fs::temp_directory_path() / ("fastlearn-ddp-" + std::to_string(flt::test_process_id()));
  if (!flt::in_rank_process()) {
    if (python.empty() ||
        std::system((python + " -c 'import torch.distributed, safetensors.torch' 2>/dev/null").c_str()) != 0) {
      GTEST_SKIP() << "no Python torch with safetensors";
    }
    fs::create_directories(dir);
    torch::manual_seed(5);
    auto model = fl::models::mlp(16, {32}, 4);
    fl::NamedTensors tensors;
    for (const auto& p : model->named_parameters()) tensors.emplace_back(p.key(), p.value().detach());
    for (int r = 0; r < 2; ++r) {  // uneven batch sizes: DDP averages per rank, so must we
      tensors.emplace_back(fmt::format("data/x{}", r), torch::randn({6 + 2 * r, 16}));
      tensors.emplace_back(fmt::format("data/y{}", r), torch::randint(0, 4, {6 + 2 * r}, torch::kLong));
    }
    fl::save_safetensors(dir / "input.safetensors", tensors);
  }
  flt::run_on_ranks(2,
                    [&dir](const flt::RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      auto input = fl::load_safetensors(dir / "input.safetensors");
                      auto model = fl::models::mlp(16, {32}, 4);
                      std::vector<std::pair<std::string, at::Tensor>> params;
                      {
                        torch::NoGradGuard no_grad;
                        for (auto& p : model->named_parameters()) {
                          p.value().copy_(*input.find(p.key()));
                          params.emplace_back(p.key(), p.value());
                        }
                      }
                      fl::GradReducer reducer(params, {}, fl::world_group());
                      const auto x = *input.find(fmt::format("data/x{}", fl::rank()));
                      const auto y = *input.find(fmt::format("data/y{}", fl::rank()));
                      torch::nn::functional::cross_entropy(model->forward(x), y).backward();
                      if (fl::rank() == 0) {
                        fl::NamedTensors grads;
                        for (auto& [name, p] : params) grads.emplace_back(name, p.grad());
                        fl::save_safetensors(dir / "ours.safetensors", grads);
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});

  const auto command = fmt::format(
      "{} -m torch.distributed.run --nproc-per-node 2 --master-port {} {}/tests/python/"
      "ddp_grads_oracle.py {} {} > {} 2>&1",
      python, flt::free_tcp_port(), FASTLEARN_SOURCE_DIR, (dir / "input.safetensors").string(),
      (dir / "ddp.safetensors").string(), (dir / "torchrun.log").string());
  ASSERT_EQ(std::system(command.c_str()), 0) << "torchrun failed; see " << dir / "torchrun.log";
  auto ours = fl::load_safetensors(dir / "ours.safetensors");
  auto theirs = fl::load_safetensors(dir / "ddp.safetensors");
  ASSERT_EQ(ours.tensors.size(), theirs.tensors.size());
  for (const auto& [name, grad] : ours.tensors) {
    const auto* ddp = theirs.find(name);
    ASSERT_NE(ddp, nullptr) << name;
    EXPECT_TRUE(grad.allclose(*ddp, 1e-5, 1e-7)) << name << " differs by " << (grad - *ddp).abs().max().item<double>();
  }
  fs::remove_all(dir);
}
