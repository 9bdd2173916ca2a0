#include <fastlearn/callbacks/checkpointing.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/checkpoint.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/lr_finder.h>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <regex>
#include <tuple>
#include <vector>

namespace fastlearn {

namespace fs = std::filesystem;

namespace {

struct Found {
  int epoch = 0;
  std::int64_t batch = 0;
  fs::path file;
};

// The checkpoints in `dir` by name, newest first (temporaries of interrupted writes start with '.').
std::vector<Found> checkpoints_in(const fs::path& dir) {
  static const std::regex pattern(R"(ckpt-e(\d{1,9})-b(\d{1,15})\.safetensors)");
  std::vector<Found> found;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return found;
  for (const auto& entry : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const auto name = entry.path().filename().string();
    if (!entry.is_regular_file(ec) || !std::regex_match(name, m, pattern)) continue;
    found.push_back({std::stoi(m[1].str()), std::stoll(m[2].str()), entry.path()});
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return std::tie(a.epoch, a.batch) > std::tie(b.epoch, b.batch); });
  return found;
}

}  // namespace

std::string checkpoint_file_name(int epoch, std::int64_t batch) {
  return fmt::format("ckpt-e{:04}-b{:07}.safetensors", epoch, batch);
}

std::vector<fs::path> checkpoint_files(const fs::path& dir) {
  std::vector<fs::path> files;
  for (const auto& found : checkpoints_in(dir)) files.push_back(found.file);
  return files;
}

std::optional<fs::path> latest_checkpoint(const fs::path& dir, LatestCheckpointOptions options) {
  for (const auto& candidate : checkpoints_in(dir)) {
    try {
      const auto state = load_safetensors(candidate.file);  // parses and checks every tensor's extent
      (void)fit_position(state, candidate.file.string());
      return candidate.file;
    } catch (const CheckpointError& e) {
      if (!options.skip_torn) {
        throw CheckpointError(
            fmt::format("the newest checkpoint in '{}' is torn or corrupt: {}\nDelete '{}' to "
                        "resume from the one before it",
                        excerpt(dir.string(), 256), e.what(), excerpt(candidate.file.string(), 256)));
      }
      std::fprintf(stderr, "fastlearn: skipping checkpoint '%s', it is torn or corrupt: %s\n",
                   excerpt(candidate.file.string(), 256).c_str(), e.what());
    }
  }
  return std::nullopt;
}

Checkpointer::Checkpointer(CheckpointerOptions options) : options_(std::move(options)) {
  if (options_.every_n_batches < 0) {
    throw ConfigError(fmt::format("Checkpointer: every_n_batches must be >= 0, got {}", options_.every_n_batches));
  }
  if (options_.keep < 0) throw ConfigError(fmt::format("Checkpointer: keep must be >= 0, got {}", options_.keep));
  order = cb_order::checkpointer;
}

fs::path Checkpointer::dir() const {
  return options_.dir.is_absolute() ? options_.dir : learn().options().path / options_.dir;
}

void Checkpointer::before_fit() {
  last_saved_.reset();
  if (lr_finder_attached(learn())) {  // lr_find's sweep is not training to resume (run is reset after the fit)
    run = false;
    return;
  }
  if (!learn().coordination().is_main()) return;
  // Temporaries of writes that a SIGKILL interrupted ("." + name + ".tmp.<pid>.<random>") are garbage.
  std::error_code ec;
  if (!fs::is_directory(dir(), ec)) return;
  for (const auto& entry : fs::directory_iterator(dir(), ec)) {
    const auto name = entry.path().filename().string();
    if (name.starts_with(".ckpt-e") && name.find(".safetensors.tmp.") != std::string::npos)
      fs::remove(entry.path(), ec);
  }
}

void Checkpointer::after_batch() {
  const auto& l = learn();
  if (!l.training || options_.every_n_batches == 0) return;
  if ((l.iter + 1) % options_.every_n_batches == 0) save_now(false);
}

void Checkpointer::after_epoch() {
  if (options_.every_epoch) save_now(true);
}

fs::path Checkpointer::save_now(bool epoch_end) {
  auto& l = learn();
  const auto position = current_fit_position(l, epoch_end);
  const auto file = dir() / checkpoint_file_name(position.epoch_offset + position.epoch, position.batch);
  if (last_saved_ == file) return file;
  const auto rng_states = gather_rng_states(l);  // every rank: each resumes its own random streams
  if (l.coordination().is_main() || saving_is_collective(l)) {
    auto to_save = capture_state_to_save(l);  // every process when the optimizer's state is gathered from them
    if (!l.coordination().is_main()) {
      write_checkpoint(l, file, to_save);  // its part of the gathers
      last_saved_ = file;
      return file;
    }
    auto& state = to_save.state;
    if (rng_states.size(0) > 1) add_rng_states_of_every_rank(state, rng_states);
    set_fit_position(state, position);
    state.metadata["world_size"] = std::to_string(rng_states.size(0));  // a resume on another count is told
    write_checkpoint(l, file, to_save);
    prune();
  }
  last_saved_ = file;
  return file;
}

void Checkpointer::prune() const {
  if (options_.keep == 0) return;
  const auto found = checkpoints_in(dir());
  std::error_code ec;
  for (std::size_t i = static_cast<std::size_t>(options_.keep); i < found.size(); ++i) fs::remove(found[i].file, ec);
}

}  // namespace fastlearn
