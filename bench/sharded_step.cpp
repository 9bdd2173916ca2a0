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
#include "support/sharded_steps.h"
#include "support/source_dir.h"

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/comm/spawn.h>
#include <fastlearn/distributed/distributed_trainer.h>

#include <fmt/format.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <vector>

namespace fl = fastlearn;

namespace {

constexpr int kBatch = 32, kSteps = 30, kWarmup = 5;
const std::vector<std::string> kModels{"mlp_8x1024", "conv_net_32_64_128_256"};  // zero_step.py's names
using Measured = bench::StepMeasure;

Measured measure(const std::string& name, fl::Shard shard) {
  return bench::measure_steps(name, {.shard = shard}, kBatch, kSteps, kWarmup);
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
        const auto anchor = bench::run_torchrun_anchor("zero_step.py", kBatch, kSteps, kModels[m]);
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
