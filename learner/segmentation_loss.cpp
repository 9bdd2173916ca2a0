#include <fastlearn/learner/segmentation_loss.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn {

namespace F = torch::nn::functional;

namespace {

void check_shapes(const at::Tensor& pred, const at::Tensor& targ, const char* loss) {
  if (pred.dim() < 2 || targ.dim() != pred.dim() - 1 || targ.size(0) != pred.size(0) ||
      targ.sizes().slice(1) != pred.sizes().slice(2)) {
    throw DataError(
        fmt::format("{}: scores [{}] and targets [{}]; expects (N, C, H, W) scores and (N, H, W) class "
                    "indices",
                    loss, fmt::join(pred.sizes(), ", "), fmt::join(targ.sizes(), ", ")));
  }
}

void segmentation_outputs(Loss& loss) {
  loss.activation = [](const at::Tensor& pred) { return pred.softmax(1); };
  loss.decodes = [](const at::Tensor& probs) { return probs.argmax(1); };
}

at::Tensor cross_entropy_of(const at::Tensor& pred, const at::Tensor& targ, const CrossEntropyOptions& options) {
  check_shapes(pred, targ, "pixel_cross_entropy");
  return F::cross_entropy(
      pred, targ.to(torch::kLong),
      F::CrossEntropyFuncOptions().label_smoothing(options.label_smoothing).ignore_index(options.ignore_index));
}

at::Tensor dice_of(const at::Tensor& pred, const at::Tensor& targ, const DiceLossOptions& options) {
  check_shapes(pred, targ, "dice_loss");
  const auto probs = pred.softmax(1);
  const auto one_hot = F::one_hot(targ.to(torch::kLong), pred.size(1)).movedim(-1, 1).to(probs.scalar_type());
  std::vector<std::int64_t> pixels;
  for (std::int64_t d = 2; d < pred.dim(); ++d) pixels.push_back(d);
  const auto inter = (probs * one_hot).sum(pixels);
  const auto uni = (options.square_in_union ? probs.square() + one_hot : probs + one_hot).sum(pixels);
  return (1 - (inter * 2 + options.smooth) / (uni + options.smooth)).mean();
}

}  // namespace

Loss pixel_cross_entropy(CrossEntropyOptions options) {
  Loss loss{.name = "pixel_cross_entropy", .fn = [options](const at::Tensor& pred, const at::Tensor& targ) {
              return cross_entropy_of(pred, targ, options);
            }};
  segmentation_outputs(loss);
  return loss;
}

Loss dice_loss(DiceLossOptions options) {
  Loss loss{.name = "dice_loss",
            .fn = [options](const at::Tensor& pred, const at::Tensor& targ) { return dice_of(pred, targ, options); }};
  segmentation_outputs(loss);
  return loss;
}

Loss cross_entropy_dice(double dice_weight, DiceLossOptions dice) {
  if (!(dice_weight >= 0))
    throw ConfigError(fmt::format("cross_entropy_dice: dice_weight {} must be >= 0", dice_weight));
  Loss loss{.name = "cross_entropy_dice", .fn = [dice_weight, dice](const at::Tensor& pred, const at::Tensor& targ) {
              return cross_entropy_of(pred, targ, {}) + dice_of(pred, targ, dice) * dice_weight;
            }};
  segmentation_outputs(loss);
  return loss;
}

}  // namespace fastlearn
