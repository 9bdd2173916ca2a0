/* fastlearn's C interface, for programs in C, Fortran (the module in fastlearn.f90) or any language that calls C:
 * a Learner made from a TOML config, trained one step at a time on the program's own arrays, asked for predictions,
 * checkpointed and resumed, and trained on several processes. docs/c_fortran.md is the guide.
 *
 *   fl_learner* learn = NULL;
 *   if (fl_create("surrogate.toml", &learn) != FL_OK) { fprintf(stderr, "%s\n", fl_last_error()); return 1; }
 *   fl_array x = {.data = u, .dtype = FL_FLOAT64, .layout = FL_ROW_MAJOR, .ndim = 3, .shape = {8, 64, 64}};
 *   fl_array y = {.data = u_next, .dtype = FL_FLOAT64, .layout = FL_ROW_MAJOR, .ndim = 3, .shape = {8, 64, 64}};
 *   double loss;
 *   fl_train_step(learn, &x, &y, &loss);
 *   fl_free(&learn);
 *
 * Every function returns a status (FL_OK, or what kind of error); the text of the last error on the calling thread
 * is fl_last_error(). No error ends the program: exceptions never leave these functions. A Learner may be used from
 * any thread, one call at a time (calls on one Learner from several threads wait for each other). */
#ifndef FASTLEARN_C_FASTLEARN_H
#define FASTLEARN_C_FASTLEARN_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum fl_status {
  FL_OK = 0,
  FL_ERROR_NULL = 1,        /* a pointer argument that may not be NULL was NULL */
  FL_ERROR_CONFIG = 2,      /* the config (its file, a key, a value) or an argument is wrong */
  FL_ERROR_SHAPE = 3,       /* an array's shape, rank, type or layout does not fit */
  FL_ERROR_VALUE = 4,       /* an array holds NaN or infinite values */
  FL_ERROR_STATE = 5,       /* not now: a freed Learner, steps that ended, setup after the first step */
  FL_ERROR_IO = 6,          /* a file could not be read or written, or is not what it should be */
  FL_ERROR_DISTRIBUTED = 7, /* the job's environment, a peer that died or timed out */
  FL_ERROR_INTERNAL = 8     /* anything else (out of memory, a LibTorch error): the text says what */
} fl_status;

/* FL_FLOAT32 and FL_FLOAT64 for float inputs and targets (trained as float32); FL_INT64 and FL_INT32 for those the
 * config declares "int64" or "int32" (data.input_dtypes, data.target_dtypes: indices, class labels, masks). An
 * FL_INT32 array for an "int64" one is widened; a float array for an integer one (or the reverse) is refused. */
typedef enum fl_dtype { FL_FLOAT32 = 0, FL_FLOAT64 = 1, FL_INT32 = 2, FL_INT64 = 3 } fl_dtype;

/* How an array's elements lie in memory. FL_ROW_MAJOR (C): shape[0] is the batch, the last index varies fastest.
 * FL_COLUMN_MAJOR (Fortran): the first index varies fastest, and shape is listed as the program declares it, the batch
 * last: a Fortran u(nx, ny, batch) is the batch of (ny, nx) samples that the same memory holds in C, so the config's
 * data.input_shape is [ny, nx]. Neither layout is copied for training on the CPU in float32. */
typedef enum fl_layout { FL_ROW_MAJOR = 0, FL_COLUMN_MAJOR = 1 } fl_layout;

#define FL_MAX_DIMS 8

/* A caller-owned array: read (inputs, targets) or written (outputs) during the call only, never kept. */
typedef struct fl_array {
  void* data;
  int32_t dtype;  /* fl_dtype */
  int32_t layout; /* fl_layout */
  int32_t ndim;   /* 1 to FL_MAX_DIMS, the batch dimension included */
  int32_t reserved;
  int64_t shape[FL_MAX_DIMS];
} fl_array;

typedef struct fl_learner fl_learner;

/* fastlearn's version, e.g. "0.1.0". */
const char* fl_version(void);

/* The message of this thread's last call when it failed ("" after one that succeeded, or before any): what failed
 * and why, naming the function, the key, the array or the file. Valid until this thread's next call. */
const char* fl_last_error(void);

/* A Learner from a TOML config as `fastlearn train` reads it (docs/cli.md), with data.dataset = "program":
 * data.input_shape and data.target_shape give one sample's shapes, data.steps_per_epoch and train.epochs the steps
 * (train.epochs x data.steps_per_epoch in all, scheduled by train.schedule), data.held_out the samples held out for
 * validation; [model], the loss, optimizer, callbacks, device and output as for any run. output.dir is created here;
 * the Learner writes into it what a training run writes (history.csv, metrics.json, checkpoints/ when
 * output.checkpoints). */
fl_status fl_create(const char* config_file, fl_learner** learner);
/* The same from the config's text (`source_name` names it in messages; NULL: "config"). */
fl_status fl_create_from_toml(const char* toml, const char* source_name, fl_learner** learner);
/* A Learner for predictions only, from an export (fl_export, `fastlearn train`'s export.safetensors), on `device`
 * ("auto", "cpu", "cuda" or "cuda:N"; NULL: "auto"). */
fl_status fl_load_export(const char* export_file, const char* device, fl_learner** learner);
/* Frees the Learner (ending its steps first) and sets *learner to NULL; NULL or *learner NULL: nothing to do. The
 * handle is refused (FL_ERROR_STATE) by every later call, copies of it included. */
fl_status fl_free(fl_learner** learner);

/* Data parallel training, from the environment a launcher set (fastlearn launch, torchrun, mpirun, srun): each
 * process trains on its own samples and the gradients are averaged over the processes every step. Call before the
 * first step; on a single process it does nothing. The config's [distributed] table applies. */
fl_status fl_distributed_init(fl_learner* learner);
/* Data parallel training on a subset of the launched job's processes (the others run beside it: a solver's ranks
 * that do not learn, say): `ranks` lists the n global ranks that train together (in any order, each once). Every
 * process of the job calls it, members or not, with the same list (as torch.distributed.new_group); on a process
 * outside the list the Learner trains alone, if at all. Before the first step; on a single process it does nothing. */
fl_status fl_distributed_init_ranks(fl_learner* learner, const int32_t* ranks, int32_t n);
/* This process's rank and the number of processes training together (0 and 1 without a launcher; within the subset
 * after fl_distributed_init_ranks, -1 outside it); either pointer may be NULL. */
fl_status fl_rank(fl_learner* learner, int32_t* rank, int32_t* world_size);
/* This process's rank in the whole job, and the job's number of processes. */
fl_status fl_global_rank(fl_learner* learner, int32_t* rank, int32_t* world_size);

/* One training step on a batch: inputs (batch, data.input_shape...) and targets (batch, data.target_shape...),
 * the same batch size. The first step starts the steps the config plans; `loss` (may be NULL) gets the batch's
 * loss. After the last planned step, or once a callback stopped them (early stopping, a signal), the steps have
 * ended and a step is FL_ERROR_STATE. */
fl_status fl_train_step(fl_learner* learner, const fl_array* inputs, const fl_array* targets, double* loss);
/* Sets a batch of samples aside for validation (the last data.held_out of them are kept); after each epoch the
 * Learner validates on them with its metrics. Needs data.held_out > 0. */
fl_status fl_hold_out(fl_learner* learner, const fl_array* inputs, const fl_array* targets);
/* The model's outputs for inputs (batch, data.input_shape...), in eval mode without gradients, written into
 * `outputs` (batch, data.target_shape...: its dtype and layout are the caller's). Between steps too. */
fl_status fl_predict(fl_learner* learner, const fl_array* inputs, fl_array* outputs);
/* Several inputs and targets (a model of two inputs, features and indices; a loss taking a mask beside the target):
 * `inputs` holds n_inputs arrays in the order of data.input_shapes, `targets` n_targets in that of data.target_shapes,
 * each of its declared dtype, all of the same batch size. A count, shape or dtype that does not fit is a status that
 * names the array (inputs[1], ...) and changes nothing. fl_train_step is fl_train_step_n with one of each. */
fl_status fl_train_step_n(fl_learner* learner, int32_t n_inputs, const fl_array* inputs, int32_t n_targets,
                          const fl_array* targets, double* loss);
fl_status fl_hold_out_n(fl_learner* learner, int32_t n_inputs, const fl_array* inputs, int32_t n_targets,
                        const fl_array* targets);
/* The model's outputs for several inputs, one array each in `outputs` (n_outputs: as many as the model returns; the
 * first activated as the loss says, the others as the model gives them). */
fl_status fl_predict_n(fl_learner* learner, int32_t n_inputs, const fl_array* inputs, int32_t n_outputs,
                       fl_array* outputs);
/* Ends the steps now (before the planned number: as a cancelled fit); nothing when none are under way. */
fl_status fl_end_steps(fl_learner* learner);
/* The training steps done since the start (a resumed run's earlier ones included), and those the config plans;
 * `running` (1 or 0): whether more steps are taken. Any pointer may be NULL. */
fl_status fl_steps(fl_learner* learner, int64_t* trained, int64_t* planned, int32_t* running);

/* Before the first step: continue from a checkpoint the Learner's Checkpointer wrote (output.checkpoints,
 * output.checkpoint_every_n_batches), a file or the folder of them (its newest complete one). The model, optimizer,
 * schedule, random streams and held-out samples come back; fl_steps then says how many steps were trained, and the
 * program hands over its batches from there. */
fl_status fl_resume(fl_learner* learner, const char* checkpoint);
/* The model's weights and the optimizer state now, written atomically to `file` (safetensors), by rank 0 (for
 * fl_load, or other tools); the other ranks return at once. Not collective: rank 0 may call it alone. Not the
 * schedule's position nor the random streams: a program that restarts continues its steps with fl_resume, from the
 * checkpoints the config has the Learner write. */
fl_status fl_save(fl_learner* learner, const char* file);
/* Weights (and the optimizer state, when the file has it) from fl_save's file or a checkpoint; not while steps are
 * under way. */
fl_status fl_load(fl_learner* learner, const char* file);
/* The trained model with what predicting needs, for fl_load_export, fastlearn's load_learner or `fastlearn predict`;
 * written by rank 0, the other ranks return at once. Not collective: rank 0 may call it alone (`if (rank == 0)`). */
fl_status fl_export(fl_learner* learner, const char* file);

#ifdef __cplusplus
}
#endif

#endif /* FASTLEARN_C_FASTLEARN_H */
