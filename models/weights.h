#pragma once
// A model's weights by name: its parameters and buffers as a state dict (torch's names: "layer1.0.conv1.weight"),
// checked against a file's tensors before anything is copied, and loaded from safetensors files (checkpoints,
// or weights exported from PyTorch with safetensors.torch.save_file(model.state_dict(), ...)).
#include <fastlearn/core/named_tensors.h>

#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fastlearn::models {

struct WeightsOptions {
  bool strict = true;  ///< every model tensor must be in the file and every file tensor in the model
  /// File tensors under these prefixes are not the model's and are passed over (a Learner checkpoint's "optimizer/"
  /// and "rng/").
  std::vector<std::string> ignore_prefixes;
};

/// The parameters, then the buffers, of `model` and its submodules, by name.
NamedTensors model_tensors(torch::nn::Module& model);

/// The copies that load `tensors` into `model`: pairs of (model tensor, file tensor). CheckpointError naming
/// `origin` and the tensor when a name is missing on either side (strict), or a shape or dtype differs.
std::vector<std::pair<at::Tensor, const at::Tensor*>> match_weights(torch::nn::Module& model,
                                                                    const NamedTensors& tensors,
                                                                    std::string_view origin,
                                                                    const WeightsOptions& options = {});
/// Makes the copies of match_weights (onto each model tensor's device).
void copy_weights(const std::vector<std::pair<at::Tensor, const at::Tensor*>>& copies);

/// Loads a safetensors file into `model`: everything is checked before anything changes.
void load_weights(torch::nn::Module& model, const std::filesystem::path& file, const WeightsOptions& options = {});

}  // namespace fastlearn::models
