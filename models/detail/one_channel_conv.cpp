#include <fastlearn/models/detail/one_channel_conv.h>

namespace fastlearn::models {

namespace {

// Eight floats: one AVX2 register, half an AVX-512 one. Unaligned loads and stores (aligned(4)).
typedef float Vec8 __attribute__((vector_size(32), aligned(4)));

[[gnu::always_inline]] inline Vec8 load(const float* p) { return *reinterpret_cast<const Vec8*>(p); }
[[gnu::always_inline]] inline void store(float* p, Vec8 v) { *reinterpret_cast<Vec8*>(p) = v; }

constexpr int kTaps = 9;

// Output channels [channel, channel + 8 * kVecs) of the output pixels of rows [first, last), accumulated in
// registers over the nine taps.
template <int kVecs>
[[gnu::always_inline]] inline void forward_block(const OneChannelConv& c, const float* __restrict input,
                                                 const float* __restrict weight_taps, const float* __restrict bias,
                                                 float* __restrict out, std::int64_t first, std::int64_t last,
                                                 std::int64_t channel) {
  const auto channels = c.out_channels;
  for (std::int64_t row = first; row < last; ++row) {
    const auto image = row / c.out_height, out_y = row % c.out_height;
    const float* top_left = input + (image * c.padded_height + out_y * c.stride_h) * c.padded_width;
    float* out_row = out + row * c.out_width * channels + channel;
    for (std::int64_t x = 0; x < c.out_width; ++x) {
      const float* window = top_left + x * c.stride_w;
      Vec8 sum[kVecs];
      for (int v = 0; v < kVecs; ++v) sum[v] = bias ? load(bias + channel + 8 * v) : Vec8{};
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
          const float pixel = window[i * c.padded_width + j];
          const float* w = weight_taps + (i * 3 + j) * channels + channel;
          for (int v = 0; v < kVecs; ++v) sum[v] += pixel * load(w + 8 * v);
        }
      }
      for (int v = 0; v < kVecs; ++v) store(out_row + x * channels + 8 * v, sum[v]);
    }
  }
}

// The nine tap sums and the bias sum of output channels [channel, channel + 8 * kVecs), held in registers
// across all the pixels of rows [first, last).
template <int kVecs>
[[gnu::always_inline]] inline void weight_grad_block(const OneChannelConv& c, const float* __restrict input,
                                                     const float* __restrict grad_output, float* __restrict sums,
                                                     std::int64_t first, std::int64_t last, std::int64_t channel) {
  const auto channels = c.out_channels;
  Vec8 tap_sum[kTaps][kVecs] = {};
  Vec8 bias_sum[kVecs] = {};
  for (std::int64_t row = first; row < last; ++row) {
    const auto image = row / c.out_height, out_y = row % c.out_height;
    const float* top_left = input + (image * c.padded_height + out_y * c.stride_h) * c.padded_width;
    const float* grad_row = grad_output + row * c.out_width * channels + channel;
    for (std::int64_t x = 0; x < c.out_width; ++x) {
      const float* window = top_left + x * c.stride_w;
      Vec8 grad[kVecs];
      for (int v = 0; v < kVecs; ++v) {
        grad[v] = load(grad_row + x * channels + 8 * v);
        bias_sum[v] += grad[v];
      }
      for (int i = 0; i < 3; ++i) {
        for (int j = 0; j < 3; ++j) {
          const float pixel = window[i * c.padded_width + j];
          for (int v = 0; v < kVecs; ++v) tap_sum[i * 3 + j][v] += pixel * grad[v];
        }
      }
    }
  }
  for (int t = 0; t < kTaps; ++t) {
    for (int v = 0; v < kVecs; ++v) store(sums + t * channels + channel + 8 * v, tap_sum[t][v]);
  }
  for (int v = 0; v < kVecs; ++v) store(sums + kTaps * channels + channel + 8 * v, bias_sum[v]);
}

// Channel blocks of 8 * kWide where they fit, then of 8: the widest block that keeps its sums in registers.
template <int kWide>
[[gnu::always_inline]] inline void forward_rows(const OneChannelConv& c, const float* input, const float* weight_taps,
                                                const float* bias, float* out, std::int64_t first, std::int64_t last) {
  std::int64_t channel = 0;
  for (; channel + 8 * kWide <= c.out_channels; channel += 8 * kWide) {
    forward_block<kWide>(c, input, weight_taps, bias, out, first, last, channel);
  }
  for (; channel < c.out_channels; channel += 8)
    forward_block<1>(c, input, weight_taps, bias, out, first, last, channel);
}

template <int kWide>
[[gnu::always_inline]] inline void weight_grad_rows(const OneChannelConv& c, const float* input,
                                                    const float* grad_output, float* sums, std::int64_t first,
                                                    std::int64_t last) {
  std::int64_t channel = 0;
  for (; channel + 8 * kWide <= c.out_channels; channel += 8 * kWide) {
    weight_grad_block<kWide>(c, input, grad_output, sums, first, last, channel);
  }
  for (; channel < c.out_channels; channel += 8)
    weight_grad_block<1>(c, input, grad_output, sums, first, last, channel);
}

#if defined(__x86_64__)
#define FASTLEARN_X86_VARIANTS 1
// AVX-512VL gives 32 vector registers: room for two vectors of sums per tap in the weight gradient.
[[gnu::target("avx512f,avx512vl,fma")]] void forward_avx512(const OneChannelConv& c, const float* input,
                                                            const float* weight_taps, const float* bias, float* out,
                                                            std::int64_t first, std::int64_t last) {
  forward_rows<4>(c, input, weight_taps, bias, out, first, last);
}
[[gnu::target("avx512f,avx512vl,fma")]] void weight_grad_avx512(const OneChannelConv& c, const float* input,
                                                                const float* grad_output, float* sums,
                                                                std::int64_t first, std::int64_t last) {
  weight_grad_rows<2>(c, input, grad_output, sums, first, last);
}
[[gnu::target("avx2,fma")]] void forward_avx2(const OneChannelConv& c, const float* input, const float* weight_taps,
                                              const float* bias, float* out, std::int64_t first, std::int64_t last) {
  forward_rows<4>(c, input, weight_taps, bias, out, first, last);
}
[[gnu::target("avx2,fma")]] void weight_grad_avx2(const OneChannelConv& c, const float* input, const float* grad_output,
                                                  float* sums, std::int64_t first, std::int64_t last) {
  weight_grad_rows<1>(c, input, grad_output, sums, first, last);
}

#endif

}  // namespace

void one_channel_conv_forward(const OneChannelConv& c, const float* padded_input, const float* weight_taps,
                              const float* bias, float* out, std::int64_t first, std::int64_t last,
                              [[maybe_unused]] KernelIsa isa) {
#ifdef FASTLEARN_X86_VARIANTS
  const auto chosen = resolve_isa(isa);
  if (chosen == ResolvedIsa::avx512) return forward_avx512(c, padded_input, weight_taps, bias, out, first, last);
  if (chosen == ResolvedIsa::avx2) return forward_avx2(c, padded_input, weight_taps, bias, out, first, last);
#endif
  forward_rows<1>(c, padded_input, weight_taps, bias, out, first, last);
}

void one_channel_conv_weight_grad(const OneChannelConv& c, const float* padded_input, const float* grad_output,
                                  float* sums, std::int64_t first, std::int64_t last, [[maybe_unused]] KernelIsa isa) {
#ifdef FASTLEARN_X86_VARIANTS
  const auto chosen = resolve_isa(isa);
  if (chosen == ResolvedIsa::avx512) return weight_grad_avx512(c, padded_input, grad_output, sums, first, last);
  if (chosen == ResolvedIsa::avx2) return weight_grad_avx2(c, padded_input, grad_output, sums, first, last);
#endif
  weight_grad_rows<1>(c, padded_input, grad_output, sums, first, last);
}

}  // namespace fastlearn::models
