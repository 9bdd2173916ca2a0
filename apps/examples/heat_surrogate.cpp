// A 2-D heat solver that trains a surrogate of its own time step while it runs, then uses it in the solver's place:
// the C++ version, on the step API (heat_surrogate.c and heat_surrogate.f90 do the same through the C interface).
//   heat_surrogate CONFIG [WEIGHTS]   (configs/heat_surrogate.toml; WEIGHTS: where to save the trained weights)
// On several ranks (fastlearn launch --nproc-per-node 2 ...) each rank simulates fields of its own.
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>

#include <cstdint>
#include <iostream>
#include <vector>

namespace fl = fastlearn;

namespace {

constexpr int N = 32, kBatch = 8, kRestart = 50, kRollout = 20;
constexpr double kAlpha = 0.2;  // diffusion number: explicit Euler is stable up to 0.25

// Park-Miller's generator: the same numbers in C, C++ and Fortran.
double uniform(std::int64_t& state) {
  state = (state * 48271) % 2147483647;
  return static_cast<double>(state) / 2147483647.0;
}

void noise(std::vector<double>& u, std::int64_t& state) {
  for (auto& v : u) v = uniform(state);
}

// One explicit step of u_t = laplacian(u) on each field, the boundary held at zero.
std::vector<double> solver_step(const std::vector<double>& u) {
  std::vector<double> next(u.size());
  for (std::size_t b = 0; b < u.size() / (N * N); ++b) {
    const double* f = u.data() + b * N * N;
    for (int j = 0; j < N; ++j) {
      for (int i = 0; i < N; ++i) {
        const double c = f[j * N + i];
        const double west = i > 0 ? f[j * N + i - 1] : 0.0, east = i < N - 1 ? f[j * N + i + 1] : 0.0;
        const double south = j > 0 ? f[(j - 1) * N + i] : 0.0, north = j < N - 1 ? f[(j + 1) * N + i] : 0.0;
        next[b * N * N + j * N + i] = c + kAlpha * ((((west + east) + south) + north) - 4.0 * c);
      }
    }
  }
  return next;
}

// Fields as the model's batch: (fields, N, N) in float32.
at::Tensor batch_of(std::vector<double>& u) {
  const auto fields = static_cast<std::int64_t>(u.size() / (N * N));
  return torch::from_blob(u.data(), {fields, N, N}, torch::kFloat64).to(torch::kFloat32);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: heat_surrogate CONFIG [WEIGHTS]\n";
    return 2;
  }
  const auto config = fl::load_config(argv[1]);
  auto learn = fl::learner_from_config(config, {.progress = false});
  fl::DistribCtx ctx(*learn, fl::trainer_options(config.distributed), fl::setup_options(config.distributed));
  std::int64_t state = 12345 + 1000 * fl::rank();  // each rank simulates fields of its own

  // Samples set aside for validation, then the simulation: every tick trains one step on (fields, next fields).
  learn->begin_steps(fl::step_plan(config), fl::step_fit(config));
  std::vector<double> u(kBatch * N * N);
  noise(u, state);
  auto next = solver_step(u);
  learn->hold_out({batch_of(u)}, {batch_of(next)});
  at::Tensor loss;
  for (int tick = 0; learn->stepping(); ++tick) {
    if (tick % kRestart == 0) noise(u, state);  // a fresh start now and then
    next = solver_step(u);
    loss = learn->train_step(batch_of(u), batch_of(next));
    u = next;
  }
  learn->end_steps();

  // The surrogate in the solver's place: kRollout steps from a new field, against the solver's.
  std::vector<double> exact(N * N);
  noise(exact, state);
  auto surrogate = batch_of(exact);
  for (int s = 0; s < kRollout; ++s) {
    surrogate = learn->predict_batch({surrogate});
    exact = solver_step(exact);
  }
  const auto solved = torch::from_blob(exact.data(), {1, N, N}, torch::kFloat64);
  const auto off = (surrogate.to(torch::kFloat64) - solved).norm() / solved.norm();
  if (fl::rank() == 0)
    fmt::print(
        "heat_surrogate: {} steps on {} rank(s), last loss {:.3g}; after {} steps the surrogate is {:.3g}% off\n",
        learn->train_iter, fl::world_size(), loss.item<double>(), kRollout, 100 * off.item<double>());
  if (argc > 2 && fl::rank() == 0) fl::save_checkpoint(*learn, argv[2]);
}
