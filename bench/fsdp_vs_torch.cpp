// fsdp_vs_torch: median seconds per data parallel training step on 2 ranks (Gloo, 1 thread per rank, this machine)
// with Adam(W) in fp32, every parameter sharded (ZeRO stage 3), and the bytes each rank holds (the unique local
// storages of the parameters, gradients and optimizer state after the last backward, counted the same way on both
// sides):
//  - fsdp_vs_torch: an MLP of 8 layers of 1024 x 1024 and a head (8.4M parameters), 32 items per rank: fastlearn's
//    Learner under DistribCtx with shard = "parameters" (a unit per layer, the default: each entry of the Sequential
//    with parameters) vs PyTorch FSDP2 (fully_shard per layer, then the root, its defaults) in Python started by
//    torchrun (bench/python/fsdp_step.py). ratio = anchor / ours. Also ours unsharded (`ours_ddp`,
//    `ratio_vs_our_ddp` = ours_ddp / ours).
//    `ours`: prefetch off; `ours_prefetch`: on (each unit's gather started by the unit before; its default is on
//    except over shared memory).
//  - fsdp_vs_torch_large_batch: the same with 256 items per rank.
//  - fsdp_vs_torch_conv_net: models::conv_net 32-64-128-256 (a unit per block), 32 items per rank.
//  - fsdp_vs_torch_tcp: fsdp_vs_torch with our ranks over Gloo's TCP transport too (SetupOptions::shared_memory off),
//    where a collective runs on Gloo's threads and a prefetched gather can overlap the compute.
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
#include <string>
#include <vector>

namespace fl = fastlearn;

namespace {

constexpr int kSteps = 20, kWarmup = 5;

struct Case {
  std::string row, model;
  int batch;
  bool shared_memory;  ///< our ranks' transport: shared memory (the default on one host) or Gloo's TCP
};
const std::vector<Case> kCases{{"fsdp_vs_torch", "mlp_8x1024", 32, true},
                               {"fsdp_vs_torch_large_batch", "mlp_8x1024", 256, true},
                               {"fsdp_vs_torch_conv_net", "conv_net_32_64_128_256", 32, true},
                               {"fsdp_vs_torch_tcp", "mlp_8x1024", 32, false}};
constexpr int kSides = 4;  // ours, ours with prefetch, ours unsharded, the anchor

// Rank 0 writes one line per case and repeat: the case's index, then seconds and bytes of ours with sharded
// parameters, the same with prefetch, ours unsharded, and the anchor.
void run_rank(int) {
  at::set_num_threads(1);
  std::ofstream out;
  for (int r = 0, n = bench::repeats(5); r < n; ++r) {
    for (std::size_t c = 0; c < kCases.size(); ++c) {
      const auto& k = kCases[c];
      fl::setup_distrib({.timeout = std::chrono::seconds(300), .shared_memory = k.shared_memory});
      if (fl::rank() == 0 && !out.is_open()) out.open(std::getenv("FASTLEARN_BENCH_OUT"));
      fl::DistributedTrainerOptions sharded{.shard = fl::Shard::parameters};
      sharded.prefetch = false;
      auto prefetched = sharded;
      prefetched.prefetch = true;
      const auto ours = bench::measure_steps(k.model, sharded, k.batch, kSteps, kWarmup);
      const auto ours_prefetch = bench::measure_steps(k.model, prefetched, k.batch, kSteps, kWarmup);
      const auto ddp = bench::measure_steps(k.model, {.shard = fl::Shard::none}, k.batch, kSteps, kWarmup);
      if (fl::rank() == 0) {
        const auto anchor = bench::run_torchrun_anchor("fsdp_step.py", k.batch, kSteps, k.model);
        out << c;
        for (const auto& x : {ours, ours_prefetch, ddp, anchor}) out << " " << x.seconds << " " << x.held;
        out << "\n" << std::flush;
      }
      fl::barrier();
      fl::teardown_distrib();
    }
  }
}

}  // namespace

int main() {
  const auto out = std::filesystem::temp_directory_path() / fmt::format("fastlearn-fsdp-bench-{}", getpid());
  fl::spawn(2, run_rank,
            {.extra_env = {{"FASTLEARN_BENCH_OUT", out.string()}, {"OMP_NUM_THREADS", "1"}}, .prefix_output = false});
  struct Series {
    std::vector<double> ours, prefetch, ddp, anchor;
    std::int64_t held[kSides] = {0, 0, 0, 0};
  };
  std::vector<Series> series(kCases.size());
  std::ifstream in(out);
  for (std::size_t c; in >> c;) {
    double s[kSides];
    std::int64_t h[kSides];
    for (int k = 0; k < kSides; ++k) in >> s[k] >> h[k];
    if (!in || c >= kCases.size()) break;
    if (s[3] <= 0) {
      std::cerr << "fsdp_vs_torch: the anchor's run of " << kCases[c].row
                << " did not report (python: " << FASTLEARN_PYTHON << ")\n";
      return 1;
    }
    auto& runs = series[c];
    runs.ours.push_back(s[0]);
    runs.prefetch.push_back(s[1]);
    runs.ddp.push_back(s[2]);
    runs.anchor.push_back(s[3]);
    for (int k = 0; k < kSides; ++k) runs.held[k] = h[k];
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
               ddp = bench::summarize(runs.ddp), prefetch = bench::summarize(runs.prefetch);
    rows.push_back(bench::Row(k.row, ours, anchor, "s/step", false, 5)
                       .stats("ours_prefetch", prefetch, 5)
                       .set("ratio_prefetch_vs_ours", ours.median / prefetch.median, 3)
                       .stats("ours_ddp", ddp, 5)
                       .set("ratio_vs_our_ddp", ddp.median / ours.median, 3)
                       .set("bytes_per_rank_ours", runs.held[0])
                       .set("bytes_per_rank_ours_prefetch", runs.held[1])
                       .set("bytes_per_rank_anchor", runs.held[3])
                       .set("bytes_per_rank_ours_ddp", runs.held[2])
                       .set("our_transport", k.shared_memory ? "shared memory" : "Gloo TCP")
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
