#pragma once
// ImageDataLoaders: the train and valid loaders of an image classification task, from files (class
// folders, a CSV table, lists, names matched by a regular expression or a function) or from MNIST-format
// idx files. The vocabulary is the sorted set of labels; the valid_pct split is seeded (split_seed), so
// every rank of a distributed job and every rerun gets the same split.
//
// Files go through: decode (JPEG scaled down where the size allows) -> item transform in the workers
// (Resize, or RandomResizedCrop for training) -> uint8 batch -> training only: left-right flip -> to float
// in [0, 1] -> training, when asked: aug_transforms -> normalize (ImageNet statistics by default).
#include <fastlearn/data/aug_transforms.h>
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/image_decode.h>
#include <fastlearn/data/image_transforms.h>

#include <filesystem>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

/// Options of from_idx (MNIST-format files, already 28x28).
struct ImageDataLoadersOptions {
  std::int64_t bs = 64;
  std::int64_t valid_bs = 0;  ///< 0: twice bs, as there is no backward pass to hold memory for
  int num_workers = 0;
  std::optional<std::uint64_t> seed;
  bool normalize = true;          ///< scale to [0, 1], then per-channel mean/std of the training images
  bool augment = false;           ///< training only: random crop (padding crop_padding) and left-right flip (flip_p)
  std::int64_t crop_padding = 2;  ///< with augment: 0 leaves out the random crop
  double flip_p = 0.5;            ///< with augment: 0 leaves out the flip
  std::optional<c10::Device> device;
  /// The class names in label order (predictions, confusion matrices and exports show them); the class count is
  /// their number. Default: the folder's classes.txt, one name per line, when it has one (untar_data writes
  /// Fashion-MNIST's); otherwise none, and the classes are the labels' numbers.
  std::vector<std::string> classes;
};

/// Normalization of image files' batches.
enum class ImageNormalization {
  imagenet,  ///< torchvision's ImageNet mean and std (what pretrained weights expect)
  none,      ///< only scaled to [0, 1]
  computed,  ///< the training images' own per-channel mean and std (channel_statistics of up to stats_items)
};

/// Options of the loaders of image files.
struct ImageFilesOptions {
  std::int64_t bs = 64;
  std::int64_t valid_bs = 0;          ///< 0: twice bs
  int num_workers = 0;                ///< threads decoding and transforming batches (0: in the training thread)
  std::optional<std::uint64_t> seed;  ///< order and augmentation seed (default: drawn from torch's generator)
  std::optional<c10::Device> device;
  ImageMode mode = ImageMode::rgb;
  std::int64_t size = 224;  ///< items come out size x size
  /// Items of another shape, height x width (fastai's item_tfms=Resize((h, w))); replaces size. The segmentation
  /// loaders take any; the classification loaders a square one only (their exports record one side).
  std::optional<ImageSize> item_size;
  ResizeMethod method = ResizeMethod::crop;  ///< Resize(size, method) on every item
  PadMode pad_mode = PadMode::reflection;    ///< with method pad: what fills the window outside the image
  /// Below 1: training items go through RandomResizedCrop(size, {min_scale}) instead of Resize.
  double min_scale = 1.0;
  double flip_p = 0.5;  ///< training batches: left-right flip probability (0: none)
  /// Training batches: instead of the left-right flip, with probability flip_p one of the square's 8 symmetries
  /// (fastai's aug_transforms(flip_vert=True): Dihedral); square items only.
  bool flip_vert = false;
  ImageNormalization normalize = ImageNormalization::imagenet;
  /// With normalize = computed: how many training images (drawn by split_seed, so every rank draws the same)
  /// the statistics come from; 0: all of them.
  std::int64_t stats_items = 1024;
  /// Decode every file first; files that do not decode are left out with one warning that counts and names
  /// them (otherwise the first bad file stops training with an error naming it).
  bool skip_bad_images = false;
  double valid_pct = 0.2;         ///< share of the items for validation when no split is given
  std::uint64_t split_seed = 42;  ///< the valid_pct split's seed
  /// Training batches: aug_transforms (rotation, zoom, warp, lighting) between the scaling to [0, 1] and
  /// the normalization. AugOptions{} are fastai's aug_transforms() defaults.
  std::optional<AugOptions> augment;
};

/// Columns of from_csv (fastai's from_csv arguments).
struct ImageCsvColumns {
  std::string fn_col;       ///< file name column (empty: the first)
  std::string label_col;    ///< label column (empty: the second)
  std::string valid_col;    ///< a column of flags marking validation rows (csv_flag; empty: valid_pct split)
  std::string label_delim;  ///< non-empty: multi-label, labels separated by it
  std::string folder;       ///< prefix folder of the file names, under the CSV's folder
  std::string suffix;       ///< appended to each file name (e.g. ".jpg")
  char delimiter = ',';
};

struct ImageDataLoaders {
  /// MNIST-format folder: train-images/-labels for training, t10k-images/-labels for validation, each
  /// `*-idx3-ubyte` / `*-idx1-ubyte`, gzipped (.gz) or raw, and classes.txt (the class names) when it has one.
  /// Images stay uint8 in memory; batches are converted and normalized by the loader.
  static DataLoaders from_idx(const std::filesystem::path& dir, const ImageDataLoadersOptions& options = {});

  /// ImageNet-style folders: <path>/<train>/<label>/<file> and <path>/<valid>/<label>/<file> when
  /// <path>/<train> exists, else <path>/<label>/<file> split by valid_pct. An image's label is its class folder, the
  /// folder right under <path>/<train> (or <path>) that holds it, also from a subfolder of it, as torchvision's
  /// ImageFolder labels; images outside any class folder are left out with a warning.
  static DataLoaders from_folder(const std::filesystem::path& path, const ImageFilesOptions& options = {},
                                 const std::string& train = "train", const std::string& valid = "valid");
  /// Files with their labels, split by valid_pct.
  static DataLoaders from_lists(std::vector<std::filesystem::path> files, std::vector<std::string> labels,
                                const ImageFilesOptions& options = {});
  /// Labels from the first capture group of `pattern` matched against each file's name (the whole name
  /// must match); a file that does not match is an error naming it.
  static DataLoaders from_name_re(std::vector<std::filesystem::path> files, const std::string& pattern,
                                  const ImageFilesOptions& options = {});
  /// Labels from `label_of(file)`.
  static DataLoaders from_name_func(std::vector<std::filesystem::path> files,
                                    const std::function<std::string(const std::filesystem::path&)>& label_of,
                                    const ImageFilesOptions& options = {});
  /// fastai's dls.test_dl for image files: a loader over `files` through `dls`'s validation pipeline (decoding,
  /// item transform, batch transforms, validation batch size, device), in the files' order and without targets,
  /// for Learner::get_preds on new images; for from_idx's data, the files are decoded grey and squished to its
  /// side. DataError when `dls` holds no images.
  static DataLoader test_dl(const DataLoaders& dls, std::vector<std::filesystem::path> files);
  /// A CSV table of file names (relative to the CSV's folder / columns.folder) and labels.
  static DataLoaders from_csv(const std::filesystem::path& csv_file, const ImageCsvColumns& columns = {},
                              const ImageFilesOptions& options = {});
};

}  // namespace fastlearn
