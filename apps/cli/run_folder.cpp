#include "cli/run_folder.h"

#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <string_view>

namespace fastlearn::cli {

namespace fs = std::filesystem;

namespace {

// What a run writes into its folder (README "The output directory"); nothing else there is touched.
constexpr std::array<std::string_view, 6> kRunFiles{"config.toml", "metrics.json", "history.csv",
                                                    "loss.svg",    "checkpoints",  "tensorboard"};

// The older run's files while a takeover is pending; ".partial" while they are being moved there.
fs::path aside(const fs::path& out) { return out / ".previous-run"; }
fs::path aside_partial(const fs::path& out) { return out / ".previous-run.partial"; }

void fail(const fs::path& out, const std::string& what, const std::error_code& error) {
  throw Error(fmt::format("--out {}: {}: {}", out.string(), what, error.message()));
}

// Moves the run files present in `from` to `to` (both folders), replacing what `to` has under those names when
// `replace`; returns how many moved.
int move_run_files(const fs::path& from, const fs::path& to, bool replace, const fs::path& out) {
  int moved = 0;
  std::error_code error;
  for (const auto name : kRunFiles) {
    const auto source = from / name, target = to / name;
    if (!fs::exists(fs::symlink_status(source))) continue;
    if (replace && fs::remove_all(target, error) == static_cast<std::uintmax_t>(-1))
      fail(out, fmt::format("removing '{}'", target.string()), error);
    fs::rename(source, target, error);
    if (error) fail(out, fmt::format("moving '{}' to '{}'", source.string(), target.string()), error);
    ++moved;
  }
  return moved;
}

void remove_folder(const fs::path& dir, const fs::path& out) {
  std::error_code error;
  if (fs::remove_all(dir, error) == static_cast<std::uintmax_t>(-1))
    fail(out, fmt::format("removing '{}'", dir.string()), error);
}

// The files of the run that failed are removed and the older run's moved back.
void put_back(const fs::path& out) {
  for (const auto name : kRunFiles) remove_folder(out / name, out);
  move_run_files(aside(out), out, /*replace=*/false, out);
  remove_folder(aside(out), out);
}

// Restarts the launcher (--max-restarts) still has for this run.
bool launcher_will_restart() {
  const char* count = std::getenv("TORCHELASTIC_RESTART_COUNT");
  const char* max = std::getenv("TORCHELASTIC_MAX_RESTARTS");
  return count && max && std::atoi(count) < std::atoi(max);
}

}  // namespace

RunFolder::RunFolder(fs::path out, std::string config_toml, bool fresh)
    : out_(std::move(out)), config_toml_(std::move(config_toml)), fresh_(fresh) {
  order = -100;  // before the loggers and the Checkpointer open their files in the folder
}

void RunFolder::before_fit() {
  if (std::exchange(taken_, true)) return;
  fs::create_directories(out_);
  if (fresh_) {
    // Moved into a ".partial" folder first: a run killed halfway leaves no doubt which files were the older run's.
    remove_folder(aside_partial(out_), out_);
    fs::create_directories(aside_partial(out_));
    const int moved = move_run_files(out_, aside_partial(out_), /*replace=*/false, out_);
    if (moved > 0) {
      std::error_code error;
      fs::rename(aside_partial(out_), aside(out_), error);
      if (error) fail(out_, "setting the older run's files aside", error);
    } else {
      remove_folder(aside_partial(out_), out_);
    }
    pending_ = moved > 0;
  } else {
    pending_ = fs::exists(aside(out_));  // a failed attempt's takeover, continued by this restart
  }
  write_file_atomically(out_ / "config.toml", config_toml_);
}

void RunFolder::after_batch() {
  if (!pending_) return;
  const auto checkpointer = learn().cb<Checkpointer>();
  if (checkpointer && checkpointer->last_saved()) finish_takeover();  // a checkpoint of its own to resume from
}

void RunFolder::after_epoch() { finish_takeover(); }
void RunFolder::after_fit() { finish_takeover(); }

void RunFolder::finish_takeover() {
  if (!std::exchange(pending_, false)) return;
  remove_folder(aside(out_), out_);
}

void RunFolder::after_failure() noexcept {
  if (!pending_ || launcher_will_restart()) return;
  pending_ = false;
  try {
    put_back(out_);
    fmt::print(stderr,
               "fastlearn train: the run failed before it had an epoch or a checkpoint of its own; the "
               "older run's files in {} are back as they were\n",
               out_.string());
  } catch (const std::exception& e) {  // the run's own error matters more: report this one beside it
    fmt::print(stderr, "fastlearn train: could not put the older run's files back ({}); they are in {}\n", e.what(),
               aside(out_).string());
  }
}

bool put_back_interrupted_takeover(const fs::path& out) {
  if (fs::exists(aside_partial(out))) {  // killed while setting aside: what is there is the older run's
    move_run_files(aside_partial(out), out, /*replace=*/false, out);
    remove_folder(aside_partial(out), out);
  }
  if (!fs::exists(aside(out))) return false;
  put_back(out);
  return true;
}

}  // namespace fastlearn::cli
