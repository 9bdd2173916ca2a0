// The Learner loop: the order of every event, each Cancel* effect, callback ordering and filtering,
// callbacks added and removed at run time, evaluation helpers, freezing, and bit-for-bit determinism.
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/core/device.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/distributed/parallel_trainer.h>
#include <fastlearn/learner/detail/capture_plan.h>
#include <fastlearn/learner/detail/step_graphs.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/memory_report.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/sgd.h>

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/message_of.h"
#include "support/scripted_mlp.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
using fl::Event;

namespace {

// Logs every event it receives; optionally throws a Cancel exception at one event (and batch).
class EventLog : public fl::Callback {
 public:
  std::vector<std::string> events;
  std::optional<Event> cancel_at;
  std::function<void()> thrower;
  std::optional<std::int64_t> only_iter;
  std::optional<int> only_epoch;
  bool only_training = true;

  std::string name() const override { return "event_log"; }

#define FASTLEARN_LOG_EVENT(e) \
  void e() override { on(Event::e); }
  FASTLEARN_LOG_EVENT(before_fit)
  FASTLEARN_LOG_EVENT(before_epoch)
  FASTLEARN_LOG_EVENT(before_train)
  FASTLEARN_LOG_EVENT(before_batch)
  FASTLEARN_LOG_EVENT(after_pred)
  FASTLEARN_LOG_EVENT(after_loss)
  FASTLEARN_LOG_EVENT(before_backward)
  FASTLEARN_LOG_EVENT(after_cancel_backward)
  FASTLEARN_LOG_EVENT(after_backward)
  FASTLEARN_LOG_EVENT(before_step)
  FASTLEARN_LOG_EVENT(after_cancel_step)
  FASTLEARN_LOG_EVENT(after_step)
  FASTLEARN_LOG_EVENT(after_cancel_batch)
  FASTLEARN_LOG_EVENT(after_batch)
  FASTLEARN_LOG_EVENT(after_cancel_train)
  FASTLEARN_LOG_EVENT(after_train)
  FASTLEARN_LOG_EVENT(before_validate)
  FASTLEARN_LOG_EVENT(after_cancel_validate)
  FASTLEARN_LOG_EVENT(after_validate)
  FASTLEARN_LOG_EVENT(after_cancel_epoch)
  FASTLEARN_LOG_EVENT(after_epoch)
  FASTLEARN_LOG_EVENT(after_cancel_fit)
  FASTLEARN_LOG_EVENT(after_fit)
#undef FASTLEARN_LOG_EVENT

 private:
  void on(Event e) {
    events.emplace_back(fl::to_string(e));
    if (cancel_at != e || !thrower) return;
    auto& l = learn();
    if (only_iter && (l.iter != *only_iter || (fl::is_inner_loop(e) && l.training != only_training))) return;
    if (only_epoch && l.epoch != *only_epoch) return;
    thrower();
  }
};

// 2 training batches of 4 and 1 validation batch of 4.
fl::DataLoaders two_batches() { return flt::regression_data({.n_train = 8, .n_valid = 4, .bs = 4, .shuffle = false}); }

std::unique_ptr<fl::Learner> learner_with(std::shared_ptr<EventLog> log, int epochs = 1) {
  auto learn = flt::regression_learner(two_batches(), {.opt_func = fl::SGD()});
  learn->add_cb(log);
  learn->fit(epochs, 0.01);
  return learn;
}

std::vector<std::string> train_batch() {
  return {"before_batch",   "after_pred",  "after_loss", "before_backward",
          "after_backward", "before_step", "after_step", "after_batch"};
}
std::vector<std::string> valid_batch() { return {"before_batch", "after_pred", "after_loss", "after_batch"}; }

std::vector<std::string> concat(std::initializer_list<std::vector<std::string>> parts) {
  std::vector<std::string> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

template <typename Cancel>
std::function<void()> throws() {
  return [] { throw Cancel(); };
}

}  // namespace

// The memory report counts by storage: the parameters (a tied weight once), the gradients of a backward, and Adam's
// two moments per parameter after its first step.
TEST(LearnerMemory, TheReportCountsParametersGradientsAndOptimizerStateByStorage) {
  torch::nn::Sequential model(torch::nn::Linear(4, 4), torch::nn::Linear(4, 4), torch::nn::Linear(4, 1));
  // The second layer's weight is tied to the first's storage (as ParallelTrainer's replicas share theirs).
  model[1]->as<torch::nn::LinearImpl>()->weight.set_data(model[0]->as<torch::nn::LinearImpl>()->weight);
  fl::Learner learn(flt::regression_data(), model, fl::mse_loss(), {.opt_func = fl::Adam(), .progress = false});
  const std::int64_t first = (16 + 4) * 4, second_bias = 4 * 4, last = (4 + 1) * 4;
  auto report = fl::memory_report(learn);
  EXPECT_EQ(report.parameters, first + second_bias + last) << "the tied weight's storage is the first layer's";
  EXPECT_EQ(report.gradients, 0);
  EXPECT_EQ(report.optimizer_state, 0);
  learn.fit(1, 1e-3);
  const auto batch = learn.dls().train().one_batch();
  learn.loss_func().fn(learn.forward(batch.inputs), batch.targets.front()).backward();
  report = fl::memory_report(learn);
  EXPECT_EQ(report.gradients, (16 + 4 + 16 + 4 + 4 + 1) * 4) << "each parameter's gradient once";
  EXPECT_EQ(report.optimizer_state, 2 * (16 + 4 + 16 + 4 + 4 + 1) * 4) << "Adam's exp_avg and exp_avg_sq";
  EXPECT_EQ(report.total(), report.parameters + report.gradients + report.optimizer_state);
}

TEST(Learner, FiresEveryEventInFastaiOrder) {
  auto log = std::make_shared<EventLog>();
  learner_with(log);
  const auto expected = concat({{"before_fit", "before_epoch", "before_train"},
                                train_batch(),
                                train_batch(),
                                {"after_train", "before_validate"},
                                valid_batch(),
                                {"after_validate", "after_epoch", "after_fit"}});
  EXPECT_EQ(log->events, expected);
}

TEST(Learner, AFitWhoseTrainingLoaderMakesNoBatchIsRefusedBeforeAnyChange) {
  // 3 training items with bs 8 and drop_last: no batch at all, which would train nothing yet end "successfully".
  auto x = torch::randn({7, 4}), y = torch::randn({7, 1});
  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.slice(0, 0, 3)},
                                                   std::vector<at::Tensor>{y.slice(0, 0, 3)});
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.slice(0, 3)},
                                                   std::vector<at::Tensor>{y.slice(0, 3)});
  auto learn = flt::regression_learner(
      fl::DataLoaders(fl::DataLoader(train, {.bs = 8, .drop_last = true}), fl::DataLoader(valid, {.bs = 8}), 1));
  auto log = std::make_shared<EventLog>();
  learn->add_cb(log);
  const auto before = flt::snapshot(learn->model());
  try {
    learn->fit(1, 0.01);
    ADD_FAILURE() << "a fit of no batch ran";
  } catch (const fl::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("makes no batch: 3 item(s) per epoch with bs 8 and drop_last"),
              std::string::npos)
        << e.what();
  }
  EXPECT_TRUE(log->events.empty()) << "events fired: " << log->events.size();
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model())));
  // A fit of no epoch asks for no batch; validation still runs on what there is.
  EXPECT_NO_THROW(learn->fit(0, 0.01));
  EXPECT_NO_THROW(learn->validate());
}

TEST(Learner, CancelBatchSkipsTheRestOfTheBatchAndZeroGrad) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::after_backward;
  log->only_iter = 0;
  log->thrower = throws<fl::CancelBatchException>();
  auto learn = flt::regression_learner(two_batches(), {.opt_func = fl::SGD()});
  learn->add_cb(log);
  // Stop right after the first batch to look at the gradients it left.
  struct StopAfterFirst : fl::Callback {
    at::Tensor grad;
    void after_batch() override {
      if (learn().training && learn().iter == 0) {
        grad = learn().model().parameters()[0].grad().clone();
        throw fl::CancelFitException();
      }
    }
  };
  auto stop = std::make_shared<StopAfterFirst>();
  stop->order = 100;
  learn->add_cb(stop);
  const auto before = flt::snapshot(learn->model());
  learn->fit(1, 0.01);
  const auto first_batch =
      concat({{"before_fit", "before_epoch", "before_train", "before_batch", "after_pred", "after_loss",
               "before_backward", "after_backward", "after_cancel_batch", "after_batch"}});
  ASSERT_GE(log->events.size(), first_batch.size());
  EXPECT_EQ(std::vector<std::string>(log->events.begin(), log->events.begin() + first_batch.size()), first_batch);
  ASSERT_TRUE(stop->grad.defined()) << "zero_grad must not run after CancelBatch: the gradient is kept";
  EXPECT_GT(stop->grad.abs().sum().item<double>(), 0);
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model()))) << "no optimizer step after CancelBatch";
}

TEST(Learner, CancelStepSkipsOnlyTheStep) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::before_step;
  log->thrower = throws<fl::CancelStepException>();
  auto learn = flt::regression_learner(two_batches(), {.opt_func = fl::SGD()});
  learn->add_cb(log);
  const auto before = flt::snapshot(learn->model());
  learn->fit(1, 0.01);
  auto step =
      std::vector<std::string>{"before_batch", "after_pred",        "after_loss", "before_backward", "after_backward",
                               "before_step",  "after_cancel_step", "after_step", "after_batch"};
  EXPECT_EQ(log->events, concat({{"before_fit", "before_epoch", "before_train"},
                                 step,
                                 step,
                                 {"after_train", "before_validate"},
                                 valid_batch(),
                                 {"after_validate", "after_epoch", "after_fit"}}));
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model())));
  for (auto& p : learn->model().parameters()) EXPECT_FALSE(p.grad().defined()) << "zero_grad still runs";
}

TEST(Learner, CancelBackwardSkipsBackwardButStillSteps) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::before_backward;
  log->thrower = throws<fl::CancelBackwardException>();
  auto learn = flt::regression_learner(two_batches(), {.opt_func = fl::SGD()});
  learn->add_cb(log);
  const auto before = flt::snapshot(learn->model());
  learn->fit(1, 0.01);
  auto batch = std::vector<std::string>{
      "before_batch",   "after_pred",  "after_loss", "before_backward", "after_cancel_backward",
      "after_backward", "before_step", "after_step", "after_batch"};
  EXPECT_EQ(log->events, concat({{"before_fit", "before_epoch", "before_train"},
                                 batch,
                                 batch,
                                 {"after_train", "before_validate"},
                                 valid_batch(),
                                 {"after_validate", "after_epoch", "after_fit"}}));
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model()))) << "no gradient, so no change";
}

TEST(Learner, CancelTrainEndsTrainingButValidationRuns) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::before_batch;
  log->only_iter = 1;
  log->thrower = throws<fl::CancelTrainException>();
  learner_with(log);
  EXPECT_EQ(log->events, concat({{"before_fit", "before_epoch", "before_train"},
                                 train_batch(),
                                 {"before_batch", "after_cancel_train", "after_train", "before_validate"},
                                 valid_batch(),
                                 {"after_validate", "after_epoch", "after_fit"}}));
}

TEST(Learner, CancelValidateEndsValidation) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::before_validate;
  log->thrower = throws<fl::CancelValidException>();
  learner_with(log);
  EXPECT_EQ(log->events, concat({{"before_fit", "before_epoch", "before_train"},
                                 train_batch(),
                                 train_batch(),
                                 {"after_train", "before_validate", "after_cancel_validate", "after_validate",
                                  "after_epoch", "after_fit"}}));
}

TEST(Learner, CancelEpochMovesToTheNextEpoch) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::after_train;
  log->only_epoch = 0;
  log->thrower = throws<fl::CancelEpochException>();
  learner_with(log, 2);
  const auto second_epoch = concat({{"before_epoch", "before_train"},
                                    train_batch(),
                                    train_batch(),
                                    {"after_train", "before_validate"},
                                    valid_batch(),
                                    {"after_validate", "after_epoch"}});
  EXPECT_EQ(log->events, concat({{"before_fit", "before_epoch", "before_train"},
                                 train_batch(),
                                 train_batch(),
                                 {"after_train", "after_cancel_epoch", "after_epoch"},
                                 second_epoch,
                                 {"after_fit"}}));
}

TEST(Learner, CancelFitEndsTheFitAndAfterFitStillRuns) {
  auto log = std::make_shared<EventLog>();
  log->cancel_at = Event::after_epoch;
  log->thrower = throws<fl::CancelFitException>();
  log->order = 100;  // after the Recorder, which then has recorded the epoch
  auto learn = learner_with(log, 3);
  EXPECT_EQ(log->events.back(), "after_fit");
  EXPECT_EQ(std::count(log->events.begin(), log->events.end(), "before_epoch"), 1);
  EXPECT_EQ(log->events[log->events.size() - 2], "after_cancel_fit");
  EXPECT_EQ(learn->recorder().history().size(), 1u);
}

TEST(Learner, CallbacksRunSortedByOrderAndStably) {
  std::vector<std::string> seen;
  struct Named : fl::Callback {
    Named(std::string n, int o, std::vector<std::string>& s) : label(std::move(n)), sink(s) { order = o; }
    void before_fit() override { sink.push_back(label); }
    std::string label;
    std::vector<std::string>& sink;
  };
  auto learn = flt::regression_learner(two_batches());
  learn->add_cb(std::make_shared<Named>("late", 100, seen));
  learn->add_cb(std::make_shared<Named>("first-zero", 0, seen));
  learn->add_cb(std::make_shared<Named>("early", -5, seen));
  learn->add_cb(std::make_shared<Named>("second-zero", 0, seen));
  learn->fit(1);
  EXPECT_EQ(seen, (std::vector<std::string>{"early", "first-zero", "second-zero", "late"}));
  // The built-ins sit where fastai puts them: TrainEval first (-10), the Recorder at 50.
  EXPECT_EQ(learn->cbs().front()->name(), "train_eval");
}

TEST(Learner, RunTrainAndRunValidFilterInnerLoopEvents) {
  auto train_only = std::make_shared<EventLog>();
  train_only->run_valid = false;
  auto valid_only = std::make_shared<EventLog>();
  valid_only->run_train = false;
  auto learn = flt::regression_learner(two_batches());
  learn->add_cbs({train_only, valid_only});
  learn->fit(1);
  auto count = [](const std::vector<std::string>& v, const char* e) { return std::count(v.begin(), v.end(), e); };
  EXPECT_EQ(count(train_only->events, "before_batch"), 2);
  EXPECT_EQ(count(valid_only->events, "before_batch"), 1);
  // Events outside the batch reach both.
  EXPECT_EQ(count(train_only->events, "after_validate"), 1);
  EXPECT_EQ(count(valid_only->events, "before_train"), 1);
}

TEST(Learner, RunFalseSilencesACallbackUntilTheEndOfTheFit) {
  struct Once : fl::Callback {
    int batches = 0;
    void after_batch() override {
      ++batches;
      run = false;
    }
  };
  auto once = std::make_shared<Once>();
  auto learn = flt::regression_learner(two_batches());
  learn->add_cb(once);
  learn->fit(2);
  EXPECT_EQ(once->batches, 1);
  learn->fit(1);  // run is reset at after_fit
  EXPECT_EQ(once->batches, 2);
}

TEST(Learner, CallbacksCanBeAddedAndRemovedDuringAFit) {
  auto late = std::make_shared<EventLog>();
  struct Adder : fl::Callback {
    std::shared_ptr<fl::Callback> to_add;
    std::shared_ptr<fl::Callback> self;
    void after_train() override {
      learn().add_cb(to_add);
      learn().remove_cb(self);
    }
  };
  auto adder = std::make_shared<Adder>();
  adder->to_add = late;
  adder->self = adder;
  auto learn = flt::regression_learner(two_batches());
  learn->add_cb(adder);
  learn->fit(1);
  adder->self.reset();
  EXPECT_EQ(late->events, concat({{"before_validate"}, valid_batch(), {"after_validate", "after_epoch", "after_fit"}}));
  EXPECT_FALSE(adder->attached());
  EXPECT_EQ(learn->cb<Adder>(), nullptr);
}

TEST(Learner, ScopedCallbacksAreAttachedOnlyInTheirScope) {
  auto learn = flt::regression_learner(two_batches());
  auto log = std::make_shared<EventLog>();
  {
    auto scope = learn->added_cbs({log});
    EXPECT_EQ(learn->cb<EventLog>(), log);
    learn->fit(1);
  }
  EXPECT_EQ(learn->cb<EventLog>(), nullptr);
  const auto n = log->events.size();
  learn->fit(1);
  EXPECT_EQ(log->events.size(), n);
  // Per-fit callbacks are detached after the fit, also when it throws.
  auto extra = std::make_shared<EventLog>();
  extra->cancel_at = Event::before_fit;
  extra->thrower = [] { throw std::runtime_error("boom"); };
  EXPECT_THROW(learn->fit(1, {}, {.cbs = {extra}}), std::runtime_error);
  EXPECT_EQ(learn->cb<EventLog>(), nullptr);
}

TEST(Learner, TrainsALinearRegression) {
  auto learn = flt::regression_learner(flt::regression_data({.n_train = 256, .n_valid = 64, .bs = 16}),
                                       {.opt_func = fl::SGD({.mom = 0.9})});
  learn->fit(10, 0.05);
  const auto& history = learn->recorder().history();
  ASSERT_EQ(history.size(), 10u);
  EXPECT_LT(history.back().valid_loss, 1e-3);
  EXPECT_LT(history.back().train_loss, history.front().train_loss);
  EXPECT_NEAR(learn->validate().loss, history.back().valid_loss, 1e-9);
}

TEST(Learner, EachFitStartsWithoutASmoothedLoss) {
  // What a callback at the default order sees at the first batch of each fit: no smoothed loss yet, not the
  // last one of the fit before (lr_find's, for fit_one_cycle after lr_find).
  struct FirstBatch : fl::Callback {
    std::vector<double> seen;
    void before_batch() override {
      if (learn().training && learn().train_iter == 0) seen.push_back(learn().smooth_loss);
    }
  };
  auto learn = flt::regression_learner(flt::regression_data({.n_train = 64, .n_valid = 16, .bs = 16}));
  auto first = std::make_shared<FirstBatch>();
  learn->add_cb(first);
  learn->fit(1, 0.05);
  ASSERT_FALSE(std::isnan(learn->smooth_loss));
  learn->fit(1, 0.05);
  ASSERT_EQ(first->seen.size(), 2u);
  EXPECT_TRUE(std::isnan(first->seen[0]));
  EXPECT_TRUE(std::isnan(first->seen[1])) << "the second fit began with the first one's " << first->seen[1];
}

TEST(Learner, ValidateGetPredsAndPredict) {
  auto dls = flt::classification_data({.n_train = 96, .n_valid = 30, .bs = 8, .shuffle = true});
  torch::manual_seed(0);
  fl::Learner learn(dls, fl::models::mlp(4, {16}, 3), fl::cross_entropy(),
                    {.metrics = {fl::accuracy()}, .progress = false});
  learn.fit_one_cycle(5, 0.05);
  auto result = learn.validate();
  EXPECT_GT(result.metric("accuracy"), 0.8);
  EXPECT_THROW(result.metric("nope"), fl::Error);

  auto preds = learn.get_preds();
  ASSERT_EQ(preds.preds.sizes(), (at::IntArrayRef{30, 3}));
  EXPECT_TRUE(preds.preds.sum(1).allclose(at::ones({30})));  // softmax activations
  const auto& valid = static_cast<const fl::TensorDataset&>(learn.dls().valid().dataset());
  EXPECT_TRUE(preds.targets.equal(valid.targets()[0])) << "targets come back in dataset order";
  const double acc = preds.decoded.eq(preds.targets).to(at::kDouble).mean().item<double>();
  EXPECT_NEAR(acc, result.metric("accuracy"), 1e-9);

  auto one = learn.predict(valid.get(3));
  EXPECT_EQ(one.decoded.item<std::int64_t>(), preds.decoded[3].item<std::int64_t>());
  EXPECT_TRUE(one.probs.allclose(preds.preds[3], 1e-5, 1e-6));
}

TEST(Learner, GetPredsAndValidateReadAShufflingLoaderInOrderAndWhole) {
  // fastai's get_preds(ds_idx=0): every training item once, in dataset order, the same at every call.
  auto gen = at::detail::createCPUGenerator(5);
  const auto x = at::randn({37, 4}, gen);
  const auto y = at::randint(0, 3, {37}, gen, at::TensorOptions().dtype(at::kLong));
  auto data = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  fl::DataLoader train(data, {.bs = 8, .shuffle = true, .drop_last = true, .seed = 1});
  fl::DataLoader valid(data, {.bs = 8});
  torch::manual_seed(0);
  auto model = fl::models::mlp(4, {16}, 3);
  fl::Learner learn(fl::DataLoaders(std::move(train), std::move(valid), 3), model, fl::cross_entropy(),
                    {.metrics = {fl::accuracy()}, .progress = false});
  learn.fit(1, 0.05);
  const auto first = learn.get_preds(&learn.dls().train());
  ASSERT_EQ(first.preds.size(0), 37) << "the 5 items a dropped last batch would leave out are there";
  EXPECT_TRUE(first.targets.equal(y)) << "dataset order";
  const auto second = learn.get_preds(&learn.dls().train());
  EXPECT_TRUE(second.preds.equal(first.preds)) << "the same at every call";
  model->eval();
  EXPECT_TRUE(first.preds.allclose(torch::softmax(model->forward(x), 1), 1e-5, 1e-6));
  const auto on_train = learn.validate(&learn.dls().train());
  const auto on_valid = learn.validate();  // the same 37 items, read by a plain loader
  EXPECT_NEAR(on_train.loss, on_valid.loss, 1e-6);
  EXPECT_NEAR(on_train.metric("accuracy"), on_valid.metric("accuracy"), 1e-9);
  // The training loader itself still shuffles and drops its last batch.
  EXPECT_EQ(learn.dls().train().size(), 4);
  EXPECT_TRUE(learn.dls().train().options().shuffle);
  learn.fit(1, 0.05);
  EXPECT_EQ(learn.recorder().history().size(), 1u);
}

TEST(Learner, FreezeKeepsBatchNormTrainableAndFineTuneUnfreezes) {
  auto dls = flt::classification_data({.n_train = 32, .n_valid = 8, .bs = 8});
  // A model of a linear body with BatchNorm and a linear head, split into two groups.
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 3));
  fl::Learner learn(dls, model, fl::cross_entropy(), {.splitter = fl::models::body_head_split, .progress = false});
  learn.freeze();
  EXPECT_FALSE(model[0]->parameters()[0].requires_grad());
  EXPECT_TRUE(model[1]->parameters()[0].requires_grad()) << "BatchNorm stays trainable (train_bn)";
  EXPECT_TRUE(model[3]->parameters()[0].requires_grad());
  const auto body_before = model[0]->parameters()[0].clone();
  learn.fit(1, 1e-2);
  EXPECT_TRUE(model[0]->parameters()[0].equal(body_before)) << "a frozen group does not change";
  learn.unfreeze();
  for (auto& p : model->parameters()) EXPECT_TRUE(p.requires_grad());

  learn.fine_tune(1, 1e-2);
  auto& opt = learn.opt();
  ASSERT_EQ(opt.n_groups(), 2u);
  for (auto& p : model->parameters()) EXPECT_TRUE(p.requires_grad());
  EXPECT_FALSE(model[0]->parameters()[0].equal(body_before));
}

// A callback that cancels the frozen fit (as early stopping does) ends that fit only; the unfrozen fit still runs,
// as in fastai. Only a stop of the whole run (Learner::stop_training, which GracefulStop calls) skips it.
TEST(Learner, FineTuneGoesOnAfterAFrozenFitCancelledUnlessTrainingWasStopped) {
  struct CancelFirstFit : fl::Callback {
    bool stop_training = false;
    int fits = 0;
    void before_fit() override { ++fits; }
    void before_batch() override {
      if (fits != 1) return;
      if (stop_training) learn().stop_training();
      throw fl::CancelFitException();
    }
  };
  for (const bool stop : {false, true}) {
    auto dls = flt::classification_data({.n_train = 32, .n_valid = 8, .bs = 8});
    torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
    fl::Learner learn(dls, model, fl::cross_entropy(), {.splitter = fl::models::body_head_split, .progress = false});
    auto cancel = std::make_shared<CancelFirstFit>();
    cancel->stop_training = stop;
    learn.add_cb(cancel);
    learn.fine_tune(2, 1e-2);
    EXPECT_EQ(cancel->fits, stop ? 1 : 2) << "stop_training " << stop;
    EXPECT_EQ(learn.training_stopped(), stop);
  }
}

// As fastai's wd_bn_bias = False: normalization layers (whole) and every bias get no weight decay; the other
// weights do. wd_bn_bias = true decays them all. The exemption is set again on every new optimizer (after freeze).
TEST(Learner, NormalizationLayersAndBiasesGetNoWeightDecayUnlessAsked) {
  auto dls = flt::classification_data({.n_train = 32, .n_valid = 8, .bs = 8});
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::BatchNorm1d(8), torch::nn::ReLU(),
                              torch::nn::Linear(8, 8), torch::nn::LayerNorm(torch::nn::LayerNormOptions({8})),
                              torch::nn::Linear(torch::nn::LinearOptions(8, 3).bias(false)));
  const std::vector<std::string> undecayed{"0.bias", "1.bias", "1.weight", "3.bias", "4.bias", "4.weight"};  // sorted
  std::vector<std::string> found;
  for (const auto& p : fl::norm_bias_params(*model))
    for (const auto& named : model->named_parameters())
      if (named.value().is_same(p)) found.push_back(named.key());
  std::sort(found.begin(), found.end());
  EXPECT_EQ(found, undecayed);

  for (const bool wd_bn_bias : {false, true}) {
    fl::Learner learn(dls, model, fl::cross_entropy(),
                      {.splitter = fl::models::body_head_split, .wd_bn_bias = wd_bn_bias, .progress = false});
    for (int round = 0; round < 2; ++round) {
      learn.create_opt();
      if (round == 1) learn.freeze();
      const auto& groups = learn.opt().param_groups();
      for (std::size_t g = 0; g < groups.size(); ++g) {
        for (std::size_t i = 0; i < groups[g].params.size(); ++i) {
          std::string name;
          for (const auto& named : model->named_parameters())
            if (named.value().is_same(groups[g].params[i])) name = named.key();
          const bool exempt = std::find(undecayed.begin(), undecayed.end(), name) != undecayed.end();
          EXPECT_EQ(learn.opt().decays(g, i), wd_bn_bias || !exempt) << name << " wd_bn_bias " << wd_bn_bias;
        }
      }
    }
  }
}

TEST(Learner, LrSpecSpreadsLearningRatesOverGroups) {
  EXPECT_EQ(fl::LrSpec(0.1).per_group(3), (std::vector<double>{0.1, 0.1, 0.1}));
  EXPECT_EQ(fl::LrSpec::slice(1.0).per_group(3), (std::vector<double>{0.1, 0.1, 1.0}));
  const auto geo = fl::LrSpec::slice(1e-4, 1e-2).per_group(3);
  EXPECT_NEAR(geo[0], 1e-4, 1e-12);
  EXPECT_NEAR(geo[1], 1e-3, 1e-12);
  EXPECT_NEAR(geo[2], 1e-2, 1e-12);
  EXPECT_THROW(fl::LrSpec(std::vector<double>{1, 2}).per_group(3), fl::ConfigError);
}

TEST(Learner, SeededCpuRunsAreBitForBitReproducible) {
  auto run = [] {
    torch::manual_seed(7);
    auto dls = flt::classification_data({.n_train = 64, .n_valid = 16, .bs = 8, .seed = 3});
    fl::Learner learn(dls, fl::models::mlp(4, {32, 32}, 3), fl::cross_entropy(), {.progress = false});
    learn.fit_one_cycle(2, 1e-2);
    return std::make_pair(learn.recorder().losses(), flt::snapshot(learn.model()));
  };
  const auto a = run();
  const auto b = run();
  EXPECT_EQ(a.first, b.first);
  EXPECT_TRUE(flt::same_tensors(a.second, b.second));
}

namespace {
// Two heads on one trunk: a value (N, 1) and class scores (N, 3).
struct TwoHeadsImpl : torch::nn::Cloneable<TwoHeadsImpl> {
  torch::nn::Linear trunk{nullptr}, value{nullptr}, classes{nullptr};
  TwoHeadsImpl() { reset(); }
  void reset() override {
    trunk = register_module("trunk", torch::nn::Linear(4, 16));
    value = register_module("value", torch::nn::Linear(16, 1));
    classes = register_module("classes", torch::nn::Linear(16, 3));
  }
  std::vector<at::Tensor> forward(const at::Tensor& x) {
    const auto h = torch::relu(trunk->forward(x));
    return {value->forward(h), classes->forward(h)};
  }
};
TORCH_MODULE(TwoHeads);

// The value's MSE plus the classes' cross entropy, the targets a value and a class.
fl::Loss two_heads_loss() {
  return {.name = "two_heads",
          .fn_all = [](const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs) {
            return torch::mse_loss(preds.at(0), targs.at(0)) + torch::cross_entropy_loss(preds.at(1), targs.at(1));
          }};
}

// 40 items: a value (the inputs' sum) and a class (how many of the first two inputs are positive); the seed set first.
fl::DataLoaders two_heads_data() {
  torch::manual_seed(0);
  const auto x = torch::randn({40, 4});
  const auto value = x.sum(1, true);
  const auto cls = (x.select(1, 0) > 0).to(at::kLong) + (x.select(1, 1) > 0).to(at::kLong);
  auto items = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{value, cls});
  return fl::DataLoaders(fl::DataLoader(items, {.bs = 8}), fl::DataLoader(items, {.bs = 16}), 3);
}

std::unique_ptr<fl::Learner> two_heads_learner(fl::Loss loss, std::vector<fl::MetricPtr> metrics = {}) {
  auto dls = two_heads_data();
  return std::make_unique<fl::Learner>(std::move(dls), TwoHeads(), std::move(loss),
                                       fl::LearnerOptions{.metrics = std::move(metrics), .progress = false});
}
}  // namespace

TEST(Learner, AModelOfSeveralOutputsTrainsOnALossOverEveryOutputAndTarget) {
  auto learn = two_heads_learner(two_heads_loss(), {fl::metric_on(fl::mse(), 0, 0, "value_mse"),
                                                    fl::metric_on(fl::accuracy(), 1, 1, "class_accuracy")});
  const auto before = learn->validate().loss;
  learn->fit(3, 1e-2);
  const auto result = learn->validate();
  EXPECT_LT(result.loss, before * 0.8);
  // The loss and each metric as computed by hand on the whole set.
  const auto& items = static_cast<const fl::TensorDataset&>(learn->dls().valid().dataset());
  const auto outputs = learn->predict_batch_outputs(items.inputs());
  ASSERT_EQ(outputs.size(), 2U);
  const auto& value = items.targets()[0];
  const auto& cls = items.targets()[1];
  EXPECT_NEAR(result.loss, two_heads_loss().fn_all(outputs, items.targets()).item<double>(), 1e-5);
  EXPECT_NEAR(result.metric("value_mse"), (outputs[0] - value).square().mean().item<double>(), 1e-6);
  EXPECT_NEAR(result.metric("class_accuracy"), outputs[1].argmax(1).eq(cls).to(at::kDouble).mean().item<double>(),
              1e-9);
  // get_preds: the first output activated by the loss (none here), the others as they come, each target.
  const auto preds = learn->get_preds();
  EXPECT_TRUE(preds.preds.allclose(outputs[0], 1e-5, 1e-6));
  ASSERT_EQ(preds.extra_preds.size(), 1U);
  EXPECT_TRUE(preds.extra_preds[0].allclose(outputs[1], 1e-5, 1e-6));
  EXPECT_TRUE(preds.targets.equal(value));
  ASSERT_EQ(preds.extra_targets.size(), 1U);
  EXPECT_TRUE(preds.extra_targets[0].equal(cls));

  // Two CPU replicas of one process take one device's steps: each output's chunks joined, each gradient split.
  auto one = two_heads_learner(two_heads_loss());
  one->fit(1, 1e-2);
  auto two = two_heads_learner(two_heads_loss());
  fl::to_parallel(*two, {torch::kCPU, torch::kCPU});
  two->fit(1, 1e-2);
  const auto a = one->model().parameters(), b = two->model().parameters();
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].allclose(b[i], 1e-5, 1e-6)) << i;

  // An output that is not one row per item (a penalty, say) comes back as the first batch's, and is not split over
  // replicas, which refuse it by name.
  const auto with_penalty = [](std::shared_ptr<TwoHeadsImpl> heads) -> fl::ForwardOutputs {
    return [heads](const std::vector<at::Tensor>& xb) {
      auto outputs = heads->forward(xb.at(0));
      outputs.push_back(outputs[1].square().mean());
      return outputs;
    };
  };
  auto heads = std::make_shared<TwoHeadsImpl>();
  fl::Loss penalized = two_heads_loss();
  penalized.fn_all = [both = two_heads_loss().fn_all](const std::vector<at::Tensor>& preds,
                                                      const std::vector<at::Tensor>& targs) {
    return both(preds, targs) + 0.01 * preds.at(2);
  };
  fl::Learner scalar_out(two_heads_data(), heads, with_penalty(heads), penalized,
                         {.progress = false, .replicate = [&](torch::nn::Module& model, const c10::Device& device) {
                            auto copy = std::dynamic_pointer_cast<TwoHeadsImpl>(model.clone(device));
                            return fl::ModelCopy{.model = copy, .forward = with_penalty(copy)};
                          }});
  scalar_out.fit(1, 1e-2);
  const auto with_scalar = scalar_out.get_preds();
  ASSERT_EQ(with_scalar.extra_preds.size(), 2U);
  EXPECT_EQ(with_scalar.extra_preds[1].dim(), 0);
  EXPECT_EQ(with_scalar.preds.size(0), 40);
  fl::to_parallel(scalar_out, {torch::kCPU, torch::kCPU});
  const auto split = flt::message_of([&] { scalar_out.fit(1, 1e-2); });
  EXPECT_NE(split.find("output 2 of a replica's forward is a scalar"), std::string::npos) << split;

  // A loss that reads one output is refused by name, as is a metric that reads an output the model does not have.
  const auto one_output = flt::message_of([] { two_heads_learner(fl::mse_loss())->fit(1, 1e-2); });
  EXPECT_NE(one_output.find("loss 'mse_loss' reads one output of the model, which returned 2"), std::string::npos)
      << one_output;
  const auto no_such = flt::message_of(
      [] { two_heads_learner(two_heads_loss(), {fl::metric_on(fl::mse(), 2, 0, "third")})->validate(); });
  EXPECT_NE(no_such.find("metric 'third' reads output 2 and target 0, and the batch has 2 output(s)"),
            std::string::npos)
      << no_such;
}

// A script is a model like any other (tests/oracles/torchscript_test.cpp compares it with PyTorch): lr_find restores
// it, bf16 autocast reaches its ops, and save / load carry its weights and optimizer state into a Learner that
// continues exactly as the one that saved.
TEST(Learner, AScriptedModelTakesLrFindBf16AndSaveLoad) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("fastlearn_scripted_{}", getpid());
  auto make = [&] {
    torch::manual_seed(0);
    return std::make_unique<fl::Learner>(flt::classification_data({.n_train = 64, .n_valid = 16, .bs = 8}),
                                         flt::scripted_mlp({4, 16, 3}), fl::cross_entropy(),
                                         fl::LearnerOptions{.path = dir, .progress = false});
  };
  auto learn = make();
  const auto before = flt::snapshot(learn->model());
  const auto found = learn->lr_find({.num_it = 20});
  EXPECT_GT(found.valley, 0);
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model()))) << "lr_find puts the weights back";

  auto bf16 = make();
  bf16->fit(1, 1e-2,
            {.cbs = {std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16})}});
  EXPECT_TRUE(std::isfinite(bf16->recorder().history().back().valid_loss));
  EXPECT_FALSE(flt::same_tensors(before, flt::snapshot(bf16->model())));
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    const auto out = bf16->forward({torch::randn({2, 4})});
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    EXPECT_EQ(out.scalar_type(), at::kBFloat16) << "the script's matmuls run in bf16 under autocast";
  }

  learn->fit(1, 1e-2);
  learn->save("scripted");
  auto loaded = make();
  loaded->load("scripted");
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(learn->model()), flt::snapshot(loaded->model())));
  learn->fit(1, 1e-2);
  loaded->fit(1, 1e-2);
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(learn->model()), flt::snapshot(loaded->model())))
      << "the optimizer's state came back with the weights";
  std::filesystem::remove_all(dir);
}

TEST(Learner, ModelInputCountMismatchIsAClearError) {
  auto learn = flt::regression_learner(two_batches());
  try {
    learn->forward({at::zeros({1, 4}), at::zeros({1, 4})});
    FAIL() << "expected an error";
  } catch (const fl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("takes 1 input tensor(s) but the batch has 2"), std::string::npos) << e.what();
  }
}

TEST(Models, ShapesNamesAndGroups) {
  auto mlp = fl::models::mlp(8, {16, 4}, 3);
  EXPECT_EQ(mlp->forward(at::zeros({5, 2, 4})).sizes(), (at::IntArrayRef{5, 3}));
  std::vector<std::string> names;
  for (const auto& p : mlp->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names, (std::vector<std::string>{"1.weight", "1.bias", "3.weight", "3.bias", "5.weight", "5.bias"}))
      << "the same names as a Python nn.Sequential(Flatten, Linear, ReLU, Linear, ReLU, Linear)";

  auto net = fl::models::resnet({.widths = {8, 16}, .classes = 5, .in_channels = 1, .stem_width = 8});
  EXPECT_EQ(net->forward(at::randn({2, 1, 28, 28})).sizes(), (at::IntArrayRef{2, 5}));
  EXPECT_EQ(net->forward(at::randn({2, 1, 13, 13})).sizes(), (at::IntArrayRef{2, 5})) << "any input size";
  std::size_t batchnorms = 0;
  for (const auto& m : net->modules()) batchnorms += m->name().find("BatchNorm") != std::string::npos;
  EXPECT_EQ(batchnorms, 2u + 2 * 2 + 1) << "stem 2, two per block, one in the widening shortcut";
  auto groups = fl::models::body_head_split(*net);
  ASSERT_EQ(groups.size(), 2u);
  EXPECT_EQ(groups[1].size(), 2u) << "the head is the final Linear";
  EXPECT_EQ(groups[0].size() + groups[1].size(), net->parameters().size());
  EXPECT_THROW(fl::models::resnet({.widths = {}}), fl::ConfigError);

  auto conv = fl::models::conv_net({.widths = {4, 8, 16, 32}, .classes = 5});
  EXPECT_EQ(conv->forward(at::randn({3, 1, 28, 28})).sizes(), (at::IntArrayRef{3, 5}));
  names.clear();
  for (const auto& p : conv->named_parameters()) names.push_back(p.key());
  EXPECT_EQ(names.front(), "0.weight") << "the first convolution has no bias (BatchNorm follows)";
  EXPECT_EQ(names.back(), "13.bias") << "Sequential(4 x (Conv2d, BatchNorm2d, ReLU), Flatten, Linear)";
  EXPECT_EQ(conv->ptr(13)->as<torch::nn::Linear>()->options.in_features(), 32 * 2 * 2) << "28 -> 14 -> 7 -> 4 -> 2";
  auto small = fl::models::conv_net({.widths = {8}, .classes = 2, .in_channels = 3, .input_size = 9});
  EXPECT_EQ(small->forward(at::randn({1, 3, 9, 9})).sizes(), (at::IntArrayRef{1, 2})) << "9 -> 5";
  EXPECT_THROW(fl::models::conv_net({.widths = {}}), fl::ConfigError);
  EXPECT_THROW(fl::models::conv_net({.widths = {8, 0}}), fl::ConfigError);
}

// The same seed gives the same model whatever the compiler: the layers draw their weights first to last,
// as Python's nn.Sequential(...) does (arguments of one call have no evaluation order in C++).
TEST(Models, LayersDrawTheirInitialWeightsFirstToLast) {
  const auto conv = [](std::int64_t in, std::int64_t out, std::int64_t stride, bool bias) {
    return torch::nn::Conv2d(torch::nn::Conv2dOptions(in, out, 3).stride(stride).padding(1).bias(bias))->weight;
  };
  torch::manual_seed(3);
  auto cnn = fl::models::simple_cnn(10);
  torch::manual_seed(3);
  EXPECT_TRUE(cnn->ptr(0)->as<torch::nn::Conv2d>()->weight.equal(conv(1, 32, 2, true)));

  torch::manual_seed(3);
  auto net = fl::models::resnet({.widths = {8}, .classes = 2, .in_channels = 1, .stem_width = 8});
  torch::manual_seed(3);
  const auto stem0 = conv(1, 8, 1, false);  // BatchNorm draws nothing: the convolutions draw in turn
  const auto stem1 = conv(8, 8, 1, false);
  const auto branch0 = conv(8, 8, 1, false);
  const auto params = net->named_parameters();
  EXPECT_TRUE(params["0.conv.weight"].equal(stem0));
  EXPECT_TRUE(params["1.conv.weight"].equal(stem1));
  EXPECT_TRUE(params["2.branch.0.conv.weight"].equal(branch0));
}

TEST(Learner, UnfreezingFromACallbackDuringAFitKeepsTraining) {
  auto dls = flt::classification_data({.n_train = 32, .n_valid = 8, .bs = 8});
  torch::nn::Sequential model(torch::nn::Linear(4, 8), torch::nn::ReLU(), torch::nn::Linear(8, 3));
  fl::Learner learn(dls, model, fl::cross_entropy(), {.splitter = fl::models::body_head_split, .progress = false});
  learn.freeze();
  struct UnfreezeAfterFirstEpoch : fl::Callback {
    void after_epoch() override {
      if (learn().epoch == 0) learn().unfreeze();
    }
  };
  const auto body = model[0]->parameters()[0].clone();
  struct BodyProbe : fl::Callback {
    at::Tensor body_after_epoch0;
    void after_epoch() override {
      if (learn().epoch == 0) body_after_epoch0 = learn().model().parameters()[0].clone();
    }
  };
  auto probe = std::make_shared<BodyProbe>();
  learn.fit(2, 1e-2, {.cbs = {probe, std::make_shared<UnfreezeAfterFirstEpoch>()}});
  EXPECT_TRUE(probe->body_after_epoch0.equal(body)) << "frozen during epoch 0";
  EXPECT_FALSE(model[0]->parameters()[0].equal(body)) << "trained after unfreezing in the middle of the fit";
  EXPECT_DOUBLE_EQ(learn.opt().hyper("lr", 0), 1e-2) << "hyper-parameters survive the new optimizer";
}

namespace {
// One weight registered under two names, as tied layers are: parameters() lists it twice.
struct TiedImpl : torch::nn::Module {
  TiedImpl() {
    w = register_parameter("w", torch::randn({4, 4}) * 0.1);
    register_parameter("w_again", w);
    head = register_module("head", torch::nn::Linear(4, 1));
  }
  torch::Tensor forward(const torch::Tensor& x) { return head->forward(x.matmul(w).matmul(w)); }
  torch::Tensor w;
  torch::nn::Linear head{nullptr};
};
TORCH_MODULE(Tied);
}  // namespace

TEST(Learner, ASharedWeightIsOneParameter) {
  auto dls = flt::regression_data({.n_train = 16, .n_valid = 8, .bs = 8});
  Tied model;
  ASSERT_EQ(model->parameters().size(), 4u);
  fl::Learner learn(dls, model, fl::mse_loss(), {.progress = false});
  EXPECT_EQ(learn.param_groups()[0].size(), 3u);
  const auto before = model->w.clone();
  learn.fit(1, 1e-2);  // no "parameter appears twice" from the optimizer
  EXPECT_FALSE(model->w.equal(before));
}

TEST(LearnerDevice, LeftToFastlearnItIsDefaultDeviceAndAGivenOneIsChecked) {
  // On this machine (no GPU, or GPUs hidden from the CPU tests) the default is the CPU, and the loaders stay as
  // they are: batches where the dataset holds them.
  auto learn = flt::regression_learner(two_batches(), {.opt_func = fl::SGD()});
  EXPECT_TRUE(learn->device().is_cpu());
  EXPECT_TRUE(learn->device_is_auto());
  EXPECT_EQ(learn->device(), fl::default_device());
  EXPECT_FALSE(learn->dls().device()) << "a loader without a device keeps none on the CPU";

  auto cpu = flt::regression_learner(two_batches(), {.opt_func = fl::SGD(), .device = c10::Device(c10::kCPU)});
  EXPECT_FALSE(cpu->device_is_auto());
  cpu->fit(1, 0.01);
  EXPECT_TRUE(cpu->model().parameters().front().is_cpu());

  if (!torch::cuda::is_available()) {
    const auto msg =
        flt::message_of([] { flt::regression_learner(two_batches(), {.device = c10::Device(c10::kCUDA)}); });
    EXPECT_NE(msg.find("LearnerOptions::device: 'cuda' needs a CUDA GPU and none is visible"), std::string::npos)
        << msg;
    EXPECT_NE(msg.find("\"cpu\""), std::string::npos) << "says what to use instead: " << msg;
    EXPECT_NE(flt::message_of([] { fl::resolve_device(c10::Device("cuda:3")); }).find("needs a CUDA GPU"),
              std::string::npos);
  }
  EXPECT_NE(flt::message_of([] { fl::resolve_device(c10::Device(c10::kMeta)); }).find("is not supported"),
            std::string::npos);
}

TEST(LearnerDevice, OptimizerStateFollowsItsParameterWhereItWasMovedOrRestrided) {
  // A learner moved after its optimizer holds state (data parallel training moving it to the rank's GPU) must not
  // step with state left behind. On the CPU the same path carries a state tensor to its parameter's layout.
  auto param = torch::randn({4, 3, 2, 2}).requires_grad_(true);
  auto opt = fl::Adam()({{param}}, 1e-2);
  param.mutable_grad() = torch::ones_like(param);
  opt->step();
  param.set_data(param.detach().contiguous(at::MemoryFormat::ChannelsLast));
  param.mutable_grad() = torch::ones_like(param);
  opt->step();
  for (const auto& [name, state] : opt->state_tensors()) {
    EXPECT_EQ(state.device(), param.device()) << name;
    EXPECT_TRUE(state.is_contiguous(at::MemoryFormat::ChannelsLast)) << name << " follows the parameter's layout";
  }
}

// The step API: a program that hands the Learner the same batches a fit's loader would, one train_step at a time,
// gets that fit exactly: the same events in the same order, the same losses, weights and validation.
TEST(LearnerSteps, TrainStepOverTheBatchesOfAFitIsThatFit) {
  struct Losses : fl::Callback {
    std::vector<at::Tensor> losses;
    void after_batch() override {
      if (learn().training) losses.push_back(learn().loss);
    }
  };
  const auto data = [] { return flt::regression_data({.n_train = 32, .n_valid = 8, .bs = 8, .shuffle = false}); };
  auto fitted = flt::regression_learner(data());
  auto fit_log = std::make_shared<EventLog>();
  auto fit_losses = std::make_shared<Losses>();
  fitted->add_cbs({fit_log, fit_losses});
  fitted->fit_one_cycle(2, 0.05);

  auto stepped = flt::regression_learner(data());
  auto step_log = std::make_shared<EventLog>();
  stepped->add_cb(step_log);
  fl::DataLoader batches(stepped->dls().train().dataset_ptr(), {.bs = 8, .seed = 0});
  stepped->begin_steps({.steps = 8, .steps_per_epoch = 4}, [](fl::Learner& l, int n) { l.fit_one_cycle(n, 0.05); });
  EXPECT_TRUE(stepped->stepping());
  std::vector<at::Tensor> losses;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (const auto& batch : batches) losses.push_back(stepped->train_step(batch.inputs, batch.targets));
  EXPECT_FALSE(stepped->stepping()) << "the planned steps are done";
  stepped->end_steps();

  EXPECT_EQ(step_log->events, fit_log->events);
  ASSERT_EQ(losses.size(), fit_losses->losses.size());
  for (std::size_t i = 0; i < losses.size(); ++i) EXPECT_TRUE(torch::equal(losses[i], fit_losses->losses[i])) << i;
  EXPECT_TRUE(flt::same_tensors(flt::snapshot(stepped->model()), flt::snapshot(fitted->model())));
  EXPECT_EQ(stepped->recorder().losses(), fitted->recorder().losses());
  EXPECT_EQ(stepped->recorder().lrs(), fitted->recorder().lrs());
  ASSERT_EQ(stepped->recorder().history().size(), 2u);
  for (std::size_t e = 0; e < 2; ++e)
    EXPECT_EQ(stepped->recorder().history()[e].valid_loss, fitted->recorder().history()[e].valid_loss) << e;
  EXPECT_EQ(stepped->dls().train().size(), 4) << "the training loader is the Learner's own again";
  EXPECT_NE(fl::testing::message_of([&] { stepped->train_step(losses[0], losses[0]); }).find("no steps under way"),
            std::string::npos);
}

// Ended before the planned steps, the steps end as a cancelled fit; predict_batch runs between steps in eval mode and
// leaves the model as it was; a callback's error reaches the train_step whose batch raised it, and the Learner can
// step again.
TEST(LearnerSteps, EndStepsEarlyPredictBetweenStepsAndErrors) {
  auto learn = flt::regression_learner(two_batches());
  auto log = std::make_shared<EventLog>();
  learn->add_cb(log);
  const auto x = torch::randn({4, 4}), y = torch::randn({4, 1});
  EXPECT_NE(fl::testing::message_of([&] {
              learn->begin_steps({.steps = 10, .steps_per_epoch = 4});
            }).find("steps_per_epoch 4 must divide steps 10"),
            std::string::npos);
  EXPECT_NE(fl::testing::message_of([&] { learn->begin_steps({.steps = 0}); }).find("steps must be positive"),
            std::string::npos);
  learn->begin_steps({.steps = 10});
  learn->train_step(x, y);
  EXPECT_TRUE(learn->model().is_training());
  const auto predicted = learn->predict_batch({x});
  EXPECT_TRUE(learn->model().is_training()) << "predict_batch puts the mode back";
  {
    torch::NoGradGuard no_grad;
    learn->model().eval();
    EXPECT_TRUE(torch::equal(predicted, learn->forward({x})));
    learn->model().train();
  }
  learn->train_step(x, y);
  learn->end_steps();
  ASSERT_GE(log->events.size(), 2u);
  EXPECT_EQ(log->events[log->events.size() - 2], "after_cancel_fit");
  EXPECT_EQ(log->events.back(), "after_fit");
  EXPECT_FALSE(learn->stepping());

  log->cancel_at = Event::after_loss;
  log->only_iter = 1;
  log->thrower = [] { throw std::runtime_error("the simulation's sensor failed"); };
  learn->begin_steps({.steps = 4});
  learn->train_step(x, y);
  EXPECT_NE(fl::testing::message_of([&] { learn->train_step(x, y); }).find("the simulation's sensor failed"),
            std::string::npos);
  EXPECT_NE(fl::testing::message_of([&] { learn->train_step(x, y); }).find("the steps have ended (2 of 4 trained"),
            std::string::npos);
  log->thrower = nullptr;
  learn->begin_steps({.steps = 2});  // the ended steps are put away first
  learn->train_step(x, y);
  learn->train_step(x, y);
  learn->end_steps();
}

// A Learner made without data trains from the program's batches alone.
TEST(LearnerSteps, ALearnerWithoutDataTrainsFromTheProgramsBatches) {
  torch::manual_seed(0);
  fl::Learner learn(torch::nn::Linear(3, 1), fl::mse_loss(), {.progress = false, .device = torch::kCPU});
  EXPECT_EQ(learn.dls().train().n(), 0);
  EXPECT_THROW(learn.fit(1), fl::DataError);
  const auto w = torch::tensor({{1.0F, -2.0F, 0.5F}});
  learn.begin_steps({.steps = 200}, [](fl::Learner& l, int n) { l.fit(n, 0.05); });
  at::Tensor loss;
  for (int i = 0; i < 200; ++i) {
    const auto x = torch::randn({16, 3});
    loss = learn.train_step(x, x.mm(w.t()));
  }
  learn.end_steps();
  EXPECT_LT(loss.item<double>(), 1e-3);
}

// The steps' fit runs on the program's thread, in turns with it, and each side keeps its own thread state: the
// program's NoGradGuard around train_step does not reach the fit, the fit's autocast does not reach the program.
// The program drives the steps: a callback of the fit cannot end them from inside.
TEST(LearnerSteps, TheFitRunsOnTheProgramsThreadEachSideWithItsOwnThreadState) {
  struct Probe : fl::Callback {
    std::vector<std::thread::id> threads;
    std::vector<bool> grad, autocasting;
    bool end_from_inside = false;
    std::string inside_error;
    void before_fit() override { at::autocast::set_autocast_enabled(at::kCPU, true); }
    void after_fit() override { at::autocast::set_autocast_enabled(at::kCPU, false); }
    void after_loss() override {
      if (!learn().training) return;
      threads.push_back(std::this_thread::get_id());
      grad.push_back(at::GradMode::is_enabled());
      autocasting.push_back(at::autocast::is_autocast_enabled(at::kCPU));
    }
    void after_batch() override {
      if (end_from_inside) inside_error = fl::testing::message_of([&] { learn().end_steps(); });
    }
  };
  auto learn = flt::regression_learner(two_batches());
  auto probe = std::make_shared<Probe>();
  learn->add_cb(probe);
  const auto x = torch::randn({4, 4}), y = torch::randn({4, 1});
  const auto before = flt::snapshot(learn->model());
  learn->begin_steps({.steps = 6});
  {
    torch::NoGradGuard program_without_grad;
    learn->train_step(x, y);
    EXPECT_FALSE(at::GradMode::is_enabled()) << "the program's grad mode is its own again";
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "the fit's autocast stays in the fit";
  EXPECT_FALSE(flt::same_tensors(flt::snapshot(learn->model()), before)) << "trained under the program's guard";
  probe->end_from_inside = true;
  learn->train_step(x, y);
  probe->end_from_inside = false;
  EXPECT_NE(probe->inside_error.find("end_steps was called from inside the steps' fit"), std::string::npos)
      << probe->inside_error;
  std::thread::id other;
  std::thread([&] {  // a program may drive its steps from another thread: the step then runs there
    other = std::this_thread::get_id();
    learn->train_step(x, y);
  })
      .join();
  EXPECT_TRUE(learn->stepping());
  learn->train_step(x, y);
  learn->end_steps();
  ASSERT_EQ(probe->threads.size(), 4u);
  for (std::size_t i = 0; i < probe->threads.size(); ++i) {
    EXPECT_EQ(probe->threads[i], i == 2 ? other : std::this_thread::get_id()) << "step " << i << " ran on its caller";
    EXPECT_TRUE(probe->grad[i]) << i;
    EXPECT_TRUE(probe->autocasting[i]) << i;
  }
}

namespace {

// Steps/s of a plain LibTorch training loop (the MLP 128-512-512-128, batch 256, SGD by hand): the best of two
// slices, so that a neighbour's moment on the cores does not count.
double plain_loop_speed(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y) {
  double best = 0;
  for (int slice = 0; slice < 2; ++slice) {
    const auto start = std::chrono::steady_clock::now();
    constexpr int steps = 15;
    for (int s = 0; s < steps; ++s) {
      torch::mse_loss(model->forward(x), y).backward();
      torch::NoGradGuard no_grad;
      for (auto& p : model->parameters()) {
        p.sub_(p.grad(), 1e-3);
        p.mutable_grad().zero_();
      }
    }
    best = std::max(best, steps / std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return best;
}

torch::nn::Sequential mlp_128_512_512_128() {
  return torch::nn::Sequential(torch::nn::Linear(128, 512), torch::nn::ReLU(), torch::nn::Linear(512, 512),
                               torch::nn::ReLU(), torch::nn::Linear(512, 128));
}

// An IDX file as Fashion-MNIST's: big-endian magic (uint8, `t.dim()` dimensions) and sizes, then the bytes.
void write_idx(const std::filesystem::path& file, const at::Tensor& t) {
  std::ofstream out(file, std::ios::binary);
  const auto be32 = [&](std::uint32_t v) {
    const char bytes[4] = {static_cast<char>(v >> 24), static_cast<char>(v >> 16), static_cast<char>(v >> 8),
                           static_cast<char>(v)};
    out.write(bytes, 4);
  };
  be32(0x0800U | static_cast<std::uint32_t>(t.dim()));
  for (const auto size : t.sizes()) be32(static_cast<std::uint32_t>(size));
  const auto bytes = t.contiguous();
  out.write(reinterpret_cast<const char*>(bytes.data_ptr<std::uint8_t>()), bytes.numel());
}

}  // namespace

// A guard against threads that fight (a ratio in one process, robust to the machine's speed): a thread of
// fastlearn's doing ATen work beside the program's own brings an OpenMP team of its own, and two teams on the same
// cores slow both. The program's own loop keeps its speed while steps are under way: rounds of the loop without
// steps, then 20 train_steps, then the loop again with the steps under way, each round ended by end_steps.
TEST(LearnerThreads, TheProgramsOwnLoopKeepsItsSpeedWhileStepsAreUnderWay) {
  torch::manual_seed(0);
  auto own = mlp_128_512_512_128();
  const auto x = torch::randn({256, 128}), y = torch::tanh(x);
  // Made first: a Learner installs fastlearn's CPU memory cache, which speeds up the program's loop too.
  fl::Learner learn(mlp_128_512_512_128(), fl::mse_loss(), {.progress = false, .device = torch::kCPU});
  plain_loop_speed(own, x, y);  // warm-up
  std::vector<double> ratios;
  std::string rounds;
  for (int round = 0; round < 5; ++round) {
    const double before = plain_loop_speed(own, x, y);
    learn.begin_steps({.steps = 1000}, [](fl::Learner& l, int n) { l.fit(n, 1e-3); });
    for (int i = 0; i < 20; ++i) learn.train_step(x, y);
    const double between = plain_loop_speed(own, x, y);
    learn.end_steps();
    ratios.push_back(between / before);
    rounds += fmt::format(" {:.0f}/{:.0f}", between, before);
  }
  std::sort(ratios.begin(), ratios.end());
  EXPECT_GE(ratios[2], 0.85) << "the program's loop between steps over before them, steps/s of each round:" << rounds
                             << " (" << at::get_num_threads() << " threads)";
}

// Loader workers exist to make training faster: a fit fed by two of them is not slower than one that loads its
// batches itself (IDX images as Fashion-MNIST's, simple_cnn, an epoch each way, the best of three, interleaved).
TEST(LearnerThreads, LoaderWorkersDoNotSlowTheTrainingTheyFeed) {
  const auto dir = std::filesystem::temp_directory_path() / ("fastlearn-loader-workers-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  torch::manual_seed(0);
  write_idx(dir / "train-images-idx3-ubyte", torch::randint(0, 256, {4096, 28, 28}, torch::kUInt8));
  write_idx(dir / "train-labels-idx1-ubyte", torch::randint(0, 10, {4096}, torch::kUInt8));
  write_idx(dir / "t10k-images-idx3-ubyte", torch::randint(0, 256, {256, 28, 28}, torch::kUInt8));
  write_idx(dir / "t10k-labels-idx1-ubyte", torch::randint(0, 10, {256}, torch::kUInt8));
  auto epoch_seconds = [&](int workers) {
    auto dls = fl::ImageDataLoaders::from_idx(dir, {.bs = 128, .num_workers = workers, .seed = 0});
    fl::Learner learn(dls, fl::models::simple_cnn(10), fl::cross_entropy(), {.progress = false, .device = torch::kCPU});
    const auto start = std::chrono::steady_clock::now();
    learn.fit(1, 1e-3);
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  epoch_seconds(0);  // warm-up
  double alone = 1e9, fed = 1e9;
  for (int round = 0; round < 3; ++round) {
    alone = std::min(alone, epoch_seconds(0));
    fed = std::min(fed, epoch_seconds(2));
  }
  std::filesystem::remove_all(dir);
  EXPECT_GE(alone / fed, 0.85) << "an epoch took " << alone << " s loading in the training thread, " << fed
                               << " s with 2 loader workers (" << at::get_num_threads() << " threads)";
}

// Samples the program sets aside are the validation set of every epoch end: the last StepPlan::held_out of them.
TEST(LearnerSteps, TheLastHeldOutSamplesAreValidatedAtEachEpochEnd) {
  torch::manual_seed(0);
  fl::Learner learn(torch::nn::Linear(3, 1), fl::mse_loss(), {.progress = false, .device = torch::kCPU});
  EXPECT_THROW(learn.hold_out({torch::zeros({1, 3})}, {torch::zeros({1, 1})}), fl::Error);
  learn.begin_steps({.steps = 20, .steps_per_epoch = 10, .held_out = 8, .valid_bs = 3},
                    [](fl::Learner& l, int n) { l.fit(n, 0.05); });
  at::Tensor held, validated;  // the rows set aside (the last 8 kept); those when the last step ended the epoch
  for (int s = 0; s < 20; ++s) {
    const auto x = torch::randn({6, 3});
    learn.train_step(x, x.sum(1, true));
    if (s == 19) validated = held;  // the epoch's validation ran inside this train_step
    const auto v = torch::randn({4, 3});
    learn.hold_out({v}, {v.sum(1, true) + 1});
    held = s == 0 ? v : torch::cat({held, v});
    if (held.size(0) > 8) held = held.narrow(0, held.size(0) - 8, 8);
  }
  learn.end_steps();
  const auto& history = learn.recorder().history();
  ASSERT_EQ(history.size(), 2u);
  torch::NoGradGuard no_grad;
  const double expected = torch::mse_loss(learn.forward({validated}), validated.sum(1, true) + 1).item<double>();
  EXPECT_NEAR(history.back().valid_loss, expected, 1e-6) << "the last 8 rows set aside, in batches of 3";
  EXPECT_EQ(learn.dls().valid().n(), 0) << "the Learner's own (empty) validation loader is back";
  auto plain = flt::regression_learner(two_batches());
  plain->begin_steps({.steps = 2});
  EXPECT_NE(fl::testing::message_of([&] {
              plain->hold_out({torch::zeros({1, 4})}, {torch::zeros({1, 1})});
            }).find("holds no sample out"),
            std::string::npos);
  plain->end_steps();

  // A plan that holds samples out, and a program that never hands any over: said once, at the first epoch's end.
  fl::Learner forgetful(torch::nn::Linear(3, 1), fl::mse_loss(), {.progress = false, .device = torch::kCPU});
  forgetful.begin_steps({.steps = 4, .steps_per_epoch = 2, .held_out = 8},
                        [](fl::Learner& l, int n) { l.fit(n, 0.05); });
  ::testing::internal::CaptureStderr();
  for (int s = 0; s < 4; ++s) forgetful.train_step(torch::randn({2, 3}), torch::randn({2, 1}));
  const auto said = ::testing::internal::GetCapturedStderr();
  forgetful.end_steps();
  const std::string warning = "the steps hold out 8 sample(s) for validation";
  EXPECT_NE(said.find(warning + " (StepPlan::held_out, data.held_out), and none was held out by the end of epoch 0"),
            std::string::npos)
      << said;
  EXPECT_EQ(said.find(warning), said.rfind(warning)) << "once: " << said;
}

// --- LearnerOptions::cuda_graph: the plan and the decisions that need no GPU --------------------------------------

namespace {

fl::BatchKey key_of(std::int64_t n) { return fl::BatchKey{.values = {n}}; }

using Action = fl::CapturePlan::Action;

}  // namespace

// Warm-up steps first (three for the fit's first shape, one for each further shape), then one capture per shape, then
// replays; a moved state drops every graph and each shape warms up (one step) and captures again; shapes past the
// limit run eagerly with one notice; a refusal makes every further step eager and keeps its first reason.
TEST(CapturePlan, WarmsUpCapturesEachShapeOnceAndReplays) {
  fl::CapturePlan plan({.warmup_steps = 3, .shape_warmup_steps = 1, .max_graphs = 2});
  const auto a = key_of(256), b = key_of(96), c = key_of(7);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(plan.next(a), Action::eager) << i;
  EXPECT_EQ(plan.next(a), Action::capture);
  plan.captured(a);
  EXPECT_EQ(plan.next(a), Action::replay);
  EXPECT_EQ(plan.next(b), Action::eager);  // a ragged last batch: its own warm-up step
  EXPECT_EQ(plan.next(b), Action::capture);
  plan.captured(b);
  EXPECT_EQ(plan.next(b), Action::replay);
  EXPECT_EQ(plan.next(a), Action::replay);
  EXPECT_EQ(plan.graphs(), 2U);
  EXPECT_FALSE(plan.take_notice());
  EXPECT_EQ(plan.next(c), Action::eager);  // a third shape, past max_graphs
  EXPECT_EQ(plan.next(c), Action::eager);
  const auto notice = plan.take_notice();
  ASSERT_TRUE(notice);
  EXPECT_NE(notice->find("more than 2 shapes"), std::string::npos) << *notice;
  EXPECT_FALSE(plan.take_notice());
  EXPECT_EQ(plan.captures(), 2);
  EXPECT_EQ(plan.replays(), 5);  // the two capturing steps and three replays
  EXPECT_EQ(plan.eager_steps(), 6);

  plan.invalidate();
  EXPECT_EQ(plan.graphs(), 0U);
  EXPECT_EQ(plan.next(a), Action::eager);
  EXPECT_EQ(plan.next(a), Action::capture);
  plan.captured(a);
  EXPECT_EQ(plan.next(a), Action::replay);
  EXPECT_EQ(plan.captures(), 3);

  plan.refuse("first reason");
  plan.refuse("second reason");
  EXPECT_TRUE(plan.refused());
  EXPECT_EQ(plan.why(), "first reason");
  EXPECT_EQ(plan.next(a), Action::eager);
  EXPECT_EQ(plan.next(b), Action::eager);
  EXPECT_THROW(fl::CapturePlan({.warmup_steps = 0}), fl::ConfigError);
}

// A graph's batch buffers are made for one shape, dtype, device and layout: any difference is another key.
TEST(CapturePlan, BatchKeysTellShapesDtypesAndLayoutsApart) {
  const auto x = torch::zeros({8, 3, 4, 4}), y = torch::zeros({8}, torch::kLong);
  const auto key = fl::batch_key({x}, {y});
  EXPECT_EQ(key, fl::batch_key({torch::ones({8, 3, 4, 4})}, {torch::ones({8}, torch::kLong)}));
  EXPECT_NE(key, fl::batch_key({torch::zeros({7, 3, 4, 4})}, {torch::zeros({7}, torch::kLong)}));
  EXPECT_NE(key, fl::batch_key({x.to(torch::kHalf)}, {y}));
  EXPECT_NE(key, fl::batch_key({x.contiguous(at::MemoryFormat::ChannelsLast)}, {y}));
  EXPECT_NE(key, fl::batch_key({x}, {y.to(torch::kInt)}));
  EXPECT_NE(key, fl::batch_key({x, x}, {y}));
  EXPECT_NE(key, fl::batch_key({x}, {}));
}

namespace {

// Handles before_step with a body of its own, declaring nothing.
struct ReadsInTheStep : fl::Callback {
  std::string name() const override { return "reads_in_the_step"; }
  void before_step() override { ++calls; }
  int calls = 0;
};

// The same work, declared capturable.
struct DeclaredCapturable : ReadsInTheStep {
  std::string name() const override { return "declared_capturable"; }
  fl::CaptureSupport step_capture() const override { return {.kind = fl::StepCapture::capturable, .why = {}}; }
};

// Only around the step.
struct AroundTheStep : fl::Callback {
  std::string name() const override { return "around_the_step"; }
  void before_batch() override {}
  void after_batch() override {}
};

struct Outcome {
  fl::StepGraphStats stats;
  std::vector<at::Tensor> weights;
  std::string warnings;
};

Outcome fit_with_cuda_graph(std::vector<fl::CallbackPtr> cbs, bool cuda_graph = true) {
  auto learn = flt::regression_learner(flt::regression_data({.shuffle = false}),
                                       {.opt_func = fl::Adam(), .cbs = std::move(cbs), .cuda_graph = cuda_graph});
  ::testing::internal::CaptureStderr();
  learn->fit_one_cycle(2, 1e-2);
  return {learn->step_graph_stats(), flt::snapshot(learn->model()), ::testing::internal::GetCapturedStderr()};
}

}  // namespace

// On the CPU the steps run eagerly, exactly as without the option, with one warning that says why; the reason a fit
// cannot be captured comes first from the callbacks: those that say so (GradientAccumulation, float16 loss scaling),
// then undeclared ones that handled an event inside the step. Declared or step-free callbacks pass.
TEST(StepCapture, OnTheCpuTheStepsRunEagerlyAsWithoutItAndTheReasonNamesWhatNeedsTheHost) {
  const auto plain = fit_with_cuda_graph({}, /*cuda_graph=*/false);
  EXPECT_EQ(plain.stats.eager_steps, 0);
  EXPECT_TRUE(plain.warnings.empty()) << plain.warnings;

  const auto on_cpu = fit_with_cuda_graph({std::make_shared<AroundTheStep>()});
  EXPECT_TRUE(flt::same_tensors(on_cpu.weights, plain.weights));
  EXPECT_EQ(on_cpu.stats.eager_steps, 8);  // 2 epochs of 4 batches
  EXPECT_EQ(on_cpu.stats.captures, 0);
  EXPECT_EQ(on_cpu.stats.replays, 0);
  EXPECT_NE(on_cpu.stats.eager_because.find("computes on cpu; CUDA graphs need a GPU"), std::string::npos)
      << on_cpu.stats.eager_because;
  EXPECT_EQ(on_cpu.warnings, "fastlearn: warning: cuda_graph: the training steps of this fit run eagerly: " +
                                 on_cpu.stats.eager_because + "\n");

  const auto declared = fit_with_cuda_graph({std::make_shared<DeclaredCapturable>()});
  EXPECT_NE(declared.stats.eager_because.find("computes on cpu"), std::string::npos) << declared.stats.eager_because;

  const auto undeclared = fit_with_cuda_graph({std::make_shared<ReadsInTheStep>()});
  EXPECT_NE(undeclared.stats.eager_because.find("'reads_in_the_step' handles before_step inside the step"),
            std::string::npos)
      << undeclared.stats.eager_because;
  EXPECT_TRUE(flt::same_tensors(undeclared.weights, plain.weights));

  const auto accumulating = fit_with_cuda_graph({std::make_shared<fl::GradientAccumulation>(16)});
  EXPECT_NE(accumulating.stats.eager_because.find("'gradient_accumulation' needs the host inside each step"),
            std::string::npos)
      << accumulating.stats.eager_because;

  const auto scaled = fit_with_cuda_graph(
      {std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16, .loss_scaling = true})});
  EXPECT_NE(scaled.stats.eager_because.find("'mixed_precision' needs the host inside each step: float16 loss scaling"),
            std::string::npos)
      << scaled.stats.eager_because;
  const auto bf16 =
      fit_with_cuda_graph({std::make_shared<fl::MixedPrecision>(fl::MixedPrecisionOptions{.dtype = at::kBFloat16})});
  EXPECT_NE(bf16.stats.eager_because.find("computes on cpu"), std::string::npos) << bf16.stats.eager_because;
  const auto clipped = fit_with_cuda_graph({std::make_shared<fl::GradientClip>()});
  EXPECT_NE(clipped.stats.eager_because.find("computes on cpu"), std::string::npos) << clipped.stats.eager_because;
}

// What the run-time check reads: the in-step events a callback received and handled itself.
TEST(StepCapture, ACallbackReportsTheInStepEventsItHandled) {
  auto log = std::make_shared<EventLog>();
  auto around = std::make_shared<AroundTheStep>();
  auto reads = std::make_shared<ReadsInTheStep>();
  learner_with(log);
  auto learn = flt::regression_learner(two_batches(), {.opt_func = fl::SGD()});
  learn->add_cbs({around, reads});
  learn->fit(1, 0.01);
  const std::vector<fl::Event> in_step{fl::Event::after_pred,     fl::Event::after_loss,  fl::Event::before_backward,
                                       fl::Event::after_backward, fl::Event::before_step, fl::Event::after_step};
  EXPECT_EQ(log->in_step_events_handled(), in_step);
  EXPECT_TRUE(around->in_step_events_handled().empty());
  EXPECT_EQ(reads->in_step_events_handled(), std::vector<fl::Event>{fl::Event::before_step});
  reads->forget_in_step_events();
  EXPECT_TRUE(reads->in_step_events_handled().empty());
  EXPECT_TRUE(fl::is_in_step(fl::Event::before_step));
  EXPECT_FALSE(fl::is_in_step(fl::Event::before_batch));
  EXPECT_FALSE(fl::is_in_step(fl::Event::after_batch));
}
