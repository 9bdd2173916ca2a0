#include <fastlearn/learner/interpretation.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>

namespace fastlearn {

ClassificationInterpretation::ClassificationInterpretation(at::Tensor probs, at::Tensor targets,
                                                           std::vector<std::string> vocab)
    : probs_(probs.detach().to(torch::kCPU, torch::kDouble)),
      targets_(targets.detach().to(torch::kCPU, torch::kLong).flatten()),
      vocab_(std::move(vocab)) {
  if (probs_.dim() != 2 || probs_.size(0) != targets_.size(0)) {
    throw ConfigError(
        fmt::format("ClassificationInterpretation: probabilities shaped [{}] for {} targets; "
                    "give (N, classes) probabilities of a single-label classifier",
                    fmt::join(probs_.sizes(), ", "), targets_.size(0)));
  }
  const auto c = probs_.size(1);
  if (vocab_.empty()) {
    for (std::int64_t i = 0; i < c; ++i) vocab_.push_back(std::to_string(i));
  }
  if (static_cast<std::int64_t>(vocab_.size()) != c) {
    throw ConfigError(fmt::format("ClassificationInterpretation: {} class names for {} classes", vocab_.size(), c));
  }
  if (targets_.numel() && (targets_.min().item<std::int64_t>() < 0 || targets_.max().item<std::int64_t>() >= c)) {
    throw ConfigError(fmt::format("ClassificationInterpretation: targets outside [0, {})", c));
  }
  predicted_ = probs_.argmax(1);
}

ClassificationInterpretation ClassificationInterpretation::from_learner(Learner& learn, DataLoader* dl) {
  const auto preds = learn.get_preds(dl);
  return {preds.preds, preds.targets, learn.dls().vocab()};
}

at::Tensor ClassificationInterpretation::confusion_matrix() const {
  const auto c = probs_.size(1);
  return torch::bincount(targets_ * c + predicted_, {}, c * c).view({c, c});
}

std::vector<ClassificationInterpretation::Confused> ClassificationInterpretation::most_confused(
    std::int64_t min_count) const {
  const auto cm = confusion_matrix();
  const auto c = cm.size(0);
  const auto* counts = cm.data_ptr<std::int64_t>();
  std::vector<Confused> out;
  for (std::int64_t a = 0; a < c; ++a) {
    for (std::int64_t p = 0; p < c; ++p) {
      if (a != p && counts[a * c + p] >= std::max<std::int64_t>(min_count, 1)) {
        out.push_back({vocab_[static_cast<std::size_t>(a)], vocab_[static_cast<std::size_t>(p)], counts[a * c + p]});
      }
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const auto& x, const auto& y) { return x.count > y.count; });
  return out;
}

std::vector<ClassificationInterpretation::Loss> ClassificationInterpretation::top_losses(std::int64_t k) const {
  const auto n = targets_.size(0);
  const auto actual = probs_.gather(1, targets_.view({n, 1})).view({n});
  const auto losses = -actual.clamp_min(1e-300).log();
  const auto order = losses.argsort(/*stable=*/true, /*dim=*/0, /*descending=*/true);
  std::vector<Loss> out;
  for (std::int64_t i = 0; i < std::min(k, n); ++i) {
    const auto item = order[i].item<std::int64_t>();
    const auto predicted = predicted_[item].item<std::int64_t>();
    out.push_back({.index = item,
                   .loss = losses[item].item<double>(),
                   .actual = vocab_[static_cast<std::size_t>(targets_[item].item<std::int64_t>())],
                   .predicted = vocab_[static_cast<std::size_t>(predicted)],
                   .probability = probs_[item][predicted].item<double>()});
  }
  return out;
}

}  // namespace fastlearn
