// More of fastlearn on a GPU, part of the gpu_test binary (label `gpu`; each test skips where no GPU is visible):
//   - the device a Learner picks by itself, and optimizer state that follows a model moved after its first steps;
//   - a fit resumed inside an epoch, lr_find, fine_tune, gradient clipping and accumulation, an fp16 overflow,
//     GPU memory over epochs;
//   - NCCL without host waits (a collective and a whole training step return before the GPU is done), point-to-
//     point with CUDA tensors over Gloo, an NCCL group under a Gloo world;
//   - `fastlearn train` on the GPU: Fashion-MNIST, an image folder, a table;
//   - the C interface: a program's host arrays trained on the GPU.
#include <fastlearn/c/fastlearn.h>
#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/callbacks/grad_accumulation.h>
#include <fastlearn/callbacks/grad_clip.h>
#include <fastlearn/callbacks/mixed_precision.h>
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/p2p.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/device.h>
#include <fastlearn/data/image_encode.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/distributed_trainer.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/models/models.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#ifdef FASTLEARN_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/Sleep.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <torch/torch.h>

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>

#include "support/build_paths.h"
#include "support/message_of.h"
#include "support/multiprocess.h"
#include "support/processes.h"
#include "support/tiny_tasks.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace {

#define SKIP_WITHOUT_CUDA()                                                   \
  if (!torch::cuda::is_available())                                           \
  GTEST_SKIP() << "no CUDA device visible: this check runs on a GPU machine " \
                  "(scripts/device-kit)"

const torch::Device kGpu(torch::kCUDA, 0);

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& tag)
      : path(fs::temp_directory_path() / fmt::format("fastlearn-gpu-{}-{}", tag, ::getpid())) {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

// A classifier with dropout (so that the CUDA generator matters) on 3 blobs: 48 items, bs 8 -> 6 batches an epoch.
std::unique_ptr<fl::Learner> blob_learner(const fs::path& path, std::vector<fl::CallbackPtr> cbs = {},
                                          fl::Splitter splitter = {}) {
  torch::manual_seed(5);
  auto model = torch::nn::Sequential(torch::nn::Linear(4, 16), torch::nn::ReLU(), torch::nn::Dropout(0.3),
                                     torch::nn::Linear(16, 3));
  return std::make_unique<fl::Learner>(flt::classification_data({.n_train = 48, .n_valid = 16, .bs = 8, .seed = 9}),
                                       model, fl::cross_entropy(),
                                       fl::LearnerOptions{.metrics = {fl::accuracy()},
                                                          .cbs = std::move(cbs),
                                                          .splitter = std::move(splitter),
                                                          .path = path,
                                                          .progress = false});
}

// Every training batch's loss.
struct LossLog : fl::Callback {
  void after_loss() override {
    if (learn().training) losses.push_back(learn().loss.item<double>());
  }
  std::vector<double> losses;
};

}  // namespace

TEST(GpuDevice, ALearnerLeftToFastlearnTrainsOnTheGpuAndItsOptimizerStateFollowsAMove) {
  SKIP_WITHOUT_CUDA();
  // As fastai: nothing said, the GPU (model, batches); default_device() is cuda:0 outside a job.
  auto learn = flt::regression_learner(flt::regression_data(), {.opt_func = fl::Adam()});
  EXPECT_EQ(fl::default_device(), kGpu);
  EXPECT_EQ(learn->device(), kGpu);
  EXPECT_TRUE(learn->model().parameters().front().is_cuda());
  ASSERT_TRUE(learn->dls().device());
  EXPECT_TRUE(learn->dls().device()->is_cuda());
  learn->fit(2, 0.3);
  EXPECT_LT(learn->recorder().history().back().valid_loss, learn->recorder().history().front().train_loss);

  // Trained on the CPU first (Adam's state there), then moved: the next steps use state on the GPU.
  auto moved = flt::regression_learner(flt::regression_data(), {.opt_func = fl::Adam(), .device = c10::Device("cpu")});
  moved->fit(1, 1e-2);
  ASSERT_FALSE(moved->opt().state_tensors().empty());
  EXPECT_TRUE(moved->opt().state_tensors().begin()->second.is_cpu());
  moved->to(kGpu);
  moved->fit(1, 1e-2);
  for (const auto& [name, state] : moved->opt().state_tensors()) EXPECT_TRUE(state.is_cuda()) << name;
  EXPECT_TRUE(moved->model().parameters().front().is_cuda());

  const auto msg = flt::message_of([] { fl::resolve_device(c10::Device(c10::kCUDA, 99)); });
  EXPECT_NE(msg.find("'cuda:99' does not exist"), std::string::npos) << msg;
}

TEST(GpuResume, AFitResumedInsideAnEpochEndsLikeTheUninterruptedOne) {
  SKIP_WITHOUT_CUDA();
  TempDir dir("resume");
  auto keep_all = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 0});
  auto reference_log = std::make_shared<LossLog>();
  auto reference = blob_learner(dir.path, {keep_all, reference_log});
  ASSERT_TRUE(reference->device().is_cuda());
  reference->fit_one_cycle(3, 1e-2);
  ASSERT_EQ(reference_log->losses.size(), 18u);
  const auto reference_weights = flt::snapshot(reference->model());
  for (const auto& [epoch, batch] : std::vector<std::pair<int, int>>{{0, 2}, {1, 3}, {2, 0}}) {
    const auto file = dir.path / "checkpoints" / fl::checkpoint_file_name(epoch, batch);
    ASSERT_TRUE(fs::exists(file)) << file;
    auto log = std::make_shared<LossLog>();
    auto resumed = blob_learner(dir.path / "resumed", {log});
    resumed->fit_one_cycle(3, 1e-2, {.fit = {.resume_from = file}});
    const auto offset = reference_log->losses.size() - log->losses.size();
    ASSERT_EQ(offset, static_cast<std::size_t>(6 * epoch + batch)) << file;
    // The same dropout masks (the CUDA generator restored) and the same Adam state (on the GPU): the same losses.
    for (std::size_t i = 0; i < log->losses.size(); ++i)
      EXPECT_NEAR(log->losses[i], reference_log->losses[offset + i], 1e-5 * std::abs(reference_log->losses[offset + i]))
          << file.filename() << ": training batch " << offset + i;
    const auto weights = flt::snapshot(resumed->model());
    for (std::size_t i = 0; i < weights.size(); ++i)
      EXPECT_TRUE(weights[i].allclose(reference_weights[i], 1e-5, 1e-6)) << file.filename() << ": tensor " << i;
    for (const auto& [name, state] : resumed->opt().state_tensors()) EXPECT_TRUE(state.is_cuda()) << name;
  }
}

TEST(GpuSchedules, LrFindAndFineTuneRunOnTheGpu) {
  SKIP_WITHOUT_CUDA();
  TempDir dir("schedules");
  auto learn = blob_learner(dir.path, {}, fl::models::body_head_split);
  const auto before = flt::snapshot(learn->model());
  const auto found = learn->lr_find({.num_it = 30});
  EXPECT_GT(found.lrs.size(), 5u);
  EXPECT_GT(found.valley, 0);
  EXPECT_TRUE(flt::same_tensors(before, flt::snapshot(learn->model()))) << "lr_find puts the model back";
  learn->fine_tune(3, 5e-2);
  const auto& history = learn->recorder().history();
  ASSERT_EQ(history.size(), 3u) << "the unfrozen fit's epochs";
  EXPECT_TRUE(std::isfinite(history.back().valid_loss));
  EXPECT_GT(history.back().metrics.at(0), 0.8) << "3 separable blobs";
  EXPECT_TRUE(learn->model().parameters().front().is_cuda());
}

TEST(GpuCallbacks, GradientAccumulationEqualsOneLargeBatchAndClippingBoundsTheNorm) {
  SKIP_WITHOUT_CUDA();
  auto make = [](std::int64_t bs) {
    return flt::regression_learner(flt::regression_data({.n_train = 16, .n_valid = 4, .bs = bs, .shuffle = false}),
                                   {.opt_func = fl::SGD()});
  };
  auto big = make(16), small = make(4);
  ASSERT_TRUE(small->device().is_cuda());
  big->fit(3, 0.1);
  small->fit(3, 0.1, {.cbs = {std::make_shared<fl::GradientAccumulation>(16)}});
  const auto a = flt::snapshot(big->model()), b = flt::snapshot(small->model());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].allclose(b[i], 1e-5, 1e-6)) << a[i] << b[i];
  EXPECT_EQ(small->opt().step_count(), 3) << "one step per 16 items";

  struct Norm : fl::Callback {
    double max_seen = 0;
    void before_step() override {
      double sq = 0;
      for (auto& p : learn().model().parameters())
        if (p.grad().defined()) sq += p.grad().pow(2).sum().item<double>();
      max_seen = std::max(max_seen, std::sqrt(sq));
    }
  };
  auto norm = std::make_shared<Norm>();
  norm->order = 20;  // after the clip (11)
  auto clip = std::make_shared<fl::GradientClip>(fl::GradientClipOptions{.max_norm = 0.01});
  TempDir dir("clip");
  auto learn = blob_learner(dir.path);
  learn->fit(1, 1e-2, {.cbs = {clip, norm}});
  EXPECT_GT(clip->last_norm(), 0.01) << "the gradients were larger than the bound before clipping";
  EXPECT_LE(norm->max_seen, 0.01 * (1 + 1e-4));
}

TEST(GpuMixedPrecision, AnFp16OverflowSkipsTheStepAndHalvesTheScale) {
  SKIP_WITHOUT_CUDA();
  TempDir dir("fp16");
  auto learn = blob_learner(dir.path);
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
  auto probe = std::make_shared<StepProbe>();
  probe->order = 5;  // its snapshot comes before MixedPrecision (10) may skip the step
  auto mp = std::make_shared<fl::MixedPrecision>(
      fl::MixedPrecisionOptions{.dtype = at::kHalf, .loss_scaling = true, .init_scale = 1024});
  learn->fit(1, 1e-2, {.cbs = {std::make_shared<Poison>(), probe, mp}});
  ASSERT_EQ(probe->changed.size(), 6u);
  EXPECT_TRUE(probe->changed[0]);
  EXPECT_FALSE(probe->changed[1]) << "the step with an inf gradient is skipped";
  EXPECT_TRUE(probe->changed[2]);
  EXPECT_EQ(mp->skipped_steps(), 1);
  EXPECT_EQ(mp->scale(), 512) << "the scale backs off by half";
  for (auto& p : learn->model().parameters()) EXPECT_TRUE(p.isfinite().all().item<bool>());
}

TEST(GpuMemory, PeakAllocationIsFlatOverEpochs) {
  SKIP_WITHOUT_CUDA();
#ifdef FASTLEARN_WITH_CUDA
  namespace alloc = c10::cuda::CUDACachingAllocator;
  auto [x, y] = std::pair(torch::randn({2048, 1, 28, 28}), torch::randint(0, 10, {2048}));
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  fl::DataLoaders dls(fl::DataLoader(ds, {.bs = 128, .shuffle = true, .seed = 1}), fl::DataLoader(ds, {.bs = 256}), 10);
  torch::manual_seed(0);
  fl::Learner learn(dls, fl::models::conv_net({.widths = {16, 32}, .classes = 10}), fl::cross_entropy(),
                    {.metrics = {fl::accuracy()}, .progress = false});
  struct PeakPerEpoch : fl::Callback {
    std::vector<std::int64_t> peaks;
    void before_epoch() override { alloc::resetPeakStats(0); }
    void after_epoch() override {
      peaks.push_back(alloc::getDeviceStats(0)
                          .allocated_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                          .peak);
    }
  };
  auto peaks = std::make_shared<PeakPerEpoch>();
  learn.fit_one_cycle(3, 1e-2, {.fit = {.cbs = {peaks}}});
  ASSERT_EQ(peaks->peaks.size(), 3u);
  std::cout << "[ gpu      ] peak allocated per epoch: " << peaks->peaks[0] << ", " << peaks->peaks[1] << ", "
            << peaks->peaks[2] << " bytes\n";
  EXPECT_LE(static_cast<double>(peaks->peaks[2]), 1.05 * static_cast<double>(peaks->peaks[0]))
      << "memory grew from epoch 1 to epoch 3";
#endif
}

#ifdef FASTLEARN_WITH_CUDA
namespace {

// Cycles of at::cuda::sleep that keep this GPU busy for `ms` milliseconds, measured with CUDA events.
std::int64_t sleep_cycles(double ms) {
  constexpr std::int64_t kProbe = 10'000'000;
  at::cuda::sleep(kProbe);  // a first launch, and clocks that rise from idle, would make the probe look slow
  at::cuda::CUDAEvent start(cudaEventDefault), stop(cudaEventDefault);
  start.record();
  at::cuda::sleep(kProbe);
  stop.record();
  stop.synchronize();
  const double probe_ms = start.elapsed_time(stop);
  return static_cast<std::int64_t>(static_cast<double>(kProbe) * ms / std::max(probe_ms, 1e-3));
}

bool stream_done() { return at::cuda::getCurrentCUDAStream().query(); }

double ms_since(Clock::time_point start) {
  return std::chrono::duration<double, std::milli>(Clock::now() - start).count();
}

}  // namespace
#endif

TEST(NcclWorldOfOne, ACollectiveAndATrainingStepReturnBeforeTheGpuIsDone) {
  SKIP_WITHOUT_CUDA();
  if (!fl::backend_compiled_in(fl::BackendKind::nccl)) GTEST_SKIP() << "this build has no NCCL backend";
#ifdef FASTLEARN_WITH_CUDA
  flt::run_on_ranks(
      1,
      [](const flt::RankContext&) {
        torch::manual_seed(0);
        auto model = fl::models::conv_net({.widths = {8, 16}, .classes = 3});
        auto x = torch::randn({256, 1, 28, 28}).to(kGpu);
        auto y = torch::randint(0, 3, {256}).to(kGpu);
        auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
        fl::Learner learn(fl::DataLoaders(fl::DataLoader(ds, {.bs = 32, .shuffle = true, .seed = 1}),
                                          fl::DataLoader(ds, {.bs = 64}), 3),
                          model, fl::cross_entropy(), {.progress = false});
        fl::DistribCtx ctx(
            learn, {.with_one_process = true},
            {.backend = fl::BackendKind::nccl, .timeout = std::chrono::seconds(60), .env = {.world_size = 1}});
        ASSERT_EQ(fl::world_group().kind(), fl::BackendKind::nccl);
        const auto cycles = sleep_cycles(200);

        // A collective queued behind 200 ms of GPU work returns at once, its result not yet there.
        auto t = torch::zeros({1 << 20}, torch::TensorOptions().device(kGpu));
        torch::cuda::synchronize();
        at::cuda::sleep(cycles);
        t.fill_(3);
        auto start = Clock::now();
        fl::all_reduce(t);
        const double collective_ms = ms_since(start);
        const bool collective_pending = !stream_done();
        torch::cuda::synchronize();
        EXPECT_LT(collective_ms, 20) << "all_reduce waited for the GPU on the host";
        EXPECT_TRUE(collective_pending) << "the GPU had finished before all_reduce returned";
        EXPECT_TRUE(torch::all(t == 3).item<bool>()) << "the all_reduce ran after the work queued before it";

        // A whole training step (forward, backward, the reducer's buckets, the optimizer) likewise.
        struct StepTimer : fl::Callback {
          explicit StepTimer(std::int64_t c) : cycles(c) { order = -100; }  // before the trainer's broadcast
          void before_batch() override {
            if (!learn().training || learn().train_iter != 4) return;
            torch::cuda::synchronize();
            at::cuda::sleep(cycles);
            start = Clock::now();
          }
          void after_batch() override {
            if (!learn().training || learn().train_iter != 4) return;
            step_ms = ms_since(start);
            pending = !stream_done();
          }
          std::int64_t cycles;
          Clock::time_point start;
          double step_ms = -1;
          bool pending = false;
        };
        auto timer = std::make_shared<StepTimer>(cycles);
        learn.fit(1, 1e-3, {.cbs = {timer}});
        std::cout << "[ gpu      ] NCCL world of one: all_reduce returned in " << collective_ms
                  << " ms, a training step in " << timer->step_ms << " ms, behind 200 ms of GPU work\n";
        EXPECT_GE(timer->step_ms, 0) << "the timed batch never ran";
        EXPECT_LT(timer->step_ms, 20) << "the training step waited for the GPU on the host";
        EXPECT_TRUE(timer->pending) << "the GPU had finished before the step returned";
        EXPECT_TRUE(std::isfinite(learn.recorder().history().back().train_loss));
      },
      {.timeout = std::chrono::seconds(300), .env = flt::torchrun_env(1)});
#endif
}

TEST(GlooCudaTensors, PointToPointMovesCudaTensorsThroughTheHost) {
  SKIP_WITHOUT_CUDA();
  for (const bool debug : {false, true}) {
    flt::run_on_ranks(
        2,
        [debug](const flt::RankContext&) {
          fl::setup_distrib({.backend = fl::BackendKind::gloo, .timeout = std::chrono::seconds(30), .debug = debug});
          const auto expected = torch::arange(1000, torch::TensorOptions().dtype(torch::kFloat32));
          if (fl::rank() == 0) {
            auto data = expected.to(kGpu);
            fl::send(data, 1, 3);
            auto pending = fl::isend(data * 2, 1, 4);
            data.zero_();  // the send took its copy when it started
            pending.wait();
          } else {
            auto into = torch::full({1000}, -1.0f, torch::TensorOptions().device(kGpu));
            EXPECT_EQ(fl::recv(into, 0, 3), 0);
            EXPECT_TRUE(torch::equal(into.cpu(), expected));
            auto twice = torch::empty({1000}, torch::TensorOptions().device(kGpu));
            auto request = fl::irecv(twice, std::nullopt, 4);
            request.wait();
            EXPECT_EQ(request.source_rank(), 0);
            EXPECT_TRUE(torch::equal(twice.cpu(), expected * 2)) << (debug ? "debug mode" : "");
          }
          fl::teardown_distrib();
        },
        {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(2)});
  }
}

TEST(NcclGroupUnderGloo, AnNcclGroupRunsOnTheRanksOwnGpu) {
  SKIP_WITHOUT_CUDA();
  if (!fl::backend_compiled_in(fl::BackendKind::nccl)) GTEST_SKIP() << "this build has no NCCL backend";
  flt::run_on_ranks(
      1,
      [](const flt::RankContext&) {
        fl::setup_distrib(
            {.backend = fl::BackendKind::gloo, .timeout = std::chrono::seconds(30), .env = {.world_size = 1}});
        auto group = fl::new_group({0}, fl::BackendKind::nccl);
        EXPECT_EQ(fl::device_of(*group), kGpu);
        EXPECT_TRUE(fl::distrib_device().is_cpu()) << "the Gloo world computes on the CPU";
        auto t = torch::full({64}, 2.0f, torch::TensorOptions().device(fl::device_of(*group)));
        fl::all_reduce(t, fl::ReduceOp::sum, group.get());
        EXPECT_TRUE(torch::all(t == 2).item<bool>());
        const auto msg = flt::message_of([&] { fl::send(torch::ones({4}), 0, 0, group.get()); });
        EXPECT_NE(msg.find("the nccl backend moves CUDA tensors only"), std::string::npos) << msg;
        fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(1)});
}

// ---- the CLI on the GPU -------------------------------------------------------------------------------------

namespace {

struct CliRun {
  int exit_code = -1;
  std::string output;
};

CliRun cli_train(const fs::path& config, const fs::path& out, const std::vector<std::string>& sets) {
  std::vector<std::string> argv{FASTLEARN_CLI, "train", config.string(), "--out", out.string()};
  for (const auto& s : sets) argv.insert(argv.end(), {"--set", s});
  const auto results = flt::run_commands({{.argv = argv, .log = out.string() + ".log"}}, std::chrono::seconds(300));
  return {results.at(0).exit_code, results.at(0).output};
}

void write(const fs::path& file, const std::string& text) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary) << text;
}

}  // namespace

TEST(GpuCli, TrainRunsOnTheGpuForFashionMnistAnImageFolderAndATable) {
  SKIP_WITHOUT_CUDA();
  TempDir dir("cli");
  // Fashion-MNIST (Debian's copy, where the GPU kit links it), one epoch: device "auto" is the GPU.
  if (fs::exists("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz")) {
    const auto config = fs::path(FASTLEARN_SOURCE_DIR) / "configs" / "fashion_mnist.toml";
    const auto r = cli_train(config, dir.path / "fashion", {"train.epochs=1"});
    ASSERT_EQ(r.exit_code, 0) << r.output;
    EXPECT_NE(r.output.find("training on cuda:0"), std::string::npos) << r.output;
    EXPECT_TRUE(fs::exists(dir.path / "fashion" / "model.safetensors"));
  }
  // An image folder: 2 classes of 12 PNG files each, written here.
  torch::manual_seed(3);
  for (const char* label : {"cats", "dogs"}) {
    for (int i = 0; i < 12; ++i) {
      const auto image = torch::randint(0, 256, {3, 40, 48}, torch::TensorOptions().dtype(torch::kUInt8));
      write(dir.path / "images" / (i < 9 ? "train" : "valid") / label / fmt::format("{}.png", i),
            fl::encode_png(image));
    }
  }
  write(dir.path / "images.toml", fmt::format(R"([data]
dataset = "image_folder"
path = "{}"
bs = 6
size = 32
[model]
arch = "resnet18"
[train]
epochs = 1
schedule = "fine_tune"
device = "cuda"
)",
                                              (dir.path / "images").string()));
  auto r = cli_train(dir.path / "images.toml", dir.path / "images-run", {});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("training on cuda:0"), std::string::npos) << r.output;
  // A table: 200 rows, one categorical and two continuous columns, a class target.
  std::string csv = "color,x,z,label\n";
  for (int i = 0; i < 200; ++i)
    csv += fmt::format("{},{},{},{}\n", i % 3 == 0 ? "red" : "blue", (i % 17) * 0.1, (i % 5) * 1.5,
                       (i % 17) > 8 ? "high" : "low");
  write(dir.path / "table.csv", csv);
  write(dir.path / "table.toml", fmt::format(R"([data]
dataset = "csv"
path = "{}"
y_names = ["label"]
cat_names = ["color"]
cont_names = ["x", "z"]
bs = 32
[model]
arch = "tabular"
[train]
epochs = 2
)",
                                             (dir.path / "table.csv").string()));
  r = cli_train(dir.path / "table.toml", dir.path / "table-run", {});
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("training on cuda:0"), std::string::npos) << r.output;
}

// The C interface on the GPU: the program's host arrays are copied to the GPU for each step and the outputs back into
// the caller's array; the steps are those of the same config on the CPU, to float rounding.
TEST(GpuCInterface, AProgramsHostArraysTrainOnTheGpuAsOnTheCpu) {
  SKIP_WITHOUT_CUDA();
  TempDir dir("c-interface");
  const auto config = [&](const char* device) {
    return fmt::format(R"([data]
dataset = "program"
input_shape = [1, 16, 16]
target_shape = [1, 16, 16]
steps_per_epoch = 10
[model]
arch = "field_cnn"
hidden = [8]
[train]
epochs = 2
lr = 0.01
device = "{}"
[output]
dir = "{}"
checkpoints = false
)",
                       device, (dir.path / device).string());
  };
  torch::manual_seed(1);
  const auto x = torch::rand({20, 4, 1, 16, 16}, torch::kFloat64), y = torch::rand({20, 4, 1, 16, 16}, torch::kFloat64);
  const auto array = [](const at::Tensor& t) {
    fl_array a{
        .data = t.data_ptr(), .dtype = FL_FLOAT64, .layout = FL_ROW_MAJOR, .ndim = static_cast<int32_t>(t.dim())};
    for (int d = 0; d < t.dim(); ++d) a.shape[d] = t.size(d);
    return a;
  };
  std::vector<at::Tensor> outputs;
  for (const char* device : {"cpu", "cuda"}) {
    SCOPED_TRACE(device);
    fl_learner* learn = nullptr;
    ASSERT_EQ(fl_create_from_toml(config(device).c_str(), device, &learn), FL_OK) << fl_last_error();
    for (int s = 0; s < 20; ++s) {
      const auto xs = x[s].contiguous(), ys = y[s].contiguous();
      auto xa = array(xs), ya = array(ys);
      double loss = 0;
      ASSERT_EQ(fl_train_step(learn, &xa, &ya, &loss), FL_OK) << fl_last_error();
      EXPECT_TRUE(std::isfinite(loss));
    }
    auto out = torch::zeros({4, 1, 16, 16}, torch::kFloat64);
    const auto in = x[0].contiguous();
    auto ia = array(in), oa = array(out);
    ASSERT_EQ(fl_predict(learn, &ia, &oa), FL_OK) << fl_last_error();
    outputs.push_back(out);
    ASSERT_EQ(fl_free(&learn), FL_OK) << fl_last_error();
  }
  EXPECT_TRUE(torch::allclose(outputs[1], outputs[0], 1e-4, 1e-5))
      << (outputs[1] - outputs[0]).abs().max().item<double>();
}
