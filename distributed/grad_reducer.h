#pragma once
// GradReducer: averages gradients across the ranks of a process group during backward, so every replica
// takes the same optimizer step (what DistributedDataParallel's reducer does, written over c10d backends
// so the same code serves NCCL and Gloo).
//
// Parameters are packed, in reverse registration order (about the order backward produces gradients),
// into flat buckets: the first up to first_bucket_mb, the others up to bucket_cap_mb. A hook after each
// parameter's gradient accumulation copies the gradient, pre-divided by the world size, into its bucket;
// a full bucket starts an asynchronous all_reduce at once, buckets starting in order, so communication
// overlaps the rest of backward. At the end of backward every bucket is waited for and the averaged
// gradients are written back into .grad. After the first iteration the buckets are rebuilt in the order
// gradients actually arrived (rank 0's order, shared, so the buckets match on every rank).
#include <fastlearn/distributed/group.h>

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
  bool find_unused_parameters = false;  ///< tolerate parameters without gradient (they count as zero)
  std::optional<c10::ScalarType> compression;  ///< communicate gradients as Half or BFloat16
  bool rebuild_buckets = true;  ///< after the first iteration, bucket in the order gradients arrived
};

/// What happened in the last synchronized backward (for tests and diagnostics).
struct ReducerStats {
  std::int64_t hooks = 0;                    ///< gradients that arrived
  std::vector<std::int64_t> launched_after;  ///< per bucket, in launch order: gradients arrived when it started
  std::vector<std::int64_t> bucket_bytes;    ///< size of each bucket as communicated
};

class GradReducer {
 public:
  /// `params` (named, for messages) and `buffers` are broadcast from the group's first rank, then hooks
  /// are installed. Every rank must construct it with the same parameters in the same order.
  GradReducer(std::vector<std::pair<std::string, at::Tensor>> params, std::vector<at::Tensor> buffers,
              Group& group, GradReducerOptions options = {});
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

  /// Ends the reduction if the backward engine did not (no gradient arrived at all); called after backward.
  void finalize_if_pending();

  /// Number of buckets and their parameter counts.
  std::size_t bucket_count() const;
  const ReducerStats& last_stats() const;
  /// Synchronized backward passes so far.
  std::int64_t iterations() const;

  class Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace fastlearn
