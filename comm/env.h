#pragma once
// Where this process sits in a distributed job: rank, world size, local rank, local world size, and the
// master's address and port. Resolved, in order, from explicit options, torchrun's variables (RANK,
// WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), Open MPI (OMPI_COMM_WORLD_*),
// PMI (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID, MPI_LOCALNRANKS) and SLURM (SLURM_PROCID, SLURM_NTASKS,
// SLURM_LOCALID, SLURM_NTASKS_PER_NODE, the master from SLURM_JOB_NODELIST). Without any of them the
// process is a job of one.
#include <functional>
#include <optional>
#include <string>

namespace fastlearn {

struct DistEnv {
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";  ///< where rank and world size came from ("torchrun", "Open MPI", ...)
};

/// Values that override the environment (unset fields are looked up).
struct EnvOptions {
  std::optional<int> rank, world_size, local_rank, local_world_size, master_port;
  std::optional<std::string> master_addr;
};

/// Reads a variable; the default reads the process environment.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_env();

/// Resolves the job's layout; DistributedError naming the variables on inconsistent or malformed values
/// (rank >= world size, a non-number, no master address for a job spanning several nodes, ...).
DistEnv resolve_env(const EnvOptions& options = {}, const EnvLookup& lookup = process_env());

/// The first host of a SLURM node list: "node[03-05,9],gpu1" -> "node03".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace fastlearn
