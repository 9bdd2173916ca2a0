#pragma once
// What predicting on new items needs from the data a model was trained on, without that data: how an image file
// becomes the model's input (decoding, resizing, normalization), a table's fitted procs and column roles, the shape
// of a tensor item, and the classes (vocabulary, multi-label) or target names. The image builders record their
// pipeline in the DataLoaders they make; the rest is read from the loaders' datasets. An export (learner/export.h)
// saves it as JSON, and loaders rebuilt from it hold no items but read new ones (test_dl) exactly as the
// validation items were read.
#include <fastlearn/core/image_size.h>
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_transforms.h>
#include <fastlearn/data/tabular_procs.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

/// How an image file becomes a model input, as the validation items were made: decoded in `mode` (JPEG at the
/// smallest scale keeping both sides >= decode_min_side), Resize(size, method, pad_mode), then scaled to [0, 1]
/// and, when `mean` is not empty, normalized per channel.
struct ImagePipeline {
  ImageMode mode = ImageMode::rgb;
  ImageSize size{224, 224};  ///< the items' height and width
  ResizeMethod method = ResizeMethod::crop;
  PadMode pad_mode = PadMode::reflection;
  std::int64_t decode_min_side = 0;
  std::vector<double> mean, std;  ///< one value per channel (1 grey, 3 RGB), or both empty
  /// Segmentation: the targets were masks (one class per pixel, the data's vocabulary its codes), resized with the
  /// images; the model's outputs are a score map per class.
  bool masks = false;
  /// The channels of the images (1 for grey, 3 for RGB).
  std::int64_t channels() const { return mode == ImageMode::gray ? 1 : 3; }
  bool operator==(const ImagePipeline&) const = default;
};

/// One input of a model that reads tensors: an item's shape (without the batch) and dtype ("float32", "int64",
/// "int32").
struct TensorInput {
  std::vector<std::int64_t> shape;
  std::string dtype = "float32";
  bool operator==(const TensorInput&) const = default;
};

struct InferencePipeline {
  enum class Kind {
    none,     ///< a dataset of the user's own: the loaders of new items come from the user
    images,   ///< image files (`image`)
    table,    ///< rows of a table (`procs`, `y_names`, `regression`)
    tensors,  ///< tensors per item, as `inputs` says
  };
  Kind kind = Kind::none;
  std::optional<ImagePipeline> image;
  std::shared_ptr<const TabularProcs> procs;
  std::vector<std::string> y_names;  ///< a table's target columns
  bool regression = false;           ///< a table's targets are values (else: one column of classes)
  TabularLayout table_layout;        ///< a table's batches and unknown categories
  std::vector<TensorInput> inputs;   ///< tensors: each input of an item (one for most models)
  std::int64_t c = 0;                ///< the model's outputs: classes, or targets for a regression
  std::vector<std::string> vocab;    ///< the class names (empty when the classes have none)
  bool multi_label = false;          ///< several classes per item (sigmoid outputs, decided by a threshold)
  /// Segmentation: a score map per class (N, c, H, W) for each item, each pixel's class its argmax (image->masks).
  bool masks() const { return image && image->masks; }
};

/// The pipeline of `dls`: the recorded image pipeline, a table's procs, a TensorDataset's item shape, or Kind::none.
InferencePipeline inference_pipeline(const DataLoaders& dls);

/// As JSON (the export's "pipeline" metadata; docs/checkpoints.md documents each field), and back. from_json checks
/// every field and size before it allocates anything: DataError naming `origin` and the field otherwise.
std::string to_json(const InferencePipeline& pipeline);
InferencePipeline inference_pipeline_from_json(std::string_view json, const std::string& origin);

struct InferenceLoaderOptions {
  std::int64_t bs = 64;  ///< batch size of the loaders of new items
  int num_workers = 0;
  std::optional<c10::Device> device;
};

/// DataLoaders with no items that read new ones as `pipeline` says (test_dl of ImageDataLoaders or
/// TabularDataLoaders, predict_image, predict_row); for Kind::none they only carry the classes.
DataLoaders inference_dataloaders(const InferencePipeline& pipeline, const InferenceLoaderOptions& options = {});

/// Normalization as the image loaders apply it: scaled by 1/255, then per channel by (mean, std) unless empty.
std::vector<BatchTransform> image_input_transforms(std::vector<double> mean, std::vector<double> std);

}  // namespace fastlearn
