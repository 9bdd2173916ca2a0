// ParallelTrainer on CPU replicas: the replicas run at the same time, and 2 or 3 of them train exactly as one
// device with the whole batch (mlp, conv_net, the BatchNorm ResNet; SGD with momentum and Adam), with uneven chunks,
// chunks of no item, accumulation, clipping, bf16 autocast and fine_tune; a failing replica is reported and the
// learner trains again; every built-in model replicates faithfully; checkpoints pass both ways.
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/distributed/sync_batch_norm.h>
#include <fastlearn/learner/collab_learner.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/models.h>
#include <fastlearn/models/norm_layer.h>
#include <fastlearn/models/tabular_model.h>
#include <fastlearn/models/torchvision_resnet.h>
#include <fastlearn/models/vision_model.h>
#include <fastlearn/optim/sgd.h>

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <barrier>
#include <chrono>
#include <filesystem>
#include <future>

#include "support/message_of.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

const c10::Device cpu(c10::kCPU);

// Images 1x28x28 with 3 classes, seeded.
std::pair<at::Tensor, at::Tensor> images(std::int64_t n, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({n, 1, 28, 28}, gen) + y.to(at::kFloat).view({n, 1, 1, 1});
  return {x, y};
}

// `items` training items in batches of `bs`, in order (each run sees the same batches).
fl::DataLoaders loaders(std::int64_t items, std::int64_t bs) {
  auto [x, y] = images(items, 1);
  auto [vx, vy] = images(7, 2);
  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{vx}, std::vector<at::Tensor>{vy});
  return fl::DataLoaders(fl::DataLoader(train, {.bs = bs, .shuffle = false}), fl::DataLoader(valid, {.bs = 4}), 3);
}

torch::nn::Sequential make_model(const std::string& kind) {
  torch::manual_seed(0);
  if (kind == "mlp") return fl::models::mlp(28 * 28, {32, 16}, 3);
  if (kind == "conv_net") return fl::models::conv_net({.widths = {8, 16, 16}, .classes = 3});
  return fl::models::resnet({.widths = {8, 16}, .classes = 3, .in_channels = 1, .stem_width = 8});
}

fl::OptFunc make_opt(const std::string& kind) { return kind == "sgd" ? fl::SGD({.mom = 0.9}) : fl::Adam(); }

std::vector<at::Tensor> params_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone().to(at::kDouble));
  return out;
}

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double tol,
                  const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (std::size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].sizes(), b[i].sizes()) << what << ": tensor " << i;
    if (a[i].numel() == 0) continue;  // a BatchNorm over no features
    const double diff = (a[i].to(at::kDouble) - b[i].to(at::kDouble)).abs().max().item<double>();
    EXPECT_LE(diff, tol) << what << ": tensor " << i << " differs by " << diff;
  }
}

// After every training batch: every replica's parameters and buffers equal replica 0's.
struct ReplicasAgree : fl::Callback {
  ReplicasAgree() { order = 90; }
  void after_batch() override {
    auto trainer = learn().cb<fl::ParallelTrainer>();
    if (!trainer || !learn().training) return;
    ++batches;
    const auto reference = params_of(trainer->replica(0));
    for (int i = 1; i < trainer->replica_count(); ++i) {
      const auto other = params_of(trainer->replica(i));
      for (std::size_t k = 0; k < reference.size(); ++k) {
        if (!reference[k].equal(other[k])) ++mismatches;
      }
      std::size_t k = 0;
      for (const auto& p : trainer->replica(i).parameters()) {
        if (p.requires_grad() != trainer->replica(0).parameters()[k++].requires_grad()) ++flag_mismatches;
      }
    }
  }
  int batches = 0, mismatches = 0, flag_mismatches = 0;
};

struct Run {
  std::vector<at::Tensor> params;
  int batches = 0, mismatches = 0;
};

Run train(const std::string& model_kind, const std::string& opt, int replicas, std::int64_t items, std::int64_t bs,
          std::vector<fl::CallbackPtr> cbs = {}) {
  auto model = make_model(model_kind);
  fl::Learner learn(loaders(items, bs), model, fl::cross_entropy(),
                    {.opt_func = make_opt(opt),
                     .lr = opt == "sgd" ? 1e-2 : 1e-3,
                     .cbs = std::move(cbs),
                     .progress = false,
                     .device = cpu});
  auto agree = std::make_shared<ReplicasAgree>();
  learn.add_cb(agree);
  std::optional<fl::ParallelCtx> ctx;
  if (replicas > 1) ctx.emplace(learn, std::vector<c10::Device>(static_cast<std::size_t>(replicas), cpu));
  learn.fit(1);
  return {params_of(learn.model()), agree->batches, agree->mismatches};
}

// fastai's collaborative filtering models on replicas: the dot product, and EmbeddingNN, whose BatchNorm the replicas
// synchronize and whose empty bn_cont (no features, parameters of no elements) they leave alone.
TEST(ParallelTrainer, CollabModelsOnReplicasTrainAsOneDevice) {
  for (const bool use_nn : {false, true}) {
    const auto run = [use_nn](int replicas) {
      auto ratings = fl::CollabDataLoaders::from_table(flt::ratings_table(100, 10, 12), {}, "ratings.csv");
      fl::DataLoaders dls(fl::DataLoader(ratings.train().dataset_ptr(), {.bs = 10}),
                          fl::DataLoader(ratings.valid().dataset_ptr(), {.bs = 8}), 1);
      torch::manual_seed(0);
      auto learn =
          fl::collab_learner(std::move(dls), {.n_factors = 4, .use_nn = use_nn, .y_range = std::pair(0.0, 6.0)},
                             {.progress = false, .device = cpu});
      std::optional<fl::ParallelCtx> ctx;
      if (replicas > 1) ctx.emplace(*learn, std::vector<c10::Device>(static_cast<std::size_t>(replicas), cpu));
      learn->fit(1, 1e-2);
      return params_of(learn->model());
    };
    expect_close(run(2), run(1), 1e-5, use_nn ? "EmbeddingNN" : "EmbeddingDotBias");
  }
}

// --- the replicas run at the same time ---------------------------------------------------------------------------

// Each forward waits until two threads are in a forward at once: replicas run one after another fail.
std::atomic<int> arrived{0};
struct MeetImpl : torch::nn::Cloneable<MeetImpl> {
  MeetImpl() { reset(); }
  void reset() override { linear = register_module("linear", torch::nn::Linear(28 * 28, 3)); }
  at::Tensor forward(const at::Tensor& x) {
    const int ticket = arrived.fetch_add(1) + 1;
    const int round_end = (ticket + 1) / 2 * 2;  // the two calls of a batch meet
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (arrived.load() < round_end) {
      if (std::chrono::steady_clock::now() > deadline) throw std::runtime_error("the other replica never came");
      std::this_thread::yield();
    }
    return linear->forward(x.flatten(1));
  }
  torch::nn::Linear linear{nullptr};
};
TORCH_MODULE(Meet);

TEST(ParallelTrainer, ReplicasRunAtTheSameTime) {
  arrived = 0;
  fl::Learner learn(loaders(16, 8), Meet(), fl::cross_entropy(), {.progress = false, .device = cpu});
  fl::ParallelCtx ctx(learn, {cpu, cpu});
  ASSERT_TRUE(ctx.active());
  learn.fit(1);                  // training and validation forwards, each a meeting of the two threads
  EXPECT_EQ(arrived.load(), 8);  // 2 training batches and 2 validation batches, 2 replicas each
}

// --- equal to one device -------------------------------------------------------------------------------------------

class Equivalence : public ::testing::TestWithParam<std::tuple<std::string, std::string, int>> {};

TEST_P(Equivalence, ReplicasTrainAsOneDeviceWithTheWholeBatch) {
  const auto& [model, opt, replicas] = GetParam();
  // 5 steps of 10 items: 10 over 3 replicas makes chunks of 4, 3 and 3.
  const auto one = train(model, opt, 1, 50, 10);
  const auto many = train(model, opt, replicas, 50, 10);
  EXPECT_EQ(many.batches, 5);
  EXPECT_EQ(many.mismatches, 0) << "a replica differs from replica 0 after a step";
  expect_close(many.params, one.params, 1e-5, model + " " + opt);
}

INSTANTIATE_TEST_SUITE_P(ModelsAndOptimizers, Equivalence,
                         ::testing::Combine(::testing::Values("mlp", "conv_net", "resnet"),
                                            ::testing::Values("sgd", "adam"), ::testing::Values(2, 3)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param) + "_" +
                                  std::to_string(std::get<2>(info.param));
                         });

TEST(ParallelTrainer, ABatchSmallerThanTheReplicasLeavesSomeWithoutItems) {
  // Batches of 2 items over 3 replicas (chunks 1, 1, 0), then a last batch of 1.
  for (const std::string model : {"mlp", "resnet"}) {
    const auto one = train(model, "sgd", 1, 7, 2);
    const auto many = train(model, "sgd", 3, 7, 2);
    EXPECT_EQ(many.batches, 4);
    expect_close(many.params, one.params, 1e-5, model);
  }
}

TEST(ParallelTrainer, AccumulationReducesOncePerStep) {
  struct CountReduces : fl::Callback {
    CountReduces() { order = 95; }
    void after_fit() override {}
    void after_batch() override {
      if (auto t = learn().cb<fl::ParallelTrainer>()) reduces = t->reducer(0)->iterations();
    }
    std::int64_t reduces = 0;
  };
  auto counter = std::make_shared<CountReduces>();
  const auto one = train("conv_net", "sgd", 1, 40, 5, {std::make_shared<fl::GradientAccumulation>(10)});
  const auto many = train("conv_net", "sgd", 2, 40, 5, {std::make_shared<fl::GradientAccumulation>(10), counter});
  EXPECT_EQ(counter->reduces, 4);  // 8 micro-batches of 5, a step every 10 items
  expect_close(many.params, one.params, 1e-5, "accumulation");
}

TEST(ParallelTrainer, ClippingSeesTheReducedGradients) {
  auto clip = [] { return std::make_shared<fl::GradientClip>(fl::GradientClipOptions{.max_norm = 0.05}); };
  const auto one = train("mlp", "sgd", 1, 30, 10, {clip()});
  const auto many = train("mlp", "sgd", 2, 30, 10, {clip()});
  expect_close(many.params, one.params, 1e-5, "clipping");
}

TEST(ParallelTrainer, Bf16AutocastRunsInTheReplicas) {
  struct PredType : fl::Callback {
    void after_pred() override { type = learn().pred.scalar_type(); }
    c10::ScalarType type = at::kFloat;
  };
  auto seen = std::make_shared<PredType>();
  auto mp = [] { return std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16}); };
  const auto one = train("mlp", "sgd", 1, 30, 10, {mp()});
  const auto many = train("mlp", "sgd", 2, 30, 10, {mp(), seen});
  EXPECT_EQ(seen->type, at::kBFloat16);
  // bf16 keeps about 3 digits, and each replica rounds its chunk's products on its own: a bf16-sized tolerance.
  expect_close(many.params, one.params, 1e-3, "bf16");
}

TEST(ParallelTrainer, WithoutSyncBatchNormEachChunkHasItsOwnStatistics) {
  auto model = make_model("conv_net");
  auto reference = make_model("conv_net");  // the same initial weights
  fl::Learner learn(loaders(8, 8), model, fl::cross_entropy(), {.progress = false, .device = cpu});
  struct Capture : fl::Callback {
    void after_pred() override {
      if (learn().training && !pred.defined()) pred = learn().pred.detach().clone();
    }
    at::Tensor pred;
  };
  auto capture = std::make_shared<Capture>();
  learn.add_cb(capture);
  fl::ParallelCtx ctx(learn, {cpu, cpu}, {.sync_bn = false});
  learn.fit(1, 0.0);  // lr 0: only the statistics move
  auto [x, y] = images(8, 1);
  reference->train();
  auto first = reference->forward(x.narrow(0, 0, 4));
  const auto stats_after_chunk0 = params_of(*reference);
  auto second = reference->forward(x.narrow(0, 4, 4));
  expect_close({capture->pred}, {torch::cat({first, second}).detach()}, 1e-5, "per-chunk statistics");
  // The model keeps replica 0's running statistics: those of chunk 0.
  expect_close(params_of(learn.model()), stats_after_chunk0, 1e-6, "replica 0's statistics");
}

TEST(ParallelTrainer, FineTuneFreezesAndUnfreezesEveryReplica) {
  auto run = [](int replicas) {
    auto model = make_model("conv_net");
    fl::Learner learn(loaders(20, 10), model, fl::cross_entropy(),
                      {.splitter = fl::models::body_head_split, .progress = false, .device = cpu});
    auto agree = std::make_shared<ReplicasAgree>();
    learn.add_cb(agree);
    std::optional<fl::ParallelCtx> ctx;
    if (replicas > 1) ctx.emplace(learn, std::vector<c10::Device>(static_cast<std::size_t>(replicas), cpu));
    learn.fine_tune(1, 1e-2, {.freeze_epochs = 1});
    EXPECT_EQ(agree->flag_mismatches, 0);
    EXPECT_EQ(agree->batches, replicas > 1 ? 4 : 0);
    return params_of(learn.model());
  };
  expect_close(run(2), run(1), 1e-5, "fine_tune");
}

// --- failures -----------------------------------------------------------------------------------------------------

std::atomic<bool> copies_fail{true};
struct FailingImpl : torch::nn::Cloneable<FailingImpl> {
  FailingImpl() { reset(); }
  FailingImpl(const FailingImpl& other) : torch::nn::Cloneable<FailingImpl>(other), copy(true) {}
  FailingImpl& operator=(const FailingImpl&) = default;
  void reset() override {
    linear = register_module("linear", torch::nn::Linear(28 * 28, 8));
    register_module("bn1", torch::nn::BatchNorm1d(8));
    register_module("bn2", torch::nn::BatchNorm1d(8));
    head = register_module("head", torch::nn::Linear(8, 3));
  }
  at::Tensor forward(const at::Tensor& x) {
    auto h = fl::models::batch_norm_forward(*named_children()["bn1"], linear->forward(x.flatten(1)));
    if (copy && copies_fail) throw fl::DataError("boom in a copy");  // replica 0 waits in bn2's statistics
    return head->forward(fl::models::batch_norm_forward(*named_children()["bn2"], h));
  }
  torch::nn::Linear linear{nullptr}, head{nullptr};
  bool copy = false;
};
TORCH_MODULE(Failing);

TEST(ParallelTrainer, AFailingReplicaIsNamedAndTheLearnerTrainsAgain) {
  copies_fail = true;
  fl::Learner learn(loaders(16, 8), Failing(), fl::cross_entropy(), {.progress = false, .device = cpu});
  fl::ParallelCtx ctx(learn, {cpu, cpu});
  auto done = std::async(std::launch::async, [&] {
    try {
      learn.fit(1);
      return std::string("no error");
    } catch (const fl::DataError& e) {  // the replica's error keeps its kind
      return std::string(e.what());
    } catch (const std::exception& e) {
      return "not a DataError: " + std::string(e.what());
    }
  });
  ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready) << "a replica's failure hung the fit";
  const auto message = done.get();
  EXPECT_EQ(message.find("not a DataError"), std::string::npos) << message;
  EXPECT_NE(message.find("replica 1"), std::string::npos) << message;
  EXPECT_NE(message.find("boom in a copy"), std::string::npos) << message;
  copies_fail = false;
  learn.fit(1);
  EXPECT_TRUE(std::isfinite(learn.validate().loss));
}

TEST(ParallelTrainer, AModelItCannotCopyIsNamedWithTheOption) {
  auto model = std::make_shared<torch::nn::LinearImpl>(28 * 28, 3);
  fl::Learner learn(loaders(8, 4), model,
                    [model](const std::vector<at::Tensor>& xb) { return model->forward(xb[0].flatten(1)); },
                    fl::cross_entropy(), {.progress = false, .device = cpu});
  fl::ParallelCtx ctx(learn, {cpu, cpu});
  const auto message = flt::message_of([&] { learn.fit(1); });
  EXPECT_NE(message.find("LearnerOptions::replicate"), std::string::npos) << message;
  EXPECT_TRUE(std::isfinite(learn.validate().loss));  // nothing half-built is left: the model runs alone
}

TEST(ParallelTrainer, DevicesItCannotUseTogetherAreRefused) {
  fl::Learner learn(loaders(8, 4), make_model("mlp"), fl::cross_entropy(), {.progress = false, .device = cpu});
  auto message = flt::message_of([&] { fl::to_parallel(learn, {cpu, c10::Device("cuda:0")}); });
  EXPECT_NE(message, "no error");
  ::setenv("WORLD_SIZE", "2", 1);
  ::setenv("RANK", "0", 1);
  message = flt::message_of([&] { fl::to_parallel(learn, {cpu, cpu}); });
  ::unsetenv("WORLD_SIZE");
  ::unsetenv("RANK");
  EXPECT_NE(message.find("--nproc-per-node"), std::string::npos) << message;
  EXPECT_EQ(learn.cb<fl::ParallelTrainer>(), nullptr);
  // One device: nothing happens.
  fl::ParallelCtx one(learn, {cpu});
  EXPECT_FALSE(one.active());
}

// --- copies of the built-in models, checkpoints ------------------------------------------------------------------

std::vector<std::string> module_types(torch::nn::Module& m) {
  std::vector<std::string> out;
  for (const auto& child : m.modules()) out.push_back(child->name());
  return out;
}

TEST(ParallelTrainer, EveryBuiltInModelReplicatesFaithfully) {
  torch::manual_seed(0);
  struct Case {
    std::string name;
    std::function<std::unique_ptr<fl::Learner>()> make;
    std::vector<at::Tensor> inputs;
  };
  auto dls = [] { return loaders(8, 4); };
  std::vector<Case> cases;
  auto image = at::randn({2, 1, 28, 28});
  auto add = [&](std::string name, auto model, std::vector<at::Tensor> inputs) {
    cases.push_back({std::move(name),
                     [model, &dls] {
                       return std::make_unique<fl::Learner>(dls(), model, fl::cross_entropy(),
                                                            fl::LearnerOptions{.progress = false, .device = cpu});
                     },
                     std::move(inputs)});
  };
  add("mlp", fl::models::mlp(28 * 28, {8}, 3), {image});
  add("simple_cnn", fl::models::simple_cnn(3), {image});
  add("conv_net", fl::models::conv_net({.widths = {8, 8}, .classes = 3}), {image});
  add("resnet", fl::models::resnet({.widths = {8, 16}, .classes = 3, .stem_width = 8}), {image});
  add("torchvision_resnet18",
      fl::models::TorchvisionResNet(fl::models::TorchvisionResNetOptions{.classes = 3, .in_channels = 1}),
      {at::randn({2, 1, 32, 32})});
  add("vision_model", fl::models::vision_model({.arch = "resnet18", .classes = 3, .in_channels = 1}),
      {at::randn({2, 1, 32, 32})});
  add("tabular_model",
      fl::models::TabularModel(std::vector<std::pair<std::int64_t, std::int64_t>>{{4, 3}, {5, 2}}, 2, 3,
                               fl::models::TabularModelOptions{.layers = {8, 4}, .ps = {0.1, 0.1}, .embed_p = 0.1}),
      {at::randint(0, 4, {2, 2}, at::kLong), at::randn({2, 2})});
  for (auto& c : cases) {
    auto learn = c.make();
    auto copy = learn->replicate(cpu);
    EXPECT_EQ(module_types(*copy.model), module_types(learn->model())) << c.name;
    learn->model().eval();
    copy.model->eval();
    torch::NoGradGuard no_grad;
    EXPECT_TRUE(learn->forward(c.inputs).equal(copy.forward(c.inputs).at(0))) << c.name;
    EXPECT_EQ(params_of(*copy.model).size(), params_of(learn->model()).size()) << c.name;
    EXPECT_NE(copy.model->parameters()[0].data_ptr(), learn->model().parameters()[0].data_ptr()) << c.name;
  }
}

TEST(ParallelTrainer, CheckpointsPassBothWays) {
  const auto dir = fs::temp_directory_path() / ("fl_parallel_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto learner = [&](bool parallel) {
    auto l = std::make_unique<fl::Learner>(
        loaders(20, 10), make_model("resnet"), fl::cross_entropy(),
        fl::LearnerOptions{
            .opt_func = fl::SGD({.mom = 0.9}), .lr = 1e-2, .path = dir, .progress = false, .device = cpu});
    if (parallel) fl::to_parallel(*l, {cpu, cpu});
    return l;
  };
  // Saved under the trainer, continued without it; and the other way; both equal a plain run.
  auto plain = learner(false);
  plain->fit(1);
  plain->save("plain");
  plain->fit(1);
  auto parallel = learner(true);
  parallel->fit(1);
  parallel->save("parallel");
  auto resumed_plain = learner(false);
  resumed_plain->load("parallel");
  resumed_plain->fit(1);
  auto resumed_parallel = learner(true);
  resumed_parallel->load("plain");
  resumed_parallel->fit(1);
  expect_close(params_of(resumed_plain->model()), params_of(plain->model()), 1e-5, "parallel -> plain");
  expect_close(params_of(resumed_parallel->model()), params_of(plain->model()), 1e-5, "plain -> parallel");
  fs::remove_all(dir);
}

TEST(ParallelTrainer, DropoutStreamsAreRepeatableAndSeeded) {
  auto run = [](std::uint64_t seed, std::uint64_t global_seed) {
    torch::manual_seed(0);
    auto model = torch::nn::Sequential(torch::nn::Flatten(), torch::nn::Linear(28 * 28, 16), fl::models::Dropout(0.5),
                                       torch::nn::Linear(16, 3));
    fl::Learner learn(loaders(20, 10), model, fl::cross_entropy(), {.progress = false, .device = cpu});
    fl::ParallelCtx ctx(learn, {cpu, cpu}, {.seed = seed});
    torch::manual_seed(global_seed);  // the replicas' masks must not come from the default generator
    learn.fit(1);
    return params_of(learn.model());
  };
  auto same = [](const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
    for (std::size_t i = 0; i < a.size(); ++i)
      if (!a[i].equal(b[i])) return false;
    return true;
  };
  const auto a = run(7, 1), b = run(7, 2), c = run(8, 1);
  EXPECT_TRUE(same(a, b)) << "the same seed must give the same masks";
  EXPECT_FALSE(same(a, c)) << "another seed must give other masks";
}

TEST(ParallelTrainer, ATrainerAddedAsACallbackTrainsAsToParallel) {
  auto plain = [](bool as_callback) {
    auto model = make_model("mlp");
    fl::Learner learn(loaders(30, 10), model, fl::cross_entropy(),
                      {.opt_func = fl::SGD({.mom = 0.9}), .lr = 1e-2, .progress = false, .device = cpu});
    auto trainer = std::make_shared<fl::ParallelTrainer>(std::vector<c10::Device>{cpu, cpu});
    if (as_callback) learn.add_cb(trainer);
    learn.fit(1);
    if (as_callback) {
      learn.remove_cb(trainer);
      trainer.reset();
      learn.fit(1);  // the learner runs its model alone again
    }
    return params_of(learn.model());
  };
  const auto alone = [] {
    auto model = make_model("mlp");
    fl::Learner learn(loaders(30, 10), model, fl::cross_entropy(),
                      {.opt_func = fl::SGD({.mom = 0.9}), .lr = 1e-2, .progress = false, .device = cpu});
    learn.fit(2);
    return params_of(learn.model());
  }();
  expect_close(plain(true), alone, 1e-5, "added with add_cb, then removed");
}

TEST(ParallelTrainer, ALossTermOutsideThePredictionsReachesTheGradients) {
  // A penalty on the first layer's weights, added to the loss by a callback, as on one device.
  struct Penalty : fl::Callback {
    void after_loss() override {
      if (!learn().training) return;
      learn().loss_grad = learn().loss_grad + 1e-2 * learn().model().parameters()[0].pow(2).sum();
    }
  };
  const auto one = train("mlp", "sgd", 1, 30, 10, {std::make_shared<Penalty>()});
  const auto many = train("mlp", "sgd", 2, 30, 10, {std::make_shared<Penalty>()});
  expect_close(many.params, one.params, 1e-5, "penalty");
}

TEST(ParallelTrainer, AFitEndedByAnExceptionLeavesTheLearnerAsBefore) {
  struct Boom : fl::Callback {
    void after_batch() override {
      if (learn().training && learn().iter == 1) throw std::runtime_error("boom after batch 1");
    }
  };
  const int threads = at::get_num_threads();
  fl::Learner learn(loaders(40, 10), make_model("conv_net"), fl::cross_entropy(), {.progress = false, .device = cpu});
  fl::ParallelCtx ctx(learn, {cpu, cpu});
  EXPECT_NE(flt::message_of([&] { learn.fit(1, 1e-2, {.cbs = {std::make_shared<Boom>()}}); }).find("boom"),
            std::string::npos);
  EXPECT_TRUE(std::isfinite(learn.validate().loss));  // outside a fit: the model alone, its BatchNorms as they were
  EXPECT_EQ(at::get_num_threads(), threads);
  for (const auto& m : learn.model().modules()) EXPECT_EQ(m->as<fl::SyncBatchNormImpl>(), nullptr);
  learn.fit(1);  // and it trains on the replicas again
  EXPECT_TRUE(std::isfinite(learn.validate().loss));
}

}  // namespace
