// Sharded parameters (DistributedTrainerOptions::shard = "parameters", ZeRO stage 3 / FSDP) on 2 and 3 ranks (Gloo):
// step by step the parameters of one process fed every rank's samples as one batch, for the mlp, conv_net, a resnet
// with SyncBatchNorm and the tabular model, with Adam under one-cycle and SGD with nesterov momentum; the units'
// parameters freed after each forward or kept until backward give the same numbers; what needs the whole model
// (checkpoints, the model after a fit) sees it whole; what cannot be sharded is refused by name.
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/cpu_memory_counter.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/memory_report.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

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

namespace {

class ShardedParamsEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

}  // namespace

// Stage 3 equals one process with the whole batch; freeing a unit after its forward or keeping it until its backward
// gives the same bits.
TEST_P(ShardedParamsEquivalence, MatchesOneProcessWithEveryRanksBatch) {
  const std::string kind = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  flt::run_on_ranks(world,
                    [&kind, world](const RankContext&) {
                      const auto reference = train({.kind = kind, .twin_of = world});
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      const auto ours = train({.kind = kind, .world = world, .shard = fl::Shard::parameters});
                      expect_same_steps(reference, ours, tolerance(kind), "parameters");
                      const auto kept = train(
                          {.kind = kind, .world = world, .shard = fl::Shard::parameters, .reshard_after_forward = false});
                      ASSERT_EQ(kept.size(), ours.size());
                      for (std::size_t s = 0; s < ours.size(); ++s)
                        EXPECT_TRUE(flt::same_tensors(kept[s], ours[s])) << "reshard_after_forward off, step " << s;
                      fl::teardown_distrib();
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(world)});
}

INSTANTIATE_TEST_SUITE_P(Models, ShardedParamsEquivalence,
                         ::testing::Combine(::testing::Values("mlp", "conv_net", "resnet", "tabular"),
                                            ::testing::Values(2, 3)),
                         [](const ::testing::TestParamInfo<std::tuple<std::string, int>>& p) {
                           return std::get<0>(p.param) + "_" + std::to_string(std::get<1>(p.param)) + "_ranks";
                         });

// SGD with nesterov momentum, gradient accumulation (the shares summed over the micro-batches), bf16 autocast,
// channels-last parameters, fine_tune's frozen body (whose units' frozen parameters are sharded too, and whose
// BatchNorm layers train) and gradient clipping by the global norm: each as one process with every rank's batch.
TEST(ShardedParameters, SgdAccumulationBf16ChannelsLastFineTuneAndClippingMatchOneProcess) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        const auto stage3 = fl::Shard::parameters;
        const auto sgd_reference = train({.opt = "sgd", .twin_of = 2});
        const auto acc_reference = train({.twin_of = 2, .epochs = 3, .micro_batches = 2, .one_cycle = false});
        const auto bf16_reference = train({.kind = "conv_net", .twin_of = 2, .bf16 = true});
        const auto tuned_reference = train({.kind = "resnet", .twin_of = 2, .fine_tune = true});
        const auto channels_last = [](fl::Learner& learn) { learn.add_cb(std::make_shared<fl::ChannelsLast>()); };
        const auto cl_reference = train({.kind = "conv_net", .twin_of = 2, .setup = channels_last});
        const auto clip = [](fl::Learner& learn) {
          learn.add_cb(std::make_shared<fl::GradientClip>(fl::GradientClipOptions{.max_norm = 0.1}));
        };
        const auto clip_reference = train({.twin_of = 2, .setup = clip});
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        expect_same_steps(sgd_reference, train({.opt = "sgd", .world = 2, .shard = stage3}), 1e-5, "sgd");
        expect_same_steps(acc_reference,
                          train({.world = 2, .shard = stage3, .epochs = 3, .micro_batches = 2, .one_cycle = false}),
                          1e-5, "accumulation");
        // bf16 rounds the two runs' batch shapes differently: bf16's precision (see distributed_trainer_test).
        expect_same_steps(bf16_reference, train({.kind = "conv_net", .world = 2, .shard = stage3, .bf16 = true}), 2e-2,
                          "bf16");
        expect_same_steps(tuned_reference, train({.kind = "resnet", .world = 2, .shard = stage3, .fine_tune = true}),
                          tolerance("resnet"), "fine_tune");
        expect_same_steps(cl_reference, train({.kind = "conv_net", .world = 2, .shard = stage3, .setup = channels_last}),
                          tolerance("conv_net"), "channels-last");
        expect_same_steps(clip_reference, train({.world = 2, .shard = stage3, .setup = clip}), 1e-5, "clipping");
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
}

namespace {

// Between the units of an mlp: which units' weights have memory when the forward reaches it.
struct ProbeImpl : torch::nn::Module {
  explicit ProbeImpl(std::vector<at::Tensor> weights) : weights_(std::move(weights)) {}
  at::Tensor forward(const at::Tensor& x) {
    std::string seen;
    for (const auto& w : weights_) seen += w.storage().nbytes() > 0 ? '1' : '0';
    if (is_training()) log.push_back(seen);
    return x;
  }
  std::vector<at::Tensor> weights_;
  std::vector<std::string> log;
};
TORCH_MODULE(Probe);

// Whether each unit's parameters have memory after each step.
struct ResidencyLog : fl::Callback {
  std::vector<at::Tensor> weights;
  std::vector<std::string> after_step_log;
  void after_step() override {
    std::string seen;
    for (const auto& w : weights) seen += w.storage().nbytes() > 0 ? '1' : '0';
    after_step_log.push_back(seen);
  }
};

}  // namespace

// A unit's parameters have memory only while it runs: freed after its forward (except the last unit's, whose backward
// comes next) and after each step; with reshard_after_forward off they stay from the forward to the backward. After
// the fit the model is whole, the same on every rank, and its structure is the user's again.
TEST(ShardedParameters, AUnitsParametersHaveMemoryOnlyWhileItRuns) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        for (const bool reshard : {true, false}) {
          torch::manual_seed(0);
          torch::nn::Linear a(28 * 28, 16), b(16, 8), c(8, 3);
          const std::vector<at::Tensor> weights{a->weight, b->weight, c->weight};
          Probe first(weights), second(weights);
          torch::nn::Sequential model(torch::nn::Flatten(), a, first, b, second, c);
          fl::Learner learn(loaders("mlp", 0, 1), model, fl::cross_entropy(), learner_options("adam"));
          auto log = std::make_shared<ResidencyLog>();
          log->weights = weights;
          learn.add_cb(log);
          fl::DistribCtx ctx(learn, {.shard = fl::Shard::parameters, .reshard_after_forward = reshard});
          learn.fit(1);
          const std::string what = reshard ? "reshard_after_forward" : "kept until backward";
          ASSERT_EQ(first->log.size(), 6u) << what;
          for (std::size_t i = 0; i < first->log.size(); ++i) {
            EXPECT_EQ(first->log[i], reshard ? "000" : "100") << what << ", batch " << i;
            EXPECT_EQ(second->log[i], reshard ? "000" : "110") << what << ", batch " << i;
            EXPECT_EQ(log->after_step_log[i], "000") << what << ", batch " << i;
          }
          // Whole after the fit, equal on every rank; the Sequential runs its own entries again.
          for (const auto& p : model->parameters()) {
            EXPECT_GE(p.storage().nbytes(), static_cast<std::size_t>(p.numel()) * 4);
            auto theirs = p.detach().clone();
            fl::broadcast(theirs, 0);
            EXPECT_TRUE(theirs.equal(p)) << what;
          }
          EXPECT_EQ(model->ptr(1).get(), a.ptr().get());
          EXPECT_NO_THROW(model->forward(at::zeros({2, 1, 28, 28})));
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

namespace {

// Three blocks of one width run by the model's forward, which on rank 1 skips the second.
struct SkippingImpl : torch::nn::Module {
  SkippingImpl() {
    blocks = register_module("blocks", torch::nn::Sequential(torch::nn::Linear(28 * 28, 8), torch::nn::Linear(8, 8),
                                                             torch::nn::Linear(8, 8), torch::nn::Linear(8, 3)));
  }
  torch::nn::Sequential blocks{nullptr};
};

// A model without a Sequential.
struct PlainImpl : torch::nn::Module {
  PlainImpl() { fc = register_module("fc", torch::nn::Linear(28 * 28, 3)); }
  torch::nn::Linear fc{nullptr};
};

std::string fit_error(fl::Learner& learn, fl::DistributedTrainerOptions options) {
  fl::DistribCtx ctx(learn, options);
  try {
    learn.fit(1);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "the fit ended";
}

}  // namespace

// What cannot be sharded by units is refused by name when the fit starts: a weight two units share, a model with no
// Sequential, a unit name that matches nothing or a module that is no Sequential's entry, a unit inside another. A
// rank that skips a unit fails, naming both units, instead of exchanging one unit's parameters for another's.
TEST(ShardedParameters, WhatCannotBeShardedIsRefusedByNameAndASkippedUnitFails) {
  flt::run_on_ranks(
      2,
      [](const RankContext& ctx) {
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        const auto stage3 = fl::Shard::parameters;
        const auto expect_error = [](const std::string& what, const std::vector<std::string>& parts,
                                     const std::string& test) {
          for (const auto& part : parts) EXPECT_NE(what.find(part), std::string::npos) << test << ": " << what;
        };
        {
          auto learn = make_learner("tied", "adam", 0, 1);
          expect_error(fit_error(*learn, {.shard = stage3}), {"units '3' and '5' share a parameter", "weight"}, "tied");
        }
        {
          auto model = std::make_shared<PlainImpl>();
          fl::Learner learn(
              loaders("mlp", 0, 1), model,
              [model](const std::vector<at::Tensor>& xb) { return model->fc->forward(xb[0].flatten(1)); },
              fl::cross_entropy(), learner_options("adam"));
          expect_error(fit_error(learn, {.shard = stage3}), {"PlainImpl", "shard_units"}, "no Sequential");
          expect_error(fit_error(learn, {.shard = stage3, .shard_units = {"fc"}}),
                       {"'fc'", "not an entry of a Sequential"}, "not an entry");
          expect_error(fit_error(learn, {.shard = stage3, .shard_units = {"head.*"}}), {"'head.*' names no Sequential entry"},
                       "unknown name");
        }
        {
          auto learn = make_learner("tabular", "adam", 0, 1);
          expect_error(fit_error(*learn, {.shard = stage3, .shard_units = {"layers.0", "layers.0.*"}}),
                       {"unit 'layers.0.0' is inside unit 'layers.0'"}, "nested units");
        }
        {
          torch::manual_seed(0);
          auto model = std::make_shared<SkippingImpl>();
          const bool skip = ctx.rank == 1;
          fl::Learner learn(
              loaders("mlp", 0, 1), model,
              [model, skip](const std::vector<at::Tensor>& xb) {
                auto x = xb[0].flatten(1);
                std::size_t i = 0;
                for (auto& entry : *model->blocks)
                  if (!(skip && i++ == 1)) x = entry.forward(x);
                return x;
              },
              fl::cross_entropy(), learner_options("adam"));
          const auto start = std::chrono::steady_clock::now();
          expect_error(fit_error(learn, {.shard = stage3}), {"gathers unit 'blocks.", "same units in the same order"},
                       "a skipped unit");
          EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(20));
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}
