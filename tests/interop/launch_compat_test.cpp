// The same unchanged app (tests/interop/tiny_train.cpp: 2 ranks, a DistribCtx line) started by
// torchrun (`python -m torch.distributed.run --no-python`), by an Open MPI-style environment
// (OMPI_COMM_WORLD_*) and by a SLURM-style one (SLURM_PROCID / SLURM_NTASKS / SLURM_LOCALID, the master
// from SLURM_JOB_NODELIST) trains to the same weights and metrics, bit for bit, as under
// `fastlearn launch --nproc-per-node 2`; each rank says which variables it was placed by.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "interop/job_result.h"
#include "support/build_paths.h"
#include "support/multiprocess.h"
#include "support/processes.h"

namespace fs = std::filesystem;
namespace flt = fastlearn::testing;

namespace {

fs::path scratch(const std::string& what) {
  auto dir = fs::temp_directory_path() / fmt::format("fastlearn-launch-{}-{}", what, getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "job");
  return dir;
}

// One process per rank, placed by `env(rank)` (no launcher at all, as mpirun or srun would start them).
flt::JobResult run_with_env(const fs::path& dir, const std::function<std::map<std::string, std::string>(int)>& env) {
  std::vector<flt::Command> commands;
  for (int rank = 0; rank < 2; ++rank) {
    auto e = env(rank);
    e["OMP_NUM_THREADS"] = "1";
    commands.push_back({.argv = {FASTLEARN_TINY_TRAIN, (dir / "job").string()},
                        .env = e,
                        .log = dir / fmt::format("rank{}.log", rank)});
  }
  const auto results = flt::run_commands(commands, std::chrono::seconds(90));
  for (const auto& r : results) EXPECT_TRUE(r.ok()) << r.output;
  return flt::read_job(dir / "job", 2);
}

}  // namespace

TEST(LaunchCompat, TorchrunNoPython) {
  const std::string python = FASTLEARN_PYTHON;
  if (python.empty()) GTEST_SKIP() << "configured without -DFASTLEARN_PYTHON (torchrun comes with Python's torch)";
  const auto dir = scratch("torchrun");
  const auto want = flt::baseline_job(dir / "baseline");
  const auto results =
      flt::run_commands({{.argv = {python, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
                                   "--master-addr", "127.0.0.1", "--master-port", std::to_string(flt::free_tcp_port()),
                                   "--no-python", FASTLEARN_TINY_TRAIN, (dir / "job").string()},
                          .log = dir / "torchrun.log"}},
                        std::chrono::seconds(90));
  ASSERT_TRUE(results[0].ok()) << results[0].output;
  const auto got = flt::read_job(dir / "job", 2);
  flt::expect_layout(got, 2, 2, "torchrun");
  flt::expect_same_training(got, want);
  fs::remove_all(dir);
}

TEST(LaunchCompat, OpenMpiEnvironment) {
  const auto dir = scratch("ompi");
  const auto want = flt::baseline_job(dir / "baseline");
  const int port = flt::free_tcp_port();
  const auto got = run_with_env(dir, [port](int rank) {
    return std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                                              {"OMPI_COMM_WORLD_SIZE", "2"},
                                              {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
                                              {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                              {"MASTER_ADDR", "127.0.0.1"},
                                              {"MASTER_PORT", std::to_string(port)}};
  });
  flt::expect_layout(got, 2, 2, "Open MPI");
  flt::expect_same_training(got, want);
  fs::remove_all(dir);
}

TEST(LaunchCompat, SlurmEnvironmentWithTheMasterFromTheNodeList) {
  const auto dir = scratch("slurm");
  const auto want = flt::baseline_job(dir / "baseline");
  const int port = flt::free_tcp_port();
  // No MASTER_ADDR: rank 0's host is the first of the node list ("localhost" here, then two others).
  const auto got = run_with_env(dir, [port](int rank) {
    return std::map<std::string, std::string>{
        {"SLURM_PROCID", std::to_string(rank)},         {"SLURM_NTASKS", "2"},
        {"SLURM_LOCALID", std::to_string(rank)},        {"SLURM_NTASKS_PER_NODE", "2"},
        {"SLURM_JOB_NODELIST", "localhost,gpu[07-08]"}, {"MASTER_PORT", std::to_string(port)}};
  });
  flt::expect_layout(got, 2, 2, "SLURM");
  for (const auto& r : got.ranks) EXPECT_EQ(r["master_addr"], "localhost") << r.dump();
  flt::expect_same_training(got, want);
  fs::remove_all(dir);
}
