// unet_learner: fastai's three parameter groups, the pretrained body frozen (a frozen epoch leaves its convolutions as
// loaded while the decoder trains), and the model sized by the data.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>
#include <fastlearn/data/image_encode.h>
#include <fastlearn/data/segmentation_dataloaders.h>
#include <fastlearn/learner/segmentation_metrics.h>
#include <fastlearn/learner/unet_learner.h>
#include <fastlearn/models/torchvision_resnet.h>
#include <fastlearn/models/unet.h>
#include <fastlearn/models/weights.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

namespace fl = fastlearn;
namespace fs = std::filesystem;

TEST(UnetLearner, FastaisThreeGroupsAndAFrozenPretrainedBodyThatAFrozenEpochLeavesAsLoaded) {
  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-unet-learner-{}", ::getpid());
  torch::manual_seed(0);
  for (int i = 0; i < 8; ++i) {
    const auto mask = torch::randint(0, 3, {1, 36, 44}, torch::kUInt8);
    for (const auto& [tree, bytes] :
         {std::pair{"images", fl::encode_png(mask.mul(80).expand({3, 36, 44}).contiguous())},
          std::pair{"masks", fl::encode_png(mask)}}) {
      fs::create_directories(dir / tree);
      std::ofstream(dir / tree / fmt::format("{}.png", i), std::ios::binary).write(bytes.data(), bytes.size());
    }
  }
  auto resnet = fl::models::resnet18();
  fl::save_safetensors(dir / "resnet18.safetensors", fl::models::model_tensors(*resnet));
  auto dls = fl::SegmentationDataLoaders::from_folders(
      dir / "images", dir / "masks", {"a", "b", "c"},
      {.bs = 2, .seed = 1, .item_size = fl::ImageSize{32, 40}, .valid_pct = 0.25});
  auto learn = fl::unet_learner(dls, {.arch = "resnet18", .weights = dir / "resnet18.safetensors"}, std::nullopt,
                                {.metrics = {fl::dice_multi()}, .progress = false});
  auto& unet = dynamic_cast<fl::models::UnetImpl&>(learn->model());
  EXPECT_EQ(unet.options().image_size, (fl::ImageSize{32, 40}));
  EXPECT_EQ(unet.options().classes, 3);
  // fastai's _resnet_split: stem + layer1 + layer2, layer3 + layer4, the decoder
  const auto groups = fl::unet_split(unet);
  ASSERT_EQ(groups.size(), 3U);
  auto count = [](const std::vector<at::Tensor>& group) {
    std::int64_t n = 0;
    for (const auto& p : group) n += p.numel();
    return n;
  };
  const auto params = resnet->named_parameters();
  std::int64_t stem = 0, deep = 0;
  for (const auto& param : params) {
    const auto& name = param.key();
    if (name.starts_with("layer3") || name.starts_with("layer4")) {
      deep += param.value().numel();
    } else if (!name.starts_with("fc")) {
      stem += param.value().numel();
    }
  }
  EXPECT_EQ(count(groups[0]), stem);
  EXPECT_EQ(count(groups[1]), deep);
  std::int64_t total = 0;
  for (const auto& p : unet.parameters()) total += p.numel();
  EXPECT_EQ(count(groups[2]), total - stem - deep);
  // Pretrained: the body frozen (its BatchNorms train, as fastai's train_bn), the decoder trains
  const auto body_conv = unet.named_parameters()["0.layer3.0.conv1.weight"].clone();
  const auto stem_conv = unet.named_parameters()["0.conv1.weight"].clone();
  const auto decoder_conv = unet.named_parameters()["4.conv1.0.weight"].clone();
  EXPECT_TRUE(body_conv.equal(params["layer3.0.conv1.weight"]));
  learn->fit_one_cycle(1, 1e-3);
  EXPECT_TRUE(unet.named_parameters()["0.layer3.0.conv1.weight"].equal(body_conv));
  EXPECT_TRUE(unet.named_parameters()["0.conv1.weight"].equal(stem_conv));
  EXPECT_FALSE(unet.named_parameters()["4.conv1.0.weight"].equal(decoder_conv));
  EXPECT_TRUE(std::isfinite(learn->recorder().history().back().metrics[0]));
  EXPECT_THROW(fl::unet_split(*fl::models::resnet18()), fl::ConfigError);
  fs::remove_all(dir);
}
