#pragma once
// spawn(): run a function on N processes of this program, like torch.multiprocessing.spawn with the
// "spawn" start method.
//
// The calling process (the parent) re-executes its own binary (/proc/self/exe; argv[0] becomes its absolute
// path, the other arguments stay as they were, then SpawnOptions::extra_args) once per rank through launch()
// (output prefixed, all or nothing, signals forwarded), so each child gets torchrun's variables
// (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...) and fastlearn's FASTLEARN_SPAWN_* variables. A child
// runs main() from the start; when it reaches the matching spawn() call, that call runs fn(rank) and
// ends the process: exit code 0, or 1 after writing the exception's message to an error file the parent
// reads. The child leaves through _exit() after flushing stdio, so static destructors do not run there.
//
// Rules that follow from re-executing:
//  - Code before the spawn() call runs in every child too: keep it free of side effects that matter
//    (and deterministic, so the child reaches the same call).
//  - Calls are matched by order: the n-th spawn() of the child with the same extra_args runs fn, earlier
//    ones return at once without doing anything. Nested spawn() (inside fn) is not supported.
//  - Under GoogleTest the child would run every test again: filter it to the calling test, e.g.
//    `.extra_args = {"--gtest_filter=Suite.Name"}` (the last --gtest_filter wins). A child that exits 0
//    without ever reaching its spawn() call is reported as an error, so a wrong filter cannot pass silently.
//  - Assertions of a test framework inside fn do not cross the process boundary: throw to fail a rank.
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace fastlearn {

struct SpawnOptions {
  std::vector<std::string> extra_args;           ///< appended to the children's argv (e.g. a gtest filter)
  std::map<std::string, std::string> extra_env;  ///< added to the children's environment
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  ///< 0: a free port on master_addr
  std::chrono::milliseconds grace_period =
      std::chrono::seconds(10);  ///< SIGTERM -> SIGKILL of the others after a failure
  bool prefix_output = true;     ///< "[rank R] " before each line of a child's output
  std::FILE* out = stdout;
  std::FILE* err = stderr;  ///< where the children's output goes
};

/// Runs fn(rank) for rank 0..nprocs-1, each in its own child process, and returns when all have finished.
/// Throws DistributedError naming the first failing rank and its exception message (or its exit code or
/// signal) after stopping the other ranks, also when SIGINT/SIGTERM stopped the run; ConfigError when nprocs < 1.
/// In a child, runs fn and exits.
void spawn(int nprocs, const std::function<void(int rank)>& fn, SpawnOptions options = {});

/// True in a process started by spawn() (also after its fn has started running).
bool in_spawned_process();

}  // namespace fastlearn
