#include "cli/config.h"

#include <fastlearn/core/suggest.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

namespace fastlearn::cli {

namespace {

std::string type_name(const toml::node& node) {
  switch (node.type()) {
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return "an array";
    case toml::node_type::string: return fmt::format("the string \"{}\"", *node.value<std::string>());
    case toml::node_type::integer: return fmt::format("the integer {}", *node.value<std::int64_t>());
    case toml::node_type::floating_point: return fmt::format("the float {}", *node.value_exact<double>());
    case toml::node_type::boolean: return fmt::format("the boolean {}", *node.value<bool>());
    case toml::node_type::date: return "a date";
    case toml::node_type::time: return "a time";
    case toml::node_type::date_time: return "a date-time";
    default: return "nothing";
  }
}

// What every reader shares: where the text came from, which keys --set gave, and every key the
// schema knows (filled as the readers ask for keys), for suggestions across sections.
struct Context {
  std::string source;
  std::map<std::string, std::string> overridden;  // dotted key -> the --set argument
  std::vector<std::string> known;                 // dotted keys of the schema
  struct Unknown {
    std::string key;  // dotted
    toml::source_region where;
  };
  std::vector<Unknown> unknown;

  // "config.toml:3:9", or "--set train.epochs=x" for a value given on the command line.
  std::string location(const std::string& key, const toml::source_region& where) const {
    for (std::string prefix = key;;) {
      if (auto it = overridden.find(prefix); it != overridden.end()) return fmt::format("--set {}", it->second);
      const auto dot = prefix.rfind('.');
      if (dot == std::string::npos) break;
      prefix.resize(dot);
    }
    if (where.begin.line == 0) return source;
    return fmt::format("{}:{}:{}", source, where.begin.line, where.begin.column);
  }

  [[noreturn]] void fail(const std::string& key, const toml::source_region& where, const std::string& what) const {
    const bool from_set = location(key, where).starts_with("--set");
    throw ConfigFileError(fmt::format("{}: {}", location(key, where), what), key,
                          from_set ? 0 : static_cast<int>(where.begin.line),
                          from_set ? 0 : static_cast<int>(where.begin.column));
  }
};

// Reads the keys of one table of the schema; keys it was not asked for are unknown (see finish()).
class Section {
 public:
  Section(Context& ctx, const toml::table* table, std::string prefix)
      : ctx_(ctx), table_(table), prefix_(std::move(prefix)) {}

  std::string dotted(std::string_view key) const { return prefix_.empty() ? std::string(key) : prefix_ + "." + std::string(key); }
  bool present() const { return table_ != nullptr; }
  bool has(std::string_view key) const { return table_ && table_->contains(key); }

  /// A sub-table (absent: a Section that reads nothing, so defaults stay).
  Section table(std::string_view key) {
    const toml::node* node = find(key);
    if (node && !node->is_table()) expected(key, *node, "a table");
    return Section(ctx_, node ? node->as_table() : nullptr, dotted(key));
  }

  bool read(std::string_view key, bool& out) {
    const toml::node* node = find(key);
    if (!node) return false;
    if (!node->is_boolean()) expected(key, *node, "a boolean (true or false)");
    out = *node->value<bool>();
    return true;
  }

  bool read(std::string_view key, std::int64_t& out, std::int64_t min,
            std::int64_t max = std::numeric_limits<std::int64_t>::max()) {
    const toml::node* node = find(key);
    if (!node) return false;
    const std::string range = max == std::numeric_limits<std::int64_t>::max() ? fmt::format("an integer >= {}", min)
                                                                               : fmt::format("an integer in [{}, {}]", min, max);
    if (!node->is_integer()) expected(key, *node, range);
    const auto value = *node->value<std::int64_t>();
    if (value < min || value > max) expected(key, *node, range);
    out = value;
    return true;
  }

  /// A float (an integer is accepted too) with min < value (or min <= value when min_inclusive) and value <= max.
  bool read(std::string_view key, double& out, double min, bool min_inclusive,
            double max = std::numeric_limits<double>::infinity()) {
    const toml::node* node = find(key);
    if (!node) return false;
    std::string range = fmt::format("a number {} {}", min_inclusive ? ">=" : ">", min);
    if (std::isfinite(max)) range += fmt::format(" and <= {}", max);
    if (!node->is_number()) expected(key, *node, range);
    // Not value<double>(): it refuses integers a double cannot hold exactly.
    const double value = node->is_integer() ? static_cast<double>(*node->value<std::int64_t>())
                                            : *node->value_exact<double>();
    const bool ok = (min_inclusive ? value >= min : value > min) && value <= max && std::isfinite(value);
    if (!ok) expected(key, *node, range);
    out = value;
    return true;
  }

  /// A string; one of `choices` unless that is empty.
  bool read(std::string_view key, std::string& out, const std::vector<std::string>& choices = {}) {
    const toml::node* node = find(key);
    if (!node) return false;
    const std::string expectation =
        choices.empty() ? std::string("a string") : fmt::format("one of \"{}\"", fmt::join(choices, "\", \""));
    if (!node->is_string()) expected(key, *node, expectation);
    auto value = *node->value<std::string>();
    if (!choices.empty() && std::find(choices.begin(), choices.end(), value) == choices.end())
      expected(key, *node, expectation);
    out = std::move(value);
    return true;
  }

  bool read(std::string_view key, std::vector<std::int64_t>& out, std::int64_t min, bool allow_empty) {
    const toml::node* node = find(key);
    if (!node) return false;
    const std::string expectation =
        fmt::format("{}an array of integers >= {}", allow_empty ? "" : "a non-empty ", min);
    const auto* array = node->as_array();
    if (!array || (!allow_empty && array->empty())) expected(key, *node, expectation);
    std::vector<std::int64_t> values;
    for (const auto& element : *array) {
      if (!element.is_integer() || *element.value<std::int64_t>() < min) expected(key, element, expectation);
      values.push_back(*element.value<std::int64_t>());
    }
    out = std::move(values);
    return true;
  }

  bool read(std::string_view key, std::vector<std::string>& out) {
    const toml::node* node = find(key);
    if (!node) return false;
    const auto* array = node->as_array();
    if (!array) expected(key, *node, "an array of strings");
    std::vector<std::string> values;
    for (const auto& element : *array) {
      if (!element.is_string()) expected(key, element, "an array of strings");
      values.push_back(*element.value<std::string>());
    }
    out = std::move(values);
    return true;
  }

  /// An error about the value at `key`.
  [[noreturn]] void invalid(std::string_view key, const std::string& what) const {
    const toml::node* node = table_ ? table_->get(key) : nullptr;
    ctx_.fail(dotted(key), node ? node->source() : toml::source_region{}, fmt::format("{}: {}", dotted(key), what));
  }

  /// Records the keys of this table that no read asked for.
  void finish() {
    if (!table_) return;
    for (auto&& [key, node] : *table_) {
      if (std::find(asked_.begin(), asked_.end(), key.str()) != asked_.end()) continue;
      ctx_.unknown.push_back({dotted(key.str()), key.source()});
    }
  }

 private:
  const toml::node* find(std::string_view key) {
    asked_.emplace_back(key);
    ctx_.known.push_back(dotted(key));
    return table_ ? table_->get(key) : nullptr;
  }

  [[noreturn]] void expected(std::string_view key, const toml::node& node, const std::string& expectation) const {
    ctx_.fail(dotted(key), node.source(),
              fmt::format("{} must be {}, not {}", dotted(key), expectation, type_name(node)));
  }

  Context& ctx_;
  const toml::table* table_;
  std::string prefix_;
  std::vector<std::string> asked_;
};

// The first unknown key (in file order) as an error naming the closest known key.
[[noreturn]] void fail_unknown(const Context& ctx) {
  const auto& first = *std::min_element(ctx.unknown.begin(), ctx.unknown.end(), [](const auto& a, const auto& b) {
    return std::pair(a.where.begin.line, a.where.begin.column) < std::pair(b.where.begin.line, b.where.begin.column);
  });
  const auto dot = first.key.rfind('.');
  const std::string section = dot == std::string::npos ? "" : first.key.substr(0, dot);
  const std::string leaf = dot == std::string::npos ? first.key : first.key.substr(dot + 1);
  // Prefer the same name in another section (`epochs` under [data] -> train.epochs), then the closest
  // key of the same section, then the closest anywhere.
  std::string best;
  std::size_t best_score = std::numeric_limits<std::size_t>::max();
  std::vector<std::string> siblings;
  for (const auto& known : ctx.known) {
    const auto kdot = known.rfind('.');
    const std::string ksection = kdot == std::string::npos ? "" : known.substr(0, kdot);
    const std::string kleaf = kdot == std::string::npos ? known : known.substr(kdot + 1);
    if (ksection == section && std::find(siblings.begin(), siblings.end(), kleaf) == siblings.end())
      siblings.push_back(kleaf);
    std::size_t score = kleaf == leaf ? 0 : 1 + 2 * edit_distance(leaf, kleaf) + (ksection == section ? 0 : 3);
    if (score < best_score) best_score = score, best = known;
  }
  std::sort(siblings.begin(), siblings.end());
  const std::string where = section.empty() ? "at the top level" : fmt::format("in [{}]", section);
  ctx.fail(first.key, first.where,
           fmt::format("unknown key {}; did you mean {}? (valid keys {}: {})", first.key, best, where,
                       fmt::join(siblings, ", ")));
}

// Applies one "key.path=value" to the parsed document.
void apply_override(toml::table& root, const std::string& assignment, Context& ctx) {
  const auto eq = assignment.find('=');
  if (eq == std::string::npos || eq == 0)
    throw ConfigFileError(fmt::format("--set {}: expected key=value, e.g. --set train.epochs=5", assignment), "", 0, 0);
  const std::string key = assignment.substr(0, eq);
  const std::string text = assignment.substr(eq + 1);
  std::vector<std::string> parts;
  for (std::size_t start = 0;;) {
    const auto dot = key.find('.', start);
    parts.push_back(key.substr(start, dot == std::string::npos ? std::string::npos : dot - start));
    if (parts.back().empty())
      throw ConfigFileError(fmt::format("--set {}: '{}' is not a dotted key such as train.epochs", assignment, key), key, 0, 0);
    if (dot == std::string::npos) break;
    start = dot + 1;
  }
  // The value is TOML (5, 3e-3, true, [64, 32], "x"); anything else is taken as a bare string (resnet).
  toml::table parsed;
  try {
    parsed = toml::parse(std::string_view("value = " + text), std::string_view("--set"));
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"value", text}};
  }
  toml::table* table = &root;
  std::string walked;
  for (std::size_t i = 0; i + 1 < parts.size(); ++i) {
    walked += (walked.empty() ? "" : ".") + parts[i];
    toml::node* node = table->get(parts[i]);
    if (!node) node = table->insert(parts[i], toml::table{}).first->second.as_table();
    if (!node->is_table())
      throw ConfigFileError(fmt::format("--set {}: {} is {}, not a table", assignment, walked, type_name(*node)), walked, 0, 0);
    table = node->as_table();
  }
  table->insert_or_assign(parts.back(), std::move(*parsed.get("value")));
  ctx.overridden[key] = assignment;
}

void read_data(Section s, DataConfig& d) {
  s.read("dataset", d.dataset, {"fashion_mnist", "synthetic_regression"});
  s.read("path", d.path);
  s.read("url", d.url);
  s.read("bs", d.bs, 1);
  s.read("valid_bs", d.valid_bs, 0);
  s.read("workers", d.workers, 0, 64);
  {
    auto t = s.table("transforms");
    t.read("normalize", d.transforms.normalize);
    t.read("random_crop_padding", d.transforms.random_crop_padding, 0, 64);
    t.read("random_flip", d.transforms.random_flip, 0.0, true, 1.0);
    t.finish();
  }
  auto syn = s.table("synthetic");
  {
    syn.read("n_train", d.synthetic.n_train, 1, 100'000'000);
    syn.read("n_valid", d.synthetic.n_valid, 1, 100'000'000);
    syn.read("features", d.synthetic.features, 1, 1'000'000);
    syn.read("noise", d.synthetic.noise, 0.0, true);
    syn.read("seed", d.synthetic.seed, 0);
    syn.finish();
  }
  const bool images = d.dataset == "fashion_mnist";
  if (images && syn.present()) s.invalid("synthetic", "applies to dataset = \"synthetic_regression\" only");
  if (!images) {
    for (const char* key : {"path", "url", "transforms"}) {
      if (s.has(key)) s.invalid(key, "applies to dataset = \"fashion_mnist\" only");
    }
  }
  if (!d.path.empty() && !d.url.empty()) s.invalid("url", "give either data.path (a local folder) or data.url, not both");
  s.finish();
}

void read_model(Section s, ModelConfig& m, const DataConfig& data) {
  s.read("arch", m.arch, {"mlp", "simple_cnn", "conv_net", "resnet"});
  s.read("hidden", m.hidden, 1, true);
  s.read("widths", m.widths, 1, false);
  s.read("blocks_per_stage", m.blocks_per_stage, 1, 64);
  s.read("stem_width", m.stem_width, 1);
  for (const char* key : {"hidden"}) {
    if (m.arch != "mlp" && s.has(key)) s.invalid(key, "applies to arch = \"mlp\" only");
  }
  if (m.arch != "resnet" && m.arch != "conv_net" && s.has("widths"))
    s.invalid("widths", "applies to arch = \"resnet\" or \"conv_net\" only");
  for (const char* key : {"blocks_per_stage", "stem_width"}) {
    if (m.arch != "resnet" && s.has(key)) s.invalid(key, "applies to arch = \"resnet\" only");
  }
  if (m.arch != "mlp" && !is_classification(data))
    s.invalid("arch", fmt::format("\"{}\" needs images (data.dataset = \"fashion_mnist\"); use arch = \"mlp\" for {}",
                                  m.arch, data.dataset));
  s.finish();
}

void read_train(Section s, TrainSectionConfig& t, const DataConfig& data) {
  s.read("epochs", t.epochs, 1, 1'000'000);
  s.read("lr", t.lr, 0.0, false);
  s.read("schedule", t.schedule, {"one_cycle", "flat_cos", "constant"});
  s.read("pct_start", t.pct_start, 0.0, true, 1.0);
  s.read("optimizer", t.optimizer, {"adam", "adamw", "sgd"});
  double wd = 0;
  if (s.read("wd", wd, 0.0, true)) t.wd = wd;
  s.read("momentum", t.momentum, 0.0, true, 1.0);
  s.read("seed", t.seed, 0);
  s.read("mixed_precision", t.mixed_precision);
  s.read("channels_last", t.channels_last);
  s.read("grad_accumulation", t.grad_accumulation, 0);
  s.read("grad_clip", t.grad_clip, 0.0, true);
  const bool classification = is_classification(data);
  const std::vector<std::string> losses =
      classification ? std::vector<std::string>{"cross_entropy"} : std::vector<std::string>{"mse", "l1"};
  if (!s.read("loss", t.loss, losses)) t.loss = losses.front();
  const std::vector<std::string> metrics = classification
                                               ? std::vector<std::string>{"accuracy", "error_rate", "top_k_accuracy", "f1_macro"}
                                               : std::vector<std::string>{"rmse", "mse", "mae"};
  if (s.read("metrics", t.metrics)) {
    for (const auto& m : t.metrics) {
      if (std::find(metrics.begin(), metrics.end(), m) == metrics.end())
        s.invalid("metrics", fmt::format("unknown metric \"{}\" for {}; expected some of \"{}\"", m, data.dataset,
                                         fmt::join(metrics, "\", \"")));
    }
  } else {
    t.metrics = {metrics.front()};
  }
  if (s.has("momentum") && t.optimizer != "sgd") s.invalid("momentum", "applies to optimizer = \"sgd\" only");
  if (s.has("pct_start") && t.schedule == "constant") s.invalid("pct_start", "does not apply to schedule = \"constant\"");
  s.finish();
}

void read_distributed(Section s, DistributedConfig& d) {
  s.read("backend", d.backend, {"auto", "gloo", "nccl"});
  s.read("sync_bn", d.sync_bn);
  s.read("bucket_cap_mb", d.bucket_cap_mb, 0.0, false);
  s.read("first_bucket_mb", d.first_bucket_mb, 0.0, false);
  s.read("timeout_seconds", d.timeout_seconds, 0.0, false);
  s.read("find_unused_parameters", d.find_unused_parameters);
  s.finish();
}

void check_monitor(Section& s, const std::string& monitor, const TrainSectionConfig& train) {
  if (monitor == "valid_loss" || monitor == "train_loss") return;
  if (std::find(train.metrics.begin(), train.metrics.end(), monitor) != train.metrics.end()) return;
  s.invalid("monitor", fmt::format("\"{}\" is not recorded; expected \"valid_loss\", \"train_loss\" or one of "
                                   "train.metrics (\"{}\")", monitor, fmt::join(train.metrics, "\", \"")));
}

void read_callbacks(Section s, CallbacksConfig& c, const TrainSectionConfig& train) {
  {
    auto es = s.table("early_stopping");
    EarlyStoppingConfig e;
    es.read("monitor", e.monitor);
    es.read("patience", e.patience, 1);
    es.read("min_delta", e.min_delta, 0.0, true);
    if (es.present()) {
      check_monitor(es, e.monitor, train);
      c.early_stopping = e;
    }
    es.finish();
  }
  {
    auto sb = s.table("save_best");
    SaveBestConfig b;
    sb.read("monitor", b.monitor);
    if (sb.present()) {
      check_monitor(sb, b.monitor, train);
      c.save_best = b;
    }
    sb.finish();
  }
  s.read("csv_log", c.csv_log);
  s.read("tensorboard", c.tensorboard);
  s.finish();
}

void read_output(Section s, OutputConfig& o) {
  if (s.read("dir", o.dir) && o.dir.empty()) s.invalid("dir", "must not be empty");
  s.read("checkpoints", o.checkpoints);
  s.read("checkpoint_every_n_batches", o.checkpoint_every_n_batches, std::int64_t{0});
  s.read("plots", o.plots);
  s.finish();
}

// Every section, the data first: what it holds decides which losses, metrics and models fit.
TrainConfig read_all(Context& ctx, const toml::table& root) {
  TrainConfig config;
  Section top(ctx, &root, "");
  read_data(top.table("data"), config.data);
  read_model(top.table("model"), config.model, config.data);
  read_train(top.table("train"), config.train, config.data);
  read_distributed(top.table("distributed"), config.distributed);
  read_callbacks(top.table("callbacks"), config.callbacks, config.train);
  read_output(top.table("output"), config.output);
  top.finish();
  return config;
}

}  // namespace

bool is_classification(const DataConfig& data) { return data.dataset == "fashion_mnist"; }

TrainConfig parse_config(std::string_view toml_text, std::string_view source_name,
                         std::span<const std::string> overrides) {
  Context ctx{.source = std::string(source_name)};
  toml::table root;
  try {
    root = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& where = e.source().begin;
    throw ConfigFileError(fmt::format("{}:{}:{}: TOML syntax error: {}", source_name, where.line, where.column,
                                      e.description()),
                          "", static_cast<int>(where.line), static_cast<int>(where.column));
  }
  for (const auto& assignment : overrides) apply_override(root, assignment, ctx);

  const TrainConfig config = read_all(ctx, root);
  if (!ctx.unknown.empty()) fail_unknown(ctx);
  return config;
}

std::string describe_keys() {
  Context ctx;
  const toml::table empty;
  read_all(ctx, empty);
  std::map<std::string, std::vector<std::string>> sections;  // "[data]" -> its keys
  std::vector<std::string> order;
  for (const auto& key : ctx.known) {
    const auto dot = key.rfind('.');
    if (dot == std::string::npos) continue;  // the section names themselves
    const auto section = key.substr(0, dot);
    if (!sections.contains(section)) order.push_back(section);
    auto& keys = sections[section];
    if (std::find(keys.begin(), keys.end(), key.substr(dot + 1)) == keys.end()) keys.push_back(key.substr(dot + 1));
  }
  std::vector<std::string> lines;
  for (const auto& section : order) lines.push_back(fmt::format("[{}] {}", section, fmt::join(sections[section], ", ")));
  return fmt::format("{}", fmt::join(lines, "\n  "));
}

TrainConfig load_config(const std::string& path, std::span<const std::string> overrides) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw ConfigFileError(fmt::format("{}: cannot read the configuration file (does it exist?)", path), "", 0, 0);
  std::ostringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path, overrides);
}

namespace {

// Writes TOML by hand, sections and keys in the order of the structs (toml++'s printer sorts them and
// prints floats with 17 digits).
class TomlWriter {
 public:
  void section(std::string_view name) { out_ += fmt::format("{}[{}]\n", out_.empty() ? "" : "\n", name); }
  void put(std::string_view key, const std::string& value) { line(key, quote(value)); }
  void put(std::string_view key, std::int64_t value) { line(key, fmt::format("{}", value)); }
  void put(std::string_view key, bool value) { line(key, value ? "true" : "false"); }
  void put(std::string_view key, double value) {
    auto text = fmt::format("{}", value);  // shortest text that reads back as the same double
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
    line(key, text);
  }
  void put(std::string_view key, const std::vector<std::int64_t>& values) {
    line(key, fmt::format("[{}]", fmt::join(values, ", ")));
  }
  void put(std::string_view key, const std::vector<std::string>& values) {
    std::vector<std::string> quoted;
    for (const auto& v : values) quoted.push_back(quote(v));
    line(key, fmt::format("[{}]", fmt::join(quoted, ", ")));
  }
  const std::string& text() const { return out_; }

 private:
  void line(std::string_view key, std::string_view value) { out_ += fmt::format("{} = {}\n", key, value); }
  static std::string quote(const std::string& value) {
    std::string q = "\"";
    for (const unsigned char c : value) {
      switch (c) {
        case '"': q += "\\\""; break;
        case '\\': q += "\\\\"; break;
        case '\n': q += "\\n"; break;
        case '\t': q += "\\t"; break;
        case '\r': q += "\\r"; break;
        default:
          if (c < 0x20 || c == 0x7f) q += fmt::format("\\u{:04X}", c);
          else q += static_cast<char>(c);
      }
    }
    return q + "\"";
  }
  std::string out_;
};

}  // namespace

std::string to_toml(const TrainConfig& c) {
  TomlWriter w;
  const auto& d = c.data;
  w.section("data");
  w.put("dataset", d.dataset);
  if (!d.path.empty()) w.put("path", d.path);
  if (!d.url.empty()) w.put("url", d.url);
  w.put("bs", d.bs);
  w.put("valid_bs", d.valid_bs);
  w.put("workers", d.workers);
  if (is_classification(d)) {
    w.section("data.transforms");
    w.put("normalize", d.transforms.normalize);
    w.put("random_crop_padding", d.transforms.random_crop_padding);
    w.put("random_flip", d.transforms.random_flip);
  } else {
    w.section("data.synthetic");
    w.put("n_train", d.synthetic.n_train);
    w.put("n_valid", d.synthetic.n_valid);
    w.put("features", d.synthetic.features);
    w.put("noise", d.synthetic.noise);
    w.put("seed", d.synthetic.seed);
  }
  const auto& m = c.model;
  w.section("model");
  w.put("arch", m.arch);
  if (m.arch == "mlp") w.put("hidden", m.hidden);
  if (m.arch == "conv_net") w.put("widths", m.widths);
  if (m.arch == "resnet") {
    w.put("widths", m.widths);
    w.put("blocks_per_stage", m.blocks_per_stage);
    w.put("stem_width", m.stem_width);
  }
  const auto& t = c.train;
  w.section("train");
  w.put("epochs", t.epochs);
  w.put("lr", t.lr);
  w.put("schedule", t.schedule);
  if (t.schedule != "constant") w.put("pct_start", t.pct_start);
  w.put("optimizer", t.optimizer);
  if (t.wd) w.put("wd", *t.wd);
  if (t.optimizer == "sgd") w.put("momentum", t.momentum);
  w.put("seed", t.seed);
  w.put("mixed_precision", t.mixed_precision);
  w.put("channels_last", t.channels_last);
  w.put("grad_accumulation", t.grad_accumulation);
  w.put("grad_clip", t.grad_clip);
  w.put("loss", t.loss);
  w.put("metrics", t.metrics);
  const auto& di = c.distributed;
  w.section("distributed");
  w.put("backend", di.backend);
  w.put("sync_bn", di.sync_bn);
  w.put("bucket_cap_mb", di.bucket_cap_mb);
  w.put("first_bucket_mb", di.first_bucket_mb);
  w.put("timeout_seconds", di.timeout_seconds);
  w.put("find_unused_parameters", di.find_unused_parameters);
  w.section("callbacks");
  w.put("csv_log", c.callbacks.csv_log);
  w.put("tensorboard", c.callbacks.tensorboard);
  if (const auto& e = c.callbacks.early_stopping) {
    w.section("callbacks.early_stopping");
    w.put("monitor", e->monitor);
    w.put("patience", e->patience);
    w.put("min_delta", e->min_delta);
  }
  if (const auto& b = c.callbacks.save_best) {
    w.section("callbacks.save_best");
    w.put("monitor", b->monitor);
  }
  w.section("output");
  w.put("dir", c.output.dir);
  w.put("checkpoints", c.output.checkpoints);
  w.put("checkpoint_every_n_batches", c.output.checkpoint_every_n_batches);
  w.put("plots", c.output.plots);
  return "# The resolved configuration of this run: the file, the --set overrides and every default.\n"
         "# `fastlearn train` reads it back as it is.\n\n" +
         w.text();
}

}  // namespace fastlearn::cli
