#pragma once
// The plan of LearnerOptions::cuda_graph, without CUDA: for each training batch, whether it runs eagerly (warm-up,
// a shape past the limit, a refused fit), is captured, or replays its shape's graph; and what was done.
#include <compare>
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

/// The batch as a captured graph sees it: per tensor of the inputs, then of the targets, its dtype, device, sizes and
/// strides. A graph replays only batches of the key it was captured with (they are copied into its buffers).
struct BatchKey {
  std::vector<std::int64_t> values;
  friend auto operator<=>(const BatchKey&, const BatchKey&) = default;
};

class CapturePlan {
 public:
  struct Options {
    int warmup_steps = 3;        ///< eager steps before the first capture of a fit (lazy initialisation, workspaces)
    int shape_warmup_steps = 1;  ///< eager steps of each further shape, and of every shape after an invalidation
    std::size_t max_graphs = 8;  ///< shapes past this many run eagerly
  };
  enum class Action { eager, capture, replay };

  explicit CapturePlan(Options options);
  CapturePlan() : CapturePlan(Options{}) {}

  /// What to do with the next training batch of `key` (counted as it says, except a capture, counted by captured()).
  Action next(const BatchKey& key);
  /// The capture of `key` succeeded and its batch ran as the graph's first replay.
  void captured(const BatchKey& key);
  /// What the graphs read has moved (the optimizer's state loaded or made anew, the model moved): every graph is
  /// dropped; each shape warms up again before it is captured again.
  void invalidate();
  /// Every further step runs eagerly, because of `why` (the first reason is kept).
  void refuse(std::string why);
  bool refused() const { return refused_; }
  const std::string& why() const { return why_; }
  /// A notice to print once (shapes past max_graphs), then nothing.
  std::optional<std::string> take_notice();

  std::int64_t captures() const { return captures_; }
  std::int64_t replays() const { return replays_; }
  std::int64_t eager_steps() const { return eager_steps_; }
  std::size_t graphs() const { return graphs_; }

 private:
  struct Shape {
    int warmups = 0;
    bool graph = false;
  };
  Options options_;
  std::map<BatchKey, Shape> shapes_;
  std::size_t graphs_ = 0;
  bool first_capture_done_ = false;
  bool refused_ = false;
  std::string why_;
  bool over_limit_ = false;
  bool notice_given_ = false;
  std::int64_t captures_ = 0, replays_ = 0, eager_steps_ = 0;
};

}  // namespace fastlearn
