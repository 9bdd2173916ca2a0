#include <fastlearn/data/aug_transforms.h>
#include <fastlearn/data/detail/model_input.h>
#include <fastlearn/data/inference_pipeline.h>
#include <fastlearn/data/transforms.h>

#include <iterator>

namespace fastlearn {

namespace {

constexpr double kImagenetMean[] = {0.485, 0.456, 0.406};
constexpr double kImagenetStd[] = {0.229, 0.224, 0.225};

}  // namespace

std::pair<std::vector<double>, std::vector<double>> model_input_mean_std(const ImageFilesOptions& options,
                                                                         const ChannelStatistics& computed) {
  std::vector<double> mean, std;
  if (options.normalize == ImageNormalization::computed) {
    mean = computed.mean, std = computed.std;
  } else if (options.normalize == ImageNormalization::imagenet && options.mode == ImageMode::gray) {
    mean = {(kImagenetMean[0] + kImagenetMean[1] + kImagenetMean[2]) / 3};
    std = {(kImagenetStd[0] + kImagenetStd[1] + kImagenetStd[2]) / 3};
  } else if (options.normalize == ImageNormalization::imagenet) {
    mean.assign(std::begin(kImagenetMean), std::end(kImagenetMean));
    std.assign(std::begin(kImagenetStd), std::end(kImagenetStd));
  }
  return {std::move(mean), std::move(std)};
}

std::vector<BatchTransform> to_model_input(const ImageFilesOptions& options, const ChannelStatistics& computed,
                                           std::vector<BatchTransform> between) {
  auto [mean, std] = model_input_mean_std(options, computed);
  if (between.empty()) return image_input_transforms(std::move(mean), std::move(std));
  std::vector<BatchTransform> tfms{to_float(1.0 / 255.0)};
  tfms.insert(tfms.end(), between.begin(), between.end());
  if (!mean.empty()) tfms.push_back(normalize(std::move(mean), std::move(std)));
  return tfms;
}

std::pair<DataLoader, DataLoader> image_loaders(std::shared_ptr<const Dataset> train,
                                                std::shared_ptr<const Dataset> valid, const ImageFilesOptions& options,
                                                const ChannelStatistics& stats, bool masks) {
  std::vector<BatchTransform> augment;
  if (options.augment) augment.push_back(aug_transforms(*options.augment, masks));
  auto train_tfms = to_model_input(options, stats, std::move(augment));
  if (options.flip_p > 0) {
    train_tfms.insert(train_tfms.begin(),
                      options.flip_vert ? dihedral(options.flip_p, masks) : random_flip(options.flip_p, masks));
  }
  DataLoaderOptions train_options{.bs = options.bs,
                                  .shuffle = true,
                                  .drop_last = true,
                                  .num_workers = options.num_workers,
                                  .seed = options.seed,
                                  .batch_tfms = std::move(train_tfms),
                                  .device = options.device};
  DataLoaderOptions valid_options{.bs = options.valid_bs > 0 ? options.valid_bs : 2 * options.bs,
                                  .num_workers = options.num_workers,
                                  .seed = options.seed,
                                  .batch_tfms = to_model_input(options, stats),
                                  .device = options.device};
  return {DataLoader(std::move(train), std::move(train_options)),
          DataLoader(std::move(valid), std::move(valid_options))};
}

}  // namespace fastlearn
