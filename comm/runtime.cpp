#include <fastlearn/comm/runtime.h>

#include <fastlearn/comm/detail/rendezvous.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/detail/warning.h>
#include <fastlearn/core/error.h>

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <netdb.h>
#include <sys/socket.h>
#include <torch/cuda.h>
#include <unistd.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#ifdef FASTLEARN_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <numeric>
#include <thread>

namespace fastlearn {

namespace {

struct State {
  DistEnv env;
  c10::intrusive_ptr<c10d::Store> store;
  GroupPtr world;
  std::vector<std::weak_ptr<Group>> groups;  // made by new_group, closed at teardown if still alive
  SetupOptions options;
  BackendKind kind = BackendKind::gloo;
  bool debug = false;
  bool implicit = false;  // set up by rank0_first, to be adopted by a DistribCtx
  int groups_made = 0;
  std::int64_t rank0_first_calls = 0;
};

std::recursive_mutex state_mutex;
std::unique_ptr<State> state;

State& current() {
  if (!state) {
    throw DistributedError("no process group is set up: call setup_distrib() (or use a DistribCtx) first");
  }
  return *state;
}

bool env_shared_memory() {
  const char* value = std::getenv("FASTLEARN_SHARED_MEMORY");
  return !value || std::string_view(value) != "0";
}

bool env_debug() {
  const char* ours = std::getenv("FASTLEARN_DISTRIBUTED_DEBUG");
  const char* torch_var = std::getenv("TORCH_DISTRIBUTED_DEBUG");
  return (ours && std::string(ours) == "1") || (torch_var && std::string(torch_var) == "DETAIL");
}

// The local address Gloo should bind to: loopback for a job on loopback, otherwise the address of the
// interface that routes to the master (found by "connecting" a UDP socket, which sends nothing).
std::string transport_address(const std::string& master_addr) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(master_addr.c_str(), "9", &hints, &found) != 0 || !found) return "127.0.0.1";
  std::string address = "127.0.0.1";
  const int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd >= 0 && connect(fd, found->ai_addr, found->ai_addrlen) == 0) {
    sockaddr_in local{};
    socklen_t len = sizeof local;
    char text[INET_ADDRSTRLEN] = {};
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&local), &len) == 0 &&
        inet_ntop(AF_INET, &local.sin_addr, text, sizeof text)) {
      address = text;
    }
  }
  if (fd >= 0) close(fd);
  freeaddrinfo(found);
  return address;
}

// The backend the options or FASTLEARN_BACKEND name; nothing when "auto" is left to decide.
std::optional<BackendKind> named_backend(const SetupOptions& options) {
  if (options.backend) return *options.backend;
  if (const char* forced = std::getenv("FASTLEARN_BACKEND"); forced && *forced) {
    try {
      return parse_backend_kind(forced);
    } catch (const ConfigError& e) {
      throw DistributedError(std::string("FASTLEARN_BACKEND: ") + error_text(e));
    }
  }
  return std::nullopt;
}

int visible_gpus() { return torch::cuda::is_available() ? static_cast<int>(torch::cuda::device_count()) : 0; }

// Checks that the local rank has a GPU of its own, for NCCL; `what` names the group.
void check_local_gpu(const DistEnv& env, const std::string& what) {
  const int gpus = visible_gpus();
  if (env.local_rank >= gpus) {
    throw DistributedError(
        fmt::format("rank {}: {} needs a GPU for every rank, and local rank {} has none: this host has {} GPU(s) and "
                    "{} local rank(s). Start at most {} rank(s) per host, or use the gloo backend",
                    env.rank, what, env.local_rank, gpus, env.local_world_size, gpus));
  }
}

void bind_local_gpu([[maybe_unused]] const DistEnv& env) {
#ifdef FASTLEARN_WITH_CUDA
  check_local_gpu(env, "the nccl backend");
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
#endif
}

// Backend "auto" over the whole job: NCCL only when every host's ranks each have a GPU, so that hosts that decide
// alone cannot pick different backends. Each rank that cannot use NCCL says so in the store before it counts itself
// in at the rendezvous (wait_for_every_rank), so that once every rank has joined, the count is final.
constexpr const char* kCannotUseNccl = "fastlearn/auto_backend/cannot_use_nccl";

void announce_auto_backend(c10d::Store& store, BackendKind local_choice) {
  if (local_choice != BackendKind::nccl) store.add(kCannotUseNccl, 1);
}

BackendKind agreed_auto_backend(c10d::Store& store, const DistEnv& env, BackendKind local_choice) {
  if (local_choice != BackendKind::nccl) return local_choice;
  if (store.add(kCannotUseNccl, 0) == 0) return BackendKind::nccl;
  warn(
      fmt::format("backend \"auto\": some host of this job has fewer GPUs than ranks, so every rank uses Gloo (this "
                  "host has {} GPU(s) for its {} rank(s); a learner on a GPU stays there, and Gloo moves its tensors "
                  "through the host)",
                  visible_gpus(), env.local_world_size));
  return BackendKind::gloo;
}

// Every rank checks in at the store before the backend connects them, so that a WORLD_SIZE larger than the
// ranks started is named as such (the backend's own wait would only say that some key never came), and says
// while it waits how many have come: a rank started with a stale WORLD_SIZE or RANK otherwise waits in
// silence until the timeout, 30 minutes by default.
void wait_for_every_rank(c10d::Store& store, const DistEnv& env, std::chrono::milliseconds timeout,
                         std::chrono::milliseconds notice_after) {
  const std::string key = "fastlearn/joined";
  std::int64_t joined = 0;
  try {
    joined = store.add(key, 1);
    const auto until = std::chrono::steady_clock::now() + timeout;
    WaitingNotices notices(notice_after);
    while (joined < env.world_size && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      joined = store.add(key, 0);
      if (joined < env.world_size && notices.due()) {
        std::cerr << fmt::format(
                         "fastlearn: rank {} waits at the rendezvous {}:{}: {} of WORLD_SIZE={} ranks have joined "
                         "after {} s (the timeout is {} s). Start the missing ranks with the same MASTER_ADDR and "
                         "MASTER_PORT, or set WORLD_SIZE to the number you start\n",
                         env.rank, env.master_addr, env.master_port, joined, env.world_size, notices.seconds_waited(),
                         std::chrono::duration_cast<std::chrono::seconds>(timeout).count())
                  << std::flush;
      }
    }
  } catch (const std::exception& e) {
    // Rank 0 serves the store: it gave up waiting (or died) before every rank of WORLD_SIZE came.
    throw DistributedError(
        fmt::format("rank {}: the rendezvous store at {}:{} went away while waiting for WORLD_SIZE={} ranks ({} had "
                    "joined): rank 0 "
                    "gave up or died; start WORLD_SIZE ranks, or set WORLD_SIZE to the number you start ({})",
                    env.rank, env.master_addr, env.master_port, env.world_size, joined, error_text(e)));
  }
  if (joined < env.world_size) {
    throw DistributedError(fmt::format(
        "rank {}: only {} of WORLD_SIZE={} ranks joined the rendezvous at {}:{} within {} ms; start WORLD_SIZE ranks "
        "(every one with the same MASTER_ADDR and MASTER_PORT), or set WORLD_SIZE to the number you start",
        env.rank, joined, env.world_size, env.master_addr, env.master_port, timeout.count()));
  }
}

// The options of a `kind` backend (the world's, or a group's of another kind): NCCL on the local rank's GPU.
BackendOptions backend_options(const State& s, BackendKind kind) {
  BackendOptions options;
  options.timeout = s.options.timeout;
  options.hostname = transport_address(s.env.master_addr);
  options.gloo_threads = s.options.gloo_threads;
  options.shared_memory = kind == BackendKind::gloo && s.env.local_world_size == s.env.world_size &&
                          s.options.shared_memory.value_or(env_shared_memory());
  if (kind == BackendKind::nccl) options.cuda_device = s.env.local_rank;
  return options;
}

}  // namespace

void setup_distrib(const SetupOptions& options) {
  std::lock_guard lock(state_mutex);
  if (state) {
    throw DistributedError(
        fmt::format("setup_distrib: a process group is already set up (rank {} of {}); call "
                    "teardown_distrib() first",
                    state->env.rank, state->env.world_size));
  }
  auto s = std::make_unique<State>();
  s->options = options;
  s->env = resolve_env(options.env);
  const auto named = named_backend(options);
  s->kind = named ? *named : auto_backend(s->env.local_world_size, visible_gpus());
  if (!backend_compiled_in(s->kind)) {
    if (named)
      throw DistributedError(fmt::format("the {} backend is not compiled into this build", to_string(s->kind)));
    s->kind = BackendKind::gloo;  // a build without NCCL on a GPU machine: "auto" is Gloo
  }
  if (s->kind == BackendKind::nccl && !torch::cuda::is_available()) {
    throw DistributedError(
        fmt::format("rank {}: the nccl backend needs a CUDA GPU and none is visible{}; use the gloo "
                    "backend (or leave the backend unset: NCCL is picked only when there is a GPU)",
                    s->env.rank, options.backend ? "" : " (FASTLEARN_BACKEND=nccl)"));
  }
  if (named && s->kind == BackendKind::nccl) check_local_gpu(s->env, "the nccl backend");
  if (!named && s->kind == BackendKind::gloo && visible_gpus() > 0 && s->env.world_size > 1) {
    warn(
        fmt::format("backend \"auto\": {} rank(s) on this host and {} GPU(s), so the ranks train on the CPU over "
                    "Gloo (NCCL needs a GPU for every rank); start at most {} rank(s) per host to train on the GPUs",
                    s->env.local_world_size, visible_gpus(), visible_gpus()));
  }
  s->debug = options.debug.value_or(env_debug());
  s->store = rendezvous(s->env, parse_init_method(options.init_method), options.timeout, options.waiting_notice_after);
  if (!named) announce_auto_backend(*s->store, s->kind);
  wait_for_every_rank(*s->store, s->env, options.timeout, options.waiting_notice_after);
  if (!named) s->kind = agreed_auto_backend(*s->store, s->env, s->kind);
  if (s->kind == BackendKind::nccl) bind_local_gpu(s->env);
  auto world_store = c10::make_intrusive<c10d::PrefixStore>("world/", s->store);
  auto backend = make_backend(s->kind, world_store, s->env.rank, s->env.world_size, backend_options(*s, s->kind));
  std::vector<int> ranks(static_cast<std::size_t>(s->env.world_size));
  std::iota(ranks.begin(), ranks.end(), 0);
  s->world =
      std::make_shared<Group>("world", std::move(ranks), s->env.rank, std::move(backend), s->kind, options.timeout);
  state = std::move(s);
}

namespace {

void end_distrib(bool abort) {
  std::lock_guard lock(state_mutex);
  if (!state) return;
  for (auto& weak : state->groups) {
    if (auto group = weak.lock()) group->close(abort);
  }
  state->world->close(abort);
  state.reset();
}

}  // namespace

void teardown_distrib() { end_distrib(false); }
void abort_distrib() { end_distrib(true); }

bool is_initialized() {
  std::lock_guard lock(state_mutex);
  return state != nullptr;
}

DistEnv dist_env() {
  std::lock_guard lock(state_mutex);
  return state ? state->env : resolve_env();
}

int rank() { return dist_env().rank; }
int world_size() { return dist_env().world_size; }
int local_rank() { return dist_env().local_rank; }
int local_world_size() { return dist_env().local_world_size; }
bool is_main() { return rank() == 0; }

Group& world_group() {
  std::lock_guard lock(state_mutex);
  return *current().world;
}

c10d::Store& dist_store() {
  std::lock_guard lock(state_mutex);
  return *current().store;
}

bool debug_checks_enabled() {
  std::lock_guard lock(state_mutex);
  return state && state->debug;
}

c10::Device distrib_device() {
  std::lock_guard lock(state_mutex);
  if (state && state->kind == BackendKind::nccl) {
    return {c10::kCUDA, static_cast<c10::DeviceIndex>(state->env.local_rank)};
  }
  return c10::Device(c10::kCPU);
}

c10::Device device_of(const Group& group) {
  if (group.device()) return *group.device();
  if (group.kind() != BackendKind::nccl) return c10::Device(c10::kCPU);
  return {c10::kCUDA, static_cast<c10::DeviceIndex>(dist_env().local_rank)};
}

BackendKind auto_backend(int local_ranks, int gpus) {
  return gpus > 0 && local_ranks <= gpus ? BackendKind::nccl : BackendKind::gloo;
}

GroupPtr new_group(std::vector<int> ranks, std::optional<BackendKind> backend) {
  std::lock_guard lock(state_mutex);
  auto& s = current();
  std::sort(ranks.begin(), ranks.end());
  if (ranks.empty() || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end() || ranks.front() < 0 ||
      ranks.back() >= s.env.world_size) {
    throw DistributedError(fmt::format("new_group: ranks [{}] must be distinct and within [0, {})",
                                       fmt::join(ranks, ", "), s.env.world_size));
  }
  const auto kind = backend.value_or(s.kind);
  const auto name = fmt::format("group{}", ++s.groups_made);
  c10::intrusive_ptr<c10d::Backend> group_backend;
  auto it = std::find(ranks.begin(), ranks.end(), s.env.rank);
  if (it != ranks.end()) {
    // An NCCL group under a Gloo world still runs on the rank's own GPU.
    if (kind == BackendKind::nccl) check_local_gpu(s.env, fmt::format("the nccl group {}", name));
    auto store = c10::make_intrusive<c10d::PrefixStore>(name + "/", s.store);
    group_backend = make_backend(kind, store, static_cast<int>(it - ranks.begin()), static_cast<int>(ranks.size()),
                                 backend_options(s, kind));
  }
  auto group =
      std::make_shared<Group>(name, std::move(ranks), s.env.rank, std::move(group_backend), kind, s.options.timeout);
  s.groups.push_back(group);
  return group;
}

namespace detail {

bool adopt_implicit_setup() {
  std::lock_guard lock(state_mutex);
  if (!state || !state->implicit) return false;
  state->implicit = false;
  return true;
}

bool rank0_first_needs_sync() {
  std::lock_guard lock(state_mutex);
  if (state) return state->env.world_size > 1;
  if (resolve_env().world_size == 1) return false;
  setup_distrib();
  state->implicit = true;
  return true;
}

void rank0_first_done(bool ok, const std::string& error) {
  std::lock_guard lock(state_mutex);
  auto& s = current();
  const auto key = fmt::format("rank0_first/{}", s.rank0_first_calls++);
  const std::string value = ok ? "ok" : "error: " + error;
  s.store->set(key, std::vector<std::uint8_t>(value.begin(), value.end()));
}

void rank0_first_wait() {
  c10::intrusive_ptr<c10d::Store> store;
  std::string key;
  std::chrono::milliseconds timeout{};
  {
    std::lock_guard lock(state_mutex);
    auto& s = current();
    key = fmt::format("rank0_first/{}", s.rank0_first_calls++);
    store = s.store;
    timeout = s.options.timeout;
  }
  try {
    store->wait({key}, timeout);
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format("rank {}: waited {} ms for rank 0 to finish rank0_first: {}", rank(),
                                       timeout.count(), error_text(e)));
  }
  const auto value = store->get(key);
  const std::string text(value.begin(), value.end());
  if (text != "ok")
    throw DistributedError("rank 0 failed in rank0_first, so this rank does not run it: " + text.substr(7));
}

}  // namespace detail

}  // namespace fastlearn
