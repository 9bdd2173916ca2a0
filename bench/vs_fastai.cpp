// vs_fastai: train samples/s of one epoch of fastlearn's Learner.fit(1) against fastai's Learner.fit(1)
// (bench/python/epoch_server.py --side fastai: fastai DataLoaders over the same Fashion-MNIST tensors, the
// same simple_cnn as an nn.Module, fastai's Adam, accuracy, no progress bar), on CPU with the same items,
// batch size and threads. ratio = ours / anchor. vs_fastai_channels_last: the same with each library's
// ChannelsLast callback on both sides. vs_fastai_defaults: each library as it trains simple_cnn by default
// (fastlearn train's channels_last = "auto" turns ChannelsLast on for conv models; fastai stays contiguous), in an
// interleaved run of its own: a ratio of two runs would compare moments the machine ran at different speeds.
// Prints one JSON object.
#include "support/epoch_vs_python.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  try {
    const int n = bench::repeats(5);
    const auto cnn = bench::compare_epochs("fastai", "simple_cnn", data, n);
    const auto cnn_cl = bench::compare_epochs("fastai", "simple_cnn", data, n, /*channels_last=*/true);
    const auto defaults = bench::compare_epochs("fastai", "simple_cnn", data, n, /*channels_last=*/true,
                                                /*anchor_channels_last=*/false);
    fmt::print(
        "{}\n",
        bench::results_line(
            {bench::epoch_json("vs_fastai", cnn, "Learner.fit(1) vs fastai Learner.fit(1), simple_cnn, CPU"),
             bench::epoch_json(
                 "vs_fastai_channels_last", cnn_cl,
                 "the same with both sides in channels-last memory format (each library's ChannelsLast callback)"),
             bench::epoch_json("vs_fastai_defaults", defaults,
                               "each side's default layout for simple_cnn: ours channels-last (fastlearn train's "
                               "channels_last = auto), fastai contiguous")}));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "vs_fastai: " << e.what() << "\n";
    return 1;
  }
}
