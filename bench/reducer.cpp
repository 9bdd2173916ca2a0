// reducer_bandwidth, bucketed_vs_naive and the reduce-scatter rows, on 2 ranks spawned from this binary (local ranks,
// so the shared memory transport unless said otherwise):
//  - reducer_bandwidth: gradient bytes per second the GradReducer adds to backward (its extra time over a
//    plain backward of the same model, overlap included) vs one raw all_reduce of a flat buffer holding
//    every gradient run right after the same backward (the time it adds, likewise). Both include waiting
//    for the slower rank. ratio = ours / anchor (1.0 = the raw all_reduce's bandwidth).
//  - bucketed_vs_naive: the time gradient averaging adds to a step for a 62-tensor MLP: the reducer vs
//    the tutorial's average_gradients (one all_reduce per parameter after backward). ratio = naive / ours.
//  - reduce_scatter_vs_all_reduce: seconds of one reduce_scatter of a flat 25 MB float buffer (what sharded gradients
//    communicate per bucket) against one all_reduce of the same buffer (what data parallel training communicates),
//    both over the shared memory transport, calls interleaved. ratio = all_reduce / reduce_scatter.
//  - reduce_scatter_vs_gloo: the same reduce_scatter over shared memory against Gloo's over loopback TCP (Gloo's
//    _reduce_scatter_base, what PyTorch's reduce_scatter_tensor runs on CPU). ratio = Gloo / ours.
// Rank 0 prints one JSON object.
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/comm/spawn.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

#include "support/result_row.h"

namespace fl = fastlearn;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kRepeats = 15;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

std::vector<std::pair<std::string, at::Tensor>> named(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

// Seconds of one forward + backward of `model` (its gradients cleared first) with `after` run after backward
// (inside the timing); the ranks start it together.
template <typename After>
double one_step(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y, After&& after,
                double loss_scale = 1.0) {
  for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
  fl::barrier();
  const auto start = Clock::now();
  (torch::nn::functional::cross_entropy(model->forward(x), y) * loss_scale).backward();
  after();
  return seconds_since(start);
}

// Median seconds of one_step, after two warm-up steps.
template <typename After>
double step_time(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y, After&& after) {
  std::vector<double> times;
  for (int r = 0; r < kRepeats + 2; ++r) {
    const double t = one_step(model, x, y, after);
    if (r >= 2) times.push_back(t);
  }
  return median(times);
}

// bucketed_vs_naive's measurement: a step of a 31-layer MLP (62 parameter tensors) without averaging, with the
// reducer, and with the tutorial's average_gradients (one all_reduce per parameter after backward).
struct DeepSteps {
  double plain = 0, bucketed = 0, naive = 0;
  std::int64_t tensors = 0;
  double bucketed_cost() const { return std::max(bucketed - plain, 1e-6); }
  double naive_cost() const { return std::max(naive - plain, 1e-6); }
};

DeepSteps bucketed_and_naive(fl::Group& world) {
  std::vector<std::int64_t> hidden(30, 128);
  auto deep = fl::models::mlp(128, hidden, 10);
  auto dx = torch::randn({32, 128});
  auto dy = torch::randint(0, 10, {32}, torch::kLong);
  DeepSteps steps;
  steps.tensors = static_cast<std::int64_t>(deep->parameters().size());
  steps.plain = step_time(deep, dx, dy, [] {});
  steps.naive = step_time(deep, dx, dy, [&] {
    for (auto& p : deep->parameters()) {
      fl::all_reduce(p.grad());
      p.grad().div_(fl::world_size());
    }
  });
  fl::GradReducer reducer(named(*deep), {}, world);
  steps.bucketed = step_time(deep, dx, dy, [] {});
  return steps;
}

// reducer_bandwidth's measurement: a wide MLP (6.5M parameters, 26 MB of float gradients), small batch so that
// communication matters. One copy of the model per variant (the reducers keep their hooks installed), and the
// variants take turns step by step, so that a change in the machine's speed hits them alike.
struct WideSteps {
  double bytes = 0, plain = 0, with_reducer = 0, with_copies = 0, reducer_cost = 0, raw_cost = 0;
  std::int64_t steps = 0;
  std::vector<double> block_ratios;  ///< raw_cost / reducer_cost per block of consecutive steps: the spread
};

WideSteps reducer_and_raw(fl::Group& world) {
  auto make_wide = [] { return fl::models::mlp(1024, {2048, 2048}, 10); };
  auto wide = make_wide(), with_views = make_wide(), with_copies = make_wide();
  auto x = torch::randn({16, 1024});
  auto y = torch::randint(0, 10, {16}, torch::kLong);
  std::int64_t numel = 0;
  for (auto& p : wide->parameters()) numel += p.numel();
  const double bytes = 4.0 * static_cast<double>(numel);
  auto flat = torch::randn({numel});
  // As DistributedTrainer runs it: the loss divided by the world size, large gradients reduced in place.
  fl::GradReducer views(named(*with_views), {}, world, {.divide_by_world_size = false});
  // Every gradient copied into a packed bucket and back (the classic design).
  fl::GradReducer copies(named(*with_copies), {}, world,
                         {.gradient_as_bucket_view = false, .in_place_mb = std::numeric_limits<double>::infinity()});
  constexpr int kBlocks = 5, kStepsPerBlock = 15;
  std::vector<double> plains, viewed, copied, raws;
  for (int step = 0; step < 3 + kBlocks * kStepsPerBlock; ++step) {
    const bool warm = step >= 3;
    const double plain = one_step(wide, x, y, [] {});
    const double view = one_step(
        with_views, x, y, [] {}, 1.0 / fl::world_size());
    const double copy = one_step(with_copies, x, y, [] {});
    // The anchor runs right after the same backward, so that both sides pay the wait for the slower rank.
    const double raw = one_step(wide, x, y, [&] { fl::all_reduce(flat); });
    if (!warm) continue;
    plains.push_back(plain);
    viewed.push_back(view);
    copied.push_back(copy);
    raws.push_back(raw);
  }
  // The time a variant adds: its median step minus the plain median, over some of the steps.
  auto added = [&](const std::vector<double>& variant, std::size_t first, std::size_t count) {
    auto part = [&](const std::vector<double>& v) {
      return median(std::vector<double>(v.begin() + first, v.begin() + first + count));
    };
    return std::max(part(variant) - part(plains), 1e-6);
  };
  WideSteps out;
  out.bytes = bytes;
  out.steps = static_cast<std::int64_t>(plains.size());
  out.reducer_cost = added(viewed, 0, plains.size());
  out.raw_cost = added(raws, 0, plains.size());
  for (int k = 0; k < kBlocks; ++k) {
    const auto first = static_cast<std::size_t>(k * kStepsPerBlock);
    out.block_ratios.push_back(added(raws, first, kStepsPerBlock) / added(viewed, first, kStepsPerBlock));
  }
  out.plain = median(plains);
  out.with_reducer = median(viewed);
  out.with_copies = median(copied);
  return out;
}

// Median seconds of one call of each collective over a flat 25 MB buffer, the calls interleaved (ranks start together).
struct FlatCollectives {
  double reduce_scatter = 0, all_reduce = 0;
};

FlatCollectives flat_collectives(bool with_all_reduce) {
  const std::int64_t numel = 25 * 1024 * 1024 / 4 / fl::world_size() * fl::world_size();
  auto flat = torch::randn({numel}), part = torch::empty({numel / fl::world_size()});
  auto timed = [](auto&& call) {
    fl::barrier();
    const auto start = Clock::now();
    call();
    return seconds_since(start);
  };
  std::vector<double> scatters, reduces;
  for (int r = 0; r < kRepeats + 2; ++r) {
    const double s = timed([&] { fl::reduce_scatter(part, flat); });
    const double a = with_all_reduce ? timed([&] { fl::all_reduce(flat); }) : 0.0;
    if (r < 2) continue;
    scatters.push_back(s);
    reduces.push_back(a);
  }
  return {.reduce_scatter = median(scatters), .all_reduce = median(reduces)};
}

void run_rank(int) {
  fl::setup_distrib({.timeout = std::chrono::seconds(60)});
  torch::manual_seed(0);
  auto& world = fl::world_group();

  const auto wide = reducer_and_raw(world);
  const auto shared = bucketed_and_naive(world);
  const auto shared_flat = flat_collectives(true);
  fl::teardown_distrib();
  // The bucketing matters most where each call is expensive: Gloo over TCP, as between hosts. The shared memory
  // transport of local ranks makes a call cheap, so the same comparison is reported on it as well.
  fl::setup_distrib({.timeout = std::chrono::seconds(60), .shared_memory = false});
  const auto tcp = bucketed_and_naive(fl::world_group());
  const auto gloo_flat = flat_collectives(false);
  const double naive_cost = tcp.naive_cost(), bucketed_cost = tcp.bucketed_cost();
  const std::int64_t deep_tensors = tcp.tensors;
  const double deep_plain = tcp.plain, bucketed = tcp.bucketed, naive = tcp.naive;

  if (fl::rank() == 0) {
    // Neither row has ours_range / anchor_range (each figure is one median), so they are built here, not as
    // bench::Row.
    using bench::rounded;
    nlohmann::ordered_json bandwidth = nlohmann::ordered_json::object();
    bandwidth["ours"] = rounded(wide.bytes / wide.reducer_cost / 1e6, 1);
    bandwidth["anchor"] = rounded(wide.bytes / wide.raw_cost / 1e6, 1);
    bandwidth["ratio"] = rounded(wide.raw_cost / wide.reducer_cost, 3);
    bandwidth["unit"] = "MB/s";
    bandwidth["higher_is_better"] = true;
    bandwidth["ratio_range"] = {rounded(*std::min_element(wide.block_ratios.begin(), wide.block_ratios.end()), 3),
                                rounded(*std::max_element(wide.block_ratios.begin(), wide.block_ratios.end()), 3)};
    bandwidth["gradient_mb"] = rounded(wide.bytes / 1e6, 1);
    bandwidth["steps"] = wide.steps;
    bandwidth["backward_s"] = rounded(wide.plain, 5);
    bandwidth["backward_with_reducer_s"] = rounded(wide.with_reducer, 5);
    bandwidth["backward_with_packing_and_copies_s"] = rounded(wide.with_copies, 5);
    bandwidth["raw_allreduce_added_s"] = rounded(wide.raw_cost, 5);
    bandwidth["what"] =
        "bytes / time the reducer adds to backward (overlap included; configured as DistributedTrainer runs it) vs "
        "one all_reduce of a flat buffer of all gradients; 2 local ranks, shared memory transport";
    nlohmann::ordered_json bucketing = nlohmann::ordered_json::object();
    bucketing["ours"] = rounded(bucketed_cost, 6);
    bucketing["anchor"] = rounded(naive_cost, 6);
    bucketing["ratio"] = rounded(naive_cost / bucketed_cost, 2);
    bucketing["unit"] = "s/step added";
    bucketing["higher_is_better"] = false;
    bucketing["parameter_tensors"] = deep_tensors;
    bucketing["backward_s"] = rounded(deep_plain, 6);
    bucketing["step_with_reducer_s"] = rounded(bucketed, 6);
    bucketing["step_with_per_parameter_allreduce_s"] = rounded(naive, 6);
    bucketing["shared_memory_ours"] = rounded(shared.bucketed_cost(), 6);
    bucketing["shared_memory_anchor"] = rounded(shared.naive_cost(), 6);
    bucketing["shared_memory_ratio"] = rounded(shared.naive_cost() / shared.bucketed_cost(), 2);
    bucketing["what"] =
        "time gradient averaging adds to a step: bucketed reducer vs one all_reduce per parameter after backward; 2 "
        "ranks, Gloo over loopback TCP; shared_memory_*: the same over the shared memory transport of local ranks";
    // Seconds per call of our reduce_scatter over shared memory against another call on the same 25 MB buffer.
    const auto per_call = [&](double anchor, const char* what) {
      nlohmann::ordered_json row = nlohmann::ordered_json::object();
      row["ours"] = rounded(shared_flat.reduce_scatter, 6);
      row["anchor"] = rounded(anchor, 6);
      row["ratio"] = rounded(anchor / shared_flat.reduce_scatter, 3);
      row["unit"] = "s/call";
      row["higher_is_better"] = false;
      row["mb"] = 25;
      row["what"] = what;
      return row;
    };
    const auto scatter = per_call(
        shared_flat.all_reduce,
        "one reduce_scatter of a flat 25 MB float buffer (sharded gradients, per bucket) vs one all_reduce of it; 2 "
        "local ranks, shared memory transport, calls interleaved, medians of 15");
    const auto vs_gloo = per_call(
        gloo_flat.reduce_scatter,
        "one reduce_scatter of a flat 25 MB float buffer: fastlearn's shared memory transport vs Gloo over loopback "
        "TCP (_reduce_scatter_base, as PyTorch's reduce_scatter_tensor); 2 local ranks, medians of 15");
    nlohmann::ordered_json line = nlohmann::ordered_json::object();
    line["reducer_bandwidth"] = bandwidth;
    line["bucketed_vs_naive"] = bucketing;
    line["reduce_scatter_vs_all_reduce"] = scatter;
    line["reduce_scatter_vs_gloo"] = vs_gloo;
    fmt::print("{}\n", line.dump());
    std::fflush(stdout);
  }
  fl::teardown_distrib();
}

}  // namespace

int main() {
  fl::spawn(2, run_rank, {.prefix_output = false});
  return 0;
}
