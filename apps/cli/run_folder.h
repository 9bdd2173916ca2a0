#pragma once
// RunFolder: how `fastlearn train` takes its output folder over from an older run there. A fresh run sets the
// older run's files aside (into DIR/.previous-run) when its fit is about to train, and deletes them once it has
// something of its own to keep: its first finished epoch, its first checkpoint, or the end of its fit (a graceful
// stop ends it with a checkpoint). A run that fails before that puts them back, so that an error found while
// training (a corrupt image in the first batches) leaves the older run's folder as it was.
#include <fastlearn/learner/callback.h>

#include <filesystem>
#include <string>

namespace fastlearn::cli {

class RunFolder : public Callback {
 public:
  /// `fresh`: a new run (an older run's files are set aside); otherwise a resumed one, which continues in the
  /// folder as it is (and finishes the takeover a failed attempt before it began, under --max-restarts).
  RunFolder(std::filesystem::path out, std::string config_toml, bool fresh);
  std::string name() const override { return "run_folder"; }
  bool rank0_only() const override { return true; }
  void before_fit() override;
  void after_batch() override;
  void after_epoch() override;
  void after_fit() override;
  /// After a failed run (rank 0): puts the older run's files back, unless the launcher will restart the run
  /// (--max-restarts), whose next attempt goes on with the takeover. No-op once the takeover is final.
  void after_failure() noexcept;

 private:
  void finish_takeover();
  std::filesystem::path out_;
  std::string config_toml_;
  bool fresh_;
  bool taken_ = false;    // fine_tune fits twice: the folder is taken over once
  bool pending_ = false;  // the older run's files are set aside, not yet deleted
};

/// At the start of a run that is not a launcher's restart (rank 0, holding the folder's lock): a run into `out`
/// that died (killed) while its takeover was pending left the older run's files aside; puts them back. True
/// when it did.
bool put_back_interrupted_takeover(const std::filesystem::path& out);

}  // namespace fastlearn::cli
