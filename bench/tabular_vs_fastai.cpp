// tabular_vs_fastai: training rows/s of fit_one_cycle(3, 1e-2) of a tabular model on the 30,000-row census-like
// CSV of scripts/make-census-csv (validation after each epoch included), TabularDataLoaders + tabular_learner
// against fastai's TabularPandas + tabular_learner (bench/python/tabular_fastai.py): the same columns, procs
// (Categorify, FillMissing, Normalize), RandomSplitter(0.2, seed 42) split, layers [200, 100], batch size 64,
// Adam, 2 torch threads and no loader workers on both sides. Runs alternate between the sides, each from a
// new learner; the figure is the median, with the range, and each side's last validation accuracy (goal:
// within 1 point of fastai's). Prints one JSON object. Goal: ratio >= 3.
// usage: bench_tabular_vs_fastai [--rows N] [--epochs E]
#include <fastlearn/core/random.h>
#include <fastlearn/data/tabular_dataloaders.h>
#include <fastlearn/learner/metrics.h>
#include <fastlearn/learner/recorder.h>
#include <fastlearn/learner/tabular_learner.h>

#include <fmt/format.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "support/bench_support.h"
#include "support/result_row.h"
#include "support/source_dir.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

int main(int argc, char** argv) {
  const int rows = bench::int_flag(argc, argv, "--rows", 30000), epochs = bench::int_flag(argc, argv, "--epochs", 3);
  const int bs = 64;
  const int repeats = bench::repeats(5);
  const auto csv = fs::temp_directory_path() / fmt::format("fastlearn-tabular-{}.csv", ::getpid());
  const std::string python = FASTLEARN_PYTHON, source = FASTLEARN_SOURCE_DIR;
  if (std::system(
          fmt::format("'{}' '{}/scripts/make-census-csv' '{}' --rows {} >&2", python, source, csv.string(), rows)
              .c_str()) != 0) {
    fmt::print(stderr, "bench_tabular_vs_fastai: making the CSV failed (numpy installed?)\n");
    return 1;
  }
  torch::set_num_threads(2);
  auto dls = fl::TabularDataLoaders::from_csv(
      csv, {.y_names = {"salary"},
            .cat_names = {"workclass", "education", "occupation", "native_country", "sex"},
            .cont_names = {"age", "hours_per_week", "capital_gain", "education_num"},
            .valid_pct = 0.2,
            .split_seed = 42,
            .bs = bs});
  double accuracy = 0;
  auto ours_fit = [&] {
    auto learn = fl::tabular_learner(dls, {.layers = {200, 100}}, {.metrics = {fl::accuracy()}, .progress = false});
    const auto start = bench::Clock::now();
    learn->fit_one_cycle(epochs, 1e-2);
    const double seconds = bench::seconds_since(start);
    accuracy = learn->recorder().last_valid_metrics().at(0);
    return static_cast<double>(epochs * dls.train().size() * bs) / seconds;
  };
  bench::Coprocess theirs({python, source + "/bench/python/tabular_fastai.py", "serve", csv.string(),
                           std::to_string(epochs), std::to_string(bs)});
  if (theirs.read_line() != "ready") return 1;
  double their_accuracy = 0;
  auto their_fit = [&] {
    const auto reply = bench::numbers(theirs.request("fit"), 3);  // seconds, rows, accuracy
    their_accuracy = reply[2];
    return reply[1] / reply[0];
  };
  ours_fit(), their_fit();  // warm-up: allocator, lazy initialization
  std::vector<double> ours, anchor, ours_acc, their_acc;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(ours_fit());
    ours_acc.push_back(accuracy);
    anchor.push_back(their_fit());
    their_acc.push_back(their_accuracy);
  }
  fs::remove(csv);
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  const auto oa = bench::summarize(ours_acc), ta = bench::summarize(their_acc);
  const auto range = [](const bench::Stats& st) {
    return nlohmann::ordered_json{bench::rounded(st.min, 4), bench::rounded(st.max, 4)};
  };
  const auto row = bench::Row("tabular_vs_fastai", o, a, "rows/s", /*higher_is_better=*/true, 0)
                       .set("repeats", repeats)
                       .set("rows", rows)
                       .set("epochs", epochs)
                       .set("bs", bs)
                       .set("ours_accuracy", oa.median, 4)
                       .set("anchor_accuracy", ta.median, 4)
                       .set("ours_accuracy_range", range(oa))
                       .set("anchor_accuracy_range", range(ta))
                       .set("what",
                            "fit_one_cycle(3, 1e-2) of tabular_learner(layers [200, 100]) on the census-like CSV: "
                            "TabularDataLoaders vs fastai TabularPandas, same split and procs, bs 64, 2 threads");
  fmt::print("{}\n", bench::results_line({row}));
  return 0;
}
