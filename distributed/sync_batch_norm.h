#pragma once
// SyncBatchNorm: batch normalization whose training statistics are those of the global batch, the
// concatenation of every rank's batch (ranks may hold different numbers of items, even none). In eval
// mode, and when not distributed (no process group set up, or a group of one), it is exactly
// torch::nn::BatchNorm. Parameters and buffers are named as BatchNorm's, so state dicts interchange.
//
// Every rank of the group must run forward (in training mode) and backward together: each runs one
// all_reduce. Gradients: backward gives each rank the gradient of the SUM of all ranks' losses with respect
// to its own input, but weight/bias gradients of its own loss only (they are reduced later, by the data
// parallel reducer). So if each rank's loss is its share of the global mean (sum of its items' losses /
// global item count), input gradients are those of one BatchNorm on the global batch, and weight/bias
// gradients SUMMED over ranks are that BatchNorm's. A reducer that AVERAGES gradients wants each rank's loss
// scaled by the world size (the local mean when batches are equal): parameter gradients are then exact,
// activation gradients world-size times larger.
#include <fastlearn/comm/group.h>
#include <fastlearn/models/norm_layer.h>

#include <ATen/core/Tensor.h>
#include <torch/nn/cloneable.h>
#include <torch/nn/pimpl.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>

namespace fastlearn {

struct SyncBatchNormOptions {
  std::int64_t num_features = 0;         ///< C of (N, C, ...) inputs; must be > 0
  double eps = 1e-5;                     ///< added to the variance
  std::optional<double> momentum = 0.1;  ///< running-stats update factor; none: cumulative average
  bool affine = true;                    ///< learnable weight and bias
  bool track_running_stats = true;       ///< running_mean/running_var used in eval
  Group* group = nullptr;                ///< whose ranks share statistics; default: the world group
};

/// Batch normalization over the global batch of a group of ranks, for (N, C, ...) inputs of any rank >= 2.
class SyncBatchNormImpl : public torch::nn::Cloneable<SyncBatchNormImpl>, public models::NormLayer {
 public:
  explicit SyncBatchNormImpl(SyncBatchNormOptions options_);
  explicit SyncBatchNormImpl(std::int64_t num_features)
      : SyncBatchNormImpl(SyncBatchNormOptions{.num_features = num_features}) {}

  /// A SyncBatchNorm taking over a torch::nn::BatchNorm1d/2d/3d: its options, mode and its very tensors
  /// (not copies, as in PyTorch); ConfigError for any other module.
  static std::shared_ptr<SyncBatchNormImpl> from_batch_norm(const torch::nn::Module& batch_norm,
                                                            Group* group = nullptr);

  /// Normalizes `input` (N, C, ...); collective in training mode when distributed.
  at::Tensor forward(const at::Tensor& input);
  at::Tensor normalize(const at::Tensor& input) override { return forward(input); }

  /// (Re)creates parameters and buffers as BatchNorm does (weight 1, bias 0, mean 0, var 1, count 0).
  void reset() override;
  /// Running mean 0, running variance 1, num_batches_tracked 0.
  void reset_running_stats();
  /// reset_running_stats(), weight 1 and bias 0.
  void reset_parameters();
  void pretty_print(std::ostream& stream) const override;

  SyncBatchNormOptions options;
  at::Tensor weight;               ///< (C); undefined unless affine
  at::Tensor bias;                 ///< (C); undefined unless affine
  at::Tensor running_mean;         ///< (C); undefined unless track_running_stats
  at::Tensor running_var;          ///< (C); undefined unless track_running_stats
  at::Tensor num_batches_tracked;  ///< scalar int64; undefined unless track_running_stats

 private:
  struct State {
    at::Tensor weight, bias, running_mean, running_var, num_batches_tracked;
  };
  SyncBatchNormImpl(SyncBatchNormOptions options_, State state);
  void register_state(State state);
  friend void convert_sync_batchnorm(torch::nn::Module& model, Group* group);
  friend void revert_sync_batchnorm(torch::nn::Module& model);
  std::shared_ptr<torch::nn::Module> replaced_;  // the BatchNorm convert_sync_batchnorm took over, if it made this one
  // The group whose ranks share statistics in training, or null to run as plain BatchNorm.
  Group* sync_group() const;
  at::Tensor forward_distributed(const at::Tensor& input, Group& group, double factor);

  at::Tensor shift_;  // float64 (C): the previous global batch mean, the same on every rank (see forward_distributed)
};

TORCH_MODULE(SyncBatchNorm);

/// Replaces every torch::nn::BatchNorm1d/2d/3d in `model` (recursively; also inside Sequential, ModuleList
/// and ModuleDict) by a SyncBatchNorm over `group` that takes over its options, training mode and tensors,
/// so names, values and optimizers' parameter lists stay valid (still, create optimizers after converting
/// and moving the model). The model itself cannot be replaced: ConfigError if it is a BatchNorm. ConfigError,
/// before anything changes, if a BatchNorm is also held outside the module tree (typically a ModuleHolder
/// member of its parent, whose forward would keep calling the old module): declare such members as
/// SyncBatchNorm (plain BatchNorm when not distributed) or call the child through the tree.
void convert_sync_batchnorm(torch::nn::Module& model, Group* group = nullptr);

/// The inverse of convert_sync_batchnorm: every SyncBatchNorm it made in `model` gives its place back to the
/// BatchNorm it took over (which holds the same tensors, so values and optimizers' parameter lists stay valid), in
/// the SyncBatchNorm's training mode. Other modules, SyncBatchNorms made otherwise included, stay.
void revert_sync_batchnorm(torch::nn::Module& model);

}  // namespace fastlearn
