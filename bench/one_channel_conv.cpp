// one_channel_conv: milliseconds of one training pass (forward, then the weight and bias gradients) of
// simple_cnn's first layer (1 -> 32 channels, 3x3, stride 2, padding 1, 28x28 grey images, batch 128) in a
// channels-last model, as models::Conv2d runs it: its own one-channel kernels (models/detail/one_channel_conv.h)
// against the same module with FASTLEARN_ONE_CHANNEL_CONV=0 (torch's convolution: oneDNN), the switch flipped between
// interleaved rounds in one process. Also the forward alone under no_grad (validation's pass), both ways.
// Entries: one_channel_conv (1 thread: a rank of time_to_accuracy) and one_channel_conv_2_threads.
// ratio = torch / ours.
#include "support/bench_support.h"
#include "support/result_row.h"

#include <fastlearn/models/conv2d.h>
#include <fastlearn/models/memory_format.h>

#include <torch/torch.h>

#include <cstdlib>
#include <string>
#include <vector>

namespace {

struct Timing {
  bench::Stats torch, ours, torch_forward, ours_forward;
};

double ms_per_call(const std::function<void()>& f, int calls) {
  const auto start = bench::Clock::now();
  for (int i = 0; i < calls; ++i) f();
  return 1e3 * bench::seconds_since(start) / calls;
}

void use_own_kernels(bool on) { setenv("FASTLEARN_ONE_CHANNEL_CONV", on ? "1" : "0", 1); }

Timing time_layer(int threads, int repeats) {
  at::set_num_threads(threads);
  torch::manual_seed(0);
  fastlearn::models::Conv2d conv(torch::nn::Conv2dOptions(1, 32, 3).stride(2).padding(1));
  fastlearn::models::to_channels_last(*conv);
  const auto images = fastlearn::models::as_channels_last(torch::randn({128, 1, 28, 28}));
  const auto upstream = torch::randn({128, 32, 14, 14}).contiguous(at::MemoryFormat::ChannelsLast);
  auto train_pass = [&] {
    conv->zero_grad();
    conv->forward(images).backward(upstream);
  };
  auto forward_only = [&] {
    const torch::NoGradGuard no_grad;
    conv->forward(images);
  };
  // The two paths agree before anything is timed.
  std::vector<at::Tensor> outputs, grads;
  for (const bool own : {false, true}) {
    use_own_kernels(own);
    train_pass();
    outputs.push_back(conv->forward(images).detach());
    grads.push_back(conv->weight.grad().clone());
  }
  const auto error = [](const at::Tensor& a, const at::Tensor& b) {
    return (a - b).abs().max().item<double>() / b.abs().max().item<double>();
  };
  if (error(outputs[1], outputs[0]) > 1e-5 || error(grads[1], grads[0]) > 1e-4)
    throw std::runtime_error("the two paths' outputs or weight gradients differ");
  use_own_kernels(false);
  const int calls = std::clamp(static_cast<int>(100 / std::max(0.01, ms_per_call(train_pass, 3))), 3, 300);  // ~0.1 s
  std::vector<double> torch_ms, ours_ms, torch_fwd, ours_fwd;
  for (int r = 0; r < repeats; ++r) {
    use_own_kernels(false);
    torch_ms.push_back(ms_per_call(train_pass, calls));
    torch_fwd.push_back(ms_per_call(forward_only, calls));
    use_own_kernels(true);
    ours_ms.push_back(ms_per_call(train_pass, calls));
    ours_fwd.push_back(ms_per_call(forward_only, calls));
  }
  unsetenv("FASTLEARN_ONE_CHANNEL_CONV");
  return {bench::summarize(torch_ms), bench::summarize(ours_ms), bench::summarize(torch_fwd),
          bench::summarize(ours_fwd)};
}

bench::Row entry(const std::string& name, const Timing& t, int threads, int repeats) {
  return bench::Row(name, t.ours, t.torch, "ms", false, 3)
      .set("ours_forward", t.ours_forward.median, 3)
      .set("anchor_forward", t.torch_forward.median, 3)
      .set("forward_ratio", t.torch_forward.median / t.ours_forward.median, 3)
      .set("threads", threads)
      .set("repeats", repeats)
      .set("what",
           "forward + weight and bias gradients of simple_cnn's first layer (1 -> 32, 3x3 stride 2, 28x28, batch 128, "
           "channels-last): models::Conv2d's one-channel kernels vs FASTLEARN_ONE_CHANNEL_CONV=0 (torch's "
           "convolution, oneDNN); *_forward: the forward alone under no_grad");
}

}  // namespace

int main() {
  try {
    const int repeats = bench::repeats(7);
    const auto one = time_layer(1, repeats);
    const auto two = time_layer(2, repeats);
    fmt::print("{}\n", bench::results_line({entry("one_channel_conv", one, 1, repeats),
                                            entry("one_channel_conv_2_threads", two, 2, repeats)}));
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "one_channel_conv: {}\n", e.what());
    return 1;
  }
}
