// Segmentation data: pair transforms move an image and its mask as one (checked pixel by pixel on pictures whose
// mask is painted from the picture's own colours), and SegmentationDataLoaders pair, check and load them.
#include <fastlearn/core/error.h>
#include <fastlearn/data/aug_transforms.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/image_encode.h>
#include <fastlearn/data/image_transforms.h>
#include <fastlearn/data/segmentation_dataloaders.h>
#include <fastlearn/data/segmentation_dataset.h>
#include <fastlearn/data/transforms.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <ATen/CPUGeneratorImpl.h>

#include <filesystem>
#include <fstream>

#include "support/message_of.h"
#include "support/python_data.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

// Class k is painted in colour kColours[k]: no blend of two of them (nor of one with black padding) equals a third.
const at::Tensor& colours() {
  static const auto table =
      torch::tensor({0, 0, 0, 255, 0, 0, 0, 255, 0, 0, 0, 255}, torch::kUInt8).view({4, 3}).contiguous();
  return table;
}

// A (3, h, w) picture of blocks of `block` pixels, each a random class's colour, and its mask (h, w).
std::pair<at::Tensor, at::Tensor> blocks(std::int64_t h, std::int64_t w, std::int64_t block, std::uint64_t seed) {
  auto rng = at::make_generator<at::CPUGeneratorImpl>(seed);
  const auto grid = at::randint(4, {(h + block - 1) / block, (w + block - 1) / block}, rng, torch::kLong);
  const auto mask = grid.repeat_interleave(block, 0).repeat_interleave(block, 1).narrow(0, 0, h).narrow(1, 0, w);
  const auto image = colours().index_select(0, mask.flatten()).view({h, w, 3}).permute({2, 0, 1}).contiguous();
  return {image, mask.to(torch::kUInt8).contiguous()};
}

// Every pixel of `image` (3, h, w, uint8 or float in [0, 1]) that shows a class's colour exactly shows it where the
// mask holds that class; at least `share` of the pixels do (blends at the edges show no class's colour).
void expect_corresponds(const at::Tensor& image, const at::Tensor& mask, double share = 0.3) {
  const auto pixels = image.to(torch::kFloat64).div(image.is_floating_point() ? 1.0 : 255.0).flatten(1).t();
  const auto table = colours().to(torch::kFloat64).div(255);
  const auto distance = torch::cdist(pixels, table);  // (pixels, classes)
  const auto [nearest, which] = distance.min(1);
  const auto exact = nearest.lt(1e-5);
  const auto labels = mask.flatten().to(torch::kLong);
  const auto agree = which.eq(labels).logical_or(exact.logical_not());
  EXPECT_TRUE(agree.all().item<bool>()) << agree.logical_not().sum().item<std::int64_t>() << " pixels disagree";
  EXPECT_GE(exact.to(torch::kFloat64).mean().item<double>(), share);
}

void write(const fs::path& file, const std::string& bytes) {
  fs::create_directories(file.parent_path());
  std::ofstream(file, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

class SegmentationFolder : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / fmt::format("fastlearn-segmentation-{}-{}", ::getpid(), counter_++);
    for (int i = 0; i < 12; ++i) {
      auto [image, mask] = blocks(40 + i, 50 - i, 6, static_cast<std::uint64_t>(i));
      write(dir_ / "images" / fmt::format("item{:02}.png", i), fl::encode_png(image));
      write(dir_ / "masks" / fmt::format("item{:02}.png", i), fl::encode_png(mask.remainder(3).unsqueeze(0)));
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  fs::path dir_;
  static inline int counter_ = 0;
};

}  // namespace

TEST(PairTransforms, EveryWindowMovesTheImageAndItsMaskAsOne) {
  const auto picture = blocks(45, 61, 7, 1);
  const auto& image = picture.first;
  const auto& mask = picture.second;
  auto rng = at::make_generator<at::CPUGeneratorImpl>(3);
  for (const auto method : {fl::ResizeMethod::crop, fl::ResizeMethod::pad, fl::ResizeMethod::squish}) {
    for (const auto padding : {fl::PadMode::reflection, fl::PadMode::zeros, fl::PadMode::border}) {
      for (const auto size : {fl::ImageSize{24, 32}, fl::ImageSize{64, 40}, fl::ImageSize{30, 30}}) {
        SCOPED_TRACE(fmt::format("method {} padding {} size {}x{}", static_cast<int>(method), static_cast<int>(padding),
                                 size.height, size.width));
        const auto tfm = fl::resize_pair(size, method, padding);
        for (auto* generator : {static_cast<at::Generator*>(nullptr), &rng}) {
          const auto [x, m] = tfm(image, mask, generator);
          ASSERT_EQ(x.sizes(), (std::vector<std::int64_t>{3, size.height, size.width}));
          ASSERT_EQ(m.sizes(), (std::vector<std::int64_t>{size.height, size.width}));
          expect_corresponds(x, m);
          // The image is what resize_image makes of it with the same draws
          auto again = at::make_generator<at::CPUGeneratorImpl>(11);
          auto first = at::make_generator<at::CPUGeneratorImpl>(11);
          EXPECT_TRUE(tfm(image, mask, generator ? &first : nullptr)
                          .first.equal(fl::resize_image(image, size, method, generator ? &again : nullptr, padding)));
        }
      }
    }
  }
  const auto crop = fl::random_resized_crop_pair({20, 28}, {.min_scale = 0.3});
  for (int draw = 0; draw < 10; ++draw) {
    const auto [x, m] = crop(image, mask, &rng);
    ASSERT_EQ(m.sizes(), (std::vector<std::int64_t>{20, 28}));
    expect_corresponds(x, m, 0.1);
  }
  // Nearest is the pixel under each output pixel's centre (PIL's NEAREST; fastai's pixels in ResizeOracle), not torch's
  // legacy nearest (the pixel at the output pixel's corner): 5 -> 3 takes 0, 2, 4 (legacy 0, 1, 3), 3 -> 7 takes 0, 0,
  // 1, 1, 1, 2, 2 (legacy 0, 0, 0, 1, 1, 2, 2).
  const auto columns = torch::arange(5, torch::kUInt8).view({1, 5}).expand({2, 5}).contiguous();
  const auto squished =
      fl::resize_pair({2, 3}, fl::ResizeMethod::squish)(torch::zeros({3, 2, 5}, torch::kUInt8), columns, nullptr);
  EXPECT_TRUE(squished.second[0].equal(torch::tensor({0, 2, 4}, torch::kUInt8)));
  const auto grown = fl::resize_pair({2, 7}, fl::ResizeMethod::squish)(torch::zeros({3, 2, 3}, torch::kUInt8),
                                                                       columns.narrow(1, 0, 3).contiguous(), nullptr);
  EXPECT_TRUE(grown.second[1].equal(torch::tensor({0, 0, 1, 1, 1, 2, 2}, torch::kUInt8)));
  // A mask of another size than its image's is refused by name
  const auto message = fastlearn::testing::message_of([&] {
    fl::resize_pair({8, 8})(image, mask.narrow(0, 0, 10), nullptr);
  });
  EXPECT_NE(message.find("the mask is [10, 61] but its image [3, 45, 61]"), std::string::npos) << message;
}

TEST(PairTransforms, FlipsSymmetriesAndAffineWarpsMoveBatchMasksWithTheirImages) {
  std::vector<at::Tensor> images, masks;
  for (int i = 0; i < 6; ++i) {
    auto [image, mask] = blocks(32, 32, 5, 10 + i);
    images.push_back(image);
    masks.push_back(mask);
  }
  const fl::Batch original{{torch::stack(images).to(torch::kFloat32).div(255)}, {torch::stack(masks).to(torch::kLong)}};
  auto rng = at::make_generator<at::CPUGeneratorImpl>(5);
  const std::vector<std::pair<const char*, fl::BatchTransform>> transforms{
      {"random_flip", fl::random_flip(0.5, true)},
      {"dihedral", fl::dihedral(1.0, true)},
      {"aug_transforms",
       fl::aug_transforms({.max_rotate = 30, .max_zoom = 1.5, .max_warp = 0.3, .p_affine = 1.0, .p_lighting = 0.0},
                          true)}};
  for (const auto& [name, tfm] : transforms) {
    SCOPED_TRACE(name);
    auto batch = original;
    batch.inputs[0] = batch.inputs[0].clone();
    tfm(batch, rng);
    EXPECT_EQ(batch.targets[0].scalar_type(), torch::kLong);
    EXPECT_FALSE(batch.inputs[0].equal(original.inputs[0]));  // something moved
    for (int i = 0; i < 6; ++i) expect_corresponds(batch.inputs[0][i], batch.targets[0][i], 0.2);
  }
  // Dihedral keeps only square images whole
  fl::Batch wide{{torch::zeros({1, 3, 4, 6})}, {torch::zeros({1, 4, 6}, torch::kLong)}};
  EXPECT_THROW(fl::dihedral(1.0, true)(wide, rng), fl::DataError);
  // A transform asked to move masks refuses a target that is not one
  fl::Batch labels{{torch::zeros({2, 3, 4, 4})}, {torch::zeros({2}, torch::kLong)}};
  EXPECT_THROW(fl::random_flip(1.0, true)(labels, rng), fl::DataError);
}

TEST_F(SegmentationFolder, FromFoldersPairsByStemAndLoadsCorrespondingBatchesOfAnyShape) {
  auto dls = fl::SegmentationDataLoaders::from_folders(
      dir_ / "images", dir_ / "masks", {"background", "red", "green"},
      {.bs = 4,
       .seed = 1,
       .item_size = fl::ImageSize{24, 40},
       .min_scale = 0.5,
       .normalize = fl::ImageNormalization::none,
       .valid_pct = 0.25,
       .augment = fl::AugOptions{.max_rotate = 20, .p_affine = 1.0, .p_lighting = 0.0}});
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"background", "red", "green"}));
  EXPECT_EQ(dls.train().dataset().size(), 9);
  EXPECT_EQ(dls.valid().dataset().size(), 3);
  for (fl::DataLoader* dl : {&dls.train(), &dls.valid()}) {
    for (const auto& batch : *dl) {
      ASSERT_EQ(batch.inputs[0].sizes().slice(1), (std::vector<std::int64_t>{3, 24, 40}));
      ASSERT_EQ(batch.targets[0].sizes().slice(1), (std::vector<std::int64_t>{24, 40}));
      ASSERT_EQ(batch.targets[0].scalar_type(), torch::kLong);
      for (std::int64_t i = 0; i < batch.size(); ++i) {
        // Masks are the class index mod 3: class 3's blue shows as class 0 in the mask
        const auto labels = batch.targets[0][i];
        const auto blue =
            batch.inputs[0][i].select(0, 2).gt(0.999).logical_and(batch.inputs[0][i].select(0, 0).lt(1e-3));
        EXPECT_TRUE(labels.masked_select(blue).eq(0).all().item<bool>());
        EXPECT_LT(labels.max().item<std::int64_t>(), 3);
      }
    }
  }
}

TEST_F(SegmentationFolder, BadMasksAreRefusedBeforeTrainingNamingTheFile) {
  const std::vector<std::string> codes{"a", "b", "c"};
  auto refused = [&](const std::string& expected) {
    const auto message = fastlearn::testing::message_of(
        [&] { fl::SegmentationDataLoaders::from_folders(dir_ / "images", dir_ / "masks", codes, {.size = 16}); });
    EXPECT_NE(message.find(expected), std::string::npos) << message;
  };
  // A value that is no class: the value and a pixel
  auto bad = torch::zeros({1, 41, 49}, torch::kUInt8);
  bad[0][7][9] = 5;
  write(dir_ / "masks" / "item01.png", fl::encode_png(bad));
  refused("item01.png: mask value 5 at row 7, column 9 is not a class: there are 3 codes");
  // A mask of another size than its image
  write(dir_ / "masks" / "item01.png", fl::encode_png(torch::zeros({1, 40, 49}, torch::kUInt8)));
  refused("item01.png: the mask is 40x49 (height x width) but its image");
  // A JPEG mask in place of the PNG
  fs::remove(dir_ / "masks" / "item01.png");
  write(dir_ / "masks" / "item01.jpg", std::string("\xFF\xD8\xFF\xE0", 4) + std::string(100, '\0'));
  refused("a JPEG cannot be a mask");
  // An image without a mask
  fs::remove(dir_ / "masks" / "item01.jpg");
  refused("the image '" + (dir_ / "images" / "item01.png").string() + "' has no mask 'item01.*'");
  // from_label_func: a mask that does not exist
  const auto message = fastlearn::testing::message_of([&] {
    fl::SegmentationDataLoaders::from_label_func(
        {dir_ / "images" / "item00.png", dir_ / "images" / "item02.png"},
        [&](const fs::path& image) { return dir_ / "nowhere" / image.filename(); }, codes, {.size = 16});
  });
  EXPECT_NE(message.find("does not exist"), std::string::npos) << message;
}

TEST_F(SegmentationFolder, MasksOf0And255WithTwoCodesAreReadAs0And1SaidOnce) {
  for (int i = 0; i < 12; ++i) {
    auto [image, mask] = blocks(40 + i, 50 - i, 6, static_cast<std::uint64_t>(i));
    write(dir_ / "masks" / fmt::format("item{:02}.png", i),
          fl::encode_png(mask.gt(0).to(torch::kUInt8).mul(255).unsqueeze(0)));
  }
  testing::internal::CaptureStderr();
  auto dls = fl::SegmentationDataLoaders::from_label_func(
      fl::get_image_files(dir_ / "images"), [&](const fs::path& image) { return dir_ / "masks" / image.filename(); },
      {"background", "object"}, {.bs = 3, .size = 20, .flip_p = 0});
  const auto warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find("the masks hold only 0 and 255 and there are two codes: 255 is read as class 1 ('object')"),
            std::string::npos)
      << warning;
  const auto batch = dls.valid().one_batch();
  EXPECT_EQ(batch.targets[0].max().item<std::int64_t>(), 1);
  EXPECT_EQ(batch.targets[0].min().item<std::int64_t>(), 0);
}

TEST_F(SegmentationFolder, ClassificationTakesASquareItemSizeAndTheSymmetriesAndRefusesOtherShapes) {
  auto files = fl::get_image_files(dir_ / "images");
  std::vector<std::string> labels;
  for (std::size_t i = 0; i < files.size(); ++i) labels.push_back(i % 2 ? "odd" : "even");
  auto dls = fl::ImageDataLoaders::from_lists(files, labels,
                                              {.bs = 4,
                                               .seed = 3,
                                               .item_size = fl::ImageSize{20, 20},
                                               .flip_p = 1.0,
                                               .flip_vert = true,
                                               .normalize = fl::ImageNormalization::none});
  EXPECT_EQ(dls.train().one_batch().inputs[0].sizes(), (std::vector<std::int64_t>{4, 3, 20, 20}));
  const auto message = fastlearn::testing::message_of([&] {
    fl::ImageDataLoaders::from_lists(files, labels, {.item_size = fl::ImageSize{20, 30}});
  });
  EXPECT_NE(message.find("item_size 20x30 is not square"), std::string::npos) << message;
}

namespace {

// Masks as Pillow writes them: scripts/make-shapes with grey masks and with palette masks (Pillow packs a palette of
// three colours into 2 bits a pixel), and a 16-bit grey mask.
class PillowMasks : public fastlearn::testing::PythonData<PillowMasks> {
 protected:
  static void SetUpTestSuite() {
    make("pillow-masks",
         "'{python}' '{source}/scripts/make-shapes' '{dir}/grey' --count 12 && '{python}' "
         "'{source}/scripts/make-shapes' "
         "'{dir}/palette' --count 12 --palette && '{python}' -c \"import numpy as np; from PIL import Image; "
         "Image.fromarray(np.array([[0, 1, 2, 300, 65535]], dtype=np.uint16)).save('{dir}/wide.png')\"");
  }
};

}  // namespace

TEST_F(PillowMasks, PalettePngsOfAFewColoursGiveTheirIndicesAnd16BitMasksTheirValues) {
  for (int i = 0; i < 12; ++i) {
    const auto name = fmt::format("masks/shape_{:03}.png", i);
    EXPECT_TRUE(fl::read_mask(dir_ / "palette" / name).equal(fl::read_mask(dir_ / "grey" / name))) << name;
  }
  EXPECT_TRUE(fl::read_mask(dir_ / "wide.png").equal(torch::tensor({0, 1, 2, 300, 65535}, torch::kInt32).view({1, 5})));
  auto dls = fl::SegmentationDataLoaders::from_folders(dir_ / "palette" / "images", dir_ / "palette" / "masks",
                                                       {"background", "circle", "square"}, {.bs = 4, .size = 32});
  EXPECT_EQ(dls.valid().one_batch().targets[0].max().item<std::int64_t>(), 2);
}

TEST_F(SegmentationFolder, SubfoldersPairByPathBadImagesAreSkippedWhenAskedAndFlipVertNeedsSquares) {
  // The same name in two subfolders: each image with the mask at its own path
  for (const auto* sub : {"left", "right"}) {
    for (const auto* tree : {"images", "masks"}) {
      fs::create_directories(dir_ / tree / sub);
      fs::copy_file(dir_ / tree / "item03.png", dir_ / tree / sub / "item03.png");
    }
  }
  auto dls = fl::SegmentationDataLoaders::from_folders(dir_ / "images", dir_ / "masks", {"a", "b", "c"},
                                                       {.size = 16, .valid_pct = 0.25});
  EXPECT_EQ(dls.train().dataset().size() + dls.valid().dataset().size(), 14);
  const auto& pairs = dynamic_cast<const fl::SegmentationDataset&>(dls.train().dataset());
  for (std::size_t i = 0; i < pairs.images().size(); ++i) {
    EXPECT_EQ(pairs.images()[i].lexically_relative(dir_ / "images"),
              pairs.masks()[i].lexically_relative(dir_ / "masks"));
  }
  // An image that does not decode: an error naming it, or with skip_bad_images left out with its mask
  write(dir_ / "images" / "item05.png", fl::encode_png(torch::zeros({3, 45, 45}, torch::kUInt8)).substr(0, 60));
  testing::internal::CaptureStderr();
  auto kept = fl::SegmentationDataLoaders::from_folders(dir_ / "images", dir_ / "masks", {"a", "b", "c"},
                                                        {.size = 16, .skip_bad_images = true, .valid_pct = 0.25});
  const auto warning = testing::internal::GetCapturedStderr();
  EXPECT_NE(warning.find(
                "skipping 1 image(s) of SegmentationDataLoaders::from_folders, with their masks, that do not decode"),
            std::string::npos)
      << warning;
  EXPECT_EQ(kept.train().dataset().size() + kept.valid().dataset().size(), 13);
  // (as for classification, without skip_bad_images the first batch that holds it stops with an error naming it)
  const auto refused = fastlearn::testing::message_of([&] {
    auto all = fl::SegmentationDataLoaders::from_folders(dir_ / "images", dir_ / "masks", {"a", "b", "c"},
                                                         {.bs = 1, .size = 16, .valid_pct = 0.25});
    for (fl::DataLoader* dl : {&all.train(), &all.valid()}) {
      for (const auto& batch : *dl) (void)batch;
    }
  });
  EXPECT_NE(refused.find("item05.png"), std::string::npos) << refused;
  // flip_vert turns items by the square's symmetries: refused at once for other shapes
  const auto oblong = fastlearn::testing::message_of([&] {
    fl::SegmentationDataLoaders::from_folders(dir_ / "images", dir_ / "masks", {"a", "b", "c"},
                                              {.item_size = fl::ImageSize{16, 24}, .flip_vert = true});
  });
  EXPECT_NE(oblong.find("item size 16x24 is not square"), std::string::npos) << oblong;
}
