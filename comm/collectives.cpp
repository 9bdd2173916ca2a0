#include <fastlearn/comm/collectives.h>

#include <fastlearn/comm/detail/shared_memory_backend.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <array>
#include <thread>

namespace fastlearn {

std::string_view to_string(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::product:
      return "product";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
  }
  return "?";
}

std::string describe_tensor(const at::Tensor& t) {
  if (!t.defined()) return "no tensor";
  return fmt::format("{} [{}]", c10::toString(t.scalar_type()), fmt::join(t.sizes(), ", "));
}

Group* group_or_world(Group* group) {
  if (group) return group;
  if (!is_initialized()) {
    if (world_size() == 1) return nullptr;
    throw DistributedError(
        fmt::format("rank {} of {}: no process group is set up; call setup_distrib() (or use a "
                    "DistribCtx) before collectives",
                    rank(), world_size()));
  }
  return &world_group();
}

namespace {

// This caller's global rank as `g` numbers its members (a group of threads numbers them itself).
int self_rank(const Group& g) { return g.is_member() ? g.ranks()[static_cast<std::size_t>(g.rank())] : rank(); }

enum class Op : std::int64_t {
  broadcast = 1,
  reduce,
  all_reduce,
  scatter,
  gather,
  all_gather,
  barrier,
  reduce_scatter,
  all_gather_into
};

const char* op_name(std::int64_t op) {
  static constexpr std::array<const char*, 10> names{
      "?",      "broadcast",  "reduce",  "all_reduce",     "scatter",
      "gather", "all_gather", "barrier", "reduce_scatter", "all_gather_into"};
  return op >= 1 && op < static_cast<std::int64_t>(names.size()) ? names[static_cast<std::size_t>(op)] : "?";
}

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return c10d::ReduceOp::SUM;
    case ReduceOp::product:
      return c10d::ReduceOp::PRODUCT;
    case ReduceOp::min:
      return c10d::ReduceOp::MIN;
    case ReduceOp::max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::avg:
      return c10d::ReduceOp::AVG;
  }
  return c10d::ReduceOp::SUM;
}

std::string failure_message(Group& g, const std::string& what, const std::string& reason, std::int64_t call) {
  return fmt::format(
      "{} on rank {} (group '{}' of {} ranks) failed: {}.{} A rank that died, hangs or never made the same call "
      "causes this; the collective timeout is {} ms",
      what, self_rank(g), g.name(), g.size(), reason, call >= 0 ? silent_ranks(g, call) : std::string(),
      g.timeout().count());
}

std::string describe(c10d::ErrorType error) {
  switch (error) {
    case c10d::ErrorType::SUCCESS:
      return {};
    case c10d::ErrorType::TIMEOUT:
      return "NCCL's watchdog found a collective of this group past the timeout and aborted the communicator";
    case c10d::ErrorType::COMM_ERROR:
      return "NCCL reported an error on this group's communicator";
    case c10d::ErrorType::REMOTE_ERROR:
      return "another rank reported an NCCL error in this group";
  }
  return "NCCL reported an error";
}

// Waits for `work` (call `call` of the group) as wait_mode says: on the host, turning any failure into an error
// that names the operation, the ranks that never reached it, and the likely cause; or, for NCCL, by making the
// current stream wait and leaving the check to check_pending.
void wait_for(const c10::intrusive_ptr<c10d::Work>& work, Group& g, const std::string& what, std::int64_t call = -1,
              bool barrier = false) {
  try {
    if (wait_mode(g.kind(), barrier) == WaitMode::stream) {
      work->wait();  // no timeout: ProcessGroupNCCL then only makes the current stream wait
      g.pending().add(work, what, call);
      return;
    }
    work->wait(g.timeout());
  } catch (const std::exception& e) {
    throw DistributedError(failure_message(g, what, error_text(e), call));
  }
}

// Runs `launch` (which starts the c10d operation) and waits; errors raised while launching are named too.
template <typename Launch>
void run(Group& g, const std::string& what, Launch&& launch, bool barrier = false) {
  check_pending(g);
  c10::intrusive_ptr<c10d::Work> work;
  const auto call = g.next_call();
  try {
    work = launch();
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(
        fmt::format("{} on rank {} (group '{}') could not start: {}", what, self_rank(g), g.name(), error_text(e)));
  }
  wait_for(work, g, what, call, barrier);
}

// Debug mode: every rank shares a fingerprint of its call (sequence number, op, dtype, shape, root, reduce
// op) before the real collective, so mismatched calls fail with a message instead of hanging or corrupting.
void check_same_call(Group& g, Op op, const at::Tensor& t, int root = -1, ReduceOp rop = ReduceOp::sum) {
  if (!debug_checks_enabled()) return;
  constexpr int kDims = 8;
  std::vector<std::int64_t> fp(6 + kDims, -1);
  fp[0] = g.next_sequence();
  fp[1] = static_cast<std::int64_t>(op);
  fp[2] = t.defined() ? static_cast<std::int64_t>(t.scalar_type()) : -1;
  fp[3] = t.defined() ? t.dim() : -1;
  fp[4] = root;
  fp[5] = static_cast<std::int64_t>(rop);
  for (int d = 0; t.defined() && d < std::min<int>(kDims, static_cast<int>(t.dim())); ++d) fp[6 + d] = t.size(d);
  const auto device = t.defined() ? t.device() : device_of(g);  // a barrier: where the group's backend takes tensors
  auto mine = torch::tensor(fp, torch::kLong).to(device);
  std::vector<std::vector<at::Tensor>> all(1);
  for (int r = 0; r < g.size(); ++r) all[0].push_back(torch::empty_like(mine));
  std::vector<at::Tensor> input{mine};
  wait_for(g.backend().allgather(all, input), g, "the debug check of a collective");
  std::vector<std::vector<std::int64_t>> calls;
  for (auto& x : all[0]) {
    auto cpu = x.cpu();
    calls.emplace_back(cpu.data_ptr<std::int64_t>(), cpu.data_ptr<std::int64_t>() + cpu.numel());
  }
  if (std::all_of(calls.begin(), calls.end(), [&](const auto& c) { return c == calls[0]; })) return;
  std::string detail;
  for (int r = 0; r < g.size(); ++r) {
    const auto& c = calls[static_cast<std::size_t>(r)];
    std::vector<std::int64_t> dims;
    for (int d = 0; d < std::min<std::int64_t>(kDims, c[3]); ++d) dims.push_back(c[6 + d]);
    detail += fmt::format(
        "\n  rank {}: call #{} {}{} of {} [{}]{}", g.ranks()[static_cast<std::size_t>(r)], c[0], op_name(c[1]),
        c[1] == static_cast<std::int64_t>(Op::all_reduce) || c[1] == static_cast<std::int64_t>(Op::reduce) ||
                c[1] == static_cast<std::int64_t>(Op::reduce_scatter)
            ? fmt::format("({})", to_string(static_cast<ReduceOp>(c[5])))
            : "",
        c[2] >= 0 ? c10::toString(static_cast<c10::ScalarType>(c[2])) : "no tensor", fmt::join(dims, ", "),
        c[4] >= 0 ? fmt::format(" root {}", c[4]) : "");
  }
  throw DistributedError(fmt::format("mismatched collective calls in group '{}' (debug mode):{}", g.name(), detail));
}

// Backends need contiguous tensors: run on a contiguous copy and copy the result back if needed.
template <typename Body>
void with_contiguous(const at::Tensor& t, Body&& body) {
  if (t.is_contiguous()) return body(t);
  auto tmp = t.contiguous();
  body(tmp);
  t.copy_(tmp);
}

void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like, Group& g, const char* what) {
  if (static_cast<int>(list.size()) != g.size()) {
    throw DistributedError(fmt::format("{}: {} tensors given for a group of {} ranks", what, list.size(), g.size()));
  }
  for (std::size_t i = 0; i < list.size(); ++i) {
    if (!list[i].defined() || list[i].sizes() != like.sizes() || list[i].scalar_type() != like.scalar_type()) {
      throw DistributedError(fmt::format("{}: tensor {} is {} but must be {} like the input", what, i,
                                         describe_tensor(list[i]), describe_tensor(like)));
    }
  }
}

}  // namespace

void broadcast(const at::Tensor& tensor, int src, Group* group) {
  Group* g = group_or_world(group);
  if (!g) return;
  check_same_call(*g, Op::broadcast, tensor, src);
  with_contiguous(tensor, [&](const at::Tensor& t) {
    std::vector<at::Tensor> tensors{t};
    c10d::BroadcastOptions options;
    options.rootRank = g->group_rank_of(src);
    run(*g, fmt::format("broadcast of {} from rank {}", describe_tensor(t), src),
        [&] { return g->backend().broadcast(tensors, options); });
  });
}

void reduce(const at::Tensor& tensor, int dst, ReduceOp op, Group* group) {
  Group* g = group_or_world(group);
  if (!g) return;
  check_same_call(*g, Op::reduce, tensor, dst, op);
  const bool emulate_avg = op == ReduceOp::avg && g->kind() == BackendKind::gloo;
  if (emulate_avg && !at::isFloatingType(tensor.scalar_type())) {
    throw DistributedError("reduce(avg) of an integer tensor (" + describe_tensor(tensor) + ") is not exact; use sum");
  }
  with_contiguous(tensor, [&](const at::Tensor& t) {
    std::vector<at::Tensor> tensors{t};
    c10d::ReduceOptions options;
    options.reduceOp = to_c10d(emulate_avg ? ReduceOp::sum : op);
    options.rootRank = g->group_rank_of(dst);
    run(*g, fmt::format("reduce({}) of {} to rank {}", to_string(op), describe_tensor(t), dst),
        [&] { return g->backend().reduce(tensors, options); });
    if (emulate_avg && self_rank(*g) == dst) t.div_(g->size());
  });
}

void all_reduce(const at::Tensor& tensor, ReduceOp op, Group* group) {
  Group* g = group_or_world(group);
  if (!g) return;
  check_same_call(*g, Op::all_reduce, tensor, -1, op);
  // Gloo has no average: sum, then divide once (exact for every rank count, unlike pre-dividing).
  const bool emulate_avg = op == ReduceOp::avg && g->kind() == BackendKind::gloo;
  if (emulate_avg && !at::isFloatingType(tensor.scalar_type())) {
    throw DistributedError("all_reduce(avg) of an integer tensor (" + describe_tensor(tensor) +
                           ") is not exact; use sum");
  }
  with_contiguous(tensor, [&](const at::Tensor& t) {
    std::vector<at::Tensor> tensors{t};
    c10d::AllreduceOptions options;
    options.reduceOp = to_c10d(emulate_avg ? ReduceOp::sum : op);
    run(*g, fmt::format("all_reduce({}) of {}", to_string(op), describe_tensor(t)),
        [&] { return g->backend().allreduce(tensors, options); });
    if (emulate_avg) t.div_(g->size());
  });
}

void scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src, Group* group) {
  Group* g = group_or_world(group);
  if (!g) {
    output.copy_(inputs.at(0));
    return;
  }
  check_same_call(*g, Op::scatter, output, src);
  const bool root = self_rank(*g) == src;
  if (root) check_list(inputs, output, *g, "scatter");
  with_contiguous(output, [&](const at::Tensor& out) {
    std::vector<at::Tensor> outputs{out};
    std::vector<std::vector<at::Tensor>> in;
    if (root) {
      in.emplace_back();
      for (const auto& t : inputs) in[0].push_back(t.contiguous());
    }
    c10d::ScatterOptions options;
    options.rootRank = g->group_rank_of(src);
    run(*g, fmt::format("scatter of {} from rank {}", describe_tensor(out), src),
        [&] { return g->backend().scatter(outputs, in, options); });
  });
}

void gather(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst, Group* group) {
  Group* g = group_or_world(group);
  if (!g) {
    outputs.at(0).copy_(input);
    return;
  }
  check_same_call(*g, Op::gather, input, dst);
  const bool root = self_rank(*g) == dst;
  if (root) check_list(outputs, input, *g, "gather");
  std::vector<at::Tensor> in{input.contiguous()};
  std::vector<std::vector<at::Tensor>> out;
  std::vector<at::Tensor> staging;  // contiguous stand-ins for non-contiguous outputs
  if (root) {
    out.emplace_back();
    for (const auto& t : outputs)
      out[0].push_back(t.is_contiguous() ? t : torch::empty_like(t, at::MemoryFormat::Contiguous));
  }
  c10d::GatherOptions options;
  options.rootRank = g->group_rank_of(dst);
  run(*g, fmt::format("gather of {} to rank {}", describe_tensor(input), dst),
      [&] { return g->backend().gather(out, in, options); });
  if (root) {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (!outputs[i].is_same(out[0][i])) outputs[i].copy_(out[0][i]);
    }
  }
}

void all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, Group* group) {
  Group* g = group_or_world(group);
  if (!g) {
    outputs.at(0).copy_(input);
    return;
  }
  check_same_call(*g, Op::all_gather, input);
  check_list(outputs, input, *g, "all_gather");
  std::vector<at::Tensor> in{input.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (const auto& t : outputs)
    out[0].push_back(t.is_contiguous() ? t : torch::empty_like(t, at::MemoryFormat::Contiguous));
  run(*g, fmt::format("all_gather of {}", describe_tensor(input)), [&] { return g->backend().allgather(out, in); });
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!outputs[i].is_same(out[0][i])) outputs[i].copy_(out[0][i]);
  }
}

namespace {
// The flat tensors of reduce_scatter and all_gather_into: `whole` holds `size` parts of `part`'s elements.
void check_parts(const at::Tensor& part, const at::Tensor& whole, int size, const char* what) {
  if (!part.defined() || !whole.defined() || whole.numel() != part.numel() * size ||
      whole.scalar_type() != part.scalar_type() || whole.device() != part.device()) {
    throw DistributedError(
        fmt::format("{}: {} on {} and {} on {} for a group of {} ranks; the whole must hold {} "
                    "times the part's elements, of its dtype and device",
                    what, describe_tensor(whole), whole.defined() ? whole.device().str() : "-", describe_tensor(part),
                    part.defined() ? part.device().str() : "-", size, size));
  }
}
}  // namespace

void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op, Group* group) {
  Group* g = group_or_world(group);
  if (!g) {
    check_parts(output, input, 1, "reduce_scatter");
    output.view({-1}).copy_(input.reshape({-1}));
    return;
  }
  check_parts(output, input, g->size(), "reduce_scatter");
  check_same_call(*g, Op::reduce_scatter, input, -1, op);
  const bool emulate_avg = op == ReduceOp::avg && g->kind() == BackendKind::gloo;
  if (emulate_avg && !at::isFloatingType(input.scalar_type())) {
    throw DistributedError("reduce_scatter(avg) of an integer tensor (" + describe_tensor(input) +
                           ") is not exact; use sum");
  }
  auto in = input.contiguous().view({-1});
  with_contiguous(output, [&](const at::Tensor& out) {
    auto flat = out.view({-1});
    c10d::ReduceScatterOptions options;
    options.reduceOp = to_c10d(emulate_avg ? ReduceOp::sum : op);
    run(*g, fmt::format("reduce_scatter({}) of {}", to_string(op), describe_tensor(input)),
        [&] { return g->backend()._reduce_scatter_base(flat, in, options); });
    if (emulate_avg) out.div_(g->size());
  });
}

void all_gather_into(const at::Tensor& output, const at::Tensor& input, Group* group) {
  Group* g = group_or_world(group);
  if (!g) {
    check_parts(input, output, 1, "all_gather_into");
    output.view({-1}).copy_(input.reshape({-1}));
    return;
  }
  check_parts(input, output, g->size(), "all_gather_into");
  check_same_call(*g, Op::all_gather_into, input);
  auto in = input.contiguous().view({-1});
  // The shared memory backend copies each part of the input before it writes over it; another backend gets a copy of
  // an input that is this rank's part of the output.
  if (in.is_alias_of(output) && g->backend().getBackendName() != shared_memory_backend_name) in = in.clone();
  with_contiguous(output, [&](const at::Tensor& out) {
    auto flat = out.view({-1});
    run(*g, fmt::format("all_gather_into of {}", describe_tensor(input)),
        [&] { return g->backend()._allgather_base(flat, in); });
  });
}

void barrier(Group* group) {
  Group* g = group_or_world(group);
  if (!g) return;
  check_same_call(*g, Op::barrier, at::Tensor());
  run(
      *g, "barrier", [&] { return g->backend().barrier(); }, /*barrier=*/true);
}

std::string silent_ranks(Group& group, std::int64_t call) {
  try {
    if (group.device()) return "";  // a group of threads of this process: no store, their own errors name the failure
    auto& store = dist_store();
    const auto key = [&](int member) { return fmt::format("failed/{}/{}/{}", group.name(), call, member); };
    const std::string yes = "1";
    store.set(key(fastlearn::rank()), std::vector<std::uint8_t>(yes.begin(), yes.end()));
    // The members that failed in the same call say so within moments; give them a little time.
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(1500);
    std::vector<int> silent;
    do {
      silent.clear();
      for (int member : group.ranks()) {
        if (!store.check({key(member)})) silent.push_back(member);
      }
      if (silent.empty()) return "";
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    } while (std::chrono::steady_clock::now() < until);
    return fmt::format(" Rank{} {} never reached this call (call #{} of the group): {} hang{} elsewhere or died.",
                       silent.size() > 1 ? "s" : "", fmt::join(silent, ", "), call, silent.size() > 1 ? "they" : "it",
                       silent.size() > 1 ? "" : "s");
  } catch (const std::exception&) {
    return "";  // the store went away with its rank 0: nothing more to learn
  }
}

void check_pending(Group& group) {
  if (wait_mode(group.kind()) == WaitMode::host) return;  // nothing is left to the stream
  std::string backend_error;
  if (group.kind() == BackendKind::nccl && group.is_member()) {
    try {
      backend_error = describe(group.backend().getError());
    } catch (const std::exception&) {  // a backend without getError: the works' own state tells
    }
  }
  if (const auto failure = group.pending().check(group.timeout(), PendingWorks::Clock::now(), backend_error))
    throw DistributedError(failure_message(group, failure->what, failure->reason, failure->call));
}

void debug_check_all_reduce(const at::Tensor& tensor, Group& group) {
  check_same_call(group, Op::all_reduce, tensor, -1, ReduceOp::sum);
}

}  // namespace fastlearn
