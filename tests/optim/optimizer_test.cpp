// Optimizers: parity with LibTorch's torch::optim over sequences of random gradients (fused and _foreach_
// paths), decoupled weight decay by hand, hypers per group and between steps, checkpoint round trips.
#include <fastlearn/core/error.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/optimizer.h>
#include <fastlearn/optim/sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <ATen/CPUGeneratorImpl.h>

#include <functional>
#include <string>
#include <vector>

namespace fl = fastlearn;

namespace {

constexpr int kSteps = 12;
constexpr double kRtol = 1e-6;

using Params = std::vector<at::Tensor>;

// Parameters of awkward sizes (vector tails, a scalar-like bias) and one non-contiguous (transposed) tensor,
// which the fused path cannot take, so every group mixes both code paths.
Params make_params(at::ScalarType dtype, std::uint64_t seed = 0) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto opts = at::TensorOptions().dtype(dtype);
  Params ps{at::randn({7, 5}, gen, opts), at::randn({5}, gen, opts),        at::randn({3, 4, 2}, gen, opts),
            at::randn({37}, gen, opts),   at::randn({6, 4}, gen, opts).t(), at::randn({1}, gen, opts)};
  for (auto& p : ps) p = p.detach().requires_grad_(true);
  return ps;
}

Params copy(const Params& ps) {
  Params out;
  for (const auto& p : ps) out.push_back(p.detach().clone().requires_grad_(true));
  return out;
}

// The gradients of step `step`: a fixed random draw per step; `skip(step, i)` leaves parameter i without one.
using Skip = std::function<bool(int step, std::size_t i)>;
void set_grads(Params& ps, int step, const Skip& skip = nullptr) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(1000 + step);
  for (std::size_t i = 0; i < ps.size(); ++i) {
    auto g = at::randn(ps[i].sizes(), gen, ps[i].options().requires_grad(false));
    ps[i].mutable_grad() = (skip && skip(step, i)) ? at::Tensor() : g;
  }
}

// Per element |ours - ref| <= rtol * |ref|, with a floor of rtol * 1e-2 for values that cross zero.
void expect_close(const Params& ours, const Params& ref, const std::string& what, double rtol = kRtol) {
  for (std::size_t i = 0; i < ours.size(); ++i) {
    const auto o = ours[i].detach().to(at::kDouble), r = ref[i].detach().to(at::kDouble);
    const auto err = (o - r).abs();
    const auto bad = err.gt(r.abs() * rtol + rtol * 1e-2);
    EXPECT_FALSE(bad.any().item<bool>()) << what << ": parameter " << i << " differs from torch::optim, max abs error "
                                         << err.max().item<double>() << "\nours " << o << "\nref " << r;
  }
}

void expect_equal(const Params& a, const Params& b, const std::string& what) {
  for (std::size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(torch::equal(a[i], b[i])) << what << ": parameter " << i << " is not bit-identical";
}

std::unique_ptr<fl::Optimizer> make(const fl::OptFunc& f, const Params& ps, double lr) { return f({ps}, lr); }

// Runs kSteps of both optimizers over the same gradients and compares the parameters after every step.
void run_parity(const fl::OptFunc& ours_fn,
                const std::function<std::unique_ptr<torch::optim::Optimizer>(Params)>& ref_fn, double lr,
                at::ScalarType dtype, const std::string& what, const Skip& skip = nullptr) {
  auto ours_p = make_params(dtype), ref_p = copy(ours_p);
  auto ours = make(ours_fn, ours_p, lr);
  auto ref = ref_fn(ref_p);
  for (int s = 0; s < kSteps; ++s) {
    set_grads(ours_p, s, skip);
    set_grads(ref_p, s, skip);
    ours->step();
    ref->step();
    expect_close(ours_p, ref_p, what + " step " + std::to_string(s));
  }
  EXPECT_EQ(ours->step_count(), kSteps);
}

// Parity tests run on the fused CPU path and on the _foreach_ path, in float32 and float64.
struct ParityCase {
  bool fused;
  at::ScalarType dtype;
};

class Parity : public ::testing::TestWithParam<ParityCase> {
 protected:
  std::string tag() const {
    return std::string(GetParam().fused ? "fused " : "foreach ") + c10::toString(GetParam().dtype);
  }
};

using torch::optim::SGDOptions;

TEST_P(Parity, PlainSGD) {
  run_parity(
      fl::SGD({.fused = GetParam().fused}),
      [](Params p) { return std::make_unique<torch::optim::SGD>(p, SGDOptions(0.1)); }, 0.1, GetParam().dtype, tag());
}

TEST_P(Parity, SGDMomentum) {
  run_parity(
      fl::SGD({.mom = 0.9, .fused = GetParam().fused}),
      [](Params p) { return std::make_unique<torch::optim::SGD>(p, SGDOptions(0.05).momentum(0.9)); }, 0.05,
      GetParam().dtype, tag());
}

TEST_P(Parity, SGDNesterov) {
  run_parity(
      fl::SGD({.mom = 0.9, .nesterov = true, .fused = GetParam().fused}),
      [](Params p) { return std::make_unique<torch::optim::SGD>(p, SGDOptions(0.05).momentum(0.9).nesterov(true)); },
      0.05, GetParam().dtype, tag());
}

TEST_P(Parity, SGDL2WeightDecayWithMomentum) {
  run_parity(
      fl::SGD({.mom = 0.8, .wd = 0.1, .decouple_wd = false, .fused = GetParam().fused}),
      [](Params p) { return std::make_unique<torch::optim::SGD>(p, SGDOptions(0.05).momentum(0.8).weight_decay(0.1)); },
      0.05, GetParam().dtype, tag());
  run_parity(
      fl::SGD({.wd = 0.1, .decouple_wd = false, .fused = GetParam().fused}),
      [](Params p) { return std::make_unique<torch::optim::SGD>(p, SGDOptions(0.05).weight_decay(0.1)); }, 0.05,
      GetParam().dtype, tag() + " no momentum");
}

TEST_P(Parity, AdamL2WeightDecay) {
  run_parity(
      fl::Adam({.mom = 0.9, .sqr_mom = 0.99, .eps = 1e-5, .wd = 0.01, .decouple_wd = false, .fused = GetParam().fused}),
      [](Params p) {
        return std::make_unique<torch::optim::Adam>(
            p, torch::optim::AdamOptions(1e-2).betas({0.9, 0.99}).eps(1e-5).weight_decay(0.01));
      },
      1e-2, GetParam().dtype, tag());
}

TEST_P(Parity, AdamW) {
  run_parity(
      fl::AdamW({.mom = 0.9, .sqr_mom = 0.999, .eps = 1e-8, .wd = 0.01, .fused = GetParam().fused}),
      [](Params p) {
        return std::make_unique<torch::optim::AdamW>(
            p, torch::optim::AdamWOptions(1e-2).betas({0.9, 0.999}).eps(1e-8).weight_decay(0.01));
      },
      1e-2, GetParam().dtype, tag());
}

TEST_P(Parity, FastaiAdamIsAdamWWithFastaiDefaults) {
  run_parity(
      fl::Adam({.fused = GetParam().fused}),
      [](Params p) {
        return std::make_unique<torch::optim::AdamW>(
            p, torch::optim::AdamWOptions(3e-3).betas({0.9, 0.99}).eps(1e-5).weight_decay(0.01));
      },
      3e-3, GetParam().dtype, tag());
}

// Parameters that miss gradients on some steps are skipped, and their per-parameter step counts (bias
// correction, first momentum step) stay their own, as in torch::optim.
TEST_P(Parity, ParametersWithoutGradientsOnSomeSteps) {
  const Skip skip = [](int step, std::size_t i) { return (i == 1 && step % 3 != 2) || (i == 4 && step < 5); };
  run_parity(
      fl::SGD({.mom = 0.9, .fused = GetParam().fused}),
      [](Params p) { return std::make_unique<torch::optim::SGD>(p, SGDOptions(0.05).momentum(0.9)); }, 0.05,
      GetParam().dtype, tag() + " SGD", skip);
  // Designated initializers start from AdamOptions' (fastai's) defaults, so torch's are spelled out.
  run_parity(
      fl::AdamW({.mom = 0.9, .sqr_mom = 0.999, .eps = 1e-8, .wd = 0.01, .fused = GetParam().fused}),
      [](Params p) {
        return std::make_unique<torch::optim::AdamW>(p, torch::optim::AdamWOptions(1e-2).weight_decay(0.01));
      },
      1e-2, GetParam().dtype, tag() + " AdamW", skip);
}

// Hypers changed between steps take effect, per group: the reference is torch::optim::Adam with two groups
// whose options are changed the same way.
TEST_P(Parity, HypersChangedBetweenStepsPerGroup) {
  auto ours_p = make_params(GetParam().dtype), ref_p = copy(ours_p);
  const Params a(ours_p.begin(), ours_p.begin() + 3), b(ours_p.begin() + 3, ours_p.end());
  auto ours = fl::Adam({.wd = 0.0, .fused = GetParam().fused})({a, b}, 1e-2);
  using torch::optim::AdamOptions;
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(Params(ref_p.begin(), ref_p.begin() + 3),
                      std::make_unique<AdamOptions>(AdamOptions(1e-2).betas({0.9, 0.99}).eps(1e-5)));
  groups.emplace_back(Params(ref_p.begin() + 3, ref_p.end()),
                      std::make_unique<AdamOptions>(AdamOptions(1e-2).betas({0.9, 0.99}).eps(1e-5)));
  torch::optim::Adam ref(groups, AdamOptions(1e-2));
  for (int s = 0; s < kSteps; ++s) {
    // A schedule: per-group lrs, a momentum that moves, eps and sqr_mom changed midway.
    const double lr0 = 1e-2 * (1 + s), lr1 = 1e-3 * (kSteps - s), mom = 0.95 - 0.01 * s;
    ours->set_hyper("lr", std::vector<double>{lr0, lr1});
    ours->set_hyper("mom", mom);
    if (s == 6) {
      ours->set_hyper("eps", std::vector<double>{1e-3, 1e-8});
      ours->set_hyper("sqr_mom", 0.999);
    }
    for (std::size_t g = 0; g < 2; ++g) {
      auto& o = static_cast<AdamOptions&>(ref.param_groups()[g].options());
      o.lr(g == 0 ? lr0 : lr1);
      o.betas({mom, s >= 6 ? 0.999 : 0.99});
      if (s == 6) o.eps(g == 0 ? 1e-3 : 1e-8);
    }
    set_grads(ours_p, s);
    set_grads(ref_p, s);
    ours->step();
    ref.step();
    expect_close(ours_p, ref_p, tag() + " step " + std::to_string(s));
  }
  EXPECT_DOUBLE_EQ(ours->hyper("lr", 1), 1e-3);
  EXPECT_DOUBLE_EQ(ours->hyper("eps", 0), 1e-3);
}

INSTANTIATE_TEST_SUITE_P(Optimizer, Parity,
                         ::testing::Values(ParityCase{true, at::kFloat}, ParityCase{false, at::kFloat},
                                           ParityCase{true, at::kDouble}, ParityCase{false, at::kDouble}),
                         [](const ::testing::TestParamInfo<ParityCase>& param_info) {
                           return std::string(param_info.param.fused ? "Fused" : "Foreach") +
                                  (param_info.param.dtype == at::kFloat ? "Float" : "Double");
                         });

// fastai's true weight decay for SGD with momentum, by hand in double precision:
// p *= 1 - lr*wd; buf = mom*buf + g (the first buf is g); p -= lr*buf.
TEST(Optimizer, DecoupledSGDWeightDecayMatchesTheFormula) {
  for (const bool fused : {true, false}) {
    auto ps = make_params(at::kDouble);
    const double lr = 0.05, wd = 0.1, mom = 0.9;
    std::vector<at::Tensor> expected, bufs(ps.size());
    for (const auto& p : ps) expected.push_back(p.detach().clone());
    auto opt = make(fl::SGD({.mom = mom, .wd = wd, .fused = fused}), ps, lr);
    for (int s = 0; s < kSteps; ++s) {
      set_grads(ps, s);
      for (std::size_t i = 0; i < ps.size(); ++i) {
        const auto g = ps[i].grad();
        bufs[i] = s == 0 ? g.clone() : bufs[i] * mom + g;
        expected[i] = expected[i] * (1 - lr * wd) - lr * bufs[i];
      }
      opt->step();
      expect_close(ps, expected, fused ? "fused" : "foreach", 1e-12);
    }
  }
}

TEST(Optimizer, PerGroupLearningRates) {
  auto ps = make_params(at::kFloat);
  const auto before = copy(ps);
  auto opt = fl::SGD()({Params{ps[0], ps[1]}, Params{ps[2]}}, 0.1);
  opt->set_hyper("lr", std::vector<double>{0.1, 0.5});
  set_grads(ps, 0);
  opt->step();
  EXPECT_TRUE(torch::allclose(ps[0], before[0] - 0.1 * ps[0].grad()));
  EXPECT_TRUE(torch::allclose(ps[1], before[1] - 0.1 * ps[1].grad()));
  EXPECT_TRUE(torch::allclose(ps[2], before[2] - 0.5 * ps[2].grad()));
  EXPECT_TRUE(torch::equal(ps[3], before[3])) << "a parameter in no group changed";
  EXPECT_EQ(opt->n_groups(), 2u);
}

TEST(Optimizer, ParametersWithoutGradUntouchedAndStateless) {
  auto ps = make_params(at::kFloat);
  const auto before = copy(ps);
  auto opt = make(fl::Adam(), ps, 1e-2);
  for (int s = 0; s < 3; ++s) {
    set_grads(ps, s, [](int, std::size_t i) { return i == 2; });
    opt->step();
  }
  EXPECT_TRUE(torch::equal(ps[2], before[2]));
  EXPECT_FALSE(torch::equal(ps[0], before[0]));
  for (const auto& [name, t] : opt->state_tensors()) EXPECT_NE(name.rfind("0.2.", 0), 0u) << name;
  EXPECT_EQ(opt->state_tensors().size(), 2 * (ps.size() - 1));
}

TEST(Optimizer, SGDWithoutMomentumIgnoresMomLater) {
  auto ps = make_params(at::kFloat);
  const auto before = copy(ps);
  auto opt = make(fl::SGD(), ps, 0.1);
  opt->set_hyper("mom", 0.9);
  for (int s = 0; s < 2; ++s) {
    set_grads(ps, 0);
    opt->step();
  }
  for (std::size_t i = 0; i < ps.size(); ++i)
    EXPECT_TRUE(torch::allclose(ps[i], before[i] - 0.2 * ps[i].grad())) << "parameter " << i;
  EXPECT_TRUE(opt->state_tensors().empty());
}

TEST(Optimizer, ZeroGrad) {
  auto ps = make_params(at::kFloat);
  auto opt = make(fl::SGD(), ps, 0.1);
  set_grads(ps, 0);
  opt->zero_grad(/*set_to_none=*/false);
  for (const auto& p : ps) {
    ASSERT_TRUE(p.grad().defined());
    EXPECT_EQ(p.grad().abs().sum().item<double>(), 0.0);
  }
  opt->zero_grad();
  for (const auto& p : ps) EXPECT_FALSE(p.grad().defined());
  const auto before = copy(ps);
  opt->step();  // nothing has a gradient: nothing moves, the step still counts
  expect_equal(ps, before, "step without gradients");
  EXPECT_EQ(opt->step_count(), 1);
}

TEST(Optimizer, HyperErrorsNameTheHyperAndGroup) {
  auto ps = make_params(at::kFloat);
  auto opt = fl::Adam()({Params{ps[0]}, Params{ps[1]}}, 1e-3);
  EXPECT_DOUBLE_EQ(opt->hyper("lr", 1), 1e-3);
  EXPECT_DOUBLE_EQ(opt->hyper("sqr_mom", 0), 0.99);
  try {
    opt->hyper("momentum", 1);
    FAIL() << "no ConfigError";
  } catch (const fl::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("'momentum'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("group 1"), std::string::npos) << e.what();
  }
  EXPECT_THROW(opt->hyper("lr", 2), fl::ConfigError);
  EXPECT_THROW(opt->set_hyper("lr", std::vector<double>{1, 2, 3}), fl::ConfigError);
  EXPECT_THROW(opt->set_hyper("beta1", 0.9), fl::ConfigError);
  EXPECT_THROW(opt->set_hyper("lr", std::nan("")), fl::ConfigError);
  EXPECT_DOUBLE_EQ(opt->hyper("lr", 0), 1e-3) << "a rejected set_hyper changed a value";
}

TEST(Optimizer, BadConstructionIsAConfigError) {
  auto ps = make_params(at::kFloat);
  EXPECT_THROW(fl::SGD()({Params{ps[0]}, Params{ps[0]}}, 0.1), fl::ConfigError);  // one parameter, two groups
  EXPECT_THROW(fl::SGD()({}, 0.1), fl::ConfigError);
  EXPECT_THROW(fl::SGD()({Params{at::zeros({3}, at::kLong)}}, 0.1), fl::ConfigError);
  EXPECT_THROW(fl::SGD()({ps}, -1.0), fl::ConfigError);
  EXPECT_THROW(fl::SGD({.nesterov = true}), fl::ConfigError);
  EXPECT_THROW(fl::Adam({.mom = 1.0}), fl::ConfigError);
  EXPECT_THROW(fl::Adam({.sqr_mom = -0.1}), fl::ConfigError);
  EXPECT_NO_THROW(fl::SGD()({Params{}}, 0.1)->step());  // an empty group is fine
}

TEST(Optimizer, ChangedGroupsAndMisshapenGradientsAreConfigErrors) {
  auto ps = make_params(at::kFloat);
  auto opt = fl::SGD()({Params{ps[0]}}, 0.1);
  auto bad = at::randn({5, 7});
  ps[0].mutable_grad() = bad;
  EXPECT_THROW(opt->step(), fl::ConfigError);
  set_grads(ps, 0);
  opt->param_groups()[0].params.push_back(ps[1]);
  EXPECT_THROW(opt->step(), fl::ConfigError);
  opt->param_groups()[0].params.pop_back();
  opt->param_groups().push_back({{ps[1]}, {{"lr", 0.1}}});
  EXPECT_THROW(opt->step(), fl::ConfigError);
  opt->param_groups().pop_back();
  EXPECT_NO_THROW(opt->step());
}

TEST(Optimizer, SparseGradientsAreRejectedWithoutSideEffects) {
  auto p = at::randn({4, 3}).requires_grad_(true);
  auto opt = fl::Adam()({Params{p}}, 1e-2);
  p.mutable_grad() = at::randn({4, 3}).to_sparse();
  EXPECT_THROW(opt->step(), fl::ConfigError);
  EXPECT_EQ(opt->step_count(), 0);
  EXPECT_TRUE(opt->state_tensors().empty());
}

// ------------------------------------------------------------------------------------------------------------
// Checkpoints

fl::NamedTensors clone_all(const fl::NamedTensors& ts) {
  fl::NamedTensors out;
  for (const auto& [n, t] : ts) out.emplace_back(n, t.clone());
  return out;
}

void check_round_trip(const fl::OptFunc& f, double lr) {
  auto a_p = make_params(at::kFloat);
  auto a = f({Params(a_p.begin(), a_p.begin() + 2), Params(a_p.begin() + 2, a_p.end())}, lr);
  a->set_hyper("lr", std::vector<double>{lr, lr / 3});
  for (int s = 0; s < 5; ++s) {
    set_grads(a_p, s, [](int step, std::size_t i) { return i == 3 && step < 4; });
    a->step();
  }
  const auto tensors = clone_all(a->state_tensors());
  const auto json = a->state_json();
  auto b_p = copy(a_p);
  auto b = f({Params(b_p.begin(), b_p.begin() + 2), Params(b_p.begin() + 2, b_p.end())}, 1.0);
  b->load_state(tensors, json);
  EXPECT_EQ(b->step_count(), 5);
  EXPECT_DOUBLE_EQ(b->hyper("lr", 1), lr / 3);
  EXPECT_EQ(b->state_json(), json);
  for (int s = 5; s < 10; ++s) {
    set_grads(a_p, s);
    set_grads(b_p, s);
    a->step();
    b->step();
    expect_equal(b_p, a_p, "continuation after load_state, step " + std::to_string(s));
  }
}

TEST(OptimizerCheckpoint, RoundTripGivesIdenticalContinuation) {
  check_round_trip(fl::SGD({.mom = 0.9, .nesterov = true}), 0.05);
  check_round_trip(fl::Adam(), 1e-2);
  check_round_trip(fl::AdamW({.fused = false}), 1e-2);
}

// A run resumed from a checkpoint loads the state while the model is still contiguous, then ChannelsLast
// restrides the model: the steps after must be the bits of a run that was channels-last all along.
void check_state_follows_a_restrided_parameter(const fl::OptFunc& f, const std::string& what) {
  auto gen = at::detail::createCPUGenerator(11);
  const auto start = at::randn({8, 3, 3, 3}, gen);
  std::vector<at::Tensor> grads;
  for (int s = 0; s < 4; ++s) grads.push_back(at::randn({8, 3, 3, 3}, gen).contiguous(at::MemoryFormat::ChannelsLast));
  auto all_along = start.contiguous(at::MemoryFormat::ChannelsLast).requires_grad_();
  auto a = f({{all_along}}, 1e-2);
  for (int s = 0; s < 4; ++s) {
    all_along.mutable_grad() = grads[s].clone();
    a->step();
    if (s != 1) continue;
    // After 2 steps: a checkpoint, loaded by a contiguous copy of the parameter, which is then restrided.
    const auto tensors = clone_all(a->state_tensors());
    auto resumed = all_along.detach().contiguous().requires_grad_();
    auto b = f({{resumed}}, 1e-2);
    b->load_state(tensors, a->state_json());
    resumed.set_data(resumed.detach().contiguous(at::MemoryFormat::ChannelsLast));
    for (int t = 2; t < 4; ++t) {
      resumed.mutable_grad() = grads[t].clone();
      b->step();
    }
    all_along.mutable_grad() = grads[2].clone();
    a->step();
    all_along.mutable_grad() = grads[3].clone();
    a->step();
    EXPECT_TRUE(at::equal(resumed, all_along))
        << what << ": largest difference " << (resumed - all_along).abs().max().item<float>();
    EXPECT_TRUE(resumed.is_contiguous(at::MemoryFormat::ChannelsLast)) << what;
    for (const auto& [name, t] : b->state_tensors())
      EXPECT_TRUE(t.dim() != 4 || t.is_contiguous(at::MemoryFormat::ChannelsLast)) << what << ": " << name;
    return;
  }
}

TEST(OptimizerCheckpoint, StateFollowsAParameterRestridedAfterLoading) {
  check_state_follows_a_restrided_parameter(fl::Adam(), "Adam");
  check_state_follows_a_restrided_parameter(fl::Adam({.wd = 0.01, .decouple_wd = false}), "Adam with L2");
  check_state_follows_a_restrided_parameter(fl::SGD({.mom = 0.9}), "SGD with momentum");
}

TEST(OptimizerCheckpoint, StateTensorNames) {
  auto ps = make_params(at::kFloat);
  auto opt = fl::Adam()({Params{ps[0]}, Params{ps[1], ps[2]}}, 1e-2);
  set_grads(ps, 0, [](int, std::size_t i) { return i == 1; });
  opt->step();
  std::vector<std::string> names;
  for (const auto& [n, t] : opt->state_tensors()) names.push_back(n);
  EXPECT_EQ(names, (std::vector<std::string>{"0.0.exp_avg", "0.0.exp_avg_sq", "1.1.exp_avg", "1.1.exp_avg_sq"}));
}

// Expects load_state to throw a CheckpointError mentioning `needle` and to leave the optimizer unchanged.
void expect_load_error(fl::Optimizer& opt, const fl::NamedTensors& tensors, const std::string& json,
                       const std::string& needle) {
  const auto before = opt.state_json();
  try {
    opt.load_state(tensors, json);
    ADD_FAILURE() << "no CheckpointError for " << needle;
  } catch (const fl::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
  EXPECT_EQ(opt.state_json(), before) << "a failed load changed the optimizer";
}

TEST(OptimizerCheckpoint, LoadErrorsNameTheTensor) {
  auto ps = make_params(at::kFloat);
  auto a = make(fl::Adam(), ps, 1e-2);
  set_grads(ps, 0);
  a->step();
  const auto good = clone_all(a->state_tensors());
  const auto json = a->state_json();
  auto b = make(fl::Adam(), copy(ps), 1e-2);

  auto missing = good;
  missing.erase(missing.begin() + 3);  // "0.1.exp_avg_sq"
  expect_load_error(*b, missing, json, "'" + good[3].first + "'");

  auto extra = good;
  extra.emplace_back("0.2.momentum_buffer", at::zeros({3, 4, 2}));
  expect_load_error(*b, extra, json, "'0.2.momentum_buffer'");
  auto out_of_range = good;
  out_of_range.emplace_back("0.99.exp_avg", at::zeros({1}));
  expect_load_error(*b, out_of_range, json, "'0.99.exp_avg'");

  auto bad_shape = good;
  bad_shape[0].second = at::zeros({5, 7});
  expect_load_error(*b, bad_shape, json, "'0.0.exp_avg' has shape [5, 7]");

  auto bad_dtype = good;
  bad_dtype[1].second = bad_dtype[1].second.to(at::kDouble);
  expect_load_error(*b, bad_dtype, json, "'0.0.exp_avg_sq' has dtype Double");

  expect_load_error(*b, good, "{not json", "does not parse");
  auto sgd = make(fl::SGD({.mom = 0.9}), copy(ps), 0.1);
  expect_load_error(*sgd, good, json, "this optimizer is SGD");
  auto regrouped = fl::Adam()({Params{ps[0]}, Params(ps.begin() + 1, ps.end())}, 1e-2);
  expect_load_error(*regrouped, good, json, "1 parameter groups, this optimizer 2");

  EXPECT_NO_THROW(b->load_state(good, json));
}

TEST(Optimizer, DeterministicAcrossRuns) {
  for (const bool fused : {true, false}) {
    Params runs[2];
    for (auto& ps : runs) {
      ps = make_params(at::kFloat);
      auto opt = make(fl::Adam({.fused = fused}), ps, 1e-2);
      for (int s = 0; s < kSteps; ++s) {
        set_grads(ps, s);
        opt->step();
      }
    }
    expect_equal(runs[0], runs[1], fused ? "fused" : "foreach");
  }
}

// Parameters exempt from weight decay (fastai's do_wd = False) step exactly as with "wd" 0, the others exactly as
// without exemptions, on the fused and the _foreach_ paths, for decoupled and L2 decay.
TEST(Optimizer, ExemptParametersStepAsWithoutWeightDecayAndTheOthersAsBefore) {
  const std::vector<std::pair<std::string, fl::OptFunc>> cases{
      {"SGD decoupled", fl::SGD({.mom = 0.9, .wd = 0.1})},
      {"SGD L2", fl::SGD({.mom = 0.9, .wd = 0.1, .decouple_wd = false})},
      {"AdamW", fl::Adam({.wd = 0.1})},
      {"Adam L2", fl::Adam({.wd = 0.1, .decouple_wd = false})},
      {"Adam L2 foreach", fl::Adam({.wd = 0.1, .decouple_wd = false, .fused = false})}};
  for (const auto& [name, f] : cases) {
    auto exempted = make_params(at::kFloat), without_wd = copy(exempted), as_before = copy(exempted);
    auto opt = make(f, exempted, 1e-2), opt_without = make(f, without_wd, 1e-2), opt_before = make(f, as_before, 1e-2);
    opt->exempt_from_weight_decay({exempted[1], exempted[4], at::zeros({2})});  // a tensor it does not hold: ignored
    opt_without->set_hyper("wd", 0.0);
    for (std::size_t i = 0; i < exempted.size(); ++i)
      EXPECT_EQ(opt->decays(0, i), i != 1 && i != 4) << name << " " << i;
    for (int s = 0; s < 5; ++s) {
      set_grads(exempted, s), set_grads(without_wd, s), set_grads(as_before, s);
      opt->step(), opt_without->step(), opt_before->step();
    }
    for (std::size_t i = 0; i < exempted.size(); ++i) {
      const auto& expected = (i == 1 || i == 4) ? without_wd[i] : as_before[i];
      EXPECT_TRUE(torch::equal(exempted[i], expected)) << name << ": parameter " << i;
    }
    EXPECT_FALSE(torch::equal(without_wd[0], as_before[0])) << name << ": the decay must show";
    EXPECT_THROW(opt->decays(0, exempted.size()), fl::ConfigError);
  }
}

// Parameters laid out otherwise than contiguous (channels-last, transposed) with gradients and state laid out
// like them go through the fused kernels as views in memory order: each element ends with the bits of the same
// run on contiguous tensors (the _foreach_ path would round differently), and the updates land in the parameters.
TEST(Optimizer, FusedUpdatesOfChannelsLastAndTransposedParametersMatchContiguousBitForBit) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  for (const auto& [name, f] : {std::pair{"SGD", fl::SGD({.mom = 0.9, .wd = 0.01})}, std::pair{"Adam", fl::Adam()}}) {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
    const auto start = std::vector<at::Tensor>{at::randn({8, 3, 3, 3}, gen), at::randn({5, 7}, gen)};
    Params plain, strided;
    for (const auto& s : start) plain.push_back(s.clone().requires_grad_(true));
    strided.push_back(start[0].contiguous(cl).requires_grad_(true));
    strided.push_back(start[1].t().contiguous().t().requires_grad_(true));
    ASSERT_FALSE(strided[0].is_contiguous());
    ASSERT_FALSE(strided[1].is_contiguous());
    auto opt_plain = make(f, plain, 1e-2), opt_strided = make(f, strided, 1e-2);
    for (int s = 0; s < 4; ++s) {
      set_grads(plain, s);
      for (std::size_t i = 0; i < strided.size(); ++i)
        strided[i].mutable_grad() = at::empty_like(strided[i]).copy_(plain[i].grad());  // laid out like its param
      opt_plain->step();
      opt_strided->step();
      expect_equal(strided, plain, std::string(name) + " step " + std::to_string(s));
    }
    EXPECT_FALSE(torch::equal(strided[0], start[0])) << name << ": the updates did not reach the parameter";
    EXPECT_TRUE(strided[0].is_contiguous(cl)) << name;
  }
}

// The fused kernels split big tensors across threads on fixed 64-byte boundaries, so the result does not
// depend on the thread count either.
TEST(Optimizer, DeterministicAcrossThreadCounts) {
  const int threads = at::get_num_threads();
  for (const auto& f : {fl::SGD({.mom = 0.9, .wd = 0.01}), fl::Adam()}) {
    Params runs[2];
    for (int r = 0; r < 2; ++r) {
      at::set_num_threads(r == 0 ? 1 : 4);
      auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
      runs[r] = {at::randn({300001}, gen).requires_grad_(true), at::randn({513, 77}, gen).requires_grad_(true)};
      auto opt = make(f, runs[r], 1e-2);
      for (int s = 0; s < 5; ++s) {
        set_grads(runs[r], s);
        opt->step();
      }
    }
    expect_equal(runs[0], runs[1], "1 thread vs 4");
  }
  at::set_num_threads(threads);
}

}  // namespace

// Device hyper-parameters (what a step captured in a CUDA graph reads) train like the host path, on the CPU here: the
// same algorithms with hypers that change every step (a one-cycle lr and momentum, wd changed midway), two groups,
// parameters exempt from weight decay, parameters without gradients on some steps (their own step counts), float32
// and float64; equal to float rounding, the state and its checkpoint the same.
TEST(DeviceHypers, TrainLikeTheHostPathWithHypersChangingEveryStep) {
  const std::vector<std::pair<std::string, fl::OptFunc>> cases{
      {"SGD", fl::SGD()},
      {"SGD momentum", fl::SGD({.mom = 0.9})},
      {"SGD nesterov decoupled wd", fl::SGD({.mom = 0.9, .wd = 0.05, .nesterov = true})},
      {"SGD momentum L2", fl::SGD({.mom = 0.8, .wd = 0.05, .decouple_wd = false})},
      {"Adam (fastai)", fl::Adam()},
      {"AdamW", fl::AdamW()},
      {"Adam L2", fl::Adam({.wd = 0.05, .decouple_wd = false})}};
  const Skip skip = [](int step, std::size_t i) { return (i == 1 && step % 3 != 2) || (i == 4 && step < 5); };
  for (const auto dtype : {at::kFloat, at::kDouble}) {
    for (const auto& [name, f] : cases) {
      const auto what = name + " " + c10::toString(dtype);
      auto host_p = make_params(dtype), device_p = copy(host_p);
      const auto groups = [](const Params& ps) {
        return std::vector<Params>{Params(ps.begin(), ps.begin() + 3), Params(ps.begin() + 3, ps.end())};
      };
      auto host = f(groups(host_p), 1e-2), device = f(groups(device_p), 1e-2);
      device->set_device_hypers(true);
      host->exempt_from_weight_decay({host_p[2]});
      device->exempt_from_weight_decay({device_p[2]});
      for (int s = 0; s < kSteps; ++s) {
        const double pct = static_cast<double>(s) / kSteps;
        for (auto* opt : {host.get(), device.get()}) {
          opt->set_hyper("lr", std::vector<double>{1e-2 * (1 + 3 * pct), 2e-3 * (1 - pct)});
          opt->set_hyper("mom", 0.95 - 0.1 * pct);
          if (s == 6) opt->set_hyper("wd", std::vector<double>{0.0, 0.1});
        }
        set_grads(host_p, s, skip);
        set_grads(device_p, s, skip);
        host->step();
        device->step();
        expect_close(device_p, host_p, what + " step " + std::to_string(s), dtype == at::kFloat ? 2e-5 : 1e-12);
      }
      EXPECT_EQ(device->state_json(), host->state_json()) << what;
      const auto host_state = host->state_tensors(), device_state = device->state_tensors();
      ASSERT_EQ(device_state.size(), host_state.size()) << what;
      for (std::size_t k = 0; k < host_state.size(); ++k) EXPECT_EQ(device_state[k].first, host_state[k].first);
    }
  }
}

// What a caller replaying a captured step relies on: staging copies the host's values (and a 0, the exempt
// parameters' "wd") into the device tensor in the hypers' order; count_replayed_step counts the parameters the last
// step updated, as that step did; a state loaded from a checkpoint remakes the device tensors from its counts; the
// first update of a parameter is known before it happens.
TEST(DeviceHypers, StagingCountsAndCheckpointsKeepHostAndDeviceInStep) {
  auto ps = make_params(at::kFloat);
  auto opt = fl::Adam()({ps}, 1e-2);
  EXPECT_TRUE(opt->device_hyper_tensors().empty());
  opt->set_device_hypers(true);
  set_grads(ps, 0, [](int, std::size_t i) { return i == 5; });
  EXPECT_EQ(opt->never_updated_trainable(), "parameter 0 of group 0");
  opt->step();
  EXPECT_EQ(opt->never_updated_trainable(), "parameter 5 of group 0");
  ps[5].requires_grad_(false);  // frozen: it will get no gradient
  EXPECT_EQ(opt->never_updated_trainable(), "");
  ps[5].requires_grad_(true);

  const auto tensors = opt->device_hyper_tensors();
  ASSERT_EQ(tensors.size(), 2U);
  EXPECT_EQ(tensors[0].first, "0.hypers");
  opt->set_hyper("lr", 0.25);
  opt->set_hyper("eps", 1e-3);
  opt->stage_hypers();
  // Alphabetical, as the hypers' map: eps, lr, mom, sqr_mom, wd, then the exempt parameters' 0.
  EXPECT_TRUE(torch::equal(tensors[0].second, at::tensor({1e-3, 0.25, 0.9, 0.99, 0.01, 0.0}, at::kDouble)));
  EXPECT_TRUE(torch::equal(tensors[1].second, at::tensor({1.F, 1.F, 1.F, 1.F, 1.F, 0.F})));

  EXPECT_EQ(opt->last_updated(), (std::vector<std::vector<std::size_t>>{{0, 1, 2, 3, 4}}));
  opt->count_replayed_step(opt->last_updated());  // as if the step's kernels ran again: the host catches up
  at::_foreach_add_(std::vector<at::Tensor>{tensors[1].second.narrow(0, 0, 5)}, 1.0);
  EXPECT_EQ(opt->step_count(), 2);
  EXPECT_EQ(nlohmann::json::parse(opt->state_json())["groups"][0]["steps"].dump(), "[2,2,2,2,2,0]");

  // A checkpoint loaded into a fresh optimizer: its device tensors start from the loaded counts.
  auto ps2 = copy(ps);
  auto loaded = fl::Adam()({ps2}, 1e-2);
  loaded->set_device_hypers(true);
  loaded->load_state(opt->state_tensors(), opt->state_json());
  set_grads(ps2, 3, [](int, std::size_t i) { return i == 5; });
  loaded->step();
  EXPECT_TRUE(torch::equal(loaded->device_hyper_tensors()[1].second, at::tensor({3.F, 3.F, 3.F, 3.F, 3.F, 0.F})));
  // Where the state is: the same from step to step, elsewhere once a checkpoint is loaded.
  std::vector<const void*> before, after_step, after_load;
  loaded->append_state_addresses(before);
  loaded->step();
  loaded->append_state_addresses(after_step);
  EXPECT_EQ(after_step, before);
  loaded->load_state(loaded->state_tensors(), loaded->state_json());
  loaded->append_state_addresses(after_load);
  EXPECT_NE(after_load, before);
  loaded->set_device_hypers(false);
  EXPECT_TRUE(loaded->device_hyper_tensors().empty());

  // bfloat16 weights would have their factors rounded (1 - lr*wd to 1): refused by name, the optimizer unchanged.
  auto half = fl::Adam()({{at::zeros({2}, at::kBFloat16).requires_grad_()}}, 1e-2);
  try {
    half->set_device_hypers(true);
    ADD_FAILURE() << "bfloat16 parameters were accepted";
  } catch (const fl::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 0 of group 0 is BFloat16"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(half->device_hypers());
}
