#pragma once
// The units of sharded parameters (DistributedTrainerOptions::shard = "parameters", ZeRO stage 3 / FSDP): entries of
// Sequentials in the model, each replaced, for the length of a fit, by a wrapper module that holds the same children,
// parameters and buffers under the same names (a state dict does not change) and runs the entry's forward between
// gathering its parameters (ShardedStep::gather_unit) and freeing them. LibTorch modules have no hooks: the wrapper
// is the forward hook, and two autograd functions are the backward ones, one on the unit's output (its backward runs
// before the unit's: the parameters are gathered again) and one on its input (its backward runs once the unit's is
// done: they are freed). Every rank must run the same units in the same order; on the CPU each unit's forward starts
// with a check of that (one small collective), so that a rank that skips a unit fails with its name.
#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}

namespace fastlearn {

class Group;
class ShardedStep;

class ShardedUnits {
 public:
  /// Finds and wraps the units of `model`: the modules named by `names` (dotted paths as in named_modules; "*" stands
  /// for any characters of one name), each an entry of a Sequential; when `names` is empty, each entry of the model if
  /// it is a Sequential, else each entry of the Sequentials among its children. Entries without parameters are not
  /// units. ConfigError, naming it, for a name that matches nothing or a module that is not a Sequential's entry, a
  /// unit inside another, a parameter two units share, or no unit at all. `prefetch`: each unit's forward starts
  /// gathering the next unit, each unit's backward the previous one's.
  ShardedUnits(torch::nn::Module& model, const std::vector<std::string>& names, Group& group,
               bool reshard_after_forward, bool prefetch);
  /// Puts the original entries back.
  ~ShardedUnits();
  ShardedUnits(const ShardedUnits&) = delete;
  ShardedUnits& operator=(const ShardedUnits&) = delete;

  /// Each unit's parameters (each once, in registration order).
  std::vector<std::vector<at::Tensor>> params() const;
  /// The unit of a parameter, or -1.
  std::int64_t unit_of(const at::Tensor& param) const;

  /// From now on the units' parameters are gathered and freed through `step` (its units adopted); until then the
  /// wrappers only run the entries.
  void start(ShardedStep& step);
  bool started() const { return step_ != nullptr; }
  /// Frees every unit still gathered (after backward: the first unit, whose input needs no gradient).
  void release_all();
  /// A model tensor, whole: its unit gathered (and the unit gathered before for reading freed), for whoever reads the
  /// whole model one unit at a time (a checkpoint). Collective: every rank asks for the same tensors in the same order.
  at::Tensor whole(const at::Tensor& t);

  /// The wrapper's forward. Public for the wrapper and the autograd functions; not for callers.
  at::Tensor run(std::size_t u, const at::Tensor& x);
  void before_unit_backward(std::size_t u);
  void after_unit_backward(std::size_t u);

 private:
  struct Unit;
  // Every rank is about to run unit u: compared first (CPU groups), so that a rank that skipped a unit (or ran one the
  // others did not) fails naming both rather than exchanging one unit's parameters for another's.
  void check_same_unit(std::size_t u);

  Group& group_;
  bool reshard_after_forward_;
  bool prefetch_;
  std::vector<bool> backward_pending_;  ///< per unit: its forward registered a backward that has not run
  std::vector<std::unique_ptr<Unit>> units_;
  ShardedStep* step_ = nullptr;
  std::int64_t id_ = 0;          ///< how the autograd functions find this object (see the registry in the .cpp)
  std::int64_t read_unit_ = -1;  ///< the unit whole() gathered last
};

}  // namespace fastlearn
