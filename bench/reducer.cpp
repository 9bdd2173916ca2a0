// reducer_bandwidth and bucketed_vs_naive, on 2 ranks spawned from this binary (local ranks, so the shared memory
// transport unless said otherwise):
//  - reducer_bandwidth: gradient bytes per second the GradReducer adds to backward (its extra time over a
//    plain backward of the same model, overlap included) vs one raw all_reduce of a flat buffer holding
//    every gradient run right after the same backward (the time it adds, likewise). Both include waiting
//    for the slower rank. ratio = ours / anchor (1.0 = the raw all_reduce's bandwidth).
//  - bucketed_vs_naive: the time gradient averaging adds to a step for a 62-tensor MLP: the reducer vs
//    the tutorial's average_gradients (one all_reduce per parameter after backward). ratio = naive / ours.
// Rank 0 prints one JSON object.
#include <fastlearn/distributed/collectives.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/distributed/runtime.h>
#include <fastlearn/distributed/spawn.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <vector>

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

// Median seconds of a forward + backward, with `after` run after backward (inside the timing).
template <typename After>
double step_time(torch::nn::Sequential& model, const at::Tensor& x, const at::Tensor& y, After&& after,
                 double loss_scale = 1.0) {
  std::vector<double> times;
  for (int r = 0; r < kRepeats + 2; ++r) {
    for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
    fl::barrier();
    const auto start = Clock::now();
    (torch::nn::functional::cross_entropy(model->forward(x), y) * loss_scale).backward();
    after();
    if (r >= 2) times.push_back(seconds_since(start));  // the first two warm up
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

void run_rank(int) {
  fl::setup_distrib({.timeout = std::chrono::seconds(60)});
  torch::manual_seed(0);
  auto& world = fl::world_group();

  // reducer_bandwidth: a wide MLP (6.5M parameters, 26 MB of float gradients), small batch so that
  // communication matters.
  auto wide = fl::models::mlp(1024, {2048, 2048}, 10);
  auto x = torch::randn({16, 1024});
  auto y = torch::randint(0, 10, {16}, torch::kLong);
  std::int64_t numel = 0;
  for (auto& p : wide->parameters()) numel += p.numel();
  const double bytes = 4.0 * static_cast<double>(numel);
  // Rounds interleave the variants so that a change in the machine's load hits them alike.
  auto flat = torch::randn({numel});
  std::vector<double> plains, views, copies, raws;
  for (int round = 0; round < 3; ++round) {
    plains.push_back(step_time(wide, x, y, [] {}));
    {  // as DistributedTrainer runs it: the loss divided by the world size, large gradients reduced in place
      fl::GradReducer reducer(named(*wide), {}, world, {.divide_by_world_size = false});
      views.push_back(step_time(
          wide, x, y, [] {}, 1.0 / fl::world_size()));
    }
    {  // every gradient copied into a packed bucket and back (the classic design)
      fl::GradReducer reducer(
          named(*wide), {}, world,
          {.gradient_as_bucket_view = false, .in_place_mb = std::numeric_limits<double>::infinity()});
      copies.push_back(step_time(wide, x, y, [] {}));
    }
    // The anchor runs right after the same backward, so that both sides pay the wait for the slower rank.
    raws.push_back(step_time(wide, x, y, [&] { fl::all_reduce(flat); }));
  }
  const double plain = median(plains), with_reducer = median(views), with_copies = median(copies);
  const double raw = std::max(median(raws) - plain, 1e-6);
  const double reducer_cost = std::max(with_reducer - plain, 1e-6);

  const auto shared = bucketed_and_naive(world);
  fl::teardown_distrib();
  // The bucketing matters most where each call is expensive: Gloo over TCP, as between hosts. The shared memory
  // transport of local ranks makes a call cheap, so the same comparison is reported on it as well.
  fl::setup_distrib({.timeout = std::chrono::seconds(60), .shared_memory = false});
  const auto tcp = bucketed_and_naive(fl::world_group());
  const double naive_cost = tcp.naive_cost(), bucketed_cost = tcp.bucketed_cost();
  const std::int64_t deep_tensors = tcp.tensors;
  const double deep_plain = tcp.plain, bucketed = tcp.bucketed, naive = tcp.naive;

  if (fl::rank() == 0) {
    fmt::print(
        R"({{"reducer_bandwidth": {{"ours": {:.1f}, "anchor": {:.1f}, "ratio": {:.3f}, "unit": "MB/s", "higher_is_better": true, )"
        R"("gradient_mb": {:.1f}, "backward_s": {:.5f}, "backward_with_reducer_s": {:.5f}, "backward_with_packing_and_copies_s": {:.5f}, "raw_allreduce_added_s": {:.5f}, )"
        R"("what": "bytes / time the reducer adds to backward (overlap included; configured as DistributedTrainer runs it) vs one all_reduce of a flat buffer of all gradients; 2 local ranks, shared memory transport"}}, )"
        R"("bucketed_vs_naive": {{"ours": {:.6f}, "anchor": {:.6f}, "ratio": {:.2f}, "unit": "s/step added", "higher_is_better": false, )"
        R"("parameter_tensors": {}, "backward_s": {:.6f}, "step_with_reducer_s": {:.6f}, "step_with_per_parameter_allreduce_s": {:.6f}, )"
        R"("shared_memory_ours": {:.6f}, "shared_memory_anchor": {:.6f}, "shared_memory_ratio": {:.2f}, )"
        R"("what": "time gradient averaging adds to a step: bucketed reducer vs one all_reduce per parameter after backward; 2 ranks, Gloo over loopback TCP; shared_memory_*: the same over the shared memory transport of local ranks"}}}})"
        "\n",
        bytes / reducer_cost / 1e6, bytes / raw / 1e6, raw / reducer_cost, bytes / 1e6, plain, with_reducer,
        with_copies, raw, bucketed_cost, naive_cost, naive_cost / bucketed_cost, deep_tensors, deep_plain, bucketed,
        naive, shared.bucketed_cost(), shared.naive_cost(), shared.naive_cost() / shared.bucketed_cost());
    std::fflush(stdout);
  }
  fl::teardown_distrib();
}

}  // namespace

int main() {
  fl::spawn(2, run_rank, {.prefix_output = false});
  return 0;
}
