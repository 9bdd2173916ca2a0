#pragma once
// The runs that the sharded training tests (ZeRO stages 1 to 3) compare: tiny models (an mlp whose small parameters
// straddle ranks, conv_net, a resnet, the tabular model, a tied weight), each trained on this rank's share of the batch
// or, with `twin_of` ranks, in one process fed every rank's samples as one batch, and the parameters after each step.
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/collab.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/tabular_model.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "support/scripted_mlp.h"
#include "support/tiny_tasks.h"

namespace fastlearn::testing::sharded {

namespace fl = fastlearn;
namespace flt = fastlearn::testing;

constexpr std::int64_t kItems = 48, kPerRank = 4;  // 48 / (2 or 3 ranks): 6 or 4 steps per epoch

inline bool tabular(const std::string& kind) { return kind == "tabular"; }

inline std::vector<at::Tensor> inputs(const std::string& kind, std::int64_t n, std::uint64_t seed, at::Tensor& y) {
  auto gen = at::detail::createCPUGenerator(seed);
  y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  if (tabular(kind)) {
    auto cats = at::randint(0, 4, {n, 2}, gen, at::TensorOptions().dtype(at::kLong));
    return {cats, at::randn({n, 2}, gen) + y.to(at::kFloat).view({n, 1})};
  }
  if (kind == "embedding_nn")
    return {(at::randint(0, 2, {n, 2}, gen, at::TensorOptions().dtype(at::kLong)) + y.view({n, 1})).clamp_max(3)};
  return {at::randn({n, 1, 28, 28}, gen) + y.to(at::kFloat).view({n, 1, 1, 1})};
}

// world > 1: this rank's loaders (the DistributedTrainer takes its share); world == 1 with `twin_of` ranks: one process
// whose batch k is the union of every rank's batch k.
inline fl::DataLoaders loaders(const std::string& kind, int twin_of, int micro_batches) {
  at::Tensor y, vy;
  auto x = inputs(kind, kItems, 1, y);
  auto vx = inputs(kind, 10, 2, vy);
  auto train = std::make_shared<fl::TensorDataset>(x, std::vector<at::Tensor>{y});
  auto valid = std::make_shared<fl::TensorDataset>(vx, std::vector<at::Tensor>{vy});
  // The reference's batch is every rank's micro-batches of one step; the order below keeps each step's items together.
  const std::int64_t bs = twin_of > 0 ? kPerRank * twin_of * micro_batches : kPerRank;
  fl::DataLoader train_dl(train, {.bs = bs});
  if (twin_of > 0) {
    std::vector<std::int64_t> order;
    const std::int64_t block = kItems / twin_of;
    for (std::int64_t k = 0; k * kPerRank < block; ++k)
      for (int r = 0; r < twin_of; ++r)
        for (std::int64_t i = 0; i < kPerRank; ++i) order.push_back(r * block + k * kPerRank + i);
    train_dl.set_sampler(std::make_shared<flt::FixedSampler>(order));
  }
  return fl::DataLoaders(std::move(train_dl), fl::DataLoader(valid, {.bs = 4}), 3);
}

// An optimizer whose update of an element would read the whole parameter (as LARS's trust ratio does).
class NormReadingSgd : public fl::SGDOptimizer {
 public:
  using fl::SGDOptimizer::SGDOptimizer;
  std::string type() const override { return "NormReadingSgd"; }
  bool elementwise() const override { return false; }
};

inline fl::OptFunc opt_func(const std::string& opt) {
  if (opt == "sgd") return fl::SGD({.mom = 0.9, .wd = 1e-3, .nesterov = true});
  if (opt == "norm_reading")
    return [](std::vector<std::vector<at::Tensor>> groups, double lr) -> std::unique_ptr<fl::Optimizer> {
      return std::make_unique<NormReadingSgd>(std::move(groups), lr);
    };
  return fl::Adam({.wd = 0.01});
}

// opt: "adam", "sgd" (nesterov momentum) or "norm_reading".
inline fl::LearnerOptions learner_options(const std::string& opt, fl::Splitter splitter = {}) {
  return {.opt_func = opt_func(opt), .lr = 0.01, .splitter = std::move(splitter), .progress = false};
}

// "mlp": a 7x33 weight and a 1-element bias (whose share is empty on every rank but one) among larger ones.
// "tied": a layer used twice. "resnet" comes split into body and head (two parameter groups, fine_tune).
// "embedding_nn": fastai's EmbeddingNN (collaborative filtering), whose empty bn_cont holds parameters of no elements;
// the classes are its regression targets.
inline std::unique_ptr<fl::Learner> make_learner(const std::string& kind, const std::string& opt, int twin_of,
                                                 int micro_batches) {
  torch::manual_seed(0);
  auto dls = loaders(kind, twin_of, micro_batches);
  if (kind == "tied") {  // one layer applied twice: its weight is listed under two names
    torch::nn::Linear shared(33, 33);
    torch::nn::Sequential m(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 33), torch::nn::ReLU(), shared,
                            torch::nn::ReLU(), shared, torch::nn::ReLU(), torch::nn::Linear(33, 3));
    return std::make_unique<fl::Learner>(std::move(dls), m, fl::cross_entropy(), learner_options(opt));
  }
  if (kind == "mlp") {
    torch::nn::Sequential m(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 33), torch::nn::ReLU(),
                            torch::nn::Linear(33, 7), torch::nn::ReLU(), torch::nn::Linear(7, 1),
                            torch::nn::Linear(1, 3));
    return std::make_unique<fl::Learner>(std::move(dls), m, fl::cross_entropy(), learner_options(opt));
  }
  if (kind == "torchscript") {
    return std::make_unique<fl::Learner>(std::move(dls), flt::scripted_mlp({28 * 28, 33, 7, 3}), fl::cross_entropy(),
                                         learner_options(opt));
  }
  if (kind == "conv_net" || kind == "resnet") {
    auto m = kind == "conv_net" ? fl::models::conv_net({.widths = {8, 16}, .classes = 3})
                                : fl::models::resnet({.widths = {8, 16}, .classes = 3, .stem_width = 8});
    return std::make_unique<fl::Learner>(
        std::move(dls), m, fl::cross_entropy(),
        learner_options(opt, kind == "resnet" ? fl::Splitter(fl::models::body_head_split) : fl::Splitter{}));
  }
  if (kind == "embedding_nn") {
    auto m = fl::models::embedding_nn({{4, 3}, {4, 2}}, {.layers = {16, 8}});
    fl::ForwardOutputs forward = [m](const std::vector<at::Tensor>& xb) mutable -> std::vector<at::Tensor> {
      return {m->forward(xb[0], at::empty({xb[0].size(0), 0}))};
    };
    return std::make_unique<fl::Learner>(std::move(dls), m.ptr(), std::move(forward), fl::mse_loss(),
                                         learner_options(opt));
  }
  fl::models::TabularModel m(std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 3}, {4, 2}}, 2, 3,
                             fl::models::TabularModelOptions{.layers = {16, 8}});
  return std::make_unique<fl::Learner>(std::move(dls), m, fl::cross_entropy(), learner_options(opt));
}

// The model's parameters and buffers, whole also while shard = "parameters" holds only this rank's share of them.
inline std::vector<at::Tensor> whole_snapshot(fl::Learner& learn) {
  const auto& c = learn.coordination();
  if (!c.model_sharded || !c.model_sharded()) return flt::snapshot(learn.model());
  std::vector<at::Tensor> out;
  for (auto& p : learn.model().parameters()) out.push_back(c.whole_model_tensor(p).clone());
  for (auto& b : learn.model().buffers()) out.push_back(b.detach().clone());
  return out;
}

// Parameters and buffers after every optimizer step.
struct StepLog : fl::Callback {
  std::vector<std::vector<at::Tensor>> params;
  void after_step() override { params.push_back(whole_snapshot(learn())); }
};

// Small buckets, so that parameters straddle ranks and there are several buckets, and a large parameter reduced in
// place while the buckets are not final.
inline fl::GradReducerOptions small_buckets() {
  return {.first_bucket_mb = 0.004, .bucket_cap_mb = 0.02, .in_place_mb = 0.05};
}

struct RunOptions {
  std::string kind = "mlp";
  std::string opt = "adam";  // see learner_options
  int world = 1;             // ranks of the run; 1 with twin_of: the single-process reference
  int twin_of = 0;
  fl::Shard shard = fl::Shard::none;
  int epochs = 2;
  int micro_batches = 1;                    // > 1: gradient accumulation over that many batches per step
  bool bf16 = false;                        // MixedPrecision with bfloat16 autocast
  bool fine_tune = false;                   // fine_tune(1): a frozen epoch, then an unfrozen one
  bool one_cycle = true;                    // false: a constant lr (the schedule counts micro-batches)
  std::function<void(fl::Learner&)> setup;  // more callbacks
  std::chrono::milliseconds arrival = std::chrono::seconds(30);
  std::vector<std::string> shard_units;  // shard = parameters: the units (default: the top Sequential's entries)
  bool reshard_after_forward = true;
  bool prefetch = false;
};

inline std::vector<std::vector<at::Tensor>> train(const RunOptions& o) {
  auto learn = make_learner(o.kind, o.opt, o.twin_of, o.micro_batches);
  auto log = std::make_shared<StepLog>();
  learn->add_cb(log);
  if (o.micro_batches > 1 && o.world > 1)
    learn->add_cb(std::make_shared<fl::GradientAccumulation>(kPerRank * o.micro_batches));
  if (o.bf16) learn->add_cb(std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16}));
  if (o.setup) o.setup(*learn);
  const auto run = [&] {
    if (o.fine_tune)
      learn->fine_tune(1, 0.01);
    else if (o.one_cycle)
      learn->fit_one_cycle(o.epochs, 0.01);
    else
      learn->fit(o.epochs, 0.01);
  };
  if (o.world > 1) {
    fl::DistribCtx ctx(*learn, {.reducer = small_buckets(),
                                .shard = o.shard,
                                .arrival_timeout = o.arrival,
                                .shard_units = o.shard_units,
                                .reshard_after_forward = o.reshard_after_forward,
                                .prefetch = o.prefetch});
    run();
  } else {
    run();
  }
  return log->params;
}

// Summing in another order (per rank, then across ranks) changes the last bits, which BatchNorm's division by a
// batch's std amplifies (see distributed_trainer_test's measurements).
inline double tolerance(const std::string& kind) { return kind == "mlp" || kind == "torchscript" ? 1e-5 : 2e-4; }

inline void expect_same_steps(const std::vector<std::vector<at::Tensor>>& a,
                              const std::vector<std::vector<at::Tensor>>& b, double tol, const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  ASSERT_GE(a.size(), 5u) << what;
  for (std::size_t s = 0; s < a.size(); ++s) {
    ASSERT_EQ(a[s].size(), b[s].size());
    for (std::size_t i = 0; i < a[s].size(); ++i) {
      if (!a[s][i].is_floating_point()) continue;
      ASSERT_TRUE(a[s][i].allclose(b[s][i], tol, tol)) << what << ": step " << s << " tensor " << i << " differs by "
                                                       << (a[s][i] - b[s][i]).abs().max().item<double>();
    }
  }
}

// Three epochs of one-cycle Adam on `kind`, checkpointed after each into `dir`, or resumed from `resume`; the model's
// parameters and buffers at the end.
inline std::vector<at::Tensor> three_epochs(const std::string& kind, const std::filesystem::path& dir, int world,
                                            fl::Shard shard, const std::filesystem::path& resume = {}) {
  auto learn = make_learner(kind, "adam", 0, 1);
  learn->add_cb(std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.dir = dir, .keep = 0}));
  const auto fit = [&] { learn->fit_one_cycle(3, 0.01, {.fit = {.resume_from = resume}}); };
  if (world > 1) {
    fl::DistribCtx ctx(*learn, {.reducer = small_buckets(), .shard = shard});
    fit();
  } else {
    fit();
  }
  return flt::snapshot(learn->model());
}

inline void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double tol,
                         const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(a[i].allclose(b[i], tol, tol))
        << what << ": tensor " << i << " differs by " << (a[i] - b[i]).abs().max().item<double>();
}

// The name of a (model, ranks) test parameter: "mlp_2_ranks".
inline std::string model_and_ranks(const ::testing::TestParamInfo<std::tuple<std::string, int>>& p) {
  return std::get<0>(p.param) + "_" + std::to_string(std::get<1>(p.param)) + "_ranks";
}

}  // namespace fastlearn::testing::sharded
