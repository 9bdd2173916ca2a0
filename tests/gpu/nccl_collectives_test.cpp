// NCCL collectives on CUDA tensors: compiled always, run where two GPUs are visible.
#include <fastlearn/comm/process_group.h>

#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "support/multiprocess.h"

namespace fl = fastlearn;
using fastlearn::testing::RankContext;

namespace {

TEST(NcclCollectives, AllreduceAndBroadcastOnTwoGpus) {
  if (!fl::backend_compiled_in(fl::BackendKind::nccl)) GTEST_SKIP() << "this build has no NCCL backend";
  const int devices = torch::cuda::device_count();  // an int8 DeviceIndex, which a stream would print as a char
  if (devices < 2) GTEST_SKIP() << "NCCL needs one GPU per rank: 2 needed, " << devices << " visible";

  fastlearn::testing::run_on_ranks(2, [](const RankContext& ctx) {
    fl::BackendOptions options;
    options.timeout = std::chrono::seconds(60);
    auto pg = fl::make_backend(fl::BackendKind::nccl, ctx.store, ctx.rank, ctx.world_size, options);
    const auto device = torch::Device(torch::kCUDA, ctx.rank);

    std::vector<at::Tensor> sum{torch::full({1024}, ctx.rank + 1.0, torch::TensorOptions().device(device))};
    pg->allreduce(sum)->wait();
    EXPECT_TRUE(torch::equal(sum[0].cpu(), torch::full({1024}, 3.0)));

    std::vector<at::Tensor> bcast{ctx.rank == 0
                                      ? torch::arange(8, torch::TensorOptions().device(device))
                                      : torch::zeros({8}, torch::TensorOptions().device(device).dtype(torch::kLong))};
    pg->broadcast(bcast)->wait();
    EXPECT_TRUE(torch::equal(bcast[0].cpu(), torch::arange(8)));
  });
}

}  // namespace
