#include <fastlearn/callbacks/tensorboard.h>

#include <fastlearn/learner/callback_order.h>
#include <fastlearn/learner/learner.h>
#include <fastlearn/learner/lr_finder.h>
#include <fastlearn/learner/recorder.h>

#include <fmt/format.h>

#include <cmath>

namespace fastlearn {

// Order 55: after the Recorder (50) has the epoch's row and the smoothed loss, before trackers (60).
TensorBoardLogger::TensorBoardLogger(TensorBoardOptions options) : options_(std::move(options)) {
  order = cb_order::file_logs;
  run_valid = false;  // batches of validation are not steps
}

void TensorBoardLogger::before_fit() {
  auto& l = learn();
  if (lr_finder_attached(l)) {  // an lr_find sweep is not training to log
    run = false;
    return;
  }
  const auto dir = options_.log_dir.is_absolute() ? options_.log_dir : l.options().path / options_.log_dir;
  writer_ = std::make_unique<EventFileWriter>(dir);
  written_ = 0;
  last_flush_ = std::chrono::steady_clock::now();
}

void TensorBoardLogger::after_batch() {
  auto& l = learn();
  if (!writer_ || !options_.per_step || !l.training) return;
  write_recorded_steps();
  if (l.has_opt() && l.opt().n_groups() > 1) {
    const auto& opt = l.opt();
    for (std::size_t g = 0; g < opt.n_groups(); ++g) {
      writer_->add_scalar(fmt::format("lr/group_{}", g), opt.hyper("lr", g), l.train_iter);
    }
  }
  if (std::chrono::steady_clock::now() - last_flush_ > std::chrono::duration<double>(options_.flush_secs)) {
    writer_->flush();
    last_flush_ = std::chrono::steady_clock::now();
  }
}

// The Recorder's per-batch records not written yet (on CUDA the newest batch's loss arrives one batch later).
void TensorBoardLogger::write_recorded_steps() {
  const auto& rec = learn().recorder();
  for (; written_ < rec.losses().size(); ++written_) {
    const auto step = rec.steps()[written_];
    writer_->add_scalar("train_loss", rec.batch_losses()[written_], step);
    if (!std::isnan(rec.losses()[written_])) writer_->add_scalar("smooth_loss", rec.losses()[written_], step);
    if (!std::isnan(rec.lrs()[written_])) writer_->add_scalar("lr", rec.lrs()[written_], step);
  }
}

void TensorBoardLogger::after_epoch() {
  const auto& rec = learn().recorder();
  if (writer_ && options_.per_step) write_recorded_steps();
  if (!writer_ || rec.history().empty()) return;
  const auto& r = rec.history().back();
  const auto write = [&](const std::string& tag, double value) {
    if (!std::isnan(value)) writer_->add_scalar(tag, value, r.epoch);  // NaN: that part did not run
  };
  write("epoch/train_loss", r.train_loss);
  write("epoch/valid_loss", r.valid_loss);
  const auto names = rec.metric_names();
  for (std::size_t i = 0; i < names.size() && i < r.metrics.size(); ++i) write("epoch/" + names[i], r.metrics[i]);
  writer_->flush();
  last_flush_ = std::chrono::steady_clock::now();
}

void TensorBoardLogger::after_fit() {
  if (writer_) writer_->flush();
}

}  // namespace fastlearn
