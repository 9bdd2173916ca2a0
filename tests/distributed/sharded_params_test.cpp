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
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/config/load_learner.h>
#include <fastlearn/config/train_config.h>
#include <fastlearn/core/cpu_memory_counter.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/memory_report.h>
#include <fastlearn/models/vision_model.h>
#include <fastlearn/models/weights.h>

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
namespace sharded = fastlearn::testing::sharded;

namespace {

class ShardedParamsEquivalence : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

}  // namespace

// Stage 3 equals one process with the whole batch; freeing a unit after its forward or keeping it until its backward,
// and prefetching the next unit's gather, give the same bits.
TEST_P(ShardedParamsEquivalence, MatchesOneProcessWithEveryRanksBatch) {
  const std::string kind = std::get<0>(GetParam());
  const int world = std::get<1>(GetParam());
  flt::run_on_ranks(
      world,
      [&kind, world](const RankContext&) {
        const auto reference = train({.kind = kind, .twin_of = world});
        fl::setup_distrib({.timeout = std::chrono::seconds(60)});
        const auto ours = train({.kind = kind, .world = world, .shard = fl::Shard::parameters});
        expect_same_steps(reference, ours, tolerance(kind), "parameters");
        // The options that change when units are gathered, on 2 ranks of a model without BatchNorm and one with (the
        // other models and world sizes would cost make test's time and exercise nothing more).
        if (world == 2 && (kind == "mlp" || kind == "conv_net")) {
          const auto kept =
              train({.kind = kind, .world = world, .shard = fl::Shard::parameters, .reshard_after_forward = false});
          const auto prefetched =
              train({.kind = kind, .world = world, .shard = fl::Shard::parameters, .prefetch = true});
          ASSERT_EQ(kept.size(), ours.size());
          ASSERT_EQ(prefetched.size(), ours.size());
          for (std::size_t s = 0; s < ours.size(); ++s) {
            EXPECT_TRUE(flt::same_tensors(kept[s], ours[s])) << "reshard_after_forward off, step " << s;
            EXPECT_TRUE(flt::same_tensors(prefetched[s], ours[s])) << "prefetch, step " << s;
          }
        }
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(world)});
}

INSTANTIATE_TEST_SUITE_P(Models, ShardedParamsEquivalence,
                         ::testing::Combine(::testing::Values("mlp", "conv_net", "resnet", "tabular", "embedding_nn"),
                                            ::testing::Values(2, 3)),
                         model_and_ranks);

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
        expect_same_steps(cl_reference,
                          train({.kind = "conv_net", .world = 2, .shard = stage3, .setup = channels_last}),
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
// the fit the model is whole, the same on every rank, and its structure is the user's again; lr_find puts it back.
TEST(ShardedParameters, AUnitsParametersHaveMemoryOnlyWhileItRuns) {
  flt::run_on_ranks(2,
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
                        // lr_find is a fit of its own: it copies the whole model before its first batch and puts it
                        // back after.
                        const auto before = flt::snapshot(*model);
                        learn.lr_find({.num_it = 20});
                        EXPECT_TRUE(flt::same_tensors(flt::snapshot(*model), before)) << what << ": lr_find";
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

// Blocks in a Sequential (the units) and a weight of the first registered on the model too, as a tied head's would be.
struct TiedOutsideImpl : torch::nn::Module {
  TiedOutsideImpl() {
    blocks = register_module("blocks", torch::nn::Sequential(torch::nn::Linear(28 * 28, 8), torch::nn::Linear(8, 3)));
    register_parameter("tied", blocks->ptr<torch::nn::LinearImpl>(0)->weight);
  }
  torch::nn::Sequential blocks{nullptr};
};

// Tries to load a checkpoint in the middle of the fit, where the parameters are sharded.
struct LoadDuringFit : fl::Callback {
  std::string error;
  void after_batch() override {
    if (learn().train_iter != 2 || !error.empty()) return;
    try {
      learn().load("before");
      error = "loaded";
    } catch (const fl::CheckpointError& e) {
      error = e.what();
    }
  }
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

// What cannot be sharded by units is refused by name when the fit starts: a weight two units share or a unit shares
// with a module outside every unit, a model with no Sequential, a unit name that matches nothing or a module that is
// no Sequential's entry, a unit inside another; a load in the middle of a sharded fit is refused too. A rank that
// skips a unit fails, naming both units, instead of exchanging one unit's parameters for another's.
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
        {  // a script runs its own submodules: nothing can wrap them as units (stages 1 and 2 take it)
          auto learn = make_learner("torchscript", "adam", 0, 1);
          expect_error(fit_error(*learn, {.shard = stage3}),
                       {"the model is a TorchScript module", "shard = \"optimizer\" or \"gradients\""}, "script");
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
          expect_error(fit_error(learn, {.shard = stage3, .shard_units = {"head.*"}}),
                       {"'head.*' names no Sequential entry"}, "unknown name");
        }
        {
          auto model = std::make_shared<TiedOutsideImpl>();
          fl::Learner learn(
              loaders("mlp", 0, 1), model,
              [model](const std::vector<at::Tensor>& xb) { return model->blocks->forward(xb[0].flatten(1)); },
              fl::cross_entropy(), learner_options("adam"));
          expect_error(fit_error(learn, {.shard = stage3}),
                       {"'tied' is a parameter of unit 'blocks.0'", "used outside every unit"}, "tied outside");
        }
        {
          auto learn = make_learner("mlp", "adam", 0, 1);
          auto loader = std::make_shared<LoadDuringFit>();
          learn->add_cb(loader);
          learn->save("before");
          {
            fl::DistribCtx dctx(*learn, {.shard = stage3});
            learn->fit(1);
          }
          expect_error(loader->error, {"cannot load into a model whose parameters are sharded"}, "a load mid-fit");
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

namespace {

constexpr std::int64_t kWidth = 1024, kLayers = 8;  // 8 layers of 1024 x 1024: 8.4M parameters, a unit each

// What the CPU allocator counts over training batch 3 (a step): held at its start, the most held during it, held
// after the step; the storage-based report after the step.
struct StepMemory : fl::Callback {
  StepMemory() { order = fl::cb_order::distributed_trainer + 1; }
  std::size_t at_start = 0, peak = 0, after = 0;
  fl::MemoryReport report;
  void before_batch() override {
    if (learn().train_iter != 3) return;
    at_start = fl::cpu_memory_count().current_bytes;
    fl::reset_cpu_memory_peak();
  }
  void after_step() override {
    if (learn().train_iter != 3) return;
    const auto count = fl::cpu_memory_count();
    peak = count.peak_bytes;
    after = count.current_bytes;
    report = fl::memory_report(learn());
  }
};

StepMemory step_memory(fl::Shard shard) {
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
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.narrow(0, 0, 8)},
                                                   std::vector<at::Tensor>{y.narrow(0, 0, 8)});
  fl::Learner learn(fl::DataLoaders(fl::DataLoader(ds, {.bs = kPerRank}), fl::DataLoader(valid, {.bs = 8}), 3), mlp,
                    fl::cross_entropy(), learner_options("adam"));
  auto probe = std::make_shared<StepMemory>();
  learn.add_cb(probe);
  fl::DistribCtx ctx(learn, {.shard = shard});
  learn.fit(1, 1e-4);
  return *probe;
}

}  // namespace

// Per rank, after a step: the parameters held are at most 1/N of the model plus the two largest units; the most held
// during the step is at most what was held at its start plus 3 units plus the activations, which are measured as the
// unsharded run's peak over the same step minus what it held at the step's start. Every figure is printed.
TEST(ShardedParameters, EachRankHoldsItsShareOfTheParametersAndAFewUnitsAtOnce) {
  for (const int world : {2, 3}) {
    flt::run_on_ranks(
        world,
        [world](const RankContext& ctx) {
          fl::count_cpu_memory();
          fl::setup_distrib({.timeout = std::chrono::seconds(120)});
          const auto whole = step_memory(fl::Shard::none);
          const auto ours = step_memory(fl::Shard::parameters);
          const double model = static_cast<double>(kLayers * (kWidth * kWidth + kWidth) + 3 * kWidth + 3) * 4;
          const double unit = static_cast<double>(kWidth * kWidth + kWidth) * 4;
          const double activations = static_cast<double>(whole.peak - whole.at_start);
          const std::string what = fmt::format("rank {} of {}", ctx.rank, world);
          std::printf(
              "%s: parameters held after a step %.2f MB (model %.2f MB, 1/N %.2f MB, unit %.2f MB); during the step "
              "%.2f MB held at its start, peak %.2f MB (+%.2f MB; unsharded: %.2f MB at its start, peak +%.2f MB)\n",
              what.c_str(), static_cast<double>(ours.report.parameters) / 1e6, model / 1e6, model / world / 1e6,
              unit / 1e6, static_cast<double>(ours.at_start) / 1e6, static_cast<double>(ours.peak) / 1e6,
              static_cast<double>(ours.peak - ours.at_start) / 1e6, static_cast<double>(whole.at_start) / 1e6,
              activations / 1e6);
          EXPECT_LE(static_cast<double>(ours.report.parameters), model / world + 2 * unit) << what;
          EXPECT_LE(static_cast<double>(ours.peak), static_cast<double>(ours.at_start) + 3 * unit + activations)
              << what;
          // Closer: the activations of 4 items are a few kB; three units are one gathered, its gradient as autograd
          // made it, and its bucket (freed once reduce-scattered).
          EXPECT_LE(static_cast<double>(ours.peak - ours.at_start), 3 * unit + 1e6) << what;
          // The unsharded run holds the whole model: the bound above is not loose enough to pass without sharding.
          EXPECT_GE(static_cast<double>(whole.report.parameters), model) << what;
          EXPECT_LT(static_cast<double>(ours.at_start) + 3 * unit, static_cast<double>(whole.at_start)) << what;
          fl::teardown_distrib();
        },
        {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(world), .show_output = true});
  }
}

namespace {

fs::path checkpoint_root() {
  return fs::temp_directory_path() / ("fl_fsdp_ckpt_" + std::to_string(flt::test_process_id()));
}

fs::path first_epoch_checkpoint(const std::string& run) {
  return checkpoint_root() / run / fl::checkpoint_file_name(1, 0);
}

// Three epochs of the conv_net (sharded_runs.h), checkpointed into checkpoint_root() / run.
std::vector<at::Tensor> three_epochs(const std::string& run, int world, fl::Shard shard, const fs::path& resume = {}) {
  return sharded::three_epochs("conv_net", checkpoint_root() / run, world, shard, resume);
}

// Every tensor of `file` equals the learner's after loading it (its model and, whole, its optimizer's state).
void expect_loads_whole(fl::Learner& learn, const fs::path& file, const std::string& what) {
  const auto saved = fl::load_safetensors(file);
  fl::load_checkpoint(learn, file);
  std::map<std::string, at::Tensor> held;
  for (auto& [name, t] : fl::models::model_tensors(learn.model())) held.emplace(name, t);
  for (auto& [name, t] : learn.opt().state_tensors()) held.emplace("optimizer/" + name, t);
  std::size_t compared = 0;
  for (const auto& [name, t] : saved.tensors) {
    const auto it = held.find(name);
    if (it == held.end()) continue;  // the random generators, the step state
    ++compared;
    EXPECT_TRUE(it->second.equal(t)) << what << ": " << name;
  }
  EXPECT_EQ(compared, held.size()) << what;
}

}  // namespace

// A checkpoint of 3 ranks with sharded parameters holds the whole model and optimizer state, as 3 unsharded ranks'
// checkpoint at the same step does; it loads on 2 ranks and in one process with every tensor equal; resumed sharded
// on 2 ranks it ends within 1e-5 of the same checkpoint resumed unsharded there.
TEST(ShardedParameters, CheckpointsHoldTheWholeStateAndLoadOnAnyNumberOfRanks) {
  // Only the test's own process clears it: the ranks run this body too, at once.
  if (!flt::in_rank_process()) fs::remove_all(checkpoint_root());
  flt::run_on_ranks(3,
                    [](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      three_epochs("3_parameters", 3, fl::Shard::parameters);
                      three_epochs("3_none", 3, fl::Shard::none);
                      fl::teardown_distrib();
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(3)});
  if (flt::in_rank_process()) return;
  const auto file = first_epoch_checkpoint("3_parameters");
  const auto sharded = fl::load_safetensors(file), unsharded = fl::load_safetensors(first_epoch_checkpoint("3_none"));
  ASSERT_EQ(sharded.tensors.size(), unsharded.tensors.size());
  for (std::size_t i = 0; i < sharded.tensors.size(); ++i) {
    const auto& [name, t] = sharded.tensors[i];
    ASSERT_EQ(name, unsharded.tensors[i].first);
    if (t.is_floating_point())
      EXPECT_TRUE(t.allclose(unsharded.tensors[i].second, 2e-4, 2e-4)) << name;
    else
      EXPECT_TRUE(t.equal(unsharded.tensors[i].second)) << name;
  }
  auto one = make_learner("conv_net", "adam", 0, 1);
  expect_loads_whole(*one, file, "in one process");
  flt::run_on_ranks(2,
                    [&file](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      auto learn = make_learner("conv_net", "adam", 0, 1);
                      fl::DistribCtx ctx(*learn, {.shard = fl::Shard::parameters});
                      expect_loads_whole(*learn, file, "on 2 ranks");
                      expect_close(three_epochs("2_from_3", 2, fl::Shard::parameters, file),
                                   three_epochs("2_from_3_none", 2, fl::Shard::none, file), 1e-5, "3 -> 2");
                      fl::teardown_distrib();
                    },
                    {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
  fs::remove_all(checkpoint_root());
}

namespace {

fl::TrainConfig regression_config() {
  return fl::parse_config(
      "[data]\ndataset = \"synthetic_regression\"\nbs = 16\n[data.synthetic]\nn_train = 192\nn_valid = 64\n"
      "[model]\narch = \"mlp\"\nhidden = [32, 16]\n[train]\nepochs = 2\n[distributed]\nshard = \"parameters\"\n",
      "fsdp.toml", {}, fl::regression_of_data);
}

}  // namespace

// A config with shard = "parameters" trains on 2 ranks; the export rank 0 writes after the fit loads in one process
// with load_learner and predicts the validation set as the run did.
TEST(ShardedParameters, AnExportOfAShardedRunPredictsInOneProcessAsTheRunDid) {
  const auto dir = fs::temp_directory_path() / ("fl_fsdp_export_" + std::to_string(flt::test_process_id()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  flt::run_on_ranks(2,
                    [&dir](const RankContext& ctx) {
                      const auto config = regression_config();
                      auto learn = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
                      fl::DistribCtx dctx(*learn, fl::trainer_options(config.distributed));
                      fl::fit_from_config(*learn, config);
                      const auto preds = learn->get_preds();  // every rank's share gathered
                      if (ctx.rank == 0) {
                        learn->export_to(dir / "export.safetensors");
                        fl::save_safetensors(dir / "preds.safetensors", {{"preds", preds.preds}});
                      }
                    },
                    {.env = flt::torchrun_env(2)});
  if (flt::in_rank_process()) return;
  const auto config = regression_config();
  auto data = fl::learner_from_config(config, {.run_callbacks = false, .progress = false});
  auto loaded = fl::load_learner(dir / "export.safetensors", {.device = torch::kCPU});
  const auto expected = fl::load_safetensors(dir / "preds.safetensors").tensors.front().second;
  const auto preds = loaded->get_preds(&data->dls().valid()).preds;
  ASSERT_EQ(preds.sizes(), expected.sizes());
  EXPECT_TRUE(preds.allclose(expected, 1e-6, 1e-6)) << (preds - expected).abs().max().item<double>();
  fs::remove_all(dir);
}

// Over Gloo's TCP transport a collective runs on Gloo's threads: a prefetched gather is in flight while the unit
// before computes, and is waited for before its unit runs or is freed. The steps are the same bits as without it.
TEST(ShardedParameters, PrefetchedGathersOverGlooTcpGiveTheSameSteps) {
  const auto torchrun = flt::torchrun_env(2);  // one port for both ranks
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(60)});
                      for (const std::string kind : {"mlp", "resnet"}) {
                        const auto plain = train({.kind = kind, .world = 2, .shard = fl::Shard::parameters});
                        const auto prefetched =
                            train({.kind = kind, .world = 2, .shard = fl::Shard::parameters, .prefetch = true});
                        ASSERT_EQ(prefetched.size(), plain.size()) << kind;
                        for (std::size_t s = 0; s < plain.size(); ++s)
                          EXPECT_TRUE(flt::same_tensors(prefetched[s], plain[s])) << kind << ", step " << s;
                      }
                      fl::teardown_distrib();
                    },
                    {.env = [torchrun](int rank) {
                      auto env = torchrun(rank);
                      env["FASTLEARN_SHARED_MEMORY"] = "0";
                      return env;
                    }});
}

namespace {

// The parameter bytes this rank holds after the first step.
struct HeldAfterFirstStep : fl::Callback {
  std::int64_t bytes = 0;
  void after_step() override {
    if (bytes == 0) bytes = fl::memory_report(learn()).parameters;
  }
};

}  // namespace

// shard_units by pattern: "0.layer*.*" makes each residual block of a vision_model's torchvision body a unit (its
// layer1..layer4 are Sequentials of blocks; the stem and the head stay whole, sharded as with "gradients"). It trains
// on 2 ranks as the unsharded run does, holding about half the parameters.
TEST(ShardedParameters, TheResidualBlocksOfAVisionModelAreUnitsByPattern) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(120)});
        std::vector<std::vector<at::Tensor>> finals;
        std::vector<std::int64_t> held;
        for (const auto shard : {fl::Shard::none, fl::Shard::parameters}) {
          torch::manual_seed(0);
          auto model = fl::models::vision_model({.arch = "resnet18", .classes = 3, .in_channels = 1});
          // 16 items: 2 steps of 4 per rank (resnet18's 11M parameters make each step long).
          at::Tensor y;
          auto x = inputs("mlp", 16, 1, y);
          auto items = std::make_shared<fl::TensorDataset>(x, std::vector<at::Tensor>{y});
          fl::Learner learn(
              fl::DataLoaders(fl::DataLoader(items, {.bs = kPerRank}), fl::DataLoader(items, {.bs = 8}), 3), model,
              fl::cross_entropy(), learner_options("adam"));
          auto probe = std::make_shared<HeldAfterFirstStep>();
          learn.add_cb(probe);
          fl::DistribCtx ctx(learn, {.reducer = small_buckets(), .shard = shard, .shard_units = {"0.layer*.*"}});
          learn.fit(1, 1e-3);
          finals.push_back(flt::snapshot(learn.model()));
          held.push_back(probe->bytes);
        }
        expect_close(finals[0], finals[1], 2e-4, "resnet18 with a unit per residual block");
        EXPECT_LT(static_cast<double>(held[1]), 0.6 * static_cast<double>(held[0]))
            << "parameters held: " << held[1] << " of " << held[0];
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(240), .env = flt::torchrun_env(2)});
}
