// optimizer_step: time of one optimizer step of fastlearn's optimizers against LibTorch's own torch::optim
// (the anchor a hand-written training loop would use), on a 1M-parameter MLP, on models::simple_cnn and on
// models::conv_net in channels-last memory format, with fixed random gradients. Both sides run interleaved in one
// process on the same parameters' shapes. Prints one JSON object (one entry per optimizer and model; time per step,
// lower is better).
#include <fastlearn/models/models.h>
#include <fastlearn/optim/adam.h>
#include <fastlearn/optim/optimizer.h>
#include <fastlearn/optim/sgd.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <functional>
#include <string>
#include <vector>

#include "support/result_row.h"

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepeats = 11;

// A model's parameters, copied, with a fixed random gradient each.
std::vector<at::Tensor> with_grads(const std::vector<at::Tensor>& model_params) {
  std::vector<at::Tensor> ps;
  for (const auto& p : model_params) {
    auto q = p.detach().clone().requires_grad_(true);
    q.mutable_grad() = torch::randn_like(q) * 1e-2;
    ps.push_back(q);
  }
  return ps;
}

// Microseconds per step over `steps` steps.
double time_steps(const std::function<void()>& step, int steps) {
  const auto start = Clock::now();
  for (int i = 0; i < steps; ++i) step();
  return std::chrono::duration<double, std::micro>(Clock::now() - start).count() / steps;
}

struct Case {
  std::string name;
  std::function<void()> ours, ours_foreach, anchor;
};

}  // namespace

int main() {
  torch::manual_seed(0);
  torch::nn::Sequential mlp(torch::nn::Linear(784, 1024), torch::nn::ReLU(), torch::nn::Linear(1024, 256),
                            torch::nn::ReLU(), torch::nn::Linear(256, 10));
  auto cnn = fl::models::simple_cnn(10);
  struct Model {
    std::string name;
    std::vector<at::Tensor> params;
  };
  // conv_net's parameters channels-last, as the ChannelsLast callback leaves them: the fused kernels get them as
  // views in memory order (Optimizer::fused_operand).
  std::vector<at::Tensor> conv_net_cl;
  for (const auto& p : fl::models::conv_net({})->parameters())
    conv_net_cl.push_back(p.dim() == 4 ? p.detach().contiguous(at::MemoryFormat::ChannelsLast) : p.detach());
  const std::vector<Model> models{
      {"mlp", mlp->parameters()}, {"cnn", cnn->parameters()}, {"conv_net_channels_last", conv_net_cl}};

  // Every optimizer keeps its own copy of the parameters; they live as long as the cases.
  std::vector<std::unique_ptr<fl::Optimizer>> ours_opts;
  std::vector<std::unique_ptr<torch::optim::Optimizer>> anchor_opts;
  std::vector<Case> cases;
  std::vector<std::int64_t> numels;
  auto add = [&](const std::string& name, const Model& m, const fl::OptFunc& ours, const fl::OptFunc& ours_foreach,
                 const std::function<std::unique_ptr<torch::optim::Optimizer>(std::vector<at::Tensor>)>& anchor) {
    ours_opts.push_back(ours({with_grads(m.params)}, 1e-3));
    auto* o = ours_opts.back().get();
    ours_opts.push_back(ours_foreach({with_grads(m.params)}, 1e-3));
    auto* f = ours_opts.back().get();
    anchor_opts.push_back(anchor(with_grads(m.params)));
    auto* a = anchor_opts.back().get();
    cases.push_back({name + "_" + m.name, [o] { o->step(); }, [f] { f->step(); }, [a] { a->step(); }});
    std::int64_t n = 0;
    for (const auto& p : m.params) n += p.numel();
    numels.push_back(n);
  };
  for (const auto& m : models) {
    add("sgd", m, fl::SGD({.mom = 0.9}), fl::SGD({.mom = 0.9, .fused = false}), [](std::vector<at::Tensor> ps) {
      return std::make_unique<torch::optim::SGD>(ps, torch::optim::SGDOptions(1e-3).momentum(0.9));
    });
    add("adam", m, fl::Adam({.sqr_mom = 0.999, .eps = 1e-8, .wd = 0.01, .decouple_wd = false}),
        fl::Adam({.sqr_mom = 0.999, .eps = 1e-8, .wd = 0.01, .decouple_wd = false, .fused = false}),
        [](std::vector<at::Tensor> ps) {
          return std::make_unique<torch::optim::Adam>(ps, torch::optim::AdamOptions(1e-3).weight_decay(0.01));
        });
    add("adamw", m, fl::AdamW(), fl::AdamW({.sqr_mom = 0.999, .eps = 1e-8, .fused = false}),
        [](std::vector<at::Tensor> ps) {
          return std::make_unique<torch::optim::AdamW>(ps, torch::optim::AdamWOptions(1e-3).weight_decay(0.01));
        });
  }

  std::vector<bench::Row> rows;
  for (std::size_t c = 0; c < cases.size(); ++c) {
    const auto& k = cases[c];
    // Enough steps per repeat for ~0.1 s of the anchor.
    time_steps(k.ours, 10);
    time_steps(k.ours_foreach, 10);
    const int steps = std::clamp(static_cast<int>(1e5 / std::max(1.0, time_steps(k.anchor, 10))), 10, 5000);
    std::vector<double> ours, foreach, anchor;
    for (int r = 0; r < kRepeats; ++r) {  // interleaved, so all sides see the same machine state
      ours.push_back(time_steps(k.ours, steps));
      foreach
        .push_back(time_steps(k.ours_foreach, steps));
      anchor.push_back(time_steps(k.anchor, steps));
    }
    const auto o = bench::summarize(ours), f = bench::summarize(foreach), a = bench::summarize(anchor);
    rows.push_back(
        bench::Row("optimizer_step_" + k.name, o, a, "us/step", false, 1)
            .set("ratio", a.median / o.median, 2)  // 2 decimals, as this row always had
            .set("ours_foreach", f.median, 1)
            .set("params", numels[c])
            .set("threads", at::get_num_threads())
            .set("repeats", kRepeats)
            .set("steps_per_repeat", steps)
            .set("what",
                 fmt::format("fastlearn {} step (fused CPU kernels) vs torch::optim, fixed random grads", k.name)));
  }
  fmt::print("{}\n", bench::results_line(rows));
  return 0;
}
