#pragma once
// fastai's aug_transforms as one batch transform on float images (N, C, H, W) in [0, 1]: per image, with
// probability p_affine, a rotation, a zoom about a random centre and a perspective warp, resampled together
// (bilinear, reflection padding, corners aligned); with probability p_lighting, brightness and contrast
// changes in logit space. Every draw comes from the batch's generator. Left-right flips are random_flip.
#include <fastlearn/data/transforms.h>

namespace fastlearn {

struct AugOptions {
  double max_rotate = 10.0;  ///< degrees, drawn uniformly in [-max_rotate, max_rotate]
  double min_zoom = 1.0;     ///< zoom factor drawn uniformly in [min_zoom, max_zoom] (> 1 magnifies)
  double max_zoom = 1.1;
  double max_warp =
      0.2;  ///< perspective: the top edge narrows and the left edge shortens by up to this (of half a side)
  double p_affine = 0.75;     ///< probability of the geometric change, per image
  double max_lighting = 0.2;  ///< brightness in [0.5(1-m), 0.5(1+m)], contrast in [1-m, 1/(1-m)] (log-uniform)
  double p_lighting = 0.75;   ///< probability of the lighting change, per image
};

/// The transform; ConfigError for options out of range. With `masks`, target 0 holds the images' segmentation masks,
/// (N, H, W) class indices, moved by each image's geometry (the same grid and padding, nearest neighbour); lighting
/// changes the images only.
BatchTransform aug_transforms(AugOptions options = {}, bool masks = false);

}  // namespace fastlearn
