#include <fastlearn/learner/memory_report.h>

#include <fastlearn/learner/learner.h>
#include <fastlearn/optim/optimizer.h>

#include <torch/torch.h>

#include <unordered_set>

namespace fastlearn {

namespace {

// Adds the bytes of `t`'s storage unless `seen` has it already.
std::int64_t storage_bytes(const at::Tensor& t, std::unordered_set<const void*>& seen) {
  if (!t.defined() || !t.has_storage()) return 0;
  const auto& storage = t.storage();
  if (!seen.insert(storage.unsafeGetStorageImpl()).second) return 0;
  return static_cast<std::int64_t>(storage.nbytes());
}

}  // namespace

MemoryReport memory_report(Learner& learn) {
  MemoryReport report;
  std::unordered_set<const void*> params, grads, state;
  for (const auto& p : learn.model().parameters()) {
    report.parameters += storage_bytes(p, params);
    report.gradients += storage_bytes(p.grad(), grads);
  }
  if (learn.has_opt()) {
    auto& opt = learn.opt();
    for (const auto& [name, t] : opt.held_state_tensors()) report.optimizer_state += storage_bytes(t, state);
    // Sharded parameters: this process's elements of them are the pieces the optimizer updates, kept apart from the
    // parameters' memory (freed between uses); pieces that are views of a parameter add nothing.
    for (std::size_t g = 0; opt.sharded() && g < opt.param_groups().size(); ++g)
      for (std::size_t i = 0; i < opt.param_groups()[g].params.size(); ++i)
        report.parameters += storage_bytes(opt.shard_piece(g, i), params);
    // Sharded: the gradients the optimizer steps with are this process's shares (a reducer's buffers).
    for (std::size_t g = 0; opt.sharded() && g < opt.param_groups().size(); ++g)
      for (std::size_t i = 0; i < opt.param_groups()[g].params.size(); ++i)
        report.gradients += storage_bytes(opt.shard_piece(g, i).grad(), grads);
  }
  return report;
}

}  // namespace fastlearn
