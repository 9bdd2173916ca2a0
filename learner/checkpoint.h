#pragma once
// Checkpoints of a Learner: one safetensors file holding the model's parameters and buffers under
// their module names (so Python's safetensors.torch.load_file + load_state_dict reads them), and,
// with the optimizer, its state tensors under "optimizer/", the RNG states under "rng/", and the
// training position (epochs completed, data order epoch, optimizer hyper-parameters) in the metadata.
// Files are written atomically; loading checks everything before changing anything.
#include <fastlearn/learner/safetensors.h>

#include <filesystem>
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

/// The learner's state as the tensors and metadata of a checkpoint (tensors are copies).
CheckpointState capture_state(Learner& learn, SaveOptions options = {});
/// Puts `state` back into the learner; CheckpointError naming `origin` and the tensor on any mismatch,
/// in which case nothing was changed.
void restore_state(Learner& learn, const CheckpointState& state, LoadOptions options, std::string_view origin);

/// capture_state, written atomically to `file` (its directory is created).
void save_checkpoint(Learner& learn, const std::filesystem::path& file, SaveOptions options = {});
/// Reads `file` and restore_state()s it.
void load_checkpoint(Learner& learn, const std::filesystem::path& file, LoadOptions options = {});

}  // namespace fastlearn
