// collab_vs_fastai: training rows/s of fit_one_cycle(5, 5e-3, wd 0.1) of fastai's dot-product recommender on the
// 100,000-rating MovieLens-like table of scripts/make-ratings-csv (1,000 users, 1,700 items; validation after each
// epoch included), CollabDataLoaders + collab_learner against fastai's (bench/python/collab_fastai.py): the same
// RandomSplitter(0.2, seed 42) split, n_factors 50, y_range (0, 5.5), batch size 64, Adam, MSE, 2 torch threads and
// no loader workers on both sides. Runs alternate between the sides, each from a new learner; the figure is the
// median, with the range, and each side's last validation MSE (goal: within 2% of fastai's, or lower). Prints one
// JSON object. Goal: ratio >= 3.
// usage: bench_collab_vs_fastai [--ratings N] [--epochs E]
#include <fastlearn/data/collab_dataloaders.h>
#include <fastlearn/learner/collab_learner.h>
#include <fastlearn/learner/recorder.h>

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
  const int ratings = bench::int_flag(argc, argv, "--ratings", 100000);
  const int epochs = bench::int_flag(argc, argv, "--epochs", 5);
  const int bs = 64;
  const int repeats = bench::repeats(5);
  const auto csv = fs::temp_directory_path() / fmt::format("fastlearn-ratings-{}.csv", ::getpid());
  const std::string python = FASTLEARN_PYTHON, source = FASTLEARN_SOURCE_DIR;
  if (std::system(
          fmt::format("'{}' '{}/scripts/make-ratings-csv' '{}' --ratings {} >&2", python, source, csv.string(), ratings)
              .c_str()) != 0) {
    fmt::print(stderr, "bench_collab_vs_fastai: making the CSV failed (numpy installed?)\n");
    return 1;
  }
  torch::set_num_threads(2);
  auto dls = fl::CollabDataLoaders::from_csv(csv, {.valid_pct = 0.2, .seed = 42, .bs = bs});
  double mse = 0;
  auto ours_fit = [&] {
    auto learn =
        fl::collab_learner(dls, {.n_factors = 50, .y_range = std::pair(0.0, 5.5)}, {.wd = 0.1, .progress = false});
    const auto start = bench::Clock::now();
    learn->fit_one_cycle(epochs, 5e-3);
    const double seconds = bench::seconds_since(start);
    mse = learn->recorder().last_valid_loss();
    return static_cast<double>(epochs * dls.train().size() * bs) / seconds;
  };
  bench::Coprocess theirs({python, source + "/bench/python/collab_fastai.py", "serve", csv.string(),
                           std::to_string(epochs), std::to_string(bs)});
  if (theirs.read_line() != "ready") return 1;
  double their_mse = 0;
  auto their_fit = [&] {
    const auto reply = bench::numbers(theirs.request("fit"), 3);  // seconds, rows, valid mse
    their_mse = reply[2];
    return reply[1] / reply[0];
  };
  ours_fit(), their_fit();  // warm-up: allocator, lazy initialization
  std::vector<double> ours, anchor, ours_mse, anchor_mse;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(ours_fit());
    ours_mse.push_back(mse);
    anchor.push_back(their_fit());
    anchor_mse.push_back(their_mse);
  }
  fs::remove(csv);
  const auto o = bench::summarize(ours), a = bench::summarize(anchor);
  const auto om = bench::summarize(ours_mse), am = bench::summarize(anchor_mse);
  const auto range = [](const bench::Stats& st) {
    return nlohmann::ordered_json{bench::rounded(st.min, 4), bench::rounded(st.max, 4)};
  };
  const auto row = bench::Row("collab_vs_fastai", o, a, "rows/s", /*higher_is_better=*/true, 0)
                       .set("repeats", repeats)
                       .set("ratings", ratings)
                       .set("epochs", epochs)
                       .set("bs", bs)
                       .set("ours_valid_mse", om.median, 4)
                       .set("anchor_valid_mse", am.median, 4)
                       .set("ours_valid_mse_range", range(om))
                       .set("anchor_valid_mse_range", range(am))
                       .set("what",
                            "fit_one_cycle(5, 5e-3, wd 0.1) of collab_learner(n_factors 50, y_range (0, 5.5)) on the "
                            "MovieLens-like table: CollabDataLoaders vs fastai's, same split, bs 64, 2 threads");
  fmt::print("{}\n", bench::results_line({row}));
  return 0;
}
