// direct_conv: milliseconds of a convolution's forward, input gradient and weight gradient on fastlearn's
// channels-last kernels (models/detail/direct_conv2d.h) against torch's own (at::conv2d and at::convolution_backward
// asking for one gradient at a time: oneDNN), both on channels-last tensors, with 1 and 2 threads, the two
// interleaved call by call in rounds. Shapes: the layers of simple_cnn and conv_net on Fashion-MNIST, resnet18's at
// 128 px (vision_fine_tune) and ImageNet-size stages. Entries: direct_conv (the three parts summed over conv_net
// 32-64-128-256's convolutions after the first, batch 128, 1 thread: what a rank of time_to_accuracy runs) and
// direct_conv_2_threads (the same on 2 threads); every shape and part is listed under "shapes" of the first.
// ratio = torch / ours; "rule_takes_direct": whether models::Conv2d's rule (models/conv2d.h), which comes from
// these figures, runs the direct kernels for that shape.
#include "support/bench_support.h"
#include "support/result_row.h"

#include <fastlearn/core/cpu_memory_cache.h>
#include <fastlearn/models/conv2d.h>
#include <fastlearn/models/detail/direct_conv2d.h>

#include <torch/torch.h>

#include <array>
#include <string>
#include <vector>

namespace {

struct Shape {
  const char* what;
  std::int64_t batch, in_channels, out_channels, size, kernel, stride;
  bool headline;  // one of conv_net's layers after the first
};

constexpr std::array<const char*, 3> kParts{"forward", "input_grad", "weight_grad"};

struct Timing {
  std::array<bench::Stats, 3> torch, ours;
};

double ms_per_call(const std::function<void()>& f, int calls) {
  const auto start = bench::Clock::now();
  for (int i = 0; i < calls; ++i) f();
  return 1e3 * bench::seconds_since(start) / calls;
}

double relative_error(const at::Tensor& a, const at::Tensor& b) {
  return (a - b).abs().max().item<double>() / std::max(1e-12, b.abs().max().item<double>());
}

// The three parts of one shape, `repeats` interleaved rounds of about 0.1 s of calls each.
Timing time_shape(const Shape& s, int threads, int repeats) {
  namespace m = fastlearn::models;
  at::set_num_threads(threads);
  const auto cl = at::MemoryFormat::ChannelsLast;
  const std::vector<std::int64_t> stride{s.stride, s.stride}, padding{s.kernel / 2, s.kernel / 2};
  const auto input = torch::randn({s.batch, s.in_channels, s.size, s.size}).contiguous(cl);
  const auto weight = (torch::randn({s.out_channels, s.in_channels, s.kernel, s.kernel}) * 0.1).contiguous(cl);
  const auto output = at::conv2d(input, weight, {}, stride, padding);
  const auto grad = torch::randn_like(output).contiguous(cl);
  auto torch_backward = [&](bool input_grad) {
    const auto grads = at::convolution_backward(grad, input, weight, std::nullopt, stride, padding, {1, 1}, false,
                                                {0, 0}, 1, {input_grad, !input_grad, false});
    return input_grad ? std::get<0>(grads) : std::get<1>(grads);
  };
  const std::array<std::function<at::Tensor()>, 3> by_torch{
      [&] { return at::conv2d(input, weight, {}, stride, padding); }, [&] { return torch_backward(true); },
      [&] { return torch_backward(false); }};
  const std::array<std::function<at::Tensor()>, 3> by_ours{
      [&] { return m::direct_conv2d_output(input, weight, {}, stride, padding); },
      [&] { return m::direct_conv2d_input_grad(grad, input, weight, stride, padding); },
      [&] { return m::direct_conv2d_weight_grad(grad, input, weight, stride, padding); }};
  Timing t;
  for (std::size_t part = 0; part < kParts.size(); ++part) {
    const auto error = relative_error(by_ours[part](), by_torch[part]());
    if (error > 1e-4) {
      throw std::runtime_error(
          fmt::format("{} {}: fastlearn's and torch's results differ by {}", s.what, kParts[part], error));
    }
    const auto torch_call = [&] { by_torch[part](); };
    const auto our_call = [&] { by_ours[part](); };
    const int calls = std::clamp(static_cast<int>(100 / std::max(0.01, ms_per_call(torch_call, 2))), 2, 200);
    std::vector<double> torch_ms, our_ms;
    for (int r = 0; r < repeats; ++r) {
      torch_ms.push_back(ms_per_call(torch_call, calls));
      our_ms.push_back(ms_per_call(our_call, calls));
    }
    t.torch[part] = bench::summarize(torch_ms);
    t.ours[part] = bench::summarize(our_ms);
  }
  return t;
}

}  // namespace

int main() {
  try {
    fastlearn::enable_cpu_memory_cache();  // as in every training process
    const int repeats = bench::repeats(5);
    torch::manual_seed(0);
    const std::vector<Shape> shapes{
        {"simple_cnn 32->64 at 14x14, stride 2", 128, 32, 64, 14, 3, 2, false},
        {"simple_cnn 64->64 at 7x7, stride 2", 128, 64, 64, 7, 3, 2, false},
        {"conv_net 32->64 at 14x14, stride 2", 128, 32, 64, 14, 3, 2, true},
        {"conv_net 64->128 at 7x7, stride 2", 128, 64, 128, 7, 3, 2, true},
        {"conv_net 128->256 at 4x4, stride 2", 128, 128, 256, 4, 3, 2, true},
        {"resnet18 at 128 px: 64 at 32x32", 32, 64, 64, 32, 3, 1, false},
        {"resnet18 at 128 px: 64->128 at 32x32, stride 2", 32, 64, 128, 32, 3, 2, false},
        {"resnet18 at 128 px: 128 at 16x16", 32, 128, 128, 16, 3, 1, false},
        {"resnet18 at 128 px: 256 at 8x8", 32, 256, 256, 8, 3, 1, false},
        {"resnet18 at 128 px: 512 at 4x4", 32, 512, 512, 4, 3, 1, false},
        {"resnet18 at 128 px: 1x1 64->128, stride 2", 32, 64, 128, 32, 1, 2, false},
        {"resnet18 at 128 px: 1x1 256->512, stride 2", 32, 256, 512, 8, 1, 2, false},
        {"ImageNet: 64 at 56x56", 16, 64, 64, 56, 3, 1, false},
        {"ImageNet: 256 at 14x14", 16, 256, 256, 14, 3, 1, false},
        {"5x5 32->32 at 16x16", 32, 32, 32, 16, 5, 1, false},
    };
    auto listed = nlohmann::ordered_json::array();
    std::array<std::array<double, 2>, 2> headline{};                       // [threads - 1][torch, ours]: summed medians
    std::array<std::array<std::array<double, 2>, 2>, 2> headline_range{};  // [threads - 1][torch, ours][min, max]
    for (const int threads : {1, 2}) {
      for (const auto& s : shapes) {
        const auto t = time_shape(s, threads, repeats);
        const auto out_side = (s.size + 2 * (s.kernel / 2) - s.kernel) / s.stride + 1;
        for (std::size_t part = 0; part < kParts.size(); ++part) {
          listed.push_back({{"what", s.what},
                            {"part", kParts[part]},
                            {"batch", s.batch},
                            {"in", s.in_channels},
                            {"out", s.out_channels},
                            {"size", s.size},
                            {"kernel", s.kernel},
                            {"stride", s.stride},
                            {"threads", threads},
                            {"torch_ms", bench::rounded(t.torch[part].median, 3)},
                            {"ours_ms", bench::rounded(t.ours[part].median, 3)},
                            {"ratio", bench::rounded(t.torch[part].median / t.ours[part].median, 2)},
                            {"rule_takes_direct", fastlearn::models::uses_direct_conv(out_side * out_side)}});
          fmt::print(stderr, "{:48} {:11} {} thread(s): torch {:8.3f} ms, ours {:8.3f} ms, {:.2f}x\n", s.what,
                     kParts[part], threads, t.torch[part].median, t.ours[part].median,
                     t.torch[part].median / t.ours[part].median);
          if (s.headline) {
            auto& sum = headline[threads - 1];
            auto& range = headline_range[threads - 1];
            sum[0] += t.torch[part].median;
            sum[1] += t.ours[part].median;
            range[0][0] += t.torch[part].min;
            range[0][1] += t.torch[part].max;
            range[1][0] += t.ours[part].min;
            range[1][1] += t.ours[part].max;
          }
        }
      }
    }
    const auto entry = [&](const std::string& name, int threads) {
      const auto& sum = headline[threads - 1];
      const auto& range = headline_range[threads - 1];
      return bench::Row(name, {sum[1], range[1][0], range[1][1]}, {sum[0], range[0][0], range[0][1]}, "ms", false, 3)
          .set("threads", threads)
          .set("repeats", repeats)
          .set("what",
               "forward + input gradient + weight gradient of conv_net 32-64-128-256's convolutions after the first "
               "(batch 128, channels-last): models/detail/direct_conv2d vs at::conv2d / at::convolution_backward "
               "(oneDNN), summed medians");
    };
    fmt::print("{}\n",
               bench::results_line({entry("direct_conv", 1).set("shapes", listed), entry("direct_conv_2_threads", 2)}));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "direct_conv: {}\n", e.what());
    return 1;
  }
}
