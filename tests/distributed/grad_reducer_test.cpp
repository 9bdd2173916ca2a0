// The bucketed gradient reducer on 2 ranks with Gloo: averaged gradients equal the mean of every rank's
// own gradients, parameters start equal, buckets follow the caps and start before backward ends,
// gradient accumulation communicates once, unused parameters are named, compression stays close, and
// gradients are views into the buckets. The sharded layout of a bucket (ShardLayout).
#include <fastlearn/callbacks/channels_last.h>
#include <fastlearn/comm/p2p.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/detail/shard_layout.h>
#include <fastlearn/distributed/grad_reducer.h>
#include <fastlearn/models/models.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include "support/multiprocess.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
using flt::RankContext;

namespace {

struct Distributed {
  Distributed() { fl::setup_distrib({.timeout = std::chrono::seconds(30)}); }
  ~Distributed() { fl::teardown_distrib(); }
};

std::vector<std::pair<std::string, at::Tensor>> named(torch::nn::Module& m) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& p : m.named_parameters()) out.emplace_back(p.key(), p.value());
  return out;
}

// Each rank's batch: seeded by the rank, so every rank can also compute the others' gradients.
std::pair<at::Tensor, at::Tensor> batch_of(int rank, std::int64_t n = 8) {
  auto gen = at::detail::createCPUGenerator(100 + rank);
  return {at::randn({n, 16}, gen), at::randint(0, 4, {n}, gen, at::TensorOptions().dtype(at::kLong))};
}

at::Tensor loss_of(torch::nn::Sequential& model, const std::pair<at::Tensor, at::Tensor>& b) {
  return torch::nn::functional::cross_entropy(model->forward(b.first), b.second);
}

// The mean over ranks of each rank's gradients, computed locally on a copy of the model.
std::vector<at::Tensor> expected_average(torch::nn::Sequential& model, int world, int micro_batches = 1) {
  auto copy = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(model->clone());
  torch::nn::Sequential ref(copy);
  for (auto& p : ref->parameters()) p.mutable_grad() = at::Tensor();
  for (int r = 0; r < world; ++r) {
    for (int m = 0; m < micro_batches; ++m) loss_of(ref, batch_of(r + 10 * m)).backward();
  }
  std::vector<at::Tensor> out;
  for (auto& p : ref->parameters()) out.push_back(p.grad() / world);
  return out;
}

void expect_grads(torch::nn::Sequential& model, const std::vector<at::Tensor>& expected, double tol = 1e-6) {
  auto params = model->parameters();
  ASSERT_EQ(params.size(), expected.size());
  for (std::size_t i = 0; i < params.size(); ++i) {
    ASSERT_TRUE(params[i].grad().defined()) << "parameter " << i;
    EXPECT_TRUE(params[i].grad().allclose(expected[i], tol, tol)) << "parameter " << i;
  }
}

}  // namespace

TEST(GradReducer, AveragesGradientsAndStartsFromRankZerosWeights) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      Distributed dist;
                      torch::manual_seed(fl::rank());  // different initial weights: the reducer must broadcast rank 0's
                      auto model = fl::models::mlp(16, {32, 32}, 4);
                      fl::GradReducer reducer(named(*model), {}, fl::world_group());
                      torch::manual_seed(0);
                      auto rank0 = fl::models::mlp(16, {32, 32}, 4);
                      for (std::size_t i = 0; i < model->parameters().size(); ++i) {
                        EXPECT_TRUE(model->parameters()[i].equal(rank0->parameters()[i]))
                            << "parameter " << i << " not broadcast";
                      }
                      const auto expected = expected_average(model, 2);
                      for (int iteration = 0; iteration < 3; ++iteration) {  // the buckets are rebuilt after the first
                        for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
                        loss_of(model, batch_of(fl::rank())).backward();
                        expect_grads(model, expected);
                      }
                      EXPECT_EQ(reducer.iterations(), 3);
                    },
                    {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, BucketsFollowTheCapsAndStartBeforeBackwardEnds) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        torch::manual_seed(0);
        // 31 Linear layers of 64x64 (+ bias): 62 parameter tensors of 16 KiB / 256 B.
        std::vector<std::int64_t> hidden(30, 64);
        auto model = fl::models::mlp(16, hidden, 4);
        ASSERT_GE(model->parameters().size(), 60u);
        fl::GradReducer reducer(named(*model), {}, fl::world_group(), {.first_bucket_mb = 0.05, .bucket_cap_mb = 0.1});
        std::int64_t total = 0;
        for (auto& p : model->parameters()) total += p.numel() * 4;
        // First bucket ~50 KiB, then ~100 KiB each: about 1 + (total - 50 KiB) / 100 KiB buckets.
        const auto expected = 1 + (total - 51200 + 102399) / 102400;
        EXPECT_NEAR(static_cast<double>(reducer.bucket_count()), static_cast<double>(expected), 1.0);
        loss_of(model, batch_of(fl::rank())).backward();
        const auto& stats = reducer.last_stats();
        ASSERT_EQ(stats.launched_after.size(), reducer.bucket_count());
        EXPECT_EQ(stats.hooks, static_cast<std::int64_t>(model->parameters().size()));
        EXPECT_LT(stats.launched_after.front(), stats.hooks / 4) << "the first bucket starts early in backward";
        EXPECT_LT(stats.launched_after[stats.launched_after.size() / 2], stats.hooks);
        expect_grads(model, expected_average(model, 2), 1e-5);
      },
      {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, NoSyncAccumulatesLocallyAndCommunicatesOnce) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      Distributed dist;
                      torch::manual_seed(0);
                      auto model = fl::models::mlp(16, {32}, 4);
                      fl::GradReducer reducer(named(*model), {}, fl::world_group());
                      reducer.set_sync(false);
                      loss_of(model, batch_of(fl::rank())).backward();
                      EXPECT_EQ(reducer.iterations(), 0) << "nothing communicated";
                      reducer.set_sync(true);
                      loss_of(model, batch_of(fl::rank() + 10)).backward();
                      EXPECT_EQ(reducer.iterations(), 1);
                      expect_grads(model, expected_average(model, 2, 2));
                    },
                    {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, UnusedParametersAreNamedOrToleratedOnRequest) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      Distributed dist;
                      torch::manual_seed(0);
                      auto model = fl::models::mlp(16, {32}, 4);
                      torch::nn::Linear spare(4, 4);  // trained alongside, but never used in the loss
                      auto params = named(*model);
                      params.emplace_back("spare.weight", spare->weight);
                      params.emplace_back("spare.bias", spare->bias);
                      {
                        fl::GradReducer reducer(params, {}, fl::world_group());
                        try {
                          loss_of(model, batch_of(fl::rank())).backward();
                          ADD_FAILURE() << "expected an error about the unused parameters";
                        } catch (const std::exception& e) {
                          EXPECT_NE(std::string(e.what()).find("spare.weight"), std::string::npos) << e.what();
                          EXPECT_NE(std::string(e.what()).find("find_unused_parameters"), std::string::npos)
                              << e.what();
                        }
                      }
                      for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
                      fl::GradReducer tolerant(params, {}, fl::world_group(), {.find_unused_parameters = true});
                      loss_of(model, batch_of(fl::rank())).backward();
                      EXPECT_TRUE(spare->weight.grad().defined());
                      EXPECT_EQ(spare->weight.grad().abs().sum().item<float>(), 0.0f);
                    },
                    {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, Bf16CompressionStaysClose) {
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      Distributed dist;
                      torch::manual_seed(0);
                      auto model = fl::models::mlp(16, {32}, 4);
                      fl::GradReducer reducer(named(*model), {}, fl::world_group(), {.compression = at::kBFloat16});
                      loss_of(model, batch_of(fl::rank())).backward();
                      expect_grads(model, expected_average(model, 2), 2e-2);
                      EXPECT_EQ(model->parameters()[0].grad().scalar_type(), at::kFloat);
                    },
                    {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, GradientsAreBucketViewsWhateverTheZeroing) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        torch::manual_seed(0);
        auto model = fl::models::mlp(16, {32, 32}, 4);
        fl::GradReducer reducer(named(*model), {}, fl::world_group());
        const auto expected = expected_average(model, 2);
        for (int iteration = 0; iteration < 4; ++iteration) {
          for (auto& p : model->parameters()) {  // torch's two ways: set to none, or zero in place (in the bucket)
            if (iteration % 2 == 0) {
              p.mutable_grad() = at::Tensor();
            } else if (p.grad().defined()) {
              p.mutable_grad().zero_();
            }
          }
          loss_of(model, batch_of(fl::rank())).backward();
          expect_grads(model, expected);
          // One bucket holds this small model: every gradient lives in it, so nothing was copied back.
          const auto params = model->parameters();
          ASSERT_EQ(reducer.bucket_count(), 1u);
          for (const auto& p : params)
            EXPECT_TRUE(p.grad().is_alias_of(params.front().grad())) << "iteration " << iteration;
        }
      },
      {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, ParameterUnusedInTheLastMicroBatchKeepsItsAccumulatedGradient) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        torch::manual_seed(0);
        torch::nn::Linear a(16, 4), b(16, 4);
        fl::GradReducer reducer(
            {{"a.weight", a->weight}, {"a.bias", a->bias}, {"b.weight", b->weight}, {"b.bias", b->bias}}, {},
            fl::world_group(), {.find_unused_parameters = true});
        auto loss = [](torch::nn::Linear& m, const std::pair<at::Tensor, at::Tensor>& batch) {
          return torch::nn::functional::cross_entropy(m->forward(batch.first), batch.second);
        };
        reducer.set_sync(false);
        (loss(a, batch_of(fl::rank())) + loss(b, batch_of(fl::rank()))).backward();  // b used only here
        reducer.set_sync(true);
        loss(a, batch_of(fl::rank() + 10)).backward();
        // b's gradient: the mean over ranks of what each accumulated in the first micro-batch.
        auto ref = std::dynamic_pointer_cast<torch::nn::LinearImpl>(b->clone());
        for (int r = 0; r < 2; ++r)
          torch::nn::functional::cross_entropy(ref->forward(batch_of(r).first), batch_of(r).second).backward();
        EXPECT_TRUE(b->weight.grad().allclose(ref->weight.grad() / 2, 1e-6, 1e-6));
        EXPECT_TRUE(b->bias.grad().allclose(ref->bias.grad() / 2, 1e-6, 1e-6));
      },
      {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, LargeGradientsAreReducedInPlaceAndAPredividedLossOnlySums) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        torch::manual_seed(0);
        auto model = fl::models::mlp(16, {64}, 4);  // the 64x16 weight (4 KiB) goes in place, the rest is packed
        const auto expected = expected_average(model, 2);
        for (const bool divide : {true, false}) {
          fl::GradReducer reducer(named(*model), {}, fl::world_group(),
                                  {.in_place_mb = 4096.0 / (1024 * 1024), .divide_by_world_size = divide});
          EXPECT_EQ(reducer.bucket_count(), 2u);
          for (int iteration = 0; iteration < 3; ++iteration) {
            for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
            auto loss = loss_of(model, batch_of(fl::rank()));
            (divide ? loss : loss / 2).backward();
            expect_grads(model, expected);
          }
        }
      },
      {.env = flt::torchrun_env(2)});
}

TEST(GradReducer, ChannelsLastGradientsKeepTheParametersLayoutInBucketsAndInPlace) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        torch::manual_seed(0);
        auto images_of = [](int rank) {
          auto gen = at::detail::createCPUGenerator(200 + rank);
          return std::pair{at::randn({6, 1, 8, 8}, gen),
                           at::randint(0, 3, {6}, gen, at::TensorOptions().dtype(at::kLong))};
        };
        auto reference = fl::models::conv_net({.widths = {4, 8}, .classes = 3, .input_size = 8});
        std::vector<at::Tensor> expected;  // the mean of both ranks' gradients, in the default layout
        for (int r = 0; r < 2; ++r) {
          auto [x, y] = images_of(r);
          torch::nn::functional::cross_entropy(reference->forward(x), y).backward();
        }
        for (auto& p : reference->parameters()) expected.push_back(p.grad() / 2);
        // in_place_mb between the sizes: the 8x4x3x3 conv weight (1152 B) is reduced in its own .grad, the rest packed.
        for (const double in_place_mb : {1e9, 1000.0 / (1024 * 1024)}) {
          auto model = std::dynamic_pointer_cast<torch::nn::SequentialImpl>(reference->clone());
          for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
          fl::models::to_channels_last(*model);
          const auto conv_weight = model->parameters()[3];  // 8x4x3x3 (a 1-channel weight is both layouts at once)
          ASSERT_TRUE(conv_weight.is_contiguous(at::MemoryFormat::ChannelsLast));
          ASSERT_FALSE(conv_weight.is_contiguous());
          fl::GradReducer reducer(named(*model), {}, fl::world_group(), {.in_place_mb = in_place_mb});
          for (int iteration = 0; iteration < 2; ++iteration) {
            for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
            auto [x, y] = images_of(fl::rank());
            torch::nn::functional::cross_entropy(model->forward(x.contiguous(at::MemoryFormat::ChannelsLast)), y)
                .backward();
            const auto params = model->parameters();
            for (std::size_t i = 0; i < params.size(); ++i) {
              EXPECT_TRUE(params[i].grad().allclose(expected[i], 1e-5, 1e-6))
                  << "parameter " << i << ", in_place_mb " << in_place_mb;
              EXPECT_EQ(params[i].grad().strides(), params[i].strides())
                  << "parameter " << i << ": the optimizer's fused step needs one layout";
            }
          }
          EXPECT_EQ(reducer.bucket_count(), in_place_mb > 1 ? 1u : 2u);
        }
      },
      {.env = flt::torchrun_env(2)});
}

// A trunk and three heads; rank r trains through head r % 3 only, so the ranks' unused parameters differ.
// The first backward's bucket rebuild must still run on every rank (it broadcasts rank 0's order): before,
// only ranks without unused parameters joined it, and the collectives stopped matching (a hang).
class DifferentUnusedSets : public ::testing::TestWithParam<int> {};

TEST_P(DifferentUnusedSets, NoHangAndTheAverageOfEveryRanksGradients) {
  const int world = GetParam();
  flt::run_on_ranks(
      world,
      [](const RankContext& ctx) {
        Distributed dist;
        torch::manual_seed(3);
        torch::nn::Linear trunk(16, 12), head0(12, 4), head1(12, 4), head2(12, 4);
        std::vector<torch::nn::Linear> heads{head0, head1, head2};
        std::vector<std::pair<std::string, at::Tensor>> params;
        for (const auto& p : trunk->named_parameters()) params.emplace_back("trunk." + p.key(), p.value());
        for (int h = 0; h < 3; ++h) {
          for (const auto& p : heads[h]->named_parameters())
            params.emplace_back(fmt::format("head{}.{}", h, p.key()), p.value());
        }
        auto loss_on = [&](int rank, int iteration) {
          auto gen = at::detail::createCPUGenerator(1000 + 10 * rank + iteration);
          auto x = at::randn({6, 16}, gen);
          auto y = at::randint(0, 4, {6}, gen, at::TensorOptions().dtype(at::kLong));
          return torch::nn::functional::cross_entropy(heads[rank % 3]->forward(torch::relu(trunk->forward(x))), y);
        };
        fl::GradReducer reducer(params, {}, fl::world_group(),
                                {.first_bucket_mb = 0.0001, .find_unused_parameters = true});
        for (int it = 0; it < 4; ++it) {
          // The reference: the mean over ranks of each rank's loss, on this process (zero for unused heads).
          std::vector<at::Tensor> expected;
          {
            std::vector<at::Tensor> leaves;
            for (auto& [name, p] : params) leaves.push_back(p);
            at::Tensor total = torch::zeros({});
            for (int r = 0; r < ctx.world_size; ++r) total = total + loss_on(r, it);
            auto grads =
                torch::autograd::grad({total / ctx.world_size}, leaves, {}, false, false, /*allow_unused=*/true);
            for (std::size_t i = 0; i < grads.size(); ++i)
              expected.push_back(grads[i].defined() ? grads[i] : torch::zeros_like(leaves[i]));
          }
          for (auto& [name, p] : params) p.mutable_grad() = at::Tensor();
          loss_on(ctx.rank, it).backward();
          reducer.finalize_if_pending();
          for (std::size_t i = 0; i < params.size(); ++i) {
            ASSERT_TRUE(params[i].second.grad().defined()) << params[i].first;
            EXPECT_TRUE(params[i].second.grad().allclose(expected[i], 1e-5, 1e-6))
                << "iteration " << it << ", " << params[i].first << " differs by "
                << (params[i].second.grad() - expected[i]).abs().max().item<double>();
          }
        }
        EXPECT_EQ(reducer.iterations(), 4);
      },
      {.timeout = std::chrono::seconds(60), .env = flt::torchrun_env(world)});
}

INSTANTIATE_TEST_SUITE_P(Ranks, DifferentUnusedSets, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& p) { return std::to_string(p.param) + "_ranks"; });

// The vote rides in the last bucket's all_reduce: every rank learns that one voted, at the same backward.
TEST(GradReducer, AVoteOfOneRankReachesEveryRankWithTheGradients) {
  flt::run_on_ranks(
      2,
      [](const RankContext& ctx) {
        Distributed dist;
        torch::manual_seed(0);
        auto model = fl::models::mlp(16, {32}, 4);
        fl::GradReducer reducer(named(*model), {}, fl::world_group());
        std::vector<bool> seen;
        for (int it = 0; it < 4; ++it) {
          reducer.vote(ctx.rank == 1 && it == 2);  // rank 1 votes before the third backward
          for (auto& p : model->parameters()) p.mutable_grad() = at::Tensor();
          loss_of(model, batch_of(ctx.rank)).backward();
          seen.push_back(reducer.take_votes());
        }
        EXPECT_EQ(seen, (std::vector<bool>{false, false, true, false})) << "on CPU a vote is read at its own backward";
        EXPECT_EQ(reducer.last_stats().launched_after.size(), reducer.bucket_count());
      },
      {.timeout = std::chrono::seconds(60), .env = flt::torchrun_env(2)});
}

// The sharded layout of a bucket (ZeRO, issue 64): every element of every parameter owned by exactly one rank, at the
// place its piece says; parts equal on every rank, padding last; a parameter straddling two ranks, and a rank whose
// part holds only padding (an empty share).
TEST(ShardLayout, EveryElementHasOneOwnerAndThePartsAreEven) {
  for (const auto& numels : std::vector<std::vector<std::int64_t>>{{7 * 33, 1}, {1}, {5, 0, 3}, {}, {64, 64, 64}}) {
    for (const int world : {1, 2, 3, 4}) {
      SCOPED_TRACE(fmt::format("{} parameters over {} ranks", numels.size(), world));
      const auto layout = fl::shard_bucket(numels, world);
      std::int64_t total = 0;
      for (const auto n : numels) total += n;
      EXPECT_EQ(layout.numel, total);
      EXPECT_EQ(layout.padded % world, 0);
      EXPECT_LT(layout.padded - total, world);
      EXPECT_EQ(layout.part * world, layout.padded);
      std::vector<int> owners(static_cast<std::size_t>(total), 0);
      for (int r = 0; r < world; ++r) {
        for (const auto& piece : layout.pieces[static_cast<std::size_t>(r)]) {
          EXPECT_EQ(piece.bucket_offset, layout.param_offsets[piece.param] + piece.param_offset);
          EXPECT_EQ(piece.part_offset, piece.bucket_offset - r * layout.part);
          EXPECT_GE(piece.part_offset, 0);
          EXPECT_LE(piece.part_offset + piece.numel, layout.part);
          EXPECT_LE(piece.param_offset + piece.numel, numels[piece.param]);
          for (std::int64_t k = 0; k < piece.numel; ++k) ++owners[static_cast<std::size_t>(piece.bucket_offset + k)];
        }
      }
      EXPECT_TRUE(std::all_of(owners.begin(), owners.end(), [](int n) { return n == 1; }));
    }
  }
  // 7x33 + 1 elements over 2 ranks: 232 -> parts of 116; the weight straddles, the bias is rank 1's last element.
  const auto two = fl::shard_bucket({7 * 33, 1}, 2);
  ASSERT_EQ(two.pieces[0].size(), 1U);
  ASSERT_EQ(two.pieces[1].size(), 2U);
  EXPECT_EQ(two.pieces[1][0],
            (fl::ParamPiece{.param = 0, .param_offset = 116, .bucket_offset = 116, .part_offset = 0, .numel = 115}));
  EXPECT_EQ(two.pieces[1][1],
            (fl::ParamPiece{.param = 1, .param_offset = 0, .bucket_offset = 231, .part_offset = 115, .numel = 1}));
  // One element over 3 ranks: ranks 1 and 2 hold padding only.
  const auto one = fl::shard_bucket({1}, 3);
  EXPECT_EQ(one.part, 1);
  EXPECT_TRUE(one.pieces[1].empty() && one.pieces[2].empty());
  EXPECT_THROW(fl::shard_bucket({3}, 0), fl::ConfigError);
  EXPECT_THROW(fl::shard_bucket({-1}, 2), fl::ConfigError);
}
