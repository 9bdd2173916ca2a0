#include <fastlearn/core/error.h>
#include <fastlearn/learner/loss.h>

#include <fmt/format.h>
#include <torch/torch.h>

namespace fastlearn {

namespace F = torch::nn::functional;

at::Tensor Loss::operator()(const at::Tensor& pred, const at::Tensor& targ) const {
  return fn ? fn(pred, targ) : fn_all({pred}, {targ});
}

at::Tensor Loss::operator()(const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs) const {
  if (fn_all) return fn_all(preds, targs);
  if (preds.size() != 1) {
    throw ConfigError(fmt::format(
        "loss '{}' reads one output of the model, which returned {}: give a loss over every output (Loss::fn_all)",
        name, preds.size()));
  }
  if (targs.size() != 1) {
    throw ConfigError(fmt::format(
        "loss '{}' reads one target and the batch has {}: a target nothing reads is refused rather than dropped "
        "(give a loss over every target, Loss::fn_all, or leave the extra targets out of the dataset)",
        name, targs.size()));
  }
  return fn(preds[0], targs[0]);
}

Loss cross_entropy(CrossEntropyOptions options) {
  Loss loss;
  loss.name = "cross_entropy";
  loss.fn = [options](const at::Tensor& pred, const at::Tensor& targ) {
    const auto classes = pred.size(-1);
    return F::cross_entropy(
        pred.reshape({-1, classes}), targ.reshape({-1}),
        F::CrossEntropyFuncOptions().label_smoothing(options.label_smoothing).ignore_index(options.ignore_index));
  };
  loss.activation = [](const at::Tensor& pred) { return pred.softmax(-1); };
  loss.decodes = [](const at::Tensor& probs) { return probs.argmax(-1); };
  return loss;
}

Loss mse_loss() {
  return {.name = "mse_loss", .fn = [](const at::Tensor& pred, const at::Tensor& targ) {
            return F::mse_loss(pred.reshape({-1}), targ.reshape({-1}).to(pred.scalar_type()));
          }};
}

Loss l1_loss() {
  return {.name = "l1_loss", .fn = [](const at::Tensor& pred, const at::Tensor& targ) {
            return F::l1_loss(pred.reshape({-1}), targ.reshape({-1}).to(pred.scalar_type()));
          }};
}

Loss bce_with_logits() {
  return {.name = "bce_with_logits",
          .fn =
              [](const at::Tensor& pred, const at::Tensor& targ) {
                return F::binary_cross_entropy_with_logits(pred.reshape({-1}),
                                                           targ.reshape({-1}).to(pred.scalar_type()));
              },
          .activation = [](const at::Tensor& pred) { return pred.sigmoid(); },
          .decodes = [](const at::Tensor& probs) { return probs.gt(0.5); }};
}

}  // namespace fastlearn
