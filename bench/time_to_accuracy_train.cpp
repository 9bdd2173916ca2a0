// The fastlearn side of time_to_accuracy: trains on Fashion-MNIST with fit_one_cycle under DistribCtx
// (data parallel when started by `fastlearn launch`) and stops after the first epoch whose test accuracy
// reaches --target. Rank 0 prints one line: {"reached": .., "epochs": .., "accuracy": .., "train_seconds": ..,
// "history": [..], "epoch_seconds": [..]}.
//   tta_train --model NAME --epochs E --lr LR --bs B --target 0.92 [--data DIR] [--seed S] [--channels-last]
//             [--first-batch]
// NAME: simple_cnn, conv_net_<width>_<width>... (models::conv_net with those widths), or
// resnet_<width>_<width>..._s<stem> (models::resnet with those stage widths and stem).
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <chrono>
#include <iostream>
#include <sstream>

namespace fl = fastlearn;

namespace {

torch::nn::Sequential model_named(const std::string& name) {
  if (name == "simple_cnn") return fl::models::simple_cnn(10);
  if (name.starts_with("conv_net_")) {
    fl::models::ConvNetOptions options{.widths = {}};
    std::istringstream parts(name.substr(9));
    for (std::string part; std::getline(parts, part, '_');) options.widths.push_back(std::stoll(part));
    return fl::models::conv_net(options);
  }
  if (name.rfind("resnet_", 0) == 0) {
    fl::models::ResNetOptions options{.widths = {}};
    std::istringstream parts(name.substr(7));
    for (std::string part; std::getline(parts, part, '_');) {
      if (part.starts_with("s")) {
        options.stem_width = std::stoll(part.substr(1));
      } else {
        options.widths.push_back(std::stoll(part));
      }
    }
    return fl::models::resnet(options);
  }
  throw fl::ConfigError("tta_train: unknown --model '" + name +
                        "' (simple_cnn, conv_net_<widths> or resnet_<widths>_s<stem>)");
}

// --first-batch: at the first training batch, prints {"first_batch_ns": <steady clock>} (rank 0) and ends the fit,
// for the launch_to_first_batch benchmark (the clock is the system's monotonic one, the bench's own).
class StopAtFirstBatch : public fl::Callback {
 public:
  StopAtFirstBatch() { order = -1000; }  // before anything of the batch runs
  void before_batch() override {
    if (!learn().training) return;
    const auto ns =
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch());
    if (fl::is_main()) fmt::print("{{\"first_batch_ns\": {}}}\n", ns.count());
    std::fflush(stdout);
    throw fl::CancelFitException();
  }
};

// Ends the fit after the first epoch whose validation accuracy reaches the target.
class StopAtAccuracy : public fl::Callback {
 public:
  explicit StopAtAccuracy(double target) : target_(target) { order = 60; }  // after the metrics are final
  void after_epoch() override {
    const auto& rec = learn().recorder();
    accuracy = rec.value(rec.history().back(), "accuracy");
    history.push_back(accuracy);
    const auto now = std::chrono::steady_clock::now();
    epoch_seconds.push_back(std::chrono::duration<double>(now - last_).count());
    last_ = now;
    epochs = static_cast<int>(rec.history().size());
    if (accuracy >= target_) {
      reached = true;
      throw fl::CancelFitException();
    }
  }
  void before_fit() override { last_ = std::chrono::steady_clock::now(); }
  double accuracy = 0;
  std::vector<double> history;        // test accuracy after each epoch
  std::vector<double> epoch_seconds;  // wall seconds of each epoch (training and validation)
  int epochs = 0;
  bool reached = false;

 private:
  double target_;
  std::chrono::steady_clock::time_point last_;
};

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"time_to_accuracy: train until the test accuracy reaches a target"};
  std::string data = "/usr/share/datasets/fashion-mnist", model = "simple_cnn";
  int epochs = 5;
  double lr = 3e-3, target = 0.92;
  std::int64_t bs = 128;
  std::uint64_t seed = 0;
  bool channels_last = false;
  app.add_option("--data", data)->capture_default_str();
  app.add_option("--model", model)->capture_default_str();
  app.add_option("--epochs", epochs, "epochs of the one-cycle schedule")->capture_default_str();
  app.add_option("--lr", lr)->capture_default_str();
  app.add_option("--bs", bs, "batch size per rank")->capture_default_str();
  app.add_option("--target", target, "test accuracy to reach")->capture_default_str();
  app.add_option("--seed", seed)->capture_default_str();
  app.add_flag("--channels-last", channels_last, "train with the ChannelsLast callback");
  bool first_batch = false;
  app.add_flag("--first-batch", first_batch, "stop at the first training batch and print when it came");
  bool local_batch_norm = false;
  app.add_flag("--no-sync-bn", local_batch_norm, "keep BatchNorm statistics per rank (DistribCtx's sync_bn = false)");
  CLI11_PARSE(app, argc, argv);
  try {
    fl::set_seed(seed);
    auto dls = fl::ImageDataLoaders::from_idx(data, {.bs = bs, .seed = seed});
    fl::Learner learn(dls, model_named(model), fl::cross_entropy(),
                      {.opt_func = fl::Adam(), .metrics = {fl::accuracy()}, .progress = false});
    auto stop = std::make_shared<StopAtAccuracy>(target);
    const auto start = std::chrono::steady_clock::now();
    {
      fl::DistribCtx ctx(learn, {.sync_bn = !local_batch_norm});
      std::vector<fl::CallbackPtr> cbs{stop};
      if (channels_last) cbs.push_back(std::make_shared<fl::ChannelsLast>());
      if (first_batch) cbs.push_back(std::make_shared<StopAtFirstBatch>());
      learn.fit_one_cycle(epochs, lr, {.fit = {.cbs = cbs}});
    }
    if (first_batch) return 0;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (fl::is_main()) {
      fmt::print(
          "{{\"reached\": {}, \"epochs\": {}, \"accuracy\": {:.4f}, \"train_seconds\": {:.2f}, \"history\": "
          "[{:.4f}], \"epoch_seconds\": [{:.2f}]}}\n",
          stop->reached, stop->epochs, stop->accuracy, seconds, fmt::join(stop->history, ", "),
          fmt::join(stop->epoch_seconds, ", "));
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "tta_train: error: " << e.what() << "\n";
    return 1;
  }
}
