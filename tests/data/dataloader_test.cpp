// Dataset, DataLoader, transforms and DataLoaders: order, counts, workers, augmentation, Fashion-MNIST; the SampleQueue
// between a producing program and its trainer.
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/buffer_pool.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/sample_queue.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <thread>

#include "support/message_of.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

std::shared_ptr<fl::TensorDataset> numbered(std::int64_t n) {
  auto x = torch::arange(n, torch::kFloat32).view({n, 1});
  return std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{torch::arange(n)});
}

// The item indices one epoch yields, in order (targets hold the index).
std::vector<std::int64_t> epoch_items(fl::DataLoader& dl) {
  std::vector<std::int64_t> items;
  for (const auto& b : dl) {
    auto y = b.targets[0];
    items.insert(items.end(), y.data_ptr<std::int64_t>(), y.data_ptr<std::int64_t>() + y.numel());
  }
  return items;
}

TEST(DataLoader, ShuffleIsReproducibleBySeedAndNewEachEpoch) {
  fl::DataLoader a(numbered(100), {.bs = 16, .shuffle = true, .seed = 42});
  fl::DataLoader b(numbered(100), {.bs = 16, .shuffle = true, .seed = 42});
  const auto a0 = epoch_items(a), a1 = epoch_items(a);
  EXPECT_EQ(a0, epoch_items(b));
  EXPECT_EQ(a1, epoch_items(b));
  EXPECT_NE(a0, a1) << "the second epoch repeated the first one's order";
  EXPECT_EQ(std::set<std::int64_t>(a0.begin(), a0.end()).size(), 100u) << "an epoch is not a permutation";
  fl::DataLoader c(numbered(100), {.bs = 16, .shuffle = true, .seed = 43});
  EXPECT_NE(a0, epoch_items(c));
  a.set_epoch(1);
  EXPECT_EQ(epoch_items(a), a1) << "set_epoch(1) must replay epoch 1";
}

TEST(DataLoader, SetSeedRedrawsTheRandomOrderOnly) {
  fl::DataLoader a(numbered(50), {.bs = 8, .shuffle = true, .seed = 1});
  fl::DataLoader b(numbered(50), {.bs = 8, .shuffle = true, .seed = 2});
  a.set_seed(2);
  EXPECT_EQ(a.seed(), 2u);
  EXPECT_EQ(epoch_items(a), epoch_items(b)) << "set_seed(2) must give the order of a loader seeded with 2";
  // Another sampler keeps its order; an unshuffled loader stays sequential.
  struct Backwards : fl::Sampler {
    std::int64_t size() const override { return 3; }
    std::vector<std::int64_t> order(std::int64_t) const override { return {2, 1, 0}; }
  };
  auto backwards = std::make_shared<Backwards>();
  a.set_sampler(backwards);
  a.set_seed(3);
  EXPECT_EQ(a.sampler_ptr(), backwards);
  EXPECT_EQ(epoch_items(a), (std::vector<std::int64_t>{2, 1, 0}));
  fl::DataLoader seq(numbered(5), {.bs = 2, .seed = 1});
  seq.set_seed(9);
  EXPECT_EQ(epoch_items(seq), (std::vector<std::int64_t>{0, 1, 2, 3, 4}));
}

TEST(DataLoader, WithoutShuffleItemsComeInOrder) {
  fl::DataLoader dl(numbered(10), {.bs = 4});
  std::vector<std::int64_t> expected(10);
  std::iota(expected.begin(), expected.end(), 0);
  EXPECT_EQ(epoch_items(dl), expected);
}

TEST(DataLoader, DropLastCountsAndSizes) {
  fl::DataLoader keep(numbered(10), {.bs = 3});
  fl::DataLoader drop(numbered(10), {.bs = 3, .drop_last = true});
  EXPECT_EQ(keep.size(), 4);
  EXPECT_EQ(drop.size(), 3);
  std::vector<std::int64_t> sizes;
  for (const auto& b : keep) sizes.push_back(b.size());
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{3, 3, 3, 1}));
  sizes.clear();
  for (const auto& b : drop) sizes.push_back(b.size());
  EXPECT_EQ(sizes, (std::vector<std::int64_t>{3, 3, 3}));
  fl::DataLoader exact(numbered(9), {.bs = 3, .drop_last = true});
  EXPECT_EQ(exact.size(), 3);
  fl::DataLoader small(numbered(2), {.bs = 3, .drop_last = true});
  EXPECT_EQ(small.size(), 0);
  EXPECT_TRUE(epoch_items(small).empty());
}

TEST(DataLoader, WorkersGiveExactlyTheBatchesOfTheCallersThread) {
  auto images = torch::randint(0, 256, {203, 1, 12, 12}, torch::kUInt8);
  auto ds =
      std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{images}, std::vector<at::Tensor>{torch::arange(203)});
  std::vector<fl::BatchTransform> tfms{fl::random_crop(12, 2), fl::random_flip(0.5), fl::to_float(),
                                       fl::normalize({0.5}, {0.25})};
  fl::DataLoader serial(ds, {.bs = 16, .shuffle = true, .num_workers = 0, .seed = 7, .batch_tfms = tfms});
  fl::DataLoader threaded(ds,
                          {.bs = 16, .shuffle = true, .num_workers = 3, .prefetch = 2, .seed = 7, .batch_tfms = tfms});
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::vector<fl::Batch> expected;
    for (const auto& b : serial) expected.push_back(b);
    std::size_t i = 0;
    for (const auto& b : threaded) {
      ASSERT_LT(i, expected.size());
      EXPECT_TRUE(torch::equal(b.inputs[0], expected[i].inputs[0])) << "epoch " << epoch << " batch " << i;
      EXPECT_TRUE(torch::equal(b.targets[0], expected[i].targets[0])) << "epoch " << epoch << " batch " << i;
      ++i;
    }
    EXPECT_EQ(i, expected.size());
  }
}

TEST(DataLoader, LeavingAnEpochEarlyStopsTheWorkers) {
  fl::DataLoader dl(numbered(1000), {.bs = 8, .num_workers = 2});
  for (int repeat = 0; repeat < 20; ++repeat) {
    for (const auto& b : dl) {
      EXPECT_EQ(b.size(), 8);
      break;
    }
  }
}

class FailingDataset : public fl::Dataset {
 public:
  std::int64_t size() const override { return 20; }
  fl::Item get(std::int64_t i) const override {
    if (i == 13) throw fl::DataError("item 13 is unreadable");
    return {{torch::full({2}, i)}, {torch::tensor(i)}};
  }
};

TEST(DataLoader, AnErrorInAWorkerReachesTheCaller) {
  for (int workers : {0, 2}) {
    fl::DataLoader dl(std::make_shared<FailingDataset>(), {.bs = 4, .num_workers = workers});
    try {
      for (const auto& b : dl) (void)b;
      ADD_FAILURE() << "no error with " << workers << " workers";
    } catch (const fl::DataError& e) {
      EXPECT_NE(std::string(e.what()).find("item 13"), std::string::npos) << e.what();
    }
  }
}

TEST(DataLoader, AFailingFirstBatchIsAnErrorWithWorkersRunning) {
  fl::DataLoader dl(std::make_shared<FailingDataset>(), {.bs = 4, .num_workers = 2});
  struct FromThirteen : fl::Sampler {
    std::int64_t size() const override { return 8; }
    std::vector<std::int64_t> order(std::int64_t) const override { return {13, 0, 1, 2, 3, 4, 5, 6}; }
  };
  dl.set_sampler(std::make_shared<FromThirteen>());
  EXPECT_THROW(dl.begin(), fl::DataError);
}

TEST(DataLoader, DefaultCollationStacksItems) {
  fl::DataLoader dl(std::make_shared<FailingDataset>(), {.bs = 4});
  const auto b = dl.one_batch();
  EXPECT_EQ(b.inputs[0].sizes(), (std::vector<std::int64_t>{4, 2}));
  EXPECT_TRUE(torch::equal(b.targets[0], torch::arange(4)));
  EXPECT_EQ(dl.epoch(), 0) << "one_batch must not advance the epoch";
}

TEST(DataLoader, BadOptionsAreErrors) {
  EXPECT_THROW(fl::DataLoader(numbered(4), {.bs = 0}), fl::DataError);
  EXPECT_THROW(fl::DataLoader(numbered(4), {.num_workers = -1}), fl::DataError);
  EXPECT_THROW(fl::TensorDataset({torch::zeros({3})}, {torch::zeros({4})}), fl::DataError);
}

TEST(BufferPool, ReusesMemoryNobodyHoldsAndNeverMemorySomeoneDoes) {
  fl::BufferPool pool(2);
  const auto mb = std::int64_t{1} << 20;
  auto a = pool.empty({mb}, torch::kFloat32);
  const auto* a_memory = a.data_ptr();
  a.fill_(1);
  auto b = pool.empty({mb}, torch::kFloat32);
  EXPECT_NE(b.data_ptr(), a_memory) << "memory still held was handed out again";
  b.fill_(2);
  EXPECT_EQ(a.sum().item<double>(), mb) << "writing the second tensor changed the first";
  a = at::Tensor();
  auto c = pool.empty({mb / 2}, torch::kByte);  // a smaller request fits into a free buffer
  EXPECT_EQ(c.data_ptr(), a_memory);
  EXPECT_EQ(c.sizes(), c10::IntArrayRef({mb / 2}));
  auto d = pool.empty({mb}, torch::kFloat32);  // both buffers held and the pool is full: a plain allocation
  EXPECT_NE(d.data_ptr(), a_memory);
  EXPECT_NE(d.data_ptr(), b.data_ptr());
  // pooled_empty uses the pool only on threads that installed it, and only for large tensors.
  EXPECT_EQ(fl::pooled_empty({mb}, torch::kFloat32).storage().use_count(), 1);
  {
    fl::UseBufferPool use(pool);
    c = at::Tensor();
    EXPECT_EQ(fl::pooled_empty({mb / 4}, torch::kFloat32).data_ptr(), a_memory);
    EXPECT_EQ(fl::pooled_empty({16}, torch::kFloat32).storage().use_count(), 1) << "a small tensor was pooled";
  }
  EXPECT_NE(fl::pooled_empty({mb / 4}, torch::kFloat32).data_ptr(), a_memory);
}

TEST(DataLoader, BatchesTheCallerKeepsStayIntactWhileLaterOnesAreMade) {
  // Batches large enough for the loader's buffer pool, kept across two epochs with workers running.
  const std::int64_t n = 96, bs = 32;
  auto x = torch::randint(0, 256, {n, 3, 48, 48}, torch::kUInt8);
  const auto original = x.clone();
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{torch::arange(n)});
  fl::DataLoader dl(ds, {.bs = bs,
                         .num_workers = 2,
                         .batch_tfms = {fl::to_float(1.0 / 255), fl::normalize({0.5, 0.4, 0.3}, {0.2, 0.25, 0.3})}});
  std::vector<fl::Batch> kept;
  for (int epoch = 0; epoch < 2; ++epoch)
    for (const auto& batch : dl) kept.push_back(batch);
  ASSERT_EQ(kept.size(), 6u);
  auto mean = torch::tensor({0.5, 0.4, 0.3}).view({1, 3, 1, 1}),
       std = torch::tensor({0.2, 0.25, 0.3}).view({1, 3, 1, 1});
  for (std::size_t k = 0; k < kept.size(); ++k) {
    const auto begin = static_cast<std::int64_t>(k % 3) * bs;
    auto expected = (original.narrow(0, begin, bs).to(torch::kFloat32) / 255 - mean) / std;
    EXPECT_TRUE(torch::allclose(kept[k].inputs[0], expected, 1e-5, 1e-5)) << "batch " << k << " was overwritten";
  }
  EXPECT_TRUE(torch::equal(ds->inputs()[0], original)) << "a transform wrote into the dataset";
}

TEST(Transforms, NormalizeCentersEachChannel) {
  fl::Batch b{{torch::stack({torch::full({4, 4}, 10.0), torch::full({4, 4}, 20.0)}).unsqueeze(0).repeat({3, 1, 1, 1})},
              {}};
  auto rng = at::make_generator<at::CPUGeneratorImpl>(0);
  fl::normalize({10.0, 16.0}, {1.0, 2.0})(b, rng);
  EXPECT_TRUE(torch::allclose(b.inputs[0].select(1, 0), torch::zeros({3, 4, 4})));
  EXPECT_TRUE(torch::allclose(b.inputs[0].select(1, 1), torch::full({3, 4, 4}, 2.0)));
  EXPECT_THROW(fl::normalize({1.0}, {0.0}), fl::DataError);
}

TEST(Transforms, ToNormalizedFloatEqualsToFloatThenNormalizeBitForBit) {
  auto rng = at::make_generator<at::CPUGeneratorImpl>(0);
  const std::vector<double> mean3{0.485, 0.456, 0.406}, std3{0.229, 0.224, 0.225};
  auto two_passes = [&](at::Tensor x, std::vector<double> mean, std::vector<double> std) {
    fl::Batch b{{x}, {}};
    fl::to_float(1.0 / 255)(b, rng);
    fl::normalize(std::move(mean), std::move(std))(b, rng);
    return b.inputs[0];
  };
  auto one_pass = [&](at::Tensor x, std::vector<double> mean, std::vector<double> std) {
    fl::Batch b{{x}, {}};
    fl::to_normalized_float(1.0 / 255, std::move(mean), std::move(std))(b, rng);
    return b.inputs[0];
  };
  // Every byte value, in RGB and gray batches, and batches big enough to be split into several tasks.
  const auto every_byte = torch::arange(256, torch::kInt32).to(torch::kUInt8);
  const std::vector<at::Tensor> inputs{every_byte.repeat({12}).view({2, 3, 32, 16}), every_byte.view({1, 1, 16, 16}),
                                       torch::randint(0, 256, {64, 3, 64, 64}, torch::kUInt8),
                                       torch::rand({5, 3, 7, 9}) * 255,
                                       torch::randint(0, 256, {128, 1, 28, 28}, torch::kUInt8)};
  for (const auto& x : inputs) {
    const bool rgb = x.size(1) == 3;
    const auto mean = rgb ? mean3 : std::vector<double>{0.2860};
    const auto std = rgb ? std3 : std::vector<double>{0.3530};
    const auto original = x.clone();
    const auto expected = two_passes(x, mean, std), got = one_pass(x, mean, std);
    EXPECT_EQ(got.scalar_type(), torch::kFloat32);
    EXPECT_EQ(got.sizes(), x.sizes());
    EXPECT_TRUE(torch::equal(got, expected))
        << "shape " << x.sizes() << ", largest difference " << (got - expected).abs().max().item<float>();
    EXPECT_TRUE(torch::equal(x, original)) << "the input was written to";
  }
  // A strided input takes the two transforms, with the same result.
  const auto strided = torch::randint(0, 256, {4, 3, 8, 8}, torch::kUInt8).transpose(2, 3);
  EXPECT_TRUE(torch::equal(one_pass(strided, mean3, std3), two_passes(strided, mean3, std3)));
  // Statistics that do not fit the input are refused, naming the transform.
  fl::Batch wrong{{torch::zeros({2, 2, 4, 4}, torch::kUInt8)}, {}};
  try {
    fl::to_normalized_float(1.0 / 255, mean3, std3)(wrong, rng);
    ADD_FAILURE() << "3 channel statistics were applied to 2 channels";
  } catch (const fl::DataError& e) {
    EXPECT_NE(std::string(e.what()).find("to_normalized_float: 3 channel statistics for input shaped 2x2x4x4"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(fl::to_normalized_float(1.0 / 255, {0.5}, {0.0}), fl::DataError);
}

TEST(Transforms, FlipAndCropDoWhatTheySay) {
  auto x = torch::arange(2 * 3 * 3, torch::kFloat32).view({2, 1, 3, 3});
  auto rng = at::make_generator<at::CPUGeneratorImpl>(0);
  fl::Batch always{{x.clone()}, {}};
  fl::random_flip(1.0)(always, rng);
  EXPECT_TRUE(torch::equal(always.inputs[0], x.flip({3})));
  fl::Batch never{{x.clone()}, {}};
  fl::random_flip(0.0)(never, rng);
  EXPECT_TRUE(torch::equal(never.inputs[0], x));
  fl::Batch same{{x.clone()}, {}};
  fl::random_crop(3, 0)(same, rng);
  EXPECT_TRUE(torch::equal(same.inputs[0], x));
  fl::Batch padded{{x.clone()}, {}};
  fl::random_crop(3, 1)(padded, rng);
  EXPECT_EQ(padded.inputs[0].sizes(), x.sizes());
  // Each crop is a window of the zero-padded image: its pixels are image pixels or zeros.
  for (auto v : padded.inputs[0].flatten().unbind()) EXPECT_TRUE(v.item<float>() == 0 || (x == v).any().item<bool>());
}

TEST(ImageDataLoaders, FashionMnistFromIdx) {
  auto dls = fl::ImageDataLoaders::from_idx("/usr/share/datasets/fashion-mnist", {.bs = 128, .seed = 1});
  EXPECT_EQ(dls.c(), 10);
  EXPECT_EQ(dls.train().size(), 60000 / 128);  // drop_last on training
  EXPECT_EQ(dls.valid().size(), (10000 + 255) / 256);
  const auto b = dls.train().one_batch();
  EXPECT_EQ(b.inputs[0].sizes(), (std::vector<std::int64_t>{128, 1, 28, 28}));
  EXPECT_EQ(b.inputs[0].scalar_type(), torch::kFloat32);
  EXPECT_EQ(b.targets[0].scalar_type(), torch::kLong);
  // Normalized with the training set's statistics: a whole-set mean near 0 and std near 1.
  auto all = dls.valid().one_batch().inputs[0];
  EXPECT_NEAR(all.mean().item<double>(), 0.0, 0.1);
  EXPECT_NEAR(all.std().item<double>(), 1.0, 0.1);
  EXPECT_THROW(fl::ImageDataLoaders::from_idx("/nonexistent"), fl::DataError);
  EXPECT_TRUE(dls.vocab().empty()) << "Debian's folder has no classes.txt: the classes are numbers";
}

// An IDX folder's classes.txt names its classes (the labels' numbers otherwise); options.classes names them in code.
// A list that leaves a label unnamed, or names one twice or blank, is refused with the file and the line.
TEST(ImageDataLoaders, IdxClassNamesComeFromClassesTxtOrTheOptions) {
  const auto dir = fs::temp_directory_path() / ("fastlearn-idx-classes-" + std::to_string(getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& entry : fs::directory_iterator("/usr/share/datasets/fashion-mnist"))
    if (entry.path().filename().string().find("-ubyte") != std::string::npos)
      fs::create_symlink(entry.path(), dir / entry.path().filename());
  const auto write = [&](const std::string& text) { std::ofstream(dir / "classes.txt", std::ios::binary) << text; };
  std::string ten;
  for (int i = 0; i < 10; ++i) ten += fmt::format("kind {}\r\n", i);
  write(ten + "\n");
  auto dls = fl::ImageDataLoaders::from_idx(dir, {.bs = 128, .normalize = false});
  ASSERT_EQ(dls.vocab().size(), 10u);
  EXPECT_EQ(dls.vocab()[3], "kind 3");
  EXPECT_EQ(dls.c(), 10);
  std::vector<std::string> given;
  for (int i = 0; i < 10; ++i) given.push_back(fmt::format("given {}", i));
  EXPECT_EQ(fl::ImageDataLoaders::from_idx(dir, {.bs = 128, .normalize = false, .classes = given}).vocab(), given);
  const auto refused = [&](const std::string& text, const std::string& says) {
    write(text);
    try {
      fl::ImageDataLoaders::from_idx(dir, {.bs = 128, .normalize = false});
      ADD_FAILURE() << "accepted: " << text;
    } catch (const fl::DataError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("classes.txt"), std::string::npos) << e.what();
    }
  };
  refused("a\nb\nc\n", "names 3 classes, but the labels go up to 9");
  refused("a\nb\n\nc\nd\ne\nf\ng\nh\ni\nj\n", "class 2 (line 3) has no name");
  refused("a\nb\nc\nd\ne\nf\ng\nh\ni\na\n", "class 9 (line 10) repeats the name 'a'");
  fs::remove_all(dir);
}

}  // namespace

// A producer faster than its trainer, through a blocking SampleQueue: every sample is popped once, in order, none
// lost or duplicated; the drop policies keep order too and count exactly what they dropped.
TEST(SampleQueue, AFastProducerAndASlowTrainerLoseNothingOrCountWhatIsDropped) {
  constexpr std::int64_t n = 5000;
  for (const auto policy : {fl::QueueFull::block, fl::QueueFull::drop_oldest, fl::QueueFull::drop_newest}) {
    SCOPED_TRACE(static_cast<int>(policy));
    fl::SampleQueue queue({.capacity = 64, .when_full = policy});
    std::thread producer([&] {
      for (std::int64_t i = 0; i < n; ++i) queue.push({{torch::full({3}, static_cast<float>(i))}, {torch::tensor(i)}});
      queue.close();
    });
    std::vector<std::int64_t> seen;
    while (auto batch = queue.pop_batch(32)) {
      const auto ids = batch->targets.at(0);
      ASSERT_EQ(batch->inputs.at(0).size(1), 3);
      EXPECT_TRUE(torch::equal(batch->inputs[0].select(1, 2).to(torch::kLong), ids)) << "rows stay whole";
      for (std::int64_t k = 0; k < ids.size(0); ++k) seen.push_back(ids[k].item<std::int64_t>());
      std::this_thread::sleep_for(std::chrono::microseconds(policy == fl::QueueFull::block ? 0 : 200));
    }
    producer.join();
    const auto counts = queue.counts();
    EXPECT_EQ(counts.pushed, n);
    EXPECT_EQ(counts.popped, static_cast<std::int64_t>(seen.size()));
    EXPECT_EQ(counts.popped + counts.dropped, n);
    EXPECT_EQ(counts.queued, 0);
    EXPECT_TRUE(std::is_sorted(seen.begin(), seen.end()) && std::adjacent_find(seen.begin(), seen.end()) == seen.end())
        << "in order, each once";
    if (policy == fl::QueueFull::block) {
      EXPECT_EQ(counts.dropped, 0);
    } else {
      EXPECT_GT(counts.dropped, 0) << "the slow trainer let the queue fill";
    }
    if (policy == fl::QueueFull::drop_oldest) EXPECT_EQ(seen.back(), n - 1) << "the freshest sample is kept";
  }
}

TEST(SampleQueue, ClosingWakesWaitersAndMismatchedSamplesAreRefused) {
  fl::SampleQueue queue({.capacity = 2});
  queue.push_rows({{torch::zeros({2, 4})}, {torch::zeros({2})}});
  std::thread blocked([&] {
    EXPECT_NE(fl::testing::message_of([&] {
                queue.push({{torch::zeros({4})}, {torch::zeros({})}});
              }).find("closed while this push waited"),
              std::string::npos);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_FALSE(queue.pop_batch(3, std::chrono::milliseconds(10)).has_value()) << "two queued, three asked";
  EXPECT_EQ(queue.counts().queued, 2);
  queue.close();
  blocked.join();
  const auto rest = queue.pop_batch(3);
  ASSERT_TRUE(rest.has_value());
  EXPECT_EQ(rest->size(), 2) << "a closed queue hands out what is left";
  EXPECT_FALSE(queue.pop_batch(1).has_value());
  fl::SampleQueue shapes;
  shapes.push({{torch::zeros({4})}, {torch::zeros({})}});
  const auto wrong = fl::testing::message_of([&] { shapes.push({{torch::zeros({5})}, {torch::zeros({})}}); });
  EXPECT_NE(wrong.find("sample 1 has inputs [5] Float and targets [] Float; the first had inputs [4] Float"),
            std::string::npos)
      << wrong;
}
