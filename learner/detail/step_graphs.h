#pragma once
// LearnerOptions::cuda_graph at work (docs/gpu.md, "Training steps as CUDA graphs"): a training batch's step
// (forward, loss, backward, optimizer step) captured in a CUDA graph once per batch shape and replayed, as the
// CapturePlan says; the batch is copied into the graph's buffers, and the events inside the step run at capture only.
#include <fastlearn/core/detail/cuda_graph.h>
#include <fastlearn/learner/detail/capture_plan.h>

#include <ATen/core/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace fastlearn {

class Learner;

class StepGraphs {
 public:
  StepGraphs();
  ~StepGraphs();
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  /// Runs the training batch in `learn` (xb, yb as before_batch left them): eagerly through `eager_step` (the
  /// Learner's own step), captured, or as a replay.
  void run(Learner& learn, const std::function<void()>& eager_step);
  const CapturePlan& plan() const { return plan_; }

 private:
  struct Graph {
    CapturedGraph graph;
    std::vector<at::Tensor> xb, yb;                 ///< the buffers each batch is copied into
    at::Tensor pred, loss;                          ///< where the graph leaves its results
    std::vector<at::Tensor> extra_preds;            ///< a model of several outputs: the others
    std::vector<std::vector<std::size_t>> updated;  ///< the parameters its optimizer step updates, per group
    std::vector<const void*> fingerprint;           ///< what it reads, as fingerprint() saw it at its capture
  };
  void check_callbacks(Learner& learn);
  void check_after_eager_step(Learner& learn);
  void refuse(Learner& learn, std::string why);
  void eager(Learner& learn, const std::function<void()>& eager_step);
  void capture(Learner& learn, const BatchKey& key, const std::function<void()>& eager_step);
  void replay(Learner& learn, Graph& graph);
  std::vector<const void*> fingerprint(Learner& learn) const;
  /// Drops every graph, and the pool with the last of them (a pool whose graphs are gone cannot be captured into).
  void drop_graphs();

  CapturePlan plan_;
  GraphPool pool_;
  std::map<BatchKey, std::unique_ptr<Graph>> graphs_;
  std::vector<const void*> settled_;  ///< fingerprint() after the last eager step: a capture must see the same
  bool first_batch_ = true;
  bool device_checked_ = false;
};

/// The key of a batch: per tensor of `xb`, then of `yb`, its dtype, device, sizes and strides.
BatchKey batch_key(const std::vector<at::Tensor>& xb, const std::vector<at::Tensor>& yb);

}  // namespace fastlearn
