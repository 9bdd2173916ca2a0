// TensorBoardLogger: the event files it writes are read by TensorBoard's own reader (Python
// tensorboard's EventAccumulator, which checks the TFRecord CRCs) and hold every scalar with the right
// step and value; under a DistributedTrainer only rank 0 writes.
#include <fastlearn/callbacks/tensorboard.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/event_file.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>

#include "support/build_paths.h"
#include "support/multiprocess.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;

namespace {

std::pair<int, std::string> run(const std::string& command) {
  std::string out;
  FILE* pipe = popen(command.c_str(), "r");
  if (!pipe) return {-1, "popen failed"};
  char buf[4096];
  while (auto n = std::fread(buf, 1, sizeof buf, pipe)) out.append(buf, n);
  return {pclose(pipe), out};
}

std::string no_tensorboard_reason() {
  const std::string python = FASTLEARN_PYTHON;
  if (python.empty()) return "configured without -DFASTLEARN_PYTHON=<python>";
  auto [status, out] = run(python + " -c 'from tensorboard.backend.event_processing import event_accumulator' 2>&1");
  if (status != 0) return python + " cannot import tensorboard (run scripts/bootstrap): " + out;
  return "";
}

std::vector<fs::path> event_files(const fs::path& dir) {
  std::vector<fs::path> files;
  if (!fs::exists(dir)) return files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().filename().string().starts_with("events.out.tfevents.")) files.push_back(e.path());
  }
  return files;
}

// The batch loss and each parameter group's lr of every training batch, as the Learner had them.
struct TrainLosses : fl::Callback {
  std::vector<double> values;
  std::vector<std::vector<double>> group_lrs;
  void after_loss() override {
    if (learn().training) values.push_back(learn().loss.item<double>());
  }
  void after_batch() override {
    if (!learn().training) return;
    group_lrs.emplace_back();
    for (std::size_t g = 0; g < learn().opt().n_groups(); ++g) group_lrs.back().push_back(learn().opt().hyper("lr", g));
  }
};

fs::path scratch(const std::string& what) {
  auto dir = fs::temp_directory_path() / ("fastlearn-tb-" + what + "-" + std::to_string(flt::test_process_id()));
  return dir;
}

}  // namespace

TEST(EventFile, Crc32cMatchesTheCastagnoliCheckValue) {
  EXPECT_EQ(fl::crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(fl::crc32c(""), 0u);
  const std::uint32_t c = fl::crc32c("123456789");
  EXPECT_EQ(fl::masked_crc32c("123456789"), ((c >> 15) | (c << 17)) + 0xA282EAD8u);
}

TEST(TensorBoard, EveryScalarIsReadBackByTensorBoardWithItsStepAndValue) {
  if (auto reason = no_tensorboard_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const auto dir = scratch("single");
  fs::remove_all(dir);
  torch::manual_seed(0);
  // Two parameter groups with different learning rates, so the per-group lr scalars differ.
  fl::Learner learn(flt::classification_data({.n_train = 32, .n_valid = 16, .bs = 8}), fl::models::mlp(4, {8}, 3),
                    fl::cross_entropy(),
                    {.metrics = {fl::accuracy(), fl::error_rate()},
                     .splitter = fl::models::body_head_split,
                     .path = dir,
                     .progress = false});
  auto tb = std::make_shared<fl::TensorBoardLogger>(fl::TensorBoardOptions{.log_dir = "runs"});
  auto losses = std::make_shared<TrainLosses>();
  learn.fit_one_cycle(2, fl::LrSpec::slice(1e-3, 1e-2), {.fit = {.cbs = {tb, losses}}});

  // What the Learner and its Recorder saw, as {tag: [[step, value], ...]}.
  const auto& rec = learn.recorder();
  ASSERT_EQ(losses->values.size(), 8u);
  ASSERT_EQ(rec.lrs().size(), 8u);
  nlohmann::json expected;
  for (std::size_t i = 0; i < 8; ++i) {
    const auto step = static_cast<std::int64_t>(i + 1);
    expected["train_loss"].push_back({step, losses->values[i]});
    expected["smooth_loss"].push_back({step, rec.losses()[i]});
    expected["lr"].push_back({step, rec.lrs()[i]});
  }
  for (std::size_t i = 0; i < 8; ++i) {
    ASSERT_EQ(losses->group_lrs[i].size(), 2u);
    EXPECT_NEAR(losses->group_lrs[i][0] * 10, losses->group_lrs[i][1], 1e-12);  // slice(1e-3, 1e-2)
    for (std::size_t g = 0; g < 2; ++g) {
      expected[fmt::format("lr/group_{}", g)].push_back({static_cast<std::int64_t>(i + 1), losses->group_lrs[i][g]});
    }
  }
  const auto names = rec.metric_names();
  ASSERT_EQ(rec.history().size(), 2u);
  for (const auto& r : rec.history()) {
    expected["epoch/train_loss"].push_back({r.epoch, r.train_loss});
    expected["epoch/valid_loss"].push_back({r.epoch, r.valid_loss});
    for (std::size_t m = 0; m < names.size(); ++m) expected["epoch/" + names[m]].push_back({r.epoch, r.metrics[m]});
  }
  const auto files = event_files(dir / "runs");
  ASSERT_EQ(files.size(), 1u);
  EXPECT_EQ(files[0], tb->path());
  const auto expected_file = dir / "expected.json";
  std::ofstream(expected_file) << expected.dump();
  // A copy with one byte of the last record's CRC changed (its scalar untouched): only a reader that checks
  // the CRCs can tell, so reading the intact file back proves our CRCs right.
  fs::create_directories(dir / "corrupt");
  const auto corrupt = dir / "corrupt" / files[0].filename();
  fs::copy_file(files[0], corrupt);
  {
    std::fstream f(corrupt, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(-1, std::ios::end);
    const char byte = static_cast<char>(f.get());
    f.seekp(-1, std::ios::end);
    f.put(static_cast<char>(~byte));
  }
  const auto [status, out] = run(fmt::format("'{}' '{}/tests/python/tensorboard_events.py' '{}' '{}' '{}' 2>&1",
                                             FASTLEARN_PYTHON, FASTLEARN_SOURCE_DIR, (dir / "runs").string(),
                                             expected_file.string(), (dir / "corrupt").string()));
  EXPECT_EQ(status, 0) << out;
  EXPECT_EQ(out, "OK\n");
  fs::remove_all(dir);
}

TEST(TensorBoard, OnlyRankZeroWritesUnderDistributedTraining) {
  const auto dir = scratch("ddp");
  if (!flt::in_rank_process()) fs::remove_all(dir);
  flt::run_on_ranks(2,
                    [&dir](const flt::RankContext&) {
                      fl::setup_distrib({.timeout = std::chrono::seconds(30)});
                      {
                        torch::manual_seed(0);
                        fl::Learner learn(flt::classification_data({.n_train = 32, .n_valid = 16, .bs = 4}),
                                          fl::models::mlp(4, {8}, 3), fl::cross_entropy(),
                                          {.path = dir, .progress = false});
                        auto tb = std::make_shared<fl::TensorBoardLogger>();
                        fl::DistribCtx ctx(learn);
                        learn.fit(1, 0.01, {.cbs = {tb}});
                        EXPECT_EQ(tb->path().empty(), fl::rank() != 0);
                      }
                      fl::teardown_distrib();
                    },
                    {.env = flt::torchrun_env(2)});
  if (flt::in_rank_process()) return;
  EXPECT_EQ(event_files(dir).size(), 1u);
  fs::remove_all(dir);
}
