// ddp_vs_torch: median time of one data parallel training step on 2 ranks (Gloo, this machine), fastlearn
// (GradReducer + our SGD) vs PyTorch's DistributedDataParallel in Python (torchrun), with a fixed batch of 64
// images per rank, SGD with momentum, 1 thread per rank, on simple_cnn (key ddp_vs_torch) and on conv_net
// (ddp_vs_torch_conv_net: BatchNorm, whose buffers both sides broadcast from rank 0 before each forward, as
// DDP does by default and DistributedTrainer does). ratio = torch / ours, both in the default (contiguous)
// layout; ratio_channels_last: both sides with the model and batch in channels-last. The two sides' runs
// alternate (FASTLEARN_BENCH_REPEATS, default 5); ranges are over the runs' medians. Ours runs with the CPU memory
// cache and MKL's choice by instruction sets, as under a Learner. Prints one JSON object.
#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/comm/spawn.h>
#include <fastlearn/core/cpu_memory_cache.h>
#include <fastlearn/core/detail/mkl_dispatch.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/launch/launcher.h>
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
const std::vector<std::string> kModels{"simple_cnn", "conv_net_32_64_128_256"};  // bench/python/fashion.py's names

torch::nn::Sequential make_model(const std::string& name) {
  return name == "simple_cnn" ? fl::models::simple_cnn(10) : fl::models::conv_net({.widths = {32, 64, 128, 256}});
}

// Median seconds of kSteps steps (after 5 warm-up steps) on a fresh seeded model.
double measure(const std::string& model_name, bool averaging, bool channels_last) {
  torch::manual_seed(0);
  auto model = make_model(model_name);
  if (channels_last) fl::models::to_channels_last(*model);
  std::vector<std::pair<std::string, at::Tensor>> params;
  for (const auto& p : model->named_parameters()) params.emplace_back(p.key(), p.value());
  std::vector<at::Tensor> buffers;
  for (const auto& b : model->buffers()) buffers.push_back(b);
  auto opt = fl::SGD({.mom = 0.9})({model->parameters()}, 0.01);
  auto x = torch::randn({kBatch, 1, 28, 28});
  if (channels_last) x = x.contiguous(at::MemoryFormat::ChannelsLast);
  auto y = torch::randint(0, 10, {kBatch}, torch::kLong);
  std::optional<fl::GradReducer> reducer;
  if (averaging) reducer.emplace(params, buffers, fl::world_group());
  std::vector<double> times;
  for (int step = 0; step < kSteps + 5; ++step) {
    fl::barrier();
    const auto start = Clock::now();
    if (reducer && !buffers.empty()) reducer->broadcast_buffers();  // what DistributedTrainer::before_batch does
    torch::nn::functional::cross_entropy(model->forward(x), y).backward();
    opt->step();
    opt->zero_grad();
    if (step >= 5) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

// One DDP run (torchrun, 2 ranks) of `model_name` in `layout`: its median step, or 0 when it did not report.
double run_ddp(const std::string& model_name, const char* layout) {
  const auto command = fmt::format(
      "OMP_NUM_THREADS=1 {} -m torch.distributed.run --nproc-per-node 2 --master-port {} "
      "{}/bench/python/ddp_step.py {} {} {} {} 2>/dev/null",
      FASTLEARN_PYTHON, fl::pick_free_port("127.0.0.1"), FASTLEARN_SOURCE_DIR, kBatch, kSteps, layout, model_name);
  double median = 0, low = 0, high = 0;
  if (FILE* pipe = popen(command.c_str(), "r")) {
    if (std::fscanf(pipe, "%lf %lf %lf", &median, &low, &high) != 3) median = 0;
    pclose(pipe);
  }
  return median;
}

// Our runs and DDP's alternate, so that a change in the machine's speed (wide on this VM) falls on both
// sides alike: after each of our measurements rank 0 runs DDP while rank 1 waits at a barrier. Rank 0
// writes one line per model and repeat: the model's index, ours, ours without averaging, ours channels-last,
// DDP, DDP channels-last.
void run_rank(int) {
  at::set_num_threads(1);
  // What every fastlearn training process has (the Learner sets both up): without the cache, glibc's mmap
  // threshold, raised once conv_net's larger blocks are freed, would make simple_cnn's later repeats faster
  // than its first (8.9 against 13.1 ms per step in one run).
  fl::enable_cpu_memory_cache();
  fl::mkl_chooses_by_features();
  fl::setup_distrib({.timeout = std::chrono::seconds(180)});
  std::ofstream out;
  if (fl::rank() == 0) out.open(std::getenv("FASTLEARN_BENCH_OUT"));
  for (int r = 0, n = bench::repeats(5); r < n; ++r) {
    for (std::size_t m = 0; m < kModels.size(); ++m) {
      const auto& name = kModels[m];
      const auto compute_only =
          measure(name, false, false);  // the same step without averaging: what communication adds
      const auto ours = measure(name, true, false);
      const auto ours_channels_last = measure(name, true, true);
      if (fl::rank() == 0) {
        const double ddp = run_ddp(name, "contiguous"), ddp_channels_last = run_ddp(name, "channels_last");
        out << m << " " << ours << " " << compute_only << " " << ours_channels_last << " " << ddp << " "
            << ddp_channels_last << "\n";
      }
      fl::barrier();
    }
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
  struct Series {
    std::vector<double> ours, compute, ours_cl, anchor, anchor_cl;
  };
  std::vector<Series> series(kModels.size());
  std::ifstream in(out);
  for (std::size_t m; in >> m;) {
    double o, c, ocl, a, acl;
    if (!(in >> o >> c >> ocl >> a >> acl) || m >= kModels.size()) break;
    if (a <= 0 || acl <= 0) {
      std::cerr << "ddp_vs_torch: the DDP run of " << kModels[m] << " did not report (python: " << FASTLEARN_PYTHON
                << ")\n";
      return 1;
    }
    auto& runs = series[m];
    runs.ours.push_back(o);
    runs.compute.push_back(c);
    runs.ours_cl.push_back(ocl);
    runs.anchor.push_back(a);
    runs.anchor_cl.push_back(acl);
  }
  std::filesystem::remove(out);
  std::vector<bench::Row> rows;
  const auto range = [](const bench::Stats& s) {
    return nlohmann::ordered_json::array({bench::rounded(s.min, 6), bench::rounded(s.max, 6)});
  };
  for (std::size_t m = 0; m < kModels.size(); ++m) {
    const auto& runs = series[m];
    if (runs.ours.empty()) {
      std::cerr << "ddp_vs_torch: no measurement of " << kModels[m] << " came back from the ranks\n";
      return 1;
    }
    const auto o = bench::summarize(runs.ours), a = bench::summarize(runs.anchor), ocl = bench::summarize(runs.ours_cl),
               acl = bench::summarize(runs.anchor_cl), c = bench::summarize(runs.compute);
    rows.push_back(
        bench::Row(m == 0 ? "ddp_vs_torch" : "ddp_vs_torch_conv_net", o, a, "s/step", false, 6)
            .set("ours_without_averaging", c.median, 6)
            .set("ours_channels_last", ocl.median, 6)
            .set("anchor_channels_last", acl.median, 6)
            .set("ratio_channels_last", acl.median / ocl.median, 3)
            .set("ours_channels_last_range", range(ocl))
            .set("anchor_channels_last_range", range(acl))
            .set("model", kModels[m])
            .set("ranks", 2)
            .set("batch_per_rank", kBatch)
            .set("steps", kSteps)
            .set("repeats", runs.ours.size())
            .set("what", "2-rank data parallel step (forward, backward with gradient averaging, SGD momentum) on " +
                             kModels[m] +
                             ": fastlearn GradReducer vs PyTorch DDP (buffers broadcast before each forward on both "
                             "sides), Gloo, 1 thread per rank; medians over alternating runs"));
  }
  fmt::print("{}\n", bench::results_line(rows));
  return 0;
}
