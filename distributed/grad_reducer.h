#pragma once
// GradReducer: averages gradients across the ranks of a process group during backward, so every replica
// takes the same optimizer step (what DistributedDataParallel's reducer does, written over c10d backends
// so the same code serves NCCL and Gloo).
//
// Parameters are packed, in reverse registration order (about the order backward produces gradients),
// into flat buckets: the first up to first_bucket_mb, the others up to bucket_cap_mb. A hook after each
// parameter's gradient accumulation puts the gradient, pre-divided by the world size, into its bucket and
// makes .grad a view of that part of the bucket; a full bucket starts an asynchronous all_reduce at once,
// buckets starting in order, so communication overlaps the rest of backward. At the end of backward every
// bucket is waited for, and the averaged gradients are already in .grad (no copy back; a parameter that
// cannot alias its bucket, non-contiguous or compressed, gets a copy). Gradients stay bucket views between
// steps, so zeroing in place or accumulating (no_sync) works in the bucket directly. A large gradient is a
// bucket of its own and is reduced in place, without any copy. After the first
// iteration the buckets are rebuilt in the order gradients actually arrived (rank 0's order, shared, so the
// buckets match on every rank).
#include <fastlearn/comm/group.h>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

struct GradReducerOptions {
  double first_bucket_mb = 1.0;  ///< a small first bucket starts communication early
  double bucket_cap_mb = 25.0;
  bool find_unused_parameters = false;         ///< tolerate parameters without gradient (they count as zero)
  std::optional<c10::ScalarType> compression;  ///< communicate gradients as Half or BFloat16
  bool rebuild_buckets = true;                 ///< after the first iteration, bucket in the order gradients arrived
  /// .grad becomes a view into its bucket (no copy back after the all_reduce); false keeps gradients as
  /// their own tensors, for code that replaces .grad tensors and expects them not to alias each other.
  bool gradient_as_bucket_view = true;
  /// A parameter with at least this many MiB of gradient is a bucket of its own, communicated in place in
  /// its .grad: no copy, and at this size one call's latency is small next to its transfer.
  double in_place_mb = 4.0;
  /// false when the loss that backward runs on is already divided by the world size (DistributedTrainer
  /// divides it): the reducer then only sums, which spares a pass over the gradients communicated in place.
  bool divide_by_world_size = true;
  /// true: the reduction ends in a callback of the autograd engine when backward ends, on whichever thread ran
  /// its last node. false: it ends in finish_backward(), on the caller's thread (ranks that are threads sharing
  /// one GPU share the engine's thread for it, and one must not wait there for another).
  bool finish_in_engine = true;
  /// ZeRO stage 2 (DistributedTrainerOptions::shard = "gradients"): once the buckets are final (rebuilt after the
  /// first iteration, or from the start without rebuild_buckets), each bucket is reduce-scattered instead of
  /// all-reduced, into this rank's part of it (shares()); its whole buffer lives only while it is reduced and .grad
  /// is dropped after each gradient is staged. Not with compression.
  bool scatter = false;
  /// The stop vote and, per rank, whether its backward left a parameter without gradient, in a small reduction of
  /// their own after the buckets (always with scatter): every rank then fails together, naming the parameters on
  /// the rank that left them out, instead of the others waiting out the timeout in the next step's collective.
  bool separate_verdicts = false;
  /// Sharded parameters (DistributedTrainerOptions::shard = "parameters"): per parameter given to the constructor (in
  /// its order), the unit it belongs to, or -1. A unit's trainable parameters form one bucket of their own whatever
  /// its size, so that its gradients are reduce-scattered as soon as its backward is done; the other parameters are
  /// bucketed as usual. Empty: no units.
  std::vector<std::int64_t> unit_of;
};

/// What happened in the last synchronized backward (for tests and diagnostics).
struct ReducerStats {
  std::int64_t hooks = 0;                    ///< gradients that arrived
  std::vector<std::int64_t> launched_after;  ///< per bucket, in launch order: gradients arrived when it started
  std::vector<std::int64_t> bucket_bytes;    ///< size of each bucket as communicated
  bool scattered = false;                    ///< reduce-scattered into shares() (scatter, buckets final)
};

class GradReducer {
 public:
  /// `params` (named, for messages) and `buffers` are broadcast from the group's first rank, then hooks
  /// are installed. Every rank must construct it with the same parameters in the same order.
  GradReducer(std::vector<std::pair<std::string, at::Tensor>> params, std::vector<at::Tensor> buffers, Group& group,
              GradReducerOptions options = {});
  ~GradReducer();
  GradReducer(const GradReducer&) = delete;
  GradReducer& operator=(const GradReducer&) = delete;

  /// Copies rank 0's buffers (BatchNorm statistics, ...) to every rank; data parallel training calls
  /// it before each forward.
  void broadcast_buffers();

  /// With sync false, backward accumulates gradients locally and communicates nothing (gradient
  /// accumulation: only the last micro-batch of a step needs to communicate).
  void set_sync(bool sync);
  bool sync() const;

  /// This rank's vote (e.g. "stop"), carried by the next synchronized backward as one more element of a
  /// bucket's all_reduce: agreeing costs no collective of its own. Results are kept from the first call on.
  void vote(bool yes);
  /// True when any rank voted yes in a reduction not taken yet whose result the host can read without
  /// waiting for the device: up to the last one on CPU, up to the one before it on CUDA. Every rank that
  /// calls it at the same batch gets the same answer.
  bool take_votes();

  /// Ends the reduction if the backward engine did not (no gradient arrived at all); called after backward.
  void finalize_if_pending();
  /// Ends this backward's reduction when synchronizing: waits for every bucket (the averaged gradients are then in
  /// .grad). A rank whose backward reached no parameter (its share of the batch was empty, say) still takes part,
  /// contributing what its gradients hold or zeros; `empty_share` then spares it the unused-parameter error.
  void finish_backward(bool empty_share = false);

  /// Number of buckets and their parameter counts.
  std::size_t bucket_count() const;
  /// The parameters of each bucket that holds any, in launch order and bucket order: a bucket's elements are its
  /// parameters' end to end, each in memory order.
  std::vector<std::vector<at::Tensor>> bucket_params() const;
  /// Changes whenever the buckets are rebuilt.
  std::int64_t layout_version() const;
  /// Whether the buckets will not change any more (rebuilt, or rebuild_buckets off).
  bool layout_final() const;
  /// With scatter, after a synchronized backward that reduce-scattered: this rank's part of each bucket of
  /// bucket_params() (bucket elements padded to a multiple of the group size, split evenly), summed over the
  /// backward passes since clear_shares(); empty before the buckets are final.
  const std::vector<at::Tensor>& shares() const;
  /// The next backward's shares start from zero (after the optimizer step).
  void clear_shares();
  const ReducerStats& last_stats() const;
  /// Synchronized backward passes so far.
  std::int64_t iterations() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastlearn
