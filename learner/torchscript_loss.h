#pragma once
// A loss written in Python: a TorchScript module (torch.jit.script, saved with torch.jit.save) whose forward takes the
// model's outputs, then the batch's targets, then any further tensors the batch carries after them (a mask, weights:
// TorchFort's extra loss arguments), all tensors, and returns the batch loss as a one-element tensor:
//
//   class MaskedMSE(torch.nn.Module):
//       def forward(self, pred, target, mask):
//           return ((pred - target) ** 2 * mask).sum() / mask.sum()
//
// trains a model of one output on batches whose targets are {target, mask}. What turns the model's first output into
// predictions (get_preds, predict, the export) is stated, since a script cannot say it.
#include <fastlearn/learner/loss.h>

#include <filesystem>
#include <string>

namespace fastlearn {

struct TorchScriptLossOptions {
  /// The model's first output to predictions: "none", "softmax" (over axis 1, the classes as torch's cross_entropy
  /// takes them; decoded by argmax) or "sigmoid" (decoded by threshold 0.5).
  std::string activation = "none";
};

/// The scripted loss in `file`, named "torchscript". CheckpointError naming the file when it is missing or not a
/// TorchScript archive; ConfigError when its forward takes anything but tensors or `activation` is unknown. At each
/// batch: an Error when the outputs and targets are not as many as its forward's arguments, or it returns anything
/// but a one-element tensor.
Loss torchscript_loss(const std::filesystem::path& file, TorchScriptLossOptions options = {});

/// The activation and decoding of TorchScriptLossOptions::activation on `loss`; ConfigError naming `what` for a name
/// that is not none, softmax or sigmoid.
void set_activation(Loss& loss, const std::string& activation, const std::string& what);

}  // namespace fastlearn
