// SyncBatchNorm against torch::nn::BatchNorm: bitwise equal on one process; on 2 and 3 ranks with unequal
// (and empty) per-rank batches, equal to one BatchNorm over the concatenated batch, in float32 and float64;
// convert_sync_batchnorm on nested models, alone and on 2 ranks.
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/sync_batch_norm.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <optional>
#include <sstream>
#include <vector>

#include "support/message_of.h"
#include "support/multiprocess.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace nn = torch::nn;
using flt::RankContext;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);

flt::MultiProcessOptions torchrun(int world) { return {.env = flt::torchrun_env(world)}; }

// Sets up from the torchrun variables the runner gives each rank; torn down at scope exit.
struct Distributed {
  Distributed() { fl::setup_distrib({.timeout = kTimeout}); }
  ~Distributed() { fl::teardown_distrib(); }
};

using fastlearn::testing::message_of;

// max |actual - expected| <= rtol * max |expected| (or rtol * `scale` when given): relative to the tensor's
// scale, so that entries near zero (which a relative test per entry would make meaningless) do not decide.
::testing::AssertionResult close(const at::Tensor& actual, const at::Tensor& expected, double rtol,
                                 std::optional<double> scale_of_all = std::nullopt) {
  if (!actual.defined() || !expected.defined()) {
    return ::testing::AssertionFailure() << "undefined tensor (actual " << actual.defined() << ", expected "
                                         << expected.defined() << ")";
  }
  if (actual.sizes() != expected.sizes()) {
    return ::testing::AssertionFailure() << "shape " << actual.sizes() << " != " << expected.sizes();
  }
  if (expected.numel() == 0) return ::testing::AssertionSuccess();
  const auto a = actual.detach().to(torch::kDouble), e = expected.detach().to(torch::kDouble);
  const double scale = scale_of_all ? *scale_of_all : std::max(e.abs().max().item<double>(), 1e-300);
  const double error = (a - e).abs().max().item<double>();
  if (error <= rtol * scale) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << "max |difference| " << error << " > " << rtol << " * scale " << scale;
}

double tolerance(torch::Dtype dtype) {
  if (dtype == torch::kHalf) return 1e-2;  // both round their float32 results to 11 bits
  return dtype == torch::kDouble ? 1e-10 : 1e-5;
}

void set_affine(at::Tensor& weight, at::Tensor& bias) {
  torch::NoGradGuard no_grad;
  weight.uniform_(0.5, 1.5);
  bias.uniform_(-0.5, 0.5);
}

// ---- one process: exactly torch::nn::BatchNorm ----------------------------------------------------------

// Three training steps, then eval, of `ref` and a SyncBatchNorm with the same options and values: outputs,
// gradients and running statistics must be bitwise equal.
template <typename Ref>
void expect_exactly_batch_norm(const nn::BatchNormOptions& o, std::vector<std::int64_t> shape, torch::Dtype dtype) {
  SCOPED_TRACE(::testing::Message() << "input " << at::IntArrayRef(shape) << " " << dtype << " momentum "
                                    << (o.momentum() ? std::to_string(*o.momentum()) : "none") << " affine "
                                    << o.affine() << " track " << o.track_running_stats());
  torch::manual_seed(11);
  Ref ref(o);
  fl::SyncBatchNorm sync(fl::SyncBatchNormOptions{.num_features = o.num_features(),
                                                  .eps = o.eps(),
                                                  .momentum = o.momentum(),
                                                  .affine = o.affine(),
                                                  .track_running_stats = o.track_running_stats()});
  ref->to(dtype);
  sync->to(dtype);
  if (o.affine()) {
    set_affine(ref->weight, ref->bias);
    torch::NoGradGuard no_grad;
    sync->weight.copy_(ref->weight);
    sync->bias.copy_(ref->bias);
  }
  for (int step = 0; step < 3; ++step) {
    const auto x = torch::randn(shape, dtype) * 2 + 1;
    const auto g = torch::randn(shape, dtype);
    auto xr = x.clone().requires_grad_(), xs = x.clone().requires_grad_();
    const auto yr = ref->forward(xr), ys = sync->forward(xs);
    (yr * g).sum().backward();
    (ys * g).sum().backward();
    EXPECT_TRUE(torch::equal(ys, yr)) << "step " << step;
    EXPECT_TRUE(torch::equal(xs.grad(), xr.grad())) << "step " << step;
    if (o.affine()) {
      EXPECT_TRUE(torch::equal(sync->weight.grad(), ref->weight.grad())) << "step " << step;
      EXPECT_TRUE(torch::equal(sync->bias.grad(), ref->bias.grad())) << "step " << step;
    }
    if (o.track_running_stats()) {
      EXPECT_TRUE(torch::equal(sync->running_mean, ref->running_mean)) << "step " << step;
      EXPECT_TRUE(torch::equal(sync->running_var, ref->running_var)) << "step " << step;
      EXPECT_TRUE(torch::equal(sync->num_batches_tracked, ref->num_batches_tracked)) << "step " << step;
    }
  }
  ref->eval();
  sync->eval();
  const auto x = torch::randn(shape, dtype);
  EXPECT_TRUE(torch::equal(sync->forward(x), ref->forward(x))) << "eval";
  // Same names, so state dicts interchange.
  EXPECT_EQ(sync->named_parameters().keys(), ref->named_parameters().keys());
  EXPECT_EQ(sync->named_buffers().keys(), ref->named_buffers().keys());
}

}  // namespace

TEST(SyncBatchNormSingleProcess, EqualsBatchNormExactlyInTrainAndEval) {
  ASSERT_FALSE(fl::is_initialized());
  expect_exactly_batch_norm<nn::BatchNorm2d>(nn::BatchNormOptions(4), {6, 4, 3, 5}, torch::kFloat);
  expect_exactly_batch_norm<nn::BatchNorm2d>(nn::BatchNormOptions(4).momentum(std::nullopt).eps(1e-3), {6, 4, 3, 5},
                                             torch::kDouble);
  expect_exactly_batch_norm<nn::BatchNorm1d>(nn::BatchNormOptions(5).affine(false), {7, 5}, torch::kFloat);
  expect_exactly_batch_norm<nn::BatchNorm1d>(nn::BatchNormOptions(3), {4, 3, 6}, torch::kDouble);
  expect_exactly_batch_norm<nn::BatchNorm3d>(nn::BatchNormOptions(2).track_running_stats(false), {3, 2, 2, 3, 2},
                                             torch::kFloat);
}

TEST(SyncBatchNormSingleProcess, AWorldOfOneIsPlainBatchNorm) {
  flt::run_on_ranks(
      1,
      [](const RankContext&) {
        Distributed dist;
        ASSERT_TRUE(fl::is_initialized());
        expect_exactly_batch_norm<nn::BatchNorm2d>(nn::BatchNormOptions(3), {5, 3, 2, 2}, torch::kFloat);
      },
      torchrun(1));
}

TEST(SyncBatchNormSingleProcess, OptionsAndInputsAreChecked) {
  EXPECT_THROW(fl::SyncBatchNorm(0), fl::ConfigError);
  EXPECT_THROW(fl::SyncBatchNorm(fl::SyncBatchNormOptions{.num_features = 3, .eps = -1}), fl::ConfigError);
  fl::SyncBatchNorm bn(4);
  const auto msg = message_of([&] { bn->forward(torch::zeros({2, 3, 5})); });
  EXPECT_NE(msg.find("SyncBatchNorm(4): expected an input of shape (N, 4, ...), got [2, 3, 5]"), std::string::npos)
      << msg;
  EXPECT_THROW(bn->forward(torch::zeros({4})), fl::ConfigError);
  std::ostringstream printed;
  printed << *bn;
  EXPECT_EQ(printed.str(),
            "fastlearn::SyncBatchNorm(4, eps=1e-05, momentum=0.1, affine=true, track_running_stats=true)");
  // A clone is a deep copy that still works.
  auto copy = std::dynamic_pointer_cast<fl::SyncBatchNormImpl>(bn->clone());
  ASSERT_TRUE(copy);
  EXPECT_FALSE(copy->weight.is_same(bn->weight));
  EXPECT_TRUE(torch::equal(copy->forward(torch::ones({3, 4})), bn->forward(torch::ones({3, 4}))));
}

// ---- several ranks: one BatchNorm over the concatenated batch -------------------------------------------

namespace {

struct GlobalCase {
  std::vector<std::int64_t> sizes;       // items on each rank
  std::vector<std::int64_t> item_shape;  // (C, ...)
  torch::Dtype dtype = torch::kFloat;
  std::optional<double> momentum = 0.1;
  int steps = 2;
  double offset = 2;           // the inputs' mean
  bool channels_last = false;  // inputs and output gradients in channels-last memory (4-d items only)
};

// Every rank draws the same seeded global batch, runs the reference BatchNorm on all of it and the
// SyncBatchNorm on its own slice. Each rank's loss is its share of the global mean, sum(y * g) / total, so
// the input gradients must equal the reference's and the weight/bias gradients SUMMED over ranks too.
template <typename Ref>
void expect_global_batch_norm(const GlobalCase& c) {
  const int r = fl::rank();
  ASSERT_EQ(static_cast<int>(c.sizes.size()), fl::world_size());
  const auto total = std::accumulate(c.sizes.begin(), c.sizes.end(), std::int64_t{0});
  const auto offset = std::accumulate(c.sizes.begin(), c.sizes.begin() + r, std::int64_t{0});
  const auto mine = c.sizes[static_cast<std::size_t>(r)];
  const auto channels = c.item_shape[0];
  const double rtol = tolerance(c.dtype);
  SCOPED_TRACE(::testing::Message() << "rank " << r << " of sizes " << at::IntArrayRef(c.sizes) << ", " << c.dtype
                                    << ", momentum " << (c.momentum ? std::to_string(*c.momentum) : "none"));
  std::vector<std::int64_t> shape{total};
  shape.insert(shape.end(), c.item_shape.begin(), c.item_shape.end());

  torch::manual_seed(1234);
  Ref ref(nn::BatchNormOptions(channels).momentum(c.momentum));
  fl::SyncBatchNorm sync(fl::SyncBatchNormOptions{.num_features = channels, .momentum = c.momentum});
  ref->to(c.dtype);
  sync->to(c.dtype);
  set_affine(ref->weight, ref->bias);
  {
    torch::NoGradGuard no_grad;
    sync->weight.copy_(ref->weight);
    sync->bias.copy_(ref->bias);
  }
  for (int step = 0; step < c.steps; ++step) {
    auto x = torch::randn(shape, c.dtype) * 3 + c.offset;
    auto g = torch::randn(shape, c.dtype);
    if (c.channels_last) {
      x = x.contiguous(at::MemoryFormat::ChannelsLast);
      g = g.contiguous(at::MemoryFormat::ChannelsLast);
    }
    auto xr = x.clone().requires_grad_();
    const auto yr = ref->forward(xr);
    ((yr * g).sum() / total).backward();

    auto xs = x.narrow(0, offset, mine).clone().requires_grad_();
    const auto ys = sync->forward(xs);
    ((ys * g.narrow(0, offset, mine)).sum() / total).backward();
    if (c.channels_last && mine > 0) {
      EXPECT_TRUE(ys.is_contiguous(at::MemoryFormat::ChannelsLast)) << "output layout, step " << step;
      EXPECT_TRUE(xs.grad().is_contiguous(at::MemoryFormat::ChannelsLast)) << "input gradient layout, step " << step;
    }

    EXPECT_TRUE(close(ys, yr.narrow(0, offset, mine), rtol)) << "output, step " << step;
    EXPECT_TRUE(close(xs.grad(), xr.grad().narrow(0, offset, mine), rtol)) << "input gradient, step " << step;
    auto grad_weight = sync->weight.grad().clone(), grad_bias = sync->bias.grad().clone();
    fl::all_reduce(grad_weight);
    fl::all_reduce(grad_bias);
    EXPECT_TRUE(close(grad_weight, ref->weight.grad(), rtol)) << "summed weight gradient, step " << step;
    EXPECT_TRUE(close(grad_bias, ref->bias.grad(), rtol)) << "summed bias gradient, step " << step;
    EXPECT_TRUE(close(sync->running_mean, ref->running_mean, rtol)) << "running_mean, step " << step;
    EXPECT_TRUE(close(sync->running_var, ref->running_var, rtol)) << "running_var, step " << step;
    EXPECT_TRUE(torch::equal(sync->num_batches_tracked, ref->num_batches_tracked)) << "step " << step;
    ref->zero_grad();
    sync->zero_grad();
  }
  // Eval uses the running statistics, locally.
  ref->eval();
  sync->eval();
  const auto x = torch::randn(shape, c.dtype);
  EXPECT_TRUE(close(sync->forward(x.narrow(0, offset, mine)), ref->forward(x).narrow(0, offset, mine), rtol))
      << "eval output";
}

class SyncBatchNormRanks : public ::testing::TestWithParam<int> {};

std::vector<std::int64_t> first(int n, std::vector<std::int64_t> sizes) {
  sizes.resize(static_cast<std::size_t>(n));
  return sizes;
}

}  // namespace

TEST_P(SyncBatchNormRanks, UnequalBatchesMatchOneBatchNormOverTheConcatenatedBatch) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [n](const RankContext&) {
        Distributed dist;
        const auto sizes = first(n, {3, 5, 1});
        for (const auto dtype : {torch::kFloat, torch::kDouble}) {
          expect_global_batch_norm<nn::BatchNorm2d>({.sizes = sizes, .item_shape = {4, 3, 2}, .dtype = dtype});
          expect_global_batch_norm<nn::BatchNorm2d>(
              {.sizes = sizes, .item_shape = {4, 3, 2}, .dtype = dtype, .momentum = std::nullopt, .steps = 3});
        }
        expect_global_batch_norm<nn::BatchNorm1d>({.sizes = sizes, .item_shape = {5}, .dtype = torch::kDouble});
        for (const auto dtype : {torch::kFloat, torch::kDouble}) {
          expect_global_batch_norm<nn::BatchNorm2d>(
              {.sizes = sizes, .item_shape = {16, 3, 2}, .dtype = dtype, .channels_last = true});
        }
        // float16 takes the tensor-op path (statistics and passes in float32) on every device.
        expect_global_batch_norm<nn::BatchNorm2d>({.sizes = sizes, .item_shape = {4, 3, 2}, .dtype = torch::kHalf});
      },
      torchrun(n));
}

TEST_P(SyncBatchNormRanks, ARankWithoutItemsTakesPart) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [n](const RankContext&) {
        Distributed dist;
        const auto sizes = n == 2 ? std::vector<std::int64_t>{4, 0} : std::vector<std::int64_t>{0, 3, 0};
        expect_global_batch_norm<nn::BatchNorm1d>({.sizes = sizes, .item_shape = {3, 4}, .dtype = torch::kFloat});
        expect_global_batch_norm<nn::BatchNorm2d>({.sizes = sizes, .item_shape = {2, 2, 2}, .dtype = torch::kDouble});
      },
      torchrun(n));
}

// With gradients AVERAGED over ranks (as a data parallel reducer does), each rank's loss is scaled by the world
// size: weight/bias gradients are then exact, input gradients world-size times the reference's.
TEST_P(SyncBatchNormRanks, AveragedParameterGradientsOfLossesScaledByTheWorldSize) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [n](const RankContext&) {
        Distributed dist;
        const auto sizes = first(n, {2, 6, 3});
        const auto total = std::accumulate(sizes.begin(), sizes.end(), std::int64_t{0});
        const auto offset = std::accumulate(sizes.begin(), sizes.begin() + fl::rank(), std::int64_t{0});
        const auto mine = sizes[static_cast<std::size_t>(fl::rank())];
        torch::manual_seed(5);
        nn::BatchNorm2d ref(3);
        fl::SyncBatchNorm sync(3);
        ref->to(torch::kDouble);
        sync->to(torch::kDouble);
        const auto x = torch::randn({total, 3, 2, 2}, torch::kDouble),
                   g = torch::randn({total, 3, 2, 2}, torch::kDouble);
        auto xr = x.clone().requires_grad_();
        ((ref->forward(xr) * g).sum() / total).backward();
        auto xs = x.narrow(0, offset, mine).clone().requires_grad_();
        ((sync->forward(xs) * g.narrow(0, offset, mine)).sum() * n / total).backward();
        auto grad_weight = sync->weight.grad().clone(), grad_bias = sync->bias.grad().clone();
        fl::all_reduce(grad_weight, fl::ReduceOp::avg);
        fl::all_reduce(grad_bias, fl::ReduceOp::avg);
        EXPECT_TRUE(close(grad_weight, ref->weight.grad(), 1e-10));
        EXPECT_TRUE(close(grad_bias, ref->bias.grad(), 1e-10));
        EXPECT_TRUE(close(xs.grad(), xr.grad().narrow(0, offset, mine) * n, 1e-10));
      },
      torchrun(n));
}

INSTANTIATE_TEST_SUITE_P(Ranks, SyncBatchNormRanks, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "ranks";
                         });

// Inputs whose mean is 1e4 times their spread: after the first step the sums are shifted by the previous
// global mean, so float64 keeps ~1e-12 (unshifted sums of squares would lose eight digits more).
TEST(SyncBatchNormRanksPrecision, LargeMeansKeepFloat64Precision) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        const std::vector<std::int64_t> sizes{3, 5};
        const auto offset = fl::rank() == 0 ? 0 : 3;
        const auto mine = sizes[static_cast<std::size_t>(fl::rank())];
        torch::manual_seed(9);
        nn::BatchNorm2d ref(nn::BatchNormOptions(3).momentum(0.5));
        fl::SyncBatchNorm sync(fl::SyncBatchNormOptions{.num_features = 3, .momentum = 0.5});
        ref->to(torch::kDouble);
        sync->to(torch::kDouble);
        for (int step = 0; step < 3; ++step) {
          const auto x = torch::randn({8, 3, 2, 2}, torch::kDouble) + 1e4 + step;
          const auto yr = ref->forward(x);
          const auto ys = sync->forward(x.narrow(0, offset, mine));
          EXPECT_TRUE(close(ys, yr.narrow(0, offset, mine), step == 0 ? 1e-6 : 1e-10)) << "step " << step;
          EXPECT_TRUE(close(sync->running_mean, ref->running_mean, 1e-14)) << "step " << step;
        }
      },
      torchrun(2));
}

TEST(SyncBatchNormRanksErrors, OneValuePerChannelOverAllRanksFailsOnEveryRank) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        fl::SyncBatchNorm sync(3);
        const auto msg = message_of([&] { sync->forward(torch::randn({fl::rank() == 0 ? 1 : 0, 3})); });
        EXPECT_NE(msg.find("expected more than 1 value per channel when training, got 1 over the 2 ranks"),
                  std::string::npos)
            << msg;
        // The group still works afterwards: every rank failed at the same point.
        const auto y = sync->forward(torch::randn({2, 3}));
        EXPECT_EQ(y.size(0), 2);
      },
      torchrun(2));
}

// ---- convert_sync_batchnorm -------------------------------------------------------------------------------

namespace {

// A custom module with a BatchNorm1d child it calls by name, so that conversion can swap it.
struct HeadImpl : nn::Module {
  HeadImpl() : fc(register_module("fc", nn::Linear(16, 6))) {
    register_module("norm", nn::BatchNorm1d(nn::BatchNormOptions(6).eps(1e-3).momentum(std::nullopt)));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fl::models::batch_norm_forward(*named_children()["norm"], fc->forward(x));
  }
  nn::Linear fc;
};
TORCH_MODULE(Head);

// Conv, BatchNorm2d (no affine), ReLU, pooling, Head: BatchNorms directly in a Sequential and in a custom child.
nn::Sequential make_model() {
  torch::manual_seed(3);
  nn::Sequential model(nn::Conv2d(nn::Conv2dOptions(3, 4, 3).padding(1)),
                       nn::BatchNorm2d(nn::BatchNormOptions(4).affine(false).momentum(0.3)), nn::ReLU(),
                       nn::AdaptiveAvgPool2d(2), nn::Flatten(), Head());
  // Values a fresh BatchNorm would not have, to see them carried over.
  {
    torch::NoGradGuard no_grad;
    for (auto& p : model->parameters()) p.uniform_(-1, 1);
  }
  torch::NoGradGuard no_grad;
  for (auto& b : model->buffers()) {
    if (b.is_floating_point()) b.uniform_(0.5, 1.5);
  }
  return model;
}

int count_modules(nn::Module& model, bool sync) {
  int n = 0;
  for (const auto& m : model.modules()) {
    const bool is_sync = dynamic_cast<fl::SyncBatchNormImpl*>(m.get()) != nullptr;
    const bool is_bn = dynamic_cast<nn::BatchNorm1dImpl*>(m.get()) || dynamic_cast<nn::BatchNorm2dImpl*>(m.get()) ||
                       dynamic_cast<nn::BatchNorm3dImpl*>(m.get());
    n += sync ? is_sync : is_bn;
  }
  return n;
}

}  // namespace

TEST(SyncBatchNormConvert, NestedModelKeepsNamesValuesTensorsAndForward) {
  auto model = make_model();
  auto reference = make_model();
  model->ptr<HeadImpl>(5)->named_children()["norm"]->eval();  // a mode to carry over
  reference->ptr<HeadImpl>(5)->named_children()["norm"]->eval();
  const auto params = model->named_parameters();
  const auto buffers = model->named_buffers();

  fl::convert_sync_batchnorm(*model);

  EXPECT_EQ(count_modules(*model, false), 0);
  EXPECT_EQ(count_modules(*model, true), 2);
  // Same names, and the very same tensors (an optimizer made before still holds the parameters).
  EXPECT_EQ(model->named_parameters().keys(), params.keys());
  EXPECT_EQ(model->named_buffers().keys(), buffers.keys());
  for (const auto& p : params) EXPECT_TRUE(model->named_parameters()[p.key()].is_same(p.value())) << p.key();
  for (const auto& b : buffers) EXPECT_TRUE(model->named_buffers()[b.key()].is_same(b.value())) << b.key();
  // The Sequential runs the new module (its AnyModule entry was swapped, not only the registration).
  auto bn2d = model->ptr<fl::SyncBatchNormImpl>(1);
  EXPECT_FALSE(bn2d->options.affine);
  EXPECT_FALSE(bn2d->weight.defined());
  EXPECT_EQ(bn2d->options.momentum, 0.3);
  EXPECT_TRUE(bn2d->is_training());
  auto head_norm = std::dynamic_pointer_cast<fl::SyncBatchNormImpl>(model->ptr<HeadImpl>(5)->named_children()["norm"]);
  ASSERT_TRUE(head_norm);
  EXPECT_EQ(head_norm->options.eps, 1e-3);
  EXPECT_FALSE(head_norm->options.momentum.has_value());
  EXPECT_FALSE(head_norm->is_training());

  // On one process the converted model computes exactly what the original does, in train and eval.
  torch::manual_seed(8);
  const auto x = torch::randn({5, 3, 4, 4});
  auto xs = x.clone().requires_grad_(), xr = x.clone().requires_grad_();
  const auto ys = model->forward(xs), yr = reference->forward(xr);
  EXPECT_TRUE(torch::equal(ys, yr));
  ys.sum().backward();
  yr.sum().backward();
  EXPECT_TRUE(torch::equal(xs.grad(), xr.grad()));
  for (const auto& b : reference->named_buffers())
    EXPECT_TRUE(torch::equal(model->named_buffers()[b.key()], b.value()));
  model->eval();
  reference->eval();
  EXPECT_TRUE(torch::equal(model->forward(x), reference->forward(x)));

  // Checkpoints interchange: the converted model's archive loads into the original architecture.
  std::stringstream stream;
  torch::save(model, stream);
  auto fresh = make_model();
  {
    torch::NoGradGuard no_grad;
    for (auto& p : fresh->parameters()) p.zero_();
  }
  torch::load(fresh, stream);
  for (const auto& p : model->named_parameters())
    EXPECT_TRUE(torch::equal(fresh->named_parameters()[p.key()], p.value()));
}

TEST(SyncBatchNormConvert, ModuleListModuleDictAndSharedModules) {
  struct Blocks : nn::Module {
    Blocks() {
      nn::BatchNorm1d shared(3);
      list = register_module("list", nn::ModuleList(nn::BatchNorm1d(3), nn::Linear(3, 3), shared));
      dict = register_module("dict", nn::ModuleDict(std::vector<std::pair<std::string, std::shared_ptr<nn::Module>>>{
                                         {"a", nn::BatchNorm3d(2).ptr()}, {"b", shared.ptr()}}));
    }
    nn::ModuleList list{nullptr};
    nn::ModuleDict dict{nullptr};
  };
  auto model = std::make_shared<Blocks>();
  const auto names = model->named_parameters().keys();
  fl::convert_sync_batchnorm(*model);
  EXPECT_EQ(count_modules(*model, false), 0);
  EXPECT_TRUE(model->list->ptr<fl::SyncBatchNormImpl>(0));
  EXPECT_TRUE(model->list->ptr<fl::SyncBatchNormImpl>(2));
  EXPECT_TRUE(std::dynamic_pointer_cast<fl::SyncBatchNormImpl>((*model->dict)["a"]));
  // A BatchNorm registered twice becomes one SyncBatchNorm registered twice.
  EXPECT_EQ(model->list->ptr(2), (*model->dict)["b"]);
  EXPECT_EQ(model->named_children()["list"]->named_children()["2"], model->list->ptr(2));
  EXPECT_EQ(model->named_parameters().keys(), names);
  EXPECT_EQ(fl::models::batch_norm_forward(*(*model->dict)["a"], torch::randn({2, 2, 1, 1, 2})).size(1), 2);
}

TEST(SyncBatchNormConvert, ABatchNormAlsoHeldByAMemberIsRefusedAndNothingChanges) {
  struct WithMember : nn::Module {
    WithMember() : bn(register_module("bn", nn::BatchNorm1d(3))) {}
    at::Tensor forward(const at::Tensor& x) { return bn->forward(x); }
    nn::BatchNorm1d bn;
  };
  nn::Sequential model(nn::BatchNorm2d(2));
  model->push_back("inner", std::make_shared<WithMember>());
  const auto msg = message_of([&] { fl::convert_sync_batchnorm(*model); });
  EXPECT_NE(msg.find("nothing converted"), std::string::npos) << msg;
  EXPECT_NE(msg.find("'inner.bn' (1 more reference(s), e.g. a member of "), std::string::npos) << msg;
  EXPECT_NE(msg.find("WithMember)"), std::string::npos) << msg;
  EXPECT_NE(msg.find("Declare such members as fastlearn::SyncBatchNorm"), std::string::npos) << msg;
  EXPECT_EQ(msg.find("'0'"), std::string::npos) << "the Sequential's own BatchNorm is fine: " << msg;
  EXPECT_EQ(count_modules(*model, true), 0);
  EXPECT_TRUE(std::dynamic_pointer_cast<nn::BatchNorm2dImpl>(model->ptr(0)));

  nn::BatchNorm2d root(2);
  EXPECT_THROW(fl::convert_sync_batchnorm(*root), fl::ConfigError);
  EXPECT_THROW(fl::models::batch_norm_forward(*nn::Linear(2, 2), torch::zeros({1, 2})), fl::ConfigError);
  EXPECT_THROW(fl::SyncBatchNormImpl::from_batch_norm(*nn::Linear(2, 2)), fl::ConfigError);
}

// The converted model on 2 ranks (batches of 3 and 5) computes what the original computes on all 8 items.
TEST(SyncBatchNormConvert, ConvertedModelOnTwoRanksMatchesTheOriginalOnTheWholeBatch) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        const std::int64_t offset = fl::rank() == 0 ? 0 : 3, mine = fl::rank() == 0 ? 3 : 5;
        auto model = make_model();
        auto reference = make_model();
        fl::convert_sync_batchnorm(*model);
        torch::manual_seed(21);
        const auto x = torch::randn({8, 3, 4, 4}), g = torch::randn({8, 6});
        const auto yr = reference->forward(x);
        ((yr * g).sum() / 8).backward();
        const auto y = model->forward(x.narrow(0, offset, mine));
        ((y * g.narrow(0, offset, mine)).sum() / 8).backward();
        EXPECT_TRUE(close(y, yr.narrow(0, offset, mine), 1e-5));
        // The biases right before a BatchNorm have a zero gradient (the normalization removes any shift), so
        // their round-off is measured against the largest gradient of the model.
        double largest = 0;
        for (const auto& p : reference->parameters()) largest = std::max(largest, p.grad().abs().max().item<double>());
        for (const auto& p : reference->named_parameters()) {
          auto grad = model->named_parameters()[p.key()].grad().clone();
          fl::all_reduce(grad);
          EXPECT_TRUE(close(grad, p.value().grad(), 1e-5, largest)) << p.key();
        }
        for (const auto& b : reference->named_buffers()) {
          EXPECT_TRUE(close(model->named_buffers()[b.key()], b.value(), 1e-5)) << b.key();
        }
      },
      torchrun(2));
}
