/* A 2-D heat solver that trains a surrogate of its own time step while it runs, then uses it: the C version of
 * apps/examples/heat_surrogate.cpp (and heat_surrogate.f90), through fastlearn's C interface.
 *   heat_surrogate_c CONFIG [WEIGHTS]   (configs/heat_surrogate.toml; WEIGHTS: where to save the trained weights)
 * On several ranks (fastlearn launch --nproc-per-node 2 ...) each rank simulates fields of its own. */
#include <fastlearn/c/fastlearn.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { N = 32, BATCH = 8, RESTART = 50, ROLLOUT = 20 };
static const double ALPHA = 0.2; /* diffusion number: explicit Euler is stable up to 0.25 */

/* Park-Miller's generator: the same numbers in C, C++ and Fortran. */
static double uniform(long long* state) {
  *state = (*state * 48271LL) % 2147483647LL;
  return (double)*state / 2147483647.0;
}

static void noise(double* u, int fields, long long* state) {
  for (int k = 0; k < fields * N * N; ++k) u[k] = uniform(state);
}

/* One explicit step of u_t = laplacian(u) on each field, the boundary held at zero. */
static void solver_step(const double* u, double* next, int fields) {
  for (int b = 0; b < fields; ++b) {
    const double* f = u + b * N * N;
    for (int j = 0; j < N; ++j) {
      for (int i = 0; i < N; ++i) {
        const double c = f[j * N + i];
        const double west = i > 0 ? f[j * N + i - 1] : 0.0, east = i < N - 1 ? f[j * N + i + 1] : 0.0;
        const double south = j > 0 ? f[(j - 1) * N + i] : 0.0, north = j < N - 1 ? f[(j + 1) * N + i] : 0.0;
        next[b * N * N + j * N + i] = c + ALPHA * ((((west + east) + south) + north) - 4.0 * c);
      }
    }
  }
}

static fl_array fields_of(double* u, int fields) {
  fl_array a = {.data = u, .dtype = FL_FLOAT64, .layout = FL_ROW_MAJOR, .ndim = 3, .shape = {fields, N, N}};
  return a;
}

static int check(fl_status status, const char* what) {
  if (status != FL_OK) fprintf(stderr, "heat_surrogate_c: %s: %s (status %d)\n", what, fl_last_error(), (int)status);
  return status == FL_OK;
}

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: heat_surrogate_c CONFIG [WEIGHTS]\n");
    return 2;
  }
  static double u[BATCH * N * N], next[BATCH * N * N], surrogate[N * N], exact[N * N], predicted[N * N], solved[N * N];
  fl_learner* learn = NULL;
  if (!check(fl_create(argv[1], &learn), "fl_create") || !check(fl_distributed_init(learn), "fl_distributed_init"))
    return 1;
  int32_t rank = 0, world_size = 1;
  check(fl_rank(learn, &rank, &world_size), "fl_rank");
  long long state = 12345 + 1000LL * rank; /* each rank simulates fields of its own */

  /* Samples set aside for validation, then the simulation: every tick trains one step on (fields, next fields). */
  noise(u, BATCH, &state);
  solver_step(u, next, BATCH);
  fl_array x = fields_of(u, BATCH), y = fields_of(next, BATCH);
  if (!check(fl_hold_out(learn, &x, &y), "fl_hold_out")) return 1;
  int64_t trained = 0, planned = 0;
  int32_t running = 1;
  double loss = 0;
  for (int tick = 0; running; ++tick) {
    if (tick % RESTART == 0) noise(u, BATCH, &state); /* a fresh start now and then */
    solver_step(u, next, BATCH);
    if (!check(fl_train_step(learn, &x, &y, &loss), "fl_train_step")) return 1;
    memcpy(u, next, sizeof u);
    check(fl_steps(learn, &trained, &planned, &running), "fl_steps");
  }

  /* The surrogate in the solver's place: ROLLOUT steps from a new field, against the solver's. */
  noise(exact, 1, &state);
  memcpy(surrogate, exact, sizeof exact);
  for (int s = 0; s < ROLLOUT; ++s) {
    fl_array in = fields_of(surrogate, 1), out = fields_of(predicted, 1);
    if (!check(fl_predict(learn, &in, &out), "fl_predict")) return 1;
    memcpy(surrogate, predicted, sizeof predicted);
    solver_step(exact, solved, 1);
    memcpy(exact, solved, sizeof solved);
  }
  double error = 0, norm = 0;
  for (int k = 0; k < N * N; ++k) {
    error += (surrogate[k] - exact[k]) * (surrogate[k] - exact[k]);
    norm += exact[k] * exact[k];
  }
  if (rank == 0)
    printf("heat_surrogate_c: %lld steps on %d rank(s), last loss %.3g; after %d steps the surrogate is %.3g%% off\n",
           (long long)trained, (int)world_size, loss, ROLLOUT, 100.0 * sqrt(error / norm));
  if (argc > 2 && !check(fl_save(learn, argv[2]), "fl_save")) return 1;
  return check(fl_free(&learn), "fl_free") ? 0 : 1;
}
