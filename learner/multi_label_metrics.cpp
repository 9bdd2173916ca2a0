#include <fastlearn/learner/multi_label_metrics.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/torch.h>

namespace fastlearn {

MetricPtr accuracy_multi(double thresh) {
  return std::make_shared<AvgMetric>("accuracy_multi", [thresh](const at::Tensor& pred, const at::Tensor& targ) {
    return torch::sigmoid(pred.to(torch::kFloat)).ge(thresh).eq(targ.gt(0.5)).to(torch::kDouble).mean();
  });
}

MetricPtr fbeta_multi(double beta, double thresh, const std::string& average) {
  if (!(beta > 0)) throw ConfigError(fmt::format("fbeta_multi: beta {} must be positive", beta));
  if (average != "samples" && average != "macro") {
    throw ConfigError(fmt::format("fbeta_multi: average '{}' is not 'samples' or 'macro'", excerpt(average)));
  }
  const int dim = average == "samples" ? 1 : 0;  // sum over classes per item, or over items per class
  return std::make_shared<AccumMetric>(
      "fbeta_multi",
      [beta, dim](const at::Tensor& preds, const at::Tensor& targs) {
        const auto p = preds.to(torch::kDouble), t = targs.gt(0.5).to(torch::kDouble);
        const auto tp = (p * t).sum(dim), fp = (p * (1 - t)).sum(dim), fn = ((1 - p) * t).sum(dim);
        const double b2 = beta * beta;
        const auto denominator = (1 + b2) * tp + b2 * fn + fp;
        const auto score = torch::where(denominator > 0, (1 + b2) * tp / denominator.clamp_min(1e-300),
                                        torch::zeros_like(denominator));
        return score.numel() ? score.mean().item<double>() : std::nan("");
      },
      [thresh](const at::Tensor& pred) { return torch::sigmoid(pred.to(torch::kFloat)).ge(thresh).to(torch::kByte); });
}

}  // namespace fastlearn
