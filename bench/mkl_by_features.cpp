// mkl_by_features: ms for the matrix products of one training step that LibTorch hands to MKL, with MKL choosing
// its kernels by the processor's instruction sets (core/mkl_dispatch, the default: ours) against MKL as shipped
// (FASTLEARN_MKL_BY_FEATURES=0: anchor): the products of an MLP step (784-512-256-10, batch 128: forward, weight
// and input gradients, as torch::nn::Linear runs them) and conv_net's two patch products (models::Conv2d's
// weight gradients). MKL decides once per process, so each measurement is a child process; the settings
// alternate. On 1 thread (key mkl_by_features, what a rank of time_to_accuracy runs) and 2
// (mkl_by_features_2_threads). Median and range of 5. ratio = as shipped / ours. On Intel's processors nothing
// changes (ratio 1 within noise). Prints one JSON object.
// usage: bench_mkl_by_features [--child THREADS]
#include <fastlearn/core/mkl_dispatch.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "support/bench_support.h"

namespace fl = fastlearn;

namespace {

struct Product {
  std::string name;
  std::function<at::Tensor()> run;
};

// Linear's forward is x w^T, its weight gradient g^T x and its input gradient g w; the patch products are
// patches^T x grad.
std::vector<Product> products() {
  torch::manual_seed(0);
  std::vector<Product> out;
  const std::int64_t batch = 128;
  const std::vector<std::int64_t> widths{784, 512, 256, 10};
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const auto x = torch::randn({batch, widths[i]}), w = torch::randn({widths[i + 1], widths[i]}),
               g = torch::randn({batch, widths[i + 1]});
    out.push_back({fmt::format("mlp_forward_{}x{}", widths[i], widths[i + 1]), [=] { return at::mm(x, w.t()); }});
    out.push_back({fmt::format("mlp_weight_grad_{}x{}", widths[i], widths[i + 1]), [=] { return at::mm(g.t(), x); }});
    if (i > 0)
      out.push_back({fmt::format("mlp_input_grad_{}x{}", widths[i], widths[i + 1]), [=] { return at::mm(g, w); }});
  }
  for (const auto& [pixels, patch, channels] : {std::array<std::int64_t, 3>{512, 1152, 256}, {2048, 576, 128}}) {
    const auto p = torch::randn({pixels, patch}), g = torch::randn({pixels, channels});
    out.push_back(
        {fmt::format("patch_weight_grad_{}x{}x{}", pixels, patch, channels), [=] { return at::mm(p.t(), g); }});
  }
  return out;
}

// One child: the median over 7 rounds of each product's ms (10 calls a round after 3 warm-up calls), the total
// first.
int child(int threads) {
  torch::set_num_threads(threads);
  fl::mkl_chooses_by_features();  // links core/mkl_dispatch and checks the switch's value
  auto list = products();
  std::vector<std::vector<double>> ms(list.size());
  for (int round = 0; round < 7; ++round) {
    for (std::size_t i = 0; i < list.size(); ++i) {
      if (round == 0)
        for (int w = 0; w < 3; ++w) list[i].run();
      const auto start = bench::Clock::now();
      for (int c = 0; c < 10; ++c) list[i].run();
      ms[i].push_back(bench::seconds_since(start) * 100.0);
    }
  }
  std::vector<double> medians;
  double total = 0;
  for (auto& v : ms) total += medians.emplace_back(bench::summarize(v).median);
  fmt::print("{} {}\n", total, fmt::join(medians, " "));
  return 0;
}

std::vector<double> run_child(const std::string& self, int threads, bool by_features, std::size_t count) {
  const auto command = fmt::format("FASTLEARN_MKL_BY_FEATURES={} '{}' --child {}", by_features ? 1 : 0, self, threads);
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  if (!pipe) throw std::runtime_error("bench_mkl_by_features: cannot start " + command);
  std::vector<double> figures(count + 1);
  for (auto& f : figures)
    if (std::fscanf(pipe.get(), "%lf", &f) != 1)
      throw std::runtime_error("bench_mkl_by_features: no figures from " + command);
  return figures;
}

}  // namespace

int main(int argc, char** argv) {
  if (const int threads = bench::int_flag(argc, argv, "--child", 0); threads > 0) return child(threads);
  const int repeats = bench::repeats(5);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto list = products();
  std::vector<std::string> entries;
  for (const int threads : {1, 2}) {
    std::vector<std::vector<double>> on(list.size() + 1), off(list.size() + 1);
    for (int r = 0; r < repeats; ++r) {
      const auto shipped = run_child(self, threads, false, list.size()),
                 ours = run_child(self, threads, true, list.size());
      for (std::size_t i = 0; i <= list.size(); ++i) {
        off[i].push_back(shipped[i]);
        on[i].push_back(ours[i]);
      }
    }
    std::vector<std::string> shapes;
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto o = bench::summarize(on[i + 1]), a = bench::summarize(off[i + 1]);
      shapes.push_back(fmt::format(R"({{"product": "{}", "ours": {:.4f}, "anchor": {:.4f}, "ratio": {:.3f}}})",
                                   list[i].name, o.median, a.median, a.median / o.median));
    }
    const auto o = bench::summarize(on[0]), a = bench::summarize(off[0]);
    entries.push_back(fmt::format(
        R"("{}": {{"ours": {:.4f}, "anchor": {:.4f}, "ratio": {:.3f}, "unit": "ms", "higher_is_better": false, )"
        R"("ours_range": [{:.4f}, {:.4f}], "anchor_range": [{:.4f}, {:.4f}], "threads": {}, "repeats": {}, )"
        R"("shapes": [{}], )"
        R"x("what": "the MKL products of an MLP step (784-512-256-10, batch 128) and conv_net's patch products: MKL choosing by instruction sets (ours, core/mkl_dispatch) vs as shipped (FASTLEARN_MKL_BY_FEATURES=0), alternating child processes"}})x",
        threads == 1 ? "mkl_by_features" : "mkl_by_features_2_threads", o.median, a.median, a.median / o.median, o.min,
        o.max, a.min, a.max, threads, repeats, fmt::join(shapes, ", ")));
  }
  fmt::print("{{{}}}\n", fmt::join(entries, ", "));
  return 0;
}
