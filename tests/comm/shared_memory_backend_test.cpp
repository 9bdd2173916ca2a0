// The shared memory backend for ranks on one host: results, chunking, delegation to Gloo, and how a wait
// ends when a peer dies, hangs or gives up. The flat reduce_scatter and all_gather_into of sharded training on it,
// on plain Gloo and on the threads backend of in-process replicas.
#include <fastlearn/comm/detail/shared_memory_backend.h>
#include <fastlearn/comm/detail/threads_backend.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/error.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <chrono>
#include <filesystem>
#include <thread>

#include "support/multiprocess.h"

namespace fl = fastlearn;
using fastlearn::testing::RankContext;
using fastlearn::testing::run_on_ranks;
using fastlearn::testing::run_ranks;

namespace {

c10::intrusive_ptr<c10d::Backend> local_backend(const RankContext& ctx, std::chrono::milliseconds timeout,
                                                bool shared_memory = true) {
  fl::BackendOptions options;
  options.timeout = timeout;
  options.shared_memory = shared_memory;
  auto store = c10::make_intrusive<c10d::PrefixStore>(shared_memory ? "shm/" : "tcp/", ctx.store);
  return fl::make_backend(fl::BackendKind::gloo, store, ctx.rank, ctx.world_size, options);
}

// What rank r contributes: the same on every rank that asks.
at::Tensor contribution(int r, std::int64_t n, at::ScalarType dtype) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + r);
  if (at::isIntegralType(dtype, false)) return torch::randint(-50, 50, {n}, generator, torch::dtype(dtype));
  return (torch::rand({n}, generator, torch::kFloat64) * 2 + 0.5).to(dtype);
}

at::Tensor fold(const c10d::ReduceOp::RedOpType op, const at::Tensor& a, const at::Tensor& b) {
  switch (op) {
    case c10d::ReduceOp::SUM:
      return a + b;
    case c10d::ReduceOp::PRODUCT:
      return a * b;
    case c10d::ReduceOp::MIN:
      return torch::minimum(a, b);
    default:
      return torch::maximum(a, b);
  }
}

class SharedMemoryCollectives : public ::testing::TestWithParam<int> {};

TEST_P(SharedMemoryCollectives, AllReduceGivesTheRankOrderFoldBitForBitAcrossChunks) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = local_backend(ctx, std::chrono::seconds(30));
    ASSERT_EQ(pg->getBackendName(), fl::shared_memory_backend_name);
    // 300,000 floats are 1.2 MB: more than one 1 MiB slot, so the tensor goes through in two chunks.
    for (const std::int64_t n : {1, 7, 300'000}) {
      for (const auto dtype : {torch::kFloat32, torch::kFloat64, torch::kBFloat16, torch::kInt64, torch::kInt32}) {
        for (const auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::PRODUCT, c10d::ReduceOp::MIN, c10d::ReduceOp::MAX}) {
          auto expected = contribution(0, n, dtype);
          for (int r = 1; r < ctx.world_size; ++r) expected = fold(op, expected, contribution(r, n, dtype));
          std::vector<at::Tensor> tensors{contribution(ctx.rank, n, dtype).view({n})};
          c10d::AllreduceOptions options;
          options.reduceOp = op;
          pg->allreduce(tensors, options)->wait();
          EXPECT_TRUE(torch::equal(tensors[0], expected))
              << "n " << n << " " << dtype << " op " << static_cast<int>(op) << " rank " << ctx.rank;
        }
      }
    }
  });
}

TEST_P(SharedMemoryCollectives, BroadcastAndBarrierBehaveAsGloos) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = local_backend(ctx, std::chrono::seconds(30));
    for (int root = 0; root < ctx.world_size; ++root) {
      const auto expected = contribution(root, 700'000, torch::kFloat32).reshape({700, 1000});  // 2.8 MB: 3 chunks
      std::vector<at::Tensor> tensors{ctx.rank == root ? expected.clone() : torch::zeros({700, 1000})};
      c10d::BroadcastOptions options;
      options.rootRank = root;
      pg->broadcast(tensors, options)->wait();
      EXPECT_TRUE(torch::equal(tensors[0], expected)) << "root " << root << " rank " << ctx.rank;
    }
    const int last = ctx.world_size - 1;
    if (ctx.rank == last) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      ctx.store->set("late_rank_arrived", std::vector<uint8_t>{1});
    }
    pg->barrier()->wait();
    EXPECT_TRUE(ctx.store->check({"late_rank_arrived"})) << "rank " << ctx.rank << " passed the barrier early";
  });
}

TEST_P(SharedMemoryCollectives, WhatItDoesNotHandleGoesToGloo) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = local_backend(ctx, std::chrono::seconds(30));
    // A non-contiguous tensor, a bool tensor and an allgather: all through the wrapped Gloo backend.
    auto base = torch::arange(0, 12, torch::kFloat32).reshape({3, 4}) * (ctx.rank + 1);
    std::vector<at::Tensor> strided{base.t()};
    pg->allreduce(strided)->wait();
    const double factor = ctx.world_size * (ctx.world_size + 1) / 2.0;
    EXPECT_TRUE(torch::equal(base, torch::arange(0, 12, torch::kFloat32).reshape({3, 4}) * factor));
    std::vector<at::Tensor> input{torch::tensor({ctx.rank}, torch::kInt32)};
    std::vector<std::vector<at::Tensor>> output(1);
    for (int r = 0; r < ctx.world_size; ++r) output[0].push_back(torch::empty({1}, torch::kInt32));
    pg->allgather(output, input)->wait();
    for (int r = 0; r < ctx.world_size; ++r) EXPECT_EQ(output[0][r].item<int>(), r);
  });
}

// Each rank's input holds one part per rank; part r of every input, folded in rank order, lands in rank r's output,
// bit for bit, also when the output is a view of the rank's own part of its input (ZeRO's gradient shards) and when
// a part spans several slots. all_gather_into lays every rank's input end to end, also into a view that holds the
// rank's own input. The same through plain Gloo (shared_memory off), whose ring sums in another order.
TEST_P(SharedMemoryCollectives, ReduceScatterAndAllGatherIntoGiveEachRankItsPartAcrossChunks) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    for (const bool shared_memory : {true, false}) {
      auto pg = local_backend(ctx, std::chrono::seconds(30), shared_memory);
      const auto w = ctx.world_size;
      for (const std::int64_t n : {1, 7, 300'000}) {
        for (const auto dtype : {torch::kFloat32, torch::kFloat64, torch::kInt64}) {
          for (const auto op : {c10d::ReduceOp::SUM, c10d::ReduceOp::MIN, c10d::ReduceOp::MAX}) {
            if (!shared_memory && (n == 7 || dtype == torch::kInt64)) continue;  // Gloo: a quicker sample
            const auto part = [&](int rank, int r) { return contribution(rank, n * w, dtype).narrow(0, r * n, n); };
            auto expected = part(0, ctx.rank);
            for (int k = 1; k < w; ++k) expected = fold(op, expected, part(k, ctx.rank));
            c10d::ReduceScatterOptions options;
            options.reduceOp = op;
            auto input = contribution(ctx.rank, n * w, dtype);
            auto output = torch::zeros({n}, dtype);
            pg->_reduce_scatter_base(output, input, options)->wait();
            // Gloo's ring sums in its own order: the same within rounding, not bit for bit.
            const bool same = shared_memory ? torch::equal(output, expected) : torch::allclose(output, expected);
            EXPECT_TRUE(same) << "n " << n << " " << dtype << " op " << static_cast<int>(op) << " rank " << ctx.rank
                              << " shm " << shared_memory;
            if (!shared_memory) continue;
            auto in_place = input.clone();
            auto own = in_place.narrow(0, ctx.rank * n, n);
            pg->_reduce_scatter_base(own, in_place, options)->wait();
            EXPECT_TRUE(torch::equal(own, expected)) << "in place: n " << n << " rank " << ctx.rank;
          }
          auto gathered = torch::zeros({n * w}, dtype);
          auto mine = contribution(ctx.rank, n, dtype);
          pg->_allgather_base(gathered, mine)->wait();
          for (int k = 0; k < w; ++k)
            EXPECT_TRUE(torch::equal(gathered.narrow(0, k * n, n), contribution(k, n, dtype)))
                << "n " << n << " part " << k;
          auto whole = torch::zeros({n * w}, dtype);
          auto view = whole.narrow(0, ctx.rank * n, n);
          view.copy_(mine);
          pg->_allgather_base(whole, view)->wait();
          EXPECT_TRUE(torch::equal(whole, gathered)) << "in place: n " << n << " rank " << ctx.rank;
        }
      }
    }
  });
}

TEST_P(SharedMemoryCollectives, TheSegmentLeavesNothingInDevShm) {
  run_on_ranks(GetParam(), [](const RankContext& ctx) {
    auto pg = local_backend(ctx, std::chrono::seconds(30));
    pg->barrier()->wait();
    if (ctx.rank != 0) return;
    const auto prefix = "fastlearn-" + std::to_string(::getpid()) + "-";
    for (const auto& entry : std::filesystem::directory_iterator("/dev/shm")) {
      EXPECT_NE(entry.path().filename().string().rfind(prefix, 0), 0U) << entry.path() << " was left behind";
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, SharedMemoryCollectives, ::testing::Values(2, 3),
                         [](const auto& param_info) { return std::to_string(param_info.param) + "Ranks"; });

TEST(SharedMemoryBackend, IsOnlyUsedWhenAsked) {
  run_on_ranks(2, [](const RankContext& ctx) {
    auto pg = local_backend(ctx, std::chrono::seconds(30), /*shared_memory=*/false);
    EXPECT_EQ(pg->getBackendName(), "gloo");
    // Neither rank exits while the other may still be completing Gloo's connections to it (a rank that left at
    // once closed them under its peer: "Connection closed by peer", seen once in a CI run).
    pg->barrier()->wait();
  });
}

// rank 0 waits in an all_reduce that rank 1 never joins: it must fail within `max_wait` with `expected_text`.
void expect_rank0_fails(const std::function<void(const RankContext&, c10d::Backend&)>& rank1,
                        std::chrono::milliseconds timeout, std::chrono::milliseconds max_wait,
                        const std::string& expected_text) {
  const auto results = run_ranks(2, [&](const RankContext& ctx) {
    auto pg = local_backend(ctx, timeout);
    pg->barrier()->wait();
    if (ctx.rank == 1) return rank1(ctx, *pg);
    std::vector<at::Tensor> tensors{torch::ones({4})};
    const auto start = std::chrono::steady_clock::now();
    try {
      pg->allreduce(tensors)->wait();
      ADD_FAILURE() << "the all_reduce returned without rank 1";
    } catch (const std::exception& e) {
      const auto waited = std::chrono::steady_clock::now() - start;
      EXPECT_NE(std::string(e.what()).find(expected_text), std::string::npos) << e.what();
      EXPECT_LT(waited, max_wait) << e.what();
    }
  });
  ASSERT_EQ(results.size(), 2U);
  EXPECT_TRUE(results[0].passed) << results[0].summary() << "\n" << results[0].output;
}

TEST(SharedMemoryBackend, AWaitForARankWhoseProcessEndedFailsAtOnce) {
  // A 10 minute timeout: the error must come from noticing the dead process, not from the timeout.
  expect_rank0_fails([](const RankContext&, c10d::Backend&) { std::_Exit(0); }, std::chrono::minutes(10),
                     std::chrono::seconds(5), "has ended");
}

TEST(SharedMemoryBackend, AWaitForARankThatHangsEndsAtTheTimeout) {
  expect_rank0_fails([](const RankContext&, c10d::Backend&) { std::this_thread::sleep_for(std::chrono::seconds(4)); },
                     std::chrono::milliseconds(800), std::chrono::milliseconds(3000), "never arrived");
}

TEST(SharedMemoryBackend, AWaitForARankThatAbortedFailsAtOnce) {
  expect_rank0_fails(
      [](const RankContext&, c10d::Backend& backend) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        backend.abort();
        std::this_thread::sleep_for(std::chrono::seconds(3));  // still alive: the abort alone must end the wait
      },
      std::chrono::minutes(10), std::chrono::seconds(3), "gave up");
}

}  // namespace

// The replicas of one process (ParallelTrainer's threads backend): reduce_scatter gives each replica its part of the
// sum in rank order, also into a view of its own input; all_gather_into lays every replica's input end to end; an
// average divides by the replicas.
TEST(ThreadsBackend, ReduceScatterAndAllGatherIntoOfReplicas) {
  constexpr int kReplicas = 3;
  constexpr std::int64_t kPart = 5;
  auto backends = fl::threads_backends(kReplicas);
  std::vector<at::Tensor> inputs, outputs, in_place, gathered;
  for (int r = 0; r < kReplicas; ++r) {
    inputs.push_back(contribution(r, kPart * kReplicas, torch::kFloat64));
    outputs.push_back(torch::zeros({kPart}, torch::kFloat64));
    in_place.push_back(inputs.back().clone());
    gathered.push_back(torch::zeros({kPart * kReplicas}, torch::kFloat64));
  }
  std::vector<std::thread> threads;
  for (int r = 0; r < kReplicas; ++r) {
    threads.emplace_back([&, r] {
      c10d::ReduceScatterOptions sum;
      backends[r]->_reduce_scatter_base(outputs[r], inputs[r], sum)->wait();
      c10d::ReduceScatterOptions avg;
      avg.reduceOp = c10d::ReduceOp::AVG;
      auto own = in_place[r].narrow(0, r * kPart, kPart);
      backends[r]->_reduce_scatter_base(own, in_place[r], avg)->wait();
      auto mine = contribution(10 + r, kPart, torch::kFloat64);
      backends[r]->_allgather_base(gathered[r], mine)->wait();
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < kReplicas; ++r) {
    auto expected = inputs[0].narrow(0, r * kPart, kPart).clone();
    for (int k = 1; k < kReplicas; ++k) expected += inputs[k].narrow(0, r * kPart, kPart);
    EXPECT_TRUE(torch::equal(outputs[r], expected)) << "replica " << r;
    EXPECT_TRUE(torch::allclose(in_place[r].narrow(0, r * kPart, kPart), expected / kReplicas)) << "replica " << r;
    for (int k = 0; k < kReplicas; ++k)
      EXPECT_TRUE(torch::equal(gathered[r].narrow(0, k * kPart, kPart), contribution(10 + k, kPart, torch::kFloat64)));
  }
}
