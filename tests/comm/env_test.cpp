// Resolution of the job layout from explicit options and the variables of torchrun, Open MPI, PMI and
// SLURM, in that order of precedence, and the errors for inconsistent values.
#include <fastlearn/comm/detail/rendezvous.h>
#include <fastlearn/comm/env.h>
#include <fastlearn/core/error.h>

#include <gtest/gtest.h>

#include <map>

namespace fl = fastlearn;

namespace {

fl::EnvLookup vars(std::map<std::string, std::string> values) {
  return [values = std::move(values)](const std::string& name) -> std::optional<std::string> {
    auto it = values.find(name);
    if (it == values.end()) return std::nullopt;
    return it->second;
  };
}

std::string error_of(const fl::EnvOptions& options, std::map<std::string, std::string> values) {
  try {
    fl::resolve_env(options, vars(std::move(values)));
  } catch (const fl::DistributedError& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST(Env, NothingSetIsASingleProcess) {
  const auto env = fl::resolve_env({}, vars({}));
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1");
  EXPECT_EQ(env.source, "single process");
}

TEST(Env, TorchrunVariables) {
  const auto env = fl::resolve_env({}, vars({{"RANK", "3"},
                                             {"WORLD_SIZE", "4"},
                                             {"LOCAL_RANK", "1"},
                                             {"LOCAL_WORLD_SIZE", "2"},
                                             {"MASTER_ADDR", "10.0.0.7"},
                                             {"MASTER_PORT", "29555"}}));
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.0.0.7");
  EXPECT_EQ(env.master_port, 29555);
  EXPECT_EQ(env.source, "torchrun");
}

TEST(Env, PrecedenceExplicitThenTorchrunThenOpenMpiThenPmiThenSlurm) {
  std::map<std::string, std::string> all{
      {"RANK", "1"},       {"WORLD_SIZE", "8"}, {"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "8"},
      {"PMI_RANK", "3"},   {"PMI_SIZE", "8"},   {"SLURM_PROCID", "4"},         {"SLURM_NTASKS", "8"},
      {"MASTER_ADDR", "h"}};
  EXPECT_EQ(fl::resolve_env({.rank = 0, .world_size = 2}, vars(all)).rank, 0);
  EXPECT_EQ(fl::resolve_env({}, vars(all)).rank, 1);
  all.erase("RANK");
  EXPECT_EQ(fl::resolve_env({}, vars(all)).source, "Open MPI");
  EXPECT_EQ(fl::resolve_env({}, vars(all)).rank, 2);
  all.erase("OMPI_COMM_WORLD_RANK");
  EXPECT_EQ(fl::resolve_env({}, vars(all)).rank, 3);
  all.erase("PMI_RANK");
  EXPECT_EQ(fl::resolve_env({}, vars(all)).rank, 4);
  EXPECT_EQ(fl::resolve_env({}, vars(all)).source, "SLURM");
}

TEST(Env, OpenMpiLocalLayoutAndLoopbackMasterOnOneNode) {
  const auto env = fl::resolve_env({}, vars({{"OMPI_COMM_WORLD_RANK", "1"},
                                             {"OMPI_COMM_WORLD_SIZE", "2"},
                                             {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                             {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}}));
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.master_addr, "127.0.0.1") << "all ranks on this node: loopback";
  EXPECT_EQ(env.master_port, 29500);
}

TEST(Env, SlurmTakesTheMasterFromTheNodeList) {
  const auto env = fl::resolve_env({}, vars({{"SLURM_PROCID", "5"},
                                             {"SLURM_NTASKS", "8"},
                                             {"SLURM_LOCALID", "1"},
                                             {"SLURM_NTASKS_PER_NODE", "4(x2)"},
                                             {"SLURM_JOB_NODELIST", "gpu[07-08]"}}));
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.master_addr, "gpu07");
  EXPECT_EQ(fl::first_slurm_host("node1,node2"), "node1");
  EXPECT_EQ(fl::first_slurm_host("n[3,5-6],m1"), "n3");
  EXPECT_EQ(fl::first_slurm_host("solo"), "solo");
}

TEST(Env, InconsistentValuesAreClearErrors) {
  EXPECT_NE(error_of({}, {{"RANK", "2"}, {"WORLD_SIZE", "2"}}).find("RANK=2 is out of range for WORLD_SIZE=2"),
            std::string::npos);
  EXPECT_NE(error_of({}, {{"RANK", "x"}, {"WORLD_SIZE", "2"}}).find("RANK='x' is not an integer"), std::string::npos);
  EXPECT_NE(error_of({}, {{"RANK", "0"}, {"WORLD_SIZE", "0"}}).find("must be >= 1"), std::string::npos);
  EXPECT_NE(error_of({.rank = 1}, {}).find("set the rank option but not the world_size option"), std::string::npos);
  EXPECT_NE(error_of({}, {{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_WORLD_SIZE", "2"}}).find("set MASTER_ADDR"),
            std::string::npos)
      << "a job spanning nodes needs a master address";
  EXPECT_NE(error_of({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "5"}}).find("local rank 5"),
            std::string::npos);
  EXPECT_NE(error_of({}, {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}).find("not a TCP port"),
            std::string::npos);
}

TEST(Env, InitMethods) {
  EXPECT_EQ(fl::parse_init_method("env://").kind, fl::InitMethod::Kind::env);
  auto tcp = fl::parse_init_method("tcp://10.1.2.3:23456");
  EXPECT_EQ(tcp.kind, fl::InitMethod::Kind::tcp);
  EXPECT_EQ(tcp.host, "10.1.2.3");
  EXPECT_EQ(tcp.port, 23456);
  EXPECT_EQ(fl::parse_init_method("tcp://[::1]:80").host, "::1");
  auto file = fl::parse_init_method("file:///tmp/x/store");
  EXPECT_EQ(file.kind, fl::InitMethod::Kind::file);
  EXPECT_EQ(file.path, "/tmp/x/store");
  for (const char* bad : {"tcp://host", "tcp://host:0", "file://relative", "nccl://", "tcp://:80"}) {
    EXPECT_THROW(fl::parse_init_method(bad), fl::ConfigError) << bad;
  }
}
