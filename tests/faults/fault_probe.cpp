// fault_probe: the training program of the fault tests (faults_test.cpp). A tiny classifier on synthetic
// data (fit_one_cycle, dropout, shuffled batches) that runs in milliseconds per epoch, alone or under
// `fastlearn launch`, with switches that make it fail on purpose:
//   fault_probe train --out DIR [--epochs 3] [--every 2] [--sleep-ms 0] [--timeout-s 20]
//               [--die-rank R --die-epoch E --die-batch B]   SIGKILL itself there (first attempt only)
//               [--hang-rank R --hang-batch B]               sleep forever there (before the step's all_reduce)
//               [--pid-file F]                               append "<rank> <pid>" when started
//   It resumes from the newest complete checkpoint in DIR/checkpoints when there is one, writes
//   DIR/metrics.json and, at the end, DIR/models/final.safetensors (weights only).
//   fault_probe checkpoint-loop --out DIR   writes checkpoints into DIR/checkpoints until killed
//   fault_probe verify --out DIR           loads the newest checkpoint of DIR/checkpoints; exit 0 when it loads
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <thread>

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

fl::DataLoaders probe_data(std::int64_t n_train, std::int64_t bs) {
  auto gen = at::detail::createCPUGenerator(7);
  const std::int64_t n = n_train + 32;
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({3, 8}, gen).mul(2).index_select(0, y) + at::randn({n, 8}, gen);
  auto train = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.slice(0, 0, n_train)},
                                                   std::vector<at::Tensor>{y.slice(0, 0, n_train)});
  auto valid = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x.slice(0, n_train)},
                                                   std::vector<at::Tensor>{y.slice(0, n_train)});
  return fl::DataLoaders(fl::DataLoader(train, {.bs = bs, .shuffle = true, .seed = 11}),
                         fl::DataLoader(valid, {.bs = bs}), 3);
}

struct ProbeNetImpl : torch::nn::Module {
  explicit ProbeNetImpl(std::int64_t hidden) {
    fc1 = register_module("fc1", torch::nn::Linear(8, hidden));
    drop = register_module("drop", torch::nn::Dropout(0.2));  // uses the global RNG: resume must restore it
    fc2 = register_module("fc2", torch::nn::Linear(hidden, 3));
  }
  at::Tensor forward(const at::Tensor& x) { return fc2(drop(torch::relu(fc1(x)))); }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::Dropout drop{nullptr};
};
TORCH_MODULE(ProbeNet);

int restart_count() {
  const char* v = std::getenv("TORCHELASTIC_RESTART_COUNT");
  return v ? std::atoi(v) : 0;
}

// Kills or hangs this rank at a given training batch, on the first attempt only.
class Saboteur : public fl::Callback {
 public:
  int die_rank = -1, die_epoch = 0, die_batch = 0, hang_rank = -1, hang_batch = 0, sleep_ms = 0;
  std::string name() const override { return "saboteur"; }
  void before_backward() override {
    auto& l = learn();
    if (restart_count() > 0) return;
    if (fl::rank() == hang_rank && l.epoch == 0 && l.iter == hang_batch) {
      std::fprintf(stderr, "fault_probe: rank %d hangs at batch %d\n", fl::rank(), hang_batch);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
    }
  }
  void after_batch() override {
    auto& l = learn();
    if (sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
    if (!l.training || restart_count() > 0) return;
    if (fl::rank() == die_rank && l.epoch == die_epoch && l.iter == die_batch) {
      std::fprintf(stderr, "fault_probe: rank %d kills itself at epoch %d batch %d\n", fl::rank(), die_epoch,
                   die_batch);
      std::fflush(stderr);
      std::raise(SIGKILL);
    }
  }
};

std::unique_ptr<fl::Learner> make_learner(const fs::path& out, std::int64_t n_train, std::int64_t bs,
                                          std::int64_t hidden, std::vector<fl::CallbackPtr> cbs) {
  fl::set_seed(3);
  ProbeNet net(hidden);
  return std::make_unique<fl::Learner>(
      probe_data(n_train, bs), net, fl::cross_entropy(),
      fl::LearnerOptions{
          .opt_func = fl::Adam(), .metrics = {fl::accuracy()}, .cbs = std::move(cbs), .path = out, .progress = false});
}

int train(const fs::path& out, int epochs, std::int64_t every, int timeout_s, const std::shared_ptr<Saboteur>& sab,
          const std::string& pid_file) {
  if (!pid_file.empty()) {
    std::ofstream(pid_file, std::ios::app) << fl::rank() << ' ' << ::getpid() << std::endl;
  }
  auto checkpointer = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = every});
  auto stop = std::make_shared<fl::GracefulStop>();
  auto learn = make_learner(out, 96, 8, 16, {std::make_shared<fl::MetricsJson>(), checkpointer, stop, sab});
  const auto resume = fl::latest_checkpoint(checkpointer->dir());
  {
    // Sets up the process group only under a launcher (several processes).
    fl::DistribCtx ctx(*learn, fl::DistributedTrainerOptions{},
                       fl::SetupOptions{.timeout = std::chrono::seconds(timeout_s)});
    if (resume && fl::rank() == 0) std::fprintf(stderr, "fault_probe: resuming from %s\n", resume->c_str());
    learn->fit_one_cycle(epochs, 1e-2, {.fit = {.resume_from = resume.value_or(fs::path())}});
    if (!stop->stopped()) learn->save("final", {.with_opt = false});
  }
  return stop->stopped() ? 128 + fl::stop_signal() : 0;
}

// Writes checkpoints of a model of about 2 MB, changing the weights each time, until killed.
int checkpoint_loop(const fs::path& out) {
  auto checkpointer = std::make_shared<fl::Checkpointer>(fl::CheckpointerOptions{.every_n_batches = 1, .keep = 2});
  auto learn = make_learner(out, 4096, 8, 512, {checkpointer});
  std::printf("writing\n");
  std::fflush(stdout);
  learn->fit(1000, 1e-3);
  return 0;
}

int verify(const fs::path& out) {
  const auto latest = fl::latest_checkpoint(out / "checkpoints", {.skip_torn = false});
  if (!latest) {
    std::fprintf(stderr, "fault_probe verify: no checkpoint in %s\n", (out / "checkpoints").c_str());
    return 2;
  }
  auto learn = make_learner(out, 4096, 8, 512, {});
  fl::load_checkpoint(*learn, *latest);
  std::printf("%s\n", latest->c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fastlearn fault-test probe"};
  app.require_subcommand(1);
  std::string out, pid_file;
  int epochs = 3, timeout_s = 20;
  std::int64_t every = 2;
  auto sab = std::make_shared<Saboteur>();
  auto* train_cmd = app.add_subcommand("train", "train (resuming from the newest checkpoint in OUT)");
  train_cmd->add_option("--out", out)->required();
  train_cmd->add_option("--epochs", epochs);
  train_cmd->add_option("--every", every, "checkpoint every N training batches");
  train_cmd->add_option("--timeout-s", timeout_s, "collective timeout");
  train_cmd->add_option("--sleep-ms", sab->sleep_ms, "sleep after each batch");
  train_cmd->add_option("--die-rank", sab->die_rank);
  train_cmd->add_option("--die-epoch", sab->die_epoch);
  train_cmd->add_option("--die-batch", sab->die_batch);
  train_cmd->add_option("--hang-rank", sab->hang_rank);
  train_cmd->add_option("--hang-batch", sab->hang_batch);
  train_cmd->add_option("--pid-file", pid_file);
  auto* loop_cmd = app.add_subcommand("checkpoint-loop", "write checkpoints until killed");
  loop_cmd->add_option("--out", out)->required();
  auto* verify_cmd = app.add_subcommand("verify", "load the newest checkpoint");
  verify_cmd->add_option("--out", out)->required();
  CLI11_PARSE(app, argc, argv);
  try {
    if (*train_cmd) return train(out, epochs, every, timeout_s, sab, pid_file);
    if (*loop_cmd) return checkpoint_loop(out);
    return verify(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_probe: error: %s\n", e.what());
    return 1;
  }
}
