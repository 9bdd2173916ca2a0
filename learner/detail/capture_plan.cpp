#include <fastlearn/learner/detail/capture_plan.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>

namespace fastlearn {

CapturePlan::CapturePlan(Options options) : options_(options) {
  if (options_.warmup_steps < 1 || options_.shape_warmup_steps < 1)
    throw ConfigError(
        fmt::format("CapturePlan: warm-up steps must be >= 1 (got {} and {}): a step that makes the "
                    "optimizer's state cannot be captured",
                    options_.warmup_steps, options_.shape_warmup_steps));
}

CapturePlan::Action CapturePlan::next(const BatchKey& key) {
  if (refused_) {
    ++eager_steps_;
    return Action::eager;
  }
  auto it = shapes_.find(key);
  if (it == shapes_.end()) {
    if (shapes_.size() >= options_.max_graphs) {
      over_limit_ = true;
      ++eager_steps_;
      return Action::eager;
    }
    it = shapes_.emplace(key, Shape{}).first;
  }
  auto& shape = it->second;
  if (shape.graph) {
    ++replays_;
    return Action::replay;
  }
  const int needed = first_capture_done_ ? options_.shape_warmup_steps : options_.warmup_steps;
  if (shape.warmups < needed) {
    ++shape.warmups;
    ++eager_steps_;
    return Action::eager;
  }
  return Action::capture;
}

void CapturePlan::captured(const BatchKey& key) {
  auto& shape = shapes_.at(key);
  if (!shape.graph) ++graphs_;
  shape.graph = true;
  first_capture_done_ = true;
  ++captures_;
  ++replays_;
}

void CapturePlan::invalidate() {
  for (auto& [key, shape] : shapes_) shape = Shape{};
  graphs_ = 0;
  first_capture_done_ = true;  // the lazy initialisation is done: each shape needs only its own warm-up
}

void CapturePlan::refuse(std::string why) {
  if (refused_) return;
  refused_ = true;
  why_ = std::move(why);
  invalidate();
}

std::optional<std::string> CapturePlan::take_notice() {
  if (!over_limit_ || notice_given_) return std::nullopt;
  notice_given_ = true;
  return fmt::format(
      "cuda_graph: the training batches come in more than {} shapes; the batches of the others run "
      "eagerly (a DataLoader with drop_last, or fewer sizes, keeps every step captured)",
      options_.max_graphs);
}

}  // namespace fastlearn
