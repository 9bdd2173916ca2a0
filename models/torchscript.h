#pragma once
// A model written in Python, trained by fastlearn: a TorchScript module (torch.jit.script or torch.jit.trace, saved
// with torch.jit.save) as a torch::nn module. Its parameters and buffers are the script's own tensors, registered under
// the script's names in a tree of modules that mirrors the script's (LibTorch takes no dots in a registered name:
// "blocks.0.norm.weight" is the parameter "weight" of the child "norm" of the child "0" of "blocks"), so the
// optimizer's steps, device moves, checkpoints and fastai-style name rules (a LayerNorm or BatchNorm is recognised by
// its type's name: no weight decay, trainable when frozen) act on what the script computes with. train() and eval()
// switch the script's modules too, and clone() makes a script of its own (ParallelTrainer's replicas).
//
// TorchScript is deprecated in PyTorch in favour of torch.export, whose packages LibTorch can only run, not train:
// TorchScript remains the format a C++ program can train.
#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <filesystem>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace torch::jit {
struct Module;
}

namespace fastlearn::models {

class TorchScriptImpl : public torch::nn::Cloneable<TorchScriptImpl> {
 public:
  /// Loads `file` (CheckpointError naming it when it is not a TorchScript archive; ConfigError when its forward takes
  /// anything but tensors).
  explicit TorchScriptImpl(std::filesystem::path file);
  /// Loads the archive held in `archive` (a file's bytes); `origin` names it in errors. With `tensors`, the script's
  /// parameters and buffers are those of `tensors` by name (an export's: its archive holds none, see
  /// archive_without_tensors); CheckpointError naming a tensor the script has and `tensors` has not.
  TorchScriptImpl(const std::string& archive, std::string origin,
                  const std::vector<std::pair<std::string, at::Tensor>>* tensors = nullptr);
  /// For a clone (Cloneable::clone calls it on the copy, which shares the original's script): a copy of the script of
  /// its own, its tensors mirrored afresh.
  void reset() override;
  /// The script's forward on `inputs`, one tensor per argument after self, in order: its outputs, one for a Tensor
  /// returned, each of a tuple or list of tensors (ConfigError naming what it returned otherwise).
  std::vector<at::Tensor> forward(const std::vector<at::Tensor>& inputs);
  void train(bool on = true) override;
  /// The tensors' arguments of the script's forward (after self).
  std::size_t inputs() const { return inputs_; }
  /// The script itself (its tensors are this module's).
  torch::jit::Module& script() { return *script_; }
  /// The dropout the script does (a Dropout module, or dropout called in a forward), by where: "" when none. It draws
  /// from torch's global generator, which fastlearn's per-replica dropout streams (models/dropout.h) do not reach.
  std::string dropout() const { return uses("Dropout", "dropout"); }
  /// Likewise the batch normalization it does (a BatchNorm module, or batch_norm called in a forward).
  std::string batch_norm() const { return uses("BatchNorm", "batch_norm"); }
  /// The script as an archive whose parameters and buffers are empty: the code and the module tree, which an export
  /// carries beside the model's tensors (stored once, under their names).
  std::string archive_without_tensors();

 private:
  // Where the script's modules have `module_type` in their type's name or call an op named with `op`; "" if nowhere.
  std::string uses(const std::string& module_type, const std::string& op) const;

  std::string origin_;  // the file, or what held the archive, for messages
  std::shared_ptr<torch::jit::Module> script_;
  std::size_t inputs_ = 0;
};

TORCH_MODULE(TorchScript);

/// The TorchScript module saved in `file`, as a model (TorchScriptImpl).
TorchScript torchscript(const std::filesystem::path& file);

}  // namespace fastlearn::models
