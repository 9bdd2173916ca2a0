// Serving a trained model: an export (written by `fastlearn train`, `fastlearn export` or learn.export_to) and the
// image files given on the command line, predicted in batches with no config and no training data.
//   serve_export runs/fmnist/export.safetensors shirt.png boot.jpg
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>

namespace fl = fastlearn;

int main(int argc, char** argv) try {
  if (argc < 3) throw fl::ConfigError(fmt::format("usage: {} EXPORT IMAGE...", argv[0]));
  auto learn = fl::load_learner(argv[1]);  // on the GPU when there is one
  const std::vector<std::filesystem::path> files(argv + 2, argv + argc);
  auto dl = fl::ImageDataLoaders::test_dl(learn->dls(), files);  // decoded, resized, normalized as in training
  const auto predictions = fl::name_predictions(learn->get_preds(&dl).preds, *learn);
  for (std::size_t i = 0; i < files.size(); ++i)
    fmt::print("{}\t{}\n", files[i].string(), fl::describe(predictions[i], false));
} catch (const std::exception& e) {
  fmt::print(stderr, "serve_export: {}\n", e.what());
  return 1;
}
