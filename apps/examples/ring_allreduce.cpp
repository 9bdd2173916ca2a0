// The ring allreduce of the PyTorch tutorial "Writing distributed applications", written with fastlearn's
// point-to-point API and chunked as in Baidu's DeepSpeech: the tensor is cut into one chunk per rank;
// world_size - 1 reduce-scatter steps pass and add chunks around the ring, then world_size - 1 all-gather
// steps pass the finished chunks on. Each rank sends and receives only 2 * (n - 1) / n of the data.
// The result is checked against all_reduce.
//   fastlearn launch --nproc-per-node 3 build/bin/ring_allreduce [--numel N]
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/p2p.h>
#include <fastlearn/distributed/distrib_ctx.h>

#include <fmt/format.h>
#include <torch/torch.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace fl = fastlearn;

// Sends `out` to the right neighbour and receives `in` from the left one. Even ranks send first, odd ranks receive
// first, so that every send meets a receive already posted: where a send waits for its receive (NCCL above its
// eager size, whose sends and receives between two ranks also share one stream), two ranks that both send first
// would wait for each other for ever.
void pass_right(const at::Tensor& out, int right, const at::Tensor& in, int left, int tag) {
  if (fl::rank() % 2 == 0) {
    fl::send(out, right, tag);
    fl::recv(in, left, tag);
  } else {
    fl::recv(in, left, tag);
    fl::send(out, right, tag);
  }
}

// Sums `tensor` over every rank, in place.
void ring_allreduce(const at::Tensor& tensor) {
  const int n = fl::world_size(), r = fl::rank();
  if (n == 1) return;
  auto chunks = tensor.view(-1).tensor_split(n);
  const int right = (r + 1) % n, left = (r + n - 1) % n;
  auto incoming = torch::empty_like(chunks[0]);
  // Reduce-scatter: at step s, send chunk (r - s) and add the received one into chunk (r - s - 1).
  for (int s = 0; s < n - 1; ++s) {
    const auto& out = chunks[static_cast<std::size_t>((r - s + n) % n)];
    const auto& into = chunks[static_cast<std::size_t>((r - s - 1 + n) % n)];
    auto buffer = incoming.narrow(0, 0, into.numel());
    pass_right(out.contiguous(), right, buffer, left, s);
    into.add_(buffer);
  }
  // All-gather: rank r now holds the full sum of chunk (r + 1); pass finished chunks around the ring.
  for (int s = 0; s < n - 1; ++s) {
    const auto& out = chunks[static_cast<std::size_t>((r + 1 - s + n) % n)];
    const auto& into = chunks[static_cast<std::size_t>((r - s + n) % n)];
    auto buffer = incoming.narrow(0, 0, into.numel());
    pass_right(out.contiguous(), right, buffer, left, n + s);
    into.copy_(buffer);
  }
}

int main(int argc, char** argv) {
  try {
    const std::int64_t numel = argc > 2 && std::string(argv[1]) == "--numel" ? std::stoll(argv[2]) : 1000003;
    fl::DistribCtx ctx;
    torch::manual_seed(fl::rank());
    // On the backend's device: a GPU per rank with NCCL, the CPU with Gloo.
    auto data = torch::randn({numel}, torch::kFloat64).to(fl::distrib_device());
    auto ring = data.clone();
    auto reference = data.clone();
    ring_allreduce(ring);
    fl::all_reduce(reference);
    const double diff = (ring - reference).abs().max().item<double>();
    fmt::print("rank {} of {}: ring allreduce of {} values, max |ring - all_reduce| = {:.3g}\n", fl::rank(),
               fl::world_size(), numel, diff);
    if (diff > 1e-9) {
      std::cerr << "ring_allreduce: the ring result differs from all_reduce\n";
      return 1;
    }
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "ring_allreduce: error: " << e.what() << "\n";
    return 1;
  }
}
