#include <fastlearn/learner/annealing.h>

#include <fastlearn/core/error.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>

namespace fastlearn {

namespace {

void check_finite(const char* fn, const char* what, double value) {
  if (!std::isfinite(value)) throw ConfigError(fmt::format("{}: {} must be finite, got {}", fn, what, value));
}

}  // namespace

Schedule sched_lin(double start, double end) {
  check_finite("sched_lin", "start", start);
  check_finite("sched_lin", "end", end);
  return [=](double pos) { return start + pos * (end - start); };
}

Schedule sched_cos(double start, double end) {
  check_finite("sched_cos", "start", start);
  check_finite("sched_cos", "end", end);
  return [=](double pos) { return start + (1 + std::cos(std::numbers::pi * (1 - pos))) * (end - start) / 2; };
}

Schedule sched_no(double start, double /*end*/) {
  check_finite("sched_no", "start", start);
  return [=](double) { return start; };
}

Schedule sched_exp(double start, double end) {
  check_finite("sched_exp", "start", start);
  check_finite("sched_exp", "end", end);
  if (start <= 0 || end <= 0)
    throw ConfigError(
        fmt::format("sched_exp({}, {}): start and end must be > 0 for an exponential schedule; use "
                    "sched_lin or sched_cos to reach 0",
                    start, end));
  return [=](double pos) { return start * std::pow(end / start, pos); };
}

Schedule sched_poly(double start, double end, double power) {
  check_finite("sched_poly", "start", start);
  check_finite("sched_poly", "end", end);
  check_finite("sched_poly", "power", power);
  if (power <= 0) throw ConfigError(fmt::format("sched_poly: power must be > 0, got {}", power));
  return [=](double pos) { return start + (end - start) * std::pow(pos, power); };
}

Schedule combine_scheds(std::vector<double> pcts, std::vector<Schedule> scheds) {
  if (pcts.empty() || pcts.size() != scheds.size())
    throw ConfigError(
        fmt::format("combine_scheds: got {} fractions and {} schedules; pass one fraction per "
                    "schedule (at least one)",
                    pcts.size(), scheds.size()));
  for (std::size_t k = 0; k < pcts.size(); ++k) {
    if (!std::isfinite(pcts[k]) || pcts[k] < 0)
      throw ConfigError(fmt::format("combine_scheds: fraction {} is {}; fractions must be >= 0", k, pcts[k]));
    if (!scheds[k]) throw ConfigError(fmt::format("combine_scheds: schedule {} is empty", k));
  }
  const double total = std::accumulate(pcts.begin(), pcts.end(), 0.0);
  // A tolerance, so that fractions like {0.1, 0.2, 0.7} whose double sum is 0.9999999999999999 pass.
  if (std::abs(total - 1) > 1e-9)
    throw ConfigError(fmt::format("combine_scheds: the fractions sum to {}, not 1", total));
  // bounds[k] .. bounds[k+1] is phase k; the last bound is exactly 1.
  std::vector<double> bounds{0.0};
  for (const double p : pcts) bounds.push_back(bounds.back() + p);
  bounds.back() = 1.0;
  return [bounds = std::move(bounds), scheds = std::move(scheds)](double pos) {
    // Rounding in the caller's iter / total may overshoot a bound by an ulp or so: that much is clamped.
    if (!(pos >= -1e-9 && pos <= 1 + 1e-9))
      throw ConfigError(fmt::format("combine_scheds: position {} is outside [0, 1]", pos));
    pos = std::clamp(pos, 0.0, 1.0);
    // The last phase whose start is <= pos (so zero-length phases are skipped), but never past the last.
    std::size_t k = scheds.size() - 1;
    while (k > 0 && pos < bounds[k]) --k;
    const double width = bounds[k + 1] - bounds[k];
    const double local = width > 0 ? std::min(1.0, (pos - bounds[k]) / width) : 1.0;
    return scheds[k](local);
  };
}

Schedule combined_cos(double pct, double start, double middle, double end) {
  if (!(pct >= 0 && pct <= 1)) throw ConfigError(fmt::format("combined_cos: pct must be in [0, 1], got {}", pct));
  return combine_scheds({pct, 1 - pct}, {sched_cos(start, middle), sched_cos(middle, end)});
}

}  // namespace fastlearn
