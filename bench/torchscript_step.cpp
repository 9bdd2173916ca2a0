// torchscript_step: what training a model scripted in Python costs against the same model written in C++, per step of
// the step API. The online_step surrogates (bench/online_step.cpp): the MLP 128-512-512-128 (ReLU), batch 256, 2
// threads (torchscript_step), and the MLP 8-64-64-8, batch 32, 1 thread (torchscript_step_small), where the
// interpreter's cost per operation weighs most. Each: 16 batches made beforehand, in turn, MSE, Adam (fastai's
// defaults, lr 1e-3), the loss read on the host after each step, Learner::train_step in one long begin_steps. Two
// Learners in one process, interleaved:
//   ours    the surrogate as torch.jit.script of an nn.Sequential (bench/python/torchscript_surrogate.py), through
//           models::torchscript, its weights copied from the C++ model's;
//   anchor  the same surrogate as a torch::nn::Sequential.
// Median and range of FASTLEARN_BENCH_REPEATS (default 5) runs of 300 (3000 small) steps each; both end at the same
// loss when the interpreter computes what the C++ model does. Goal: ratio >= 0.9 (the interpreter costs <= 10%).
#include <fastlearn/core/random.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/torchscript.h>
#include <fastlearn/optim/adam.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"
#include "support/surrogate.h"

namespace fl = fastlearn;

namespace {

struct Surrogate {
  const char* name;
  std::int64_t width, hidden, batch;
  int threads, steps;
};

bench::Row measure(const Surrogate& s, int repeats) {
  torch::set_num_threads(s.threads);
  fl::set_seed(0);
  const auto batches = bench::surrogate_batches(s.batch, s.width);
  const auto& xs = batches.first;
  const auto& ys = batches.second;
  const auto file = std::filesystem::temp_directory_path() / fmt::format("fastlearn_bench_{}.pt", s.name);
  if (std::system(fmt::format("'{}' -W ignore '{}/bench/python/torchscript_surrogate.py' '{}' {} {} >&2",
                              FASTLEARN_PYTHON, FASTLEARN_SOURCE_DIR, file.string(), s.width, s.hidden)
                      .c_str()) != 0)
    throw std::runtime_error("bench/python/torchscript_surrogate.py failed");
  auto cpp = bench::surrogate_mlp(s.width, s.hidden);
  auto script = fl::models::torchscript(file);
  std::filesystem::remove(file);
  {
    torch::NoGradGuard no_grad;  // the same weights on both sides ("0.weight", ... in both)
    auto theirs = cpp->named_parameters();
    for (auto& p : script->named_parameters()) p.value().copy_(theirs[p.key()]);
  }
  const fl::LearnerOptions options{.opt_func = fl::Adam(), .progress = false, .device = torch::kCPU};
  fl::Learner scripted(script, fl::mse_loss(), options);
  fl::Learner plain(cpp, fl::mse_loss(), options);
  for (auto* learn : {&scripted, &plain}) {
    learn->begin_steps({.steps = static_cast<std::int64_t>(s.steps) * (repeats + 1)},
                       [](fl::Learner& l, int n) { l.fit(n, 1e-3); });
  }
  std::int64_t next_scripted = 0, next_plain = 0;
  double scripted_loss = 0, plain_loss = 0;
  const auto run = [&](fl::Learner& learn, std::int64_t& next, double& loss) {
    const auto start = bench::Clock::now();
    for (int step = 0; step < s.steps; ++step, ++next)
      loss = learn.train_step(xs[static_cast<std::size_t>(next % 16)], ys[static_cast<std::size_t>(next % 16)])
                 .item<double>();
    return s.steps / bench::seconds_since(start);
  };
  run(scripted, next_scripted, scripted_loss), run(plain, next_plain, plain_loss);  // warm-up (the JIT profiles)
  std::vector<double> ours, anchor;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(run(scripted, next_scripted, scripted_loss));
    anchor.push_back(run(plain, next_plain, plain_loss));
  }
  scripted.end_steps();
  plain.end_steps();
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  return bench::Row(s.name, o, a, "steps/s", true, 1)
      .set("interpreter_cost", 1.0 - o.median / a.median, 4)
      .set("last_losses", {bench::rounded(scripted_loss, 6), bench::rounded(plain_loss, 6)})
      .set("threads", s.threads)
      .set("repeats", repeats)
      .set("steps", s.steps)
      .set("what", fmt::format("Learner::train_step of the MLP {0}-{1}-{1}-{0} surrogate, batch {2}, MSE, Adam, {3} "
                               "thread(s): torch.jit.script of it (ours) vs the same torch::nn::Sequential (anchor)",
                               s.width, s.hidden, s.batch, s.threads));
}

}  // namespace

int main() {
  const int repeats = bench::repeats(5);
  const auto big = measure({"torchscript_step", 128, 512, 256, 2, 300}, repeats);
  const auto small = measure({"torchscript_step_small", 8, 64, 32, 1, 3000}, repeats);
  fmt::print("{}\n", bench::results_line({big, small}));
  return 0;
}
