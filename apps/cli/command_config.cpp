#include "cli/command_config.h"

#include <fastlearn/comm/runtime.h>
#include <fastlearn/config/learner_from_config.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/learner/checkpoint.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>

namespace fastlearn::cli {

namespace fs = std::filesystem;

bool under_launcher() { return std::getenv("RANK") != nullptr; }

std::string csv_line(const std::vector<std::string>& cells) {
  std::vector<std::string> quoted;
  for (const auto& cell : cells) {
    if (cell.find_first_of(",\"\n\r") == std::string::npos) {
      quoted.push_back(cell);
      continue;
    }
    std::string q = "\"";
    for (const char ch : cell) q += ch == '"' ? std::string("\"\"") : std::string(1, ch);
    quoted.push_back(q + "\"");
  }
  return fmt::format("{}\n", fmt::join(quoted, ","));
}

std::vector<fs::path> image_files_of(const std::string& input) {
  if (fs::is_directory(input)) {
    auto found = get_image_files(input);
    if (found.empty())
      throw DataError(fmt::format("{}: a folder with no .jpg, .jpeg or .png file in it", excerpt(input, 256)));
    return found;
  }
  if (!fs::is_regular_file(input)) throw DataError(fmt::format("{}: no such file or folder", excerpt(input, 256)));
  return {input};
}

TrainConfig read_config_file(const TrainArgs& args) {
  auto config = load_config(args.config_path, args.sets);
  check_devices(config, local_world_size(), args.config_path);
  return config;
}

std::unique_ptr<Learner> learner_from_checkpoint(const TrainConfig& config, const std::string& out,
                                                 const std::string& checkpoint, const char* command) {
  if (!fs::exists(checkpoint))
    throw CheckpointError(fmt::format("{}: checkpoint '{}' does not exist", command, excerpt(checkpoint, 256)));
  auto learn = learner_from_config(config, {.out = out, .run_callbacks = false, .checked = true});
  try {
    load_checkpoint(*learn, checkpoint, {.with_opt = false});
  } catch (const CheckpointError& e) {
    // Most often the run was trained with --set overrides the config given here lacks; its folder has them all.
    const auto run_config = fs::path(checkpoint).parent_path().parent_path() / "config.toml";
    if (!fs::is_regular_file(run_config)) throw;
    throw CheckpointError(
        fmt::format("{}\nThe run that saved it left its resolved config in '{}': `fastlearn {} {} "
                    "--checkpoint {}` builds the same data and model",
                    e.what(), excerpt(run_config.string(), 256), command, excerpt(run_config.string(), 256),
                    excerpt(checkpoint, 256)));
  }
  return learn;
}

std::string describe(const ValidationResult& r) {
  std::string text = fmt::format("loss {:.4f}", r.loss);
  for (const auto& [name, value] : r.metrics) {
    if (name == "accuracy" || name == "error_rate" || name == "top_k_accuracy")
      text += fmt::format(", {} {:.2f}%", name, 100 * value);
    else
      text += fmt::format(", {} {:.4f}", name, value);
  }
  return text;
}

}  // namespace fastlearn::cli
