// conv_weight_grad: milliseconds of one convolution weight gradient computed as models::Conv2d computes it
// where its rule says so (conv2d_weight_grad_by_patches: one matrix product over the input's patches) against
// torch's own (at::convolution_backward with only the weight gradient asked for: oneDNN), channels-last, on
// the shapes that set the rule (models/conv2d.h), with 1 and 2 threads, interleaved. Entries:
// conv_weight_grad (conv_net's last layer, 128 -> 256 channels at 4x4 -> 2x2, 1 thread: what a rank of
// time_to_accuracy runs) and conv_weight_grad_2_threads (the same layer on 2 threads); every shape is listed
// under "shapes" of the first, with whether the rule takes the patch product there. ratio = torch / ours.
#include "support/bench_support.h"
#include "support/result_row.h"

#include <fastlearn/core/detail/mkl_dispatch.h>
#include <fastlearn/models/conv2d.h>

#include <torch/torch.h>

#include <string>
#include <vector>

namespace {

struct Shape {
  std::int64_t batch, in_channels, out_channels, size, kernel, stride;
};

struct Timing {
  bench::Stats torch, patches;
  bool rule = false;
};

// Both weight gradients of one shape, `repeats` interleaved rounds of `calls` calls each, ms per call.
Timing time_shape(const Shape& s, int threads, int repeats) {
  at::set_num_threads(threads);
  const auto padding = s.kernel / 2;
  const auto cl = at::MemoryFormat::ChannelsLast;
  auto input = torch::randn({s.batch, s.in_channels, s.size, s.size}).contiguous(cl);
  auto weight = (torch::randn({s.out_channels, s.in_channels, s.kernel, s.kernel}) * 0.1).contiguous(cl);
  const auto out_size = (s.size + 2 * padding - s.kernel) / s.stride + 1;
  auto grad = torch::randn({s.batch, s.out_channels, out_size, out_size}).contiguous(cl);
  auto by_torch = [&] {
    return std::get<1>(at::convolution_backward(grad, input, weight, std::nullopt, {s.stride, s.stride},
                                                {padding, padding}, {1, 1}, false, {0, 0}, 1, {false, true, false}));
  };
  auto by_patches = [&] {
    return fastlearn::models::conv2d_weight_grad_by_patches(grad, input, {s.kernel, s.kernel}, {s.stride, s.stride},
                                                            {padding, padding});
  };
  const auto expected = by_torch();
  const auto error = (by_patches() - expected).abs().max().item<double>() / expected.abs().max().item<double>();
  if (error > 1e-4) throw std::runtime_error(fmt::format("conv_weight_grad: the two gradients differ by {}", error));
  auto ms_per_call = [](const auto& f, int calls) {
    const auto start = bench::Clock::now();
    for (int i = 0; i < calls; ++i) f();
    return 1e3 * bench::seconds_since(start) / calls;
  };
  const int calls = std::clamp(static_cast<int>(100 / std::max(0.01, ms_per_call(by_torch, 2))), 2, 200);  // ~0.1 s
  std::vector<double> torch_ms, patch_ms;
  for (int r = 0; r < repeats; ++r) {
    torch_ms.push_back(ms_per_call(by_torch, calls));
    patch_ms.push_back(ms_per_call(by_patches, calls));
  }
  return {bench::summarize(torch_ms), bench::summarize(patch_ms),
          fastlearn::models::uses_patch_weight_grad(s.in_channels, s.out_channels, s.kernel, s.kernel,
                                                    out_size * out_size)};
}

bench::Row entry(const std::string& name, const Timing& t, int threads, int repeats) {
  return bench::Row(name, t.patches, t.torch, "ms", false, 3)
      .set("threads", threads)
      .set("repeats", repeats)
      .set("what",
           "weight gradient of conv_net's last convolution (128 -> 256 channels, 3x3 stride 2, 4x4 -> 2x2, batch 128, "
           "channels-last): models::Conv2d's patch product vs at::convolution_backward (oneDNN)");
}

}  // namespace

int main() {
  try {
    fastlearn::mkl_chooses_by_features();  // the products run on the MKL kernels a training process gets
    const int repeats = bench::repeats(7);
    torch::manual_seed(0);
    // conv_net's and simple_cnn's layers on Fashion-MNIST (shapes[4]: conv_net's last, the headline), then
    // larger feature maps, ImageNet-size stages, resnet18's last two stages at 128 px (vision_fine_tune) and a
    // 2x2 output with fewer channels.
    constexpr std::size_t headline = 4;
    const std::vector<Shape> shapes{{128, 1, 32, 28, 3, 2},   {128, 32, 64, 14, 3, 2},  {128, 64, 64, 7, 3, 2},
                                    {128, 64, 128, 7, 3, 2},  {128, 128, 256, 4, 3, 2}, {128, 64, 64, 8, 3, 1},
                                    {128, 256, 256, 2, 3, 1}, {128, 64, 128, 8, 1, 2},  {16, 64, 64, 56, 3, 1},
                                    {16, 256, 256, 14, 3, 1}, {32, 512, 512, 7, 3, 1},  {128, 3, 32, 32, 3, 1},
                                    {16, 3, 64, 224, 7, 2},   {16, 64, 128, 56, 3, 2},  {16, 128, 128, 28, 3, 1},
                                    {32, 256, 256, 8, 3, 1},  {32, 512, 512, 4, 3, 1},  {128, 64, 128, 4, 3, 2}};
    auto listed = nlohmann::ordered_json::array();
    Timing at_threads[2];  // the headline shape on 1 and 2 threads
    for (const int threads : {1, 2}) {
      for (std::size_t i = 0; i < shapes.size(); ++i) {
        const auto& s = shapes[i];
        const auto t = time_shape(s, threads, repeats);
        if (i == headline) at_threads[threads - 1] = t;
        listed.push_back({{"batch", s.batch},
                          {"in", s.in_channels},
                          {"out", s.out_channels},
                          {"size", s.size},
                          {"kernel", s.kernel},
                          {"stride", s.stride},
                          {"threads", threads},
                          {"torch_ms", bench::rounded(t.torch.median, 3)},
                          {"patches_ms", bench::rounded(t.patches.median, 3)},
                          {"ratio", bench::rounded(t.torch.median / t.patches.median, 2)},
                          {"rule_takes_patches", t.rule}});
      }
    }
    fmt::print("{}\n", bench::results_line({entry("conv_weight_grad", at_threads[0], 1, repeats).set("shapes", listed),
                                            entry("conv_weight_grad_2_threads", at_threads[1], 2, repeats)}));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "conv_weight_grad: {}\n", e.what());
    return 1;
  }
}
