#pragma once
// TensorBoardLogger: writes what a fit does as TensorBoard scalars, one event file per fit under
// log_dir. Per training batch (step = training batches done, counted from the first epoch, so a
// resumed fit continues the curve): "train_loss" (the batch's loss), "smooth_loss" (the Recorder's) and
// "lr" (last parameter group; "lr/group_<i>" for each group when there are several). Per epoch
// (step = epoch): "epoch/train_loss", "epoch/valid_loss" and "epoch/<metric>". Under a
// DistributedTrainer only rank 0 writes (its own batch losses; epoch values are the whole job's).
#include <fastlearn/core/event_file.h>
#include <fastlearn/learner/callback.h>

#include <chrono>
#include <filesystem>
#include <memory>

namespace fastlearn {

struct TensorBoardOptions {
  std::filesystem::path log_dir = "runs";  ///< relative paths are under the learner's path
  bool per_step = true;                    ///< also the per-batch scalars (not just the epoch ones)
  double flush_secs = 10;                  ///< flush at least this often while training (and after each epoch)
};

class TensorBoardLogger : public Callback {
 public:
  explicit TensorBoardLogger(TensorBoardOptions options = {});
  std::string name() const override { return "tensorboard"; }
  bool rank0_only() const override { return true; }
  void before_fit() override;
  void after_batch() override;
  void after_epoch() override;
  void after_fit() override;
  /// The event file of the current (or last) fit; empty before the first fit.
  std::filesystem::path path() const { return writer_ ? writer_->path() : std::filesystem::path{}; }

 private:
  void write_recorded_steps();
  TensorBoardOptions options_;
  std::size_t written_ = 0;  // the Recorder's per-batch records written so far
  std::unique_ptr<EventFileWriter> writer_;
  std::chrono::steady_clock::time_point last_flush_;
};

}  // namespace fastlearn
