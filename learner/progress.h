#pragma once
// Progress: what a user watches during training. On a terminal, a live bar for the batches of the
// current phase with elapsed time and ETA, preceded by the fit's progress over epochs; after each
// epoch, a row of the results table (epoch, train_loss, valid_loss, metrics, time). When the output
// is not a terminal (a log file, CI), only the table rows are printed, one line per epoch.
#include <fastlearn/learner/callback.h>

#include <chrono>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

namespace fastlearn {

struct ProgressOptions {
  std::FILE* out = stdout;
  std::optional<bool> live;      ///< draw live bars; default: when `out` is a terminal
  double refresh_seconds = 0.1;  ///< at most one redraw per interval, so drawing never slows training
  int bar_width = 30;
};

class Progress : public Callback {
 public:
  explicit Progress(ProgressOptions options = {});
  std::string name() const override { return "progress"; }
  bool rank0_only() const override { return true; }

  void before_fit() override;
  void before_train() override;
  void before_validate() override;
  void after_batch() override;
  void after_train() override;
  void after_validate() override;
  void after_epoch() override;
  void after_fit() override;

  /// Formats seconds as mm:ss (or h:mm:ss).
  static std::string format_time(double seconds);

 private:
  void start_phase(const char* phase);
  void draw(bool force);
  void clear_line();
  void write(const std::string& text);

  ProgressOptions options_;
  bool live_ = false;
  bool header_printed_ = false;
  const char* phase_ = "";
  std::vector<std::size_t> widths_;
  std::chrono::steady_clock::time_point fit_start_, phase_start_, last_draw_;
};

}  // namespace fastlearn
