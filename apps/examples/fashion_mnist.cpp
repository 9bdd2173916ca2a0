// Fashion-MNIST with the Learner: simple_cnn, fit_one_cycle, accuracy, a CSV log, metrics.json and a
// checkpoint in --out. One process by default; data parallel when started by a launcher:
//   fastlearn launch --nproc-per-node 2 build/bin/fashion_mnist --bs 64
//   fashion_mnist [--data DIR|URL] [--data-sha256 HEX] [--epochs 3] [--lr 3e-3] [--bs 128] [--workers 1]
//                 [--out DIR] [--seed 0] [--checkpoint-every N] [--resume FILE|auto]
// A URL (http(s):// or file://) names an archive of the four files: downloaded, verified, extracted into
// the cache. Checkpoints go to DIR/checkpoints (after each epoch, and every N batches with
// --checkpoint-every); --resume continues a fit from one (auto: the newest there). SIGINT / SIGTERM stop
// at the next batch with a checkpoint (exit code 128 + signal).
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdlib>
#include <iostream>

namespace fl = fastlearn;

int main(int argc, char** argv) {
  CLI::App app{"Train a small CNN on Fashion-MNIST with fastlearn's Learner"};
  const char* env_dir = std::getenv("FASTLEARN_FASHION_MNIST");
  std::string data = env_dir ? env_dir : "/usr/share/datasets/fashion-mnist";
  int epochs = 3, workers = 1;
  double lr = 3e-3;
  std::int64_t bs = 128;
  std::string out = "fashion_mnist_run";
  std::uint64_t seed = 0;
  std::string data_sha256, resume;
  std::int64_t checkpoint_every = 0;
  app.add_option("--data", data,
                 "folder with the four Fashion-MNIST IDX files (.gz or raw), or the URL of an archive "
                 "of them")
      ->capture_default_str();
  app.add_option("--data-sha256", data_sha256, "expected SHA-256 of the archive given by URL");
  app.add_option("--epochs", epochs, "epochs of fit_one_cycle")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--lr", lr, "maximum learning rate of the cycle")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--bs", bs, "batch size")->capture_default_str()->check(CLI::PositiveNumber);
  app.add_option("--workers", workers, "data loading threads")->capture_default_str()->check(CLI::NonNegativeNumber);
  app.add_option("--out", out, "output folder: metrics.json, history.csv, models/, loss.svg")->capture_default_str();
  app.add_option("--seed", seed, "random seed (weights, data order)")->capture_default_str();
  app.add_option("--checkpoint-every", checkpoint_every, "also checkpoint every N training batches")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--resume", resume, "checkpoint to continue from, or 'auto' for the newest in OUT/checkpoints");
  CLI11_PARSE(app, argc, argv);

  try {
    fl::set_seed(seed);
    if (data.find("://") != std::string::npos) {
      const fl::DataSource source{.name = "fashion-mnist-" + std::filesystem::path(data).stem().string(),
                                  .files = {{.url = data, .sha256 = data_sha256}}};
      data = fl::rank0_first([&] { return fl::untar_data(source); }).string();
    }
    auto dls = fl::ImageDataLoaders::from_idx(data, {.bs = bs, .num_workers = workers, .seed = seed});
    auto checkpointer =
        std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = checkpoint_every});
    auto stop = std::make_shared<fl::GracefulStop>();
    fl::Learner learn(
        dls, fl::models::simple_cnn(dls.c()), fl::cross_entropy(),
        {.opt_func = fl::Adam(),
         .metrics = {fl::accuracy()},
         // A resumed run keeps the rows of the epochs before the checkpoint in history.csv.
         .cbs = {std::make_shared<fl::CSVLogger>(), std::make_shared<fl::MetricsJson>(), checkpointer, stop},
         .path = out});
    std::filesystem::path resume_from = resume;
    if (resume == "auto") resume_from = fl::latest_checkpoint(checkpointer->dir()).value_or(std::filesystem::path());
    {
      fl::DistribCtx ctx(learn);  // data parallel under `fastlearn launch` / torchrun; nothing with one process
      learn.fit_one_cycle(epochs, lr, {.fit = {.resume_from = resume_from}});
    }
    // A rank whose peer got the signal stops by agreement without one of its own: it reports SIGTERM.
    if (stop->stopped()) return 128 + (fl::stop_signal() != 0 ? fl::stop_signal() : SIGTERM);
    if (!fl::is_main()) return 0;  // after the scope every rank holds the same weights: rank 0 reports
    learn.save("fashion_cnn");
    learn.recorder().plot_loss(std::filesystem::path(out) / "loss.svg");
    const auto result = learn.validate();
    fmt::print("test accuracy {:.2f}% (loss {:.4f}); outputs in {}\n", 100 * result.metric("accuracy"), result.loss,
               out);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "fashion_mnist: error: " << e.what() << "\n";
    return 1;
  }
}
