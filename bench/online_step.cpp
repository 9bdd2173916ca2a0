// online_step (and online_step_small, the same program built with FASTLEARN_BENCH_SMALL_SURROGATE): training steps per
// second of a program that learns a surrogate while it runs (the step API). The surrogate:
//   online_step        the MLP 128-512-512-128 (ReLU), batch 256, 2 threads, the Learner without Progress;
//   online_step_small  the MLP 8-64-64-8 (ReLU), batch 32, 1 thread, the Learner's default callbacks;
// both: 16 batches made beforehand, in turn, MSE, Adam (fastai's defaults, lr 1e-3), the loss read on the host after
// each step. Three sides, interleaved:
//   ours    Learner::train_step (begin_steps with a constant-lr fit: every event, the Recorder, the fit's fiber);
//   anchor  the same step in a PyTorch loop driven from Python (bench/python/online_step.py), torch.optim.Adam;
//   bare    the same model and fastlearn Adam stepped by a hand-written C++ loop (forward, loss, backward, step,
//           zero_grad): the Learner's own cost per step is ours against it.
// And host_loop_after: the bare loop's speed after the steps (still under way, the anchor idle) over its speed before
// they began, in the same process (a Learner that slows the program it lives in shows there). Median and range of
// FASTLEARN_BENCH_REPEATS (default 5) runs of --steps (default 300; 3000 for the small surrogate) each. Prints one JSON
// object. Goals: online_step ratio >= 1.2, learner_cost <= 5%, host_loop_after >= 0.97; online_step_small ratio >= 3,
// learner_cost <= 25%.
#include <fastlearn/core/random.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/optim/adam.h>

#include <fmt/format.h>
#include <torch/torch.h>

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
  bool progress;
  const char* what;
};

#ifdef FASTLEARN_BENCH_SMALL_SURROGATE
constexpr Surrogate kSurrogate{
    .name = "online_step_small",
    .width = 8,
    .hidden = 64,
    .batch = 32,
    .threads = 1,
    .steps = 3000,
    .progress = true,
    .what =
        "train_step of an MLP 8-64-64-8 surrogate, batch 32, MSE, Adam, 1 thread, the default callbacks, loss "
        "read each step: Learner::train_step vs a PyTorch loop in Python (anchor) and a bare C++ loop (bare)"};
#else
constexpr Surrogate kSurrogate{
    .name = "online_step",
    .width = 128,
    .hidden = 512,
    .batch = 256,
    .threads = 2,
    .steps = 300,
    .progress = false,
    .what =
        "train_step of an MLP 128-512-512-128 surrogate, batch 256, MSE, Adam, 2 threads, loss read each step: "
        "Learner::train_step vs a PyTorch loop in Python (anchor) and a bare C++ loop (bare)"};
#endif

torch::nn::Sequential surrogate() { return bench::surrogate_mlp(kSurrogate.width, kSurrogate.hidden); }

}  // namespace

int main(int argc, char** argv) {
  const int steps = bench::int_flag(argc, argv, "--steps", kSurrogate.steps);
  const int repeats = bench::repeats(5);
  torch::set_num_threads(kSurrogate.threads);
  fl::set_seed(0);
  const auto batches = bench::surrogate_batches(kSurrogate.batch, kSurrogate.width);
  const auto& xs = batches.first;
  const auto& ys = batches.second;

  auto bare_model = surrogate();
  auto opt = fl::Adam()(fl::trainable_params(*bare_model), 1e-3);
  double bare_loss = 0;
  std::int64_t bare_next = 0;
  auto bare_run = [&] {
    const auto start = bench::Clock::now();
    for (int s = 0; s < steps; ++s, ++bare_next) {
      const auto i = static_cast<std::size_t>(bare_next % 16);
      auto loss = torch::mse_loss(bare_model->forward(xs[i]), ys[i]);
      loss.backward();
      opt->step();
      opt->zero_grad();
      bare_loss = loss.item<double>();
    }
    return steps / bench::seconds_since(start);
  };
  // Made before the bare loop's first run: a Learner installs fastlearn's CPU memory cache, which the bare loop then
  // uses too (host_loop_after compares the same process before and after the steps, nothing else).
  fl::Learner learn(surrogate(), fl::mse_loss(),
                    {.opt_func = fl::Adam(), .progress = kSurrogate.progress, .device = torch::kCPU});
  bare_run();  // warm-up
  std::vector<double> bare_before;
  for (int r = 0; r < repeats; ++r) bare_before.push_back(bare_run());

  // One long run of steps, timed in slices: the Learner's fit stays up across them, as in a running program.
  learn.begin_steps({.steps = static_cast<std::int64_t>(steps) * (repeats + 1)},
                    [](fl::Learner& l, int n) { l.fit(n, 1e-3); });
  std::int64_t next = 0;
  double our_loss = 0;
  auto ours_run = [&] {
    const auto start = bench::Clock::now();
    for (int s = 0; s < steps; ++s, ++next)
      our_loss = learn.train_step(xs[static_cast<std::size_t>(next % 16)], ys[static_cast<std::size_t>(next % 16)])
                     .item<double>();
    return steps / bench::seconds_since(start);
  };

  bench::Coprocess theirs({FASTLEARN_PYTHON, std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/online_step.py",
                           std::to_string(kSurrogate.threads), std::to_string(kSurrogate.width),
                           std::to_string(kSurrogate.hidden), std::to_string(kSurrogate.batch)});
  if (theirs.read_line() != "ready") return 1;
  double their_loss = 0;
  auto their_run = [&] {
    const auto reply = bench::numbers(theirs.request(fmt::format("run {}", steps)), 2);  // seconds, last loss
    their_loss = reply[1];
    return steps / reply[0];
  };
  ours_run(), their_run();  // warm-up
  std::vector<double> ours, anchor, bare;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(ours_run());
    anchor.push_back(their_run());
    bare.push_back(bare_run());  // while the steps are under way
  }
  // The program's loop again, steps still under way, the anchor idle as it was before the steps.
  std::vector<double> bare_after;
  for (int r = 0; r < repeats; ++r) bare_after.push_back(bare_run());
  learn.end_steps();
  const auto o = bench::summarize(ours), a = bench::summarize(anchor), b = bench::summarize(bare),
             before = bench::summarize(bare_before), after = bench::summarize(bare_after);
  const auto row = bench::Row(kSurrogate.name, o, a, "steps/s", true, 1)
                       .stats("bare", b, 1)
                       .set("learner_cost", 1.0 - o.median / b.median, 4)
                       .stats("bare_before", before, 1)
                       .stats("bare_after", after, 1)
                       .set("host_loop_after", after.median / before.median, 3)
                       .set("last_losses",
                            {bench::rounded(our_loss, 5), bench::rounded(their_loss, 5), bench::rounded(bare_loss, 5)})
                       .set("threads", kSurrogate.threads)
                       .set("repeats", repeats)
                       .set("steps", steps)
                       .set("what", kSurrogate.what);
  fmt::print("{}\n", bench::results_line({row}));
  return 0;
}
