// bench_gpu: the GPU benchmarks (the GPU kit runs it on the GPU machine, scripts/device-kit; results go to
// bench/results/gpu.json, the format of latest.json plus "device"). Every comparison trains on one GPU
// with both sides in bf16 autocast and channels-last memory format, the data held on the GPU by both,
// the same model, batch size and Adam settings (betas 0.9/0.99, eps 1e-5, decoupled wd 0.01); each side
// warms up with one epoch, then the repeats interleave; an epoch includes its validation.
//   gpu_conv_net_vs_torch / _vs_fastai: conv_net 32-64-128-256 on Fashion-MNIST (60k images, batch 256),
//     Learner.fit(1) samples/s against a hand-written PyTorch loop / fastai's Learner.fit(1)
//     (bench/python/gpu_server.py). Goals: >= 1.5x the loop, >= 2x fastai.
//   gpu_resnet224_vs_torch / _vs_fastai: the xresnet of models::resnet (widths 64-128-256-512, stem 32)
//     on 2048 synthetic 3x224x224 images, batch 64. Goal: >= 1.0x. Against the loop, each repeat also times an
//     epoch of ours with FASTLEARN_POOL_BY_VIEW=0 (the shortcut pools on ATen's kernel): ours_switched_off and
//     switch_gain = ours / that, the end-to-end effect of models::AvgPool2d's view.
//   gpu_replicas_one_gpu: conv_net on Fashion-MNIST, batch 256, fp32, Learner.fit(1) samples/s of 2 ParallelTrainer
//     replicas sharing the GPU (sync_bn off: replicas on one GPU) against the same Learner alone; reported as it
//     is (two replicas on one GPU only split its work: the row checks the path's cost, not a speed-up).
//   gpu_conv_net_graph_vs_torch / _vs_eager: the same, with each training step captured in a CUDA graph
//     (LearnerOptions::cuda_graph), against the PyTorch loop and against our eager Learner (interleaved fits).
//     Goal: >= 3x the loop, the GPU busy >= 60% of an epoch (--trace).
//   gpu_time_to_92: seconds of fit_one_cycle(6, 1e-2) of conv_net until the test accuracy reaches 92%,
//     against fastai's fit_one_cycle of the same model (lower is better; ratio = fastai / ours); _graph: ours with
//     cuda_graph, against the same fastai run.
// With --trace DIR, each comparison then traces one more epoch of each side with the profiler (Kineto on ours,
// torch.profiler on theirs) into DIR/<name>_ours.json and _anchor.json; bench/python/trace_summary.py sets
// them side by side (GPU busy and idle time, host waits, the kernels that differ).
// usage: bench_gpu [--out FILE] [--data DIR] [--only NAME] [--trace DIR]
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/data/idx.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <torch/cuda.h>
#ifdef FASTLEARN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#endif
#include <torch/torch.h>

#include <cstdlib>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

namespace fl = fastlearn;

namespace {

const torch::Device kGpu(torch::kCUDA, 0);

struct Data {
  at::Tensor xt, yt, xv, yv;
};

// Fashion-MNIST as bench/python/fashion.py loads it: scaled to [0, 1], then the training pixels' mean and std.
Data fashion(const std::string& dir) {
  auto images = [&](const std::string& stem) {
    return fl::read_idx(dir + "/" + stem + "-images-idx3-ubyte.gz").unsqueeze(1).to(torch::kFloat32).div_(255);
  };
  auto labels = [&](const std::string& stem) {
    return fl::read_idx(dir + "/" + stem + "-labels-idx1-ubyte.gz").to(torch::kLong);
  };
  auto xt = images("train"), xv = images("t10k");
  const double mean = xt.mean().item<double>(), std = xt.std().item<double>();
  return {((xt - mean) / std).to(kGpu), labels("train").to(kGpu), ((xv - mean) / std).to(kGpu),
          labels("t10k").to(kGpu)};
}

Data synthetic(std::int64_t n) {
  auto gen = at::detail::createCPUGenerator(0);
  auto y = at::randint(0, 10, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({n, 3, 224, 224}, gen) + y.to(at::kFloat).view({n, 1, 1, 1}) * 0.05;
  return {x.to(kGpu), y.to(kGpu), x.slice(0, 0, n / 8).to(kGpu), y.slice(0, 0, n / 8).to(kGpu)};
}

torch::nn::Sequential model_named(const std::string& name) {
  torch::manual_seed(0);
  if (name == "conv_net_32_64_128_256") return fl::models::conv_net({.widths = {32, 64, 128, 256}});
  if (name == "resnet_64_128_256_512_s32") {
    return fl::models::resnet({.widths = {64, 128, 256, 512}, .classes = 10, .in_channels = 3, .stem_width = 32});
  }
  throw std::runtime_error("bench_gpu: unknown model " + name);
}

// wd_bn_bias: weight decay on every parameter, as torch.optim does in the hand-written loop (fastai, like the
// Learner's default, spares normalization layers and biases).
std::unique_ptr<fl::Learner> learner(const Data& d, const std::string& model, std::int64_t bs, bool wd_bn_bias = false,
                                     bool cuda_graph = false) {
  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{d.xt}, std::vector<at::Tensor>{d.yt});
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{d.xv}, std::vector<at::Tensor>{d.yv});
  fl::DataLoaders dls(fl::DataLoader(train, {.bs = bs, .shuffle = true, .drop_last = true, .seed = 0}),
                      fl::DataLoader(valid, {.bs = 2 * bs}), 10);
  auto net = model_named(model);
  net->to(kGpu);
  auto learn = std::make_unique<fl::Learner>(dls, net, fl::cross_entropy(),
                                             fl::LearnerOptions{.opt_func = fl::Adam(),
                                                                .metrics = {fl::accuracy()},
                                                                .wd_bn_bias = wd_bn_bias,
                                                                .progress = false,
                                                                .cuda_graph = cuda_graph});
  learn->add_cb(std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16}));
  learn->add_cb(std::make_shared<fl::ChannelsLast>());
  return learn;
}

struct Comparison {
  bench::Stats ours, anchor;
  double ours_accuracy = 0, anchor_accuracy = 0;
  int repeats = 0;
  std::string off_switch;                         ///< an environment switch of ours also timed set to 0, if any
  std::optional<bench::Stats> ours_switched_off;  ///< our epochs with that switch at 0, interleaved with the rest
};

std::vector<std::string> server(const std::string& side, const std::string& model, const std::string& data,
                                std::int64_t bs, double lr) {
  return {FASTLEARN_PYTHON, std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/gpu_server.py",
          "--side",         side,
          "--model",        model,
          "--data",         data,
          "--bs",           std::to_string(bs),
          "--lr",           fmt::format("{}", lr)};
}

// Runs `work` under the Kineto profiler (host ops and GPU kernels) and saves a Chrome trace to `path`.
template <class Work>
void trace_to(const std::string& path, Work&& work) {
  namespace prof = torch::autograd::profiler;
  using torch::profiler::impl::ActivityType;
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO);
  const std::set<ActivityType> activities{ActivityType::CPU, ActivityType::CUDA};
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  work();
  torch::cuda::synchronize();
  prof::disableProfiler()->save(path);
}

// off_switch: an environment switch of ours (e.g. FASTLEARN_POOL_BY_VIEW) whose effect each repeat also times,
// with one more epoch of ours while it is 0.
Comparison compare_epochs(const std::string& side, const Data& d, const std::string& model,
                          const std::string& data_spec, std::int64_t bs, int repeats, const std::string& trace,
                          const std::string& off_switch = "", bool cuda_graph = false) {
  bench::Coprocess python(server(side, model, data_spec, bs, 1e-3));
  if (python.read_line() != "ready") throw std::runtime_error("bench_gpu: gpu_server.py did not start");
  auto learn = learner(d, model, bs, /*wd_bn_bias=*/side == "torch", cuda_graph);
  const double items = static_cast<double>(learn->dls().train().size() * bs);
  Comparison c{.repeats = repeats, .off_switch = off_switch};
  auto python_epoch = [&] {
    std::istringstream reply(python.request("epoch"));
    double seconds = 0, their_items = 0;
    if (!(reply >> seconds >> their_items >> c.anchor_accuracy) || seconds <= 0) {
      throw std::runtime_error("bench_gpu: gpu_server.py answered '" + reply.str() + "'");
    }
    return their_items / seconds;
  };
  auto our_epoch = [&] {
    torch::cuda::synchronize();
    const auto start = bench::Clock::now();
    learn->fit(1, 1e-3);
    torch::cuda::synchronize();
    return items / bench::seconds_since(start);
  };
  our_epoch();  // warm-up both sides (cuDNN's algorithm search, allocator, kernels)
  python_epoch();
  std::vector<double> ours, anchor, switched_off;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(our_epoch());
    anchor.push_back(python_epoch());
    if (!off_switch.empty()) {
      ::setenv(off_switch.c_str(), "0", 1);
      switched_off.push_back(our_epoch());
      ::unsetenv(off_switch.c_str());
    }
  }
  c.ours = bench::summarize(ours);
  c.anchor = bench::summarize(anchor);
  if (!switched_off.empty()) c.ours_switched_off = bench::summarize(switched_off);
  c.ours_accuracy = learn->recorder().history().back().metrics.at(0);
  if (!trace.empty()) {
    trace_to(trace + "_ours.json", [&] { learn->fit(1, 1e-3); });
    if (const auto reply = python.request("trace " + trace + "_anchor.json"); reply != "traced")
      throw std::runtime_error("bench_gpu: gpu_server.py could not trace: " + reply);
  }
  return c;
}

bench::Row json_member(const std::string& name, const Comparison& c, const std::string& unit, bool higher_is_better,
                       const std::string& what, const std::string& device) {
  bench::Row row(name, c.ours, c.anchor, unit, higher_is_better, 2);
  row.set("repeats", c.repeats)
      .set("ours_valid_accuracy", c.ours_accuracy, 4)
      .set("anchor_valid_accuracy", c.anchor_accuracy, 4);
  if (c.ours_switched_off) {
    const auto& off = *c.ours_switched_off;
    row.set("off_switch", c.off_switch)
        .stats("ours_switched_off", off, 2)
        .set("switch_gain", higher_is_better ? c.ours.median / off.median : off.median / c.ours.median, 3);
  }
  return row.set("device", device).set("what", what);
}

// Two of our Learners on the same batches, interleaved: samples/s of fit(1) after one warm-up fit each.
Comparison interleave_fits(fl::Learner& ours_learner, fl::Learner& anchor_learner, std::int64_t bs, int repeats) {
  const double items = static_cast<double>(anchor_learner.dls().train().size() * bs);
  auto epoch = [&](fl::Learner& l) {
    torch::cuda::synchronize();
    const auto start = bench::Clock::now();
    l.fit(1, 1e-3);
    torch::cuda::synchronize();
    return items / bench::seconds_since(start);
  };
  epoch(ours_learner);
  epoch(anchor_learner);
  std::vector<double> ours, anchor;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(epoch(ours_learner));
    anchor.push_back(epoch(anchor_learner));
  }
  Comparison c{.ours = bench::summarize(ours), .anchor = bench::summarize(anchor), .repeats = repeats};
  c.ours_accuracy = ours_learner.recorder().history().back().metrics.at(0);
  c.anchor_accuracy = anchor_learner.recorder().history().back().metrics.at(0);
  return c;
}

// The captured Learner against the eager one: both ours, the same settings otherwise.
Comparison graph_vs_eager(const Data& d, int repeats, std::string& eager_because) {
  auto graphed = learner(d, "conv_net_32_64_128_256", 256, false, /*cuda_graph=*/true);
  auto eager = learner(d, "conv_net_32_64_128_256", 256);
  auto c = interleave_fits(*graphed, *eager, 256, repeats);
  eager_because = graphed->step_graph_stats().eager_because;
  return c;
}

// Seconds until the test accuracy first reaches `target` in fit_one_cycle(epochs, lr), or -1.
double our_time_to(const Data& d, double target, int epochs, double lr, double& best, bool cuda_graph = false) {
  auto learn = learner(d, "conv_net_32_64_128_256", 256, false, cuda_graph);
  struct StopAtTarget : fl::Callback {
    double target = 0, reached = -1, best = 0;
    bench::Clock::time_point start;
    void before_fit() override { start = bench::Clock::now(); }
    void after_epoch() override {
      const double acc = learn().recorder().history().back().metrics.at(0);
      best = std::max(best, acc);
      if (acc >= target) {
        reached = bench::seconds_since(start);
        throw fl::CancelFitException();
      }
    }
  };
  auto stop = std::make_shared<StopAtTarget>();
  stop->order = 100;
  stop->target = target;
  learn->fit_one_cycle(epochs, lr, {.fit = {.cbs = {stop}}});
  best = stop->best;
  return stop->reached;
}

// 2 replicas on the one GPU against one device: fp32, no autocast, the data on the GPU.
Comparison replicas_on_one_gpu(const Data& d, int repeats) {
  auto make = [&] {
    torch::manual_seed(0);
    auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{d.xt}, std::vector<at::Tensor>{d.yt});
    auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{d.xv}, std::vector<at::Tensor>{d.yv});
    return std::make_unique<fl::Learner>(
        fl::DataLoaders(fl::DataLoader(train, {.bs = 256, .shuffle = true}), fl::DataLoader(valid, {.bs = 512}), 10),
        fl::models::conv_net(), fl::cross_entropy(),
        fl::LearnerOptions{.metrics = {fl::accuracy()}, .progress = false, .device = kGpu});
  };
  auto one = make(), two = make();
  fl::to_parallel(*two, {kGpu, kGpu}, {.sync_bn = false});
  return interleave_fits(*two, *one, 256, repeats);
}

std::string device_name() {
#ifdef FASTLEARN_WITH_CUDA
  return at::cuda::getDeviceProperties(0)->name;
#else
  return "unknown (built without CUDA)";
#endif
}

}  // namespace

int main(int argc, char** argv) {
  std::string out_file, data_dir = "/usr/share/datasets/fashion-mnist", only, trace_dir;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--out")
      out_file = argv[i + 1];
    else if (flag == "--data")
      data_dir = argv[i + 1];
    else if (flag == "--only")
      only = argv[i + 1];
    else if (flag == "--trace")
      trace_dir = argv[i + 1];
    else {
      std::cerr << "bench_gpu: unknown option " << flag << " (--out FILE, --data DIR, --only NAME, --trace DIR)\n";
      return 2;
    }
  }
  if (!torch::cuda::is_available()) {
    std::cerr << "bench_gpu: no CUDA device visible; these benchmarks run on a GPU machine (scripts/device-kit)\n";
    return 1;
  }
  try {
    const std::string device = device_name();
    const int n = bench::repeats(5);
    std::vector<bench::Row> rows;
    auto want = [&](const std::string& name) { return only.empty() || name.rfind(only, 0) == 0; };
    auto trace_of = [&](const std::string& name) { return trace_dir.empty() ? trace_dir : trace_dir + "/" + name; };
    auto report = [&](const bench::Row& row) {
      rows.push_back(row);
      std::cout << "bench_gpu: " << bench::results_line({row}) << "\n" << std::flush;
    };
    if (want("gpu_conv_net")) {
      const auto d = fashion(data_dir);
      const std::string spec = "fashion:" + data_dir, model = "conv_net_32_64_128_256";
      for (const std::string side : {"torch", "fastai"}) {
        const auto c = compare_epochs(side, d, model, spec, 256, n, trace_of("gpu_conv_net_vs_" + side));
        report(json_member("gpu_conv_net_vs_" + side, c, "train samples/s", true,
                           "Learner.fit(1) vs " + side +
                               ", conv_net on Fashion-MNIST, batch 256, bf16 + channels-last, data on the GPU",
                           device));
      }
    }
    if (want("gpu_conv_net_graph")) {
      const auto d = fashion(data_dir);
      const std::string what =
          ", conv_net on Fashion-MNIST, batch 256, bf16 + channels-last, data on the GPU, each "
          "training step a CUDA graph replay (cuda_graph)";
      const auto c = compare_epochs("torch", d, "conv_net_32_64_128_256", "fashion:" + data_dir, 256, n,
                                    trace_of("gpu_conv_net_graph_vs_torch"), "", /*cuda_graph=*/true);
      report(json_member("gpu_conv_net_graph_vs_torch", c, "train samples/s", true, "Learner.fit(1) vs torch" + what,
                         device));
      std::string eager_because;
      const auto e = graph_vs_eager(d, n, eager_because);
      if (!eager_because.empty()) std::cerr << "bench_gpu: the captured Learner ran eagerly: " << eager_because << "\n";
      report(json_member("gpu_conv_net_graph_vs_eager", e, "train samples/s", true,
                         "Learner.fit(1) with cuda_graph vs the same Learner without" + what, device));
    }
    if (want("gpu_resnet224")) {
      const auto d = synthetic(2048);
      const std::string model = "resnet_64_128_256_512_s32";
      for (const std::string side : {"torch", "fastai"}) {
        // Against the loop, also the xresnet with its shortcut pools on ATen's kernel (models::AvgPool2d's switch).
        const auto c = compare_epochs(side, d, model, "synthetic:2048", 64, n, trace_of("gpu_resnet224_vs_" + side),
                                      side == "torch" ? "FASTLEARN_POOL_BY_VIEW" : "");
        report(json_member(
            "gpu_resnet224_vs_" + side, c, "train samples/s", true,
            "Learner.fit(1) vs " + side +
                ", xresnet 64-128-256-512 on 2048 synthetic 3x224x224 images, batch 64, bf16 + channels-last",
            device));
      }
    }
    if (want("gpu_replicas_one_gpu")) {
      report(json_member("gpu_replicas_one_gpu", replicas_on_one_gpu(fashion(data_dir), n), "train samples/s", true,
                         "Learner.fit(1) of conv_net on Fashion-MNIST, batch 256, fp32, data on the GPU: 2 "
                         "ParallelTrainer replicas sharing the GPU vs the Learner alone",
                         device));
    }
    if (want("gpu_time_to_92")) {
      const auto d = fashion(data_dir);
      Comparison c{.repeats = 1};
      double best = 0;
      const double ours = our_time_to(d, 0.92, 6, 1e-2, best);
      c.ours_accuracy = best;
      bench::Coprocess python(server("fastai", "conv_net_32_64_128_256", "fashion:" + data_dir, 256, 1e-2));
      if (python.read_line() != "ready") throw std::runtime_error("bench_gpu: gpu_server.py did not start");
      std::istringstream reply(python.request("tta"));
      double theirs = -1;
      reply >> theirs >> c.anchor_accuracy;
      c.ours = {ours, ours, ours};
      c.anchor = {theirs, theirs, theirs};
      report(json_member("gpu_time_to_92", c, "s", false,
                         "fit_one_cycle(6, 1e-2) of conv_net until 92% test accuracy (-1: not reached), vs fastai's",
                         device));
      double graph_best = 0;
      const double graphed = our_time_to(d, 0.92, 6, 1e-2, graph_best, /*cuda_graph=*/true);
      c.ours = {graphed, graphed, graphed};
      c.ours_accuracy = graph_best;
      report(json_member("gpu_time_to_92_graph", c, "s", false,
                         "fit_one_cycle(6, 1e-2) of conv_net with cuda_graph until 92% test accuracy (-1: not "
                         "reached), vs fastai's",
                         device));
    }
    const std::string json = bench::results_line(rows) + "\n";
    std::cout << json;
    if (!out_file.empty()) std::ofstream(out_file) << json;
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "bench_gpu: " << e.what() << "\n";
    return 1;
  }
}
