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
    for (const auto& [name, t] : learn.opt().state_tensors()) report.optimizer_state += storage_bytes(t, state);
  }
  return report;
}

}  // namespace fastlearn
