#include <fastlearn/models/detail/direct_conv.h>

#include <algorithm>
#include <iterator>
#include <vector>

namespace fastlearn::models {

namespace {

// Vectors of 16 floats (one AVX-512 register) and of 8 (one AVX2 register, two SSE ones). Unaligned loads and
// stores (aligned(4)).
struct Lanes16 {
  typedef float Vec __attribute__((vector_size(64), aligned(4)));
  static constexpr int kWidth = 16;
};
struct Lanes8 {
  typedef float Vec __attribute__((vector_size(32), aligned(4)));
  static constexpr int kWidth = 8;
};

template <class L>
[[gnu::always_inline]] inline typename L::Vec load(const float* p) {
  return *reinterpret_cast<const typename L::Vec*>(p);
}
template <class L>
[[gnu::always_inline]] inline void store(float* p, typename L::Vec v) {
  *reinterpret_cast<typename L::Vec*>(p) = v;
}

// The shape of one register block: kRows pixels (or, in the weight gradient, output channels) times kVecs
// vectors of channels. kRows * kVecs sums plus kVecs operands fit the instruction set's registers.
template <class L, int kRows, int kVecs>
struct Block {
  using Lanes = L;
  static constexpr int kR = kRows, kV = kVecs, kChannels = kVecs * L::kWidth;
};

// The pixels along one dimension (output rows, say) that the same taps reach: taps first_tap, first_tap + step,
// ... (tap_count of them) fall inside the image for every coordinate of the class. Grouping pixels by their
// row and column classes leaves the padding out of the products instead of multiplying zeros.
struct AxisClass {
  std::int64_t first_tap = 0, tap_count = 0;
  std::vector<std::int64_t> coords;
};

// Adds `coord` to the class of its taps (first, count), making the class if it is new.
void add_to_class(std::vector<AxisClass>& classes, std::int64_t first, std::int64_t count, std::int64_t coord) {
  if (count <= 0) first = count = 0;
  for (auto& k : classes) {
    if (k.first_tap == first && k.tap_count == count) {
      k.coords.push_back(coord);
      return;
    }
  }
  classes.push_back({first, count, {coord}});
}

// Forward: output coordinate o reads input o * stride - pad + tap, inside [0, in_size) for taps [first, last).
std::vector<AxisClass> forward_axis(std::int64_t out_size, std::int64_t in_size, std::int64_t kernel,
                                    std::int64_t stride, std::int64_t pad) {
  std::vector<AxisClass> classes;
  for (std::int64_t o = 0; o < out_size; ++o) {
    const auto first = std::max<std::int64_t>(0, pad - o * stride);
    const auto last = std::min<std::int64_t>(kernel, in_size + pad - o * stride);
    add_to_class(classes, first, last - first, o);
  }
  return classes;
}

// The input coordinates phase, phase + stride, ... (along one dimension) of a stride phase.
std::int64_t phase_count(std::int64_t size, std::int64_t stride, std::int64_t phase) {
  return phase < size ? (size - phase + stride - 1) / stride : 0;
}

// Input gradient: input coordinate y of the phase is reached by the taps t = y + pad (mod stride) whose output
// coordinate (y + pad - t) / stride lies in [0, out_size).
std::vector<AxisClass> input_grad_axis(std::int64_t phase, std::int64_t in_size, std::int64_t out_size,
                                       std::int64_t kernel, std::int64_t stride, std::int64_t pad) {
  std::vector<AxisClass> classes;
  const auto residue = (phase + pad) % stride;
  for (std::int64_t m = 0; m < phase_count(in_size, stride, phase); ++m) {
    const auto y = phase + m * stride;
    const auto lowest = y + pad - stride * (out_size - 1);  // the smallest tap whose output is inside
    auto first = residue;
    if (first < lowest) first += (lowest - first + stride - 1) / stride * stride;
    const auto last = std::min(kernel - 1, y + pad);  // inclusive
    add_to_class(classes, first, first <= last ? (last - first) / stride + 1 : 0, y);
  }
  return classes;
}

// acc[r] = start + sum over taps t < tap_count and k < depth of (base[r] + offset[t])[k * step] * weight(t)[k * ldb,
// + kChannels): kR pixels that share their taps. start is out[r] itself when `accumulate` (a later slice of the
// depth), else init (or zeros where init is null). out[r] receives pixel r's sums. step is 1 unless kStrided (an
// NCHW input: its channels are step apart).
template <class B, bool kStrided, class TapWeights>
[[gnu::always_inline]] inline void window_product(const float* const* base, const std::int64_t* offset,
                                                  std::int64_t tap_count, const TapWeights& weight, std::int64_t depth,
                                                  std::int64_t ldb, std::int64_t step, bool accumulate,
                                                  const float* init, float* const* out) {
  using L = typename B::Lanes;
  using Vec = typename L::Vec;
  Vec acc[B::kR][B::kV];
  for (int v = 0; v < B::kV; ++v) {
    const Vec start = init ? load<L>(init + v * L::kWidth) : Vec{};
    for (int r = 0; r < B::kR; ++r) acc[r][v] = start;
  }
  if (accumulate) {  // a separate pass: a select between the two starts keeps the compiler from holding the sums in
                     // registers
    for (int r = 0; r < B::kR; ++r) {
      for (int v = 0; v < B::kV; ++v) acc[r][v] = load<L>(out[r] + v * L::kWidth);
    }
  }
  for (std::int64_t t = 0; t < tap_count; ++t) {
    const float* __restrict b = weight(t);
    const float* a[B::kR];
    for (int r = 0; r < B::kR; ++r) a[r] = base[r] + offset[t];
    for (std::int64_t k = 0; k < depth; ++k) {
      Vec bv[B::kV];
      for (int v = 0; v < B::kV; ++v) bv[v] = load<L>(b + k * ldb + v * L::kWidth);
      for (int r = 0; r < B::kR; ++r) {
        const float x = a[r][kStrided ? k * step : k];
        for (int v = 0; v < B::kV; ++v) acc[r][v] += x * bv[v];
      }
    }
  }
  for (int r = 0; r < B::kR; ++r) {
    for (int v = 0; v < B::kV; ++v) store<L>(out[r] + v * L::kWidth, acc[r][v]);
  }
}

// The pixels of a convolution's sums (output pixels in the forward, one phase's input pixels in the input
// gradient) in the kernels' order: by row class, then column class, then (image, row, column). `visit` gets
// runs of at most kR pixels of one class that fall in [first, last): the class pair and the pixels' (image, row,
// column).
template <int kR, class Visit>
void for_pixel_blocks(const std::vector<AxisClass>& rows, const std::vector<AxisClass>& cols, std::int64_t images,
                      std::int64_t first, std::int64_t last, Visit&& visit) {
  std::int64_t start = 0;  // of the current class pair in the order
  for (const auto& row_class : rows) {
    for (const auto& col_class : cols) {
      const auto per_image = static_cast<std::int64_t>(row_class.coords.size() * col_class.coords.size());
      const auto count = images * per_image;
      const auto begin = std::max(first, start), end = std::min(last, start + count);
      for (auto p = begin; p < end; p += kR) {
        std::int64_t n[kR], y[kR], x[kR];
        const int pixels = static_cast<int>(std::min<std::int64_t>(kR, end - p));
        for (int r = 0; r < kR; ++r) {
          const auto q = p - start + std::min(r, pixels - 1);  // past the run: the run's last pixel again
          n[r] = q / per_image;
          y[r] = row_class.coords[static_cast<std::size_t>(q % per_image / std::ssize(col_class.coords))];
          x[r] = col_class.coords[static_cast<std::size_t>(q % std::ssize(col_class.coords))];
        }
        visit(row_class, col_class, pixels, n, y, x);
      }
      start += count;
    }
  }
}

// The weights a block of B::kChannels outputs reads per slice of the depth (the summed-over channels) stay in
// the core's cache while every pixel block of a thread's share goes through them: slices of at most this many
// bytes of weights.
constexpr std::int64_t kWeightSliceBytes = std::int64_t{256} << 10;

template <class B>
std::int64_t depth_slice(std::int64_t depth, std::int64_t taps) {
  const auto fit = kWeightSliceBytes / (taps * B::kChannels * static_cast<std::int64_t>(sizeof(float)));
  return std::clamp<std::int64_t>(fit / 16 * 16, 16, depth);
}

// Forward: for every block of B::kChannels output channels and slice of the input channels, blocks of B::kR
// output pixels. kStrided: the input is NCHW (c.input_nchw).
template <class B, bool kStrided>
[[gnu::always_inline]] inline void forward_pixels(const DirectConv& c, const float* input, const float* weight_hwio,
                                                  const float* bias, float* out, std::int64_t first,
                                                  std::int64_t last) {
  std::vector<float> scratch(static_cast<std::size_t>(c.out_channels));  // the sums of rows past a run's end
  const auto rows = forward_axis(c.out_height, c.in_height, c.kernel_h, c.stride_h, c.pad_h);
  const auto cols = forward_axis(c.out_width, c.in_width, c.kernel_w, c.stride_w, c.pad_w);
  const auto slice = depth_slice<B>(c.in_channels, c.taps());
  std::int64_t offset[kMaxDirectConvTaps], tap_index[kMaxDirectConvTaps];
  for (std::int64_t o = 0; o < c.out_channels; o += B::kChannels) {
    for (std::int64_t ch = 0; ch < c.in_channels; ch += slice) {
      const auto depth = std::min(slice, c.in_channels - ch);
      for_pixel_blocks<B::kR>(
          rows, cols, c.images, first, last,
          [&](const AxisClass& row_class, const AxisClass& col_class, int pixels, const std::int64_t* n,
              const std::int64_t* y, const std::int64_t* x) {
            std::int64_t taps = 0;
            for (std::int64_t a = 0; a < row_class.tap_count; ++a) {
              for (std::int64_t b = 0; b < col_class.tap_count; ++b, ++taps) {
                offset[taps] = a * c.in_row_stride() + b * c.in_column_stride() + ch * c.in_channel_stride();
                tap_index[taps] = (row_class.first_tap + a) * c.kernel_w + col_class.first_tap + b;
              }
            }
            const float* base[B::kR];
            float* outs[B::kR];
            for (int r = 0; r < B::kR; ++r) {
              const auto top = y[r] * c.stride_h - c.pad_h + row_class.first_tap;
              const auto left = x[r] * c.stride_w - c.pad_w + col_class.first_tap;
              // A pixel that no tap reaches (a kernel over padding alone) gets the bias and reads nothing.
              base[r] = taps > 0
                            ? input + n[r] * c.in_image_stride() + top * c.in_row_stride() + left * c.in_column_stride()
                            : input;
              outs[r] = r < pixels ? out + ((n[r] * c.out_height + y[r]) * c.out_width + x[r]) * c.out_channels + o
                                   : scratch.data() + o;
            }
            const auto weight = [&](std::int64_t t) {
              return weight_hwio + (tap_index[t] * c.in_channels + ch) * c.out_channels + o;
            };
            window_product<B, kStrided>(base, offset, taps, weight, depth, c.out_channels, c.in_channel_stride(),
                                        ch > 0, bias ? bias + o : nullptr, outs);
          });
    }
  }
}

// Input gradient: for every block of B::kChannels input channels and slice of the output channels, blocks of
// B::kR input pixels of one stride phase.
template <class B>
[[gnu::always_inline]] inline void input_grad_pixels(const DirectConv& c, const float* grad_output,
                                                     const float* weight_ohwi, float* grad_input, std::int64_t phase,
                                                     std::int64_t first, std::int64_t last) {
  std::vector<float> scratch(static_cast<std::size_t>(c.in_channels));
  const auto phase_y = phase / c.stride_w, phase_x = phase % c.stride_w;
  const auto rows = input_grad_axis(phase_y, c.in_height, c.out_height, c.kernel_h, c.stride_h, c.pad_h);
  const auto cols = input_grad_axis(phase_x, c.in_width, c.out_width, c.kernel_w, c.stride_w, c.pad_w);
  const auto slice = depth_slice<B>(c.out_channels, c.taps());
  std::int64_t offset[kMaxDirectConvTaps], tap_index[kMaxDirectConvTaps];
  for (std::int64_t ch = 0; ch < c.in_channels; ch += B::kChannels) {
    for (std::int64_t o = 0; o < c.out_channels; o += slice) {
      const auto depth = std::min(slice, c.out_channels - o);
      for_pixel_blocks<B::kR>(
          rows, cols, c.images, first, last,
          [&](const AxisClass& row_class, const AxisClass& col_class, int pixels, const std::int64_t* n,
              const std::int64_t* y, const std::int64_t* x) {
            // Each next tap along a dimension reaches the output pixel one before.
            std::int64_t taps = 0;
            for (std::int64_t a = 0; a < row_class.tap_count; ++a) {
              for (std::int64_t b = 0; b < col_class.tap_count; ++b, ++taps) {
                offset[taps] = -(a * c.out_width + b) * c.out_channels + o;
                tap_index[taps] =
                    (row_class.first_tap + a * c.stride_h) * c.kernel_w + col_class.first_tap + b * c.stride_w;
              }
            }
            const float* base[B::kR];
            float* outs[B::kR];
            for (int r = 0; r < B::kR; ++r) {
              const auto oy = (y[r] + c.pad_h - row_class.first_tap) / c.stride_h;
              const auto ox = (x[r] + c.pad_w - col_class.first_tap) / c.stride_w;
              base[r] = taps > 0 ? grad_output + ((n[r] * c.out_height + oy) * c.out_width + ox) * c.out_channels
                                 : grad_output;
              outs[r] = r < pixels ? grad_input + ((n[r] * c.in_height + y[r]) * c.in_width + x[r]) * c.in_channels + ch
                                   : scratch.data() + ch;
            }
            const auto ldb = c.taps() * c.in_channels;
            const auto weight = [&](std::int64_t t) {
              return weight_ohwi + o * ldb + tap_index[t] * c.in_channels + ch;
            };
            window_product<B, false>(base, offset, taps, weight, depth, ldb, 1, o > 0, nullptr, outs);
          });
    }
  }
}

// The (input pixel, output pixel) offsets under each tap for a run of output pixels; pixels whose tap falls in
// the padding are left out.
struct TapPairs {
  std::vector<std::int64_t> input_offset, grad_offset;  // [tap * capacity + k]
  std::vector<std::int64_t> count;                      // per tap
  std::int64_t capacity = 0;
};

// Weight gradient sums of input channels [ch, ch + kRows) and output channels [o, o + kChannels) under tap t,
// over the tap's pairs: acc (in grad_weight_hwio) += input[pixel under t, ch + r] * grad_output[pixel, o...].
// The kRows input values of a pixel are adjacent (kStrided: c.in_channel_stride() apart): one pointer serves them.
template <class B, bool kStrided, int kRows>
[[gnu::always_inline]] inline void weight_grad_tile(const DirectConv& c, const float* input, const float* grad_output,
                                                    const TapPairs& pairs, std::int64_t t, std::int64_t ch,
                                                    std::int64_t o, float* grad_weight_hwio) {
  using L = typename B::Lanes;
  using Vec = typename L::Vec;
  float* tile = grad_weight_hwio + (t * c.in_channels + ch) * c.out_channels + o;
  Vec acc[kRows][B::kV];
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < B::kV; ++v) acc[r][v] = load<L>(tile + r * c.out_channels + v * L::kWidth);
  }
  const std::int64_t* in_offset = pairs.input_offset.data() + t * pairs.capacity;
  const std::int64_t* grad_offset = pairs.grad_offset.data() + t * pairs.capacity;
  const auto step = c.in_channel_stride();
  const float* in = input + ch * step;
  const float* grad = grad_output + o;
  for (std::int64_t k = 0; k < pairs.count[t]; ++k) {
    const float* __restrict x = in + in_offset[k];
    const float* __restrict g = grad + grad_offset[k];
    Vec gv[B::kV];
    for (int v = 0; v < B::kV; ++v) gv[v] = load<L>(g + v * L::kWidth);
    for (int r = 0; r < kRows; ++r) {
      const float xr = x[kStrided ? r * step : r];
      for (int v = 0; v < B::kV; ++v) acc[r][v] += xr * gv[v];
    }
  }
  for (int r = 0; r < kRows; ++r) {
    for (int v = 0; v < B::kV; ++v) store<L>(tile + r * c.out_channels + v * L::kWidth, acc[r][v]);
  }
}

// The weight gradient's remainder rows (fewer than B::kR input channels), one instantiation per count.
template <class B, bool kStrided, int kRows = B::kR - 1>
[[gnu::always_inline]] inline void weight_grad_rest(int rows, const DirectConv& c, const float* input,
                                                    const float* grad_output, const TapPairs& pairs, std::int64_t t,
                                                    std::int64_t ch, std::int64_t o, float* grad_weight_hwio) {
  if constexpr (kRows > 0) {
    if (rows == kRows) {
      return weight_grad_tile<B, kStrided, kRows>(c, input, grad_output, pairs, t, ch, o, grad_weight_hwio);
    }
    weight_grad_rest<B, kStrided, kRows - 1>(rows, c, input, grad_output, pairs, t, ch, o, grad_weight_hwio);
  }
}

// Weight gradient: runs of output pixels small enough that their input and output gradients stay in cache while
// every tile of the gradient takes its sums over them. kStrided: the input is NCHW (c.input_nchw).
template <class B, bool kStrided>
[[gnu::always_inline]] inline void weight_grad_pixels(const DirectConv& c, const float* input, const float* grad_output,
                                                      float* grad_weight_hwio, std::int64_t first, std::int64_t last) {
  std::fill(grad_weight_hwio, grad_weight_hwio + c.out_channels * c.taps() * c.in_channels, 0.0f);
  constexpr std::int64_t kRun = 256;
  TapPairs pairs;
  pairs.capacity = kRun;
  pairs.input_offset.resize(static_cast<std::size_t>(c.taps() * kRun));
  pairs.grad_offset.resize(static_cast<std::size_t>(c.taps() * kRun));
  pairs.count.resize(static_cast<std::size_t>(c.taps()));
  const auto map = c.out_height * c.out_width;
  for (std::int64_t start = first; start < last; start += kRun) {
    const auto end = std::min(last, start + kRun);
    std::fill(pairs.count.begin(), pairs.count.end(), 0);
    for (std::int64_t q = start; q < end; ++q) {
      const auto n = q / map, top = (q % map) / c.out_width * c.stride_h - c.pad_h,
                 left = q % c.out_width * c.stride_w - c.pad_w;
      for (std::int64_t i = 0; i < c.kernel_h; ++i) {
        const auto y = top + i;
        if (y < 0 || y >= c.in_height) continue;
        for (std::int64_t j = 0; j < c.kernel_w; ++j) {
          const auto x = left + j;
          if (x < 0 || x >= c.in_width) continue;
          const auto t = i * c.kernel_w + j;
          const auto k = pairs.count[t]++;
          pairs.input_offset[t * kRun + k] = n * c.in_image_stride() + y * c.in_row_stride() + x * c.in_column_stride();
          pairs.grad_offset[t * kRun + k] = q * c.out_channels;
        }
      }
    }
    for (std::int64_t t = 0; t < c.taps(); ++t) {
      for (std::int64_t o = 0; o < c.out_channels; o += B::kChannels) {
        std::int64_t ch = 0;
        for (; ch + B::kR <= c.in_channels; ch += B::kR) {
          weight_grad_tile<B, kStrided, B::kR>(c, input, grad_output, pairs, t, ch, o, grad_weight_hwio);
        }
        if (ch < c.in_channels) {
          weight_grad_rest<B, kStrided>(static_cast<int>(c.in_channels - ch), c, input, grad_output, pairs, t, ch, o,
                                        grad_weight_hwio);
        }
      }
    }
  }
}

// One instruction set's kernels: blocks of 4, 2 or 1 vectors of channels (the widest the channel count divides
// into), each with as many pixels (forward, input gradient) or input channels (weight gradient) as the
// registers hold. The forward and input gradient blocks read each pixel through a pointer of its own, so their
// pixel counts also keep those pointers in general-purpose registers.
template <class L, int kPixels4, int kPixels2, int kPixels1, int kRows4, int kRows2, int kRows1>
struct Kernels {
  template <class F>
  [[gnu::always_inline]] static void by_width(std::int64_t channels, bool weight_grad, F&& f) {
    if (channels % (4 * L::kWidth) == 0) {
      return weight_grad ? f(Block<L, kRows4, 4>{}) : f(Block<L, kPixels4, 4>{});
    }
    if (channels % (2 * L::kWidth) == 0) {
      return weight_grad ? f(Block<L, kRows2, 2>{}) : f(Block<L, kPixels2, 2>{});
    }
    weight_grad ? f(Block<L, kRows1, 1>{}) : f(Block<L, kPixels1, 1>{});
  }
  [[gnu::always_inline]] static void forward(const DirectConv& c, const float* input, const float* weight_hwio,
                                             const float* bias, float* out, std::int64_t first, std::int64_t last) {
    by_width(c.out_channels, false, [&](auto block) {
      if (c.input_nchw) return forward_pixels<decltype(block), true>(c, input, weight_hwio, bias, out, first, last);
      forward_pixels<decltype(block), false>(c, input, weight_hwio, bias, out, first, last);
    });
  }
  [[gnu::always_inline]] static void input_grad(const DirectConv& c, const float* grad_output, const float* weight_ohwi,
                                                float* grad_input, std::int64_t phase, std::int64_t first,
                                                std::int64_t last) {
    by_width(c.in_channels, false, [&](auto block) {
      input_grad_pixels<decltype(block)>(c, grad_output, weight_ohwi, grad_input, phase, first, last);
    });
  }
  [[gnu::always_inline]] static void weight_grad(const DirectConv& c, const float* input, const float* grad_output,
                                                 float* grad_weight_hwio, std::int64_t first, std::int64_t last) {
    by_width(c.out_channels, true, [&](auto block) {
      if (c.input_nchw) {
        return weight_grad_pixels<decltype(block), true>(c, input, grad_output, grad_weight_hwio, first, last);
      }
      weight_grad_pixels<decltype(block), false>(c, input, grad_output, grad_weight_hwio, first, last);
    });
  }
};

// Plain code: 8-float vectors (two SSE registers each).
using Baseline = Kernels<Lanes8, 1, 2, 4, 1, 2, 4>;

#if defined(__x86_64__)
#define FASTLEARN_X86_VARIANTS 1
// AVX-512: 32 vector registers, up to 24 of them sums (64 channels x 6 pixels, 32 x 8, 16 x 8; the weight
// gradient 64 x 6 input channels, 32 x 8, 16 x 16: 8 rows of 32 ran 2.3x faster than 12, which leave a remainder).
using Avx512 = Kernels<Lanes16, 6, 8, 8, 6, 8, 16>;
// AVX2: 16 vector registers, up to 12 of them sums.
using Avx2 = Kernels<Lanes8, 3, 6, 8, 3, 6, 12>;

#define FASTLEARN_TARGET_AVX512 [[gnu::target("avx512f,avx512vl,fma")]]
#define FASTLEARN_TARGET_AVX2 [[gnu::target("avx2,fma")]]
FASTLEARN_TARGET_AVX512 void forward_avx512(const DirectConv& c, const float* input, const float* weight_hwio,
                                            const float* bias, float* out, std::int64_t first, std::int64_t last) {
  Avx512::forward(c, input, weight_hwio, bias, out, first, last);
}
FASTLEARN_TARGET_AVX2 void forward_avx2(const DirectConv& c, const float* input, const float* weight_hwio,
                                        const float* bias, float* out, std::int64_t first, std::int64_t last) {
  Avx2::forward(c, input, weight_hwio, bias, out, first, last);
}
FASTLEARN_TARGET_AVX512 void input_grad_avx512(const DirectConv& c, const float* grad_output, const float* weight_ohwi,
                                               float* grad_input, std::int64_t phase, std::int64_t first,
                                               std::int64_t last) {
  Avx512::input_grad(c, grad_output, weight_ohwi, grad_input, phase, first, last);
}
FASTLEARN_TARGET_AVX2 void input_grad_avx2(const DirectConv& c, const float* grad_output, const float* weight_ohwi,
                                           float* grad_input, std::int64_t phase, std::int64_t first,
                                           std::int64_t last) {
  Avx2::input_grad(c, grad_output, weight_ohwi, grad_input, phase, first, last);
}
FASTLEARN_TARGET_AVX512 void weight_grad_avx512(const DirectConv& c, const float* input, const float* grad_output,
                                                float* grad_weight_hwio, std::int64_t first, std::int64_t last) {
  Avx512::weight_grad(c, input, grad_output, grad_weight_hwio, first, last);
}
FASTLEARN_TARGET_AVX2 void weight_grad_avx2(const DirectConv& c, const float* input, const float* grad_output,
                                            float* grad_weight_hwio, std::int64_t first, std::int64_t last) {
  Avx2::weight_grad(c, input, grad_output, grad_weight_hwio, first, last);
}
#endif

}  // namespace

bool direct_conv_supports(const DirectConv& c) {
  return c.in_channels > 0 && c.out_channels > 0 && c.in_channels % 16 == 0 && c.out_channels % 16 == 0 &&
         c.kernel_h > 0 && c.kernel_w > 0 && c.taps() <= kMaxDirectConvTaps && c.stride_h > 0 && c.stride_w > 0 &&
         c.pad_h >= 0 && c.pad_w >= 0 && c.pad_h < c.kernel_h && c.pad_w < c.kernel_w && c.out_height > 0 &&
         c.out_width > 0;
}

void direct_conv_forward(const DirectConv& c, const float* input, const float* weight_hwio, const float* bias,
                         float* out, std::int64_t first, std::int64_t last, KernelIsa isa) {
#ifdef FASTLEARN_X86_VARIANTS
  const auto chosen = resolve_isa(isa);
  if (chosen == ResolvedIsa::avx512) return forward_avx512(c, input, weight_hwio, bias, out, first, last);
  if (chosen == ResolvedIsa::avx2) return forward_avx2(c, input, weight_hwio, bias, out, first, last);
#else
  (void)isa;
#endif
  Baseline::forward(c, input, weight_hwio, bias, out, first, last);
}

std::int64_t direct_conv_phase_pixels(const DirectConv& c, std::int64_t phase) {
  return c.images * phase_count(c.in_height, c.stride_h, phase / c.stride_w) *
         phase_count(c.in_width, c.stride_w, phase % c.stride_w);
}

void direct_conv_input_grad(const DirectConv& c, const float* grad_output, const float* weight_ohwi, float* grad_input,
                            std::int64_t phase, std::int64_t first, std::int64_t last, KernelIsa isa) {
#ifdef FASTLEARN_X86_VARIANTS
  const auto chosen = resolve_isa(isa);
  if (chosen == ResolvedIsa::avx512)
    return input_grad_avx512(c, grad_output, weight_ohwi, grad_input, phase, first, last);
  if (chosen == ResolvedIsa::avx2) return input_grad_avx2(c, grad_output, weight_ohwi, grad_input, phase, first, last);
#else
  (void)isa;
#endif
  Baseline::input_grad(c, grad_output, weight_ohwi, grad_input, phase, first, last);
}

void direct_conv_weight_grad(const DirectConv& c, const float* input, const float* grad_output, float* grad_weight_hwio,
                             std::int64_t first, std::int64_t last, KernelIsa isa) {
#ifdef FASTLEARN_X86_VARIANTS
  const auto chosen = resolve_isa(isa);
  if (chosen == ResolvedIsa::avx512) return weight_grad_avx512(c, input, grad_output, grad_weight_hwio, first, last);
  if (chosen == ResolvedIsa::avx2) return weight_grad_avx2(c, input, grad_output, grad_weight_hwio, first, last);
#else
  (void)isa;
#endif
  Baseline::weight_grad(c, input, grad_output, grad_weight_hwio, first, last);
}

}  // namespace fastlearn::models
