#pragma once
// Checkpointer: complete training checkpoints during a fit (model, optimizer, RNG states, data order and
// the fit position: epoch, batch, schedule progress, loss accumulators), every N training batches and/or
// at the end of every epoch, into one folder as ckpt-e<epoch>-b<batch>.safetensors (epoch counting on from the fit's
// epoch_offset: fine_tune's unfrozen fit after its frozen epochs, so the two fits' files form one sequence). Files are
// written atomically (a SIGKILL at any moment leaves the previous checkpoints intact), by rank 0 only in a data
// parallel job, and only the newest `keep` are kept. latest_checkpoint(dir) finds the one to resume from
// with FitOptions{.resume_from = ...}.
#include <fastlearn/learner/callback.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <vector>

namespace fastlearn {

struct CheckpointerOptions {
  std::filesystem::path dir = "checkpoints";  ///< relative paths are under the learner's path
  std::int64_t every_n_batches = 0;           ///< also inside an epoch, after every N-th training batch; 0: never
  bool every_epoch = true;                    ///< after every epoch (after validation)
  int keep = 2;                               ///< the newest checkpoints kept; 0 keeps all
};

class Checkpointer : public Callback {
 public:
  explicit Checkpointer(CheckpointerOptions options = {});
  std::string name() const override { return "checkpointer"; }

  void before_fit() override;
  void after_batch() override;
  void after_epoch() override;

  /// Writes a checkpoint of the position now (after a training batch, or with `epoch_end` after an epoch)
  /// unless that position was just written; returns the file (also on ranks that do not write).
  std::filesystem::path save_now(bool epoch_end);
  /// The folder the checkpoints go to (the learner's path applied).
  std::filesystem::path dir() const;
  /// The last checkpoint this callback wrote (or would have, on a rank that does not write).
  const std::optional<std::filesystem::path>& last_saved() const { return last_saved_; }

 private:
  void prune() const;
  CheckpointerOptions options_;
  std::optional<std::filesystem::path> last_saved_;
};

/// The file name of the checkpoint at `epoch` (the fit's epoch_offset included) after `batch` training batches of it.
std::string checkpoint_file_name(int epoch, std::int64_t batch);

/// The files in `dir` named like checkpoints (checkpoint_file_name), newest first, whole or torn: none is read.
std::vector<std::filesystem::path> checkpoint_files(const std::filesystem::path& dir);

struct LatestCheckpointOptions {
  bool skip_torn = true;  ///< false: a newest checkpoint that does not parse is an error instead of skipped
};

/// The newest complete checkpoint in `dir` (by epoch, then batch), or nothing when there is none (or no
/// folder). A file that is not a complete checkpoint (truncated, corrupt) is skipped with a message on
/// stderr naming it and why, or with skip_torn = false a CheckpointError saying what to do.
std::optional<std::filesystem::path> latest_checkpoint(const std::filesystem::path& dir,
                                                       LatestCheckpointOptions options = {});

}  // namespace fastlearn
