#pragma once
// What bench/sharded_step.cpp and bench/fsdp_vs_torch.cpp share: the models of bench/python/zero_step.py, a Learner's
// median data parallel training step under a given shard on this rank (the bytes it holds with it), and one run of a
// Python anchor under torchrun on 2 ranks.
#include "support/bench_support.h"
#include "support/source_dir.h"

#include <fastlearn/comm/collectives.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/launch/launcher.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/memory_report.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/adam.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

namespace bench {

// zero_step.py's names: an MLP of 8 layers of 1024 x 1024 and a head (8.4M parameters), or conv_net 32-64-128-256.
inline torch::nn::Sequential sharded_model(const std::string& name) {
  if (name != "mlp_8x1024") return fastlearn::models::conv_net({.widths = {32, 64, 128, 256}});
  torch::nn::Sequential mlp;
  for (int k = 0; k < 8; ++k) {
    mlp->push_back(torch::nn::Linear(1024, 1024));
    mlp->push_back(torch::nn::ReLU());
  }
  mlp->push_back(torch::nn::Linear(1024, 3));
  return mlp;
}

// Each training step's seconds, from a barrier before its batch to the batch's end, and the bytes held after the last
// backward.
struct StepTimer : fastlearn::Callback {
  StepTimer() { order = fastlearn::cb_order::distributed_trainer + 1; }  // after_backward: after the reducer's part
  std::vector<double> times;
  std::int64_t held = 0;
  Clock::time_point start;
  void before_batch() override {
    if (!learn().training) return;
    fastlearn::barrier();
    start = Clock::now();
  }
  void after_backward() override {
    if (learn().iter + 1 == learn().n_iter) held = fastlearn::memory_report(learn()).total();
  }
  void after_batch() override {
    if (learn().training) times.push_back(seconds_since(start));
  }
};

struct StepMeasure {
  double seconds = 0;
  std::int64_t held = 0;
};

// The median step of one fit over `warmup` + `steps` batches of `batch` items on this rank, a fresh seeded model,
// Adam with fastai's defaults.
inline StepMeasure measure_steps(const std::string& name, const fastlearn::DistributedTrainerOptions& options,
                                 int batch, int steps, int warmup) {
  namespace fl = fastlearn;
  torch::manual_seed(0);
  auto model = sharded_model(name);
  const std::int64_t n = 2 * static_cast<std::int64_t>(steps + warmup) * batch;  // each rank gets half
  auto x = name == "mlp_8x1024" ? torch::randn({n, 1024}) : torch::randn({n, 1, 28, 28});
  auto y = torch::randint(0, 3, {n}, torch::kLong);
  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.narrow(0, 0, 8)},
                                                   std::vector<at::Tensor>{y.narrow(0, 0, 8)});
  fl::DataLoaders dls(fl::DataLoader(train, {.bs = batch}), fl::DataLoader(valid, {.bs = 8}), 10);
  fl::Learner learn(std::move(dls), model, fl::cross_entropy(), {.opt_func = fl::Adam(), .progress = false});
  auto timer = std::make_shared<StepTimer>();
  learn.add_cb(timer);
  {
    fl::DistribCtx ctx(learn, options);
    learn.fit(1, 1e-3);
  }
  std::vector<double> times(timer->times.begin() + std::min<std::ptrdiff_t>(warmup, timer->times.size()),
                            timer->times.end());
  std::sort(times.begin(), times.end());
  return {.seconds = times.empty() ? 0 : times[times.size() / 2], .held = timer->held};
}

// One run of bench/python/<script> under torchrun on 2 ranks (BS STEPS MODEL): its median step and rank 0's bytes, or
// zeros when it did not report.
inline StepMeasure run_torchrun_anchor(const std::string& script, int batch, int steps, const std::string& name) {
  const auto command = fmt::format(
      "OMP_NUM_THREADS=1 {} -m torch.distributed.run --nproc-per-node 2 --master-port {} "
      "{}/bench/python/{} {} {} {} 2>/dev/null",
      FASTLEARN_PYTHON, fastlearn::pick_free_port("127.0.0.1"), FASTLEARN_SOURCE_DIR, script, batch, steps, name);
  double median = 0, low = 0, high = 0;
  long long held = 0;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    if (std::fscanf(pipe, "%lf %lf %lf %lld", &median, &low, &high, &held) != 4) median = 0;
    pclose(pipe);
  }
  return {.seconds = median, .held = held};
}

}  // namespace bench
