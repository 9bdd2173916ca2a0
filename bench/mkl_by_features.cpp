// mkl_by_features: ms for the matrix products of one training step that LibTorch hands to MKL, with MKL choosing
// its kernels by the processor's instruction sets (core/mkl_dispatch, the default: ours) against MKL as shipped
// (FASTLEARN_MKL_BY_FEATURES=0: anchor): the products of an MLP step (784-512-256-10, batch 128: forward, weight
// and input gradients, as torch::nn::Linear runs them) and conv_net's patch product (models::Conv2d's weight
// gradient of its last layer). MKL decides once per process, so each measurement is a child process; the settings
// alternate. On 1 thread (key mkl_by_features, what a rank of time_to_accuracy runs) and 2
// (mkl_by_features_2_threads). Median and range of 5. ratio = as shipped / ours. On Intel's processors nothing
// changes (ratio 1 within noise). mkl_by_features_mlp_epoch: the same two settings on whole training epochs,
// vs_pytorch_loop_mlp's (Learner.fit(1) of the 784-512-256-10 MLP on 100 batches of 128 Fashion-MNIST images
// with validation, AdamW, 2 threads), train samples/s, median of 3 epochs per child after a warm-up epoch.
// Prints one JSON object.
// usage: bench_mkl_by_features [--child THREADS | --epoch-child] [FASHION_MNIST_DIR]
#include <fastlearn/core/detail/mkl_dispatch.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "support/bench_support.h"
#include "support/epoch_vs_python.h"
#include "support/result_row.h"

namespace fl = fastlearn;

namespace {

struct Product {
  std::string name;
  std::function<at::Tensor()> run;
};

// Linear's forward is x w^T, its weight gradient g^T x and its input gradient g w; the patch product is
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
  // conv_net's last layer: 128 -> 256 channels, 3x3, a 2x2 output of 128 images: 512 rows of 1152 values.
  const auto patches = torch::randn({512, 1152}), grad = torch::randn({512, 256});
  out.push_back({"patch_weight_grad_512x1152x256", [=] { return at::mm(patches.t(), grad); }});
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

// One child: train samples/s of vs_pytorch_loop_mlp's epoch, the median of 3 after a warm-up epoch.
int epoch_child(const std::string& data) {
  torch::set_num_threads(2);
  auto dls = bench::first_items(fl::ImageDataLoaders::from_idx(data, {.bs = bench::kEpochBatch, .seed = 0}),
                                bench::kEpochTrainItems, bench::kEpochValidItems);
  torch::manual_seed(0);
  fl::Learner learn(dls, bench::named_model("mlp"), fl::cross_entropy(),
                    {.opt_func = fl::Adam(), .metrics = {fl::accuracy()}, .wd_bn_bias = true, .progress = false});
  learn.fit(1, 1e-3);
  std::vector<double> rates;
  for (int e = 0; e < 3; ++e) {
    const auto start = bench::Clock::now();
    learn.fit(1, 1e-3);
    rates.push_back(static_cast<double>(bench::kEpochTrainItems) / bench::seconds_since(start));
  }
  fmt::print("{}\n", bench::summarize(rates).median);
  return 0;
}

// A child in `mode` (its arguments) with the switch on or off: its `count` + 1 figures.
std::vector<double> run_child(const std::string& self, const std::string& mode, bool by_features, std::size_t count) {
  return bench::command_figures(fmt::format("FASTLEARN_MKL_BY_FEATURES={} '{}' {}", by_features ? 1 : 0, self, mode),
                                count + 1);
}

}  // namespace

int main(int argc, char** argv) {
  // The data folder is the last argument when it is not a flag's (`--child 2`) and not a flag.
  const bool data_given = argc > 1 && argv[argc - 1][0] != '-' && bench::int_flag(argc, argv, "--child", 0) == 0;
  const std::string data = data_given ? argv[argc - 1] : "/usr/share/datasets/fashion-mnist";
  if (const int threads = bench::int_flag(argc, argv, "--child", 0); threads > 0) return child(threads);
  if (bench::has_flag(argc, argv, "--epoch-child")) return epoch_child(data);
  const int repeats = bench::repeats(5);
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const auto list = products();
  std::vector<bench::Row> rows;
  for (const int threads : {1, 2}) {
    std::vector<std::vector<double>> on(list.size() + 1), off(list.size() + 1);
    for (int r = 0; r < repeats; ++r) {
      const auto mode = fmt::format("--child {}", threads);
      const auto shipped = run_child(self, mode, false, list.size()), ours = run_child(self, mode, true, list.size());
      for (std::size_t i = 0; i <= list.size(); ++i) {
        off[i].push_back(shipped[i]);
        on[i].push_back(ours[i]);
      }
    }
    auto shapes = nlohmann::ordered_json::array();
    for (std::size_t i = 0; i < list.size(); ++i) {
      const auto o = bench::summarize(on[i + 1]), a = bench::summarize(off[i + 1]);
      shapes.push_back(nlohmann::ordered_json{{"product", list[i].name},
                                              {"ours", bench::rounded(o.median, 4)},
                                              {"anchor", bench::rounded(a.median, 4)},
                                              {"ratio", bench::rounded(a.median / o.median, 3)}});
    }
    const auto o = bench::summarize(on[0]), a = bench::summarize(off[0]);
    rows.push_back(
        bench::Row(threads == 1 ? "mkl_by_features" : "mkl_by_features_2_threads", o, a, "ms", false, 4)
            .set("threads", threads)
            .set("repeats", repeats)
            .set("shapes", shapes)
            .set("what",
                 "the MKL products of an MLP step (784-512-256-10, batch 128) and conv_net's patch product (its last "
                 "layer's weight gradient): MKL choosing by instruction sets (ours, core/mkl_dispatch) vs as shipped "
                 "(FASTLEARN_MKL_BY_FEATURES=0), alternating child processes"));
  }
  std::vector<double> epoch_on, epoch_off;
  const auto mode = fmt::format("--epoch-child '{}'", data);
  for (int r = 0; r < repeats; ++r) {
    epoch_off.push_back(run_child(self, mode, false, 0)[0]);
    epoch_on.push_back(run_child(self, mode, true, 0)[0]);
  }
  const auto o = bench::summarize(epoch_on), a = bench::summarize(epoch_off);
  rows.push_back(
      bench::Row("mkl_by_features_mlp_epoch", o, a, "train samples/s", true, 1)
          .set("threads", 2)
          .set("repeats", repeats)
          .set("what",
               "vs_pytorch_loop_mlp's training epoch (Learner.fit(1), 784-512-256-10 MLP, 100 batches of 128, "
               "validation included): MKL choosing by instruction sets (ours) vs as shipped "
               "(FASTLEARN_MKL_BY_FEATURES=0), alternating child processes"));
  fmt::print("{}\n", bench::results_line(rows));
  return 0;
}
