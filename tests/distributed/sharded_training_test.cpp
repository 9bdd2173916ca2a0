// Sharded data parallel training (DistributedTrainerOptions::shard, ZeRO stages 1 and 2) on 2 and 3 ranks (Gloo):
// step by step the parameters of one process fed every rank's samples as one batch, for each stage, with Adam under
// one-cycle and SGD with nesterov momentum, small buckets so that parameters straddle ranks and some ranks' share of
// a parameter is empty; gradient clipping by the global norm; an overflow on one rank skipping the step on every
// rank; a parameter left without gradient on one rank failing every rank at once; checkpoints holding the whole
// optimizer state, written collectively, and resumed on another world size.
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/cpu_memory_counter.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/memory_report.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/tabular_model.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <tuple>

#include "distributed/sharded_runs.h"
#include "support/multiprocess.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;
using flt::RankContext;
using namespace fastlearn::testing::sharded;
namespace sharded = fastlearn::testing::sharded;

namespace {

class ShardedEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

}  // namespace

// Each stage equals one process with the whole batch; so does the unsharded run, as a check of the setting.
TEST_P(ShardedEquivalence, EachStageMatchesOneProcessWithEveryRanksBatch) {
  const std::string kind = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  flt::run_on_ranks(world,
                    [&kind, world](const RankContext&) {
                      const auto reference = train({.kind = kind, .twin_of = world});
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const auto shard : {fl::Shard::none, fl::Shard::optimizer, fl::Shard::gradients}) {
                        const auto ours = train({.kind = kind, .world = world, .shard = shard});
                        expect_same_steps(reference, ours, tolerance(kind), std::string(fl::to_string(shard)));
                      }
                      fl::teardown_distrib();
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(world)});
}

INSTANTIATE_TEST_SUITE_P(Models, ShardedEquivalence,
                         ::testing::Combine(::testing::Values("mlp", "conv_net", "resnet", "tabular", "torchscript",
                                                              "embedding_nn"),
                                            ::testing::Values(2, 3)),
                         model_and_ranks);

TEST(ShardedTraining, SgdWithNesterovMomentumMatchesOneProcess) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      const auto reference = train({.opt = "sgd", .twin_of = 2});
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
                        const auto ours = train({.opt = "sgd", .world = 2, .shard = shard});
                        expect_same_steps(reference, ours, 1e-5, std::string(fl::to_string(shard)));
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

// Gradient accumulation (stage 2 reduce-scatters every micro-batch into the shares), bf16 autocast, channels-last
// parameters (their shares follow memory order), fine_tune's frozen then unfrozen fit (the layout changes and the
// optimizer's state is redistributed) over two parameter groups, and a weight two layers share: each as one process
// with every rank's batch.
TEST(ShardedTraining, AccumulationBf16ChannelsLastFineTuneAndTiedWeightsMatchOneProcess) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        const auto acc_reference = train({.twin_of = 2, .epochs = 3, .micro_batches = 2, .one_cycle = false});
        const auto bf16_reference = train({.kind = "conv_net", .twin_of = 2, .bf16 = true});
        const auto tuned_reference = train({.kind = "resnet", .twin_of = 2, .fine_tune = true});
        const auto tied_reference = train({.kind = "tied", .twin_of = 2});
        const auto channels_last = [](fl::Learner& learn) { learn.add_cb(std::make_shared<fl::ChannelsLast>()); };
        const auto cl_reference = train({.kind = "conv_net", .twin_of = 2, .setup = channels_last});
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
          const std::string stage(fl::to_string(shard));
          expect_same_steps(acc_reference,
                            train({.world = 2, .shard = shard, .epochs = 3, .micro_batches = 2, .one_cycle = false}),
                            1e-5, stage + ", accumulation");
          // bf16 rounds the two runs' batch shapes differently: bf16's precision (see distributed_trainer_test).
          expect_same_steps(bf16_reference, train({.kind = "conv_net", .world = 2, .shard = shard, .bf16 = true}), 2e-2,
                            stage + ", bf16");
          expect_same_steps(tuned_reference, train({.kind = "resnet", .world = 2, .shard = shard, .fine_tune = true}),
                            tolerance("resnet"), stage + ", fine_tune");
          expect_same_steps(tied_reference, train({.kind = "tied", .world = 2, .shard = shard}), 1e-5,
                            stage + ", tied weights");
          expect_same_steps(cl_reference,
                            train({.kind = "conv_net", .world = 2, .shard = shard, .setup = channels_last}),
                            tolerance("conv_net"), stage + ", channels-last");
        }
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
}

namespace {

// The global norm GradientClip measured before each step.
struct NormLog : fl::Callback {
  std::vector<double> norms;
  void after_step() override { norms.push_back(learn().cb<fl::GradientClip>()->last_norm()); }
};

}  // namespace

// Each rank holds a share of the gradients: the norm that clipping divides by must still be the whole gradient's,
// the same on every rank, so that the clipped steps equal one process's.
TEST(ShardedTraining, GradientClippingUsesTheWholeGradientsNormOnEveryRank) {
  flt::run_on_ranks(2,
                    [](const RankContext& ctx) {
                      auto clip_and_log = [](std::shared_ptr<NormLog>& log) {
                        return [&log](fl::Learner& learn) {
                          learn.add_cb(std::make_shared<fl::GradientClip>(fl::GradientClipOptions{.max_norm = 0.1}));
                          log = std::make_shared<NormLog>();
                          learn.add_cb(log);
                        };
                      };
                      std::shared_ptr<NormLog> reference_norms, norms;
                      const auto reference = train({.twin_of = 2, .setup = clip_and_log(reference_norms)});
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
                        const std::string stage(fl::to_string(shard));
                        const auto ours = train({.world = 2, .shard = shard, .setup = clip_and_log(norms)});
                        expect_same_steps(reference, ours, 1e-5, stage);
                        ASSERT_EQ(norms->norms.size(), reference_norms->norms.size());
                        for (std::size_t s = 0; s < norms->norms.size(); ++s) {
                          EXPECT_NEAR(norms->norms[s], reference_norms->norms[s], 1e-5 * reference_norms->norms[s])
                              << stage << ", step " << s << " on rank " << ctx.rank;
                          EXPECT_GT(norms->norms[s], 0.1) << "the test needs steps that clip";
                        }
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

namespace {

// On rank 1 only, at the third step, a gradient overflows. Sharded gradients: one element of rank 1's share, after
// the reduction, so that no other rank sees it unless the overflow check is agreed on. Sharded optimizer state: rank
// 1's loss, so its gradients overflow before they are all-reduced, as an overflow happens.
struct OverflowOnRankOne : fl::Callback {
  explicit OverflowOnRankOne(bool in_share) : in_share_(in_share) { order = fl::cb_order::distributed_trainer + 1; }
  void after_loss() override {
    auto& l = learn();
    if (!in_share_ && l.coordination().rank == 1 && l.train_iter == 2)
      l.loss_grad = l.loss_grad * std::numeric_limits<float>::infinity();
  }
  void after_backward() override {
    auto& l = learn();
    if (!in_share_ || l.coordination().rank != 1 || l.train_iter != 2) return;
    auto shares = l.coordination().gradient_shares();
    ASSERT_TRUE(shares && !shares->empty());
    torch::NoGradGuard no_grad;
    shares->front().view(-1)[0] = std::numeric_limits<float>::infinity();
  }

 private:
  bool in_share_;
};

}  // namespace

TEST(ShardedTraining, AnOverflowOnOneRankSkipsTheStepOnEveryRank) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
                        const std::string stage(fl::to_string(shard));
                        std::shared_ptr<fl::MixedPrecision> mp;
                        const auto steps =
                            train({.world = 2, .shard = shard, .epochs = 1, .setup = [&mp, shard](fl::Learner& learn) {
                                     mp = std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{
                                         .dtype = at::kBFloat16, .loss_scaling = true, .init_scale = 8.0});
                                     learn.add_cb(mp);
                                     learn.add_cb(std::make_shared<OverflowOnRankOne>(shard == fl::Shard::gradients));
                                   }});
                        EXPECT_EQ(mp->skipped_steps(), 1) << stage;
                        EXPECT_EQ(steps.size(), 6u) << stage << ": after_step of 6 batches (one step cancelled)";
                        // Every rank holds the same parameters after every step.
                        for (const auto& t : steps.back()) {
                          if (!t.is_floating_point()) continue;
                          auto mine = t.clone(), theirs = t.clone();
                          fl::broadcast(theirs, 0);
                          EXPECT_TRUE(mine.equal(theirs)) << stage;
                        }
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

namespace {

// A model whose forward uses its second head on rank 0 only.
struct TwoHeadsImpl : torch::nn::Module {
  TwoHeadsImpl() {
    body = register_module("body", torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 3)));
    aux = register_module("aux", torch::nn::Linear(3, 3));
  }
  torch::nn::Sequential body{nullptr};
  torch::nn::Linear aux{nullptr};
};

}  // namespace

// A parameter with a gradient on one rank and none on another: every rank fails at that step with a message (the one
// that left it out names it), within seconds, not after the collective timeout.
TEST(ShardedTraining, AParameterWithoutGradientOnOneRankFailsEveryRankAtOnce) {
  flt::run_on_ranks(2,
                    [](const RankContext& ctx) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(120)});
                      for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
                        torch::manual_seed(0);
                        auto model = std::make_shared<TwoHeadsImpl>();
                        const bool use_aux = ctx.rank == 0;
                        fl::Learner learn(
                            loaders("mlp", 0, 1), model,
                            [model, use_aux](const std::vector<at::Tensor>& xb) {
                              auto out = model->body->forward(xb[0]);
                              return use_aux ? model->aux->forward(out) : out;
                            },
                            fl::cross_entropy(), learner_options("adam"));
                        fl::DistribCtx dctx(learn, {.reducer = small_buckets(), .shard = shard});
                        const auto start = std::chrono::steady_clock::now();
                        try {
                          learn.fit(1);
                          ADD_FAILURE() << "the fit ended";
                        } catch (const fl::DistributedError& e) {
                          const std::string what = e.what();
                          if (ctx.rank == 1)
                            EXPECT_NE(what.find("aux.weight"), std::string::npos) << what;
                          else
                            EXPECT_NE(what.find("rank(s) 1 left parameters without gradient"), std::string::npos)
                                << what;
                        }
                        EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

namespace {

fs::path checkpoint_root() {
  return fs::temp_directory_path() / ("fl_sharded_ckpt_" + std::to_string(flt::test_process_id()));
}

fs::path checkpoints_of(const std::string& run) { return checkpoint_root() / run; }

// The checkpoint taken after the first of three epochs of `run`, to resume the last two from.
fs::path first_epoch_checkpoint(const std::string& run) { return checkpoints_of(run) / fl::checkpoint_file_name(1, 0); }

// Three epochs of the mlp (sharded_runs.h), checkpointed into checkpoint_root() / run.
std::vector<at::Tensor> three_epochs(const std::string& run, int world, fl::Shard shard, const fs::path& resume = {}) {
  return sharded::three_epochs("mlp", checkpoint_root() / run, world, shard, resume);
}

}  // namespace

// A checkpoint of a sharded run holds the whole optimizer state under the unsharded names, each tensor as an unsharded
// run's at that step; resumed on the same ranks it ends bit for bit as the run not interrupted; resumed on another
// number of ranks, sharded, it ends as the same checkpoint resumed there unsharded (3 -> 2, 2 -> 1, 2 -> 3, 1 -> 3).
TEST(ShardedTraining, CheckpointsHoldTheWholeStateAndResumeOnAnyNumberOfRanks) {
  // Only the test's own process clears it: the ranks run this body too, at once.
  if (!flt::in_rank_process()) fs::remove_all(checkpoint_root());
  const auto none = fl::Shard::none, optimizer = fl::Shard::optimizer, gradients = fl::Shard::gradients;
  flt::run_on_ranks(
      2,
      [&](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        three_epochs("2_none", 2, none);
        const auto uninterrupted = three_epochs("2_gradients", 2, gradients);
        three_epochs("2_optimizer", 2, optimizer);
        const auto unsharded = fl::load_safetensors(first_epoch_checkpoint("2_none"));
        for (const auto* run : {"2_gradients", "2_optimizer"}) {
          const auto sharded = fl::load_safetensors(first_epoch_checkpoint(run));
          ASSERT_EQ(sharded.tensors.size(), unsharded.tensors.size()) << run;
          std::size_t optimizer_tensors = 0;
          for (std::size_t i = 0; i < sharded.tensors.size(); ++i) {
            const auto& [name, t] = sharded.tensors[i];
            ASSERT_EQ(name, unsharded.tensors[i].first) << run;
            optimizer_tensors += name.starts_with("optimizer/") ? 1 : 0;
            if (t.is_floating_point())
              EXPECT_TRUE(t.allclose(unsharded.tensors[i].second, 1e-6, 1e-6)) << run << ": " << name;
            else
              EXPECT_TRUE(t.equal(unsharded.tensors[i].second)) << run << ": " << name;
          }
          EXPECT_EQ(optimizer_tensors, 2u * 8u) << run << ": Adam's two states of 8 parameters";
        }
        const auto resumed = three_epochs("2_gradients_resumed", 2, gradients, first_epoch_checkpoint("2_gradients"));
        EXPECT_TRUE(flt::same_tensors(resumed, uninterrupted)) << "resumed on the same ranks: not bit for bit";
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
  if (flt::in_rank_process()) return;
  // 2 -> 1: one process has nothing to shard; the sharded run's checkpoint resumes as the unsharded one's.
  expect_close(three_epochs("1_from_sharded", 1, none, first_epoch_checkpoint("2_gradients")),
               three_epochs("1_from_unsharded", 1, none, first_epoch_checkpoint("2_none")), 1e-5, "2 -> 1");
  three_epochs("1", 1, none);
  flt::run_on_ranks(3,
                    [&](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      expect_close(three_epochs("3_from_2", 3, optimizer, first_epoch_checkpoint("2_gradients")),
                                   three_epochs("3_from_2_none", 3, none, first_epoch_checkpoint("2_gradients")), 1e-5,
                                   "2 -> 3");
                      expect_close(three_epochs("3_from_1", 3, gradients, first_epoch_checkpoint("1")),
                                   three_epochs("3_from_1_none", 3, none, first_epoch_checkpoint("1")), 1e-5, "1 -> 3");
                      three_epochs("3_gradients", 3, gradients);
                      fl::teardown_distrib();
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(3)});
  flt::run_on_ranks(2,
                    [&](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      expect_close(three_epochs("2_from_3", 2, gradients, first_epoch_checkpoint("3_gradients")),
                                   three_epochs("2_from_3_none", 2, none, first_epoch_checkpoint("3_gradients")), 1e-5,
                                   "3 -> 2");
                      fl::teardown_distrib();
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
  fs::remove_all(checkpoint_root());
}

// With a sharded optimizer a save gathers the state from every rank: a rank that saves alone fails within the
// arrival timeout, naming the call, instead of waiting in the gather until the collective timeout.
TEST(ShardedTraining, ASaveOnOneRankAloneFailsWithAMessage) {
  flt::run_on_ranks(
      2,
      [](const RankContext& ctx) {
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        auto learn = make_learner("mlp", "adam", 0, 1);
        fl::DistribCtx dctx(*learn, {.shard = fl::Shard::gradients, .arrival_timeout = std::chrono::seconds(2)});
        learn->fit(1);
        if (ctx.rank == 0) {
          const auto start = std::chrono::steady_clock::now();
          try {
            learn->save("alone");
            ADD_FAILURE() << "a save on one rank went through";
          } catch (const fl::DistributedError& e) {
            EXPECT_NE(std::string(e.what()).find("only 1 of its 2 ranks arrived"), std::string::npos) << e.what();
          }
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
        }
        fl::barrier();
      },
      {.env = flt::torchrun_env(2)});
}

namespace {

// Bytes the CPU allocator counts: the optimizer's state made by the first step, and what is held after the backward
// of training batch 3 (a micro-batch that steps).
struct MemoryProbe : fl::Callback {
  MemoryProbe() { order = fl::cb_order::distributed_trainer + 1; }  // after the reducer's part of after_backward
  std::size_t before_first_step = 0, state_bytes = 0, after_backward_bytes = 0;
  fl::MemoryReport report;
  void before_step() override {
    if (learn().opt().step_count() == 0) before_first_step = fl::cpu_memory_count().current_bytes;
  }
  void after_step() override {
    if (learn().opt().step_count() == 1 && state_bytes == 0)
      state_bytes = fl::cpu_memory_count().current_bytes - before_first_step;
  }
  void after_backward() override {
    if (learn().train_iter != 3) return;
    after_backward_bytes = fl::cpu_memory_count().current_bytes;
    report = fl::memory_report(learn());
  }
};

struct MemoryUse {
  std::size_t state = 0;      // the optimizer's state, counted by the allocator
  std::size_t gradients = 0;  // held after backward beyond the parameters, data and state: gradient buffers
  fl::MemoryReport report;
};

constexpr std::int64_t kWidth = 1024, kLayers = 8;  // 8 layers of 1024 x 1024: 8.4M parameters
constexpr double kBucketMb = 4.2;                   // each bucket one layer's weight and bias

// Adam on the 8.4M-parameter MLP, 2 micro-batches of 4 per step, buckets of one layer each.
MemoryUse memory_use(fl::Shard shard) {
  torch::manual_seed(0);
  torch::nn::Sequential mlp;
  for (std::int64_t k = 0; k < kLayers; ++k) {
    mlp->push_back(torch::nn::Linear(kWidth, kWidth));
    mlp->push_back(torch::nn::ReLU());
  }
  mlp->push_back(torch::nn::Linear(kWidth, 3));
  auto gen = at::detail::createCPUGenerator(5);
  auto x = at::randn({48, kWidth}, gen);
  auto y = at::randint(0, 3, {48}, gen, at::TensorOptions().dtype(at::kLong));
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  fl::Learner learn(fl::DataLoaders(fl::DataLoader(ds, {.bs = kPerRank}), fl::DataLoader(ds, {.bs = 8}), 3), mlp,
                    fl::cross_entropy(), learner_options("adam"));
  auto probe = std::make_shared<MemoryProbe>();
  learn.add_cb(probe);
  learn.add_cb(std::make_shared<fl::GradientAccumulation>(kPerRank * 2));
  fl::DistribCtx ctx(learn, {.reducer = {.first_bucket_mb = kBucketMb, .bucket_cap_mb = kBucketMb}, .shard = shard});
  const auto baseline = fl::cpu_memory_count().current_bytes;
  learn.fit(1, 1e-4);
  return {.state = probe->state_bytes,
          .gradients = probe->after_backward_bytes - baseline - probe->state_bytes,
          .report = probe->report};
}

}  // namespace

// The optimizer's state per rank is 1/N of the unsharded state (+5%) under both stages; with sharded gradients the
// gradient buffers held after backward are at most 1/N of the gradients plus the largest bucket, with gradient
// accumulation. Measured by the CPU allocator's count (and the storage-based report, which must agree).
TEST(ShardedTraining, EachRankHoldsItsShareOfTheOptimizerStateAndGradients) {
  for (const int world : {2, 3}) {
    flt::run_on_ranks(
        world,
        [world](const RankContext& ctx) {
          fl::count_cpu_memory();
          fl::setup_distrib({.timeout = std::chrono::seconds(120)});
          const auto whole = memory_use(fl::Shard::none);
          const auto params_bytes = static_cast<double>(kLayers * (kWidth * kWidth + kWidth) + 3 * kWidth + 3) * 4;
          // The measure sees the unsharded run's Adam state (two copies) and its gradient buckets.
          EXPECT_NEAR(static_cast<double>(whole.state), 2 * params_bytes, 0.02 * params_bytes);
          EXPECT_GT(static_cast<double>(whole.gradients), 0.95 * params_bytes);
          for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
            const auto ours = memory_use(shard);
            const std::string what = fmt::format("{} on rank {} of {}", fl::to_string(shard), ctx.rank, world);
            EXPECT_LE(static_cast<double>(ours.state), 1.05 * static_cast<double>(whole.state) / world) << what;
            EXPECT_EQ(static_cast<std::size_t>(ours.report.optimizer_state), ours.state) << what;
            std::printf("%s: optimizer state %.1f MB (unsharded %.1f MB), gradient buffers %.1f MB (unsharded %.1f)\n",
                        what.c_str(), static_cast<double>(ours.state) / 1e6, static_cast<double>(whole.state) / 1e6,
                        static_cast<double>(ours.gradients) / 1e6, static_cast<double>(whole.gradients) / 1e6);
            if (shard == fl::Shard::gradients) {
              EXPECT_LE(static_cast<double>(ours.gradients), params_bytes / world + kBucketMb * 1024 * 1024) << what;
              EXPECT_LE(static_cast<double>(ours.report.gradients), 1.01 * params_bytes / world) << what;
            }
          }
          fl::teardown_distrib();
        },
        {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(world)});
  }
}

namespace {

// Rank 1 votes to stop from training batch 3 on; every rank stops where the agreed vote says so.
struct StopVote : fl::Callback {
  std::int64_t stopped_at = -1;
  void after_batch() override {
    auto& l = learn();
    if (!l.training) return;
    if (l.coordination().any_process_soon(l.coordination().rank == 1 && l.iter >= 3)) {
      stopped_at = l.iter;
      throw fl::CancelFitException();
    }
  }
};

}  // namespace

// The stop vote travels in the reduction of its own that sharded gradients need: the ranks stop at the same batch,
// the one after the vote (on CPU the vote of a batch is read after the next backward). An optimizer that is not
// elementwise is refused by name when the fit starts.
TEST(ShardedTraining, StopVotesAgreeAndANonElementwiseOptimizerIsRefused) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
                        auto learn = make_learner("mlp", "adam", 0, 1);
                        auto vote = std::make_shared<StopVote>();
                        learn->add_cb(vote);
                        fl::DistribCtx ctx(*learn, {.shard = shard});
                        learn->fit(2);
                        EXPECT_EQ(vote->stopped_at, 4) << fl::to_string(shard);
                      }
                      auto learn = make_learner("mlp", "norm_reading", 0, 1);
                      fl::DistribCtx ctx(*learn, {.shard = fl::Shard::optimizer});
                      try {
                        learn->fit(1);
                        ADD_FAILURE() << "a non-elementwise optimizer was sharded";
                      } catch (const fl::ConfigError& e) {
                        EXPECT_NE(std::string(e.what()).find("NormReadingSgd"), std::string::npos) << e.what();
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

// A job of one process with the whole distributed path (with_one_process): every rank's part is the whole bucket,
// and each stage trains as the plain Learner does (the CPU twin of the NCCL test in tests/gpu).
TEST(ShardedTraining, OneProcessWithTheWholePathTrainsAsThePlainLearner) {
  flt::run_on_ranks(1,
                    [](const RankContext&) {
                      const auto plain = train({.twin_of = 1});
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const auto shard : {fl::Shard::optimizer, fl::Shard::gradients}) {
                        auto learn = make_learner("mlp", "adam", 1, 1);
                        auto log = std::make_shared<StepLog>();
                        learn->add_cb(log);
                        fl::DistribCtx ctx(*learn,
                                           {.reducer = small_buckets(), .with_one_process = true, .shard = shard});
                        learn->fit_one_cycle(2, 0.01);
                        expect_same_steps(plain, log->params, 1e-6, std::string(fl::to_string(shard)));
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(1)});
}
