// batch_inference: images/s of predictions over 2,000 new JPEG files of 160x160 with resnet18 (fastai's head, 8
// classes) at 128 px, batch 64, 2 loader workers, 2 torch threads: an export loaded by load_learner, then
// ImageDataLoaders::test_dl + get_preds (what `fastlearn predict EXPORT` runs), against fastai's
// learn.get_preds(dl=learn.dls.test_dl(files)) and a plain PyTorch + torchvision loop (a Dataset of the files, a
// DataLoader of 2 workers, the model in eval mode under no_grad) over the same files with the same weights
// (bench/python/batch_inference.py). Each side in its default layout (ours: the channels-last model vision_learner
// makes). Runs interleave; median and range. Also the split of ours: decoding alone (the test loader's epoch without
// the model) and the forward alone (the model over batches made beforehand). Prints one JSON object.
// Goals: >= 2x fastai, >= 1.2x the PyTorch loop.
// usage: bench_batch_inference [--images N]
#include <fastlearn/config/load_learner.h>
#include <fastlearn/core/random.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/learner/vision_learner.h>
#include <fastlearn/models/fastai_weights.h>

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
  const int images = bench::int_flag(argc, argv, "--images", 2000);
  const int repeats = bench::repeats(5);
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-batch-inference-{}", ::getpid());
  const std::string python = FASTLEARN_PYTHON,
                    script = std::string(FASTLEARN_SOURCE_DIR) + "/bench/python/batch_inference.py";
  if (std::system(fmt::format("'{}' '{}' make '{}' {} >&2", python, script, dir.string(), images).c_str()) != 0) {
    fmt::print(stderr, "bench_batch_inference: making the files failed (scikit-image and fastai installed?)\n");
    return 1;
  }
  torch::set_num_threads(2);
  fl::set_seed(0);
  {  // the trained model's stand-in: seeded weights, exported as `fastlearn train` would
    auto learn = fl::vision_learner(fl::ImageDataLoaders::from_folder(dir, {.bs = 64, .seed = 0, .size = 128}),
                                    {.arch = "resnet18"}, {.progress = false, .device = torch::kCPU});
    learn->export_to(dir / "export.safetensors");
    fl::save_safetensors(dir / "fastai.safetensors", fl::models::fastai_vision_state_dict(learn->model()));
  }
  auto learn = fl::load_learner(dir / "export.safetensors", {.device = torch::kCPU, .bs = 64, .num_workers = 2});
  const auto files = fl::get_image_files(dir / "new");
  std::int64_t our_argmax_sum = 0;
  auto ours_run = [&] {
    const auto start = bench::Clock::now();
    auto dl = fl::ImageDataLoaders::test_dl(learn->dls(), files);
    const auto preds = learn->get_preds(&dl).preds;
    const double seconds = bench::seconds_since(start);
    our_argmax_sum = preds.argmax(1).sum().item<std::int64_t>();
    return static_cast<double>(preds.size(0)) / seconds;
  };
  bench::Coprocess theirs({python, script, "serve", dir.string(), (dir / "fastai.safetensors").string()});
  if (theirs.read_line() != "ready") return 1;
  std::int64_t fastai_argmax_sum = 0, torch_argmax_sum = 0;
  auto their_run = [&](const char* side, std::int64_t& argmax_sum) {
    const auto reply = bench::numbers(theirs.request(side), 3);  // seconds, images, sum of argmax
    argmax_sum = static_cast<std::int64_t>(reply[2]);
    return reply[1] / reply[0];
  };
  // Ours apart: decoding alone (an epoch of the test loader) and the forward alone (over those batches, kept).
  auto split = [&] {
    auto dl = fl::ImageDataLoaders::test_dl(learn->dls(), files);
    std::vector<at::Tensor> batches;
    auto start = bench::Clock::now();
    for (const auto& batch : dl) batches.push_back(batch.inputs.at(0));
    const double decode = bench::seconds_since(start);
    torch::NoGradGuard no_grad;
    start = bench::Clock::now();
    for (const auto& x : batches) learn->forward({x});
    return std::pair{decode, bench::seconds_since(start)};
  };
  ours_run(), their_run("fastai", fastai_argmax_sum), their_run("torch", torch_argmax_sum);  // warm-up
  std::vector<double> ours, fastai, loop, decode, forward;
  for (int r = 0; r < repeats; ++r) {
    ours.push_back(ours_run());
    fastai.push_back(their_run("fastai", fastai_argmax_sum));
    loop.push_back(their_run("torch", torch_argmax_sum));
    const auto [d, f] = split();
    decode.push_back(d);
    forward.push_back(f);
  }
  fs::remove_all(dir);
  const auto o = bench::summarize(ours), a = bench::summarize(fastai), t = bench::summarize(loop),
             d = bench::summarize(decode), f = bench::summarize(forward);
  const auto range = [](const bench::Stats& s) {
    return nlohmann::ordered_json::array({bench::rounded(s.min, 3), bench::rounded(s.max, 3)});
  };
  fmt::print(
      "{}\n",
      bench::results_line(
          {bench::Row("batch_inference", o, a, "images/s", true, 2)
               .stats("torch_loop", t, 2)
               .set("ratio_vs_torch_loop", o.median / t.median, 3)
               .set("ours_decode_seconds", d.median, 3)
               .set("ours_decode_range", range(d))
               .set("ours_forward_seconds", f.median, 3)
               .set("ours_forward_range", range(f))
               .set("argmax_sums", {our_argmax_sum, fastai_argmax_sum, torch_argmax_sum})
               .set("repeats", repeats)
               .set("images", images)
               .set("what",
                    fmt::format("predictions over {} JPEGs of 160x160, resnet18 (fastai's head, 8 classes) "
                                "at 128 px, batch 64, 2 loader workers, 2 threads: load_learner + test_dl + "
                                "get_preds (channels-last) vs fastai learn.get_preds(dl=learn.dls.test_dl(files)) "
                                "(anchor) and a PyTorch + torchvision DataLoader loop",
                                images))}));
  return 0;
}
