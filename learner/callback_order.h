#pragma once
// Callback::order of every built-in callback, in one place: callbacks run sorted by order, so each value
// says who must come before whom (the comments say why). User callbacks default to 0.
namespace fastlearn::cb_order {

inline constexpr int channels_last = -20;  // before everything that records the layout (TrainEval, reducer, optimizer)
inline constexpr int train_eval = -10;     // sets the mode and counters before the others see the batch
inline constexpr int grad_accumulation = 6;     // decides will_step before MixedPrecision unscales
inline constexpr int mixed_precision = 10;      // scales the loss, unscales before the step
inline constexpr int grad_clip = 11;            // after MixedPrecision's unscaling
inline constexpr int recorder = 50;             // records the batch, then gathers validation (data parallel)
inline constexpr int distributed_trainer = 51;  // after GradientAccumulation and MixedPrecision have set the loss
inline constexpr int file_logs = 55;            // CSVLogger, MetricsJson, TensorBoard: after the Recorder's epoch row
inline constexpr int schedulers = 60;           // ParamScheduler / LRFinder, as fastai
inline constexpr int trackers = 60;             // EarlyStopping, SaveModel, ReduceLROnPlateau: read the epoch row
inline constexpr int progress = 60;             // shows the Recorder's numbers
inline constexpr int checkpointer = 60;   // after the Recorder and the file logs: a checkpoint holds the finished batch
inline constexpr int graceful_stop = 65;  // after the Checkpointer: a checkpoint at the same batch is not written twice

}  // namespace fastlearn::cb_order
