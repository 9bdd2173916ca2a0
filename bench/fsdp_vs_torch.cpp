// fsdp_vs_torch: median seconds per data parallel training step on 2 ranks (Gloo, 1 thread per rank, this machine)
// with Adam(W) in fp32, every parameter sharded (ZeRO stage 3), and the bytes each rank holds (the unique local
// storages of the parameters, gradients and optimizer state after the last backward, counted the same way on both
// sides):
//  - fsdp_vs_torch: an MLP of 8 layers of 1024 x 1024 and a head (8.4M parameters), 32 items per rank: fastlearn's
//    Learner under DistribCtx with shard = "parameters" (a unit per layer, the default: each entry of the Sequential
//    with parameters) vs PyTorch FSDP2 (fully_shard per layer, then the root, its defaults) in Python started by
//    torchrun (bench/python/fsdp_step.py). ratio = anchor / ours. Also ours unsharded (`ours_ddp`,
//    `ratio_vs_our_ddp` = ours_ddp / ours).
//  - fsdp_vs_torch_large_batch: the same with 256 items per rank.
//  - fsdp_vs_torch_conv_net: models::conv_net 32-64-128-256 (a unit per block), 32 items per rank.
// Ours are whole Learner steps (every event), timed from a barrier before the batch to its end; the anchor's are
// bare loop steps, timed from a barrier likewise. The sides' runs alternate (FASTLEARN_BENCH_REPEATS, default 5):
// after our two runs rank 0 runs the anchor while rank 1 waits. Prints one JSON object.
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
#include <string>
#include <vector>

namespace fl = fastlearn;

namespace {

constexpr int kSteps = 20, kWarmup = 5;

struct Case {
  std::string row, model;
  int batch;
};
const std::vector<Case> kCases{{"fsdp_vs_torch", "mlp_8x1024", 32},
                               {"fsdp_vs_torch_large_batch", "mlp_8x1024", 256},
                               {"fsdp_vs_torch_conv_net", "conv_net_32_64_128_256", 32}};

// Rank 0 writes one line per case and repeat: the case's index, then seconds and bytes of ours with sharded
// parameters, ours unsharded, and the anchor.
void run_rank(int) {
  at::set_num_threads(1);
  fl::setup_distrib({.timeout = std::chrono::seconds(300)});
  std::ofstream out;
  if (fl::rank() == 0) out.open(std::getenv("FASTLEARN_BENCH_OUT"));
  for (int r = 0, n = bench::repeats(5); r < n; ++r) {
    for (std::size_t c = 0; c < kCases.size(); ++c) {
      const auto& k = kCases[c];
      const auto ours = bench::measure_steps(k.model, {.shard = fl::Shard::parameters}, k.batch, kSteps, kWarmup);
      const auto ddp = bench::measure_steps(k.model, {.shard = fl::Shard::none}, k.batch, kSteps, kWarmup);
      if (fl::rank() == 0) {
        const auto anchor = bench::run_torchrun_anchor("fsdp_step.py", k.batch, kSteps, k.model);
        out << c;
        for (const auto& x : {ours, ddp, anchor}) out << " " << x.seconds << " " << x.held;
        out << "\n" << std::flush;
      }
      fl::barrier();
    }
  }
  fl::teardown_distrib();
}

}  // namespace

int main() {
  const auto out = std::filesystem::temp_directory_path() / fmt::format("fastlearn-fsdp-bench-{}", getpid());
  fl::spawn(2, run_rank,
            {.extra_env = {{"FASTLEARN_BENCH_OUT", out.string()}, {"OMP_NUM_THREADS", "1"}}, .prefix_output = false});
  struct Series {
    std::vector<double> ours, ddp, anchor;
    std::int64_t held[3] = {0, 0, 0};
  };
  std::vector<Series> series(kCases.size());
  std::ifstream in(out);
  for (std::size_t c; in >> c;) {
    double s[3];
    std::int64_t h[3];
    for (int k = 0; k < 3; ++k) in >> s[k] >> h[k];
    if (!in || c >= kCases.size()) break;
    if (s[2] <= 0) {
      std::cerr << "fsdp_vs_torch: the anchor's run of " << kCases[c].row << " did not report (python: "
                << FASTLEARN_PYTHON << ")\n";
      return 1;
    }
    auto& runs = series[c];
    runs.ours.push_back(s[0]);
    runs.ddp.push_back(s[1]);
    runs.anchor.push_back(s[2]);
    for (int k = 0; k < 3; ++k) runs.held[k] = h[k];
  }
  std::filesystem::remove(out);
  std::vector<bench::Row> rows;
  for (std::size_t c = 0; c < kCases.size(); ++c) {
    const auto& runs = series[c];
    const auto& k = kCases[c];
    if (runs.ours.empty()) {
      std::cerr << "fsdp_vs_torch: no measurement of " << k.row << " came back from the ranks\n";
      return 1;
    }
    const auto ours = bench::summarize(runs.ours), anchor = bench::summarize(runs.anchor),
               ddp = bench::summarize(runs.ddp);
    rows.push_back(bench::Row(k.row, ours, anchor, "s/step", false, 5)
                       .stats("ours_ddp", ddp, 5)
                       .set("ratio_vs_our_ddp", ddp.median / ours.median, 3)
                       .set("bytes_per_rank_ours", runs.held[0])
                       .set("bytes_per_rank_anchor", runs.held[2])
                       .set("bytes_per_rank_ours_ddp", runs.held[1])
                       .set("model", k.model)
                       .set("ranks", 2)
                       .set("batch_per_rank", k.batch)
                       .set("steps", kSteps)
                       .set("repeats", runs.ours.size())
                       .set("what", fmt::format("2-rank Adam step on {} with {} items per rank: fastlearn Learner with "
                                                "shard = parameters (ZeRO-3, a unit per layer) vs PyTorch FSDP2 "
                                                "(fully_shard per layer), Gloo, 1 thread per rank; bytes: the unique "
                                                "local storages of parameters, gradients and optimizer state per rank",
                                                k.model, k.batch)));
  }
  fmt::print("{}\n", bench::results_line(rows));
  return 0;
}
