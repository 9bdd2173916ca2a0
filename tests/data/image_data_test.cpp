// Image files as training data: listing and verifying files, the item transforms' geometry, and the
// ImageDataLoaders built from class folders, lists, names and CSV tables. The files are Fashion-MNIST
// written out by scripts/make-image-folders (with odd and bad files), made once per run of this binary.
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/aug_transforms.h>
#include <fastlearn/data/image_dataloaders.h>
#include <fastlearn/data/image_dataset.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_transforms.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/loss.h>
#include <fastlearn/models/models.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "support/message_of.h"
#include "support/python_data.h"

namespace fl = fastlearn;
namespace fs = std::filesystem;

namespace {

class ImageFiles : public fastlearn::testing::PythonData<ImageFiles> {
 protected:
  static void SetUpTestSuite() { make("images", "'{python}' '{source}/scripts/make-image-folders' '{dir}'"); }
  static std::vector<std::string> labels_of(const fl::DataLoader& dl, const std::vector<std::string>& vocab) {
    const auto& ds = dynamic_cast<const fl::ImageDataset&>(dl.dataset());
    std::vector<std::string> out;
    for (std::int64_t i = 0; i < ds.size(); ++i) out.push_back(vocab.at(ds.targets()[i].item<std::int64_t>()));
    return out;
  }
  // The first `n` training images of class Bag, by name (fewer when there are fewer).
  static std::vector<fs::path> first_bags(std::size_t n) {
    std::vector<fs::path> bags;
    for (const auto& e : fs::directory_iterator(dir_ / "png" / "train" / "Bag")) bags.push_back(e.path());
    std::sort(bags.begin(), bags.end());
    bags.resize(std::min(bags.size(), n));
    return bags;
  }
  static const fl::ImageDataset& dataset(const fl::DataLoader& dl) {
    return dynamic_cast<const fl::ImageDataset&>(dl.dataset());
  }
};

const std::vector<std::string> kClasses{"Ankle_boot", "Bag",   "Coat",    "Dress",       "Pullover",
                                        "Sandal",     "Shirt", "Sneaker", "T-shirt_top", "Trouser"};

// A 1 x h x w image whose pixel (y, x) is 10 * y + x: where a crop came from can be read off it.
at::Tensor coordinates(std::int64_t h, std::int64_t w) {
  return (torch::arange(h).view({h, 1}) * 10 + torch::arange(w).view({1, w})).to(torch::kUInt8).unsqueeze(0);
}

}  // namespace

TEST(ImageTransforms, CropTakesTheCentredSquareOrARandomOneAndKeepsTheSizeWhenItFits) {
  const auto image = coordinates(4, 8);
  // The shorter side is already the size: no resampling, only the crop.
  EXPECT_TRUE(torch::equal(fl::resize_image(image, 4, fl::ResizeMethod::crop), image.narrow(2, 2, 4)));
  std::set<std::int64_t> lefts;
  for (std::uint64_t seed = 0; seed < 40; ++seed) {
    auto rng = at::make_generator<at::CPUGeneratorImpl>(seed);
    const auto out = fl::resize_image(image, 4, fl::ResizeMethod::crop, &rng);
    const auto left = out[0][0][0].item<std::int64_t>();
    EXPECT_TRUE(torch::equal(out, image.narrow(2, left, 4))) << "seed " << seed;
    lefts.insert(left);
  }
  EXPECT_EQ(lefts, (std::set<std::int64_t>{0, 1, 2, 3, 4})) << "every position of the window is drawn";
}

TEST(ImageTransforms, SquishAndPadGiveTheirGeometry) {
  const auto flat = torch::full({3, 2, 8}, 200, torch::kUInt8);
  const auto squished = fl::resize_image(flat, 4, fl::ResizeMethod::squish);
  EXPECT_EQ(squished.sizes(), (std::vector<std::int64_t>{3, 4, 4}));
  EXPECT_TRUE(squished.eq(200).all().item<bool>()) << "a flat image stays flat";
  // 2 x 8 in an 8 x 8 window: 3 rows above and 3 below, then resampled to 4 x 4. Reflection and border fill
  // with the image's own value; zeros leave the middle rows' values and zeros around them.
  for (const auto mode : {fl::PadMode::reflection, fl::PadMode::border}) {
    const auto padded = fl::resize_image(flat, 4, fl::ResizeMethod::pad, nullptr, mode);
    EXPECT_EQ(padded.sizes(), (std::vector<std::int64_t>{3, 4, 4}));
    EXPECT_TRUE(padded.eq(200).all().item<bool>());
  }
  const auto zeros = fl::resize_image(flat, 4, fl::ResizeMethod::pad, nullptr, fl::PadMode::zeros);
  EXPECT_TRUE(zeros.narrow(1, 0, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(zeros.narrow(1, 3, 1).eq(0).all().item<bool>());
  EXPECT_TRUE(zeros.narrow(1, 1, 2).gt(0).all().item<bool>());
  // A one-pixel sliver has nothing to mirror: reflection repeats it.
  const auto sliver = fl::resize_image(torch::full({1, 1, 6}, 9, torch::kUInt8), 3, fl::ResizeMethod::pad);
  EXPECT_TRUE(sliver.eq(9).all().item<bool>());
  EXPECT_EQ(fl::pad_mode("border"), fl::PadMode::border);
  EXPECT_THROW(fl::pad_mode("mirror"), fl::DataError);
  EXPECT_THROW(fl::resize_image(torch::zeros({3, 4, 4}), 4, fl::ResizeMethod::crop), fl::DataError) << "not uint8";
  EXPECT_THROW(fl::resize_method("stretch"), fl::DataError);
}

// fastai's Resize on the same PNG files (tests/python/resize_oracle.py): the same window, padding and size.
class ResizeOracle : public fastlearn::testing::PythonData<ResizeOracle> {
 protected:
  static void SetUpTestSuite() {
    make("resize-oracle", "'{python}' -W ignore '{source}/tests/python/resize_oracle.py' '{dir}'");
  }
};

TEST_F(ResizeOracle, CropPadAndSquishGiveFastaisPixelsForImagesAndMasksOfAnyShape) {
  int compared = 0;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    const auto name = entry.path().stem().string();  // out_<w>x<h>_<size or height x width>_<method>_<pad mode>
    if (!name.starts_with("out_")) continue;
    std::vector<std::string> parts;
    std::stringstream fields(name);
    for (std::string part; std::getline(fields, part, '_');) parts.push_back(part);
    ASSERT_EQ(parts.size(), 5U) << name;
    const auto sides = parts[2].find('x');
    const fl::ImageSize size = sides == std::string::npos ? fl::ImageSize{std::stoll(parts[2]), std::stoll(parts[2])}
                                                          : fl::ImageSize{std::stoll(parts[2].substr(0, sides)),
                                                                          std::stoll(parts[2].substr(sides + 1))};
    const auto method = fl::resize_method(parts[3]);
    const auto padding = fl::pad_mode(parts[4]);
    const auto image = fl::read_image(dir_ / fmt::format("in_{}.png", parts[1]));
    const auto ours = fl::resize_image(image, size, method, nullptr, padding);
    const auto fastai = fl::read_image(entry.path());
    ASSERT_EQ(ours.sizes(), fastai.sizes()) << name;
    // The same window and fill; the resampling rounds a pixel now and then the other way from PIL's fixed-point
    // arithmetic (on these noise images at most 1 level, for at most a fifth of the values).
    const auto difference = (ours.to(torch::kInt) - fastai.to(torch::kInt)).abs();
    EXPECT_LE(difference.max().item<int>(), 1) << name;
    EXPECT_LT(difference.to(torch::kFloat).mean().item<float>(), 0.25) << name;
    // The mask of the same shape through the pair transform: fastai's PILMask, nearest, to the value
    const auto mask = fl::read_mask(dir_ / fmt::format("mask_in_{}.png", parts[1])).to(torch::kUInt8);
    const auto [moved_image, moved_mask] = fl::resize_pair(size, method, padding)(image, mask, nullptr);
    EXPECT_TRUE(moved_image.equal(ours)) << name;
    EXPECT_TRUE(moved_mask.to(torch::kInt32).equal(fl::read_mask(dir_ / ("mask_" + name + ".png")))) << name;
    ++compared;
  }
  EXPECT_EQ(compared, 120);  // 6 images, 4 sizes (2 square, 2 not), crop + squish + pad in 3 modes
}

TEST(ImageTransforms, RandomResizedCropIsSeededAndCentredWithoutAGenerator) {
  const auto image = coordinates(20, 24);
  auto a = at::make_generator<at::CPUGeneratorImpl>(7);
  auto b = at::make_generator<at::CPUGeneratorImpl>(7);
  const auto x = fl::random_resized_crop(image, 8, &a, {.min_scale = 0.3});
  EXPECT_TRUE(torch::equal(x, fl::random_resized_crop(image, 8, &b, {.min_scale = 0.3}))) << "same seed, same crop";
  EXPECT_EQ(x.sizes(), (std::vector<std::int64_t>{1, 8, 8}));
  EXPECT_TRUE(
      torch::equal(fl::random_resized_crop(image, 8, nullptr), fl::resize_image(image, 8, fl::ResizeMethod::crop)));
  // A full-scale, square-ratio crop of a square image is the whole image.
  const auto square = coordinates(8, 8);
  auto c = at::make_generator<at::CPUGeneratorImpl>(1);
  EXPECT_TRUE(torch::equal(fl::random_resized_crop(square, 8, &c, {.min_scale = 1.0, .ratio = {1.0, 1.0}}), square));
}

TEST(AugTransforms, WithNothingToDrawTheImagesComeBackUnchanged) {
  fl::Batch batch{{torch::rand({3, 3, 12, 16})}, {}};
  const auto before = batch.inputs[0].clone();
  auto rng = at::make_generator<at::CPUGeneratorImpl>(0);
  fl::aug_transforms(
      {.max_rotate = 0, .max_zoom = 1, .max_warp = 0, .p_affine = 1, .max_lighting = 0, .p_lighting = 1})(batch, rng);
  EXPECT_TRUE(batch.inputs[0].allclose(before, 1e-5, 1e-5)) << (batch.inputs[0] - before).abs().max();
}

TEST(AugTransforms, TheDrawsFollowTheGeneratorAndZoomAndLightingHaveTheirEffect) {
  const auto image = torch::rand({4, 3, 16, 16});
  auto run = [&](std::uint64_t seed, fl::AugOptions options) {
    fl::Batch batch{{image.clone()}, {}};
    auto rng = at::make_generator<at::CPUGeneratorImpl>(seed);
    fl::aug_transforms(options)(batch, rng);
    return batch.inputs[0];
  };
  EXPECT_TRUE(torch::equal(run(1, {}), run(1, {})));
  EXPECT_FALSE(torch::equal(run(1, {}), run(2, {})));
  // Zoom x2 on a left-to-right ramp: each row spans half of the ramp.
  const auto ramp = torch::linspace(0, 1, 17).view({1, 1, 1, 17}).expand({2, 1, 9, 17}).contiguous();
  fl::Batch zoomed{{ramp.clone()}, {}};
  auto rng = at::make_generator<at::CPUGeneratorImpl>(3);
  fl::aug_transforms({.max_rotate = 0, .min_zoom = 2, .max_zoom = 2, .max_warp = 0, .p_affine = 1, .p_lighting = 0})(
      zoomed, rng);
  const auto row = zoomed.inputs[0][0][0][0];
  EXPECT_NEAR((row.max() - row.min()).item<double>(), 0.5, 1e-4);
  // Brightness and contrast on a flat 0.5 image: contrast leaves logit 0 alone, brightness moves it within
  // [0.4, 0.6], the same for every pixel of an image.
  fl::Batch flat{{torch::full({8, 1, 4, 4}, 0.5)}, {}};
  fl::aug_transforms({.p_affine = 0, .max_lighting = 0.2, .p_lighting = 1})(flat, rng);
  const auto& lit = flat.inputs[0];
  EXPECT_TRUE(lit.ge(0.4 - 1e-6).all().item<bool>() && lit.le(0.6 + 1e-6).all().item<bool>()) << lit.flatten();
  EXPECT_TRUE(lit.amax({1, 2, 3}).sub(lit.amin({1, 2, 3})).lt(1e-6).all().item<bool>());
  EXPECT_THROW(fl::aug_transforms({.max_warp = 1}), fl::ConfigError);
  fl::Batch bytes{{torch::zeros({1, 3, 4, 4}, torch::kUInt8)}, {}};
  EXPECT_THROW(fl::aug_transforms()(bytes, rng), fl::DataError);
}

TEST_F(ImageFiles, GetImageFilesFindsEveryExtensionInAnyCaseSortedAndVerifyImagesNamesTheBadOnes) {
  const auto files = fl::get_image_files(dir_ / "odd");
  std::vector<std::string> names;
  for (const auto& f : files) names.push_back(fs::relative(f, dir_ / "odd").string());
  EXPECT_EQ(names,
            (std::vector<std::string>{"a/gray.jpg", "a/palette.png", "a/rgba.png", "b/CAPS.PNG", "b/nested/UPPER.JPG",
                                      "b/nested/sixteen.png", "c/notes.jpg", "c/truncated.jpg", "c/whole.jpg"}));
  const auto bad = fl::verify_images(dir_ / "odd", 2);
  ASSERT_EQ(bad.size(), 2u);
  EXPECT_EQ(bad[0].file, dir_ / "odd" / "c" / "notes.jpg");
  EXPECT_EQ(bad[1].file, dir_ / "odd" / "c" / "truncated.jpg");
  for (const auto& b : bad) EXPECT_NE(b.error.find(b.file.string()), std::string::npos) << b.error;
  EXPECT_THROW(fl::get_image_files(dir_ / "missing"), fl::DataError);
}

TEST_F(ImageFiles, FromFolderWithTrainAndValidFoldersLabelsByParentFolderWithASortedVocab) {
  auto dls = fl::ImageDataLoaders::from_folder(dir_ / "png", {.bs = 16, .seed = 1, .size = 28});
  EXPECT_EQ(dls.vocab(), kClasses);
  EXPECT_EQ(dls.c(), 10);
  EXPECT_FALSE(dls.multi_label());
  EXPECT_EQ(dls.train().dataset().size(), 200);
  EXPECT_EQ(dls.valid().dataset().size(), 100);
  const auto& train = dataset(dls.train());
  const auto labels = labels_of(dls.train(), dls.vocab());
  for (std::size_t i = 0; i < labels.size(); ++i) {
    EXPECT_EQ(labels[i], train.files()[i].parent_path().filename().string());
    EXPECT_EQ(train.files()[i].parent_path().parent_path().filename(), "train");
  }
  // Batches: RGB uint8 files become normalized float (N, 3, 28, 28) with their labels.
  std::int64_t seen = 0;
  for (const auto& batch : dls.valid()) {
    EXPECT_EQ(batch.inputs[0].sizes(), (std::vector<std::int64_t>{batch.size(), 3, 28, 28}));
    EXPECT_EQ(batch.inputs[0].scalar_type(), torch::kFloat32);
    EXPECT_EQ(batch.targets[0].scalar_type(), torch::kLong);
    seen += batch.size();
  }
  EXPECT_EQ(seen, 100);
  // The pixels are the file's, normalized with ImageNet's statistics.
  const auto first = *dls.valid().begin();
  const auto file = fl::read_image(dataset(dls.valid()).files()[0]).to(torch::kFloat32).div(255);
  const auto expected = (file - torch::tensor({0.485, 0.456, 0.406}).view({3, 1, 1})) /
                        torch::tensor({0.229, 0.224, 0.225}).view({3, 1, 1});
  EXPECT_TRUE(first.inputs[0][0].allclose(expected.to(torch::kFloat32), 1e-5, 1e-5));
}

// fastai's dls.test_dl: new files through the validation pipeline, without targets, for get_preds.
TEST_F(ImageFiles, TestDlGivesTheValidationPipelinesBatchesWithoutTargetsAndGetPredsReadsThem) {
  auto dls = fl::ImageDataLoaders::from_folder(dir_ / "png", {.bs = 16, .seed = 1, .size = 28});
  const auto& valid_files = dataset(dls.valid()).files();
  auto test = fl::ImageDataLoaders::test_dl(dls, valid_files);  // the validation files, as new ones
  EXPECT_EQ(test.n(), 100);
  auto valid_batch = dls.valid().begin();
  std::int64_t seen = 0;
  for (const auto& batch : test) {
    EXPECT_TRUE(batch.targets.empty());
    EXPECT_TRUE(torch::equal(batch.inputs[0], (*valid_batch).inputs[0])) << "batch at item " << seen;
    seen += batch.size();
    ++valid_batch;
  }
  EXPECT_EQ(seen, 100);
  torch::manual_seed(0);
  fl::Learner learn(dls, fl::models::simple_cnn(dls.c(), 3), fl::cross_entropy(), {.progress = false});
  const auto on_valid = learn.get_preds();
  const auto on_test = learn.get_preds(&test);
  EXPECT_FALSE(on_test.targets.defined());
  ASSERT_EQ(on_test.preds.size(0), 100);
  EXPECT_TRUE(torch::equal(on_test.preds, on_valid.preds));
  // Not image files: a clear error.
  auto x = torch::rand({4, 1, 8, 8});
  auto ds = std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x},
                                                std::vector<at::Tensor>{torch::zeros({4}, torch::kLong)});
  fl::DataLoaders tensors(fl::DataLoader(ds), fl::DataLoader(ds), 2);
  EXPECT_THROW(fl::ImageDataLoaders::test_dl(tensors, valid_files), fl::DataError);
  EXPECT_THROW(fl::ImageDataLoaders::test_dl(dls, {}), fl::DataError);
}

TEST_F(ImageFiles, AClassWithValidationImagesOnlyIsKeptWithAWarningNamingIt) {
  // train/ has Bag; valid/ has Bag and Coat: Coat gets an index for its targets, and a warning.
  const auto root = dir_ / "valid_only_class";
  const auto bags = first_bags(4);
  ASSERT_EQ(bags.size(), 4u);
  for (const auto& [split, label, file] :
       std::vector<std::tuple<const char*, const char*, fs::path>>{{"train", "Bag", bags[0]},
                                                                   {"train", "Bag", bags[1]},
                                                                   {"valid", "Bag", bags[2]},
                                                                   {"valid", "Coat", bags[3]}}) {
    fs::create_directories(root / split / label);
    fs::copy_file(file, root / split / label / file.filename(), fs::copy_options::overwrite_existing);
  }
  testing::internal::CaptureStderr();
  const auto dls = fl::ImageDataLoaders::from_folder(root, {.bs = 2, .size = 16});
  const auto warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"Bag", "Coat"}));
  EXPECT_NE(warning.find("1 class(es) have validation images but no training image, so the model cannot learn "
                         "them: Coat"),
            std::string::npos)
      << warning;
  testing::internal::CaptureStderr();
  (void)fl::ImageDataLoaders::from_folder(dir_ / "png", {.bs = 16, .size = 28});
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "") << "no warning when every class has training images";
}

TEST_F(ImageFiles, AnImageInASubfolderBelongsToItsClassFolder) {
  // train/Bag/nested/deeper/x.png is a Bag (as torchvision's ImageFolder has it), not a class "deeper" that
  // would merge the subfolders of every class; an image outside any class folder is left out, with a warning.
  const auto root = dir_ / "nested";
  const auto bags = first_bags(6);
  ASSERT_EQ(bags.size(), 6u);
  for (const auto& [folder, file] : std::vector<std::pair<fs::path, fs::path>>{{"train/Bag", bags[0]},
                                                                               {"train/Bag/nested/deeper", bags[1]},
                                                                               {"train/Coat", bags[2]},
                                                                               {"train/Coat/nested/deeper", bags[3]},
                                                                               {"train", bags[4]},
                                                                               {"valid/Coat/deeper", bags[5]}}) {
    fs::create_directories(root / folder);
    fs::copy_file(file, root / folder / file.filename(), fs::copy_options::overwrite_existing);
  }
  testing::internal::CaptureStderr();
  const auto dls = fl::ImageDataLoaders::from_folder(root, {.bs = 2, .size = 16});
  const auto warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"Bag", "Coat"}));
  EXPECT_EQ(dls.train().dataset().size(), 4);
  const auto& valid = static_cast<const fl::ImageDataset&>(dls.valid().dataset());
  EXPECT_EQ(valid.targets()[0].item<std::int64_t>(), 1) << "valid/Coat/deeper/x is a Coat";
  EXPECT_NE(warning.find("1 image(s) outside any class folder left out: " + bags[4].filename().string()),
            std::string::npos)
      << warning;
}

TEST_F(ImageFiles, AnEmptyClassFolderAndASingleClassAreNamedInWarnings) {
  const auto root = dir_ / "one_class";
  const auto bags = first_bags(4);
  ASSERT_EQ(bags.size(), 4u);
  for (std::size_t i = 0; i < 4; ++i) {
    fs::create_directories(root / "Bag");
    fs::copy_file(bags[i], root / "Bag" / bags[i].filename(), fs::copy_options::overwrite_existing);
  }
  fs::create_directories(root / "Coat");  // a class folder left empty
  testing::internal::CaptureStderr();
  const auto dls = fl::ImageDataLoaders::from_folder(root, {.bs = 1, .size = 16, .valid_pct = 0.25});
  const auto warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"Bag"}));
  EXPECT_NE(warning.find("1 folder(s) without a .jpg, .jpeg or .png image left out: Coat"), std::string::npos)
      << warning;
  EXPECT_NE(warning.find("every image has the label 'Bag': with one class every prediction is right"),
            std::string::npos)
      << warning;
}

// A class name goes into checkpoints (JSON), logs and SVG, all UTF-8: a class folder whose name is not UTF-8 is
// refused when the data is made, naming the folder, instead of an epoch later when the first checkpoint is written.
TEST_F(ImageFiles, AClassFolderWhoseNameIsNotUtf8IsRefusedNamingIt) {
  const auto root = dir_ / "latin1";
  const auto bags = first_bags(4);
  for (const auto& folder : {std::string("Bag"), std::string("Caf\xE9")}) {
    fs::create_directories(root / folder);
    for (const auto& bag : bags)
      fs::copy_file(bag, root / folder / bag.filename(), fs::copy_options::overwrite_existing);
  }
  const auto msg = fl::testing::message_of([&] { fl::ImageDataLoaders::from_folder(root, {.bs = 2, .size = 16}); });
  EXPECT_NE(msg.find("the class folder 'Caf\\xE9' of '" + root.string() +
                     "': its name 'Caf\\xE9' is not valid UTF-8 (byte 0xE9 at offset 3)"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("rename the folder"), std::string::npos) << msg;
  // Every other source of class names (here a list of labels) is held to the same.
  const auto files = fl::get_image_files(root / "Bag");
  const auto from_lists = fl::testing::message_of([&] {
    fl::ImageDataLoaders::from_lists(files, {"ok", "ok", std::string("bad\xFF"), "ok"},
                                     {.bs = 2, .size = 16, .valid_pct = 0.5});
  });
  EXPECT_NE(from_lists.find("'bad\\xFF' is not valid UTF-8 (byte 0xFF at offset 3)"), std::string::npos) << from_lists;
}

TEST(Text, ExcerptsAreBoundedAndEscapedAndUtf8IsCheckedExactly) {
  EXPECT_EQ(fl::excerpt("short"), "short");
  EXPECT_EQ(fl::excerpt(std::string(100, 'a'), 10), "aaaaaaaaaa... (100 bytes)");
  EXPECT_EQ(fl::excerpt("line\nbreak\t\xE9t\xC3\xA9"), "line\\x0Abreak\\x09\\xE9t\xC3\xA9")
      << "é stays, a lone 0xE9 does not";
  EXPECT_EQ(fl::excerpt("\xE2\x82\xAC\xE2\x82\xAC", 1), "\xE2\x82\xAC... (6 bytes)") << "characters, not bytes";
  EXPECT_FALSE(fl::invalid_utf8_at("plain, caf\xC3\xA9, \xF0\x9F\x98\x80"));
  EXPECT_EQ(fl::invalid_utf8_at("\xC0\xAF"), 0u) << "an overlong '/'";
  EXPECT_EQ(fl::invalid_utf8_at("ab\xED\xA0\x80"), 2u) << "a surrogate";
  EXPECT_EQ(fl::invalid_utf8_at("\xF4\x90\x80\x80"), 0u) << "above U+10FFFF";
  EXPECT_EQ(fl::invalid_utf8_at("abc\xE2\x82"), 3u) << "cut short";
}

TEST_F(ImageFiles, ACmykJpegFromPilDecodesToPilsRgbBitForBit) {
  // PIL writes Adobe-style CMYK (inverted inks, YCCK inside); its RGB conversion, saved losslessly, is the reference.
  const auto jpg = dir_ / "pil_cmyk.jpg", png = dir_ / "pil_cmyk_as_rgb.png";
  const auto script = fmt::format(
      "import numpy as np; from PIL import Image; "
      "a = (np.random.RandomState(0).rand(40, 56, 3) * 255).astype('uint8'); "
      "Image.fromarray(a).convert('CMYK').save('{}', quality=90); "
      "Image.open('{}').convert('RGB').save('{}')",
      jpg.string(), jpg.string(), png.string());
  const auto [code, output] =
      fastlearn::testing::run_shell(fmt::format("'{}' -c \"{}\" 2>&1", FASTLEARN_PYTHON, script));
  ASSERT_EQ(code, 0) << output;
  const auto ours = fl::read_image(jpg), pils = fl::read_image(png);
  ASSERT_EQ(ours.sizes(), pils.sizes());
  EXPECT_TRUE(torch::equal(ours, pils)) << "largest difference "
                                        << (ours.to(torch::kInt) - pils.to(torch::kInt)).abs().max().item<int>();
}

TEST_F(ImageFiles, ComputedStatisticsAreTheTrainingImagesOwn) {
  auto dls = fl::ImageDataLoaders::from_folder(
      dir_ / "png", {.bs = 16, .size = 28, .normalize = fl::ImageNormalization::computed, .stats_items = 0});
  // Every training file, as it is (28 px: the resize keeps it), pixel by pixel.
  std::vector<at::Tensor> pixels;
  for (const auto& file : dataset(dls.train()).files())
    pixels.push_back(fl::read_image(file).to(torch::kFloat64).div(255).flatten(1));
  const auto all = torch::cat(pixels, 1);
  const auto mean = all.mean(1), std = all.std(1, /*unbiased=*/false);
  const auto first = *dls.valid().begin();
  const auto file = fl::read_image(dataset(dls.valid()).files()[0]).to(torch::kFloat64).div(255);
  EXPECT_TRUE(
      first.inputs[0][0].to(torch::kFloat64).allclose((file - mean.view({3, 1, 1})) / std.view({3, 1, 1}), 1e-4, 1e-4));
  // A sample: drawn by the seed, the same each time, close to the whole set's.
  const auto& train = dataset(dls.train());
  const auto a = fl::channel_statistics(train, 50, 7, 1), b = fl::channel_statistics(train, 50, 7, 3);
  EXPECT_EQ(a.mean, b.mean) << "the thread count changed the result";
  EXPECT_EQ(a.std, b.std);
  EXPECT_NE(a.mean, fl::channel_statistics(train, 50, 8).mean);
  for (int c = 0; c < 3; ++c) EXPECT_NEAR(a.mean[c], mean[c].item<double>(), 0.05);
}

TEST_F(ImageFiles, ValidPctSplitIsReproducibleAndFollowsItsSeed) {
  auto valid_files = [&](std::uint64_t split_seed) {
    auto dls =
        fl::ImageDataLoaders::from_folder(dir_ / "jpg", {.size = 28, .valid_pct = 0.25, .split_seed = split_seed});
    EXPECT_EQ(dls.valid().dataset().size(), 75);
    EXPECT_EQ(dls.train().dataset().size(), 225);
    return dataset(dls.valid()).files();
  };
  EXPECT_EQ(valid_files(3), valid_files(3));
  EXPECT_NE(valid_files(3), valid_files(4));
  EXPECT_THROW(fl::ImageDataLoaders::from_folder(dir_ / "jpg", {.valid_pct = 1.0}), fl::DataError);
}

TEST_F(ImageFiles, BatchesAreTheSameWithAnyNumberOfWorkers) {
  auto batches = [&](int workers) {
    auto dls = fl::ImageDataLoaders::from_folder(
        dir_ / "png", {.bs = 32, .num_workers = workers, .seed = 5, .size = 24, .min_scale = 0.5});
    std::vector<at::Tensor> out;
    for (const auto& b : dls.train()) out.push_back(b.inputs[0]);
    return out;
  };
  const auto a = batches(0), b = batches(3);
  ASSERT_EQ(a.size(), 6u) << "200 items, batches of 32, the last dropped";
  ASSERT_EQ(a.size(), b.size());
  for (std::size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(torch::equal(a[i], b[i])) << "batch " << i;
}

TEST_F(ImageFiles, FromCsvWithAValidColumnAndMultiLabel) {
  auto dls = fl::ImageDataLoaders::from_csv(dir_ / "labels.csv", {.valid_col = "is_valid"}, {.size = 28});
  EXPECT_EQ(dls.vocab(), kClasses);
  EXPECT_EQ(dls.train().dataset().size(), 200);
  EXPECT_EQ(dls.valid().dataset().size(), 100);
  for (const auto& f : dataset(dls.valid()).files()) EXPECT_EQ(f.parent_path().parent_path().filename(), "valid");

  auto multi = fl::ImageDataLoaders::from_csv(dir_ / "multi.csv", {.label_delim = " "}, {.size = 28});
  EXPECT_TRUE(multi.multi_label());
  const auto& targets = dataset(multi.train()).targets();
  EXPECT_EQ(targets.scalar_type(), torch::kFloat32);
  EXPECT_EQ(targets.size(1), 10);
  EXPECT_TRUE(targets.sum(1).eq(2).all().item<bool>()) << "two labels per image";

  const auto error = fastlearn::testing::message_of(
      [&] { fl::ImageDataLoaders::from_csv(dir_ / "labels.csv", {.label_col = "class"}, {.size = 28}); });
  EXPECT_NE(error.find("labels.csv: no column 'class'; the columns are name, label, is_valid"), std::string::npos)
      << error;

  // A row naming a file that is not there is an error when the loaders are made, naming the row.
  std::ofstream(dir_ / "ghost.csv") << "name,label\n"
                                    << dataset(dls.train()).files()[0].lexically_relative(dir_).string()
                                    << ",a\nnothing_here.png,b\n";
  const auto missing = fastlearn::testing::message_of([&] { fl::ImageDataLoaders::from_csv(dir_ / "ghost.csv"); });
  EXPECT_NE(missing.find("ghost.csv: row 3 names '" + (dir_ / "nothing_here.png").string() + "', which does not exist"),
            std::string::npos)
      << missing;
}

TEST_F(ImageFiles, FromNameReTakesTheLabelFromTheFirstGroupAndNamesAFileThatDoesNotMatch) {
  auto files = fl::get_image_files(dir_ / "jpg");
  auto dls = fl::ImageDataLoaders::from_name_re(files, R"((train|valid)_\d+\.jpg)", {.size = 28});
  EXPECT_EQ(dls.vocab(), (std::vector<std::string>{"train", "valid"}));
  files.push_back(dir_ / "odd" / "a" / "gray.jpg");
  const auto error =
      fastlearn::testing::message_of([&] { fl::ImageDataLoaders::from_name_re(files, R"((train|valid)_\d+\.jpg)"); });
  EXPECT_NE(error.find("gray.jpg' does not match"), std::string::npos) << error;
}

TEST_F(ImageFiles, BadImagesStopTrainingNamingTheFileUnlessSkippedWithOneWarning) {
  const auto odd = dir_ / "odd";
  // valid_pct over 9 files: both splits get some; every file must decode to be loaded.
  auto strict = fl::ImageDataLoaders::from_folder(odd, {.bs = 2, .size = 16, .valid_pct = 0.3});
  const auto error = fastlearn::testing::message_of([&] {
    for (auto& dl : {&strict.train(), &strict.valid()}) {
      for (const auto& batch : *dl) (void)batch;
    }
  });
  EXPECT_TRUE(error.find("notes.jpg") != std::string::npos || error.find("truncated.jpg") != std::string::npos)
      << error;

  testing::internal::CaptureStderr();
  auto skipping =
      fl::ImageDataLoaders::from_folder(odd, {.bs = 2, .size = 16, .skip_bad_images = true, .valid_pct = 0.3});
  const auto warning = testing::internal::GetCapturedStderr();
  EXPECT_EQ(skipping.train().dataset().size() + skipping.valid().dataset().size(), 7);
  EXPECT_NE(warning.find("notes.jpg"), std::string::npos) << warning;
  EXPECT_NE(warning.find("truncated.jpg"), std::string::npos) << warning;
  std::int64_t seen = 0;
  for (auto* dl : {&skipping.train(), &skipping.valid()}) {
    for (const auto& batch : *dl) {
      EXPECT_EQ(batch.inputs[0].size(1), 3) << "gray, RGBA, palette and 16-bit files all come out RGB";
      seen += batch.size();
    }
  }
  EXPECT_GT(seen, 0);
}
