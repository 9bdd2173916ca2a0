// The built-in callbacks: trackers (early stopping, save best, reduce lr), file logs (CSV,
// metrics.json), the progress output, gradient accumulation and clipping, and mixed precision.
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/callbacks/epoch_logs.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/callbacks/save_model.h>
#include <fastlearn/callbacks/tracker.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/progress.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/sgd.h>

#include <ATen/autocast_mode.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>

#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

class Callbacks : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("fastlearn-cbs-" + std::to_string(getpid()) + "-" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::unique_ptr<fl::Learner> classifier(std::vector<fl::MetricPtr> metrics = {fl::accuracy()},
                                          fl::OptFunc opt = fl::Adam()) {
    torch::manual_seed(0);
    auto dls = flt::classification_data({.n_train = 64, .n_valid = 32, .bs = 8});
    return std::make_unique<fl::Learner>(
        dls, fl::models::mlp(4, {16}, 3), fl::cross_entropy(),
        fl::LearnerOptions{.opt_func = std::move(opt), .metrics = std::move(metrics), .path = dir_, .progress = false});
  }

  static std::string read(const fs::path& file) {
    std::ifstream in(file);
    return {std::istreambuf_iterator<char>(in), {}};
  }

  fs::path dir_;
};

}  // namespace

TEST_F(Callbacks, EarlyStoppingStopsAfterPatienceEpochsWithoutImprovement) {
  auto learn = classifier();
  auto stop = std::make_shared<fl::EarlyStopping>(fl::EarlyStoppingOptions{.patience = 2});
  learn->fit(10, 0.0, {.cbs = {stop}});  // lr 0: the valid loss never improves after the first epoch
  ASSERT_TRUE(stop->stopped_after().has_value());
  EXPECT_EQ(*stop->stopped_after(), 2);
  EXPECT_EQ(learn->recorder().history().size(), 3u);
}

TEST_F(Callbacks, TrackerDirectionFollowsTheMonitoredName) {
  auto learn = classifier();
  auto acc = std::make_shared<fl::EarlyStopping>(
      fl::EarlyStoppingOptions{.tracker = {.monitor = "accuracy"}, .patience = 100});
  learn->fit(3, 1e-2, {.cbs = {acc}});
  double best = -1;
  for (auto& r : learn->recorder().history()) best = std::max(best, r.metrics[0]);
  EXPECT_EQ(acc->best(), best) << "higher is better for accuracy";
  auto bad = std::make_shared<fl::EarlyStopping>(fl::EarlyStoppingOptions{.tracker = {.monitor = "f1"}});
  try {
    learn->fit(1, 1e-2, {.cbs = {bad}});
    FAIL();
  } catch (const fl::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no value called 'f1'"), std::string::npos) << e.what();
  }
}

TEST_F(Callbacks, SaveModelKeepsTheBestEpochAndLoadsItAtTheEnd) {
  auto learn = classifier();
  std::vector<std::vector<at::Tensor>> weights;
  struct Snap : fl::Callback {
    std::vector<std::vector<at::Tensor>>* out;
    void after_epoch() override { out->push_back(flt::snapshot(learn().model())); }
  };
  auto snap = std::make_shared<Snap>();
  snap->out = &weights;
  snap->order = 55;  // before SaveModel (60)
  auto save = std::make_shared<fl::SaveModel>(fl::SaveModelOptions{.fname = "best"});
  learn->fit(4, 3e-2, {.cbs = {snap, save}});
  ASSERT_TRUE(fs::exists(dir_ / "models" / "best.safetensors"));
  const auto& history = learn->recorder().history();
  std::size_t best = 0;
  for (std::size_t i = 1; i < history.size(); ++i) {
    if (history[i].valid_loss < history[best].valid_loss) best = i;
  }
  EXPECT_TRUE(flt::same_tensors(weights[best], flt::snapshot(learn->model()))) << "the best epoch is " << best;
}

TEST_F(Callbacks, SaveModelEveryEpoch) {
  auto learn = classifier();
  learn->fit(3, 1e-2, {.cbs = {std::make_shared<fl::SaveModel>(fl::SaveModelOptions{.fname = "e", .every_epoch = 1})}});
  for (int e = 0; e < 3; ++e) EXPECT_TRUE(fs::exists(dir_ / "models" / ("e_" + std::to_string(e) + ".safetensors")));
}

TEST_F(Callbacks, ReduceLROnPlateauDividesTheLearningRate) {
  auto learn = classifier({}, fl::SGD());
  auto floor = std::make_shared<fl::ReduceLROnPlateau>(
      fl::ReduceLROnPlateauOptions{.tracker = {.min_delta = 1e9}, .patience = 1, .factor = 10, .min_lr = 1e-3});
  learn->fit(3, 1.0, {.cbs = {floor}});
  // The first epoch improves on +inf; epochs 2 and 3 do not (min_delta is huge): 1 -> 0.1 -> 0.01.
  EXPECT_NEAR(learn->opt().hyper("lr", 0), 0.01, 1e-12);
}

TEST_F(Callbacks, CsvLoggerWritesAHeaderAndOneRowPerEpoch) {
  auto learn = classifier({fl::accuracy(), fl::error_rate()});
  auto csv = std::make_shared<fl::CSVLogger>();
  learn->fit(2, 1e-2, {.cbs = {csv}});
  EXPECT_EQ(csv->path(), dir_ / "history.csv");
  const auto text = read(csv->path());
  std::istringstream lines(text);
  std::string header, row0, row1, extra;
  std::getline(lines, header), std::getline(lines, row0), std::getline(lines, row1);
  EXPECT_FALSE(std::getline(lines, extra));
  EXPECT_EQ(header, "epoch,train_loss,valid_loss,accuracy,error_rate,time");
  EXPECT_EQ(row0.substr(0, 2), "0,");
  EXPECT_EQ(row1.substr(0, 2), "1,");
  const auto& r = learn->recorder().history()[1];
  EXPECT_NE(row1.find(fmt::format("{:.6f}", r.valid_loss)), std::string::npos) << row1;
  // append keeps the earlier rows and does not repeat the header
  learn->fit(1, 1e-2, {.cbs = {std::make_shared<fl::CSVLogger>(fl::CSVLoggerOptions{.append = true})}});
  const auto appended = read(csv->path());
  EXPECT_EQ(std::count(appended.begin(), appended.end(), '\n'), 4);
}

// A fit that resumes keeps the rows of the epochs before it without being told (no append), and drops those it
// trains again.
TEST_F(Callbacks, AResumedFitKeepsTheLogRowsBeforeItAndDropsThoseItTrainsAgain) {
  auto learn = classifier();
  learn->fit(3, 1e-2, {.cbs = {std::make_shared<fl::CSVLogger>()}});  // rows of epochs 0, 1, 2
  // As after resuming from the checkpoint of epoch 1 when the one of epoch 2 is torn: epochs 1 and 2 again.
  learn->fit(3, 1e-2, {.cbs = {std::make_shared<fl::CSVLogger>()}, .start_epoch = 1});
  std::istringstream lines(read(dir_ / "history.csv"));
  std::vector<std::string> epochs;
  std::string line;
  std::getline(lines, line);
  EXPECT_EQ(line.substr(0, 6), "epoch,");
  while (std::getline(lines, line)) epochs.push_back(line.substr(0, line.find(',')));
  EXPECT_EQ(epochs, (std::vector<std::string>{"0", "1", "2"}));
}

TEST_F(Callbacks, MetricsJsonHasOneRecordPerEpoch) {
  auto learn = classifier();
  auto json_log = std::make_shared<fl::MetricsJson>();
  learn->fit(2, 1e-2, {.cbs = {json_log}});
  auto records = nlohmann::json::parse(read(dir_ / "metrics.json"));
  ASSERT_EQ(records.size(), 2u);
  const auto& history = learn->recorder().history();
  for (std::size_t e = 0; e < 2; ++e) {
    EXPECT_EQ(records[e]["epoch"], e);
    EXPECT_DOUBLE_EQ(records[e]["train_loss"].get<double>(), history[e].train_loss);
    EXPECT_DOUBLE_EQ(records[e]["valid_loss"].get<double>(), history[e].valid_loss);
    EXPECT_DOUBLE_EQ(records[e]["accuracy"].get<double>(), history[e].metrics[0]);
    EXPECT_GT(records[e]["seconds"].get<double>(), 0);
  }
}

TEST_F(Callbacks, ProgressPrintsATableWhenNotATerminal) {
  auto learn = classifier();
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  learn->fit(2, 1e-2, {.cbs = {std::make_shared<fl::Progress>(fl::ProgressOptions{.out = out})}});
  std::rewind(out);
  std::string text;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, out)) text.append(buf, n);
  std::fclose(out);
  EXPECT_EQ(text.find('\r'), std::string::npos) << "no live bar when the output is not a terminal";
  std::istringstream lines(text);
  std::string header, row;
  std::getline(lines, header);
  EXPECT_EQ(header.substr(0, 5), "epoch");
  EXPECT_NE(header.find("train_loss"), std::string::npos);
  EXPECT_NE(header.find("accuracy"), std::string::npos);
  int rows = 0;
  while (std::getline(lines, row)) ++rows;
  EXPECT_EQ(rows, 2);
}

TEST_F(Callbacks, ProgressPrintsNoTableDuringLrFindAndOneAfterIt) {
  // The sweep's "epochs" skip validation: fastai's lr_find logs no row, and nor does this one.
  auto learn = classifier();
  std::FILE* out = std::tmpfile();
  ASSERT_NE(out, nullptr);
  learn->add_cb(std::make_shared<fl::Progress>(fl::ProgressOptions{.out = out}));
  (void)learn->lr_find({.num_it = 20, .stop_div = false});
  learn->fit(1, 1e-2);
  std::rewind(out);
  std::string text;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, out)) text.append(buf, n);
  std::fclose(out);
  EXPECT_EQ(text.find("nan"), std::string::npos) << text;
  EXPECT_EQ(std::count(text.begin(), text.end(), '\n'), 2) << "the fit's header and its one row:\n" << text;
}

TEST_F(Callbacks, ProgressDrawsLiveBarsOnATerminal) {
  auto learn = classifier();
  std::FILE* out = std::tmpfile();
  learn->fit(
      1, 1e-2,
      {.cbs = {std::make_shared<fl::Progress>(fl::ProgressOptions{.out = out, .live = true, .refresh_seconds = 0})}});
  std::rewind(out);
  std::string text;
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, out)) text.append(buf, n);
  std::fclose(out);
  EXPECT_NE(text.find("train ["), std::string::npos);
  EXPECT_NE(text.find("8/8"), std::string::npos) << "the bar reaches the end of the 8 training batches";
  EXPECT_NE(text.find("epoch 1/1"), std::string::npos);
  EXPECT_EQ(fl::Progress::format_time(3725), "1:02:05");
  EXPECT_EQ(fl::Progress::format_time(65), "01:05");
}

TEST_F(Callbacks, GradientAccumulationMatchesOneLargeBatch) {
  // SGD on 16 items: batches of 4 accumulated to 16 must equal one batch of 16 (up to float rounding).
  auto make = [](std::int64_t bs) {
    return flt::regression_learner(flt::regression_data({.n_train = 16, .n_valid = 4, .bs = bs, .shuffle = false}),
                                   {.opt_func = fl::SGD()});
  };
  auto big = make(16);
  big->fit(3, 0.1);
  auto small = make(4);
  small->fit(3, 0.1, {.cbs = {std::make_shared<fl::GradientAccumulation>(16)}});
  auto a = flt::snapshot(big->model()), b = flt::snapshot(small->model());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].allclose(b[i], 1e-5, 1e-6)) << a[i] << b[i];
  EXPECT_EQ(small->opt().step_count(), 3) << "one step per 16 items";
  // The logged losses are the real batch losses, not the scaled ones.
  EXPECT_NEAR(small->recorder().history()[0].train_loss, big->recorder().history()[0].train_loss,
              1e-5 * big->recorder().history()[0].train_loss);
}

TEST_F(Callbacks, GradientClipBoundsTheGlobalNorm) {
  auto learn = classifier({}, fl::SGD());
  struct Norm : fl::Callback {
    double max_seen = 0;
    void before_step() override {
      double sq = 0;
      for (auto& p : learn().model().parameters()) {
        if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
      }
      max_seen = std::max(max_seen, std::sqrt(sq));
    }
  };
  auto norm = std::make_shared<Norm>();
  norm->order = 20;  // after the clip (11)
  auto clip = std::make_shared<fl::GradientClip>(fl::GradientClipOptions{.max_norm = 0.01});
  learn->fit(1, 1e-2, {.cbs = {clip, norm}});
  EXPECT_GT(clip->last_norm(), 0.01) << "the gradients were larger than the bound before clipping";
  EXPECT_LE(norm->max_seen, 0.01 * (1 + 1e-5));
}

TEST_F(Callbacks, MixedPrecisionBf16OnCpuTrainsAndLeavesAutocastOff) {
  auto learn = classifier();
  struct DtypeProbe : fl::Callback {
    c10::ScalarType seen = c10::ScalarType::Undefined;
    void after_pred() override { seen = learn().pred.scalar_type(); }
  };
  auto probe = std::make_shared<DtypeProbe>();
  auto mp = std::make_shared<fl::MixedPrecision>();
  learn->fit(2, 1e-2, {.cbs = {mp, probe}});
  EXPECT_EQ(mp->dtype(), at::kBFloat16);
  EXPECT_EQ(probe->seen, at::kBFloat16) << "the forward ran under autocast";
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU)) << "autocast is off outside the batch";
  EXPECT_LT(learn->recorder().history().back().valid_loss, learn->recorder().history().front().train_loss);
  EXPECT_EQ(mp->scale(), 1.0) << "no loss scaling with bfloat16";
}

TEST_F(Callbacks, LossScalingSkipsStepsWithNonFiniteGradientsAndBacksOff) {
  auto learn = classifier({}, fl::SGD());
  // Poison the gradients of the second training batch.
  struct Poison : fl::Callback {
    void after_backward() override {
      if (learn().train_iter == 1) learn().model().parameters()[0].mutable_grad()[0][0] = INFINITY;
    }
  };
  struct StepProbe : fl::Callback {
    std::vector<bool> changed;
    std::vector<at::Tensor> before;
    void before_step() override { before = flt::snapshot(learn().model()); }
    void after_step() override { changed.push_back(!flt::same_tensors(before, flt::snapshot(learn().model()))); }
  };
  auto poison = std::make_shared<Poison>();
  auto probe = std::make_shared<StepProbe>();
  probe->order = 5;  // its before_step snapshot runs before MixedPrecision (10) may skip the step
  auto mp = std::make_shared<fl::MixedPrecision>(
      fl::MixedPrecisionOptions{.dtype = at::kHalf, .loss_scaling = true, .init_scale = 1024});
  learn->fit(1, 1e-2, {.cbs = {poison, probe, mp}});
  ASSERT_EQ(probe->changed.size(), 8u);
  EXPECT_TRUE(probe->changed[0]);
  EXPECT_FALSE(probe->changed[1]) << "the step with an inf gradient is skipped";
  EXPECT_TRUE(probe->changed[2]);
  EXPECT_EQ(mp->skipped_steps(), 1);
  EXPECT_EQ(mp->scale(), 512) << "the scale backs off by half";
  for (auto& p : learn->model().parameters()) EXPECT_TRUE(p.isfinite().all().item<bool>());
}

TEST_F(Callbacks, LrFindLeavesLogsAndTrackersAlone) {
  torch::manual_seed(0);
  auto dls = flt::classification_data({.n_train = 64, .n_valid = 32, .bs = 8});
  auto csv = std::make_shared<fl::CSVLogger>();
  auto save = std::make_shared<fl::SaveModel>(fl::SaveModelOptions{.fname = "end", .at_end = true});
  fl::Learner learn(dls, fl::models::mlp(4, {16}, 3), fl::cross_entropy(),
                    {.metrics = {fl::accuracy()}, .cbs = {csv, save}, .path = dir_, .progress = false});
  learn.fit(1, 1e-2);
  const auto log = read(dir_ / "history.csv");
  fs::remove(dir_ / "models" / "end.safetensors");
  learn.lr_find({.num_it = 20});
  EXPECT_EQ(read(dir_ / "history.csv"), log) << "the sweep neither truncates nor extends the CSV log";
  EXPECT_FALSE(fs::exists(dir_ / "models" / "end.safetensors")) << "SaveModel stands aside during lr_find";
}

TEST_F(Callbacks, MetricsJsonOfAResumedFitKeepsTheEarlierEpochs) {
  auto learn = classifier();
  learn->fit(3, 1e-2, {.cbs = {std::make_shared<fl::MetricsJson>()}});
  const auto first = nlohmann::json::parse(read(dir_ / "metrics.json"));
  learn->fit(3, 1e-2, {.cbs = {std::make_shared<fl::MetricsJson>()}, .start_epoch = 2});
  const auto resumed = nlohmann::json::parse(read(dir_ / "metrics.json"));
  ASSERT_EQ(resumed.size(), 3u);
  EXPECT_EQ(resumed[0], first[0]);
  EXPECT_EQ(resumed[1], first[1]);
  EXPECT_EQ(resumed[2]["epoch"], 2);
}

TEST_F(Callbacks, AnUnknownMonitorFailsBeforeTheFirstEpoch) {
  auto learn = classifier();
  struct Count : fl::Callback {
    int epochs = 0;
    void before_epoch() override { ++epochs; }
  };
  auto count = std::make_shared<Count>();
  EXPECT_THROW(learn->fit(2, 1e-2,
                          {.cbs = {count, std::make_shared<fl::EarlyStopping>(
                                              fl::EarlyStoppingOptions{.tracker = {.monitor = "acuracy"}})}}),
               fl::Error);
  EXPECT_EQ(count->epochs, 0);
  // Attached to the learner, it also fails before an lr_find sweep (that would otherwise run first).
  learn->add_cb(count);
  learn->add_cb(std::make_shared<fl::EarlyStopping>(fl::EarlyStoppingOptions{.tracker = {.monitor = "acuracy"}}));
  EXPECT_THROW((void)learn->lr_find({.num_it = 20}), fl::Error);
  EXPECT_EQ(count->epochs, 0);
}

// A grey batch stored row by row already has its values in channels-last order: it gets the strides a copy
// would have, without the copy. Other tensors are copied as before; every result holds the same values.
TEST(ChannelsLast, AOneChannelBatchIsRestridedWithoutACopy) {
  const auto cl = at::MemoryFormat::ChannelsLast;
  auto gen = at::detail::createCPUGenerator(3);
  const auto grey = at::randn({4, 1, 5, 6}, gen);
  const auto restrided = fl::models::as_channels_last(grey);
  EXPECT_EQ(restrided.data_ptr(), grey.data_ptr()) << "no copy";
  EXPECT_EQ(restrided.strides(), at::empty_like(grey, cl).strides());
  EXPECT_EQ(restrided.suggest_memory_format(), cl);
  EXPECT_TRUE(torch::equal(restrided, grey));
  for (const auto& other : {at::randn({4, 3, 5, 6}, gen), at::randn({4, 1, 6, 5}, gen).transpose(2, 3),
                            at::randn({8, 1, 5, 6}, gen).slice(0, 0, 8, 2)}) {
    const auto copied = fl::models::as_channels_last(other);
    EXPECT_NE(copied.data_ptr(), other.data_ptr()) << other.strides();
    EXPECT_EQ(copied.suggest_memory_format(), cl) << other.strides();
    EXPECT_TRUE(torch::equal(copied, other)) << other.strides();
  }
}

TEST_F(Callbacks, ChannelsLastTrainsLikeTheDefaultLayoutWithTheSameParameters) {
  auto gen = at::detail::createCPUGenerator(5);
  auto y = at::randint(0, 3, {48}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({48, 1, 12, 12}, gen) + y.to(at::kFloat).view({48, 1, 1, 1});
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  auto train = [&](bool channels_last) {
    torch::manual_seed(0);
    fl::DataLoaders dls(fl::DataLoader(ds, {.bs = 8, .shuffle = true, .seed = 1}), fl::DataLoader(ds, {.bs = 16}), 3);
    auto learn = std::make_unique<fl::Learner>(
        dls, fl::models::conv_net({.widths = {8, 16}, .classes = 3, .input_size = 12}), fl::cross_entropy(),
        fl::LearnerOptions{.opt_func = fl::Adam(), .path = dir_, .progress = false});
    const auto weight = learn->model().parameters()[3];  // the 16x8x3x3 convolution; the optimizer holds this tensor
    learn->fit_one_cycle(2, 1e-2,
                         channels_last ? fl::OneCycleOptions{.fit = {.cbs = {std::make_shared<fl::ChannelsLast>()}}}
                                       : fl::OneCycleOptions{});
    EXPECT_TRUE(weight.is_same(learn->model().parameters()[3]));
    EXPECT_EQ(weight.is_contiguous(at::MemoryFormat::ChannelsLast) && !weight.is_contiguous(), channels_last);
    const auto first = learn->model().parameters()[0];  // 8x1x3x3: one input channel, contiguous in both formats
    EXPECT_EQ(first.suggest_memory_format() == at::MemoryFormat::ChannelsLast, channels_last)
        << "the first convolution must run channels-last too, or every layer after it converts";
    return learn;
  };
  const auto plain = train(false), nhwc = train(true);
  const auto& a = plain->recorder().history();
  const auto& b = nhwc->recorder().history();
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t e = 0; e < a.size(); ++e) {
    EXPECT_NEAR(a[e].train_loss, b[e].train_loss, 1e-4) << "epoch " << e;
    EXPECT_NEAR(a[e].valid_loss, b[e].valid_loss, 1e-4) << "epoch " << e;
  }
  EXPECT_LT(b.back().valid_loss, b.front().train_loss) << "it learns";
  const auto pa = plain->model().parameters(), pb = nhwc->model().parameters();
  for (std::size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(pa[i].allclose(pb[i], 1e-4, 1e-5)) << "parameter " << i;
}
