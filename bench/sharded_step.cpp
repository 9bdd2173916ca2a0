// sharded_step: median seconds per data parallel training step on 2 ranks (Gloo, 1 thread per rank, this machine)
// with Adam, a fixed batch of 32 items per rank, and the bytes each rank holds (the unique storages of the
// parameters, gradients and optimizer state after the last backward, counted the same way on both sides):
//  - sharded_step: an MLP of 8 layers of 1024 x 1024 and a head (8.4M parameters), fastlearn's Learner under
//    DistribCtx with shard = "gradients" (ZeRO stage 2) vs PyTorch's DistributedDataParallel +
//    ZeroRedundancyOptimizer(AdamW) in Python started by torchrun (bench/python/zero_step.py; ZeRO stage 1, what
//    PyTorch offers short of FSDP). ratio = anchor / ours. Also ours unsharded (`ours_ddp`, `ratio_vs_our_ddp` =
//    ours_ddp / ours) and with shard = "optimizer" (`ours_optimizer`).
//  - sharded_step_conv_net: the same on models::conv_net 32-64-128-256 (BatchNorm, 390k parameters), reported
//    beside it.
// Ours are whole Learner steps (every event), timed from a barrier before the batch to its end; the anchor's are
// bare loop steps, timed from a barrier likewise. The sides' runs alternate (FASTLEARN_BENCH_REPEATS, default 5):
// after our three runs rank 0 runs the anchor while rank 1 waits. Prints one JSON object.
#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/comm/spawn.h>
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
#include <fstream>
#include <iostream>
#include <vector>

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kBatch = 32, kSteps = 30, kWarmup = 5;
const std::vector<std::string> kModels{"mlp_8x1024", "conv_net_32_64_128_256"};  // zero_step.py's names

torch::nn::Sequential make_model(const std::string& name) {
  if (name != "mlp_8x1024") return fl::models::conv_net({.widths = {32, 64, 128, 256}});
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
struct StepTimer : fl::Callback {
  StepTimer() { order = fl::cb_order::distributed_trainer + 1; }  // after_backward: after the reducer's part
  std::vector<double> times;
  std::int64_t held = 0;
  Clock::time_point start;
  void before_batch() override {
    if (!learn().training) return;
    fl::barrier();
    start = Clock::now();
  }
  void after_backward() override {
    if (learn().iter + 1 == learn().n_iter) held = fl::memory_report(learn()).total();
  }
  void after_batch() override {
    if (learn().training) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
};

struct Measured {
  double seconds = 0;
  std::int64_t held = 0;
};

// The median step of one fit over kWarmup + kSteps batches of a fresh seeded model.
Measured measure(const std::string& name, fl::Shard shard) {
  torch::manual_seed(0);
  auto model = make_model(name);
  const std::int64_t n = 2 * static_cast<std::int64_t>(kSteps + kWarmup) * kBatch;  // each rank gets half
  auto x = name == "mlp_8x1024" ? torch::randn({n, 1024}) : torch::randn({n, 1, 28, 28});
  auto y = torch::randint(0, 3, {n}, torch::kLong);
  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.narrow(0, 0, 8)},
                                                   std::vector<at::Tensor>{y.narrow(0, 0, 8)});
  fl::DataLoaders dls(fl::DataLoader(train, {.bs = kBatch}), fl::DataLoader(valid, {.bs = 8}), 10);
  fl::Learner learn(std::move(dls), model, fl::cross_entropy(), {.opt_func = fl::Adam(), .progress = false});
  auto timer = std::make_shared<StepTimer>();
  learn.add_cb(timer);
  {
    fl::DistribCtx ctx(learn, {.shard = shard});
    learn.fit(1, 1e-3);
  }
  std::vector<double> times(timer->times.begin() + std::min<std::ptrdiff_t>(kWarmup, timer->times.size()),
                            timer->times.end());
  std::sort(times.begin(), times.end());
  return {.seconds = times.empty() ? 0 : times[times.size() / 2], .held = timer->held};
}

// One run of the anchor (torchrun, 2 ranks): its median step and rank 0's bytes, or zeros when it did not report.
Measured run_anchor(const std::string& name) {
  const auto command = fmt::format(
      "OMP_NUM_THREADS=1 {} -m torch.distributed.run --nproc-per-node 2 --master-port {} "
      "{}/bench/python/zero_step.py {} {} {} 2>/dev/null",
      FASTLEARN_PYTHON, fl::pick_free_port("127.0.0.1"), FASTLEARN_SOURCE_DIR, kBatch, kSteps, name);
  double median = 0, low = 0, high = 0;
  long long held = 0;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    if (std::fscanf(pipe, "%lf %lf %lf %lld", &median, &low, &high, &held) != 4) median = 0;
    pclose(pipe);
  }
  return {.seconds = median, .held = held};
}

// Rank 0 writes one line per model and repeat: the model's index, then seconds and bytes of ours with sharded
// gradients, ours unsharded, ours with the sharded optimizer state, and the anchor.
void run_rank(int) {
  at::set_num_threads(1);
  fl::setup_distrib({.timeout = std::chrono::seconds(300)});
  std::ofstream out;
  if (fl::rank() == 0) out.open(std::getenv("FASTLEARN_BENCH_OUT"));
  for (int r = 0, n = bench::repeats(5); r < n; ++r) {
    for (std::size_t m = 0; m < kModels.size(); ++m) {
      const auto gradients = measure(kModels[m], fl::Shard::gradients);
      const auto ddp = measure(kModels[m], fl::Shard::none);
      const auto optimizer = measure(kModels[m], fl::Shard::optimizer);
      if (fl::rank() == 0) {
        const auto anchor = run_anchor(kModels[m]);
        out << m;
        for (const auto& x : {gradients, ddp, optimizer, anchor}) out << " " << x.seconds << " " << x.held;
        out << "\n" << std::flush;
      }
      fl::barrier();
    }
  }
  fl::teardown_distrib();
}

}  // namespace

int main() {
  const auto out = std::filesystem::temp_directory_path() / fmt::format("fastlearn-sharded-bench-{}", getpid());
  fl::spawn(2, run_rank,
            {.extra_env = {{"FASTLEARN_BENCH_OUT", out.string()}, {"OMP_NUM_THREADS", "1"}}, .prefix_output = false});
  struct Series {
    std::vector<double> gradients, ddp, optimizer, anchor;
    std::int64_t held[4] = {0, 0, 0, 0};
  };
  std::vector<Series> series(kModels.size());
  std::ifstream in(out);
  for (std::size_t m; in >> m;) {
    double s[4];
    std::int64_t h[4];
    for (int k = 0; k < 4; ++k) in >> s[k] >> h[k];
    if (!in || m >= kModels.size()) break;
    if (s[3] <= 0) {
      std::cerr << "sharded_step: the anchor's run of " << kModels[m] << " did not report (python: " << FASTLEARN_PYTHON
                << ")\n";
      return 1;
    }
    auto& runs = series[m];
    runs.gradients.push_back(s[0]);
    runs.ddp.push_back(s[1]);
    runs.optimizer.push_back(s[2]);
    runs.anchor.push_back(s[3]);
    for (int k = 0; k < 4; ++k) runs.held[k] = h[k];
  }
  std::filesystem::remove(out);
  std::vector<bench::Row> rows;
  for (std::size_t m = 0; m < kModels.size(); ++m) {
    const auto& runs = series[m];
    if (runs.gradients.empty()) {
      std::cerr << "sharded_step: no measurement of " << kModels[m] << " came back from the ranks\n";
      return 1;
    }
    const auto ours = bench::summarize(runs.gradients), anchor = bench::summarize(runs.anchor),
               ddp = bench::summarize(runs.ddp), optimizer = bench::summarize(runs.optimizer);
    rows.push_back(bench::Row(m == 0 ? "sharded_step" : "sharded_step_conv_net", ours, anchor, "s/step", false, 5)
                       .stats("ours_ddp", ddp, 5)
                       .set("ratio_vs_our_ddp", ddp.median / ours.median, 3)
                       .stats("ours_optimizer", optimizer, 5)
                       .set("bytes_per_rank_ours", runs.held[0])
                       .set("bytes_per_rank_anchor", runs.held[3])
                       .set("bytes_per_rank_ours_ddp", runs.held[1])
                       .set("bytes_per_rank_ours_optimizer", runs.held[2])
                       .set("model", kModels[m])
                       .set("ranks", 2)
                       .set("batch_per_rank", kBatch)
                       .set("steps", kSteps)
                       .set("repeats", runs.gradients.size())
                       .set("what", "2-rank Adam step on " + kModels[m] +
                                        ": fastlearn Learner with shard = gradients (ZeRO-2) vs PyTorch DDP + "
                                        "ZeroRedundancyOptimizer(AdamW), Gloo, 1 thread per rank; bytes: the unique "
                                        "storages of parameters, gradients and optimizer state per rank"));
  }
  fmt::print("{}\n", bench::results_line(rows));
  return 0;
}
