#pragma once
// Checkpoints of a Learner: one safetensors file holding the model's parameters and buffers under
// their module names (so Python's safetensors.torch.load_file + load_state_dict reads them), and,
// with the optimizer, its state tensors under "optimizer/", the RNG states under "rng/", and the
// training position (epochs completed, data order epoch, optimizer hyper-parameters) in the metadata.
// Files are written atomically; loading checks everything before changing anything.
#include <fastlearn/core/safetensors.h>
#include <fastlearn/learner/recorder.h>

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

namespace fastlearn {

class Learner;

struct SaveOptions {
  bool with_opt = true;  ///< also the optimizer state, training position and RNG state
};

struct LoadOptions {
  bool with_opt = true;  ///< restore the optimizer state and training position too (when the file has them)
  bool strict = true;    ///< every model tensor must be in the file and every file tensor in the model
};

using CheckpointState = SafetensorsContent;

/// Where in a fit a checkpoint was taken (metadata "fit_position"), so that a fit resumed from it
/// continues exactly: at the start of an epoch (batch 0) or after `batch` training batches of it.
struct FitPosition {
  int n_epoch = 0;                ///< epochs of the fit (a resumed fit must have as many)
  int epoch = 0;                  ///< the epoch to continue
  std::int64_t batch = 0;         ///< training batches of `epoch` already done
  std::int64_t train_iter = 0;    ///< training batches since the start of the fit
  double pct_train = 0;           ///< the learner's pct_train at that point (exact, it drives the schedules)
  Recorder::EpochState recorder;  ///< the running epoch's loss accumulators
  std::string phase;              ///< the fit's part of a longer training (FitOptions::phase; fine_tune's "unfrozen")
  int epoch_offset = 0;           ///< epochs of that training before the fit (FitOptions::epoch_offset)
};

/// The position of `learn` now: inside a training epoch (after a batch) or, with `epoch_end`, after the epoch.
FitPosition current_fit_position(const Learner& learn, bool epoch_end);
/// Stores `position` in `state`, making its data order the one of position.epoch.
void set_fit_position(CheckpointState& state, const FitPosition& position);
/// The position stored in a checkpoint, if it has one; CheckpointError naming `origin` when it is malformed.
std::optional<FitPosition> fit_position(const CheckpointState& state, std::string_view origin);

/// The learner's state as the tensors and metadata of a checkpoint (tensors are copies).
CheckpointState capture_state(Learner& learn, SaveOptions options = {});
/// Puts `state` back into the learner; CheckpointError naming `origin` and the tensor on any mismatch,
/// in which case nothing was changed.
void restore_state(Learner& learn, const CheckpointState& state, LoadOptions options, std::string_view origin);

/// Every process's RNG states, one row per rank (collective in a job of several, through the learner's
/// coordination: every rank calls it), for a checkpoint from which each rank resumes its own streams.
at::Tensor gather_rng_states(Learner& learn);
/// Adds the rows of gather_rng_states to `state` as rng/rank<r>/cpu and rng/rank<r>/cuda<i>; restore_state
/// gives each rank its own (Learner::Coordination::rank), and a process of a one-process job the plain rng/cpu.
void add_rng_states_of_every_rank(CheckpointState& state, const at::Tensor& gathered);

/// What a save writes: the learner's state as capture_state takes it, except that a sharded optimizer's state is left
/// to be gathered one tensor at a time while the file is written (`deferred`, collective), so that no process holds
/// all of it at once.
struct StateToSave {
  CheckpointState state;
  std::vector<DeferredTensor> deferred;
  std::size_t deferred_at = 0;  ///< where in state.tensors' order the deferred tensors are written
};
StateToSave capture_state_to_save(Learner& learn, SaveOptions options = {});
/// Writes `to_save` atomically to `file` (its directory created) on the main process; on the others it only makes the
/// deferred tensors, which is their part of the gathers.
void write_checkpoint(Learner& learn, const std::filesystem::path& file, const StateToSave& to_save);

/// capture_state, written atomically to `file` (its directory is created) by the main process; the others only take
/// part in the capture, when saving_is_collective.
void save_checkpoint(Learner& learn, const std::filesystem::path& file, SaveOptions options = {});
/// Whether saving with `options` needs every process: the optimizer's state or the model's parameters are sharded
/// over them (DistributedTrainerOptions::shard) and each must take part in gathering them. Otherwise the main process
/// saves alone.
bool saving_is_collective(Learner& learn, SaveOptions options = {});
/// Reads `file` and restore_state()s it.
void load_checkpoint(Learner& learn, const std::filesystem::path& file, LoadOptions options = {});

}  // namespace fastlearn
