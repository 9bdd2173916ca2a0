// Two "nodes" on one machine: two network namespaces of the test's own, joined by a veth pair, each
// running `fastlearn launch --nnodes 2 --node-rank K --master-addr <node 0's address> --nproc-per-node 1`
// (through `ip netns exec`). The store and Gloo have to go over the veth link (the namespaces share no
// loopback), and the job must train to the same weights and metrics as one node with 2 ranks.
// Needs root (CAP_SYS_ADMIN + CAP_NET_ADMIN); skips, saying why, where namespaces cannot be made.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <stdexcept>

#include "interop/job_result.h"
#include "support/build_paths.h"
#include "support/processes.h"

namespace fs = std::filesystem;
namespace flt = fastlearn::testing;

namespace {

using fastlearn::testing::run_shell;

// Two namespaces and a veth pair between them, with names unique to this run; removed by the destructor
// (deleting a namespace deletes the veth end inside it, and with it the pair), also after a failure.
class TwoHosts {
 public:
  TwoHosts() : suffix_(std::to_string(getpid())) {
    ns_ = {"fl-node0-" + suffix_, "fl-node1-" + suffix_};
    veth_ = {"flv0-" + suffix_, "flv1-" + suffix_};  // interface names have at most 15 characters
  }
  ~TwoHosts() {
    for (std::size_t i = 0; i < made_; ++i) run_shell("ip netns delete " + ns_[i]);
    run_shell("ip link delete " + veth_[0]);  // only left when moving it into a namespace failed
  }
  TwoHosts(const TwoHosts&) = delete;
  TwoHosts& operator=(const TwoHosts&) = delete;

  /// Creates the namespaces; the error output of `ip` when it cannot (no root, no netns support).
  std::string create_namespaces() {
    for (const auto& ns : ns_) {
      auto [status, out] = run_shell("ip netns add " + ns);
      if (status != 0) return "`ip netns add " + ns + "` failed: " + out;
      ++made_;
    }
    return "";
  }

  /// Joins them: node K gets 10.97.0.<K+1>/24 on its end of the veth pair, both ends and lo up.
  void connect() {
    run_ok(fmt::format("ip link add {} type veth peer name {}", veth_[0], veth_[1]));
    for (int k = 0; k < 2; ++k) {
      run_ok(fmt::format("ip link set {} netns {}", veth_[k], ns_[k]));
      run_ok(fmt::format("ip -n {} addr add {}/24 dev {}", ns_[k], address(k), veth_[k]));
      run_ok(fmt::format("ip -n {} link set {} up", ns_[k], veth_[k]));
      run_ok(fmt::format("ip -n {} link set lo up", ns_[k]));
    }
  }

  const std::string& ns(int k) const { return ns_[k]; }
  const std::string& veth(int k) const { return veth_[k]; }
  static std::string address(int k) { return fmt::format("10.97.0.{}", k + 1); }

 private:
  static void run_ok(const std::string& command) {
    auto [status, out] = run_shell(command);
    if (status != 0) throw std::runtime_error("`" + command + "` failed: " + out);
  }
  std::string suffix_;
  std::array<std::string, 2> ns_, veth_;
  std::size_t made_ = 0;
};

}  // namespace

TEST(MultiNode, TwoNamespacesOverAVethPairTrainLikeOneNode) {
  TwoHosts hosts;
  if (auto reason = hosts.create_namespaces(); !reason.empty()) {
    GTEST_SKIP() << "cannot create network namespaces here (needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN): "
                 << reason;
  }
  ASSERT_NO_THROW(hosts.connect());
  // Node 1 reaches node 0 over the veth link (the namespaces have no other route).
  const auto [status, out] = run_shell(fmt::format("ip -n {} route get {}", hosts.ns(1), TwoHosts::address(0)));
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("dev " + hosts.veth(1)), std::string::npos) << out;

  const auto dir = fs::temp_directory_path() / fmt::format("fastlearn-netns-{}", getpid());
  fs::remove_all(dir);
  fs::create_directories(dir / "job");
  const auto want = flt::baseline_job(dir / "baseline");

  std::vector<flt::Command> nodes;
  for (int k = 0; k < 2; ++k) {
    nodes.push_back({.argv = {"/usr/sbin/ip", "netns", "exec", hosts.ns(k), FASTLEARN_CLI, "launch", "--nnodes", "2",
                              "--node-rank", std::to_string(k), "--master-addr", TwoHosts::address(0), "--master-port",
                              "29517", "--nproc-per-node", "1", "--", FASTLEARN_TINY_TRAIN, (dir / "job").string()},
                     .log = dir / fmt::format("node{}.log", k)});
  }
  const auto results = flt::run_commands(nodes, std::chrono::seconds(120));
  for (int k = 0; k < 2; ++k) EXPECT_TRUE(results[k].ok()) << "node " << k << ":\n" << results[k].output;

  const auto got = flt::read_job(dir / "job", 2);
  ASSERT_EQ(got.ranks.size(), 2u);
  for (int rank = 0; rank < 2; ++rank) {
    const auto& r = got.ranks[static_cast<std::size_t>(rank)];
    EXPECT_EQ(r["rank"], rank) << r.dump();
    EXPECT_EQ(r["world_size"], 2) << r.dump();
    EXPECT_EQ(r["local_rank"], 0) << "one rank per node: " << r.dump();
    EXPECT_EQ(r["master_addr"], TwoHosts::address(0)) << r.dump();
  }
  flt::expect_same_training(got, want);
  if (!HasFailure()) fs::remove_all(dir);
}
