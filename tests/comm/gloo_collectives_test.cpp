// c10d collectives over ProcessGroupGloo on CPU tensors, 2 and 3 ranks in separate processes.
#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include "support/multiprocess.h"

namespace fl = fastlearn;
using fastlearn::testing::RankContext;
using fastlearn::testing::run_on_ranks;

namespace {

c10::intrusive_ptr<c10d::Backend> gloo(const RankContext& ctx) {
  fl::BackendOptions options;
  options.timeout = std::chrono::seconds(30);
  return fl::make_backend(fl::BackendKind::gloo, ctx.store, ctx.rank, ctx.world_size, options);
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, AllreduceSumAddsEveryRanksTensor) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = gloo(ctx);
    // rank r contributes (r + 1) * [1, 2, ..., 5], as float and as int64
    std::vector<at::Tensor> tensors{torch::arange(1, 6, torch::kFloat32) * (ctx.rank + 1)};
    pg->allreduce(tensors)->wait();
    const int n = ctx.world_size;
    const double factor = n * (n + 1) / 2.0;
    EXPECT_TRUE(torch::equal(tensors[0], torch::arange(1, 6, torch::kFloat32) * factor)) << tensors[0];

    std::vector<at::Tensor> ints{torch::full({3, 2}, ctx.rank, torch::kLong)};
    pg->allreduce(ints)->wait();
    EXPECT_TRUE(torch::equal(ints[0], torch::full({3, 2}, static_cast<std::int64_t>(n * (n - 1) / 2), torch::kLong)));
  });
}

TEST_P(GlooCollectives, BroadcastCopiesTheRootsTensorToEveryRank) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = gloo(ctx);
    for (int root = 0; root < ctx.world_size; ++root) {
      auto expected = torch::arange(0, 12, torch::kFloat64).reshape({3, 4}) + 100.0 * root;
      std::vector<at::Tensor> tensors{ctx.rank == root ? expected.clone() : torch::zeros({3, 4}, torch::kFloat64)};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      pg->broadcast(tensors, options)->wait();
      EXPECT_TRUE(torch::equal(tensors[0], expected)) << "root " << root << " rank " << ctx.rank << "\n" << tensors[0];
    }
  });
}

TEST_P(GlooCollectives, AllgatherCollectsEachRanksTensorInRankOrder) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = gloo(ctx);
    std::vector<at::Tensor> input{torch::tensor({ctx.rank * 10, ctx.rank * 10 + 1}, torch::kInt32)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < ctx.world_size; ++r) output[0].push_back(torch::empty({2}, torch::kInt32));
    pg->allgather(output, input)->wait();
    for (int r = 0; r < ctx.world_size; ++r) {
      EXPECT_TRUE(torch::equal(output[0][r], torch::tensor({r * 10, r * 10 + 1}, torch::kInt32)))
          << "slot " << r << " on rank " << ctx.rank << ": " << output[0][r];
    }
  });
}

TEST_P(GlooCollectives, BarrierHoldsEveryRankUntilAllArrive) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = gloo(ctx);
    // The last rank arrives late; no rank may pass the barrier before it has announced itself.
    const int last = ctx.world_size - 1;
    if (ctx.rank == last) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ctx.store->set("late_rank_arrived", std::vector<uint8_t>{1});
    }
    pg->barrier()->wait();
    EXPECT_TRUE(ctx.store->check({"late_rank_arrived"})) << "rank " << ctx.rank << " passed the barrier early";
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(2, 3),
                         [](const auto& param_info) { return std::to_string(param_info.param) + "ranks"; });

TEST(MakeBackend, RejectsARankOutsideTheWorld) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  try {
    fl::make_backend(fl::BackendKind::gloo, store, 2, 2);
    FAIL() << "rank 2 of 2 was accepted";
  } catch (const fl::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 2 is out of range for world size 2"), std::string::npos) << e.what();
  }
}

TEST(MakeBackend, ParsesBackendNamesAndRejectsOthers) {
  EXPECT_EQ(fl::parse_backend_kind("gloo"), fl::BackendKind::gloo);
  EXPECT_EQ(fl::parse_backend_kind("nccl"), fl::BackendKind::nccl);
  EXPECT_THROW(fl::parse_backend_kind("mpi"), fl::ConfigError);
  EXPECT_TRUE(fl::backend_compiled_in(fl::BackendKind::gloo));
}

}  // namespace
