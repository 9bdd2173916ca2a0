#include <fastlearn/learner/detail/step_graphs.h>

#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/models/torchscript.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

namespace fastlearn {

namespace {
std::vector<at::Tensor> clones(const std::vector<at::Tensor>& tensors) {
  std::vector<at::Tensor> out;
  out.reserve(tensors.size());
  for (const auto& t : tensors) out.push_back(t.clone());
  return out;
}
}  // namespace

BatchKey batch_key(const std::vector<at::Tensor>& xb, const std::vector<at::Tensor>& yb) {
  BatchKey key;
  for (const auto* list : {&xb, &yb}) {
    key.values.push_back(static_cast<std::int64_t>(list->size()));
    for (const auto& t : *list) {
      key.values.push_back(static_cast<std::int64_t>(t.scalar_type()));
      key.values.push_back(static_cast<std::int64_t>(t.device().type()));
      key.values.push_back(t.device().index());
      key.values.push_back(t.dim());
      for (const auto s : t.sizes()) key.values.push_back(s);
      for (const auto s : t.strides()) key.values.push_back(s);
    }
  }
  return key;
}

StepGraphs::StepGraphs() = default;
StepGraphs::~StepGraphs() = default;

void StepGraphs::refuse(Learner& learn, std::string why) {
  if (plan_.refused()) return;
  warn(fmt::format("cuda_graph: the training steps of this fit run eagerly: {}", why));
  plan_.refuse(std::move(why));
  drop_graphs();
  if (learn.has_opt()) learn.opt().set_device_hypers(false);  // the host path's fused kernels are faster eagerly
}

// Declared support, asked once the fit's callbacks are all attached and have seen before_fit.
void StepGraphs::check_callbacks(Learner& learn) {
  for (const auto& m : learn.model().modules()) {
    if (dynamic_cast<const models::TorchScriptImpl*>(m.get()))
      return refuse(learn,
                    "the model is a TorchScript module, whose interpreter decides on the host as it runs (profiling, "
                    "guards): it trains eagerly");
  }
  for (const auto& cb : learn.cbs()) {
    cb->forget_in_step_events();
    if (!cb->run || !cb->run_train) continue;
    const auto support = cb->step_capture();
    if (support.kind == StepCapture::eager_only)
      return refuse(learn,
                    fmt::format("the callback '{}' needs the host inside each step: {}", cb->name(), support.why));
  }
}

// Undeclared callbacks are judged by what they did in an eager step; then the device.
void StepGraphs::check_after_eager_step(Learner& learn) {
  if (plan_.refused()) return;
  for (const auto& cb : learn.cbs()) {
    if (!cb->run || !cb->run_train || cb->step_capture().kind != StepCapture::undeclared) continue;
    const auto handled = cb->in_step_events_handled();
    if (handled.empty()) continue;
    std::vector<std::string> names;
    for (const auto e : handled) names.emplace_back(to_string(e));
    return refuse(learn,
                  fmt::format("the callback '{}' handles {} inside the step and does not say that its work there "
                              "can be captured (Callback::step_capture)",
                              cb->name(), fmt::join(names, ", ")));
  }
  if (device_checked_) return;
  device_checked_ = true;
  if (!learn.device().is_cuda())
    return refuse(learn, fmt::format("the Learner computes on {}; CUDA graphs need a GPU", learn.device().str()));
  if (!cuda_graphs_built()) return refuse(learn, "this build of fastlearn has no CUDA");
}

void StepGraphs::drop_graphs() {
  graphs_.clear();
  pool_ = {};
}

void StepGraphs::eager(Learner& learn, const std::function<void()>& eager_step) {
  for (const auto& cb : learn.cbs()) cb->forget_in_step_events();  // this step's only, not validation's
  run_on_side_stream(learn.device(), eager_step);
  check_after_eager_step(learn);
  if (!plan_.refused()) settled_ = fingerprint(learn);
}

// Where everything the graphs read is, and what decides which parameters a step updates: the optimizer itself, and
// which parameters require a gradient.
std::vector<const void*> StepGraphs::fingerprint(Learner& learn) const {
  std::vector<const void*> where{&learn.opt()};
  for (const auto& p : learn.model().parameters()) {
    where.push_back(p.data_ptr());
    where.push_back(p.requires_grad() ? &learn : nullptr);
  }
  for (const auto& b : learn.model().buffers()) where.push_back(b.defined() ? b.data_ptr() : nullptr);
  learn.opt().append_state_addresses(where);
  return where;
}

void StepGraphs::capture(Learner& learn, const BatchKey& key, const std::function<void()>& eager_step) {
  auto graph = std::make_unique<Graph>();
  for (const auto& x : learn.xb) graph->xb.push_back(at::empty_strided(x.sizes(), x.strides(), x.options()).copy_(x));
  for (const auto& y : learn.yb) graph->yb.push_back(at::empty_strided(y.sizes(), y.strides(), y.options()).copy_(y));
  auto& opt = learn.opt();
  opt.stage_hypers();
  // No gradient before the capture: backward then writes fresh ones (from the graph's pool) instead of adding.
  opt.zero_grad(/*set_to_none=*/true);
  const auto batch_xb = learn.xb, batch_yb = learn.yb;
  learn.xb = graph->xb;
  learn.yb = graph->yb;
  try {
    graph->graph.capture(learn.device(), pool_, eager_step);
  } catch (const CancelException&) {
    learn.xb = batch_xb, learn.yb = batch_yb;
    refuse(learn, "a callback cancelled part of the step while it was being captured");
    throw;
  } catch (const std::exception& e) {
    learn.xb = batch_xb, learn.yb = batch_yb;
    throw Error(
        fmt::format("cuda_graph: capturing the training step failed: {}; something in the step (a callback "
                    "that says it can be captured, the model's forward) makes the host wait for the GPU or "
                    "decides on a value it reads back. Set cuda_graph off to train eagerly",
                    e.what()));
  }
  learn.xb = batch_xb, learn.yb = batch_yb;
  graph->pred = learn.pred;
  graph->extra_preds = learn.extra_preds;
  graph->loss = learn.loss;
  graph->updated = opt.last_updated();
  graph->fingerprint = fingerprint(learn);
  graph->graph.replay();  // capture ran nothing: this batch's step is the graph's first replay
  learn.pred = graph->pred.clone();
  learn.extra_preds = clones(graph->extra_preds);
  learn.loss = graph->loss.clone();
  plan_.captured(key);
  graphs_[key] = std::move(graph);
}

void StepGraphs::replay(Learner& learn, Graph& graph) {
  auto& opt = learn.opt();
  opt.stage_hypers();
  for (std::size_t i = 0; i < graph.xb.size(); ++i) graph.xb[i].copy_(learn.xb[i], /*non_blocking=*/true);
  for (std::size_t i = 0; i < graph.yb.size(); ++i) graph.yb[i].copy_(learn.yb[i], /*non_blocking=*/true);
  graph.graph.replay();
  opt.count_replayed_step(graph.updated);
  // Copies, as an eager step makes new tensors: the next replay overwrites the graph's own.
  learn.pred = graph.pred.clone();
  learn.extra_preds = clones(graph.extra_preds);
  learn.loss = graph.loss.clone();
}

void StepGraphs::run(Learner& learn, const std::function<void()>& eager_step) {
  if (first_batch_) {
    first_batch_ = false;
    check_callbacks(learn);
  }
  const auto key = batch_key(learn.xb, learn.yb);
  if (plan_.refused()) {
    plan_.next(key);  // counts it
    return eager_step();
  }
  if (learn.device().is_cuda() && !learn.opt().device_hypers()) {
    try {
      learn.opt().set_device_hypers(true);
    } catch (const ConfigError& e) {
      refuse(learn, e.what());
      plan_.next(key);  // counts it
      return eager_step();
    }
  }
  // The optimizer's state loaded or made anew, a parameter frozen, the model moved: what the graphs read is elsewhere.
  if (const auto it = graphs_.find(key); it != graphs_.end() && fingerprint(learn) != it->second->fingerprint) {
    drop_graphs();
    plan_.invalidate();
  }
  auto action = plan_.next(key);
  if (action == CapturePlan::Action::capture && fingerprint(learn) != settled_) {
    drop_graphs();  // changed since the last eager step: that step did not see it
    plan_.invalidate();
    action = plan_.next(key);
  }
  if (action == CapturePlan::Action::capture) {
    // After the warm-up steps every trainable parameter has its state, unless one gets no gradient in a step.
    if (const auto untouched = learn.opt().never_updated_trainable(); !untouched.empty()) {
      refuse(learn, fmt::format("{} of the optimizer requires a gradient but got none in {} steps; its first update "
                                "would make its state inside a captured step (freeze what does not train)",
                                untouched, plan_.eager_steps()));
      plan_.next(key);  // counts this step as eager
      return eager_step();
    }
  }
  if (auto notice = plan_.take_notice()) warn(*notice);
  switch (action) {
    case CapturePlan::Action::eager:
      return eager(learn, eager_step);
    case CapturePlan::Action::capture:
      return capture(learn, key, eager_step);
    case CapturePlan::Action::replay:
      return replay(learn, *graphs_.at(key));
  }
}

}  // namespace fastlearn
