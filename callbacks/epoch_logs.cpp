#include <fastlearn/callbacks/epoch_logs.h>

#include <fastlearn/core/atomic_file.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/lr_finder.h>
#include <fastlearn/learner/recorder.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstring>

namespace fastlearn {

namespace {

std::filesystem::path under_learner(const Learner& l, const std::filesystem::path& file) {
  return file.is_absolute() ? file : l.options().path / file;
}

// Drops the rows of epochs >= `start` from the log at `path` (header and earlier rows stay): a fit resumed from
// an earlier checkpoint than the log's last row trains those epochs again.
void keep_rows_before(const std::filesystem::path& path, int start) {
  std::ifstream in(path);
  std::string kept, line;
  for (bool header = true; std::getline(in, line); header = false) {
    int epoch = 0;
    const auto [end, error] = std::from_chars(line.data(), line.data() + line.size(), epoch);
    if (header || error != std::errc() || end == line.data() + line.size() || *end != ',' || epoch < start)
      kept += line + '\n';
  }
  in.close();
  write_file_atomically(path, [&](std::ostream& out) { out << kept; });
}

std::string csv_number(double v) { return std::isnan(v) ? "" : fmt::format("{:.6f}", v); }

}  // namespace

// Order 55: after the Recorder wrote the epoch's row (50), before trackers (60) that may stop the fit.
CSVLogger::CSVLogger(CSVLoggerOptions options) : options_(std::move(options)) { order = cb_order::file_logs; }

void CSVLogger::before_fit() {
  auto& l = learn();
  if (lr_finder_attached(l)) {  // an lr_find sweep is not an epoch to log (and must not truncate the log)
    run = false;
    return;
  }
  path_ = under_learner(l, options_.file);
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  // A fit that continues a training (resumed from a checkpoint at epoch k > 0, or fine_tune's unfrozen fit) keeps
  // the rows of the epochs before it, as MetricsJson does.
  const int start = l.epoch_offset + l.epoch;
  const bool keep =
      (options_.append || start > 0) && std::filesystem::exists(path_) && std::filesystem::file_size(path_) > 0;
  if (keep && start > 0) keep_rows_before(path_, start);
  out_.close();
  out_.open(path_, keep ? std::ios::app : std::ios::trunc);
  if (!out_)
    throw Error(
        fmt::format("CSVLogger: cannot open '{}' for writing: {}", excerpt(path_.string(), 256), std::strerror(errno)));
  if (!keep) {
    const auto cols = l.recorder().columns();
    for (std::size_t i = 0; i < cols.size(); ++i) out_ << (i ? "," : "") << cols[i];
    out_ << '\n' << std::flush;
  }
}

void CSVLogger::after_epoch() {
  const auto& rec = learn().recorder();
  if (rec.history().empty() || !out_.is_open()) return;
  const auto& r = rec.history().back();
  out_ << r.epoch << ',' << csv_number(r.train_loss) << ',' << csv_number(r.valid_loss);
  for (double m : r.metrics) out_ << ',' << csv_number(m);
  out_ << ',' << fmt::format("{:.3f}", r.seconds) << '\n' << std::flush;
  if (!out_)
    throw Error(fmt::format("CSVLogger: writing '{}' failed: {}", excerpt(path_.string(), 256), std::strerror(errno)));
}

void CSVLogger::after_fit() { out_.close(); }

MetricsJson::MetricsJson(MetricsJsonOptions options) : options_(std::move(options)) { order = cb_order::file_logs; }

void MetricsJson::before_fit() {
  if (lr_finder_attached(learn())) {
    run = false;
    return;
  }
  path_ = under_learner(learn(), options_.file);
  records_.clear();
  // A resumed fit (start_epoch > 0), or one that continues a training (fine_tune's unfrozen fit, epoch_offset > 0),
  // keeps the records of the epochs before it.
  const int start = learn().epoch_offset + learn().epoch;
  if (start > 0 && std::filesystem::exists(path_)) {
    std::ifstream in(path_);
    const auto previous = nlohmann::ordered_json::parse(in, nullptr, false);
    if (previous.is_array()) {
      for (const auto& record : previous) {
        if (record.contains("epoch") && record["epoch"].is_number_integer() && record["epoch"].get<int>() < start) {
          records_ += (records_.empty() ? "\n  " : ",\n  ") + record.dump();
        }
      }
    }
  }
}

void MetricsJson::after_epoch() {
  const auto& rec = learn().recorder();
  if (rec.history().empty()) return;
  const auto& r = rec.history().back();
  auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  nlohmann::ordered_json record;
  record["epoch"] = r.epoch;
  record["train_loss"] = number(r.train_loss);
  record["valid_loss"] = number(r.valid_loss);
  const auto names = rec.metric_names();
  for (std::size_t i = 0; i < names.size() && i < r.metrics.size(); ++i) record[names[i]] = number(r.metrics[i]);
  record["seconds"] = r.seconds;
  records_ += (records_.empty() ? "\n  " : ",\n  ") + record.dump();
  if (path_.has_parent_path()) std::filesystem::create_directories(path_.parent_path());
  const std::string text = "[" + records_ + "\n]\n";
  write_file_atomically(path_, [&](std::ostream& out) { out << text; });
}

}  // namespace fastlearn
