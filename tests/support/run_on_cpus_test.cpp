// How `make test` shares a machine among tests: scripts/ctest-resources hands ctest one `cpus` resource per
// pair of CPUs (2 slots each), and tests/support/run_on_cpus pins each test to the pair it was given.
#include "support/build_paths.h"
#include "support/processes.h"

#include <gtest/gtest.h>
#include <sched.h>
#include <nlohmann/json.hpp>

#include <ATen/Parallel.h>

#include <cstdlib>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace {

using fastlearn::testing::run_shell;
namespace build_paths = fastlearn::testing::build_paths;

std::string script(const std::string& relative) { return std::string(build_paths::source_dir()) + "/" + relative; }

std::set<int> cpus_of_this_process() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof set, &set), 0);
  std::set<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &set)) cpus.insert(cpu);
  }
  return cpus;
}

// "id:c4_5,slots:1" -> {4, 5}
std::set<int> cpus_of_resource(std::string value) {
  value = value.substr(value.find(":c") + 2);
  value = value.substr(0, value.find(','));
  std::set<int> cpus;
  std::istringstream ids(value);
  for (std::string id; std::getline(ids, id, '_');) cpus.insert(std::stoi(id));
  return cpus;
}

std::vector<std::string> resource_ids(const std::string& cpu_list) {
  const auto [code, output] = run_shell("'" + script("scripts/ctest-resources") + "' " + cpu_list + " 2>&1");
  EXPECT_EQ(code, 0) << output;
  const auto spec = nlohmann::json::parse(output);
  EXPECT_EQ(spec["version"]["major"], 1);
  std::vector<std::string> ids;
  for (const auto& cpu : spec["local"][0]["cpus"]) {
    EXPECT_EQ(cpu["slots"], 2) << cpu.dump();
    ids.push_back(cpu["id"]);
  }
  return ids;
}

}  // namespace

TEST(TestHarness, CtestResourcesPairsTheCpusOfAList) {
  EXPECT_EQ(resource_ids("0-1"), (std::vector<std::string>{"c0_1"}));
  EXPECT_EQ(resource_ids("0-4"), (std::vector<std::string>{"c0_1", "c2_3", "c4"}));
  EXPECT_EQ(resource_ids("0-3,8,10-11"), (std::vector<std::string>{"c0_1", "c2_3", "c8_10", "c11"}));
  for (const char* bad : {"abc", "3-1", "0-", "1,,2"}) {
    const auto [code, output] = run_shell("'" + script("scripts/ctest-resources") + "' '" + bad + "' 2>&1");
    EXPECT_EQ(code, 2) << bad << ": " << output;
    EXPECT_NE(output.find(std::string("'") + bad), std::string::npos) << output;
  }
  // Without an argument: the CPUs this process may use.
  const auto ids = resource_ids("");
  std::set<int> listed;
  for (const auto& id : ids) {
    for (const int cpu : cpus_of_resource("id:" + id)) listed.insert(cpu);
  }
  EXPECT_EQ(listed, cpus_of_this_process());
}

TEST(TestHarness, RunOnCpusPinsTheCommandToTheCpusOfItsResource) {
  const auto first = *cpus_of_this_process().begin();
  const auto show = "'" + script("tests/support/run_on_cpus") + "' sh -c 'grep Cpus_allowed_list /proc/self/status'";
  const auto [code, output] =
      run_shell("CTEST_RESOURCE_GROUP_0_CPUS=id:c" + std::to_string(first) + ",slots:1 " + show + " 2>&1");
  EXPECT_EQ(code, 0) << output;
  EXPECT_NE(output.find("Cpus_allowed_list:\t" + std::to_string(first) + "\n"), std::string::npos) << output;

  // Outside `make test` (no resource) the command runs as it was started, with its arguments and exit code.
  const auto [plain_code, plain] =
      run_shell("env -u CTEST_RESOURCE_GROUP_0_CPUS '" + script("tests/support/run_on_cpus") +
                "' sh -c 'echo \"$1\"; exit 3' - 'a b'");
  EXPECT_EQ(plain_code, 3) << plain;
  EXPECT_EQ(plain, "a b\n");
}

TEST(TestHarness, UnderMakeTestEachTestRunsOnTheCpuPairCtestHandedIt) {
  const char* resource = std::getenv("CTEST_RESOURCE_GROUP_0_CPUS");
  if (resource == nullptr) GTEST_SKIP() << "not started by `make test` (ctest without scripts/ctest-resources' spec)";
  const auto pair = cpus_of_resource(resource);
  EXPECT_EQ(cpus_of_this_process(), pair) << resource;
  // LibTorch's intra-op threads follow the pinning (OpenMP reads the CPU mask when it starts), unless the
  // environment sets their number.
  if (std::getenv("OMP_NUM_THREADS") == nullptr && std::getenv("MKL_NUM_THREADS") == nullptr) {
    EXPECT_EQ(at::get_num_threads(), static_cast<int>(pair.size())) << resource;
  }
}
