// Data parallel training with the Learner on 2 ranks (Gloo): step by step the same parameters as one
// process fed the same samples with twice the batch (mlp, simple_cnn, the BatchNorm ResNet with
// SyncBatchNorm, and with gradient accumulation); validation metrics and get_preds over exactly the
// whole validation set on every rank; only rank 0 writes checkpoints.
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/collab_learner.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/learner/segmentation_loss.h>
#include <fastlearn/learner/segmentation_metrics.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/unet.h>
#include <fastlearn/optim/sgd.h>

#include <gtest/gtest.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <cstdint>
#include <filesystem>

#include "support/multiprocess.h"
#include "support/scripted_mlp.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;
using flt::RankContext;

namespace {

constexpr std::int64_t kItems = 64, kValid = 13;

// Images 1x28x28 with 3 classes, seeded: the same on every rank.
std::pair<at::Tensor, at::Tensor> images(std::int64_t n, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({n, 1, 28, 28}, gen) + y.to(at::kFloat).view({n, 1, 1, 1});
  return {x, y};
}

bool is_collab(const std::string& kind) { return kind.starts_with("collab"); }

fl::DataLoaders loaders(std::int64_t bs, bool single_process_twin, std::uint64_t data_seed = 1,
                        const std::string& kind = "") {
  std::shared_ptr<const fl::Dataset> train, valid;
  if (is_collab(kind)) {  // a table of ratings: 80 rows, 64 of them for training
    auto ratings =
        fl::CollabDataLoaders::from_table(flt::ratings_table(kItems + 16, 10, 12, data_seed), {}, "ratings.csv");
    train = ratings.train().dataset_ptr();
    valid = ratings.valid().dataset_ptr();
  } else {
    auto [x, y] = images(kItems, data_seed);
    auto [vx, vy] = images(kValid, 2);
    train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
    valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{vx}, std::vector<at::Tensor>{vy});
  }
  fl::DataLoader train_dl(train, {.bs = bs, .seed = 3});
  if (single_process_twin) {
    // Batch k of 2*b items = rank 0's batch k (items [k*b, (k+1)*b)) then rank 1's (offset n/2).
    std::vector<std::int64_t> order;
    const std::int64_t b = bs / 2, half = kItems / 2;
    for (std::int64_t k = 0; k * b < half; ++k) {
      for (std::int64_t i = 0; i < b; ++i) order.push_back(k * b + i);
      for (std::int64_t i = 0; i < b; ++i) order.push_back(half + k * b + i);
    }
    train_dl.set_sampler(std::make_shared<flt::FixedSampler>(order));
  }
  return fl::DataLoaders(std::move(train_dl), fl::DataLoader(valid, {.bs = 4}), is_collab(kind) ? 1 : 3);
}

torch::nn::Sequential make_model(const std::string& kind) {
  torch::manual_seed(0);
  if (kind == "mlp") return fl::models::mlp(28 * 28, {32, 16}, 3);
  if (kind == "simple_cnn") return fl::models::simple_cnn(3);
  return fl::models::resnet({.widths = {8, 16}, .classes = 3, .in_channels = 1, .stem_width = 8});
}

std::unique_ptr<fl::Learner> learner_of(const std::string& kind, fl::DataLoaders dls, fl::LearnerOptions options) {
  if (is_collab(kind)) {
    torch::manual_seed(0);
    return fl::collab_learner(std::move(dls),
                              {.n_factors = 6, .use_nn = kind == "collab_nn", .y_range = std::pair(0.0, 6.0)},
                              std::move(options));
  }
  if (kind == "torchscript") {
    torch::manual_seed(0);
    return std::make_unique<fl::Learner>(std::move(dls), flt::scripted_mlp({28 * 28, 32, 3}), fl::cross_entropy(),
                                         std::move(options));
  }
  return std::make_unique<fl::Learner>(std::move(dls), make_model(kind), fl::cross_entropy(), std::move(options));
}

// Parameters after every optimizer step.
struct StepLog : fl::Callback {
  std::vector<std::vector<at::Tensor>> params;
  void after_step() override { params.push_back(flt::snapshot(learn().model())); }
};

std::vector<std::vector<at::Tensor>> train_steps(const std::string& kind, std::int64_t bs, bool accumulate,
                                                 bool distributed, bool bf16 = false, fl::Group* group = nullptr,
                                                 std::uint64_t data_seed = 1) {
  auto learner = learner_of(kind, loaders(bs, !distributed, data_seed, kind),
                            {.opt_func = fl::SGD({.mom = 0.9}), .progress = false});
  auto& learn = *learner;
  auto log = std::make_shared<StepLog>();
  std::vector<fl::CallbackPtr> cbs{log};
  if (accumulate) cbs.push_back(std::make_shared<fl::GradientAccumulation>(bs * 2));
  if (bf16) cbs.push_back(std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16}));
  if (distributed) {
    fl::DistribCtx ctx(learn, {.group = group});
    learn.fit(2, 0.05, {.cbs = cbs});
  } else {
    learn.fit(2, 0.05, {.cbs = cbs});
  }
  return log->params;
}

void expect_same_steps(const std::vector<std::vector<at::Tensor>>& a, const std::vector<std::vector<at::Tensor>>& b,
                       double tolerance = 1e-5) {
  ASSERT_EQ(a.size(), b.size());
  ASSERT_GT(a.size(), 0u);
  for (std::size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size());
    for (std::size_t i = 0; i < a[s].size(); ++i) {
      if (a[s][i].is_floating_point()) {
        ASSERT_TRUE(a[s][i].allclose(b[s][i], tolerance, tolerance))
            << "step " << s << " tensor " << i << " differs by " << (a[s][i] - b[s][i]).abs().max().item<double>();
      }
    }
  }
}

// Summing in another order (per rank, then across ranks) changes the last bits, and BatchNorm's division by
// the std of a batch of 16 amplifies them; momentum carries them on. resnet_syncbn, measured (weights up to
// 0.37): 1.3e-6 after step 1, 1.3e-5 after step 3, 7.8e-5 after step 8 (growing about linearly, not
// exponentially), so 2e-4. The models without BatchNorm hold 1e-5.
double step_tolerance(const std::string& kind) { return kind == "resnet_syncbn" || kind == "collab_nn" ? 2e-4 : 1e-5; }

class Equivalence : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Equivalence, TwoRanksMatchOneProcessWithTwiceTheBatch) {
  const std::string kind = GetParam();
  flt::run_on_ranks(2,
                    [&kind](const RankContext&) {
                      const auto reference = train_steps(kind, 16, false, false);  // one process, batch 16
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      const auto ours = train_steps(kind, 8, false, true);  // 2 ranks, batch 8 each
                      fl::teardown_distrib();
                      expect_same_steps(reference, ours, step_tolerance(kind));
                    },
                    {.env = flt::torchrun_env(2)});
}

INSTANTIATE_TEST_SUITE_P(Models, Equivalence,
                         ::testing::Values("mlp", "simple_cnn", "resnet_syncbn", "torchscript", "collab", "collab_nn"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(DistributedTrainer, GradientAccumulationCommunicatesOnlyTheLastMicroBatch) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      const auto reference = train_steps("mlp", 16, false, false);
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      const auto ours = train_steps("mlp", 4, true, true);  // 2 micro-batches of 4 per rank per step
                      fl::teardown_distrib();
                      expect_same_steps(reference, ours);
                    },
                    {.env = flt::torchrun_env(2)});
}

// bf16 autocast (MixedPrecision on CPU) through the reducer: the same steps as one process to bf16's
// precision (8 bits of mantissa: the two runs round different batch shapes differently).
TEST(DistributedTrainer, Bf16MixedPrecisionMatchesOneProcessWithTwiceTheBatch) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      const auto reference = train_steps("simple_cnn", 16, false, false, /*bf16=*/true);
                      const auto full_precision = train_steps("simple_cnn", 16, false, false);
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      const auto ours = train_steps("simple_cnn", 8, false, true, /*bf16=*/true);
                      fl::teardown_distrib();
                      expect_same_steps(reference, ours, 2e-2);
                      // The tolerance is tight enough to see that autocast ran: float32 steps differ from bf16 ones by
                      // more.
                      double max_diff = 0;
                      for (std::size_t i = 0; i < ours.back().size(); ++i) {
                        max_diff =
                            std::max(max_diff, (ours.back()[i] - full_precision.back()[i]).abs().max().item<double>());
                      }
                      EXPECT_GT(max_diff, 1e-4) << "bf16 steps equal float32 ones: autocast did not run";
                    },
                    {.env = flt::torchrun_env(2)});
}

// DistributedTrainerOptions.group: 4 ranks run two independent 2-rank trainings at once, on the subgroups
// {0, 1} and {2, 3} with different data; each takes the steps of one process with twice its batch (that
// is, of its own 2-rank run), with SyncBatchNorm, sharding and validation gathers all within the subgroup.
TEST(DistributedTrainer, TwoTrainingsOnTwoSubgroupsAtOnceEachMatchItsOwnRun) {
  flt::run_on_ranks(4,
                    [](const RankContext& ctx) {
                      const int pair = ctx.rank / 2;
                      const auto reference = train_steps("resnet_syncbn", 16, false, false, false, nullptr, 1 + pair);
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      auto first = fl::new_group({0, 1});
                      auto second = fl::new_group({2, 3});
                      const auto ours = train_steps("resnet_syncbn", 8, false, true, false,
                                                    pair == 0 ? first.get() : second.get(), 1 + pair);
                      first.reset();
                      second.reset();
                      fl::teardown_distrib();
                      expect_same_steps(reference, ours, step_tolerance("resnet_syncbn"));
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(4)});
}

TEST(DistributedTrainer, ValidationAndGetPredsCoverExactlyTheWholeSetOnEveryRank) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      auto model = make_model("mlp");
                      fl::Learner single(loaders(8, false), model, fl::cross_entropy(),
                                         {.metrics = {fl::accuracy()}, .progress = false});
                      const auto expected = single.validate();
                      const auto expected_preds = single.get_preds();
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      {
                        auto model2 = make_model("mlp");
                        fl::Learner learn(loaders(8, false), model2, fl::cross_entropy(),
                                          {.metrics = {fl::accuracy()}, .progress = false});
                        const auto train_sampler = learn.dls().train().sampler_ptr();
                        fl::DistribCtx ctx(learn);
                        learn.fit(1, 0.0);  // lr 0: the weights stay those of `single`
                        const auto& row = learn.recorder().history().back();
                        EXPECT_NEAR(row.valid_loss, expected.loss, 1e-6)
                            << "13 items, 1 padded: the padding is not counted";
                        EXPECT_NEAR(row.metrics[0], expected.metric("accuracy"), 1e-9);
                        auto preds = learn.get_preds();
                        ASSERT_EQ(preds.preds.size(0), kValid);
                        EXPECT_TRUE(preds.preds.allclose(expected_preds.preds, 1e-6, 1e-6));
                        EXPECT_TRUE(preds.targets.equal(expected_preds.targets)) << "dataset order";
                        // A loader that shuffles and drops its last batch: all 64 items in dataset order, on
                        // every rank, and the loader keeps its own sampler.
                        fl::DataLoader shuffled(learn.dls().train().dataset_ptr(),
                                                {.bs = 6, .shuffle = true, .drop_last = true, .seed = 3});
                        const auto sampler = shuffled.sampler_ptr();
                        const auto on_train = learn.get_preds(&shuffled);
                        ASSERT_EQ(on_train.preds.size(0), kItems);
                        fl::DataLoader single_shuffled(single.dls().train().dataset_ptr(),
                                                       {.bs = 6, .shuffle = true, .drop_last = true, .seed = 3});
                        EXPECT_TRUE(on_train.preds.allclose(single.get_preds(&single_shuffled).preds, 1e-6, 1e-6));
                        const auto& items = static_cast<const fl::TensorDataset&>(shuffled.dataset());
                        EXPECT_TRUE(on_train.targets.equal(items.targets()[0])) << "dataset order";
                        EXPECT_EQ(shuffled.sampler_ptr().get(), sampler.get());
                        learn.fit(1, 0.0);  // the training loader is wrapped again after the copy was
                        EXPECT_EQ(learn.dls().train().sampler_ptr().get(), train_sampler.get())
                            << "the training loader has its own sampler back";
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

// fastai's U-Net (resnet18 body, its 25 BatchNorms synchronized) on 2 ranks takes the steps of one process fed both
// ranks' items with twice the batch, as the models above do; the augmentation is off (each rank draws its own).
TEST(DistributedTrainer, AUnetOnTwoRanksTakesTheStepsOfOneProcessWithTwiceTheBatch) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        auto steps = [](std::int64_t bs, bool distributed) {
          auto gen = at::detail::createCPUGenerator(4);
          auto y = at::randint(0, 3, {16, 32, 32}, gen, at::TensorOptions().dtype(at::kLong));
          auto x = at::randn({16, 3, 32, 32}, gen);
          x.select(1, 0).add_(y.to(at::kFloat));
          auto items = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
          fl::DataLoader train_dl(items, {.bs = bs});
          if (!distributed)  // batch k: rank 0's batch k (items [4k, 4k + 4)), then rank 1's (from item 8)
            train_dl.set_sampler(std::make_shared<flt::FixedSampler>(
                std::vector<std::int64_t>{0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15}));
          torch::manual_seed(0);
          auto model = fl::models::unet({.arch = "resnet18", .classes = 3, .image_size = {32, 32}});
          fl::Learner learn(fl::DataLoaders(std::move(train_dl), fl::DataLoader(items, {.bs = 8}), 3), model,
                            fl::pixel_cross_entropy(), {.opt_func = fl::SGD({.mom = 0.9}), .progress = false});
          auto log = std::make_shared<StepLog>();
          if (distributed) {
            fl::DistribCtx ctx(learn);
            learn.fit(1, 0.01, {.cbs = {log}});
          } else {
            learn.fit(1, 0.01, {.cbs = {log}});
          }
          return log->params;
        };
        const auto reference = steps(8, false);
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        const auto ours = steps(4, true);
        fl::teardown_distrib();
        expect_same_steps(reference, ours, 1e-5);
      },
      {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
}

// Segmentation metrics keep per-class pixel sums: each rank adds over its own items (rank 1's last one is padding) and
// the sums are added over the ranks, so the whole set's values come without gathering a single logit.
TEST(DistributedTrainer, SegmentationMetricsAreTheWholeSetsFromSumsWithoutGatheringPredictions) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        auto masks = [](std::int64_t n, std::uint64_t seed) {
          auto gen = at::detail::createCPUGenerator(seed);
          auto y = at::randint(0, 3, {n, 6, 5}, gen, at::TensorOptions().dtype(at::kLong));
          auto x = at::randn({n, 1, 6, 5}, gen) + y.unsqueeze(1).to(at::kFloat);
          return std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
        };
        auto make_learner = [&] {
          torch::manual_seed(0);
          auto model = torch::nn::Sequential(torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 3, 3).padding(1)));
          fl::DataLoaders dls(fl::DataLoader(masks(kItems, 1), {.bs = 8}), fl::DataLoader(masks(kValid, 2), {.bs = 4}),
                              3);
          return std::make_unique<fl::Learner>(
              std::move(dls), model, fl::pixel_cross_entropy(),
              fl::LearnerOptions{.metrics = {fl::dice_multi(), fl::jaccard_coeff_multi(), fl::foreground_acc()},
                                 .progress = false});
        };
        const auto single = make_learner();
        const auto expected = single->validate();
        fl::DataLoader one_item(masks(1, 3), {.bs = 4});
        const auto expected_one = single->validate(&one_item);
        fl::setup_distrib({.timeout = std::chrono::seconds(30)});
        {
          const auto learn = make_learner();
          fl::DistribCtx ctx(*learn);
          int gathers = 0;
          auto& gather = learn->coordination().gather_items;
          gather = [&gathers, inner = gather](const at::Tensor& t) { return ++gathers, inner(t); };
          learn->fit(1, 0.0);  // lr 0: the weights stay those of `single`
          const auto& row = learn->recorder().history().back();
          EXPECT_NEAR(row.valid_loss, expected.loss, 1e-6) << "13 items, 1 padded: the padding is not counted";
          for (const auto* name : {"dice_multi", "jaccard_coeff_multi", "foreground_acc"}) {
            EXPECT_NEAR(learn->recorder().value(row, name), expected.metric(name), 1e-12) << name;
          }
          EXPECT_EQ(gathers, 0) << "no predictions gathered";
          // One item: rank 1's share is the padding alone, and adds nothing.
          fl::DataLoader one(masks(1, 3), {.bs = 4});
          const auto got = learn->validate(&one);
          EXPECT_NEAR(got.loss, expected_one.loss, 1e-6);
          EXPECT_NEAR(got.metric("dice_multi"), expected_one.metric("dice_multi"), 1e-12);
          EXPECT_EQ(learn->get_preds().preds.size(0), kValid) << "get_preds still gathers the whole set";
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

TEST(DistributedTrainer, GetPredsOnAShufflingTrainingLoaderAfterACancelledFitReadsTheWholeSet) {
  // A fit cancelled inside training (as lr_find's and a graceful stop's are) leaves the training loader wrapped for
  // this rank's share when get_preds reads it: the in-order copy takes the whole set, not that share, and a second call
  // frees the first copy while the trainer holds it wrapped.
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(30)});
        {
          auto [x, y] = images(kItems, 1);
          auto [vx, vy] = images(kValid, 2);
          auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
          auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{vx}, std::vector<at::Tensor>{vy});
          fl::DataLoaders dls(fl::DataLoader(train, {.bs = 8, .shuffle = true, .seed = 3}),
                              fl::DataLoader(valid, {.bs = 8}), 3);
          auto model = make_model("mlp");
          fl::Learner learn(std::move(dls), model, fl::cross_entropy(), {.progress = false});
          fl::DistribCtx ctx(learn);
          struct CancelInTraining : fl::Callback {
            void after_batch() override {
              if (learn().training && learn().iter == 1) throw fl::CancelFitException();
            }
          };
          learn.fit(1, 0.0, {.cbs = {std::make_shared<CancelInTraining>()}});
          for (int call = 0; call < 2; ++call) {
            const auto preds = learn.get_preds(&learn.dls().train());
            ASSERT_EQ(preds.preds.size(0), kItems) << "call " << call;
            EXPECT_TRUE(preds.targets.equal(y)) << "dataset order, call " << call;
          }
          learn.fit(1, 0.0);
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

TEST(DistributedTrainer, LrFindRecordsOneCurveOnEveryRank) {
  flt::run_on_ranks(
      2,
      [](const RankContext& rank) {
        fl::setup_distrib({.timeout = std::chrono::seconds(30)});
        {
          auto model = make_model("mlp");
          fl::Learner learn(loaders(8, false), model, fl::cross_entropy(), {.progress = false});
          fl::DistribCtx ctx(learn);
          // Up to lr 100 the loss diverges: the sweep stops early, at the same batch on both ranks.
          const auto found = learn.lr_find({.end_lr = 100, .num_it = 60});
          const auto losses = torch::tensor(found.losses, torch::kFloat64);
          auto n = torch::tensor({losses.numel()});
          std::vector<at::Tensor> counts{torch::empty_like(n), torch::empty_like(n)};
          fl::all_gather(counts, n);
          ASSERT_EQ(counts[0].item<std::int64_t>(), counts[1].item<std::int64_t>());
          EXPECT_LT(learn.recorder().losses().size(), 60u) << "the sweep should have diverged";
          std::vector<at::Tensor> curves{torch::empty_like(losses), torch::empty_like(losses)};
          fl::all_gather(curves, losses);
          EXPECT_TRUE(curves[0].equal(curves[1])) << "rank " << rank.rank << ": each rank its own curve";
          const double valley = found.valley;
          std::vector<at::Tensor> valleys{torch::empty({1}, torch::kFloat64), torch::empty({1}, torch::kFloat64)};
          fl::all_gather(valleys, torch::tensor({valley}, torch::kFloat64));
          EXPECT_EQ(valleys[0].item<double>(), valleys[1].item<double>());
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

// save() and export_to() are not collective: rank 0 calls them alone while rank 1 is busy elsewhere (here: waiting
// for rank 0's word through the store, which never comes if rank 0 waits for rank 1), as `if (rank == 0)` code does.
// load() is collective: every rank reads rank 0's file, and the weights it holds are every rank's.
TEST(DistributedTrainer, RankZeroAloneSavesAndExportsWhileTheOtherRankIsBusyAndEveryRankLoads) {
  const auto dir = fs::temp_directory_path() / ("fastlearn-dt-" + std::to_string(flt::test_process_id()));
  flt::run_on_ranks(
      2,
      [&dir](const RankContext& rank) {
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        {
          auto model = make_model("mlp");
          fl::Learner learn(loaders(8, false), model, fl::cross_entropy(), {.path = dir, .progress = false});
          fl::DistribCtx ctx(learn);
          learn.fit(1, 0.05);
          const auto trained = flt::snapshot(learn.model());
          if (rank.rank == 0) {
            learn.save("alone");
            learn.export_to("alone_export.safetensors");
            rank.store->set("written", std::vector<std::uint8_t>{1});
          } else {
            rank.store->wait({"written"}, std::chrono::seconds(20));  // throws if rank 0 waits for this rank
          }
          EXPECT_TRUE(fs::exists(dir / "models" / "alone.safetensors"));
          EXPECT_TRUE(fs::exists(dir / "alone_export.safetensors"));
          torch::NoGradGuard no_grad;
          for (auto& p : learn.model().parameters()) p.zero_();
          learn.load("alone");
          const auto loaded = flt::snapshot(learn.model());
          ASSERT_EQ(loaded.size(), trained.size());
          for (std::size_t i = 0; i < loaded.size(); ++i) EXPECT_TRUE(torch::equal(loaded[i], trained[i])) << i;
        }
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(2)});
  if (!flt::in_rank_process()) fs::remove_all(dir);
}

// With sync_bn = false each rank's BatchNorm layers update their running statistics from the rank's own half of the
// batch; before every training forward rank 0's buffers are broadcast (as DDP's broadcast_buffers), so every rank
// starts each batch with rank 0's. Turned off, the ranks' statistics drift apart: the check can fail.
TEST(DistributedTrainer, WithoutSyncBnRankZerosBuffersAreBroadcastBeforeEveryBatch) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(30)});
        // After the trainer's broadcast: whether every rank's buffers equal rank 0's, at each training batch.
        struct BuffersAlike : fl::Callback {
          BuffersAlike() { order = fl::cb_order::distributed_trainer + 1; }
          void before_batch() override {
            if (!learn().training) return;
            std::vector<at::Tensor> parts;
            for (const auto& b : learn().model().buffers())
              if (b.is_floating_point()) parts.push_back(b.detach().reshape(-1));
            const auto mine = torch::cat(parts);
            std::vector<at::Tensor> all{torch::empty_like(mine), torch::empty_like(mine)};
            fl::all_gather(all, mine);
            alike.push_back(torch::equal(all[0], all[1]));
          }
          std::vector<bool> alike;
        };
        for (const bool broadcast : {true, false}) {
          auto model = make_model("resnet_syncbn");
          fl::Learner learn(loaders(8, false), model, fl::cross_entropy(),
                            {.opt_func = fl::SGD({.mom = 0.9}), .progress = false});
          auto probe = std::make_shared<BuffersAlike>();
          {
            fl::DistribCtx ctx(learn, {.sync_bn = false, .broadcast_buffers = broadcast});
            learn.fit(1, 0.05, {.cbs = {probe}});
          }
          ASSERT_EQ(probe->alike.size(), 4u) << "32 items a rank, 8 a batch";
          if (broadcast) {
            for (std::size_t k = 0; k < probe->alike.size(); ++k)
              EXPECT_TRUE(probe->alike[k]) << "batch " << k << ": a rank started it with buffers of its own";
          } else {
            EXPECT_FALSE(probe->alike.back()) << "without the broadcast the running statistics drift apart";
          }
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

// A DistribCtx given a Learner attaches the trainer for its scope only: at the end the learner is a single process's
// again (no trainer, its own loaders, rank 0 of 1), also when the scope ends by an exception.
TEST(DistributedTrainer, DistribCtxDetachesTheTrainerAtTheEndOfItsScope) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        auto learn = std::make_unique<fl::Learner>(loaders(8, false), make_model("mlp"), fl::cross_entropy(),
                                                   fl::LearnerOptions{.opt_func = fl::SGD(), .progress = false});
        const auto items = learn->dls().train().n();
        {
          fl::DistribCtx ctx(*learn);
          ASSERT_NE(learn->cb<fl::DistributedTrainer>(), nullptr);
          learn->fit(1, 0.05);
          EXPECT_EQ(learn->coordination().rank, fl::rank());
        }
        EXPECT_EQ(learn->cb<fl::DistributedTrainer>(), nullptr);
        EXPECT_EQ(learn->coordination().rank, 0) << "a single process's coordination again";
        EXPECT_FALSE(learn->coordination().barrier);
        EXPECT_EQ(learn->dls().train().n(), items) << "the loader holds every item again, not this rank's half";
        EXPECT_FALSE(fl::is_initialized()) << "the scope tore down the group it set up";
        learn->fit(1, 0.05);  // alone, without a process group
        try {
          fl::DistribCtx ctx(*learn);
          throw std::runtime_error("the training failed");
        } catch (const std::runtime_error&) {}
        EXPECT_EQ(learn->cb<fl::DistributedTrainer>(), nullptr);
        EXPECT_FALSE(fl::is_initialized());
      },
      {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(2)});
}

// The step API under DistribCtx, as a program started by a launcher runs it: each rank hands over its own samples
// (no DistributedDL shares them out), the reducer averages the gradients, and 2 ranks of 8 samples each take the
// steps of one process handed both ranks' 16 samples as one batch.
TEST(DistributedTrainer, StepsOnTwoRanksWithTheirOwnSamplesAreOneProcessWithBoth) {
  flt::run_on_ranks(2,
                    [](const RankContext& ctx) {
                      const auto samples = [](int step) {  // the same on every rank: 16 rows per step
                        auto gen = at::detail::createCPUGenerator(100 + step);
                        const auto x = at::randn({16, 4}, gen);
                        return std::pair{x, x.sum(1, true) + 0.1 * at::randn({16, 1}, gen)};
                      };
                      const auto learner = [] {
                        torch::manual_seed(0);
                        return std::make_unique<fl::Learner>(
                            torch::nn::Linear(4, 1), fl::mse_loss(),
                            fl::LearnerOptions{.opt_func = fl::SGD(), .progress = false, .device = torch::kCPU});
                      };
                      const auto constant = [](fl::Learner& l, int n) { l.fit(n, 0.05); };
                      std::vector<std::vector<at::Tensor>> alone, together;
                      auto one = learner();
                      one->begin_steps({.steps = 6, .steps_per_epoch = 3}, constant);
                      for (int s = 0; s < 6; ++s) {
                        const auto [x, y] = samples(s);
                        one->train_step(x, y);
                        alone.push_back(flt::snapshot(one->model()));
                      }
                      one->end_steps();

                      auto mine = learner();
                      {
                        fl::DistribCtx distributed(*mine, {}, {.timeout = std::chrono::seconds(30)});
                        mine->begin_steps({.steps = 6, .steps_per_epoch = 3}, constant);
                        for (int s = 0; s < 6; ++s) {
                          const auto [x, y] = samples(s);
                          mine->train_step(x.narrow(0, 8 * ctx.rank, 8), y.narrow(0, 8 * ctx.rank, 8));
                          together.push_back(flt::snapshot(mine->model()));
                        }
                        mine->end_steps();
                      }
                      fl::teardown_distrib();
                      expect_same_steps(alone, together);
                    },
                    {.env = flt::torchrun_env(2)});
}
