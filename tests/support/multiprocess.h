#pragma once
// Runs a test body on N ranks, each a separate process, for distributed tests.
//
// The test binary re-executes itself once per rank, filtered to the current test; the child runs only
// the body for its rank and reports through its exit status and captured output. Ranks meet through
// a TCPStore that the parent serves on a free loopback port (picked by the OS, so tests run in
// parallel without clashing). On the timeout every rank's process group is killed.
//
// Rule: code in the test outside the body also runs in each child up to the matching call, so keep
// it free of side effects that matter (creating a temporary folder is fine).
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace fastlearn::testing {

/// What a rank's body gets.
struct RankContext {
  int rank = 0;
  int world_size = 1;
  c10::intrusive_ptr<c10d::Store> store;  ///< client of the parent's TCPStore, shared by all ranks
};

struct MultiProcessOptions {
  std::chrono::milliseconds timeout = std::chrono::seconds(120);  ///< whole run; then every rank is killed
  /// Extra environment variables of a rank's process (e.g. RANK, MASTER_ADDR for env:// tests).
  std::function<std::map<std::string, std::string>(int rank)> env;
  /// run_on_ranks: also print the output of a rank that passed (rank 0's), for tests that print their figures.
  bool show_output = false;
};

/// How one rank ended.
struct RankResult {
  int rank = 0;
  int pid = 0;
  bool passed = false;                 ///< exited 0 with no failed assertion
  bool skipped = false;                ///< the body called GTEST_SKIP
  bool timed_out = false;              ///< killed at the timeout
  bool stopped_after_failure = false;  ///< killed because another rank had failed and this one did not end
  int exit_code = -1;                  ///< when it exited
  int signal = 0;                      ///< when a signal ended it
  std::string output;                  ///< its stdout and stderr, with the failed assertions
  std::string summary() const;         ///< one line: "rank 1: exited with code 1", "rank 0: timed out (killed)"...
};

/// Runs `body` on `world_size` ranks and returns how each ended; reports nothing by itself.
std::vector<RankResult> run_ranks(int world_size, const std::function<void(const RankContext&)>& body,
                                  const MultiProcessOptions& options = {});

/// run_ranks, then a gtest failure per failed rank (with its output); skips the test if every rank skipped.
void run_on_ranks(int world_size, const std::function<void(const RankContext&)>& body,
                  const MultiProcessOptions& options = {});

/// Environment of a torchrun-style job for MultiProcessOptions::env: RANK, WORLD_SIZE, LOCAL_RANK,
/// LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1 and a MASTER_PORT that is free when the ranks start.
std::function<std::map<std::string, std::string>(int rank)> torchrun_env(int world_size);

/// A TCP port nobody listens on right now (on 127.0.0.1), picked by fastlearn::pick_free_port.
int free_tcp_port();

/// True in a rank's child process.
bool in_rank_process();

/// The pid of the test's own process: the parent's in a rank's child, so both can name the same files.
int test_process_id();

}  // namespace fastlearn::testing
