#include "cli/run_folder.h"

#include <fastlearn/callbacks/checkpointing.h>
#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>

#include <fmt/format.h>

#include <array>
#include <cstdlib>
#include <vector>

namespace fastlearn::cli {

namespace fs = std::filesystem;

namespace {

constexpr const char* kAside = ".previous-run";
constexpr const char* kAsidePartial = ".previous-run.partial";  // while the files are being moved there

// A folder and which of its entries a run writes.
struct Place {
  fs::path folder;
  std::vector<fs::path> (*run_entries)(const fs::path& folder);
};

std::vector<fs::path> top_level_files(const fs::path& folder) {
  std::vector<fs::path> found;
  for (const char* name : {"config.toml", "metrics.json", "history.csv", "loss.svg", "export.safetensors"})
    if (fs::exists(fs::symlink_status(folder / name))) found.push_back(folder / name);
  return found;
}

std::vector<fs::path> checkpoint_entries(const fs::path& folder) {
  auto found = checkpoint_files(folder);  // ckpt-e*-b*.safetensors, torn ones too
  for (const char* name : {"model.safetensors", "best.safetensors"})
    if (fs::exists(fs::symlink_status(folder / name))) found.push_back(folder / name);
  return found;
}

std::vector<fs::path> all_entries(const fs::path& folder) {
  std::vector<fs::path> found;
  std::error_code ignored;
  for (const auto& e : fs::directory_iterator(folder, ignored)) {
    const auto name = e.path().filename();
    if (name != kAside && name != kAsidePartial) found.push_back(e.path());
  }
  return found;
}

std::array<Place, 3> places(const fs::path& out) {
  return {Place{out, top_level_files}, Place{out / "checkpoints", checkpoint_entries},
          Place{out / "tensorboard", all_entries}};
}

[[noreturn]] void fail(const fs::path& what, const std::string& doing, const std::error_code& error) {
  throw Error(fmt::format("{}: {}: {}", excerpt(what.string(), 256), doing, error.message()));
}

void move(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::rename(from, to, error);
  if (error) fail(from, fmt::format("moving it to '{}'", excerpt(to.string(), 256)), error);
}

void remove_tree(const fs::path& path) {
  std::error_code error;
  if (fs::remove_all(path, error) == static_cast<std::uintmax_t>(-1)) fail(path, "removing it", error);
}

// Moves every entry of `from` into `to_folder`, under its own name.
void move_entries(const fs::path& from, const fs::path& to_folder) {
  std::error_code ignored;
  for (const auto& e : fs::directory_iterator(from, ignored)) move(e.path(), to_folder / e.path().filename());
}

// Sets the place's run entries aside; true when there were any. On an error the moved ones go back first.
bool set_aside(const Place& place) {
  if (!fs::is_directory(place.folder)) return false;
  const auto entries = place.run_entries(place.folder);
  if (entries.empty()) return false;
  const auto partial = place.folder / kAsidePartial;
  remove_tree(partial);
  fs::create_directory(partial);
  try {
    for (const auto& entry : entries) move(entry, partial / entry.filename());
  } catch (...) {
    move_entries(partial, place.folder);
    remove_tree(partial);
    throw;
  }
  move(partial, place.folder / kAside);  // now complete: a killed run's files are known to be all here
  return true;
}

bool has_aside(const Place& place) { return fs::exists(place.folder / kAside); }

// The failed run's entries go, the older run's come back.
void put_back(const Place& place) {
  for (const auto& entry : place.run_entries(place.folder)) remove_tree(entry);
  move_entries(place.folder / kAside, place.folder);
  remove_tree(place.folder / kAside);
}

// Puts back every place's set-aside files; true when there were any.
bool put_back_all(const fs::path& out) {
  bool put = false;
  for (const auto& place : places(out)) {
    if (has_aside(place)) {
      put_back(place);
      put = true;
    }
  }
  return put;
}

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
  bool aside = false;
  for (const auto& place : places(out_)) aside = (fresh_ ? set_aside(place) : has_aside(place)) || aside;
  pending_ = aside;
  write_file_atomically(out_ / "config.toml", config_toml_);
}

void RunFolder::before_batch() {
  if (!pending_) return;
  const auto checkpointer = learn().cb<Checkpointer>();
  if (checkpointer && checkpointer->last_saved()) finish_takeover();  // a checkpoint of its own to resume from
}

void RunFolder::after_epoch() { finish_takeover(); }
void RunFolder::after_fit() { finish_takeover(); }

void RunFolder::finish_takeover() {
  if (!std::exchange(pending_, false)) return;
  for (const auto& place : places(out_)) remove_tree(place.folder / kAside);
}

bool put_back_interrupted_takeover(const fs::path& out, bool fresh) {
  bool put = false;
  for (const auto& place : places(out)) {
    if (const auto partial = place.folder / kAsidePartial; fs::exists(partial)) {
      move_entries(partial, place.folder);  // killed while moving: the new run had written nothing yet
      remove_tree(partial);
      put = true;
    }
  }
  if (!fresh) return put;  // a resumed run continues the new run, and its takeover
  return put_back_all(out) || put;
}

bool put_back_after_failure(const fs::path& out) { return !launcher_will_restart() && put_back_all(out); }

}  // namespace fastlearn::cli
