// ddp_vs_torch: median time of one data parallel training step on 2 ranks (Gloo, this machine), fastlearn
// (GradReducer + our SGD) vs PyTorch's DistributedDataParallel in Python (torchrun), both on simple_cnn
// with a fixed batch of 64 images per rank, SGD with momentum, 1 thread per rank. ratio = torch / ours, both in
// the default (contiguous) layout; ratio_channels_last: both sides with the model and batch in channels-last.
// The two sides' runs alternate (FASTLEARN_BENCH_REPEATS, default 3); ranges are over the runs' medians.
// Prints one JSON object.
#include "support/bench_support.h"
#include "support/source_dir.h"

#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/distributed/collectives.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/distributed/launcher.h>
#include <fastlearn/distributed/runtime.h>
#include <fastlearn/distributed/spawn.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/optimizer.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <optional>
#include <vector>

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kBatch = 64, kSteps = 40;

// Median seconds of kSteps steps (after 5 warm-up steps) on a fresh seeded model.
double measure(bool averaging, bool channels_last) {
  torch::manual_seed(0);
  auto model = fl::models::simple_cnn(10);
  if (channels_last) fl::to_channels_last(*model);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
  auto opt = fl::SGD({.mom = 0.9})({model->parameters()}, 0.01);
  auto x = torch::randn({kBatch, 1, 28, 28});
  if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  auto y = torch::randint(0, 10, {kBatch}, torch::kLong);
  std::optional<fl::GradReducer> reducer;
  if (averaging) reducer.emplace(params, std::vector<at::Tensor>{}, fl::world_group());
  std::vector<double> times;
  for (int step = 0; step < kSteps + 5; ++step) {
    fl::barrier();
    const auto start = Clock::now();
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt->step();
    opt->zero_grad();
    if (step >= 5) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One DDP run (torchrun, 2 ranks) in `layout`: its median step, or 0 when it did not report.
double run_ddp(const char* layout) {
  const auto command = fmt::format(
      "OMP_NUM_THREADS=1 {} -m torch.distributed.run --nproc-per-node 2 --master-port {} "
      "{}/bench/python/ddp_step.py {} {} {} 2>/dev/null",
      FASTLEARN_PYTHON, fl::pick_free_port("127.0.0.1"), FASTLEARN_SOURCE_DIR, kBatch, kSteps, layout);
  double median = 0, low = 0, high = 0;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    if (std::fscanf(pipe, "%lf %lf %lf", &median, &low, &high) != 3) median = 0;
    pclose(pipe);
  }
  return median;
}

// Our runs and DDP's alternate, so that a change in the machine's speed (wide on this VM) falls on both
// sides alike: after each of our measurements rank 0 runs DDP while rank 1 waits at a barrier. Rank 0
// writes one line per repeat: ours, ours without averaging, ours channels-last, DDP, DDP channels-last.
void run_rank(int) {
  at::set_num_threads(1);
  fl::setup_distrib({.timeout = std::chrono::seconds(180)});
  std::ofstream out;
  if (fl::rank() == 0) out.open(std::getenv("FASTLEARN_BENCH_OUT"));
  for (int r = 0, n = bench::repeats(3); r < n; ++r) {
    const auto compute_only = measure(false, false);  // the same step without averaging: what communication adds
    const auto ours = measure(true, false);
    const auto ours_channels_last = measure(true, true);
    if (fl::rank() == 0) {
      const double ddp = run_ddp("contiguous"), ddp_channels_last = run_ddp("channels_last");
      out << ours << " " << compute_only << " " << ours_channels_last << " " << ddp << " " << ddp_channels_last << "\n";
    }
    fl::barrier();
  }
  fl::teardown_distrib();
}

}  // namespace

int main() {
  const auto out = std::filesystem::temp_directory_path() / fmt::format("fastlearn-ddp-bench-{}", getpid());
  // OMP_NUM_THREADS=1 from the start, as torchrun's ranks get it (at::set_num_threads alone leaves libgomp
  // initialised for every core).
  fl::spawn(2, run_rank,
            {.extra_env = {{"FASTLEARN_BENCH_OUT", out.string()}, {"OMP_NUM_THREADS", "1"}}, .prefix_output = false});
  std::vector<double> ours, compute, ours_cl, anchor, anchor_cl;
  std::ifstream in(out);
  for (double o, c, ocl, a, acl; in >> o >> c >> ocl >> a >> acl;) {
    if (a <= 0 || acl <= 0) {
      std::cerr << "ddp_vs_torch: the DDP run did not report (python: " << FASTLEARN_PYTHON << ")\n";
      return 1;
    }
    ours.push_back(o);
    compute.push_back(c);
    ours_cl.push_back(ocl);
    anchor.push_back(a);
    anchor_cl.push_back(acl);
  }
  std::filesystem::remove(out);
  if (ours.empty()) {
    std::cerr << "ddp_vs_torch: no measurement came back from the ranks\n";
    return 1;
  }
  const auto o = bench::summarize(ours), a = bench::summarize(anchor), ocl = bench::summarize(ours_cl),
             acl = bench::summarize(anchor_cl), c = bench::summarize(compute);
  fmt::print(
      R"({{"ddp_vs_torch": {{"ours": {:.6f}, "anchor": {:.6f}, "ratio": {:.3f}, "unit": "s/step", "higher_is_better": false, )"
      R"("ours_range": [{:.6f}, {:.6f}], "anchor_range": [{:.6f}, {:.6f}], "ours_without_averaging": {:.6f}, )"
      R"("ours_channels_last": {:.6f}, "anchor_channels_last": {:.6f}, "ratio_channels_last": {:.3f}, "ranks": 2, "batch_per_rank": {}, "steps": {}, "repeats": {}, )"
      R"("what": "2-rank data parallel step (forward, backward with gradient averaging, SGD momentum) on simple_cnn: fastlearn GradReducer vs PyTorch DDP, Gloo, 1 thread per rank; medians over alternating runs"}}}})"
      "\n",
      o.median, a.median, a.median / o.median, o.min, o.max, a.min, a.max, c.median, ocl.median, acl.median,
      acl.median / ocl.median, kBatch, kSteps, ours.size());
  return 0;
}
