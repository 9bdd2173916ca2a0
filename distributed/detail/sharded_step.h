#pragma once
// What a DistributedTrainer with shard = optimizer or gradients (ZeRO stages 1 and 2) does around the optimizer
// step. Each rank owns the same part of every reducer bucket (detail/shard_layout); once the reducer's buckets are
// final, the optimizer is told which elements of each parameter this rank updates (Optimizer::shard). After each
// synchronized backward, each piece gets its gradient: its part of the parameter's averaged .grad (stage 1), or of
// the reducer's share of the bucket (stage 2: the only gradient this rank keeps). The parameters of each bucket are
// moved into one flat buffer laid out as the bucket (the layout stage 3 shards), so that after the step the ranks'
// updated parts are all-gathered straight into every rank's parameters, a bucket at a time, without a copy.
#include <fastlearn/distributed/detail/shard_layout.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

namespace fastlearn {

class GradReducer;
class Group;
class Optimizer;

class ShardedStep {
 public:
  explicit ShardedStep(Group& group) : group_(group) {}

  /// After a synchronized backward whose gradients the optimizer steps: adopts the reducer's buckets if they are
  /// final and new (the optimizer's state is cut, or redistributed, to the new parts), then gives each piece its
  /// gradient. Before the buckets are final the optimizer steps whole parameters, as without sharding.
  void feed(GradReducer& reducer, Optimizer& opt);
  /// The gradients this rank steps with (its pieces'), when the optimizer is sharded; empty otherwise.
  std::vector<at::Tensor> gradients(Optimizer& opt) const;

 private:
  struct Bucket {
    ShardedBucket layout;
    at::Tensor flat;                                             ///< the parameters' memory, padded
    std::vector<at::Tensor> params;                              ///< bucket order
    std::vector<std::pair<std::size_t, std::size_t>> opt_index;  ///< (group, index) in the optimizer, per param
    std::vector<bool> in_opt;                                    ///< whether the optimizer holds the param
  };
  void adopt(const GradReducer& reducer, Optimizer& opt);
  static void flatten(Bucket& b);
  // After the optimizer stepped (ShardPlan::gather_params): every rank's part of every bucket into every rank's
  // parameters.
  static void gather_params(const std::vector<Bucket>& buckets, Group& group);

  Group& group_;
  std::shared_ptr<const std::vector<Bucket>> buckets_;  ///< shared with the optimizer's plan
  const GradReducer* reducer_ = nullptr;
  std::int64_t version_ = -1;
  const Optimizer* opt_ = nullptr;
};

}  // namespace fastlearn
