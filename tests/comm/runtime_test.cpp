// The distributed runtime on CPU with Gloo, ranks in separate processes: every collective and
// point-to-point call on 2 and 3 ranks, groups, the three init methods, rank0_first, DistribCtx,
// debug-mode mismatch errors, timeouts and dead peers, and launches by torchrun and Open MPI variables.
#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/p2p.h>
#include <fastlearn/comm/pending_works.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>
#include <fastlearn/distributed/distrib_ctx.h>
#include <fastlearn/distributed/grad_reducer.h>

#include <fmt/format.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "support/message_of.h"
#include "support/multiprocess.h"

namespace fl = fastlearn;
namespace flt = fastlearn::testing;
namespace fs = std::filesystem;
using flt::RankContext;
using Clock = std::chrono::steady_clock;

namespace {

constexpr auto kTimeout = std::chrono::seconds(20);

flt::MultiProcessOptions torchrun(int world) { return {.env = flt::torchrun_env(world)}; }

// Sets up from the torchrun variables the runner gives each rank; torn down at scope exit.
struct Distributed {
  explicit Distributed(fl::SetupOptions options = {}) {
    if (options.timeout == std::chrono::minutes(30)) options.timeout = kTimeout;
    fl::setup_distrib(options);
  }
  ~Distributed() { fl::teardown_distrib(); }
};

class Runtime : public ::testing::TestWithParam<int> {};

using fastlearn::testing::message_of;

}  // namespace

TEST_P(Runtime, AllReduceEveryOpIncludingAnExactAverage) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank(), w = fl::world_size();
        EXPECT_EQ(fl::world_group().kind(), fl::BackendKind::gloo);
        auto values = [&] { return torch::tensor({1.0 + r, 2.0 * (r + 1), -1.0 * r}, torch::kFloat64); };
        auto t = values();
        fl::all_reduce(t);
        EXPECT_DOUBLE_EQ(t[0].item<double>(), w + w * (w - 1) / 2.0);
        t = values();
        fl::all_reduce(t, fl::ReduceOp::product);
        double product = 1;
        for (int k = 0; k < w; ++k) product *= 1.0 + k;
        EXPECT_DOUBLE_EQ(t[0].item<double>(), product);
        t = values();
        fl::all_reduce(t, fl::ReduceOp::min);
        EXPECT_DOUBLE_EQ(t[2].item<double>(), -(w - 1.0));
        t = values();
        fl::all_reduce(t, fl::ReduceOp::max);
        EXPECT_DOUBLE_EQ(t[1].item<double>(), 2.0 * w);
        // avg over 3 ranks of 1, 2, 3: exactly 2 (sum then one division), also for a float tensor.
        auto f = torch::full({5}, 1.0f + static_cast<float>(r));
        fl::all_reduce(f, fl::ReduceOp::avg);
        EXPECT_TRUE(torch::equal(f, torch::full({5}, (w + 1) / 2.0f))) << f;
        auto ints = torch::full({2}, r, torch::kLong);
        EXPECT_NE(message_of([&] { fl::all_reduce(ints, fl::ReduceOp::avg); }).find("integer tensor"),
                  std::string::npos);
        // Non-contiguous tensors work too.
        auto wide = torch::arange(12, torch::kFloat32).reshape({3, 4}).t() * (r + 1);
        fl::all_reduce(wide);
        EXPECT_TRUE(torch::equal(wide, torch::arange(12, torch::kFloat32).reshape({3, 4}).t() * (w * (w + 1) / 2)));
      },
      torchrun(n));
}

TEST_P(Runtime, BroadcastReduceScatterGatherAllGather) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank(), w = fl::world_size();
        for (int root = 0; root < w; ++root) {
          auto t = r == root ? torch::arange(6, torch::kFloat32) + root : torch::zeros({6});
          fl::broadcast(t, root);
          EXPECT_TRUE(torch::equal(t, torch::arange(6, torch::kFloat32) + root));

          auto red = torch::full({3}, static_cast<double>(r + 1), torch::kFloat64);
          fl::reduce(red, root);
          if (r == root) {
            EXPECT_DOUBLE_EQ(red[0].item<double>(), w * (w + 1) / 2.0);
          }

          std::vector<at::Tensor> pieces;
          if (r == root) {
            for (int k = 0; k < w; ++k) pieces.push_back(torch::full({2, 2}, 10 * root + k, torch::kInt32));
          }
          auto mine = torch::zeros({2, 2}, torch::kInt32);
          fl::scatter(mine, pieces, root);
          EXPECT_TRUE(torch::equal(mine, torch::full({2, 2}, 10 * root + r, torch::kInt32)));

          std::vector<at::Tensor> gathered;
          if (r == root) {
            for (int k = 0; k < w; ++k) gathered.push_back(torch::zeros({2}, torch::kLong));
          }
          fl::gather(torch::full({2}, 100 + r, torch::kLong), gathered, root);
          for (int k = 0; r == root && k < w; ++k) EXPECT_EQ(gathered[k][1].item<std::int64_t>(), 100 + k);
        }
        std::vector<at::Tensor> all;
        for (int k = 0; k < w; ++k) all.push_back(torch::empty({3}));
        fl::all_gather(all, torch::full({3}, static_cast<float>(r * r)));
        for (int k = 0; k < w; ++k) EXPECT_EQ(all[k][0].item<float>(), static_cast<float>(k * k));
        EXPECT_NE(message_of([&] { fl::all_gather({torch::empty({3})}, torch::zeros({3})); }).find("1 tensors given"),
                  std::string::npos);
        // The flat collectives of sharded training: part r of the sum (or the exact average) to rank r, and every
        // rank's part end to end.
        auto parts = torch::arange(4 * w, torch::kFloat32).reshape({w, 4}) * (r + 1);
        auto part = torch::empty({2, 2});
        fl::reduce_scatter(part, parts);
        const float ranks_sum = static_cast<float>(w * (w + 1)) / 2.0F;
        EXPECT_TRUE(torch::equal(part.view({-1}), torch::arange(4 * r, 4 * r + 4, torch::kFloat32) * ranks_sum));
        fl::reduce_scatter(part, parts, fl::ReduceOp::avg);
        EXPECT_TRUE(torch::allclose(part.view({-1}), torch::arange(4 * r, 4 * r + 4, torch::kFloat32) * ranks_sum / w));
        auto whole = torch::empty({w, 3}, torch::kInt64);
        fl::all_gather_into(whole, torch::full({3}, 7 * r, torch::kInt64));
        for (int k = 0; k < w; ++k) EXPECT_EQ(whole[k][2].item<std::int64_t>(), 7 * k);
        EXPECT_NE(message_of([&] {
                    fl::reduce_scatter(torch::empty({3}), torch::empty({3 * w + 1}));
                  }).find("times the part's elements"),
                  std::string::npos);
      },
      torchrun(n));
}

TEST_P(Runtime, BarrierHoldsEveryRankUntilTheLastArrives) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [](const RankContext&) {
        Distributed dist;
        fl::barrier();
        const auto start = Clock::now();
        if (fl::rank() == fl::world_size() - 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
        fl::barrier();
        EXPECT_GE(Clock::now() - start, std::chrono::milliseconds(350)) << "rank " << fl::rank() << " left too early";
      },
      torchrun(n));
}

TEST_P(Runtime, PointToPointRingAndAnySource) {
  const int n = GetParam();
  flt::run_on_ranks(
      n,
      [](const RankContext&) {
        Distributed dist;
        const int r = fl::rank(), w = fl::world_size();
        // A ring: everyone sends to the right and receives from the left, asynchronously.
        auto out = torch::full({4}, static_cast<float>(r));
        auto in = torch::empty({4});
        auto sent = fl::isend(out, (r + 1) % w, 7);
        auto received = fl::irecv(in, (r + w - 1) % w, 7);
        received.wait();
        sent.wait();
        EXPECT_TRUE(received.is_completed());
        EXPECT_EQ(in[0].item<float>(), static_cast<float>((r + w - 1) % w));
        // Everyone sends to rank 0, which receives from any source and learns who sent what.
        if (r == 0) {
          std::set<int> senders;
          for (int k = 1; k < w; ++k) {
            auto t = torch::empty({1}, torch::kLong);
            const int from = fl::recv(t, std::nullopt, 3);
            EXPECT_EQ(t.item<std::int64_t>(), 1000 + from);
            senders.insert(from);
          }
          EXPECT_EQ(static_cast<int>(senders.size()), w - 1);
        } else {
          fl::send(torch::full({1}, 1000 + r, torch::kLong), 0, 3);
        }
      },
      torchrun(n));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Runtime, ::testing::Values(2, 3), [](const ::testing::TestParamInfo<int>& param) {
  return std::to_string(param.param) + "ranks";
});

TEST(RuntimeGroups, CollectivesWithinASubgroupUseGlobalRanks) {
  flt::run_on_ranks(
      3,
      [](const RankContext&) {
        Distributed dist;
        auto evens = fl::new_group({2, 0});
        auto odd = fl::new_group({1});
        const int r = fl::rank();
        EXPECT_EQ(evens->ranks(), (std::vector<int>{0, 2}));
        if (r == 1) {
          EXPECT_FALSE(evens->is_member());
          EXPECT_NE(message_of([&] {
                      fl::all_reduce(torch::ones({1}), fl::ReduceOp::sum, evens.get());
                    }).find("not a member of group"),
                    std::string::npos);
          auto t = torch::ones({1});
          fl::all_reduce(t, fl::ReduceOp::sum, odd.get());
          EXPECT_EQ(t.item<float>(), 1.0f);
        } else {
          auto t = torch::full({2}, static_cast<float>(r));
          fl::all_reduce(t, fl::ReduceOp::sum, evens.get());
          EXPECT_EQ(t[0].item<float>(), 2.0f);
          auto b = r == 2 ? torch::full({1}, 42.0f) : torch::zeros({1});
          fl::broadcast(b, 2, evens.get());  // global rank 2 is group rank 1
          EXPECT_EQ(b.item<float>(), 42.0f);
        }
        fl::barrier();
      },
      torchrun(3));
  EXPECT_THROW(fl::new_group({0}), fl::DistributedError) << "nothing set up in the test's own process";
}

TEST(RuntimeInit, TcpInitMethod) {
  const int port = flt::in_rank_process() ? 0 : flt::free_tcp_port();
  flt::run_on_ranks(2,
                    [](const RankContext& ctx) {
                      Distributed dist({.init_method = "tcp://127.0.0.1:" + std::string(std::getenv("TEST_PORT")),
                                        .env = {.rank = ctx.rank, .world_size = 2}});
                      auto t = torch::ones({1});
                      fl::all_reduce(t);
                      EXPECT_EQ(t.item<float>(), 2.0f);
                    },
                    {.env = [port](int) {
                      return std::map<std::string, std::string>{{"TEST_PORT", std::to_string(port)}};
                    }});
}

TEST(RuntimeInit, FileInitMethod) {
  const auto dir = fs::temp_directory_path() / ("fastlearn-filestore-" + std::to_string(flt::test_process_id()));
  if (!flt::in_rank_process()) fs::create_directories(dir);
  flt::run_on_ranks(2, [&dir](const RankContext& ctx) {
    Distributed dist({.init_method = "file://" + (dir / "store").string(), .env = {.rank = ctx.rank, .world_size = 2}});
    auto t = torch::full({1}, static_cast<float>(ctx.rank + 1));
    fl::all_reduce(t);
    EXPECT_EQ(t.item<float>(), 3.0f);
  });
  if (!flt::in_rank_process()) fs::remove_all(dir);
}

TEST(RuntimeInit, MasterPortInUseIsAClearError) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 1), 0);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  const int port = ntohs(addr.sin_port);
  const auto msg = message_of([&] {
    fl::setup_distrib({.timeout = std::chrono::seconds(2),
                       .env = {.rank = 0, .world_size = 2, .master_port = port, .master_addr = "127.0.0.1"}});
  });
  close(fd);
  EXPECT_NE(msg.find(fmt::format("cannot listen on 127.0.0.1:{}", port)), std::string::npos) << msg;
  EXPECT_NE(msg.find("Address already in use"), std::string::npos) << msg;
  EXPECT_FALSE(fl::is_initialized());
}

// A rank that waits for missing ranks, or for rank 0's store, says so while it waits, and still fails with the
// same error at the timeout.
TEST(RuntimeInit, ARankWaitingForMissingRanksSaysSoBeforeTheTimeout) {
  const int port = flt::free_tcp_port();
  testing::internal::CaptureStderr();
  const auto msg = message_of([&] {
    fl::setup_distrib({.timeout = std::chrono::milliseconds(2500),
                       .env = {.rank = 0, .world_size = 2, .master_port = port, .master_addr = "127.0.0.1"},
                       .waiting_notice_after = std::chrono::milliseconds(400)});
  });
  const auto said = testing::internal::GetCapturedStderr();
  EXPECT_NE(msg.find("only 1 of WORLD_SIZE=2 ranks joined"), std::string::npos) << msg;
  EXPECT_NE(said.find(fmt::format("rank 0 waits at the rendezvous 127.0.0.1:{}: 1 of WORLD_SIZE=2 ranks have joined "
                                  "after ",
                                  port)),
            std::string::npos)
      << said;
  EXPECT_NE(said.find("(the timeout is 2 s)"), std::string::npos) << said;
  // At 0.4 s, then 0.8 s later (1.2 s), then 1.6 s later (2.8 s: past the timeout): two notices, not one every
  // 0.4 s (a loaded machine may run late, never early).
  const auto notices = std::count(said.begin(), said.end(), '\n');
  EXPECT_GE(notices, 1) << said;
  EXPECT_LE(notices, 2) << said;
  EXPECT_FALSE(fl::is_initialized());
}

TEST(RuntimeInit, ARankWaitingForRankZerosStoreSaysSoBeforeTheTimeout) {
  const int port = flt::free_tcp_port();  // nobody listens there: rank 0 never started
  testing::internal::CaptureStderr();
  const auto msg = message_of([&] {
    fl::setup_distrib({.timeout = std::chrono::milliseconds(6000),
                       .env = {.rank = 1, .world_size = 2, .master_port = port, .master_addr = "127.0.0.1"},
                       .waiting_notice_after = std::chrono::milliseconds(400)});
  });
  const auto said = testing::internal::GetCapturedStderr();
  EXPECT_NE(msg.find("rendezvous with the store"), std::string::npos) << msg;
  // When: after the first connection attempt that runs past 0.4 s. The store's client retries on its own, with
  // delays of over a second whatever its timeout, hence the 6 s here.
  EXPECT_NE(said.find(fmt::format("rank 1 of 2 waits for the rendezvous store at 127.0.0.1:{}, which rank 0 serves: "
                                  "no answer after ",
                                  port)),
            std::string::npos)
      << said;
  // Off: no notice at all.
  testing::internal::CaptureStderr();
  message_of([&] {
    fl::setup_distrib({.timeout = std::chrono::milliseconds(1000),
                       .env = {.rank = 1, .world_size = 2, .master_port = port, .master_addr = "127.0.0.1"},
                       .waiting_notice_after = std::chrono::milliseconds(0)});
  });
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("waits for"), std::string::npos);
}

// `setups` setups of 2 ranks in a row, each checked by an all-reduce that only its own ranks can complete;
// `rank0_lingers`: rank 0 waits before every second teardown, so the other rank sets up again first.
void setups_back_to_back(int setups, bool rank0_lingers) {
  for (int it = 0; it < setups; ++it) {
    fl::setup_distrib({.timeout = std::chrono::seconds(20)});
    auto t = torch::full({1}, static_cast<float>(10 * it + fl::rank()));
    fl::all_reduce(t);
    ASSERT_EQ(t.item<float>(), static_cast<float>(20 * it + 1)) << "setup " << it << " met a rank of another setup";
    if (rank0_lingers && fl::rank() == 0 && it % 2 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(30));
    fl::teardown_distrib();
  }
}

// Setups back to back on one MASTER_PORT: a rank that is quicker to set up again can reach the previous
// setup's store while rank 0 still serves it. The run key makes it wait for its own run's store instead of
// joining the old one. Rank 0 lingers before some teardowns to provoke exactly that.
TEST(RuntimeInit, FiftyBackToBackSetupsOnOnePortNeverCrossRuns) {
  flt::run_on_ranks(2, [](const RankContext&) { setups_back_to_back(50, /*rank0_lingers=*/true); },
                    {.timeout = std::chrono::seconds(120), .env = flt::torchrun_env(2)});
}

// Under an agent's store (torchrun's, or fastlearn launch's when it picks the port) every rank is a client and the
// store lives on between setups: each setup of a process gets keys of its own, or the second group would read the
// first one's addresses.
TEST(RuntimeInit, BackToBackSetupsUnderAnAgentStoreNeverCrossSetups) {
  c10::intrusive_ptr<c10d::TCPStore> agent;  // served by the test's parent process, as an agent does
  if (!flt::in_rank_process()) {
    c10d::TCPStoreOptions options;
    options.port = 0;
    options.isServer = true;
    options.waitWorkers = false;
    agent = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", options);
  }
  const int port = agent ? agent->getPort() : 0;
  flt::run_on_ranks(2, [](const RankContext&) { setups_back_to_back(5, /*rank0_lingers=*/false); },
                    {.timeout = std::chrono::seconds(60), .env = [port](int rank) {
                       return std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                                 {"WORLD_SIZE", "2"},
                                                                 {"MASTER_ADDR", "127.0.0.1"},
                                                                 {"MASTER_PORT", std::to_string(port)},
                                                                 {"TORCHELASTIC_USE_AGENT_STORE", "True"},
                                                                 {"TORCHELASTIC_RESTART_COUNT", "0"}};
                     }});
}

// A rank launched for another run that reaches this run's store is refused with a message, never joined.
TEST(RuntimeInit, ARankOfAnotherRunIsRefusedByName) {
  const int port = flt::in_rank_process() ? 0 : flt::free_tcp_port();
  flt::run_on_ranks(
      2,
      [](const RankContext& ctx) {
        const auto msg = message_of([] { fl::setup_distrib({.timeout = std::chrono::seconds(3)}); });
        if (ctx.rank == 1) {
          EXPECT_NE(msg.find("serves another run ('job-a.0#0') and not this rank's ('job-b.0#0')"), std::string::npos)
              << msg;
        } else {
          EXPECT_NE(msg, "no error") << "rank 0 waited for a rank 1 of its own run";
        }
        if (fl::is_initialized()) fl::teardown_distrib();
      },
      {.timeout = std::chrono::seconds(60), .env = [port](int rank) {
         return std::map<std::string, std::string>{{"RANK", std::to_string(rank)},
                                                   {"WORLD_SIZE", "2"},
                                                   {"MASTER_ADDR", "127.0.0.1"},
                                                   {"MASTER_PORT", std::to_string(port)},
                                                   {"FASTLEARN_RUN_ID", rank == 0 ? "job-a.0" : "job-b.0"}};
       }});
}

TEST(RuntimeSingleProcess, CollectivesAreNoOpsAndQueriesWork) {
  ASSERT_FALSE(fl::is_initialized());
  EXPECT_EQ(fl::rank(), 0);
  EXPECT_EQ(fl::world_size(), 1);
  EXPECT_TRUE(fl::is_main());
  auto t = torch::ones({2});
  fl::all_reduce(t, fl::ReduceOp::avg);
  fl::broadcast(t, 0);
  fl::barrier();
  EXPECT_TRUE(torch::equal(t, torch::ones({2})));
  std::vector<at::Tensor> out{torch::zeros({2})};
  fl::all_gather(out, t);
  EXPECT_TRUE(torch::equal(out[0], t));
  EXPECT_EQ(fl::rank0_first([] { return 5; }), 5);
  {
    fl::DistribCtx ctx;
    EXPECT_FALSE(ctx.active());
    EXPECT_FALSE(fl::is_initialized());
  }
  EXPECT_THROW(fl::send(t, 0), fl::DistributedError);
}

TEST(RuntimeRank0First, RankZerosSideEffectIsVisibleBeforeTheOthersRun) {
  const auto file = fs::temp_directory_path() / ("fastlearn-r0f-" + std::to_string(flt::test_process_id()));
  flt::run_on_ranks(3,
                    [&file](const RankContext&) {
                      // No setup: rank0_first sets the group up from the environment, and a DistribCtx adopts it.
                      const auto seen = fl::rank0_first([&] {
                        if (fl::rank() == 0) {
                          std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the others must wait for this
                          std::ofstream(file) << "downloaded";
                          return std::string("wrote");
                        }
                        std::ifstream in(file);
                        std::string text;
                        in >> text;
                        return text;
                      });
                      EXPECT_EQ(seen, fl::rank() == 0 ? "wrote" : "downloaded");
                      EXPECT_TRUE(fl::is_initialized());
                      {
                        fl::DistribCtx ctx;
                        EXPECT_TRUE(ctx.owns_setup()) << "the implicit setup is adopted";
                        // A failure on rank 0 reaches the others as an error instead of a hang.
                        const auto msg = message_of([] {
                          fl::rank0_first([] {
                            if (fl::rank() == 0) throw std::runtime_error("mirror unreachable");
                          });
                        });
                        if (fl::rank() == 0) {
                          EXPECT_EQ(msg, "mirror unreachable");
                        } else {
                          EXPECT_NE(msg.find("rank 0 failed in rank0_first"), std::string::npos) << msg;
                          EXPECT_NE(msg.find("mirror unreachable"), std::string::npos) << msg;
                        }
                      }
                      EXPECT_FALSE(fl::is_initialized());
                    },
                    {.env = flt::torchrun_env(3)});
  if (!flt::in_rank_process()) fs::remove(file);
}

TEST(RuntimeDistribCtx, TearsDownWhatItCreatedAlsoOnException) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        try {
          fl::DistribCtx ctx({.timeout = kTimeout});
          EXPECT_TRUE(ctx.active());
          EXPECT_TRUE(fl::is_initialized());
          throw std::runtime_error("training failed");
        } catch (const std::runtime_error&) {}
        EXPECT_FALSE(fl::is_initialized());
        // A group set up before the scope is left alone. (A second job on another port: right after a teardown,
        // rank 1 could otherwise reach rank 0's old store before rank 0 has closed it.)
        fl::setup_distrib({.timeout = kTimeout, .env = {.master_port = std::atoi(std::getenv("SECOND_PORT"))}});
        {
          fl::DistribCtx ctx;
          EXPECT_FALSE(ctx.owns_setup());
        }
        EXPECT_TRUE(fl::is_initialized());
        fl::teardown_distrib();
      },
      {.env = [env = flt::torchrun_env(2), port = std::make_shared<int>(0)](int rank) {
        auto vars = env(rank);
        if (*port == 0) *port = flt::free_tcp_port();
        vars["SECOND_PORT"] = std::to_string(*port);
        return vars;
      }});
}

TEST(RuntimeDebug, MismatchedCallsNameEachRanksCall) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist({.debug = true});
        auto t = torch::zeros({fl::rank() == 0 ? 4 : 5});
        const auto msg = message_of([&] { fl::all_reduce(t); });
        EXPECT_NE(msg.find("mismatched collective calls"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 0: call #0 all_reduce(sum) of Float [4]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 1: call #0 all_reduce(sum) of Float [5]"), std::string::npos) << msg;
        // Different operations are named too.
        const auto other = message_of([&] {
          if (fl::rank() == 0) {
            fl::broadcast(torch::zeros({2}), 0);
          } else {
            fl::all_reduce(torch::zeros({2}));
          }
        });
        EXPECT_NE(other.find("broadcast"), std::string::npos) << other;
        EXPECT_NE(other.find("all_reduce"), std::string::npos) << other;
      },
      torchrun(2));
}

// The GradReducer's bucket all-reduces go through the same check: ranks whose models differ are named.
TEST(RuntimeDebug, TheReducersAllReducesAreCheckedToo) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist({.debug = true});
        torch::manual_seed(0);
        torch::nn::Linear layer(8, fl::rank() == 0 ? 3 : 5);  // rank 1's model is not rank 0's
        std::vector<std::pair<std::string, at::Tensor>> params;
        for (const auto& p : layer->named_parameters()) params.emplace_back(p.key(), p.value());
        const auto msg = message_of([&] {
          fl::GradReducer reducer(params, {}, fl::world_group(), {.rebuild_buckets = false});
          layer->forward(torch::randn({2, 8})).sum().backward();
          reducer.finalize_if_pending();
        });
        EXPECT_NE(msg.find("mismatched collective calls"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 0: call #"), std::string::npos) << msg;
        EXPECT_NE(msg.find("rank 1: call #"), std::string::npos) << msg;
      },
      torchrun(2));
}

// Point-to-point: a send whose tensor the receive does not expect is named with both ranks (debug mode).
TEST(RuntimeDebug, MismatchedSendAndRecvNameBothRanks) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist({.debug = true});
        if (fl::rank() == 0) {
          auto mismatched = fl::isend(torch::ones({4}), 1, 7);
          fl::send(torch::ones({3}), 1, 8);  // matches: the checks do not get in the way of correct calls
          fl::send(torch::ones({2}), 1, 9);
          mismatched.wait();  // rank 1 drains it below
        } else {
          const auto msg = message_of([] { fl::recv(torch::zeros({4}, torch::kLong), 0, 7); });
          EXPECT_NE(msg.find("rank 0 sends Float [4] (tag 7) but rank 1 receives into Long [4]"), std::string::npos)
              << msg;
          std::vector<at::Tensor> drain{torch::zeros({4})};  // the refused message was never received: take it now
          fl::world_group().backend().recv(drain, 0, 7)->wait();
          auto ok = torch::zeros({3});
          EXPECT_EQ(fl::recv(ok, std::nullopt, 8), 0) << "from any rank, the sender is known after the check";
          EXPECT_TRUE(torch::equal(ok, torch::ones({3})));
          auto req = fl::irecv(torch::zeros({2}), 0, 9);
          req.wait();
        }
      },
      torchrun(2));
}

TEST(RuntimeFaults, AHungRankMakesTheOthersFailWithinTheTimeoutNamingTheOperation) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist({.timeout = std::chrono::seconds(2)});
        if (fl::rank() == 1) {
          std::this_thread::sleep_for(std::chrono::seconds(5));  // never joins the collective
          return;
        }
        const auto start = Clock::now();
        const auto msg = message_of([] { fl::all_reduce(torch::ones({8})); });
        const auto waited = Clock::now() - start;
        EXPECT_NE(msg.find("all_reduce(sum) of Float [8]"), std::string::npos) << msg;
        EXPECT_NE(msg.find("timeout is 2000 ms"), std::string::npos) << msg;
        EXPECT_LT(waited, std::chrono::seconds(4));
      },
      torchrun(2));
}

TEST(RuntimeFaults, ADeadPeerIsReportedWithoutWaitingForTheTimeout) {
  flt::run_on_ranks(
      2,
      [](const RankContext&) {
        Distributed dist({.timeout = std::chrono::seconds(30)});
        fl::barrier();
        if (fl::rank() == 1) std::_Exit(0);  // dies without a word
        const auto start = Clock::now();
        const auto msg = message_of([] { fl::all_reduce(torch::ones({8})); });
        EXPECT_NE(msg.find("all_reduce(sum) of Float [8]"), std::string::npos) << msg;
        EXPECT_LT(Clock::now() - start, std::chrono::seconds(10)) << "detected long before the 30 s timeout";
      },
      torchrun(2));
}

TEST(RuntimeLaunch, OpenMpiStyleVariables) {
  const int port = flt::in_rank_process() ? 0 : flt::free_tcp_port();
  flt::run_on_ranks(2,
                    [](const RankContext&) {
                      Distributed dist;
                      EXPECT_EQ(fl::dist_env().source, "Open MPI");
                      auto t = torch::full({1}, static_cast<float>(fl::rank() + 1));
                      fl::all_reduce(t);
                      EXPECT_EQ(t.item<float>(), 3.0f);
                    },
                    {.env = [port](int rank) {
                      return std::map<std::string, std::string>{{"OMPI_COMM_WORLD_RANK", std::to_string(rank)},
                                                                {"OMPI_COMM_WORLD_SIZE", "2"},
                                                                {"OMPI_COMM_WORLD_LOCAL_RANK", std::to_string(rank)},
                                                                {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                                                                {"MASTER_PORT", std::to_string(port)}};
                    }});
}

// Started by torchrun itself (python -m torch.distributed.run --no-python): this same binary is each rank.
TEST(RuntimeLaunch, UnderTorchrun) {
  if (std::getenv("FASTLEARN_UNDER_TORCHRUN")) {
    ASSERT_NE(std::getenv("TORCHELASTIC_RUN_ID"), nullptr) << "expected torchrun's environment";
    Distributed dist;
    EXPECT_EQ(fl::dist_env().source, "torchrun");
    auto t = torch::full({2}, static_cast<float>(fl::rank() + 1));
    fl::all_reduce(t);
    EXPECT_EQ(t[1].item<float>(), 3.0f);
    return;
  }
  const std::string python = FASTLEARN_PYTHON;
  if (python.empty() || std::system((python + " -c 'import torch.distributed.run' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "no Python torch to provide torchrun";
  }
  const auto self = fs::read_symlink("/proc/self/exe");
  const auto command = fmt::format(
      "FASTLEARN_UNDER_TORCHRUN=1 {} -m torch.distributed.run --no-python --nproc-per-node 2 --master-port {} "
      "{} --gtest_filter=RuntimeLaunch.UnderTorchrun > {}.log 2>&1",
      python, flt::free_tcp_port(), self.string(), (fs::temp_directory_path() / "fastlearn-torchrun").string());
  const int rc = std::system(command.c_str());
  std::ifstream log(fs::temp_directory_path() / "fastlearn-torchrun.log");
  std::string text((std::istreambuf_iterator<char>(log)), {});
  EXPECT_EQ(rc, 0) << text;
  EXPECT_NE(text.find("[  PASSED  ] 1 test"), std::string::npos) << text;
}

// ---- how collectives wait (comm/pending_works.h), without a GPU ---------------------------------------

namespace {

// A Work whose state the test sets: as NCCL work is, complete or not, with or without an exception.
class FakeWork : public c10d::Work {
 public:
  bool isCompleted() override { return completed; }
  std::exception_ptr exception() const override { return failure; }
  bool completed = false;
  std::exception_ptr failure;
};

c10::intrusive_ptr<FakeWork> fake_work() { return c10::make_intrusive<FakeWork>(); }

}  // namespace

TEST(RuntimeWaits, NcclWorkIsLeftToTheStreamAndEveryOtherWaitBlocksTheHost) {
  EXPECT_EQ(fl::wait_mode(fl::BackendKind::nccl), fl::WaitMode::stream);
  EXPECT_EQ(fl::wait_mode(fl::BackendKind::gloo), fl::WaitMode::host);
  EXPECT_EQ(fl::wait_mode(fl::BackendKind::nccl, /*barrier=*/true), fl::WaitMode::host) << "a barrier makes hosts meet";
  EXPECT_EQ(fl::wait_mode(fl::BackendKind::gloo, /*barrier=*/true), fl::WaitMode::host);
}

TEST(RuntimeWaits, PendingWorkFailsByItsExceptionTheBackendsErrorOrTheTimeoutAndIsForgottenWhenDone) {
  using namespace std::chrono_literals;
  const auto t0 = fl::PendingWorks::Clock::now();
  fl::PendingWorks pending;
  auto done = fake_work(), running = fake_work(), failed = fake_work();
  done->completed = true;
  pending.add(done, "all_reduce(sum) of Float [4]", 7, t0);
  pending.add(running, "broadcast of Float [2] from rank 0", 8, t0);
  EXPECT_FALSE(pending.check(1000ms, t0 + 10ms)) << "nothing failed, nothing is late";
  EXPECT_EQ(pending.size(), 1u) << "the finished work is forgotten, the running one kept";

  // Late: named with how long it has been running.
  const auto late = pending.check(1000ms, t0 + 1500ms);
  ASSERT_TRUE(late);
  EXPECT_EQ(late->what, "broadcast of Float [2] from rank 0");
  EXPECT_EQ(late->call, 8);
  EXPECT_NE(late->reason.find("not done after 1500 ms (the timeout is 1000 ms)"), std::string::npos) << late->reason;

  // The backend's error (NCCL's watchdog aborted the communicator) fails the oldest work remembered, also once the
  // abort made it look complete (the watchdog marks only its own copy of the work).
  running->completed = true;
  const auto aborted = pending.check(1000ms, t0 + 20ms, "the communicator was aborted");
  ASSERT_TRUE(aborted);
  EXPECT_EQ(aborted->what, "broadcast of Float [2] from rank 0");
  EXPECT_EQ(aborted->reason, "the communicator was aborted");
  fl::PendingWorks none;
  const auto group_error = none.check(1000ms, t0, "the communicator was aborted");
  ASSERT_TRUE(group_error) << "with nothing remembered the group's error still shows";
  EXPECT_EQ(group_error->what, "a collective of this group");

  // The work's own exception, also once it counts as complete.
  failed->completed = true;
  failed->failure = std::make_exception_ptr(std::runtime_error("NCCL error: remote process exited"));
  pending.add(failed, "gradient all_reduce of bucket 0 of 1 (3 parameters, 48 bytes)", 9, t0);
  const auto error = pending.check(1000ms, t0 + 20ms);
  ASSERT_TRUE(error);
  EXPECT_EQ(error->call, 9);
  EXPECT_EQ(error->reason, "NCCL error: remote process exited");

  pending.clear();
  EXPECT_EQ(pending.size(), 0u);
  EXPECT_FALSE(pending.check(1000ms, t0 + 1h));
}

TEST(RuntimeWaits, AutoBackendIsNcclOnlyWhenEveryLocalRankHasAGpu) {
  EXPECT_EQ(fl::auto_backend(1, 0), fl::BackendKind::gloo) << "no GPU";
  EXPECT_EQ(fl::auto_backend(2, 0), fl::BackendKind::gloo);
  EXPECT_EQ(fl::auto_backend(1, 1), fl::BackendKind::nccl);
  EXPECT_EQ(fl::auto_backend(2, 1), fl::BackendKind::gloo) << "two ranks, one GPU: make demo on a one-GPU machine";
  EXPECT_EQ(fl::auto_backend(8, 8), fl::BackendKind::nccl);
  EXPECT_EQ(fl::auto_backend(4, 8), fl::BackendKind::nccl);
  EXPECT_EQ(fl::auto_backend(9, 8), fl::BackendKind::gloo);
}
