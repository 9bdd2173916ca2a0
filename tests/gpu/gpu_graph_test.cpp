// Training steps captured in CUDA graphs (LearnerOptions::cuda_graph), part of the gpu_test binary (label `gpu`; each
// test skips where no GPU is visible): the weights of eager training with SGD and Adam under one-cycle schedules,
// fixed shapes and a ragged last batch; one capture per shape; resume from a checkpoint taken between replays; memory
// flat over epochs; bf16, channels-last and clipping captured; a callback that needs the host makes the fit eager.
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#ifdef FASTLEARN_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <torch/torch.h>

#include <unistd.h>
#include <filesystem>

#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

#define SKIP_WITHOUT_CUDA()                                                   \
  if (!torch::cuda::is_available())                                           \
  GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine " \
                  "(scripts/device-kit)"

const torch::Device kGpu(torch::kCUDA, 0);

// 3 classes of 1x28x28 images held on the GPU; `n` items in batches of `bs` (a ragged last one when bs does not
// divide n), in a seeded order.
fl::DataLoaders gpu_images(std::int64_t n, std::int64_t bs) {
  auto gen = at::detail::createCPUGenerator(7);
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({n, 1, 28, 28}, gen) + y.to(at::kFloat).view({n, 1, 1, 1});
  auto ds =
      std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.to(kGpu)}, std::vector<at::Tensor>{y.to(kGpu)});
  return fl::DataLoaders(fl::DataLoader(ds, {.bs = bs, .shuffle = true, .seed = 3}), fl::DataLoader(ds, {.bs = 256}),
                         3);
}

// Puts the optimizer on the device-hyper path in an eager fit: the kernels a captured step replays, launched one by
// one.
struct DeviceHypersEagerly : fl::Callback {
  void before_fit() override { learn().opt().set_device_hypers(true); }
};

std::unique_ptr<fl::Learner> conv_learner(fl::DataLoaders dls, fl::OptFunc opt, bool cuda_graph,
                                          std::vector<fl::CallbackPtr> cbs = {}, const fs::path& path = ".") {
  torch::manual_seed(0);
  return std::make_unique<fl::Learner>(std::move(dls), fl::models::conv_net({.widths = {8, 16}, .classes = 3}),
                                       fl::cross_entropy(),
                                       fl::LearnerOptions{.opt_func = std::move(opt),
                                                          .metrics = {fl::accuracy()},
                                                          .cbs = std::move(cbs),
                                                          .path = path,
                                                          .progress = false,
                                                          .device = kGpu,
                                                          .cuda_graph = cuda_graph});
}

// The largest ||a - b|| / ||b|| over the tensors (each at least 1e-12 in norm).
double worst_relative(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double worst = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto diff = (a[i].to(at::kDouble) - b[i].to(at::kDouble)).norm().item<double>();
    worst = std::max(worst, diff / std::max(b[i].to(at::kDouble).norm().item<double>(), 1e-12));
  }
  return worst;
}

// cuDNN's deterministic kernels for a scope, so that two runs of the same kernels give the same bits.
struct DeterministicCudnn {
  bool was = at::globalContext().deterministicCuDNN();
  DeterministicCudnn() { at::globalContext().setDeterministicCuDNN(true); }
  ~DeterministicCudnn() { at::globalContext().setDeterministicCuDNN(was); }
};

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / fmt::format("fastlearn-graph-{}-{}", tag, ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

}  // namespace

// SGD with momentum and Adam, fit_one_cycle moving lr and momentum every step: 512 items in batches of 64 (one shape)
// and 500 (a ragged last batch of 52, a second shape). The captured fit ends with the weights of the eager fit that
// launches the same kernels (device hypers) to 1e-5, and with those of the plain eager fit to fp32 rounding; each shape
// is captured once, after three warm-up steps (one for the second shape).
TEST(GpuStepGraphs, CapturedStepsTrainTheWeightsOfEagerStepsForSgdAndAdam) {
  SKIP_WITHOUT_CUDA();
  const DeterministicCudnn deterministic;
  const std::vector<std::pair<std::string, fl::OptFunc>> optimizers{{"SGD", fl::SGD({.mom = 0.9, .wd = 1e-3})},
                                                                    {"Adam", fl::Adam()}};
  for (const auto& [name, opt] : optimizers) {
    for (const std::int64_t n : {512, 500}) {
      const auto what = fmt::format("{}, {} items", name, n);
      auto graphed = conv_learner(gpu_images(n, 64), opt, true);
      graphed->fit_one_cycle(3, 1e-2);
      const auto stats = graphed->step_graph_stats();
      ASSERT_TRUE(stats.eager_because.empty()) << what << ": " << stats.eager_because;
      const std::int64_t batches = (n + 63) / 64, steps = 3 * batches;
      EXPECT_EQ(stats.captures, n == 512 ? 1 : 2) << what;
      EXPECT_EQ(stats.eager_steps, n == 512 ? 3 : 4) << what;
      EXPECT_EQ(stats.replays + stats.eager_steps, steps) << what;
      EXPECT_EQ(graphed->opt().step_count(), steps) << what << ": the host counts every replayed step";

      auto same_kernels = conv_learner(gpu_images(n, 64), opt, false, {std::make_shared<DeviceHypersEagerly>()});
      same_kernels->fit_one_cycle(3, 1e-2);
      auto plain = conv_learner(gpu_images(n, 64), opt, false);
      plain->fit_one_cycle(3, 1e-2);
      const auto weights = flt::snapshot(graphed->model());
      const double vs_same = worst_relative(weights, flt::snapshot(same_kernels->model()));
      const double vs_plain = worst_relative(weights, flt::snapshot(plain->model()));
      std::cout << "[ gpu      ] " << what << ": worst relative difference vs eager with the same kernels " << vs_same
                << ", vs plain eager " << vs_plain << "\n";
      EXPECT_LT(vs_same, 1e-5) << what;
      EXPECT_LT(vs_plain, 1e-3) << what;
      EXPECT_EQ(graphed->opt().state_json(), same_kernels->opt().state_json()) << what;
      const auto& h = graphed->recorder().history().back();
      EXPECT_NEAR(h.valid_loss, plain->recorder().history().back().valid_loss, 1e-3) << what;
    }
  }
}

// A checkpoint taken between replays holds the replayed steps (weights, Adam state, step counts); a fit resumed from it
// recaptures (its state is new memory) and ends as the uninterrupted captured fit. The memory reserved is flat over
// epochs: one private pool, reused.
TEST(GpuStepGraphs, ResumeFromACheckpointBetweenReplaysAndMemoryFlatOverEpochs) {
  SKIP_WITHOUT_CUDA();
#ifdef FASTLEARN_WITH_CUDA
  TempDir dir("resume");
  namespace alloc = c10::cuda::CUDACachingAllocator;
  struct PeakPerEpoch : fl::Callback {
    std::vector<std::int64_t> peaks;
    void before_epoch() override { alloc::resetPeakStats(0); }
    void after_epoch() override {
      // Reserved, not allocated: a private pool that grew would hold free blocks that allocated_bytes leaves out.
      peaks.push_back(alloc::getDeviceStats(0)
                          .reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                          .peak);
    }
  };
  auto peaks = std::make_shared<PeakPerEpoch>();
  auto keep_all = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 3, .keep = 0});
  auto reference = conv_learner(gpu_images(500, 64), fl::Adam(), true, {keep_all, peaks}, dir.path);
  reference->fit_one_cycle(4, 1e-2);
  ASSERT_EQ(peaks->peaks.size(), 4u);
  std::cout << "[ gpu      ] captured: peak reserved per epoch " << fmt::format("{}", fmt::join(peaks->peaks, ", "))
            << " bytes\n";
  EXPECT_LE(static_cast<double>(peaks->peaks[3]), 1.05 * static_cast<double>(peaks->peaks[1]));
  const auto reference_weights = flt::snapshot(reference->model());
  const auto file = dir.path / "checkpoints" / fl::checkpoint_file_name(1, 6);  // epoch 2, between replays
  ASSERT_TRUE(fs::exists(file)) << file;
  auto resumed = conv_learner(gpu_images(500, 64), fl::Adam(), true, {}, dir.path / "resumed");
  resumed->fit_one_cycle(4, 1e-2, {.fit = {.resume_from = file}});
  EXPECT_GE(resumed->step_graph_stats().captures, 1);
  EXPECT_EQ(resumed->opt().step_count(), reference->opt().step_count());
  EXPECT_LT(worst_relative(flt::snapshot(resumed->model()), reference_weights), 1e-5);
#endif
}

// The benchmark's setting captured: bf16 autocast, channels-last, gradient clipping; it trains. A callback that needs
// the host inside the step (GradientAccumulation) makes the fit eager with the reason, and it trains as without graphs;
// so does a trainable parameter that never gets a gradient.
TEST(GpuStepGraphs, Bf16ChannelsLastAndClippingAreCapturedAndAccumulationFallsBack) {
  SKIP_WITHOUT_CUDA();
  auto captured = conv_learner(gpu_images(512, 64), fl::Adam(), true,
                               {std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16}),
                                std::make_shared<fl::ChannelsLast>(), std::make_shared<fl::GradientClip>()});
  captured->fit_one_cycle(3, 1e-2);
  EXPECT_TRUE(captured->step_graph_stats().eager_because.empty()) << captured->step_graph_stats().eager_because;
  EXPECT_EQ(captured->step_graph_stats().captures, 1);
  EXPECT_GT(captured->recorder().history().back().metrics.at(0), 0.8);

  auto accumulating =
      conv_learner(gpu_images(512, 64), fl::Adam(), true, {std::make_shared<fl::GradientAccumulation>(128)});
  accumulating->fit_one_cycle(2, 1e-2);
  EXPECT_NE(accumulating->step_graph_stats().eager_because.find("gradient_accumulation"), std::string::npos);
  EXPECT_EQ(accumulating->step_graph_stats().captures, 0);
  auto eager = conv_learner(gpu_images(512, 64), fl::Adam(), false, {std::make_shared<fl::GradientAccumulation>(128)});
  eager->fit_one_cycle(2, 1e-2);
  EXPECT_LT(worst_relative(flt::snapshot(accumulating->model()), flt::snapshot(eager->model())), 1e-5);

  // A trainable parameter that never gets a gradient: its first update could come inside a graph, so the fit is eager.
  auto unused = conv_learner(gpu_images(512, 64), fl::Adam(), true);
  unused->model().register_parameter("unused", torch::zeros({3}, kGpu));
  unused->fit_one_cycle(1, 1e-2);
  EXPECT_NE(unused->step_graph_stats().eager_because.find("requires a gradient but got none in 3 steps"),
            std::string::npos)
      << unused->step_graph_stats().eager_because;
  EXPECT_EQ(unused->step_graph_stats().eager_steps, 8);
}
