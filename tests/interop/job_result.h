#pragma once
// What interop_tiny_train (tests/interop/tiny_train.cpp) leaves in its output folder, read back, and
// the baseline every launch is compared with: `fastlearn launch --nproc-per-node 2` on this machine.
#include <fastlearn/core/safetensors.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "support/build_paths.h"
#include "support/processes.h"

namespace fastlearn::testing {

struct JobResult {
  NamedTensors weights;
  nlohmann::json history;             ///< per epoch: train_loss, valid_loss, accuracy
  std::vector<nlohmann::json> ranks;  ///< rank<R>.json of every rank that wrote one
};

inline nlohmann::json read_json(const std::filesystem::path& file) {
  std::ifstream in(file);
  return nlohmann::json::parse(in, nullptr, false);
}

inline JobResult read_job(const std::filesystem::path& dir, int world_size) {
  JobResult r;
  if (std::filesystem::exists(dir / "weights.safetensors"))
    r.weights = load_safetensors(dir / "weights.safetensors").tensors;
  if (std::filesystem::exists(dir / "history.json")) r.history = read_json(dir / "history.json");
  for (int rank = 0; rank < world_size; ++rank) {
    const auto file = dir / ("rank" + std::to_string(rank) + ".json");
    if (std::filesystem::exists(file)) r.ranks.push_back(read_json(file));
  }
  return r;
}

/// Same parameter names, shapes and values bit for bit, and the same per-epoch losses and accuracy.
inline void expect_same_training(const JobResult& got, const JobResult& want) {
  ASSERT_EQ(got.weights.size(), want.weights.size());
  ASSERT_FALSE(want.weights.empty());
  for (std::size_t i = 0; i < want.weights.size(); ++i) {
    EXPECT_EQ(got.weights[i].first, want.weights[i].first);
    EXPECT_TRUE(got.weights[i].second.equal(want.weights[i].second)) << "tensor " << want.weights[i].first;
  }
  EXPECT_EQ(got.history, want.history);
  ASSERT_EQ(want.history.size(), 2u);
  // It trained: the loss fell and the classes are separated.
  EXPECT_LT(want.history[1]["train_loss"].get<double>(), want.history[0]["train_loss"].get<double>());
  EXPECT_GE(want.history[1]["accuracy"].get<double>(), 0.8);
}

/// Each of the `world_size` ranks resolved the job from `source` with its own rank and local rank.
inline void expect_layout(const JobResult& job, int world_size, int local_world_size, const std::string& source) {
  ASSERT_EQ(static_cast<int>(job.ranks.size()), world_size);
  for (int rank = 0; rank < world_size; ++rank) {
    const auto& r = job.ranks[static_cast<std::size_t>(rank)];
    EXPECT_EQ(r["source"], source) << r.dump();
    EXPECT_EQ(r["rank"], rank) << r.dump();
    EXPECT_EQ(r["world_size"], world_size) << r.dump();
    EXPECT_EQ(r["local_rank"], rank % local_world_size) << r.dump();
  }
}

/// Runs `fastlearn launch --nproc-per-node 2 interop_tiny_train <dir>` and reads what it left.
inline JobResult baseline_job(const std::filesystem::path& dir) {
  std::filesystem::create_directories(dir);
  const auto results = run_commands(
      {{.argv = {FASTLEARN_CLI, "launch", "--nproc-per-node", "2", "--", FASTLEARN_TINY_TRAIN, dir.string()},
        .log = dir / "launch.log"}},
      std::chrono::seconds(90));
  EXPECT_TRUE(results[0].ok()) << results[0].output;
  return read_job(dir, 2);
}

}  // namespace fastlearn::testing
