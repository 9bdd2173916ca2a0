#pragma once
// Segmentation predictions for image files at the image's own size. The whole image is resized by the scale that the
// validation pipeline gives its items (Resize crop: the larger of item/image on each side, so the crop's scale; pad:
// the smaller; squish: each side's own) without cropping or padding, the model (which takes any size) predicts every
// pixel, and the class probabilities are resized bilinearly back to the image's height and width. Nothing is cut off,
// and each pixel is seen at the scale the model was trained at.
#include <fastlearn/core/image_size.h>
#include <fastlearn/data/image_transforms.h>
#include <fastlearn/learner/learner.h>

#include <filesystem>
#include <string>
#include <vector>

namespace fastlearn {

struct MaskPrediction {
  at::Tensor mask;             ///< (H, W) int64 class indices, the image's height and width, on the CPU
  at::Tensor probs;            ///< (classes, H, W) float probabilities, on the CPU (undefined unless asked for)
  std::vector<double> shares;  ///< each class's share of the pixels of `mask`, in the codes' order
};

struct PredictMaskOptions {
  /// Also return the probabilities at the image's size (classes x H x W floats: at most 2^28 of them). Without them
  /// the mask is made row by row from the model's output, in little memory, for images of any size.
  bool probs = true;
};

/// `file` predicted by `learn`, whose data must be segmentation images (SegmentationDataLoaders, or an export of
/// them). DataError naming the file when it does not decode, when its prediction would exceed 4096 pixels a side
/// (a strip of 1 x 65536 pixels with crop), or when the probabilities asked for exceed their bound; ConfigError for
/// other data.
MaskPrediction predict_mask(Learner& learn, const std::filesystem::path& file, const PredictMaskOptions& options = {});

/// The size a whole image of size `image` is resized to for prediction, when the items were made at `items` by Resize
/// with `method` (at least 1 on each side).
ImageSize prediction_size(ImageSize image, ImageSize items, ResizeMethod method);

}  // namespace fastlearn
