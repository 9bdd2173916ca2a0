#pragma once
// RunFolder: how `fastlearn train` takes its output folder over from an older run there. A fresh run sets the
// older run's files aside when its fit is about to train, and deletes them once it has something of its own to
// keep: its first finished epoch, its first checkpoint, or the end of its fit (a graceful stop ends it with a
// checkpoint). A run that fails before that puts them back, so that an error found while training (a corrupt image
// in the first batches) leaves the older run's folder as it was. Only the files a run writes move: config.toml,
// metrics.json, history.csv and loss.svg into DIR/.previous-run; the checkpoint files (ckpt-*, model, best) into
// DIR/checkpoints/.previous-run and tensorboard/'s entries into DIR/tensorboard/.previous-run, inside those folders
// themselves, which may be mount points or links to another disk.
#include <fastlearn/learner/callback.h>

#include <filesystem>
#include <string>

namespace fastlearn::cli {

class RunFolder : public Callback {
 public:
  /// `fresh`: a new run (an older run's files are set aside); otherwise a resumed one, which continues in the
  /// folder as it is, and finishes a takeover left pending by the attempt it resumes.
  RunFolder(std::filesystem::path out, std::string config_toml, bool fresh);
  std::string name() const override { return "run_folder"; }
  bool rank0_only() const override { return true; }
  void before_fit() override;
  void before_batch() override;
  void after_epoch() override;
  void after_fit() override;

 private:
  void finish_takeover();
  std::filesystem::path out_;
  std::string config_toml_;
  bool fresh_;
  bool taken_ = false;    // fine_tune fits twice: the folder is taken over once
  bool pending_ = false;  // the older run's files are set aside, not yet deleted
};

/// At the start of every run (rank 0, holding the folder's lock): a run killed while it set the older run's files
/// aside left some of them half moved; puts those back. Then, only for a fresh run (the caller says so), a run
/// killed while its takeover was pending left the older run's files aside; puts them back too. True when it put
/// anything back.
bool put_back_interrupted_takeover(const std::filesystem::path& out, bool fresh);

/// After a run failed (rank 0): puts an older run's files still set aside back, removing what the failed run
/// wrote in their place, unless the launcher will restart the run (--max-restarts), whose next attempt goes on
/// with the takeover. True when it put anything back.
bool put_back_after_failure(const std::filesystem::path& out);

}  // namespace fastlearn::cli
