#include "cli/mask_predictions.h"

#include "cli/command_config.h"

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/image_encode.h>
#include <fastlearn/learner/predict_mask.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <map>

namespace fastlearn::cli {

namespace fs = std::filesystem;

int predict_mask_files(Learner& learn, const std::vector<std::string>& inputs, const std::string& out) {
  if (out.empty())
    throw ConfigError(
        "predict: a segmentation model writes a mask per image: give --out DIR (each image's mask goes to DIR as "
        "NAME.png, the shares of the classes to DIR/masks.csv)");
  const auto& codes = learn.dls().vocab();
  int failed = 0;
  const auto report = [&failed](const Error& e) {
    std::fflush(stdout);
    fmt::print(stderr, "fastlearn: error: {}\n", e.what());
    ++failed;
  };
  std::vector<fs::path> files;
  for (const auto& input : inputs) {
    try {
      const auto found = image_files_of(input);
      files.insert(files.end(), found.begin(), found.end());
    } catch (const DataError& e) {
      report(e);
    }
  }
  std::vector<std::string> header{"input", "mask"};
  header.insert(header.end(), codes.begin(), codes.end());
  std::string table = csv_line(header);
  std::map<std::string, fs::path> written;  // mask file name -> image
  for (const auto& file : files) {
    try {
      const auto name = file.stem().string() + ".png";
      if (const auto other = written.find(name); other != written.end())
        throw DataError(fmt::format("{}: its mask would overwrite that of {} ({}): give images of distinct names",
                                    excerpt(file.string(), 256), excerpt(other->second.string(), 256), name));
      const auto target = fs::path(out) / name;
      std::error_code same_error;
      if (fs::equivalent(target, file, same_error))
        throw DataError(fmt::format("{}: its mask would overwrite the image itself: give --out another folder",
                                    excerpt(file.string(), 256)));
      const auto predicted = predict_mask(learn, file, {.probs = false});
      try {
        fs::create_directories(out);
      } catch (const fs::filesystem_error& e) {
        throw DataError(fmt::format("{}: cannot make the folder of its mask: {}", excerpt(out, 256), e.what()));
      }
      write_file_atomically(target, encode_png(predicted.mask.to(torch::kUInt8).unsqueeze(0).contiguous()));
      written[name] = file;
      std::vector<std::string> shares, cells{file.string(), target.string()};
      for (std::size_t c = 0; c < codes.size(); ++c) {
        shares.push_back(fmt::format("{} {:.3f}", codes[c], predicted.shares[c]));
        cells.push_back(fmt::format("{}", predicted.shares[c]));
      }
      table += csv_line(cells);
      fmt::print("{}\t{} ({}x{}): {}\n", file.string(), target.string(), predicted.mask.size(0), predicted.mask.size(1),
                 fmt::join(shares, ", "));
    } catch (const DataError& e) {
      report(e);
    }
  }
  if (!written.empty()) {
    write_file_atomically(fs::path(out) / "masks.csv", table);
    std::fflush(stdout);
    fmt::print(stderr, "wrote {} mask(s) and {}\n", written.size(),
               excerpt((fs::path(out) / "masks.csv").string(), 256));
  }
  return failed == 0 ? 0 : 1;
}

}  // namespace fastlearn::cli
