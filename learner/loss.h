#pragma once
// Loss functions for the Learner: the loss itself (mean over the batch), plus how raw model outputs
// become predictions (activation, for get_preds) and decoded values (decodes, for predict).
#include <ATen/core/Tensor.h>

#include <functional>
#include <string>
#include <vector>

namespace fastlearn {

struct Loss {
  std::string name;
  /// The batch loss (a scalar) of the model output `pred` against the target `targ`.
  std::function<at::Tensor(const at::Tensor& pred, const at::Tensor& targ)> fn;
  /// The batch loss over every output of the model (`preds`: Learner::pred, then Learner::extra_preds) and every
  /// target of the batch (`targs`: Learner::yb), for models of several outputs and batches of several targets or
  /// extra loss arguments (a mask, weights). When set, the Learner calls it instead of fn.
  std::function<at::Tensor(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs)> fn_all;
  /// Raw output -> prediction (e.g. softmax); identity when empty.
  std::function<at::Tensor(const at::Tensor&)> activation;
  /// Prediction -> decoded value (e.g. argmax to a class index); identity when empty.
  std::function<at::Tensor(const at::Tensor&)> decodes;
  /// The activation's name for an export's readers ("none", "softmax", "sigmoid"); empty for fastlearn's losses,
  /// whose names say it (activation_of in learner/export.h).
  std::string activation_name;

  at::Tensor operator()(const at::Tensor& pred, const at::Tensor& targ) const;
  /// The loss of a batch: fn_all when set; otherwise fn on the one output and the one target, and an Error naming
  /// the loss when there are more (a target that nothing reads is refused rather than dropped).
  at::Tensor operator()(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs) const;
  at::Tensor activate(const at::Tensor& pred) const { return activation ? activation(pred) : pred; }
  at::Tensor decode(const at::Tensor& activated) const { return decodes ? decodes(activated) : activated; }
};

struct CrossEntropyOptions {
  double label_smoothing = 0.0;
  std::int64_t ignore_index = -100;
};

/// Cross entropy over class logits in the last dimension (fastai's CrossEntropyLossFlat): softmax
/// activation, argmax decoding. Extra dimensions of pred and targ are flattened.
Loss cross_entropy(CrossEntropyOptions options = {});
/// Mean squared error; flattens pred and targ (which must have the same number of elements).
Loss mse_loss();
/// Mean absolute error; flattens pred and targ.
Loss l1_loss();
/// Binary cross entropy on logits: sigmoid activation, decoding by threshold 0.5.
Loss bce_with_logits();

}  // namespace fastlearn
