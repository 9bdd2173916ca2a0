// DistributedDL: the index arithmetic on simulated ranks (every size n up to 2 * world * bs + 1), then
// real ranks over Gloo: rank 0's order shared, padding by wrapping, equal batch counts and sizes on every
// rank with and without drop_last, exact removal of the padding after gathering, a new shared shuffle
// each epoch, errors instead of hangs for mismatched ranks, and the one-process case.
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/dataloader.h>
#include <fastlearn/distributed/distributed_dl.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <chrono>
#include <numeric>
#include <set>

#include "support/message_of.h"
#include "support/multiprocess.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
using flt::RankContext;

namespace {

using Items = std::vector<std::int64_t>;

flt::MultiProcessOptions torchrun(int world) { return {.env = flt::torchrun_env(world)}; }

// Sets up from the torchrun variables the runner gives each rank; torn down at scope exit.
struct Distributed {
  Distributed() { fl::setup_distrib({.timeout = std::chrono::seconds(20)}); }
  ~Distributed() { fl::teardown_distrib(); }
};

// Item i: input [i, -i] (float), target i (int64).
std::shared_ptr<fl::TensorDataset> numbered(std::int64_t n) {
  auto x = torch::arange(n, torch::kFloat32).view({n, 1});
  return std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{torch::cat({x, -x}, 1)},
                                             std::vector<at::Tensor>{torch::arange(n)});
}

Items to_items(const at::Tensor& t) {
  auto c = t.to(torch::kLong).contiguous();
  return {c.data_ptr<std::int64_t>(), c.data_ptr<std::int64_t>() + c.numel()};
}

// The target of every item of every batch of one epoch, batch by batch.
std::vector<Items> epoch_batches(fl::DataLoader& dl) {
  std::vector<Items> batches;
  for (const auto& b : dl) batches.push_back(to_items(b.targets[0]));
  return batches;
}

Items flatten(const std::vector<Items>& batches) {
  Items all;
  for (const auto& b : batches) all.insert(all.end(), b.begin(), b.end());
  return all;
}

std::vector<std::int64_t> sizes_of(const std::vector<Items>& batches) {
  std::vector<std::int64_t> sizes;
  for (const auto& b : batches) sizes.push_back(static_cast<std::int64_t>(b.size()));
  return sizes;
}

Items iota(std::int64_t n) {
  Items v(static_cast<std::size_t>(n));
  std::iota(v.begin(), v.end(), 0);
  return v;
}

// The spec, written out independently of the implementation: `order` padded by wrapping to a multiple of
// `world`, then rank `rank`'s contiguous block.
Items expected_block(const Items& order, int rank, int world) {
  const auto n = static_cast<std::int64_t>(order.size());
  const std::int64_t total = (n + world - 1) / world * world, per = total / world;
  Items block;
  for (std::int64_t i = rank * per; i < (rank + 1) * per; ++i) block.push_back(order[static_cast<std::size_t>(i % n)]);
  return block;
}

// Expected batch sizes of a block of `items` items.
std::vector<std::int64_t> expected_sizes(std::int64_t items, std::int64_t bs, bool drop_last) {
  std::vector<std::int64_t> sizes(static_cast<std::size_t>(items / bs), bs);
  if (!drop_last && items % bs != 0) sizes.push_back(items % bs);
  return sizes;
}

// A loader over numbered(n) that rank `rank` of `world` would use, without processes.
fl::DataLoader simulated_rank(std::int64_t n, int rank, int world, fl::DataLoaderOptions options) {
  fl::DataLoader dl(numbered(n), std::move(options));
  dl.set_sampler(std::make_shared<fl::DistributedSampler>(dl.sampler_ptr(), rank, world));
  return dl;
}

using fastlearn::testing::message_of;

// Every rank's `mine`, gathered (all the same length).
std::vector<Items> all_ranks(const Items& mine) {
  std::vector<at::Tensor> parts;
  for (int r = 0; r < fl::world_size(); ++r)
    parts.push_back(torch::empty({static_cast<std::int64_t>(mine.size())}, torch::kLong));
  fl::all_gather(parts, torch::tensor(mine, torch::kLong));
  std::vector<Items> out;
  for (const auto& p : parts) out.push_back(to_items(p));
  return out;
}

}  // namespace

// ---- the index arithmetic, ranks simulated in this process --------------------------------------------

TEST(DistributedDLLogic, FiftyItemsOnFourRanksInBatchesOfTwelve) {
  for (int r = 0; r < 4; ++r) {
    auto dl = simulated_rank(50, r, 4, {.bs = 12});
    const auto& sampler = *fl::distributed_sampler(dl);
    EXPECT_EQ(sampler.total(), 52);
    EXPECT_EQ(sampler.padding(), 2);
    EXPECT_EQ(dl.size(), 2);
    Items first;
    for (std::int64_t i = 13 * r; i < 13 * r + 12; ++i) first.push_back(i % 50);
    EXPECT_EQ(epoch_batches(dl), (std::vector<Items>{first, {(13 * r + 12) % 50}})) << "rank " << r;
  }
}

TEST(DistributedDLLogic, EveryUnevenSizeGivesEveryRankTheSameBatches) {
  const std::int64_t bs = 4;
  for (int world : {2, 3}) {
    for (std::int64_t n = 1; n <= 2 * world * bs + 1; ++n) {
      for (bool drop_last : {false, true}) {
        SCOPED_TRACE(fmt::format("world {}, n {}, drop_last {}", world, n, drop_last));
        const std::int64_t total = (n + world - 1) / world * world;
        std::vector<std::vector<std::int64_t>> sizes;
        Items concatenated;
        for (int r = 0; r < world; ++r) {
          auto dl = simulated_rank(n, r, world, {.bs = bs, .drop_last = drop_last});
          const auto batches = epoch_batches(dl);
          EXPECT_EQ(dl.size(), static_cast<std::int64_t>(batches.size())) << "size() must be the real batch count";
          EXPECT_EQ(sizes_of(batches), expected_sizes(total / world, bs, drop_last));
          if (!drop_last) {
            EXPECT_EQ(flatten(batches), expected_block(iota(n), r, world));
          }
          sizes.push_back(sizes_of(batches));
          const auto items = flatten(batches);
          concatenated.insert(concatenated.end(), items.begin(), items.end());
        }
        for (const auto& s : sizes) EXPECT_EQ(s, sizes[0]) << "ranks disagree on batch sizes";
        const auto rank0 = simulated_rank(n, 0, world, {.bs = bs});
        EXPECT_EQ(fl::distributed_sampler(rank0)->padding(), total - n);
        EXPECT_LT(fl::distributed_sampler(rank0)->padding(), world);
        if (!drop_last) {
          // The padding is the tail of the concatenated blocks; what is left is the dataset, in order.
          EXPECT_EQ(Items(concatenated.begin(), concatenated.begin() + n), iota(n));
          for (std::int64_t i = n; i < total; ++i) EXPECT_EQ(concatenated[static_cast<std::size_t>(i)], i % n);
        }
      }
    }
  }
}

TEST(DistributedDLLogic, ShuffledBlocksPartitionTheSharedPermutationEachEpoch) {
  const std::int64_t n = 23;
  const int world = 3;
  std::vector<fl::DataLoader> ranks;
  for (int r = 0; r < world; ++r) ranks.push_back(simulated_rank(n, r, world, {.bs = 5, .shuffle = true, .seed = 7}));
  fl::DataLoader base(numbered(n), {.bs = 5, .shuffle = true, .seed = 7});
  Items previous;
  for (int epoch = 0; epoch < 3; ++epoch) {
    const auto order = flatten(epoch_batches(base));
    Items concatenated;
    for (int r = 0; r < world; ++r) {
      const auto items = flatten(epoch_batches(ranks[static_cast<std::size_t>(r)]));
      EXPECT_EQ(items, expected_block(order, r, world)) << "epoch " << epoch << ", rank " << r;
      concatenated.insert(concatenated.end(), items.begin(), items.end());
    }
    EXPECT_EQ(std::set<std::int64_t>(concatenated.begin(), concatenated.end()).size(), static_cast<std::size_t>(n));
    EXPECT_NE(concatenated, previous) << "epoch " << epoch << " repeated the previous order";
    previous = concatenated;
  }
}

TEST(DistributedDLLogic, BadRanksAndBadBaseSamplersAreErrors) {
  auto base = std::make_shared<fl::SequentialSampler>(10);
  EXPECT_THROW(fl::DistributedSampler(base, 2, 2), fl::DistributedError);
  EXPECT_THROW(fl::DistributedSampler(base, -1, 2), fl::DistributedError);
  EXPECT_THROW(fl::DistributedSampler(nullptr, 0, 2), fl::DistributedError);
  struct Liar : fl::Sampler {
    std::int64_t size() const override { return 5; }
    Items order(std::int64_t) const override { return {0, 1, 2}; }
  };
  fl::DistributedSampler over_liar(std::make_shared<Liar>(), 0, 2);
  EXPECT_NE(message_of([&] { over_liar.order(0); }).find("gave 3 items for epoch 0 but its size is 5"),
            std::string::npos);
  fl::DistributedSampler empty(std::make_shared<fl::SequentialSampler>(0), 1, 2);
  EXPECT_EQ(empty.size(), 0);
  EXPECT_TRUE(empty.order(0).empty());
}

// ---- one process: exactly the base loader ------------------------------------------------------------

TEST(DistributedDLOneProcess, YieldsExactlyTheBaseLoadersBatches) {
  ASSERT_EQ(fl::world_size(), 1) << "run this test without RANK/WORLD_SIZE in the environment";
  // A random per-item augmentation, to see that it is drawn the same way too.
  fl::BatchTransform noise = [](fl::Batch& b, at::Generator& rng) {
    b.inputs[0] = b.inputs[0] + torch::rand(b.inputs[0].sizes(), rng);
  };
  for (bool shuffle : {false, true}) {
    for (bool drop_last : {false, true}) {
      const fl::DataLoaderOptions options{
          .bs = 6, .shuffle = shuffle, .drop_last = drop_last, .seed = 11, .batch_tfms = {noise}};
      fl::DataLoader base(numbered(27), options), wrapped(numbered(27), options);
      const auto original = wrapped.sampler_ptr();
      auto ddl = fl::DistributedDL::wrap(wrapped);
      EXPECT_EQ(ddl.padding(), 0);
      EXPECT_EQ(wrapped.size(), base.size());
      EXPECT_EQ(ddl.size(), base.size());
      for (int epoch = 0; epoch < 2; ++epoch) {
        std::vector<at::Tensor> preds;
        auto it = base.begin();
        for (const auto& b : wrapped) {
          ASSERT_TRUE(it != base.end());
          EXPECT_TRUE(torch::equal(b.inputs[0], it->inputs[0]));
          EXPECT_TRUE(torch::equal(b.targets[0], it->targets[0]));
          preds.push_back(b.targets[0]);
          ++it;
        }
        EXPECT_TRUE(it == base.end());
        const auto local = torch::cat(preds);
        EXPECT_TRUE(torch::equal(fl::gather_unpadded(local, ddl), local));
        EXPECT_TRUE(torch::equal(fl::gather_unpadded(local, wrapped), local));
      }
      EXPECT_THROW(fl::DistributedDL::wrap(wrapped), fl::DistributedError) << "wrapping twice must be refused";
      ddl.unwrap();
      EXPECT_FALSE(ddl.wrapped());
      EXPECT_EQ(wrapped.sampler_ptr(), original) << "unwrap must give back the very sampler";
      EXPECT_EQ(wrapped.seed(), 11u);
      EXPECT_EQ(wrapped.epoch(), 2);
      EXPECT_EQ(fl::distributed_sampler(wrapped), nullptr);
      EXPECT_THROW(ddl.loader(), fl::DistributedError);
      ddl.unwrap();  // a second unwrap does nothing
    }
  }
}

// ---- real ranks over Gloo ----------------------------------------------------------------------------

TEST(DistributedDL, FiftyItemsOnFourRanksAndTheirGatheredPredictions) {
  flt::run_on_ranks(
      4,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank();
        fl::DataLoader dl(numbered(50), {.bs = 12});
        auto ddl = fl::DistributedDL::wrap(dl);
        EXPECT_EQ(ddl.rank(), r);
        EXPECT_EQ(ddl.world_size(), 4);
        EXPECT_EQ(dl.size(), 2);
        Items first;
        for (std::int64_t i = 13 * r; i < 13 * r + 12; ++i) first.push_back(i % 50);
        std::vector<at::Tensor> preds;
        std::vector<Items> batches;
        for (const auto& b : dl) {
          batches.push_back(to_items(b.targets[0]));
          preds.push_back(b.inputs[0]);
        }
        EXPECT_EQ(batches, (std::vector<Items>{first, {(13 * r + 12) % 50}}));
        const auto all = fl::gather_unpadded(torch::cat(preds), ddl);
        EXPECT_TRUE(torch::equal(all, numbered(50)->inputs()[0])) << "padding not removed exactly";
      },
      torchrun(4));
}

class DistributedDLUneven : public ::testing::TestWithParam<int> {};

TEST_P(DistributedDLUneven, SameBatchesOnEveryRankAndExactlyNGatheredItems) {
  const int world = GetParam();
  flt::run_on_ranks(
      world,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank(), w = fl::world_size();
        const std::int64_t bs = 4;
        for (std::int64_t n : {std::int64_t{1}, std::int64_t{2}, std::int64_t{7}, w * bs + 1, 2 * w * bs + 1}) {
          for (bool drop_last : {false, true}) {
            SCOPED_TRACE(fmt::format("n {}, drop_last {}", n, drop_last));
            fl::DataLoader dl(numbered(n), {.bs = bs, .drop_last = drop_last});
            auto ddl = fl::DistributedDL::wrap(dl);
            const std::int64_t total = (n + w - 1) / w * w;
            EXPECT_EQ(ddl.padding(), total - n);
            std::vector<std::int64_t> sizes;
            std::vector<at::Tensor> targets, inputs;
            for (const auto& b : dl) {
              // A step's collective: it would hang if some rank had a batch more than another.
              auto step = torch::ones({1});
              fl::all_reduce(step);
              EXPECT_EQ(step.item<float>(), static_cast<float>(w));
              sizes.push_back(b.size());
              targets.push_back(b.targets[0]);
              inputs.push_back(b.inputs[0]);
            }
            EXPECT_EQ(static_cast<std::int64_t>(sizes.size()), dl.size());
            EXPECT_EQ(static_cast<std::int64_t>(sizes.size()), ddl.size());
            EXPECT_EQ(sizes, expected_sizes(total / w, bs, drop_last));
            for (const auto& other : all_ranks(sizes)) EXPECT_EQ(other, sizes) << "rank " << r << " vs another rank";
            const auto local = targets.empty() ? torch::empty({0}, torch::kLong) : torch::cat(targets);
            EXPECT_EQ(local.size(0), ddl.items());
            const auto gathered = to_items(fl::gather_unpadded(local, dl));
            if (!drop_last) {
              EXPECT_EQ(gathered, iota(n)) << "validation must see exactly the n items, in dataset order";
            } else {
              // Only what the ranks yielded, without the padding: positions r * per + j, j < items, below n.
              Items expected;
              for (int k = 0; k < w; ++k) {
                for (std::int64_t j = 0; j < ddl.items(); ++j) {
                  if (k * (total / w) + j < n) expected.push_back(k * (total / w) + j);
                }
              }
              EXPECT_EQ(gathered, expected);
            }
            if (!drop_last) {
              // Any dtype and trailing shape: float inputs [k, 2], bool, half and int32 rows of shape [2, 3].
              const auto x = fl::gather_unpadded(torch::cat(inputs), ddl);
              EXPECT_TRUE(torch::equal(x, numbered(n)->inputs()[0]));
              const auto t = local.view({-1, 1, 1}).expand({-1, 2, 3}).contiguous();
              const auto global = torch::arange(n).view({-1, 1, 1}).expand({-1, 2, 3});
              EXPECT_TRUE(torch::equal(fl::gather_unpadded(t % 2 == 1, ddl), global % 2 == 1));
              EXPECT_TRUE(torch::equal(fl::gather_unpadded(t.to(torch::kHalf), ddl), global.to(torch::kHalf)));
              EXPECT_TRUE(torch::equal(fl::gather_unpadded(t.to(torch::kInt), ddl), global.to(torch::kInt)));
            }
            ddl.unwrap();
            EXPECT_EQ(flatten(epoch_batches(dl)), iota(drop_last ? n / bs * bs : n))
                << "unwrap must give back the whole dataset";
          }
        }
      },
      torchrun(world));
}

INSTANTIATE_TEST_SUITE_P(Ranks, DistributedDLUneven, ::testing::Values(2, 3),
                         [](const ::testing::TestParamInfo<int>& param) {
                           return std::to_string(param.param) + "ranks";
                         });

TEST(DistributedDL, ShuffleUsesRankZerosPermutationNewEachEpoch) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank();
        torch::manual_seed(1000 + static_cast<std::uint64_t>(r));  // each rank draws its own loader seed
        const std::int64_t n = 21, bs = 4;
        // An augmentation that records its random draws as a second input.
        fl::BatchTransform draw = [](fl::Batch& b, at::Generator& rng) {
          b.inputs.push_back(torch::rand({b.size()}, rng));
        };
        fl::DataLoader dl(numbered(n), {.bs = bs, .shuffle = true, .batch_tfms = {draw}});
        const auto seeds = all_ranks({static_cast<std::int64_t>(dl.seed())});
        ASSERT_NE(seeds[0], seeds[1]) << "the ranks' loaders should start with different seeds";
        const auto seed0 = static_cast<std::uint64_t>(seeds[0][0]);
        auto ddl = fl::DistributedDL::wrap(dl);
        if (r == 0) {
          EXPECT_EQ(dl.seed(), seed0) << "rank 0 keeps its seed";
        }
        // Rank 0's own loader as it was before wrapping: its permutations are the ones to share.
        fl::DataLoader rank0(numbered(n), {.bs = bs, .shuffle = true, .seed = seed0, .batch_tfms = {draw}});
        Items previous;
        for (int epoch = 0; epoch < 3; ++epoch) {
          SCOPED_TRACE(fmt::format("epoch {}", epoch));
          Items mine;
          at::Tensor first_draws;
          for (const auto& b : dl) {
            const auto items = to_items(b.targets[0]);
            mine.insert(mine.end(), items.begin(), items.end());
            if (!first_draws.defined()) first_draws = b.inputs[1];
          }
          Items order;
          at::Tensor rank0_draws;
          for (const auto& b : rank0) {
            const auto items = to_items(b.targets[0]);
            order.insert(order.end(), items.begin(), items.end());
            if (!rank0_draws.defined()) rank0_draws = b.inputs[1];
          }
          EXPECT_EQ(mine, expected_block(order, r, 2));
          Items concatenated;
          for (const auto& block : all_ranks(mine)) concatenated.insert(concatenated.end(), block.begin(), block.end());
          Items padded = order;
          padded.push_back(order[0]);
          EXPECT_EQ(concatenated, padded) << "the blocks must make rank 0's padded permutation";
          EXPECT_EQ(all_ranks(concatenated)[1], concatenated) << "the ranks see different orders";
          EXPECT_NE(concatenated, previous) << "an epoch repeated the previous order";
          previous = concatenated;
          // Augmentation: rank 0 draws what its base loader draws; the other rank draws numbers of its own.
          std::vector<at::Tensor> draws{torch::empty({bs}), torch::empty({bs})};
          fl::all_gather(draws, first_draws);
          if (r == 0) {
            EXPECT_TRUE(torch::equal(first_draws, rank0_draws));
          }
          EXPECT_FALSE(torch::equal(draws[0], draws[1])) << "the ranks' augmentations repeat each other";
        }
        ddl.unwrap();
        EXPECT_EQ(dl.seed(), static_cast<std::uint64_t>(seeds[static_cast<std::size_t>(r)][0]));
      },
      torchrun(2));
}

TEST(DistributedDL, MismatchedRanksAreErrorsOnEveryRankNotHangs) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank();
        // Rank 1 wraps a loader of another size: both ranks are told, with the sizes.
        fl::DataLoader odd(numbered(r == 0 ? 10 : 11), {.bs = 4});
        const auto wrap_error = message_of([&] { fl::DistributedDL::wrap(odd); });
        EXPECT_NE(wrap_error.find("rank(s) 1 wrap a loader unlike rank 0's (10 items, bs 4"), std::string::npos)
            << wrap_error;
        EXPECT_EQ(fl::distributed_sampler(odd), nullptr) << "a failed wrap must leave the loader alone";
        // Rank 1 passes too few rows to the gather: both ranks are told.
        fl::DataLoader dl(numbered(10), {.bs = 4});
        auto ddl = fl::DistributedDL::wrap(dl);
        const auto rows = r == 0 ? ddl.items() : ddl.items() - 1;
        const auto gather_error = message_of([&] { fl::gather_unpadded(torch::zeros({rows, 3}), ddl); });
        EXPECT_NE(gather_error.find("rank 1: 4 rows of 3 elements, Float"), std::string::npos) << gather_error;
        EXPECT_NE(gather_error.find("(5 rows: a block of 5 of the 10 padded items, bs 4)"), std::string::npos)
            << gather_error;
        // Afterwards the ranks are still in step.
        auto t = torch::ones({1});
        fl::all_reduce(t);
        EXPECT_EQ(t.item<float>(), 2.0f);
      },
      torchrun(2));
}
