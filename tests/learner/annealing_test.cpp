// Annealing schedules: values at known points computed by hand from the formulas, fastai's one-cycle
// shapes, phase boundaries, and bad inputs.
#include <fastlearn/core/error.h>
#include <fastlearn/learner/annealing.h>

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace fl = fastlearn;

namespace {

// (1 + cos(pi * (1 - 0.25))) / 2 = (1 - sqrt(2)/2) / 2: how far a cosine schedule is at a quarter.
constexpr double kCosQuarter = 0.14644660940672624;

TEST(Annealing, Linear) {
  auto s = fl::sched_lin(2, 10);
  EXPECT_DOUBLE_EQ(s(0), 2);
  EXPECT_DOUBLE_EQ(s(0.25), 4);
  EXPECT_DOUBLE_EQ(s(0.5), 6);
  EXPECT_DOUBLE_EQ(s(1), 10);
}

TEST(Annealing, Cosine) {
  auto s = fl::sched_cos(0, 10);
  EXPECT_NEAR(s(0), 0, 1e-15);
  EXPECT_DOUBLE_EQ(s(0.25), 10 * kCosQuarter);
  EXPECT_DOUBLE_EQ(s(0.5), 5);
  EXPECT_DOUBLE_EQ(s(0.75), 10 * (1 - kCosQuarter));
  EXPECT_DOUBLE_EQ(s(1), 10);
  auto down = fl::sched_cos(1, 0);
  EXPECT_DOUBLE_EQ(down(0.25), 1 - kCosQuarter);
}

TEST(Annealing, NoScheduleIsConstant) {
  auto s = fl::sched_no(3, 7);
  for (double pos : {0.0, 0.25, 0.5, 1.0}) EXPECT_EQ(s(pos), 3);
}

TEST(Annealing, Exponential) {
  auto s = fl::sched_exp(1e-7, 10);  // lr_find's range: 8 decades
  EXPECT_DOUBLE_EQ(s(0), 1e-7);
  EXPECT_DOUBLE_EQ(s(0.25), 1e-5);
  EXPECT_DOUBLE_EQ(s(0.5), 1e-3);
  EXPECT_DOUBLE_EQ(s(1), 10);
}

TEST(Annealing, Polynomial) {
  auto s = fl::sched_poly(1, 0, 2);
  EXPECT_DOUBLE_EQ(s(0), 1);
  EXPECT_DOUBLE_EQ(s(0.25), 1 - 1.0 / 16);
  EXPECT_DOUBLE_EQ(s(0.5), 0.75);
  EXPECT_DOUBLE_EQ(s(1), 0);
}

// fastai's fit_one_cycle defaults: pct_start 0.25, lr from lr_max/25 up to lr_max then down to lr_max/1e5
// (div = 25, div_final = 1e5), momentum 0.95 -> 0.85 -> 0.95.
TEST(Annealing, OneCycleLearningRate) {
  const double lr_max = 1e-2, start = lr_max / 25, end = lr_max / 1e5;
  auto s = fl::combined_cos(0.25, start, lr_max, end);
  EXPECT_DOUBLE_EQ(s(0), 4e-4);
  EXPECT_DOUBLE_EQ(s(0.0625), 4e-4 + kCosQuarter * (1e-2 - 4e-4));  // a quarter into the warm-up
  EXPECT_DOUBLE_EQ(s(0.125), (4e-4 + 1e-2) / 2);                    // half-way up
  EXPECT_DOUBLE_EQ(s(0.25), 1e-2);                                  // the peak: the second phase at 0
  EXPECT_DOUBLE_EQ(s(0.4375), 1e-2 + kCosQuarter * (1e-7 - 1e-2));  // a quarter into the annealing
  EXPECT_DOUBLE_EQ(s(0.625), (1e-2 + 1e-7) / 2);                    // half-way down
  EXPECT_NEAR(s(1), 1e-7, 1e-18);
  EXPECT_LT(s(0.2499999), 1e-2);
  EXPECT_GT(s(0.2499999), 0.99e-2);
}

TEST(Annealing, OneCycleMomentum) {
  auto s = fl::combined_cos(0.25, 0.95, 0.85, 0.95);
  EXPECT_DOUBLE_EQ(s(0), 0.95);
  EXPECT_DOUBLE_EQ(s(0.0625), 0.95 - kCosQuarter * 0.1);
  EXPECT_DOUBLE_EQ(s(0.125), 0.9);
  EXPECT_DOUBLE_EQ(s(0.25), 0.85);
  EXPECT_DOUBLE_EQ(s(0.4375), 0.85 + kCosQuarter * 0.1);
  EXPECT_DOUBLE_EQ(s(0.625), 0.9);
  EXPECT_DOUBLE_EQ(s(1), 0.95);
}

TEST(Annealing, CombineSchedsPhases) {
  // fastai's documentation example.
  auto s = fl::combine_scheds({0.3, 0.7}, {fl::sched_cos(0.3, 0.6), fl::sched_cos(0.6, 0.2)});
  EXPECT_DOUBLE_EQ(s(0), 0.3);
  EXPECT_DOUBLE_EQ(s(0.15), 0.45);
  EXPECT_DOUBLE_EQ(s(0.3), 0.6);
  EXPECT_DOUBLE_EQ(s(0.65), 0.4);
  EXPECT_DOUBLE_EQ(s(1), 0.2);
}

TEST(Annealing, CombineSchedsBoundariesAndZeroLengthPhases) {
  auto s = fl::combine_scheds({0.5, 0, 0.5}, {fl::sched_lin(0, 1), fl::sched_no(42, 42), fl::sched_lin(2, 3)});
  EXPECT_DOUBLE_EQ(s(0.25), 0.5);
  EXPECT_DOUBLE_EQ(s(0.5), 2) << "at a boundary the later phase applies, skipping the empty one";
  EXPECT_DOUBLE_EQ(s(0.75), 2.5);
  EXPECT_DOUBLE_EQ(s(1), 3);
  // pos == 1 is the last schedule at 1, even when the last phase is empty (fastai would divide 0 by 0).
  auto last_empty = fl::combine_scheds({1, 0}, {fl::sched_lin(0, 1), fl::sched_lin(7, 8)});
  EXPECT_DOUBLE_EQ(last_empty(0.5), 0.5);
  EXPECT_DOUBLE_EQ(last_empty(1), 8);
  auto single = fl::combine_scheds({1}, {fl::sched_lin(0, 4)});
  EXPECT_DOUBLE_EQ(single(0.25), 1);
  // Fractions whose double sum is not exactly 1.
  EXPECT_NO_THROW(fl::combine_scheds({0.1, 0.2, 0.7}, {fl::sched_no(1, 1), fl::sched_no(2, 2), fl::sched_no(3, 3)}));
}

TEST(Annealing, BadInputsAreConfigErrors) {
  EXPECT_THROW(fl::sched_exp(0, 1), fl::ConfigError);
  EXPECT_THROW(fl::sched_exp(-1e-3, 1), fl::ConfigError);
  EXPECT_THROW(fl::sched_exp(1e-3, 0), fl::ConfigError);
  EXPECT_THROW(fl::sched_poly(1, 0, 0), fl::ConfigError);
  EXPECT_THROW(fl::sched_lin(std::numeric_limits<double>::infinity(), 0), fl::ConfigError);
  const auto lin = fl::sched_lin(0, 1);
  EXPECT_THROW(fl::combine_scheds({0.5, 0.4}, {lin, lin}), fl::ConfigError);   // sums to 0.9
  EXPECT_THROW(fl::combine_scheds({1.5, -0.5}, {lin, lin}), fl::ConfigError);  // sums to 1, one negative
  EXPECT_THROW(fl::combine_scheds({0.5, 0.5}, {lin}), fl::ConfigError);
  EXPECT_THROW(fl::combine_scheds({}, {}), fl::ConfigError);
  EXPECT_THROW(fl::combine_scheds({1}, {fl::Schedule()}), fl::ConfigError);
  EXPECT_THROW(fl::combined_cos(1.5, 1, 2, 3), fl::ConfigError);
  const auto s = fl::combined_cos(0.25, 1, 2, 3);
  EXPECT_THROW(s(1.5), fl::ConfigError);
  EXPECT_THROW(s(-0.1), fl::ConfigError);
  EXPECT_THROW(s(std::nan("")), fl::ConfigError);
  EXPECT_DOUBLE_EQ(s(1 + 1e-12), 3) << "an ulp-sized overshoot is clamped";
}

}  // namespace
