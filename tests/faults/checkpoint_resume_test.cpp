// Mid-epoch checkpoints and resume (Checkpointer, latest_checkpoint, FitOptions::resume_from) and the
// graceful stop on SIGINT / SIGTERM: a fit resumed from any checkpoint ends bit for bit like one that was
// not interrupted, on one process and on two ranks.
#include "support/multiprocess.h"
#include "support/tiny_tasks.h"

#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/epoch_logs.h>
#include <fastlearn/callbacks/graceful_stop.h>
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <csignal>
#include <cstdint>
#include <filesystem>
#include <fstream>

namespace {

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;
using flt::RankContext;

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / fmt::format("fastlearn-ckpt-{}-{}", tag, flt::test_process_id())) {
    if (!flt::in_rank_process()) fs::remove_all(path);
  }
  ~TempDir() {
    if (!flt::in_rank_process()) fs::remove_all(path);
  }
};

// Every training batch's loss and the model after the fit.
class LossLog : public fl::Callback {
 public:
  std::string name() const override { return "loss_log"; }
  void after_loss() override {
    if (learn().training) losses.push_back(learn().loss.item<double>());
  }
  std::vector<double> losses;
};

// Sends this process `sig` after training batch `batch` of epoch `epoch` of the fit of phase `phase`.
class RaiseAt : public fl::Callback {
 public:
  RaiseAt(int e, std::int64_t b, int s, std::string p = {}) : epoch(e), batch(b), sig(s), phase(std::move(p)) {}
  std::string name() const override { return "raise_at"; }
  void after_batch() override {
    const auto& l = learn();
    if (l.training && l.phase == phase && l.epoch == epoch && l.iter == batch) std::raise(sig);
  }
  int epoch;
  std::int64_t batch;
  int sig;
  std::string phase;
};

// A classifier with dropout (so the global RNG matters) on 3 blobs: 48 items, bs 8 -> 6 batches per epoch.
std::unique_ptr<fl::Learner> make_learner(const fs::path& path, std::vector<fl::CallbackPtr> cbs,
                                          fl::Splitter splitter = {}) {
  torch::manual_seed(5);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Dropout(0.3),
                                     torch::nn::Linear(16, 3));
  auto dls = flt::classification_data({.n_train = 48, .n_valid = 16, .bs = 8, .seed = 9});
  return std::make_unique<fl::Learner>(std::move(dls), model, fl::cross_entropy(),
                                       fl::LearnerOptions{.metrics = {fl::accuracy()},
                                                          .cbs = std::move(cbs),
                                                          .splitter = std::move(splitter),
                                                          .path = path,
                                                          .progress = false});
}

struct Run {
  std::vector<double> losses;
  std::vector<at::Tensor> weights;
  fl::EpochRecord last;
};

Run train(const fs::path& path, const fs::path& resume_from, std::vector<fl::CallbackPtr> extra = {},
          bool distributed = false) {
  auto log = std::make_shared<LossLog>();
  extra.push_back(log);
  auto learn = make_learner(path, extra);
  if (distributed) fl::to_distributed(*learn);
  learn->fit_one_cycle(3, 1e-2, {.fit = {.resume_from = resume_from}});
  if (distributed) fl::detach_distributed(*learn);
  return {log->losses, flt::snapshot(learn->model()), learn->recorder().history().back()};
}

void expect_same_end(const Run& reference, const Run& resumed, const std::string& what) {
  ASSERT_LE(resumed.losses.size(), reference.losses.size()) << what;
  const auto offset = reference.losses.size() - resumed.losses.size();
  for (std::size_t i = 0; i < resumed.losses.size(); ++i) {
    ASSERT_EQ(resumed.losses[i], reference.losses[offset + i]) << what << ": training batch " << offset + i;
  }
  EXPECT_TRUE(flt::same_tensors(reference.weights, resumed.weights)) << what << ": final weights differ";
  EXPECT_EQ(reference.last.train_loss, resumed.last.train_loss) << what;
  EXPECT_EQ(reference.last.valid_loss, resumed.last.valid_loss) << what;
  EXPECT_EQ(reference.last.metrics, resumed.last.metrics) << what;
}

TEST(Resume, FromAnyCheckpointEndsBitForBitLikeTheUninterruptedFit) {
  TempDir dir("single");
  auto keep_all = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 0});
  const auto reference = train(dir.path, {}, {keep_all});
  ASSERT_EQ(reference.losses.size(), 18u);
  const auto ckpts = dir.path / "checkpoints";
  // 6 per epoch inside the epochs and 3 at their ends; (e, 6) and (e + 1, 0) are both written.
  int files = 0;
  for (const auto& e : fs::directory_iterator(ckpts)) files += e.path().extension() == ".safetensors";
  EXPECT_EQ(files, 21);
  for (const auto& [epoch, batch] : std::vector<std::pair<int, int>>{{0, 1}, {1, 3}, {1, 6}, {2, 0}, {2, 5}}) {
    const auto file = ckpts / fl::checkpoint_file_name(epoch, batch);
    ASSERT_TRUE(fs::exists(file)) << file;
    const auto resumed = train(dir.path / "resumed", file);
    EXPECT_EQ(resumed.losses.size(), static_cast<std::size_t>(18 - 6 * epoch - batch));
    expect_same_end(reference, resumed, file.filename().string());
  }
}

// fine_tune(2) of the same classifier split into body and head: a frozen fit of 1 epoch (6 batches), then an
// unfrozen one of 2 epochs (12 batches), numbered on: epochs 0, then 1 and 2.
Run fine_tune(const fs::path& path, const fs::path& resume_from, std::vector<fl::CallbackPtr> extra = {},
              bool distributed = false) {
  auto log = std::make_shared<LossLog>();
  extra.push_back(log);
  auto learn = make_learner(path, extra, fl::models::body_head_split);
  if (distributed) fl::to_distributed(*learn);
  learn->fine_tune(2, 1e-2, {.fit = {.resume_from = resume_from}});
  if (distributed) fl::detach_distributed(*learn);
  const auto& history = learn->recorder().history();  // empty after a stop in the frozen fit's only epoch
  return {log->losses, flt::snapshot(learn->model()), history.empty() ? fl::EpochRecord{} : history.back()};
}

std::string phase_of(const fs::path& checkpoint) {
  const fl::CheckpointState header{.tensors = {}, .metadata = fl::load_safetensors_metadata(checkpoint)};
  return fl::fit_position(header, checkpoint.string()).value().phase;
}

// Checkpoints of both fits of a fine_tune say which fit they belong to and are named in one sequence (the
// unfrozen fit's epochs after the frozen one's), so none replaces another and the newest is the last; a fine_tune
// resumed from any of them (one of the unfrozen fit skips the frozen fit) ends bit for bit like the one that was
// not interrupted. The logs hold both fits' epochs.
TEST(Resume, FineTuneFromACheckpointOfEitherFitEndsBitForBitLikeTheUninterruptedRun) {
  TempDir dir("fine-tune");
  auto keep_all = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 0});
  const auto reference =
      fine_tune(dir.path, {}, {keep_all, std::make_shared<fl::CSVLogger>(), std::make_shared<fl::MetricsJson>()});
  ASSERT_EQ(reference.losses.size(), 18u);
  EXPECT_EQ(reference.last.epoch, 2) << "the unfrozen fit's epochs are numbered after the frozen one's";
  const auto ckpts = dir.path / "checkpoints";
  int files = 0;
  for (const auto& e : fs::directory_iterator(ckpts)) files += e.path().extension() == ".safetensors";
  EXPECT_EQ(files, 21) << "7 of the frozen fit and 14 of the unfrozen one, none replaced";
  EXPECT_EQ(phase_of(ckpts / fl::checkpoint_file_name(0, 3)), "frozen");
  EXPECT_EQ(phase_of(ckpts / fl::checkpoint_file_name(1, 0)), "frozen") << "the end of the frozen fit";
  EXPECT_EQ(phase_of(ckpts / fl::checkpoint_file_name(1, 3)), "unfrozen");
  EXPECT_EQ(phase_of(ckpts / fl::checkpoint_file_name(3, 0)), "unfrozen");
  EXPECT_EQ(fl::latest_checkpoint(ckpts), ckpts / fl::checkpoint_file_name(3, 0));
  std::ifstream csv(dir.path / "history.csv");
  std::vector<std::string> epochs;
  for (std::string line; std::getline(csv, line);) epochs.push_back(line.substr(0, line.find(',')));
  EXPECT_EQ(epochs, (std::vector<std::string>{"epoch", "0", "1", "2"})) << "history.csv has both fits";
  std::ifstream json_file(dir.path / "metrics.json");
  const std::string json((std::istreambuf_iterator<char>(json_file)), std::istreambuf_iterator<char>());
  for (const auto* epoch : {R"("epoch":0,)", R"("epoch":1,)", R"("epoch":2,)"})
    EXPECT_NE(json.find(epoch), std::string::npos) << "metrics.json lacks " << epoch << ":\n" << json;

  for (const auto& [epoch, batch] : std::vector<std::pair<int, int>>{{0, 3}, {1, 0}, {1, 1}, {1, 6}, {2, 0}, {2, 5}}) {
    const auto file = ckpts / fl::checkpoint_file_name(epoch, batch);
    ASSERT_TRUE(fs::exists(file)) << file;
    const auto resumed = fine_tune(dir.path / "resumed", file);
    EXPECT_EQ(resumed.losses.size(), static_cast<std::size_t>(18 - 6 * epoch - batch)) << file.filename();
    expect_same_end(reference, resumed, file.filename().string());
  }
}

// A stop in either fit of a fine_tune ends it there (the unfrozen fit does not start after a stopped frozen fit)
// with a checkpoint from which the resumed fine_tune ends like the uninterrupted one.
TEST(GracefulStop, AFineTuneStoppedInEitherFitResumesToTheUninterruptedResult) {
  TempDir dir("fine-tune-stop");
  const auto reference = fine_tune(dir.path / "reference", {});
  for (const auto* phase : {"frozen", "unfrozen"}) {
    const auto run = dir.path / phase;
    fl::clear_stop_signal();
    auto stop = std::make_shared<fl::GracefulStop>();
    auto checkpointer = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 4});
    const auto stopped = fine_tune(run, {}, {checkpointer, stop, std::make_shared<RaiseAt>(0, 2, SIGTERM, phase)});
    EXPECT_TRUE(stop->stopped()) << phase;
    const bool frozen = std::string(phase) == "frozen";
    EXPECT_EQ(stopped.losses.size(), frozen ? 3u : 9u) << phase;
    ASSERT_TRUE(checkpointer->last_saved()) << phase;
    EXPECT_EQ(checkpointer->last_saved()->filename(), fl::checkpoint_file_name(frozen ? 0 : 1, 3));
    fl::clear_stop_signal();
    const auto latest = fl::latest_checkpoint(run / "checkpoints");
    ASSERT_TRUE(latest) << phase;
    EXPECT_EQ(*latest, *checkpointer->last_saved()) << phase;
    const auto resumed = fine_tune(run / "resumed", *latest);
    EXPECT_EQ(resumed.losses.size(), frozen ? 15u : 9u) << phase;
    expect_same_end(reference, resumed, std::string("stopped in the ") + phase + " fit");
  }
}

TEST(Resume, AFitRefusesACheckpointOfAFineTuneAndTheOtherWayRound) {
  TempDir dir("fine-tune-plain");
  fine_tune(dir.path, {}, {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 4})});
  const auto unfrozen = fl::latest_checkpoint(dir.path / "checkpoints");
  ASSERT_TRUE(unfrozen);
  auto learn = make_learner(dir.path / "plain", {}, fl::models::body_head_split);
  try {
    learn->fit_one_cycle(2, 1e-2, {.fit = {.resume_from = *unfrozen}});
    ADD_FAILURE() << "a plain fit resumed a fine_tune's checkpoint";
  } catch (const fl::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("taken in the 'unfrozen' fit of a fine_tune but this fit is a plain fit"),
              std::string::npos)
        << e.what();
  }
  train(dir.path / "plain", {}, {std::make_shared<fl::Checkpointer>()});
  const auto plain = fl::latest_checkpoint(dir.path / "plain" / "checkpoints");
  ASSERT_TRUE(plain);
  try {
    fine_tune(dir.path / "other", *plain);
    ADD_FAILURE() << "a fine_tune resumed a plain fit's checkpoint";
  } catch (const fl::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("taken in a plain fit but this fit is the 'frozen' fit of a fine_tune"),
              std::string::npos)
        << e.what();
  }
}

TEST(Resume, RefusesAFitOfAnotherLengthAndAMissingFile) {
  TempDir dir("length");
  train(dir.path, {}, {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 4})});
  const auto latest = fl::latest_checkpoint(dir.path / "checkpoints");
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->filename(), fl::checkpoint_file_name(3, 0));
  auto learn = make_learner(dir.path, {});
  try {
    learn->fit(5, 1e-3, {.resume_from = *latest});
    ADD_FAILURE() << "a 5-epoch fit resumed a 3-epoch one";
  } catch (const fl::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("fit of 3 epochs but this fit has 5"), std::string::npos) << e.what();
  }
  EXPECT_THROW(learn->fit(3, 1e-3, {.resume_from = dir.path / "nope.safetensors"}), fl::CheckpointError);
}

TEST(LatestCheckpoint, SkipsTornFilesAndTemporariesOrRefusesThem) {
  TempDir dir("latest");
  EXPECT_FALSE(fl::latest_checkpoint(dir.path / "checkpoints")) << "no folder: none";
  train(dir.path, {}, {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 2, .keep = 3})});
  const auto ckpts = dir.path / "checkpoints";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(ckpts)) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{fl::checkpoint_file_name(2, 4), fl::checkpoint_file_name(2, 6),
                                             fl::checkpoint_file_name(3, 0)}))
      << "keep = 3 keeps the newest three";
  // A newer file cut short (as a copy interrupted half way would be) and a leftover temporary.
  const auto torn = ckpts / fl::checkpoint_file_name(4, 0);
  fs::copy_file(ckpts / fl::checkpoint_file_name(3, 0), torn);
  fs::resize_file(torn, fs::file_size(torn) / 2);
  std::ofstream(ckpts / ".ckpt-e0005-b0000000.safetensors.tmp.1.2") << "partial";
  ::testing::internal::CaptureStderr();
  const auto latest = fl::latest_checkpoint(ckpts);
  const auto err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->filename(), fl::checkpoint_file_name(3, 0));
  EXPECT_NE(err.find("skipping checkpoint '" + torn.string() + "'"), std::string::npos) << err;
  try {
    fl::latest_checkpoint(ckpts, {.skip_torn = false});
    ADD_FAILURE() << "a torn newest checkpoint was accepted";
  } catch (const fl::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("Delete '" + torn.string() + "'"), std::string::npos) << e.what();
  }
  // The next fit's Checkpointer removes the temporary.
  fs::remove(torn);
  auto again = make_learner(dir.path, {std::make_shared<fl::Checkpointer>()});
  again->fit(1, 1e-3);
  EXPECT_FALSE(fs::exists(ckpts / ".ckpt-e0005-b0000000.safetensors.tmp.1.2"));
}

TEST(LatestCheckpoint, ACheckpointWithAFlippedBitIsSkippedAndRefusedByLoad) {
  TempDir dir("flipped");
  train(dir.path, {}, {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.keep = 0})});
  const auto ckpts = dir.path / "checkpoints";
  const auto newest = ckpts / fl::checkpoint_file_name(3, 0);
  ASSERT_TRUE(fs::exists(newest));
  {  // one bit of the last data byte (the file's end is tensor data): the file parses and keeps its size
    std::fstream file(newest, std::ios::in | std::ios::out | std::ios::binary);
    file.seekg(-1, std::ios::end);
    const char byte = static_cast<char>(file.get() ^ 0x01);
    file.seekp(-1, std::ios::end);
    file.put(byte);
  }
  ::testing::internal::CaptureStderr();
  const auto latest = fl::latest_checkpoint(ckpts);
  const auto err = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(latest);
  EXPECT_EQ(latest->filename(), fl::checkpoint_file_name(2, 0)) << "the one before the corrupt one";
  EXPECT_NE(err.find("does not match its checksum: the file is corrupt"), std::string::npos) << err;
  auto learn = make_learner(dir.path / "load", {});
  try {
    fl::load_checkpoint(*learn, newest);
    ADD_FAILURE() << "a checkpoint with a flipped bit loaded";
  } catch (const fl::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find(newest.string() + ": tensor '"), std::string::npos) << e.what();
  }
}

TEST(GracefulStop, SigtermStopsAtTheBatchWithACheckpointAndTheResumedFitMatches) {
  TempDir dir("stop");
  const auto reference = train(dir.path / "reference", {});
  fl::clear_stop_signal();
  auto stop = std::make_shared<fl::GracefulStop>();
  auto checkpointer = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_epoch = false});
  const auto stopped = train(dir.path, {}, {checkpointer, stop, std::make_shared<RaiseAt>(1, 2, SIGTERM)});
  EXPECT_TRUE(stop->stopped());
  EXPECT_EQ(fl::stop_signal(), SIGTERM);
  EXPECT_EQ(stopped.losses.size(), 9u) << "6 batches of epoch 0 and 3 of epoch 1, then the stop";
  ASSERT_TRUE(checkpointer->last_saved());
  EXPECT_EQ(checkpointer->last_saved()->filename(), fl::checkpoint_file_name(1, 3));
  fl::clear_stop_signal();
  const auto resumed = train(dir.path / "resumed", *fl::latest_checkpoint(dir.path / "checkpoints"));
  EXPECT_EQ(resumed.losses.size(), 9u);
  expect_same_end(reference, resumed, "resumed after SIGTERM");
}

// Handles the signals during a fit only.
class HandlerProbe : public fl::Callback {
 public:
  std::string name() const override { return "handler_probe"; }
  void after_batch() override {
    struct sigaction now {};
    sigaction(SIGTERM, nullptr, &now);
    during = now.sa_handler;
  }
  void (*during)(int) = nullptr;
};

TEST(GracefulStop, HandlesTheSignalsOnlyDuringTheFit) {
  struct sigaction before {};
  sigaction(SIGTERM, nullptr, &before);
  auto probe = std::make_shared<HandlerProbe>();
  train(fs::temp_directory_path(), {}, {std::make_shared<fl::GracefulStop>(), probe});
  struct sigaction after {};
  sigaction(SIGTERM, nullptr, &after);
  const auto address = [](void (*handler)(int)) { return reinterpret_cast<std::uintptr_t>(handler); };
  EXPECT_EQ(address(before.sa_handler), address(after.sa_handler));
  EXPECT_NE(address(probe->during), address(before.sa_handler));
}

TEST(GracefulStop, ASignalTheProcessStartedWithIgnoredStaysIgnored) {
  // A script's background job starts with SIGINT ignored (the shell's doing); the launcher and Python keep it so.
  struct sigaction ignore {
  }, before{};
  ignore.sa_handler = SIG_IGN;
  sigemptyset(&ignore.sa_mask);
  sigaction(SIGINT, &ignore, &before);
  fl::clear_stop_signal();
  auto stop = std::make_shared<fl::GracefulStop>();
  const auto run = train(fs::temp_directory_path(), {}, {stop, std::make_shared<RaiseAt>(1, 2, SIGINT)});
  struct sigaction after {};
  sigaction(SIGINT, &before, &after);
  EXPECT_FALSE(stop->stopped());
  EXPECT_EQ(fl::stop_signal(), 0);
  EXPECT_EQ(run.losses.size(), 18u) << "the whole fit: 3 epochs of 6 batches";
  EXPECT_EQ(after.sa_handler, SIG_IGN) << "the fit left SIGINT with another handler";
}

// ---- two ranks ------------------------------------------------------------------------------------

// Per-rank random augmentation from the global generator: rank 1 draws one number more per batch, so the
// ranks' generator states differ; a resumed rank must continue its own stream, not rank 0's.
class PerRankNoise : public fl::Callback {
 public:
  std::string name() const override { return "per_rank_noise"; }
  void before_batch() override {
    auto& l = learn();
    if (!l.training) return;
    if (fl::rank() == 1) torch::rand({1});
    l.xb[0] = l.xb[0] + torch::randn_like(l.xb[0]) * 0.1;
  }
};

TEST(Resume, TwoRanksResumedInsideAnEpochMatchTheUninterruptedRun) {
  TempDir dir("ranks");
  flt::run_on_ranks(
      2,
      [&dir](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(30)});
        const auto reference =
            train(dir.path, {},
                  {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 0}),
                   std::make_shared<PerRankNoise>()},
                  true);
        EXPECT_EQ(reference.losses.size(), 9u) << "3 batches per rank per epoch";
        fl::barrier();
        for (const auto& [epoch, batch] : std::vector<std::pair<int, int>>{{1, 1}, {2, 0}}) {
          const auto resumed =
              train(dir.path / "resumed", dir.path / "checkpoints" / fl::checkpoint_file_name(epoch, batch),
                    {std::make_shared<PerRankNoise>()}, true);
          expect_same_end(reference, resumed, fmt::format("rank {} from epoch {} batch {}", fl::rank(), epoch, batch));
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

// The same on two ranks for a fine_tune (what `--max-restarts` does after a rank died in the unfrozen fit): each
// rank resumes its own random streams from a checkpoint of either fit.
TEST(Resume, TwoRanksResumeAFineTuneInEitherFit) {
  TempDir dir("ranks-fine-tune");
  flt::run_on_ranks(
      2,
      [&dir](const RankContext&) {
        fl::setup_distrib({.timeout = std::chrono::seconds(30)});
        const auto reference =
            fine_tune(dir.path, {},
                      {std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 0}),
                       std::make_shared<PerRankNoise>()},
                      true);
        EXPECT_EQ(reference.losses.size(), 9u) << "3 batches per rank per epoch, 3 epochs";
        fl::barrier();
        for (const auto& [epoch, batch] : std::vector<std::pair<int, int>>{{0, 2}, {1, 1}, {2, 0}}) {
          const auto resumed =
              fine_tune(dir.path / "resumed", dir.path / "checkpoints" / fl::checkpoint_file_name(epoch, batch),
                        {std::make_shared<PerRankNoise>()}, true);
          EXPECT_EQ(resumed.losses.size(), static_cast<std::size_t>(9 - 3 * epoch - batch));
          expect_same_end(reference, resumed, fmt::format("rank {} from epoch {} batch {}", fl::rank(), epoch, batch));
        }
        fl::teardown_distrib();
      },
      {.env = flt::torchrun_env(2)});
}

TEST(GracefulStop, ASignalOnOneRankStopsEveryRankAtTheSameBatch) {
  TempDir dir("ranks-stop");
  flt::run_on_ranks(2,
                    [&dir](const RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      // As in a terminal: started as a script's background job, SIGINT would be ignored, and kept so.
                      std::signal(SIGINT, SIG_DFL);
                      auto stop = std::make_shared<fl::GracefulStop>();
                      std::vector<fl::CallbackPtr> cbs{std::make_shared<fl::Checkpointer>(), stop};
                      // The flag raised after batch 0 of epoch 1 travels with batch 1's gradient all-reduce (no
                      // collective of its own): every rank stops after batch 1.
                      if (fl::rank() == 1) cbs.push_back(std::make_shared<RaiseAt>(1, 0, SIGINT));
                      const auto run = train(dir.path, {}, cbs, true);
                      EXPECT_TRUE(stop->stopped());
                      EXPECT_EQ(run.losses.size(), 5u)
                          << "rank " << fl::rank() << ": 3 batches of epoch 0, 2 of epoch 1";
                      EXPECT_EQ(fl::stop_signal(), fl::rank() == 1 ? SIGINT : 0);
                      fl::barrier();
                      const auto latest = fl::latest_checkpoint(dir.path / "checkpoints");
                      ASSERT_TRUE(latest);
                      EXPECT_EQ(latest->filename(), fl::checkpoint_file_name(1, 2));
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
}

}  // namespace

// The step API resumed from a Checkpointer's checkpoint taken between steps: begin_steps says how many steps were
// trained (learn.train_iter), the program hands over the rest, and the run ends bit for bit like the uninterrupted
// one (dropout included, and the validation on the held-out samples, which the checkpoint keeps).
TEST(Resume, StepsResumedFromACheckpointEndBitForBitLikeTheUninterruptedSteps) {
  TempDir dir("steps");
  // `kill`: the process is killed (SIGKILL) after `stop_after` steps, in the middle of its steps.
  const auto run = [&](const fs::path& path, std::int64_t stop_after, const fs::path& resume_from, bool kill) {
    auto log = std::make_shared<LossLog>();
    auto learn = make_learner(
        path, {log, std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 4, .keep = 0})});
    std::vector<fl::Batch> program;  // the program's samples: step s hands over program[s % 6]
    for (const auto& batch : fl::DataLoader(learn->dls().train().dataset_ptr(), {.bs = 8, .seed = 0}))
      program.push_back(batch);
    learn->begin_steps({.steps = 18, .steps_per_epoch = 6, .held_out = 12},
                       [&](fl::Learner& l, int n) { l.fit_one_cycle(n, 1e-2, {.fit = {.resume_from = resume_from}}); });
    const auto first = learn->train_iter;
    for (auto s = first; s < stop_after; ++s) {
      const auto& b = program[static_cast<std::size_t>(s % 6)];
      learn->train_step(b.inputs, b.targets);
      const auto& v = program[static_cast<std::size_t>((s + 3) % 6)];  // 4 rows set aside after every step
      learn->hold_out({v.inputs[0].narrow(0, 0, 4)}, {v.targets[0].narrow(0, 0, 4)});
    }
    if (kill) std::raise(SIGKILL);
    learn->end_steps();
    return std::pair{first, ::Run{log->losses, flt::snapshot(learn->model()), learn->recorder().history().back()}};
  };
  // A process killed after 11 steps: its checkpoints are after 4 steps of each epoch (steps 4 and 10) and after
  // epoch 0.
  const auto killed = flt::run_ranks(1, [&](const RankContext&) { run(dir.path / "cut", 11, {}, true); });
  ASSERT_EQ(killed.size(), 1u);
  EXPECT_EQ(killed[0].signal, SIGKILL) << killed[0].summary() << "\n" << killed[0].output;
  const auto [start, reference] = run(dir.path / "whole", 18, {}, false);
  EXPECT_EQ(start, 0);
  const auto checkpoint = fl::latest_checkpoint(dir.path / "cut" / "checkpoints");
  ASSERT_TRUE(checkpoint.has_value());
  const auto [resumed_at, resumed] = run(dir.path / "cut", 18, *checkpoint, false);
  EXPECT_EQ(resumed_at, 10) << checkpoint->string();
  EXPECT_EQ(resumed.losses.size(), 8u) << "steps 10 to 17";
  expect_same_end(reference, resumed, "steps resumed after 10");
}
