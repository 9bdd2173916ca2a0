#pragma once
// What a DistributedTrainer with shard = optimizer, gradients or parameters (ZeRO stages 1 to 3) does around the
// optimizer step. Each rank owns the same part of every reducer bucket (detail/shard_layout); once the reducer's
// buckets are final, the optimizer is told which elements of each parameter this rank updates (Optimizer::shard).
// After each synchronized backward, each piece gets its gradient: its part of the parameter's averaged .grad (stage
// 1), or of the reducer's share of the bucket (stages 2 and 3: the only gradient this rank keeps). The parameters of
// each bucket are moved into one flat buffer laid out as the bucket, so that after the step the ranks' updated parts
// are all-gathered straight into every rank's parameters, a bucket at a time, without a copy.
// Stage 3 (units): the reducer keeps each unit's trainable parameters in a bucket of their own, and each unit's
// frozen parameters get a buffer of their own here; this rank keeps only its part of those buffers (the share, which
// the optimizer updates), and their memory is freed except while the unit is gathered (gather_unit / release_unit).
#include <fastlearn/distributed/detail/shard_layout.h>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

namespace c10d {
class Work;
}

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

  // --- stage 3 ---
  /// Adopts the reducer's buckets (final from the start: a unit's trainable parameters are one bucket) and one buffer
  /// more per unit for its frozen parameters (`unit_params`: each unit's parameters), keeps this rank's part of each
  /// unit's buffers and frees the rest. The parameters must be whole (outside a fit, or before its first step).
  void adopt_units(GradReducer& reducer, Optimizer& opt, const std::vector<std::vector<at::Tensor>>& unit_params);
  bool has_units() const;
  /// Unit `u`'s parameters get memory and every rank's part (collective); nothing when they are whole. A gather
  /// started by prefetch_unit is waited for (on a GPU: by the stream).
  void gather_unit(std::size_t u);
  /// Starts gathering unit `u` without waiting for it (collective; nothing when it is whole or on its way): where the
  /// backend runs collectives in the background (NCCL's stream, Gloo's threads) the transfer overlaps what runs
  /// until gather_unit(u); over shared memory it completes here.
  void prefetch_unit(std::size_t u);
  /// Frees unit `u`'s parameters' memory (its share stays).
  void release_unit(std::size_t u);
  bool unit_whole(std::size_t u) const;
  /// After a fit: every unit whole, its parameters' memory held again, the optimizer's pieces back in that memory
  /// (as with stage 1 and 2 after a fit). Collective.
  void make_whole(Optimizer& opt);
  /// When a fit failed and the other ranks may be gone (no collective): every unit's parameters get memory again,
  /// this rank's part from its share and the rest NaN, so that nothing reads freed memory. Returns whether any unit
  /// was sharded.
  bool abandon();

 private:
  struct Bucket {
    ShardedBucket layout;
    at::Tensor flat;                                             ///< the parameters' memory, padded
    std::vector<at::Tensor> params;                              ///< bucket order
    std::vector<std::pair<std::size_t, std::size_t>> opt_index;  ///< (group, index) in the optimizer, per param
    std::vector<bool> in_opt;                                    ///< whether the optimizer holds the param
    std::int64_t unit = -1;  ///< stage 3: the unit whose parameters these are; -1: whole on every rank
    bool reduced = true;     ///< a reducer bucket (false: a unit's frozen parameters)
    at::Tensor share;        ///< stage 3: this rank's part of `flat`, kept while `flat` has no memory
  };
  struct State {
    std::vector<Bucket> buckets;  ///< the reducer's, in its order, then the units' frozen buffers
    std::vector<std::vector<std::size_t>> unit_buckets;
    std::vector<bool> unit_whole;  ///< gathered, or on its way (in_flight)
    /// Per unit, the works of a prefetch not waited for yet (with the group's call number of each).
    std::vector<std::vector<std::pair<c10::intrusive_ptr<c10d::Work>, std::int64_t>>> in_flight;
  };
  // Waits for unit u's prefetch, if any (before its parameters are read or freed).
  void finish_prefetch(std::size_t u);
  void adopt(const GradReducer& reducer, Optimizer& opt);
  /// The buckets' layout, their flat buffers and the optimizer's ranges and pieces (from `share` where there is one).
  void shard_optimizer(State& state, Optimizer& opt);
  static void flatten(Bucket& b);
  // After the optimizer stepped (ShardPlan::gather_params): every rank's part of every bucket that stays whole into
  // every rank's parameters; the units' gathered parameters are out of date: freed.
  static void gather_params(State& state, Group& group);
  static void gather_bucket(const Bucket& b, Group& group);

  Group& group_;
  std::shared_ptr<State> state_;  ///< shared with the optimizer's plan
  const GradReducer* reducer_ = nullptr;
  std::int64_t version_ = -1;
  const Optimizer* opt_ = nullptr;
};

}  // namespace fastlearn
