#include <fastlearn/learner/progress.h>

#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/lr_finder.h>
#include <fastlearn/learner/recorder.h>

#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>

namespace fastlearn {

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }
}  // namespace

Progress::Progress(ProgressOptions options) : options_(options) {
  order = cb_order::progress;
  // Under `fastlearn launch` the output is a pipe; the launcher says whether its own output is a terminal.
  const char* launcher_live = std::getenv("FASTLEARN_PROGRESS_LIVE");
  live_ = options_.live.value_or((options_.out && isatty(fileno(options_.out)) == 1) ||
                                 (launcher_live && std::string(launcher_live) == "1"));
}

std::string Progress::format_time(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "--:--";
  const auto total = static_cast<long long>(std::llround(seconds));
  if (total >= 3600) return fmt::format("{}:{:02}:{:02}", total / 3600, total / 60 % 60, total % 60);
  return fmt::format("{:02}:{:02}", total / 60, total % 60);
}

void Progress::write(const std::string& text) {
  if (!options_.out) return;
  std::fwrite(text.data(), 1, text.size(), options_.out);
  std::fflush(options_.out);
}

void Progress::before_fit() {
  fit_start_ = Clock::now();
  header_printed_ = false;
}

void Progress::start_phase(const char* phase) {
  phase_ = phase;
  phase_start_ = Clock::now();
  last_draw_ = Clock::time_point{};
  if (live_) draw(true);
}

void Progress::before_train() { start_phase("train"); }
void Progress::before_validate() { start_phase("valid"); }

void Progress::after_batch() {
  if (live_) draw(false);
}

void Progress::draw(bool force) {
  if (!force && seconds_since(last_draw_) < options_.refresh_seconds) return;
  last_draw_ = Clock::now();
  auto& l = learn();
  const auto done = l.iter + (force ? 0 : 1);
  const auto total = std::max<std::int64_t>(l.n_iter, 1);
  const double frac = std::clamp(static_cast<double>(done) / static_cast<double>(total), 0.0, 1.0);
  const double elapsed = seconds_since(phase_start_);
  const double eta = done > 0 ? elapsed / static_cast<double>(done) * static_cast<double>(total - done) : NAN;
  const auto filled = static_cast<int>(frac * options_.bar_width);
  std::string bar(static_cast<std::size_t>(filled), '#');
  bar.resize(static_cast<std::size_t>(options_.bar_width), '.');
  std::string line;
  if (l.n_epoch > 0) {
    const double fit_eta = l.pct_train > 0 ? seconds_since(fit_start_) / l.pct_train * (1 - l.pct_train) : NAN;
    line =
        fmt::format("epoch {}/{} ({:3.0f}%, eta {}) ", l.epoch + 1, l.n_epoch, 100 * l.pct_train, format_time(fit_eta));
  }
  line += fmt::format("{} [{}] {}/{} {}<{}", phase_, bar, done, l.n_iter, format_time(elapsed), format_time(eta));
  if (l.training && std::isfinite(l.smooth_loss)) line += fmt::format(" loss {:.4f}", l.smooth_loss);
  write("\r\033[2K" + line);
}

void Progress::clear_line() {
  if (live_) write("\r\033[2K");
}

void Progress::after_train() { clear_line(); }
void Progress::after_validate() { clear_line(); }

void Progress::after_epoch() {
  auto& l = learn();
  if (lr_finder_attached(l)) return;  // a sweep's "epochs" have no validation: fastai's lr_find prints no table
  auto rec = l.cb<Recorder>();
  if (!rec || rec->history().empty()) return;
  const auto& r = rec->history().back();
  std::vector<std::string> cells{std::to_string(r.epoch), fmt::format("{:.6f}", r.train_loss),
                                 fmt::format("{:.6f}", r.valid_loss)};
  for (double m : r.metrics) cells.push_back(fmt::format("{:.6f}", m));
  cells.push_back(format_time(r.seconds));
  // Columns padded to the header's widths, two spaces apart, as fastai's table.
  auto line = [&](const std::vector<std::string>& values) {
    std::string out;
    for (std::size_t i = 0; i < values.size(); ++i) {
      out +=
          i + 1 < values.size() ? fmt::format("{:<{}}  ", values[i], i < widths_.size() ? widths_[i] : 10) : values[i];
    }
    return out + "\n";
  };
  std::string text;
  if (!header_printed_) {
    const auto cols = rec->columns();
    widths_.clear();
    for (std::size_t i = 0; i < cols.size(); ++i)
      widths_.push_back(std::max<std::size_t>(cols[i].size(), i == 0 ? 5 : 10));
    text += line(cols);
    header_printed_ = true;
  }
  write(text + line(cells));
}

void Progress::after_fit() { clear_line(); }

}  // namespace fastlearn
