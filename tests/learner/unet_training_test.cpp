// A U-Net (resnet18 body, 31M parameters) under what trains other models: two CPU replicas of one process (their
// BatchNorms synchronized) take the steps of one device, channels-last memory takes the steps of contiguous memory,
// bf16 autocast trains near float32, steps handed over by a program equal a fit over the same batches, and a fit
// resumed from a checkpoint inside an epoch ends bit for bit as the uninterrupted one. 2 ranks:
// distributed_trainer_test.
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/segmentation_loss.h>
#include <fastlearn/learner/segmentation_metrics.h>
#include <fastlearn/learner/step_session.h>
#include <fastlearn/models/memory_format.h>
#include <fastlearn/models/unet.h>
#include <fastlearn/optim/sgd.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <memory>

#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

// 12 training and 4 validation items of 3 x 32 x 32 whose masks (3 classes) follow the first channel.
fl::DataLoaders masks_data() {
  auto make = [](std::int64_t n, std::uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    auto y = at::randint(0, 3, {n, 32, 32}, gen, at::TensorOptions().dtype(at::kLong));
    auto x = at::randn({n, 3, 32, 32}, gen);
    x.select(1, 0).add_(y.to(at::kFloat));
    return std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  };
  return fl::DataLoaders(fl::DataLoader(make(12, 1), {.bs = 4}), fl::DataLoader(make(4, 2), {.bs = 4}), 3);
}

fl::models::Unet make_unet() {
  torch::manual_seed(0);
  return fl::models::unet({.arch = "resnet18", .classes = 3, .image_size = {32, 32}});
}

std::unique_ptr<fl::Learner> unet_learner_of(const fs::path& path = {}) {
  return std::make_unique<fl::Learner>(masks_data(), make_unet(), fl::pixel_cross_entropy(),
                                       fl::LearnerOptions{.opt_func = fl::SGD({.mom = 0.9}),
                                                          .metrics = {fl::dice_multi()},
                                                          .path = path.empty() ? fs::path(".") : path,
                                                          .progress = false});
}

// The largest difference between the tensors of two snapshots (from index `from` to `to`), relative to the largest
// magnitude of the first.
double relative_gap(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, std::size_t from = 0,
                    std::size_t to = SIZE_MAX) {
  double gap = 0, scale = 0;
  for (std::size_t i = from; i < std::min(to, a.size()); ++i) {
    if (!a[i].is_floating_point()) continue;
    gap = std::max(gap, (a[i].to(at::kFloat) - b[i].to(at::kFloat)).abs().max().item<double>());
    scale = std::max(scale, a[i].abs().max().item<double>());
  }
  return gap / scale;
}

// Snapshots of two runs of the same U-Net agree: the parameters within 1e-5 of their scale, the BatchNorms' running
// statistics within 1e-3. Another summation order (kernels for NHWC, per-replica sums) moves a BatchNorm's running
// variance most: measured after 3 steps, 4.0e-4 of the statistics' scale in channels-last memory, 1.9e-4 on two
// replicas, while every parameter stays within 1e-5.
void expect_same_run(fl::Learner& learn, const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  const auto params = learn.model().parameters().size();
  EXPECT_LT(relative_gap(a, b, 0, params), 1e-5) << "parameters";
  EXPECT_LT(relative_gap(a, b, params), 1e-3) << "running statistics";
}

std::vector<at::Tensor> trained(fl::Learner& learn, std::vector<fl::CallbackPtr> cbs = {}) {
  learn.fit_one_cycle(1, 0.01, {.fit = {.cbs = std::move(cbs)}});
  return flt::snapshot(learn.model());
}

}  // namespace

TEST(UnetTraining, TwoCpuReplicasTakeTheStepsOfOneDevice) {
  auto one = unet_learner_of();
  const auto reference = trained(*one);
  auto two = unet_learner_of();
  fl::to_parallel(*two, {torch::kCPU, torch::kCPU});
  const auto replicas = trained(*two);
  expect_same_run(*one, reference, replicas);
  EXPECT_NEAR(two->recorder().history().back().valid_loss, one->recorder().history().back().valid_loss, 1e-4);
}

TEST(UnetTraining, ChannelsLastTakesTheStepsOfContiguousMemory) {
  auto contiguous = unet_learner_of();
  const auto reference = trained(*contiguous);
  auto nhwc = unet_learner_of();
  fl::models::to_channels_last(nhwc->model());
  const auto steps = trained(*nhwc, {std::make_shared<fl::ChannelsLast>()});
  expect_same_run(*contiguous, reference, steps);
}

TEST(UnetTraining, Bf16AutocastTrainsNearFloat32) {
  auto fp32 = unet_learner_of();
  const auto start = flt::snapshot(fp32->model());
  const auto reference = trained(*fp32);
  auto bf16 = unet_learner_of();
  const auto steps =
      trained(*bf16, {std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16})});
  const auto moved = relative_gap(start, reference);
  EXPECT_GT(moved, 1e-4);
  EXPECT_LT(relative_gap(reference, steps), moved / 4) << "bf16 moved the weights elsewhere than float32";
  EXPECT_TRUE(std::isfinite(bf16->recorder().history().back().valid_loss));
}

TEST(UnetTraining, StepsHandedOverEqualAFitOverTheSameBatches) {
  auto fitted = unet_learner_of();
  const auto reference = trained(*fitted);
  fl::Learner stepped(make_unet(), fl::pixel_cross_entropy(), {.opt_func = fl::SGD({.mom = 0.9}), .progress = false});
  stepped.begin_steps({.steps = 3}, [](fl::Learner& l, int n_epoch) { l.fit_one_cycle(n_epoch, 0.01); });
  for (auto& batch : fitted->dls().train()) stepped.train_step(batch.inputs.front(), batch.targets.front());
  stepped.end_steps();
  EXPECT_TRUE(flt::same_tensors(reference, flt::snapshot(stepped.model())));
}

TEST(UnetTraining, AFitResumedInsideAnEpochEndsBitForBitAsTheUninterruptedOne) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-unet-resume-{}", ::getpid());
  auto whole = unet_learner_of(dir);
  whole->fit_one_cycle(
      2, 0.01,
      {.fit = {.cbs = {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 0})}}});
  auto resumed = unet_learner_of(dir / "resumed");
  resumed->fit_one_cycle(2, 0.01, {.fit = {.resume_from = dir / "checkpoints" / fl::checkpoint_file_name(1, 1)}});
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(whole->model()), flt::snapshot(resumed->model())));
  EXPECT_EQ(whole->recorder().history().back().metrics, resumed->recorder().history().back().metrics);
  fs::remove_all(dir);
}
