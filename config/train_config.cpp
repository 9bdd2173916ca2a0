#include <fastlearn/config/train_config.h>

#include <fastlearn/config/detail/byte_path.h>
#include <fastlearn/config/detail/strict_toml.h>
#include <fastlearn/config/registry.h>
#include <fastlearn/core/detail/text.h>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <functional>
#include <sstream>
#include <type_traits>

namespace fastlearn {

namespace {

using Check = std::string (*)(const TrainConfig&);

// When a key applies: given where `holds` is false, it is the error `unless`; the resolved config leaves it out.
struct Condition {
  bool (*holds)(const TrainConfig&) = nullptr;  // nullptr: everywhere
  std::string_view unless;
};

struct Rules {
  Condition applies;
  // The values a string key accepts when they depend on keys above it; the first is its default.
  std::vector<std::string> (*choices)(const TrainConfig&) = nullptr;
  // What is wrong with the config once the key is read, given or not ("" when nothing is).
  Check check = nullptr;
  bool omit_empty = false;  // a string key: "" means not set, and is left out of the resolved config
  // Its choices follow the task (classification or regression): data.y_block is decided before it is read.
  bool needs_task = false;
  // A file or folder: a path that is not UTF-8 is written in fastlearn's byte form and read back from it
  // (config/detail/byte_path.h).
  bool path = false;
};

// One key of the schema: its dotted name, what it accepts, when it applies, and the field it fills.
struct Key {
  // `field` of the struct that `section` gives for a TrainConfig; its type picks what the key accepts.
  template <class Section, class S, class T>
  Key(std::string_view key_name, Section section, T S::*field, strict::SpecFor<T> accepts = {}, Rules key_rules = {})
      : name(key_name), spec(std::move(accepts)), rules(key_rules) {
    get = [section, field](const TrainConfig& c) -> std::optional<strict::Value> {
      const T& value = section(c).*field;
      if constexpr (std::is_same_v<T, std::optional<double>>) {
        if (!value) return std::nullopt;
        return *value;
      } else if constexpr (std::is_same_v<T, Switch>) {
        return strict::switch_value(value);
      } else {
        return value;
      }
    };
    set = [section, field](TrainConfig& c, strict::Value value) {
      auto& out = section(c).*field;
      if constexpr (std::is_same_v<T, std::optional<double>>)
        out = std::get<double>(std::move(value));
      else if constexpr (std::is_same_v<T, Switch>)
        out = strict::switch_from(value);
      else
        out = std::get<T>(std::move(value));
    };
  }

  // A table whose keys have their own entries; `applies` as for a key.
  static Key table(std::string_view name, Condition applies = {}) { return Key(name, applies); }

  // A table that turns `field` (a std::optional member of what `section` gives) on when it is given.
  template <class Section, class S, class T>
  static Key optional_table(std::string_view name, Section section, std::optional<T> S::*field) {
    Key key(name, {});
    key.is_on = [section, field](const TrainConfig& c) { return (section(c).*field).has_value(); };
    key.turn_on = [section, field](TrainConfig& c) { (section(c).*field).emplace(); };
    return key;
  }

  bool applies(const TrainConfig& c) const { return !rules.applies.holds || rules.applies.holds(c); }

  std::string name;
  std::optional<strict::Spec> spec;  // nullopt: a table
  Rules rules;
  std::function<std::optional<strict::Value>(const TrainConfig&)> get;  // nullopt: not set, not written
  std::function<void(TrainConfig&, strict::Value)> set;
  std::function<bool(const TrainConfig&)> is_on;  // an optional table: whether it is on
  std::function<void(TrainConfig&)> turn_on;

 private:
  Key(std::string_view table_name, Condition applies) : name(table_name), rules{.applies = applies} {}
};

// The struct each table fills (in::train(config) is config.train); the keys below name their field in it.
namespace in {
constexpr auto data = [](auto& c) -> auto& { return c.data; };
constexpr auto transforms = [](auto& c) -> auto& { return c.data.transforms; };
constexpr auto synthetic = [](auto& c) -> auto& { return c.data.synthetic; };
constexpr auto model = [](auto& c) -> auto& { return c.model; };
constexpr auto train = [](auto& c) -> auto& { return c.train; };
constexpr auto distributed = [](auto& c) -> auto& { return c.distributed; };
constexpr auto callbacks = [](auto& c) -> auto& { return c.callbacks; };
// Used only once the table was given, which turned the optional on.
constexpr auto early_stopping = [](auto& c) -> auto& { return *c.callbacks.early_stopping; };
constexpr auto save_best = [](auto& c) -> auto& { return *c.callbacks.save_best; };
constexpr auto output = [](auto& c) -> auto& { return c.output; };
}  // namespace in

constexpr Condition images_only{
    [](const TrainConfig& c) { return is_images(c.data); },
    "applies to dataset = \"fashion_mnist\", \"image_folder\", \"image_csv\" or \"segmentation\" only"};
constexpr Condition idx_only{[](const TrainConfig& c) { return c.data.dataset == "fashion_mnist"; },
                             "applies to dataset = \"fashion_mnist\" only"};
constexpr Condition files_only{[](const TrainConfig& c) { return is_image_files(c.data); },
                               "applies to dataset = \"image_folder\", \"image_csv\" or \"segmentation\" only"};
constexpr Condition segmentation_only{[](const TrainConfig& c) { return c.data.dataset == "segmentation"; },
                                      "applies to dataset = \"segmentation\" only"};
constexpr Condition csv_only{[](const TrainConfig& c) { return c.data.dataset == "image_csv"; },
                             "applies to dataset = \"image_csv\" only"};
constexpr Condition tabular_only{[](const TrainConfig& c) { return is_tabular(c.data); },
                                 "applies to dataset = \"csv\" only"};
constexpr Condition has_files{
    [](const TrainConfig& c) { return c.data.dataset != "synthetic_regression" && c.data.dataset != "program"; },
    "does not apply to dataset = \"synthetic_regression\" or \"program\""};
constexpr Condition program_only{[](const TrainConfig& c) { return c.data.dataset == "program"; },
                                 "applies to dataset = \"program\" only"};
constexpr Condition one_input{
    [](const TrainConfig& c) { return c.data.dataset == "program" && c.data.input_shapes.empty(); },
    "applies to dataset = \"program\" only (and not beside data.input_shapes, which gives every input's shape)"};
constexpr Condition one_target{
    [](const TrainConfig& c) { return c.data.dataset == "program" && c.data.target_shapes.empty(); },
    "applies to dataset = \"program\" only (and not beside data.target_shapes, which gives every target's shape)"};
constexpr Condition split_by_pct{
    [](const TrainConfig& c) { return is_image_files(c.data) || is_tabular(c.data) || is_ratings(c.data); },
    "applies to dataset = \"image_folder\", \"image_csv\", \"segmentation\", \"csv\" or \"ratings\" only"};
constexpr Condition csv_files{
    [](const TrainConfig& c) { return c.data.dataset == "image_csv" || is_tabular(c.data) || is_ratings(c.data); },
    "applies to dataset = \"image_csv\", \"csv\" or \"ratings\" only"};
constexpr Condition ratings_only{[](const TrainConfig& c) { return is_ratings(c.data); },
                                 "applies to dataset = \"ratings\" only"};
constexpr Condition collab_only{
    [](const TrainConfig& c) { return c.model.arch == "collab" || c.model.arch == "collab_nn"; },
    "applies to arch = \"collab\" or \"collab_nn\" only"};
constexpr Condition layers_apply{
    [](const TrainConfig& c) { return c.model.arch == "tabular" || c.model.arch == "collab_nn"; },
    "applies to arch = \"tabular\" or \"collab_nn\" only"};
constexpr Condition valid_col_applies{
    [](const TrainConfig& c) { return c.data.dataset == "image_csv" || is_tabular(c.data); },
    "applies to dataset = \"image_csv\" or \"csv\" only"};
constexpr Condition tabular_model_only{[](const TrainConfig& c) { return c.model.arch == "tabular"; },
                                       "applies to arch = \"tabular\" only"};
constexpr Condition torchvision_only{
    [](const TrainConfig& c) { return c.model.arch.starts_with("resnet") && c.model.arch != "resnet"; },
    "applies to arch = \"resnet18\", \"resnet34\" or \"resnet50\" only"};
constexpr Condition torchscript_only{[](const TrainConfig& c) { return c.model.arch == "torchscript"; },
                                     "applies to arch = \"torchscript\" only"};
constexpr Condition scripted_loss_only{[](const TrainConfig& c) { return c.train.loss == "torchscript"; },
                                       "applies to loss = \"torchscript\" only"};
constexpr Condition unet_only{[](const TrainConfig& c) { return c.model.arch == "unet"; },
                              "applies to arch = \"unet\" only"};
constexpr Condition torchvision_body{
    [](const TrainConfig& c) { return torchvision_only.holds(c) || unet_only.holds(c); },
    "applies to arch = \"resnet18\", \"resnet34\", \"resnet50\" or \"unet\" only"};
constexpr Condition parameters_sharded{[](const TrainConfig& c) { return c.distributed.shard == "parameters"; },
                                       "applies to distributed.shard = \"parameters\" only"};
constexpr Condition synthetic_only{[](const TrainConfig& c) { return c.data.dataset == "synthetic_regression"; },
                                   "applies to dataset = \"synthetic_regression\" only"};
constexpr Condition hidden_applies{
    [](const TrainConfig& c) { return c.model.arch == "mlp" || c.model.arch == "field_cnn"; },
    "applies to arch = \"mlp\" or \"field_cnn\" only"};
constexpr Condition field_cnn_only{[](const TrainConfig& c) { return c.model.arch == "field_cnn"; },
                                   "applies to arch = \"field_cnn\" only"};
constexpr Condition resnet_only{[](const TrainConfig& c) { return c.model.arch == "resnet"; },
                                "applies to arch = \"resnet\" only"};
constexpr Condition staged_only{
    [](const TrainConfig& c) { return c.model.arch == "resnet" || c.model.arch == "conv_net"; },
    "applies to arch = \"resnet\" or \"conv_net\" only"};
constexpr Condition sgd_only{[](const TrainConfig& c) { return c.train.optimizer == "sgd"; },
                             "applies to optimizer = \"sgd\" only"};
constexpr Condition mixed_precision_only{[](const TrainConfig& c) { return c.train.mixed_precision; },
                                         "applies to mixed_precision = true only"};
constexpr Condition top_k_metric{[](const TrainConfig& c) {
                                   return std::find(c.train.metrics.begin(), c.train.metrics.end(), "top_k_accuracy") !=
                                          c.train.metrics.end();
                                 },
                                 "applies with train.metrics holding \"top_k_accuracy\" only"};
constexpr Condition scheduled{[](const TrainConfig& c) { return c.train.schedule != "constant"; },
                              "does not apply to schedule = \"constant\""};

constexpr strict::Number positive{.min_inclusive = false};
constexpr strict::Number fraction{.max = 1};

std::string known_metrics(const TrainConfig& c) {
  const auto known = metric_names(c);
  for (const auto& m : c.train.metrics) {
    if (c.data.dataset == "segmentation" && (m == "dice" || m == "jaccard_coeff") && c.data.codes.size() != 2)
      return fmt::format("\"{}\" measures class 1 of two, and data.codes names {}; use \"{}_multi\"", m,
                         c.data.codes.size(), m);
    if (std::find(known.begin(), known.end(), m) != known.end()) continue;
    if (!is_tabular(c.data))
      return fmt::format("unknown metric \"{}\" for {}; expected some of \"{}\"", excerpt(m), c.data.dataset,
                         fmt::join(known, "\", \""));
    // A table's task is data.y_block's: a metric of the other task says which y_block it needs.
    auto other = c;
    other.data.y_block = c.data.y_block == "regression" ? "category" : "regression";
    const auto theirs = metric_names(other);
    const auto hint = std::find(theirs.begin(), theirs.end(), m) == theirs.end()
                          ? std::string()
                          : fmt::format(" (\"{}\" needs data.y_block = \"{}\")", excerpt(m), other.data.y_block);
    return fmt::format("unknown metric \"{}\" for csv with y_block = \"{}\"; expected some of \"{}\"{}", excerpt(m),
                       c.data.y_block, fmt::join(known, "\", \""), hint);
  }
  return {};
}

std::string fine_tune_fits_model(const TrainConfig& c) {
  if (c.train.schedule != "fine_tune" || torchvision_body.holds(c)) return {};
  return "\"fine_tune\" trains a body and a head: it needs arch = \"resnet18\", \"resnet34\", \"resnet50\" or "
         "\"unet\"";
}

// segmentation: the classes' names, each once.
std::string codes_given(const TrainConfig& c) {
  const auto& codes = c.data.codes;
  if (c.data.dataset != "segmentation") return {};
  if (codes.empty()) return "dataset = \"segmentation\" needs the classes' names, in the masks' index order";
  if (codes.size() > 256) return fmt::format("names {} classes; masks hold at most 256", codes.size());
  for (std::size_t i = 0; i < codes.size(); ++i)
    if (std::find(codes.begin(), codes.begin() + static_cast<std::ptrdiff_t>(i), codes[i]) !=
        codes.begin() + static_cast<std::ptrdiff_t>(i))
      return fmt::format("names \"{}\" twice", excerpt(codes[i]));
  return {};
}

std::string item_size_fits(const TrainConfig& c) {
  const auto& s = c.data.item_size;
  if (s.empty()) return {};
  if (s.size() != 2) return fmt::format("is [height, width]; got {} values", s.size());
  if (s[0] < 8 || s[0] > 4096 || s[1] < 8 || s[1] > 4096) return "each side must be in [8, 4096]";
  return {};
}

// A file name pattern with "{stem}" once and no folder.
std::string mask_name_fits(const TrainConfig& c) {
  const auto& n = c.data.mask_name;
  if (n.empty()) return {};
  const auto at = n.find("{stem}");
  if (at == std::string::npos || n.find("{stem}", at + 1) != std::string::npos)
    return "must hold \"{stem}\" once (the image's name without its suffix), e.g. \"{stem}_P.png\"";
  if (n.find('/') != std::string::npos || n.find('\\') != std::string::npos)
    return "is a file name: the mask is in the image's sub-folder under data.masks";
  return {};
}

std::string path_given(const TrainConfig& c) {
  if ((is_tabular(c.data) || is_ratings(c.data)) && c.data.path.empty()) return "must name the CSV file";
  return is_image_files(c.data) && c.data.path.empty() ? "must name the folder of the images (or of the CSV file)" : "";
}

std::string columns_given(const TrainConfig& c) {
  const auto& d = c.data;
  if (!is_tabular(d)) return {};
  if (d.y_names.empty()) return "dataset = \"csv\" needs data.y_names (the target column or columns)";
  if (d.cat_names.empty() && d.cont_names.empty()) return "dataset = \"csv\" needs data.cat_names or data.cont_names";
  if (d.y_block == "category" && d.y_names.size() > 1)
    return "y_block = \"category\" takes one target column; several targets need y_block = \"regression\"";
  return {};
}

// data.y_block when the config does not give it (dataset = "csv"), as TabularOptions::regression's default: several
// targets make a regression, and one target does when `probe` finds its training values all numbers. Returns why,
// for the errors about the loss and metrics that follow from it.
std::string decide_y_block(TrainConfig& c, const RegressionProbe& probe) {
  auto& d = c.data;
  if (d.y_names.size() > 1) {
    d.y_block = "regression";
    return fmt::format("data.y_block is not set, and {} targets make a regression", d.y_names.size());
  }
  const auto regression = probe ? probe(c) : std::nullopt;
  d.y_block = regression.value_or(false) ? "regression" : "category";
  const auto target = d.y_names.empty() ? std::string() : d.y_names.front();
  if (!regression) return "data.y_block is not set, and with no data to read (is data.path right?) it is \"category\"";
  return *regression ? fmt::format(
                           "data.y_block is not set, and the training values of the target '{}' are all "
                           "numbers, so it is a regression",
                           excerpt(target))
                     : fmt::format(
                           "data.y_block is not set, and the target '{}' has training values that are not "
                           "numbers, so it is a category",
                           excerpt(target));
}

std::string known_procs(const TrainConfig& c) {
  static const std::vector<std::string> known{"categorify", "fill_missing", "normalize"};
  for (auto p = c.data.procs.begin(); p != c.data.procs.end(); ++p) {
    if (std::find(known.begin(), known.end(), *p) == known.end())
      return fmt::format("unknown proc \"{}\"; expected some of \"{}\"", excerpt(*p), fmt::join(known, "\", \""));
    if (std::find(c.data.procs.begin(), p, *p) != p) return fmt::format("proc \"{}\" is listed twice", excerpt(*p));
  }
  if (!c.data.cat_names.empty() &&
      std::find(c.data.procs.begin(), c.data.procs.end(), "categorify") == c.data.procs.end())
    return "categorical columns (data.cat_names) need the \"categorify\" proc";
  return {};
}

std::string one_field_delimiter(const TrainConfig& c) {
  const auto& d = c.data.delimiter;
  if (d.size() != 1)
    return fmt::format("must be one character (\",\", \";\", \"\\t\" or \"|\"), got \"{}\"", excerpt(d));
  if (d == "\"" || d == "\n" || d == "\r") return "cannot be a quote or a line break";
  return {};
}

std::string path_or_url(const TrainConfig& c) {
  if (c.data.path.empty() || c.data.url.empty()) return {};
  return "give either data.path (a local folder) or data.url, not both";
}

std::string recorded(const std::string& monitor, const TrainSectionConfig& train) {
  if (monitor == "valid_loss" || monitor == "train_loss") return {};
  if (std::find(train.metrics.begin(), train.metrics.end(), monitor) != train.metrics.end()) return {};
  return fmt::format("\"{}\" is not recorded; expected \"valid_loss\", \"train_loss\" or one of train.metrics (\"{}\")",
                     excerpt(monitor), fmt::join(train.metrics, "\", \""));
}

std::string early_stopping_monitor_recorded(const TrainConfig& c) {
  return recorded(c.callbacks.early_stopping->monitor, c.train);
}

std::string save_best_monitor_recorded(const TrainConfig& c) {
  return recorded(c.callbacks.save_best->monitor, c.train);
}

// A layer's width: more than this many units or channels is a mistake, not a model (and would be allocated as given).
constexpr std::int64_t kMaxWidth = 1 << 20;

std::string widths_bounded(const std::vector<std::int64_t>& widths) {
  for (const auto w : widths)
    if (w > kMaxWidth) return fmt::format("holds {}; a layer is at most {} wide", w, kMaxWidth);
  return {};
}
std::string hidden_bounded(const TrainConfig& c) { return widths_bounded(c.model.hidden); }
std::string widths_key_bounded(const TrainConfig& c) { return widths_bounded(c.model.widths); }
std::string layers_bounded(const TrainConfig& c) { return widths_bounded(c.model.layers); }
std::string y_range_fits(const TrainConfig& c) {
  const auto& r = c.model.y_range;
  if (r.empty()) return {};
  if (r.size() != 2 || !(r[0] < r[1])) return "is [low, high] with low < high (e.g. [0, 5.5]), or left out";
  return {};
}

// A program's sample shape: a few dimensions, each and their product bounded (a batch of them is allocated).
std::string sample_shape(const std::vector<std::int64_t>& shape) {
  if (shape.size() > 6) return fmt::format("has {} dimensions; a sample has at most 6", shape.size());
  std::int64_t n = 1;
  for (const auto d : shape) {
    if (d > (std::int64_t{1} << 24)) return fmt::format("holds {}; a dimension is at most {}", d, 1 << 24);
    n *= d;
    if (n > (std::int64_t{1} << 31)) return "describes a sample of more than 2^31 values";
  }
  return {};
}
std::string input_shape_fits(const TrainConfig& c) {
  if (!c.data.input_shapes.empty()) return {};  // data.input_shapes gives the shapes
  if (c.data.dataset == "program" && c.data.input_shape.empty())
    return "dataset = \"program\" needs it (or data.input_shapes): one sample's input shape, without the batch "
           "dimension (e.g. [64, 64])";
  return sample_shape(c.data.input_shape);
}
std::string target_shape_fits(const TrainConfig& c) {
  if (!c.data.target_shapes.empty()) return {};  // data.target_shapes gives the shapes
  if (c.data.dataset == "program" && c.data.target_shape.empty() && c.data.classes == 0)
    return "dataset = \"program\" needs it (or data.target_shapes): one sample's target shape, without the batch "
           "dimension (e.g. [64, 64])";
  return sample_shape(c.data.target_shape);
}
// data.input_shapes / target_shapes: a few tensors, each a sample shape.
std::string shapes_fit(const std::vector<std::vector<std::int64_t>>& shapes) {
  if (shapes.size() > 16) return fmt::format("lists {} tensors; a sample has at most 16", shapes.size());
  for (std::size_t i = 0; i < shapes.size(); ++i) {
    if (auto why = sample_shape(shapes[i]); !why.empty()) return fmt::format("its shape {} {}", i, why);
  }
  return {};
}
std::string input_shapes_fit(const TrainConfig& c) { return shapes_fit(c.data.input_shapes); }
std::string target_shapes_fit(const TrainConfig& c) { return shapes_fit(c.data.target_shapes); }
// data.input_dtypes / target_dtypes: known names, one per tensor.
std::string dtypes_fit(const std::vector<std::string>& dtypes, std::size_t tensors, const char* shapes_key) {
  for (const auto& d : dtypes) {
    if (d != "float32" && d != "int64" && d != "int32")
      return fmt::format("lists \"{}\"; each is \"float32\", \"int64\" or \"int32\"", excerpt(d, 40));
  }
  if (!dtypes.empty() && dtypes.size() != tensors)
    return fmt::format("lists {} dtype(s) for {} tensor(s) ({}): one each, or none (all float32)", dtypes.size(),
                       tensors, shapes_key);
  return {};
}
std::string input_dtypes_fit(const TrainConfig& c) {
  return dtypes_fit(c.data.input_dtypes, program_inputs(c.data).size(), "data.input_shapes or data.input_shape");
}
std::string target_dtypes_fit(const TrainConfig& c) {
  auto why =
      dtypes_fit(c.data.target_dtypes, program_targets(c.data).size(), "data.target_shapes or data.target_shape");
  if (why.empty() && c.data.dataset == "program" && c.data.classes > 0 && program_targets(c.data)[0].dtype != "int64")
    why = "data.classes makes the first target class indices: its dtype is \"int64\"";
  return why;
}

// field_cnn maps a field to a field of the same height and width: (C, H, W) or (H, W) samples, the target's H and W
// the input's.
std::string arch_fits_shapes(const TrainConfig& c) {
  if (c.data.dataset == "program" && (c.model.arch == "mlp" || c.model.arch == "field_cnn")) {
    const auto inputs = program_inputs(c.data), targets = program_targets(c.data);
    if (c.data.classes > 0 && (c.model.arch != "mlp" || !targets[0].shape.empty()))
      return fmt::format(
          "model.arch = \"{}\" with data.classes: only \"mlp\" classifies a program's samples, one class per sample "
          "(data.target_shape [] or left out); other targets need model.arch = \"torchscript\"",
          c.model.arch);
    const auto target_dtype = c.data.classes > 0 ? "int64" : "float32";
    if (inputs.size() != 1 || targets.size() != 1 || inputs[0].dtype != "float32" || targets[0].dtype != target_dtype)
      return fmt::format(
          "model.arch = \"{}\" reads one float32 input and one float32 target; these samples have {} input(s) and "
          "{} target(s) (data.input_shapes, data.target_shapes, their dtypes): use model.arch = \"torchscript\" or "
          "an arch of your own",
          c.model.arch, inputs.size(), targets.size());
  }
  if (c.model.arch != "field_cnn" || c.data.dataset != "program") return {};
  const auto& in = c.data.input_shape;
  const auto& out = c.data.target_shape;
  const auto spatial = [](const std::vector<std::int64_t>& s) {
    return std::vector<std::int64_t>(s.end() - 2, s.end());
  };
  if (in.size() < 2 || in.size() > 3 || out.size() != in.size())
    return fmt::format(
        "model.arch = \"field_cnn\" maps fields to fields: data.input_shape and data.target_shape are both [H, W] "
        "(one channel) or both [C, H, W]; got [{}] and [{}]",
        fmt::join(in, ", "), fmt::join(out, ", "));
  if (spatial(in) != spatial(out))
    return fmt::format(
        "model.arch = \"field_cnn\" keeps a field's height and width: data.input_shape [{}] and data.target_shape "
        "[{}] differ in them",
        fmt::join(in, ", "), fmt::join(out, ", "));
  return {};
}

std::string kernel_size_odd(const TrainConfig& c) {
  return c.model.kernel_size % 2 == 1 ? "" : "must be odd (zero padding then keeps a field's size)";
}

std::string dir_not_empty(const TrainConfig& c) { return c.output.dir.empty() ? "must not be empty" : ""; }

// "auto", "cpu", "cuda" or "cuda:N" (N a GPU index).
std::string device_spelled(const TrainConfig& c) {
  const std::string_view d = c.train.device;
  if (d == "auto" || d == "cpu" || d == "cuda") return {};
  if (d.starts_with("cuda:")) {
    const auto index = d.substr(5);
    if (!index.empty() && index.size() <= 4 &&
        std::all_of(index.begin(), index.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      return {};
  }
  return fmt::format(R"(must be "auto", "cpu", "cuda" or "cuda:N" (N: a GPU's index), got "{}{}")",
                     excerpt(d.substr(0, 40)), d.size() > 40 ? "..." : "");
}

std::string script_file_given(const TrainConfig& c) {
  return c.model.arch == "torchscript" && c.model.file.empty()
             ? "must name the TorchScript file of the model (torch.jit.save's) when arch = \"torchscript\""
             : "";
}

std::string loss_file_given(const TrainConfig& c) {
  return c.train.loss == "torchscript" && c.train.loss_file.empty()
             ? "must name the TorchScript file of the loss (torch.jit.save's) when loss = \"torchscript\""
             : "";
}

// distributed.devices: "cpu", "cuda" (alone: every GPU) or "cuda:N", at least two replicas when given.
std::string devices_spelled(const TrainConfig& c) {
  const auto& devices = c.distributed.devices;
  if (devices.empty()) return {};
  for (const auto& d : devices) {
    const bool index = d.starts_with("cuda:") && d.size() > 5 && d.size() <= 9 &&
                       std::all_of(d.begin() + 5, d.end(), [](char ch) { return ch >= '0' && ch <= '9'; });
    if (d != "cpu" && d != "cuda" && !index)
      return fmt::format(
          R"(lists "{}"; each device is "cpu", "cuda:N" (N: a GPU's index), or "cuda" alone (every GPU))",
          excerpt(d, 40));
  }
  if (std::find(devices.begin(), devices.end(), "cuda") != devices.end() && devices.size() != 1)
    return R"("cuda" stands for every visible GPU: give it alone, or list "cuda:N" devices)";
  if (devices.size() == 1 && devices.front() != "cuda")
    return "lists one device; give at least two (the CPU may be listed several times), or leave it out";
  return {};
}

// distributed.devices spelled right, and usable with the model: replicas sharing one GPU run one after another, so
// the BatchNorm statistics that sync_bn reduces inside backward would wait for each other (to_parallel refuses it
// too, once the model is built; the registry's entry says it here, before the data is read).
std::string devices_fit_the_model(const TrainConfig& c) {
  if (auto spelled = devices_spelled(c); !spelled.empty()) return spelled;
  const auto& devices = c.distributed.devices;
  if (devices.size() < 2 || !c.distributed.sync_bn || !devices.front().starts_with("cuda:") ||
      std::adjacent_find(devices.begin(), devices.end(), std::not_equal_to<>()) != devices.end())
    return {};
  for (const auto& arch : arch_choices()) {
    if (arch.name == c.model.arch && arch.holds_batch_norm && arch.holds_batch_norm(c))
      return fmt::format(
          "puts every replica on {} and model.arch = \"{}\" holds BatchNorm layers, which distributed.sync_bn = "
          "true would synchronize inside backward, where replicas on one GPU run one after another; set "
          "distributed.sync_bn = false (each replica's chunk keeps its own statistics) or give each replica a GPU of "
          "its own",
          excerpt(devices.front()), excerpt(arch.name));
  }
  return {};
}

// distributed.shard splits the state over processes; replicas of one process (distributed.devices) are not sharded.
std::string shard_without_devices(const TrainConfig& c) {
  if (c.distributed.shard == "none" || c.distributed.devices.empty()) return {};
  return fmt::format(
      "\"{}\" shards the training state over the processes of a launch, and distributed.devices trains replicas in "
      "one process, which are not sharded; leave one of them out",
      excerpt(c.distributed.shard));
}

// Every key, in the order they are read and written: the data first, since it decides which losses, metrics
// and models fit. A sub-table may come before its table's plain keys: the writer groups keys by table.
const std::vector<Key>& schema() {
  static const std::vector<Key> keys{
      Key("data.dataset", in::data, &DataConfig::dataset, {.choices = dataset_names()}),
      Key("data.path", in::data, &DataConfig::path, {},
          {.applies = has_files, .check = path_given, .omit_empty = true, .path = true}),
      Key("data.url", in::data, &DataConfig::url, {}, {.applies = idx_only, .check = path_or_url, .omit_empty = true}),
      Key("data.bs", in::data, &DataConfig::bs, {.min = 1}),
      Key("data.valid_bs", in::data, &DataConfig::valid_bs),
      Key("data.workers", in::data, &DataConfig::workers, {.max = 64}),
      Key("data.size", in::data, &DataConfig::size, {.min = 8, .max = 4096}, {.applies = files_only}),
      Key("data.item_size", in::data, &DataConfig::item_size, {.min = 8},
          {.applies = segmentation_only, .check = item_size_fits}),
      Key("data.images", in::data, &DataConfig::images, {}, {.applies = segmentation_only, .path = true}),
      Key("data.masks", in::data, &DataConfig::masks, {}, {.applies = segmentation_only, .path = true}),
      Key("data.mask_name", in::data, &DataConfig::mask_name, {},
          {.applies = segmentation_only, .check = mask_name_fits, .omit_empty = true}),
      Key("data.codes", in::data, &DataConfig::codes, {}, {.applies = segmentation_only, .check = codes_given}),
      Key("data.valid_pct", in::data, &DataConfig::valid_pct, {.min_inclusive = false, .max = 0.9},
          {.applies = split_by_pct}),
      Key("data.skip_bad_images", in::data, &DataConfig::skip_bad_images, {}, {.applies = files_only}),
      Key("data.csv", in::data, &DataConfig::csv, {}, {.applies = csv_only, .path = true}),
      Key("data.fn_col", in::data, &DataConfig::fn_col, {}, {.applies = csv_only, .omit_empty = true}),
      Key("data.label_col", in::data, &DataConfig::label_col, {}, {.applies = csv_only, .omit_empty = true}),
      Key("data.valid_col", in::data, &DataConfig::valid_col, {}, {.applies = valid_col_applies, .omit_empty = true}),
      Key("data.label_delim", in::data, &DataConfig::label_delim, {}, {.applies = csv_only, .omit_empty = true}),
      Key("data.delimiter", in::data, &DataConfig::delimiter, {}, {.applies = csv_files, .check = one_field_delimiter}),
      Key("data.y_names", in::data, &DataConfig::y_names, {}, {.applies = tabular_only, .check = columns_given}),
      Key("data.cat_names", in::data, &DataConfig::cat_names, {}, {.applies = tabular_only}),
      Key("data.cont_names", in::data, &DataConfig::cont_names, {}, {.applies = tabular_only}),
      Key("data.procs", in::data, &DataConfig::procs, {}, {.applies = tabular_only, .check = known_procs}),
      Key("data.y_block", in::data, &DataConfig::y_block, {.choices = {"category", "regression"}},
          {.applies = tabular_only}),
      Key("data.user", in::data, &DataConfig::user, {}, {.applies = ratings_only, .omit_empty = true}),
      Key("data.item", in::data, &DataConfig::item, {}, {.applies = ratings_only, .omit_empty = true}),
      Key("data.rating", in::data, &DataConfig::rating, {}, {.applies = ratings_only, .omit_empty = true}),
      Key("data.classes", in::data, &DataConfig::classes, {.max = 1'000'000}, {.applies = program_only}),
      Key("data.input_shapes", in::data, &DataConfig::input_shapes, {.min = 1},
          {.applies = program_only, .check = input_shapes_fit}),
      Key("data.input_shape", in::data, &DataConfig::input_shape, {.min = 1, .allow_empty = false},
          {.applies = one_input, .check = input_shape_fits}),
      Key("data.input_dtypes", in::data, &DataConfig::input_dtypes, {},
          {.applies = program_only, .check = input_dtypes_fit}),
      Key("data.target_shapes", in::data, &DataConfig::target_shapes, {.min = 1},
          {.applies = program_only, .check = target_shapes_fit}),
      Key("data.target_shape", in::data, &DataConfig::target_shape, {.min = 1},  // []: with data.classes
          {.applies = one_target, .check = target_shape_fits}),
      Key("data.target_dtypes", in::data, &DataConfig::target_dtypes, {},
          {.applies = program_only, .check = target_dtypes_fit}),
      Key("data.steps_per_epoch", in::data, &DataConfig::steps_per_epoch, {.min = 1, .max = 1'000'000'000},
          {.applies = program_only}),
      Key("data.held_out", in::data, &DataConfig::held_out, {.max = 100'000'000}, {.applies = program_only}),
      Key::table("data.transforms", images_only),
      Key("data.transforms.normalize", in::transforms, &TransformsConfig::normalize),
      Key("data.transforms.random_crop_padding", in::transforms, &TransformsConfig::random_crop_padding, {.max = 64},
          {.applies = idx_only}),
      Key("data.transforms.random_flip", in::transforms, &TransformsConfig::random_flip, fraction),
      Key("data.transforms.resize", in::transforms, &TransformsConfig::resize, {.choices = {"crop", "pad", "squish"}},
          {.applies = files_only}),
      Key("data.transforms.pad_mode", in::transforms, &TransformsConfig::pad_mode,
          {.choices = {"reflection", "zeros", "border"}}, {.applies = files_only}),
      Key("data.transforms.min_scale", in::transforms, &TransformsConfig::min_scale, {.min = 0.01, .max = 1},
          {.applies = files_only}),
      Key("data.transforms.augment", in::transforms, &TransformsConfig::augment, {}, {.applies = files_only}),
      Key("data.transforms.stats", in::transforms, &TransformsConfig::stats, {.choices = {"imagenet", "computed"}},
          {.applies = files_only}),
      Key::table("data.synthetic", synthetic_only),
      Key("data.synthetic.n_train", in::synthetic, &SyntheticRegressionConfig::n_train, {.min = 1, .max = 100'000'000}),
      Key("data.synthetic.n_valid", in::synthetic, &SyntheticRegressionConfig::n_valid, {.min = 1, .max = 100'000'000}),
      Key("data.synthetic.features", in::synthetic, &SyntheticRegressionConfig::features, {.min = 1, .max = 1'000'000}),
      Key("data.synthetic.noise", in::synthetic, &SyntheticRegressionConfig::noise),
      Key("data.synthetic.seed", in::synthetic, &SyntheticRegressionConfig::seed),

      Key("model.arch", in::model, &ModelConfig::arch, {}, {.choices = arch_names, .check = arch_fits_shapes}),
      Key("model.weights", in::model, &ModelConfig::weights, {},
          {.applies = torchvision_body, .omit_empty = true, .path = true}),
      Key("model.file", in::model, &ModelConfig::file, {},
          {.applies = torchscript_only, .check = script_file_given, .omit_empty = true, .path = true}),
      Key("model.body", in::model, &ModelConfig::body, {.choices = {"resnet18", "resnet34", "resnet50"}},
          {.applies = unet_only}),
      Key("model.hidden", in::model, &ModelConfig::hidden, {.min = 1},
          {.applies = hidden_applies, .check = hidden_bounded}),
      Key("model.kernel_size", in::model, &ModelConfig::kernel_size, {.min = 1, .max = 31},
          {.applies = field_cnn_only, .check = kernel_size_odd}),
      Key("model.widths", in::model, &ModelConfig::widths, {.min = 1, .allow_empty = false},
          {.applies = staged_only, .check = widths_key_bounded}),
      Key("model.blocks_per_stage", in::model, &ModelConfig::blocks_per_stage, {.min = 1, .max = 64},
          {.applies = resnet_only}),
      Key("model.stem_width", in::model, &ModelConfig::stem_width, {.min = 1, .max = kMaxWidth},
          {.applies = resnet_only}),
      Key("model.layers", in::model, &ModelConfig::layers, {.min = 1, .allow_empty = false},
          {.applies = layers_apply, .check = layers_bounded}),
      Key("model.embed_p", in::model, &ModelConfig::embed_p, {.max = 0.99}, {.applies = tabular_model_only}),
      Key("model.n_factors", in::model, &ModelConfig::n_factors, {.min = 1, .max = kMaxWidth},
          {.applies = collab_only}),
      Key("model.y_range", in::model, &ModelConfig::y_range, {}, {.applies = collab_only, .check = y_range_fits}),

      Key("train.epochs", in::train, &TrainSectionConfig::epochs, {.min = 1, .max = 1'000'000}),
      Key("train.lr", in::train, &TrainSectionConfig::lr, positive),
      Key("train.schedule", in::train, &TrainSectionConfig::schedule, {},
          {.choices = [](const TrainConfig&) { return schedule_names(); }, .check = fine_tune_fits_model}),
      Key("train.pct_start", in::train, &TrainSectionConfig::pct_start, fraction, {.applies = scheduled}),
      Key("train.optimizer", in::train, &TrainSectionConfig::optimizer, {},
          {.choices = [](const TrainConfig&) { return optimizer_names(); }}),
      Key("train.wd", in::train, &TrainSectionConfig::wd),
      Key("train.wd_bn_bias", in::train, &TrainSectionConfig::wd_bn_bias),
      Key("train.momentum", in::train, &TrainSectionConfig::momentum, fraction, {.applies = sgd_only}),
      Key("train.seed", in::train, &TrainSectionConfig::seed),
      Key("train.mixed_precision", in::train, &TrainSectionConfig::mixed_precision),
      Key("train.mixed_precision_dtype", in::train, &TrainSectionConfig::mixed_precision_dtype,
          {.choices = {"auto", "bf16", "fp16"}}, {.applies = mixed_precision_only}),
      Key("train.channels_last", in::train, &TrainSectionConfig::channels_last),
      Key("train.cuda_graph", in::train, &TrainSectionConfig::cuda_graph),
      Key("train.grad_accumulation", in::train, &TrainSectionConfig::grad_accumulation),
      Key("train.grad_clip", in::train, &TrainSectionConfig::grad_clip),
      Key("train.loss", in::train, &TrainSectionConfig::loss, {},
          {.choices = loss_names, .omit_empty = true, .needs_task = true}),
      Key("train.loss_file", in::train, &TrainSectionConfig::loss_file, {},
          {.applies = scripted_loss_only, .check = loss_file_given, .omit_empty = true, .path = true}),
      Key("train.activation", in::train, &TrainSectionConfig::activation, {.choices = {"none", "softmax", "sigmoid"}},
          {.applies = scripted_loss_only}),
      Key("train.metrics", in::train, &TrainSectionConfig::metrics, {},
          {.choices = metric_names, .check = known_metrics, .needs_task = true}),
      Key("train.top_k", in::train, &TrainSectionConfig::top_k, {.min = 1}, {.applies = top_k_metric}),
      Key("train.device", in::train, &TrainSectionConfig::device, {}, {.check = device_spelled}),
      Key("train.handle_signals", in::train, &TrainSectionConfig::handle_signals),

      Key("distributed.backend", in::distributed, &DistributedConfig::backend, {.choices = {"auto", "gloo", "nccl"}}),
      Key("distributed.sync_bn", in::distributed, &DistributedConfig::sync_bn),
      Key("distributed.bucket_cap_mb", in::distributed, &DistributedConfig::bucket_cap_mb, positive),
      Key("distributed.first_bucket_mb", in::distributed, &DistributedConfig::first_bucket_mb, positive),
      Key("distributed.timeout_seconds", in::distributed, &DistributedConfig::timeout_seconds, positive),
      Key("distributed.find_unused_parameters", in::distributed, &DistributedConfig::find_unused_parameters),
      Key("distributed.devices", in::distributed, &DistributedConfig::devices, {}, {.check = devices_fit_the_model}),
      Key("distributed.shard", in::distributed, &DistributedConfig::shard,
          {.choices = {"none", "optimizer", "gradients", "parameters"}}, {.check = shard_without_devices}),
      Key("distributed.shard_units", in::distributed, &DistributedConfig::shard_units, {},
          {.applies = parameters_sharded}),

      Key::optional_table("callbacks.early_stopping", in::callbacks, &CallbacksConfig::early_stopping),
      Key("callbacks.early_stopping.monitor", in::early_stopping, &EarlyStoppingConfig::monitor, {},
          {.check = early_stopping_monitor_recorded}),
      Key("callbacks.early_stopping.patience", in::early_stopping, &EarlyStoppingConfig::patience, {.min = 1}),
      Key("callbacks.early_stopping.min_delta", in::early_stopping, &EarlyStoppingConfig::min_delta),
      Key::optional_table("callbacks.save_best", in::callbacks, &CallbacksConfig::save_best),
      Key("callbacks.save_best.monitor", in::save_best, &SaveBestConfig::monitor, {},
          {.check = save_best_monitor_recorded}),
      Key("callbacks.csv_log", in::callbacks, &CallbacksConfig::csv_log),
      Key("callbacks.tensorboard", in::callbacks, &CallbacksConfig::tensorboard),

      Key("output.dir", in::output, &OutputConfig::dir, {}, {.check = dir_not_empty, .path = true}),
      Key("output.checkpoints", in::output, &OutputConfig::checkpoints),
      Key("output.checkpoint_every_n_batches", in::output, &OutputConfig::checkpoint_every_n_batches),
      Key("output.plots", in::output, &OutputConfig::plots),
  };
  return keys;
}

const std::vector<std::string>& key_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> all;
    for (const auto& key : schema()) all.push_back(key.name);
    return all;
  }();
  return names;
}

// Whether `key` lies in one of `tables`.
bool inside(std::string_view key, const std::vector<std::string_view>& tables) {
  return std::any_of(tables.begin(), tables.end(), [&](std::string_view table) {
    return key.size() > table.size() && key.starts_with(table) && key[table.size()] == '.';
  });
}

// Reads one key (a table: checks it is one, and turns an optional one on); returns whether it is given.
bool read_key(const strict::Document& doc, const Key& key, TrainConfig& config, std::vector<std::string_view>& off) {
  if (!key.spec) {
    const bool given = doc.table(key.name);
    if (key.turn_on && given) key.turn_on(config);
    if (key.turn_on && !given) off.push_back(key.name);  // its keys are not read
    return given;
  }
  strict::Spec spec = *key.spec;
  const auto choices = key.rules.choices ? key.rules.choices(config) : std::vector<std::string>{};
  if (auto* text = std::get_if<strict::String>(&spec); text && key.rules.choices) text->choices = choices;
  if (auto value = doc.read(key.name, spec)) {
    if (auto* text = std::get_if<std::string>(&*value); text && key.rules.path) {
      std::string why;
      auto path = path_from_config_text(*text, why);
      if (!path) doc.invalid(key.name, why);
      *text = std::move(*path);
    }
    key.set(config, std::move(*value));
    return true;
  }
  if (key.rules.choices && std::holds_alternative<strict::Strings>(spec))
    key.set(config, std::vector{choices.front()});
  else if (key.rules.choices)
    key.set(config, choices.front());
  return false;
}

std::string_view top_table(std::string_view key) { return key.substr(0, key.find('.')); }

// Whether the config gave data.dataset (or took its default).
bool dataset_given(const std::vector<Key>& keys, const std::vector<bool>& given) {
  for (std::size_t i = 0; i < keys.size(); ++i)
    if (keys[i].name == "data.dataset") return given[i];
  return false;
}

// Reads keys [begin, end), one table of the schema, into `config`: every value's type and range first, then whether
// the keys given apply, then the checks across keys. `decide_task` runs before the first key whose choices follow
// the task.
void read_table(const strict::Document& doc, const std::vector<Key>& keys, std::size_t begin, std::size_t end,
                TrainConfig& config, std::vector<std::string_view>& off, std::vector<bool>& given,
                const std::function<void()>& decide_task) {
  for (auto i = begin; i < end; ++i) {
    if (keys[i].rules.needs_task) decide_task();
    if (!inside(keys[i].name, off)) given[i] = read_key(doc, keys[i], config, off);
  }
  for (auto i = begin; i < end; ++i) {
    if (!given[i] || keys[i].applies(config)) continue;
    std::string why(keys[i].rules.applies.unless);
    if (why.find("dataset = ") != std::string::npos && !dataset_given(keys, given))
      why += "; data.dataset is not set, so it is \"fashion_mnist\" (the default): set it to your data's kind";
    doc.invalid(keys[i].name, why);
  }
  for (auto i = begin; i < end; ++i) {
    if (!keys[i].rules.check || inside(keys[i].name, off)) continue;
    if (const auto what = keys[i].rules.check(config); !what.empty()) doc.invalid(keys[i].name, what);
  }
}

// Table by table (data, model, ...), so a rule may look at any key of its table or of the tables above it.
TrainConfig read_config(const strict::Document& doc, const RegressionProbe& probe) {
  TrainConfig config;
  const auto& keys = schema();
  std::vector<std::string_view> off;  // optional tables not given
  std::vector<bool> given(keys.size());
  std::string decided;  // why data.y_block is what it is, when the data decided it
  for (std::size_t begin = 0, end = 0; begin < keys.size(); begin = end) {
    while (end < keys.size() && top_table(keys[end].name) == top_table(keys[begin].name)) ++end;
    try {
      read_table(doc, keys, begin, end, config, off, given, [&] {
        if (is_tabular(config.data) && config.data.y_block.empty()) decided = decide_y_block(config, probe);
      });
    } catch (const ConfigFileError& e) {
      // A loss or metric that does not fit a task the data chose: say that the data chose it, and how to choose.
      if (decided.empty() || (e.key() != "train.loss" && e.key() != "train.metrics")) throw;
      throw ConfigFileError(fmt::format("{} ({}; set data.y_block to choose)", e.what(), decided), e.key(), e.line(),
                            e.column());
    }
  }
  doc.reject_unknown();
  // fastai's EmbeddingNN has one hidden layer of n_factors when none are given (TabularModel's default is not its).
  if (config.model.arch == "collab_nn")
    for (std::size_t i = 0; i < keys.size(); ++i)
      if (keys[i].name == "model.layers" && !given[i]) config.model.layers = {config.model.n_factors};
  return config;
}

}  // namespace

Task task_of(const DataConfig& data) {
  if (data.dataset == "segmentation") return Task::segmentation;
  if (data.dataset == "image_csv" && !data.label_delim.empty()) return Task::multi_label;
  if (is_images(data) || (is_tabular(data) && data.y_block == "category") ||
      (data.dataset == "program" && data.classes > 0))
    return Task::classification;
  return Task::regression;
}

std::string_view to_string(Task task) {
  switch (task) {
    case Task::classification:
      return "classification";
    case Task::multi_label:
      return "multi_label";
    case Task::regression:
      return "regression";
    case Task::segmentation:
      return "segmentation";
  }
  return "?";
}

namespace {
std::vector<SampleTensor> sample_tensors(const std::vector<std::vector<std::int64_t>>& shapes,
                                         const std::vector<std::int64_t>& shape,
                                         const std::vector<std::string>& dtypes) {
  std::vector<SampleTensor> out;
  if (shapes.empty()) {
    out.push_back({.shape = shape});
  } else {
    for (const auto& s : shapes) out.push_back({.shape = s});
  }
  for (std::size_t i = 0; i < out.size() && i < dtypes.size(); ++i) out[i].dtype = dtypes[i];
  return out;
}
}  // namespace

std::vector<SampleTensor> program_inputs(const DataConfig& d) {
  return sample_tensors(d.input_shapes, d.input_shape, d.input_dtypes);
}
std::vector<SampleTensor> program_targets(const DataConfig& d) {
  auto targets = sample_tensors(d.target_shapes, d.target_shape, d.target_dtypes);
  if (d.classes > 0 && d.target_dtypes.empty()) targets[0].dtype = "int64";  // class indices
  return targets;
}

const std::vector<std::string>& dataset_names() {
  static const std::vector<std::string> names{"fashion_mnist", "image_folder",         "image_csv", "segmentation",
                                              "csv",           "synthetic_regression", "program",   "ratings"};
  return names;
}

bool is_images(const DataConfig& data) { return data.dataset == "fashion_mnist" || is_image_files(data); }

bool is_tabular(const DataConfig& data) { return data.dataset == "csv"; }

bool is_ratings(const DataConfig& data) { return data.dataset == "ratings"; }

// "auto": NHWC where oneDNN's conv kernels are faster (bench/README.md has the figures), as the arch says.
bool channels_last_on(const TrainConfig& config) {
  if (config.train.channels_last != Switch::automatic) return config.train.channels_last == Switch::on;
  for (const auto& arch : arch_choices())
    if (arch.name == config.model.arch) return arch.channels_last;
  return false;
}

bool is_image_files(const DataConfig& data) {
  return data.dataset == "image_folder" || data.dataset == "image_csv" || data.dataset == "segmentation";
}

TrainConfig parse_config(std::string_view toml_text, std::string_view source_name,
                         const std::vector<std::string>& overrides, const RegressionProbe& probe) {
  strict::Document doc(toml_text, source_name, key_names());
  for (const auto& assignment : overrides) doc.set(assignment);
  return read_config(doc, probe);
}

TrainConfig load_config(const std::string& path, const std::vector<std::string>& overrides,
                        const RegressionProbe& probe) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw ConfigFileError(fmt::format("{}: cannot read the configuration file (does it exist?)", excerpt(path, 256)),
                          "", 0, 0);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides, probe);
}

std::string describe_config_keys() { return strict::describe_tables(key_names()); }

TrainConfig check_config(const TrainConfig& config, const RegressionProbe& probe) {
  constexpr std::string_view kWhere = "config built in code";
  const auto refuse = [&](const std::string& key, const std::string& what) {
    throw ConfigFileError(fmt::format("{}: {}: {}", kWhere, key, what), key, 0, 0);
  };
  const TrainConfig defaults;
  std::vector<std::string_view> off;  // tables not on: their keys are not looked at
  for (const Key& key : schema()) {
    if (inside(key.name, off)) continue;
    if (!key.spec) {
      if (key.is_on && !key.is_on(config)) off.push_back(key.name);
      continue;
    }
    const auto value = key.get(config);
    if (!value) continue;
    const auto utf8 = [&](const std::string& text) {
      if (const auto at = invalid_utf8_at(text))
        refuse(key.name, fmt::format("'{}' is not valid UTF-8 (byte 0x{:02X} at offset {}), which a config's text is "
                                     "(only a path may hold other bytes)",
                                     excerpt(text), static_cast<unsigned char>(text[*at]), *at));
    };
    if (const auto* text = std::get_if<std::string>(&*value); text && !key.rules.path) utf8(*text);
    if (const auto* texts = std::get_if<std::vector<std::string>>(&*value))
      for (const auto& text : *texts) utf8(text);
    // A file that names a key where it does not apply is refused; to_toml would leave it out without a word.
    if (!key.applies(config) && value != key.get(defaults))
      refuse(key.name, fmt::format("{} (it is set away from its default)", key.rules.applies.unless));
  }
  try {
    return parse_config(to_toml(config), kWhere, {}, probe);
  } catch (const ConfigFileError& e) {  // the line of a text the caller never saw says nothing: the key does
    std::string message = e.what();
    if (message.starts_with(kWhere) && message.find(": ", kWhere.size()) != std::string::npos)
      message = fmt::format("{}{}", kWhere, message.substr(message.find(": ", kWhere.size())));
    throw ConfigFileError(message, e.key(), 0, 0);
  }
}

std::string to_toml(const TrainConfig& config) {
  strict::Writer writer;
  std::vector<std::string_view> off;  // tables that do not apply or are not on: their keys are left out
  for (const Key& key : schema()) {
    if (inside(key.name, off)) continue;
    const bool applies = key.applies(config);
    if (!key.spec) {
      if (applies && (!key.is_on || key.is_on(config)))
        writer.table(key.name);
      else
        off.push_back(key.name);
    } else if (auto value = key.get(config); applies && value) {
      if (auto* text = std::get_if<std::string>(&*value); text && key.rules.path) *text = path_to_config_text(*text);
      if (!key.rules.omit_empty || *value != strict::Value(std::string())) writer.put(key.name, *value);
    }
  }
  return "# The resolved configuration of this run: the file, the --set overrides and every default.\n"
         "# `fastlearn train` reads it back as it is.\n\n" +
         writer.text();
}

}  // namespace fastlearn
