#pragma once
// A training run's configuration (what `fastlearn train CONFIG.toml` reads, docs/cli.md lists every key): its
// sections as plain structs, read strictly (unknown keys, wrong types and out-of-range values are errors that
// say where and what is expected) and written back resolved. One table in train_config.cpp describes every
// key; the names of losses, metrics, archs, optimizers and schedules come from config/registry.h, and
// config/learner_from_config.h turns a TrainConfig into a Learner.
#include <fastlearn/config/switch.h>
#include <fastlearn/core/error.h>  // ConfigFileError

#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

struct TransformsConfig {
  bool normalize = true;                 ///< to [0, 1], then the training images' mean / std (image files: ImageNet's)
  std::int64_t random_crop_padding = 0;  ///< fashion_mnist: > 0 pads by this and crops back at random (training)
  double random_flip = 0.0;              ///< probability of a left-right flip (training); 0: off
  std::string resize = "crop";           ///< image files: crop | pad | squish, to data.size
  std::string pad_mode = "reflection";   ///< image files, resize = pad: reflection | zeros | border
  double min_scale = 1.0;                ///< image files: < 1 uses RandomResizedCrop(size, min_scale) for training
  bool augment = false;                  ///< image files: fastai's aug_transforms() on training batches
  std::string stats = "imagenet";        ///< image files, with normalize: imagenet | computed (up to 1024 images)
  bool operator==(const TransformsConfig&) const = default;
};

/// y = x . w + b + noise, x ~ N(0, 1), w and b drawn from the seed as well.
struct SyntheticRegressionConfig {
  std::int64_t n_train = 2048;
  std::int64_t n_valid = 512;
  std::int64_t features = 8;
  double noise = 0.1;  ///< standard deviation of the noise added to y
  std::int64_t seed = 0;
  bool operator==(const SyntheticRegressionConfig&) const = default;
};

struct DataConfig {
  /// fashion_mnist | image_folder | image_csv | segmentation | csv | synthetic_regression | program | ratings
  std::string dataset = "fashion_mnist";
  std::string
      path;  ///< fashion_mnist: a local MNIST-format folder (default: url); image_*: the data; csv, ratings: the file
  std::string url;  ///< fashion_mnist: an archive for untar_data (default: Debian's copy)
  std::int64_t bs = 128;
  std::int64_t valid_bs = 0;  ///< 0: twice bs
  std::int64_t workers = 1;
  std::int64_t size = 224;  ///< image files: items come out size x size
  /// segmentation: [height, width] of the items when they are not square (empty: size x size)
  std::vector<std::int64_t> item_size;
  std::string images = "images";  ///< segmentation: the folder of the images, under data.path
  std::string masks = "labels";   ///< segmentation: the folder of the masks, under data.path
  /// segmentation: a mask's file name from its image's, "{stem}" standing for the image's name without its suffix
  /// (e.g. "{stem}_P.png"), in the image's sub-folder under data.masks. Empty: the mask with the image's path under
  /// data.images, any suffix (SegmentationDataLoaders::from_folders).
  std::string mask_name;
  std::vector<std::string> codes;  ///< segmentation: the classes' names, in the masks' index order
  double valid_pct = 0.2;          ///< image files without a train/valid split: share held out (seeded by train.seed)
  bool skip_bad_images = false;    ///< image files: leave out the files that do not decode, with one warning
  std::string csv = "labels.csv";  ///< image_csv: the table, under data.path
  std::string fn_col;              ///< image_csv: file name column (empty: the first)
  std::string label_col;           ///< image_csv: label column (empty: the second)
  std::string valid_col;           ///< image_csv, csv: column marking validation rows (empty: data.valid_pct)
  std::string label_delim;         ///< image_csv: non-empty makes a multi-label task, labels separated by it
  std::string delimiter = ",";  ///< image_csv, csv, ratings: the one character between a CSV file's fields (e.g. ";")
  std::vector<std::string> y_names;                                           ///< csv: the target column(s)
  std::vector<std::string> cat_names;                                         ///< csv: categorical columns
  std::vector<std::string> cont_names;                                        ///< csv: continuous columns
  std::vector<std::string> procs{"categorify", "fill_missing", "normalize"};  ///< csv: fastai's tabular procs
  /// csv: category (one categorical target) | regression. Not given: decided from the data as the C++ API decides
  /// (TabularOptions::regression): several targets, or one whose training values are all numbers, make a
  /// regression; a target with another value, a classification (see RegressionProbe).
  std::string y_block;
  /// ratings (collaborative filtering, CollabDataLoaders): the users', items' and ratings' columns (empty: the first,
  /// second and third)
  std::string user, item, rating;
  /// program (samples a running program hands over: the step API, the C interface): one sample's input and target,
  /// without the batch dimension (e.g. [64, 64] for a 64 x 64 field; [3, 64, 64] with 3 channels)
  std::vector<std::int64_t> input_shape;
  std::vector<std::int64_t> target_shape;
  /// program, several inputs (a scripted model's: features and indices, say): one sample's shape of each, instead of
  /// input_shape; likewise target_shapes for several targets (a loss's extra tensors among them).
  std::vector<std::vector<std::int64_t>> input_shapes;
  std::vector<std::vector<std::int64_t>> target_shapes;
  /// program: each input's (target's) dtype, "float32", "int64" or "int32"; empty: float32 for each.
  std::vector<std::string> input_dtypes;
  std::vector<std::string> target_dtypes;
  /// program: > 0 makes a classification of that many classes: the (first) target holds a class index per sample
  /// (int64, of target_shape, [] by default), the model a score per class (cross entropy, accuracy...); 0: regression.
  std::int64_t classes = 0;
  std::int64_t steps_per_epoch = 100;  ///< program: training steps between epoch ends; train.epochs of them in all
  std::int64_t held_out = 0;           ///< program: the last samples held out for validation (0: none)
  TransformsConfig transforms;
  SyntheticRegressionConfig synthetic;  ///< synthetic_regression only
  bool operator==(const DataConfig&) const = default;
};

struct ModelConfig {
  std::string arch = "simple_cnn";  ///< mlp | simple_cnn | conv_net | resnet (fashion_mnist); resnet18 | 34 | 50; unet;
                                    ///< tabular; field_cnn; collab | collab_nn (ratings); torchscript (any dataset)
  std::string file;     ///< torchscript: the scripted model (torch.jit.save's file); relative: the working directory's
  std::string weights;  ///< resnet18/34/50, unet: a torchvision state dict (safetensors) for the (U-Net's) body
  std::string body = "resnet34";                  ///< unet: its body, resnet18 | resnet34 | resnet50
  std::vector<std::int64_t> hidden{256, 128};     ///< mlp: hidden layer sizes; field_cnn: hidden layers' channels
  std::int64_t kernel_size = 3;                   ///< field_cnn: odd
  std::vector<std::int64_t> widths{32, 64, 128};  ///< resnet: channels of each stage; conv_net: of each stride-2 layer
  std::int64_t blocks_per_stage = 1;              ///< resnet
  std::int64_t stem_width = 32;                   ///< resnet
  /// tabular, collab_nn: hidden layer sizes (collab_nn, when a file leaves it out: [n_factors], as fastai)
  std::vector<std::int64_t> layers{200, 100};
  double embed_p = 0.0;         ///< tabular: dropout over the embeddings
  std::int64_t n_factors = 50;  ///< collab: the factors of each user and item
  std::vector<double> y_range;  ///< collab, collab_nn: [low, high], ratings squashed into it (empty: none)
  bool operator==(const ModelConfig&) const = default;
};

struct TrainSectionConfig {
  std::int64_t epochs = 3;
  double lr = 3e-3;
  std::string schedule = "one_cycle";  ///< one_cycle | flat_cos | constant | fine_tune (freeze_epochs 1)
  double pct_start = 0.25;             ///< one_cycle: warm-up fraction; flat_cos: flat fraction
  std::string optimizer = "adam";      ///< adam | adamw | sgd
  std::optional<double> wd;            ///< default: the optimizer's
  bool wd_bn_bias = false;             ///< weight decay on normalization layers and biases too (fastai's default: no)
  double momentum = 0.9;               ///< sgd only
  std::int64_t seed = 0;
  bool mixed_precision = false;                ///< bf16 autocast on CPU, fp16 with loss scaling on CUDA
  std::string mixed_precision_dtype = "auto";  ///< auto (as above) | bf16 | fp16 (with loss scaling)
  /// ChannelsLast (conv nets in NHWC memory format: faster oneDNN kernels); auto: as the arch's entry says
  /// (registry.h: on for simple_cnn, conv_net, resnet, resnet18/34/50, unet, off for mlp and tabular).
  Switch channels_last = Switch::automatic;
  bool cuda_graph = false;  ///< LearnerOptions::cuda_graph: each training step captured and replayed on a GPU
  std::int64_t grad_accumulation = 0;  ///< > 0: step once this many items were seen
  double grad_clip = 0.0;              ///< > 0: clip the gradients' global norm to this
  /// A loss that fits the task (registry.h): cross_entropy (classification, the default), bce_with_logits
  /// (multi-label), mse (regression, the default) or l1. Empty: the task's default.
  std::string loss;
  std::string loss_file;  ///< loss = "torchscript": the scripted loss (torch.jit.save's file)
  std::string activation =
      "none";  ///< loss = "torchscript": what makes predictions of the outputs (none | softmax | sigmoid)
  /// Metrics that fit the task: classification: accuracy, error_rate, top_k_accuracy (the target among the top_k
  /// highest scores), f1_macro; multi-label: accuracy_multi, fbeta_multi; regression: rmse, mse, mae. A file
  /// without the key gets the task's first (accuracy, accuracy_multi, rmse); an empty list means none.
  std::vector<std::string> metrics;
  std::int64_t top_k = 5;  ///< k of top_k_accuracy (fastai's default); at most the number of classes
  /// Where to train: auto (a GPU when one is visible, as fastai; with several ranks per host, each rank's own GPU
  /// when there is one for every rank, else the CPU) | cpu | cuda (the rank's GPU) | cuda:N (one process only)
  std::string device = "auto";
  /// Stop at a batch end with a checkpoint on SIGINT / SIGTERM (GracefulStop). false leaves the signals to the program
  /// (a simulation code with a wall-time handler of its own): the fit installs no handler.
  bool handle_signals = true;
  bool operator==(const TrainSectionConfig&) const = default;
};

struct DistributedConfig {
  std::string backend = "auto";  ///< auto (NCCL when every rank has a GPU of its own, else Gloo) | gloo | nccl
  bool sync_bn = true;
  double bucket_cap_mb = 25.0;
  double first_bucket_mb = 1.0;
  double timeout_seconds = 1800;
  bool find_unused_parameters = false;
  /// Several devices of this one process, a replica of the model on each (ParallelTrainer): "cpu" (listed n times
  /// for n CPU replicas), "cuda" (every visible GPU) or "cuda:N". Empty: one device. Not with several processes.
  std::vector<std::string> devices;
  /// What each rank keeps of the training state: none | optimizer (its share of the optimizer's state) | gradients
  /// (and its share of the gradients) | parameters (and of the parameters of each unit); see
  /// DistributedTrainerOptions::shard. Not with devices.
  std::string shard = "none";
  /// With shard = parameters: the units, by dotted module path ("*" for any characters of one name); empty: the model's
  /// default units (DistributedTrainerOptions::shard_units).
  std::vector<std::string> shard_units;
  bool operator==(const DistributedConfig&) const = default;
};

struct EarlyStoppingConfig {
  std::string monitor = "valid_loss";
  std::int64_t patience = 3;
  double min_delta = 0.0;
  bool operator==(const EarlyStoppingConfig&) const = default;
};

struct SaveBestConfig {
  /// The best epoch's weights go to checkpoints/best and are loaded back at the end.
  std::string monitor = "valid_loss";
  bool operator==(const SaveBestConfig&) const = default;
};

struct CallbacksConfig {
  std::optional<EarlyStoppingConfig> early_stopping;  ///< on when the table is present
  std::optional<SaveBestConfig> save_best;            ///< on when the table is present
  bool csv_log = true;                                ///< history.csv
  bool tensorboard = false;                           ///< TensorBoard event files in <out>/tensorboard
  bool operator==(const CallbacksConfig&) const = default;
};

struct OutputConfig {
  std::string dir = "runs/train";  ///< --out overrides
  bool checkpoints = true;         ///< a checkpoint after every epoch in checkpoints/ (what --resume continues from)
  std::int64_t checkpoint_every_n_batches = 0;  ///< also one every N training batches (0: only at epoch ends)
  bool plots = true;                            ///< loss.svg
  bool operator==(const OutputConfig&) const = default;
};

struct TrainConfig {
  DataConfig data;
  ModelConfig model;
  TrainSectionConfig train;
  DistributedConfig distributed;
  CallbacksConfig callbacks;
  OutputConfig output;
  bool operator==(const TrainConfig&) const = default;
};

/// For dataset = "csv" with one target and no data.y_block: whether the data makes a regression (the target's
/// training values are all numbers), from the config read so far (the data table, and train.seed for the split).
/// nullopt when it cannot tell (no such file: the run reports it). Without a probe, or with nullopt, such a target
/// is a category.
using RegressionProbe = std::function<std::optional<bool>(const TrainConfig&)>;

/// One tensor of a program's samples: its shape without the batch dimension, and its dtype ("float32", "int64",
/// "int32").
struct SampleTensor {
  std::vector<std::int64_t> shape;
  std::string dtype = "float32";
  bool operator==(const SampleTensor&) const = default;
};
/// A program's inputs (targets), in order: data.input_shapes with data.input_dtypes, or data.input_shape alone.
std::vector<SampleTensor> program_inputs(const DataConfig& data);
std::vector<SampleTensor> program_targets(const DataConfig& data);

/// The probe that reads data.path's CSV file and decides as TabularDataLoaders does (its training rows' values of
/// the target all numbers: a regression); nullopt when data.path is not a file.
std::optional<bool> regression_of_data(const TrainConfig& config);

/// Reads a TOML configuration, applies `overrides` ("key.path=value", as `--set`; the value is TOML, or a
/// bare string) and validates everything; the result has every default filled in, data.y_block too (from
/// `probe` when the data decides it). ConfigFileError on a syntax error (line and column), an unknown key (its
/// line and the closest valid key), a wrong type or an out-of-range value (the key and what is expected).
/// `source_name` names the text in messages.
TrainConfig parse_config(std::string_view toml_text, std::string_view source_name,
                         const std::vector<std::string>& overrides = {}, const RegressionProbe& probe = {});

/// Reads the file `path` and parse_config()s it, the task of a table decided from its data as the CLI decides it;
/// ConfigFileError when it cannot be read. A relative data.path is the working directory's.
TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides = {},
                        const RegressionProbe& probe = regression_of_data);

/// A config built in code, checked as a value as a file would be (what a file leaves out being at its default): a
/// key set away from its default where it does not apply, or a string that is not UTF-8 (a path has its byte form),
/// is refused by key, where to_toml would drop the one and could not write the other; then every range, choice and
/// rule is checked and the defaults resolved as parse_config does. Errors are ConfigFileErrors that name the key and
/// "config built in code" as where.
TrainConfig check_config(const TrainConfig& config, const RegressionProbe& probe = regression_of_data);

/// The configuration as TOML, every key spelled out; parse_config(to_toml(c), ...) == c.
std::string to_toml(const TrainConfig& config);

/// Every key of the schema, one line per section ("[train] epochs, lr, ..."), for --help.
std::string describe_config_keys();

/// What a model learns; the losses and metrics that fit it differ (config/registry.h).
enum class Task { classification, multi_label, regression, segmentation };
/// The task of the data: segmentation for dataset = "segmentation", multi_label for image_csv with a label_delim,
/// classification for the other images and for a table with y_block = "category", regression otherwise.
Task task_of(const DataConfig& data);
/// "classification", "multi_label", "regression" or "segmentation".
std::string_view to_string(Task task);

/// The values data.dataset takes, in order (the first is the default).
const std::vector<std::string>& dataset_names();
/// fashion_mnist, image_folder, image_csv or segmentation: images.
bool is_images(const DataConfig& data);
/// csv: a table (tabular data).
bool is_tabular(const DataConfig& data);
/// ratings: a table of ratings (collaborative filtering).
bool is_ratings(const DataConfig& data);
/// Whether training uses ChannelsLast: train.channels_last, where "auto" is on for the conv models and off for
/// mlp and tabular.
bool channels_last_on(const TrainConfig& config);
/// image_folder, image_csv or segmentation: the user's image files.
bool is_image_files(const DataConfig& data);

}  // namespace fastlearn
