#pragma once
// SyncBatchNorm's arithmetic, apart from the module: the moments each rank contributes, the global statistics
// made from their all-reduced total, and the two elementwise passes (normalize; the input gradient).
// CPU tensors take a host path: the per-channel values (C of them) in plain loops, where a tensor op per
// formula step costs more in dispatch than its arithmetic (some 45 small ops per layer and step), and each
// elementwise pass as one fused loop. Other devices stay in tensor ops and never read a value on the host.
#include <ATen/core/Tensor.h>

namespace fastlearn::detail {

/// The moments of this rank's input (N, C, ...) about `shift` (float64 (C), the previous global mean: it keeps
/// the sums of squares from cancelling when |mean| >> std), as float64 (2C + 1) on the input's device:
/// [sum (x - shift) | sum (x - shift)^2 | n], n the values per channel (all zeros when n == 0). Statistics are
/// computed in `compute` (float or double).
at::Tensor local_moments(const at::Tensor& input, const at::Tensor& shift, at::ScalarType compute);

struct GlobalStatistics {
  at::Tensor mean;    ///< (C) in the compute dtype
  at::Tensor invstd;  ///< 1 / sqrt(biased variance + eps), (C) in the compute dtype
  at::Tensor shift;   ///< the mean in float64: the next step's shift
  at::Tensor count;   ///< the global number of values per channel, float64 (1), on the device
};

/// The statistics of the global batch from the all-reduced moments (same shift). Updates running_mean and
/// running_var (where defined) as BatchNorm does, with the unbiased variance: r = r * (1 - factor) + s * factor.
GlobalStatistics global_statistics(const at::Tensor& total, const at::Tensor& shift, double eps, double factor,
                                   const at::Tensor& running_mean, const at::Tensor& running_var,
                                   at::ScalarType compute);

/// (x - mean) * invstd * weight + bias, in the input's dtype (weight, bias: undefined without affine).
at::Tensor normalize(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                     const at::Tensor& weight, const at::Tensor& bias);

/// sum(dy) and sum(dy * (x - mean)) per channel, in mean's dtype (zeros for an empty input).
std::pair<at::Tensor, at::Tensor> gradient_sums(const at::Tensor& dy, const at::Tensor& input, const at::Tensor& mean);

/// The input gradient of BatchNorm over the global batch, in the input's dtype: weight * invstd * (dy - mean_dy -
/// (x - mean) * invstd^2 * mean_dy_xmu), the two means taken from `sums` (float64 (2C): the all-reduced
/// [sum dy | sum dy * (x - mean)]) over count.
at::Tensor input_gradient(const at::Tensor& dy, const at::Tensor& input, const at::Tensor& mean,
                          const at::Tensor& invstd, const at::Tensor& weight, const at::Tensor& sums,
                          const at::Tensor& count);

}  // namespace fastlearn::detail
