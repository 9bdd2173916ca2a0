// vs_pytorch_loop: train samples/s of one epoch of fastlearn's Learner.fit(1) against a plain Python
// PyTorch loop (bench/python/epoch_server.py --side torch), for simple_cnn (key vs_pytorch_loop) and a
// 784-512-256-10 MLP (key vs_pytorch_loop_mlp); same items, batch, optimizer settings and threads.
// ratio = ours / anchor. Prints one JSON object.
#include "support/epoch_vs_python.h"

#include <iostream>

int main(int argc, char** argv) {
  const std::string data = argc > 1 ? argv[1] : "/usr/share/datasets/fashion-mnist";
  try {
    const int n = bench::repeats(5);
    const auto cnn = bench::compare_epochs("torch", "simple_cnn", data, n);
    const auto mlp = bench::compare_epochs("torch", "mlp", data, n);
    fmt::print("{}\n",
               bench::results_line(
                   {bench::epoch_json("vs_pytorch_loop", cnn,
                                      "Learner.fit(1) vs a plain Python PyTorch loop (torch.optim.AdamW), simple_cnn"),
                    bench::epoch_json(
                        "vs_pytorch_loop_mlp", mlp,
                        "Learner.fit(1) vs a plain Python PyTorch loop (torch.optim.AdamW), mlp 784-512-256-10")}));
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "vs_pytorch_loop: " << e.what() << "\n";
    return 1;
  }
}
