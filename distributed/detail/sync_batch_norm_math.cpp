#include <fastlearn/distributed/detail/sync_batch_norm_math.h>

#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/models/detail/kernel_isa.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <optional>
#include <tuple>
#include <vector>

namespace fastlearn::detail {

namespace {

// (1, C, 1, ...): a per-channel vector broadcast against an input of `dim` dimensions.
std::vector<std::int64_t> channel_shape(std::int64_t dim, std::int64_t channels) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(dim), 1);
  shape[1] = channels;
  return shape;
}

// A dense tensor (N, C, ...) as rows of C channels of `inner` consecutive values each: inner = 1 in channels-last
// memory (and for (N, C)), the image's pixels in contiguous memory.
struct ChannelRows {
  std::int64_t rows = 0, channels = 0, inner = 0;
};

std::optional<ChannelRows> channel_rows(const at::Tensor& t, std::int64_t channels) {
  if (t.dim() < 2 || t.numel() == 0) return std::nullopt;
  if (t.is_contiguous()) return ChannelRows{t.size(0), channels, t.numel() / (t.size(0) * channels)};
  if ((t.dim() == 4 && t.is_contiguous(at::MemoryFormat::ChannelsLast)) ||
      (t.dim() == 5 && t.is_contiguous(at::MemoryFormat::ChannelsLast3d))) {
    return ChannelRows{t.numel() / channels, channels, 1};
  }
  return std::nullopt;
}

// The host path's elementwise passes take CPU float/double tensors of the compute dtype, of one dense layout.
std::optional<ChannelRows> fused_layout(const at::Tensor& x, const at::Tensor& other, at::ScalarType compute) {
  if (!x.is_cpu() || x.scalar_type() != compute || (compute != at::kFloat && compute != at::kDouble)) {
    return std::nullopt;
  }
  if (other.defined() && (!other.is_cpu() || other.scalar_type() != compute || other.sizes() != x.sizes() ||
                          other.strides() != x.strides())) {
    return std::nullopt;
  }
  return channel_rows(x, x.size(1));
}

// out = a * sa[c] + b * sb[c] + k[c] over every value of channel c of rows [first, last) (with kTwo false:
// a * sa[c] + k[c]). Inlined into one copy per instruction set below, where the compiler vectorizes it.
template <typename T, bool kTwo>
[[gnu::always_inline]] inline void pass_rows(const ChannelRows& l, std::int64_t first, std::int64_t last,
                                             T* __restrict out, const T* __restrict a, const T* __restrict sa,
                                             const T* __restrict b, const T* __restrict sb, const T* __restrict k) {
  const std::int64_t channels = l.channels, inner = l.inner, row = channels * inner;
  for (std::int64_t r = first; r < last; ++r) {
    T* __restrict o = out + r * row;
    const T* __restrict x = a + r * row;
    const T* __restrict y = kTwo ? b + r * row : nullptr;
    if (inner == 1) {
      for (std::int64_t c = 0; c < channels; ++c) {
        if constexpr (kTwo) {
          o[c] = x[c] * sa[c] + y[c] * sb[c] + k[c];
        } else {
          o[c] = x[c] * sa[c] + k[c];
        }
      }
      continue;
    }
    for (std::int64_t c = 0; c < channels; ++c) {
      const T s = sa[c], u = k[c], t = kTwo ? sb[c] : T(0);
      const std::int64_t p = c * inner;
      for (std::int64_t j = 0; j < inner; ++j) {
        if constexpr (kTwo) {
          o[p + j] = x[p + j] * s + y[p + j] * t + u;
        } else {
          o[p + j] = x[p + j] * s + u;
        }
      }
    }
  }
}

template <typename T, bool kTwo>
void pass_baseline(const ChannelRows& l, std::int64_t first, std::int64_t last, T* out, const T* a, const T* sa,
                   const T* b, const T* sb, const T* k) {
  pass_rows<T, kTwo>(l, first, last, out, a, sa, b, sb, k);
}
#if defined(__x86_64__)
template <typename T, bool kTwo>
[[gnu::target("avx512f,avx512vl,fma")]] void pass_avx512(const ChannelRows& l, std::int64_t first, std::int64_t last,
                                                         T* out, const T* a, const T* sa, const T* b, const T* sb,
                                                         const T* k) {
  pass_rows<T, kTwo>(l, first, last, out, a, sa, b, sb, k);
}
template <typename T, bool kTwo>
[[gnu::target("avx2,fma")]] void pass_avx2(const ChannelRows& l, std::int64_t first, std::int64_t last, T* out,
                                           const T* a, const T* sa, const T* b, const T* sb, const T* k) {
  pass_rows<T, kTwo>(l, first, last, out, a, sa, b, sb, k);
}
#endif

// The pass over all rows, in ranges of at least ~64k values (smaller ones are not worth waking a thread for), in the
// widest instruction set this CPU has.
template <typename T, bool kTwo>
void channel_pass(const ChannelRows& l, T* out, const T* a, const T* sa, const T* b, const T* sb, const T* k) {
  auto* pass = &pass_baseline<T, kTwo>;
#if defined(__x86_64__)
  switch (models::resolve_isa(models::KernelIsa::widest)) {
    case models::ResolvedIsa::avx512:
      pass = &pass_avx512<T, kTwo>;
      break;
    case models::ResolvedIsa::avx2:
      pass = &pass_avx2<T, kTwo>;
      break;
    case models::ResolvedIsa::baseline:
      break;
  }
#endif
  const std::int64_t row = l.channels * l.inner;
  const std::int64_t grain = std::max<std::int64_t>(1, (std::int64_t{1} << 16) / std::max<std::int64_t>(1, row));
  parallel_for(0, l.rows, grain,
               [&](std::int64_t first, std::int64_t last) { pass(l, first, last, out, a, sa, b, sb, k); });
}

// A CPU tensor's values as float64 on the host (a copy only where it is not float64 and contiguous already).
at::Tensor host_doubles(const at::Tensor& t) { return t.to(at::kDouble).contiguous(); }

// r = r * (1 - factor) + value * factor, computed in float64, for a CPU buffer of any floating dtype (values: one
// per element of running).
void update_running(const at::Tensor& running, const double* values, double factor) {
  if (!running.defined()) return;
  if (running.is_contiguous() && (running.scalar_type() == at::kFloat || running.scalar_type() == at::kDouble)) {
    AT_DISPATCH_FLOATING_TYPES(running.scalar_type(), "update_running", [&] {
      auto* r = running.mutable_data_ptr<scalar_t>();
      for (std::int64_t c = 0; c < running.numel(); ++c) {
        r[c] = static_cast<scalar_t>(static_cast<double>(r[c]) * (1 - factor) + values[c] * factor);
      }
    });
    running.unsafeGetTensorImpl()->bump_version();
    return;
  }
  at::NoGradGuard no_grad;
  const auto given =
      at::from_blob(const_cast<double*>(values), {running.numel()}, at::TensorOptions().dtype(at::kDouble));
  running.copy_(running.to(at::kDouble) * (1 - factor) + given * factor);
}

}  // namespace

at::Tensor local_moments(const at::Tensor& input, const at::Tensor& shift, at::ScalarType compute) {
  at::NoGradGuard no_grad;
  const auto channels = shift.size(0);
  const auto n = input.numel() / channels;  // values per channel on this rank
  if (n == 0) return at::zeros({2 * channels + 1}, shift.options());
  // ATen's BatchNorm statistics kernel (one vectorized pass per channel, contiguous or channels-last input): several
  // times faster than var_mean's float64 Welford reduction. var is the biased variance.
  const auto [mean, var] = at::batch_norm_update_stats(input.to(compute), {}, {}, 0.0);
  const auto count = static_cast<double>(n);
  auto moments = at::empty({2 * channels + 1}, shift.options());
  if (input.is_cpu()) {
    const auto m = host_doubles(mean), v = host_doubles(var), k = host_doubles(shift);
    const double *mp = m.const_data_ptr<double>(), *vp = v.const_data_ptr<double>(), *kp = k.const_data_ptr<double>();
    double* out = moments.mutable_data_ptr<double>();
    for (std::int64_t c = 0; c < channels; ++c) {
      const double d = mp[c] - kp[c];
      out[c] = d * count;
      out[channels + c] = (vp[c] + d * d) * count;
    }
    out[2 * channels] = count;
    return moments;
  }
  const auto d = mean.to(at::kDouble) - shift;
  moments.narrow(0, 0, channels).copy_(d * count);
  moments.narrow(0, channels, channels).copy_((var.to(at::kDouble) + d * d) * count);
  moments.narrow(0, 2 * channels, 1).fill_(count);
  return moments;
}

GlobalStatistics global_statistics(const at::Tensor& total, const at::Tensor& shift, double eps, double factor,
                                   const at::Tensor& running_mean, const at::Tensor& running_var,
                                   at::ScalarType compute) {
  at::NoGradGuard no_grad;
  const auto channels = shift.size(0);
  const auto count = total.narrow(0, 2 * channels, 1);
  if (total.is_cpu()) {
    const auto t = total.contiguous(), k = host_doubles(shift);
    const double* tp = t.const_data_ptr<double>();
    const double* kp = k.const_data_ptr<double>();
    const double n = tp[2 * channels];
    auto mean = at::empty({channels}, shift.options()), invstd = at::empty({channels}, shift.options());
    double* mp = mean.mutable_data_ptr<double>();
    double* ip = invstd.mutable_data_ptr<double>();
    std::vector<double> unbiased(static_cast<std::size_t>(channels));
    for (std::int64_t c = 0; c < channels; ++c) {
      const double s1 = tp[c], s2 = tp[channels + c];
      const double m2 = std::max(s2 - s1 * s1 / n, 0.0);  // sum of squared deviations from the mean
      mp[c] = kp[c] + s1 / n;
      ip[c] = 1 / std::sqrt(m2 / n + eps);
      unbiased[static_cast<std::size_t>(c)] = m2 / (n - 1);
    }
    update_running(running_mean, mp, factor);
    update_running(running_var, unbiased.data(), factor);
    return {mean.to(compute), invstd.to(compute), mean, count};
  }
  const auto s1 = total.narrow(0, 0, channels);
  const auto s2 = total.narrow(0, channels, channels);
  const auto mean = shift + s1 / count;
  const auto m2 = (s2 - s1 * s1 / count).clamp_min(0);
  if (running_mean.defined()) running_mean.copy_(running_mean.to(at::kDouble) * (1 - factor) + mean * factor);
  if (running_var.defined()) {
    running_var.copy_(running_var.to(at::kDouble) * (1 - factor) + m2 / (count - 1) * factor);
  }
  const auto invstd = (m2 / count + eps).rsqrt();
  return {mean.to(compute), invstd.to(compute), mean, count};
}

at::Tensor normalize(const at::Tensor& input, const at::Tensor& mean, const at::Tensor& invstd,
                     const at::Tensor& weight, const at::Tensor& bias) {
  const auto dtype = mean.scalar_type();
  const auto channels = mean.size(0);
  if (const auto rows = fused_layout(input, at::Tensor(), dtype)) {
    // y = x * scale + (bias - mean * scale), scale = invstd * weight: one pass.
    auto out = at::empty_like(input);
    AT_DISPATCH_FLOATING_TYPES(dtype, "sync_batch_norm_normalize", [&] {
      const auto w = weight.defined() ? weight.to(dtype).contiguous() : at::Tensor();
      const auto b = bias.defined() ? bias.to(dtype).contiguous() : at::Tensor();
      const scalar_t* mp = mean.const_data_ptr<scalar_t>();
      const scalar_t* ip = invstd.const_data_ptr<scalar_t>();
      std::vector<scalar_t> scale(static_cast<std::size_t>(channels)), shift(scale.size());
      for (std::int64_t c = 0; c < channels; ++c) {
        const auto s = ip[c] * (w.defined() ? w.const_data_ptr<scalar_t>()[c] : scalar_t(1));
        scale[c] = s;
        shift[c] = (b.defined() ? b.const_data_ptr<scalar_t>()[c] : scalar_t(0)) - mp[c] * s;
      }
      channel_pass<scalar_t, false>(*rows, out.mutable_data_ptr<scalar_t>(), input.const_data_ptr<scalar_t>(),
                                    scale.data(), nullptr, nullptr, shift.data());
    });
    return out;
  }
  const auto shape = channel_shape(input.dim(), channels);
  auto scale = weight.defined() ? invstd * weight.to(dtype) : invstd;
  auto shift = -mean * scale;
  if (bias.defined()) shift = shift + bias.to(dtype);
  return at::addcmul(shift.view(shape), input.to(dtype), scale.view(shape)).to(input.scalar_type());
}

std::pair<at::Tensor, at::Tensor> gradient_sums(const at::Tensor& dy, const at::Tensor& input, const at::Tensor& mean) {
  const auto dtype = mean.scalar_type();
  if (input.numel() == 0) return {at::zeros_like(mean), at::zeros_like(mean)};
  // One fused pass of ATen's BatchNorm backward: with a unit weight and invstd its weight and bias gradients are
  // exactly these sums.
  const auto ones = at::ones_like(mean);
  at::Tensor sum_dy, sum_dy_xmu;
  std::tie(std::ignore, sum_dy_xmu, sum_dy) =
      at::native_batch_norm_backward(dy.to(dtype), input.to(dtype), ones, /*running_mean=*/{}, /*running_var=*/{}, mean,
                                     ones, /*train=*/true, 0.0, {false, true, true});
  return {sum_dy, sum_dy_xmu};
}

at::Tensor input_gradient(const at::Tensor& dy, const at::Tensor& input, const at::Tensor& mean,
                          const at::Tensor& invstd, const at::Tensor& weight, const at::Tensor& sums,
                          const at::Tensor& count) {
  const auto dtype = mean.scalar_type();
  const auto channels = mean.size(0);
  // scale * (dy - mean_dy - (x - mean) * invstd^2 * mean_dy_xmu) = dy * scale + x * b + k, scale = invstd * weight.
  if (const auto rows = fused_layout(input, dy, dtype); rows && sums.is_cpu()) {
    auto out = at::empty_like(input);
    AT_DISPATCH_FLOATING_TYPES(dtype, "sync_batch_norm_input_gradient", [&] {
      const auto w = weight.defined() ? host_doubles(weight) : at::Tensor();
      const auto s = sums.contiguous();
      const double n = count.item<double>();
      const double* sp = s.const_data_ptr<double>();
      const scalar_t* mp = mean.const_data_ptr<scalar_t>();
      const scalar_t* ip = invstd.const_data_ptr<scalar_t>();
      std::vector<scalar_t> scale(static_cast<std::size_t>(channels)), b(scale.size()), k(scale.size());
      for (std::int64_t c = 0; c < channels; ++c) {
        const double inv = ip[c];
        const double sc = inv * (w.defined() ? w.const_data_ptr<double>()[c] : 1.0);
        const double bc = -sc * inv * inv * (sp[channels + c] / n);
        scale[c] = static_cast<scalar_t>(sc);
        b[c] = static_cast<scalar_t>(bc);
        k[c] = static_cast<scalar_t>(-sc * (sp[c] / n) - static_cast<double>(mp[c]) * bc);
      }
      channel_pass<scalar_t, true>(*rows, out.mutable_data_ptr<scalar_t>(), dy.const_data_ptr<scalar_t>(), scale.data(),
                                   input.const_data_ptr<scalar_t>(), b.data(), k.data());
    });
    return out;
  }
  const auto shape = channel_shape(input.dim(), channels);
  const auto mean_dy = (sums.narrow(0, 0, channels) / count).to(dtype);
  const auto mean_dy_xmu = (sums.narrow(0, channels, channels) / count).to(dtype);
  const auto scale = weight.defined() ? invstd * weight.to(dtype) : invstd;
  const auto b = -scale * invstd * invstd * mean_dy_xmu;
  const auto k = -scale * mean_dy - mean * b;
  return at::addcmul(k.view(shape), dy.to(dtype), scale.view(shape))
      .addcmul_(input.to(dtype), b.view(shape))
      .to(input.scalar_type());
}

}  // namespace fastlearn::detail
