#include <fastlearn/comm/detail/threads_backend.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/detail/fold.h>
#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <map>
#include <mutex>
#include <optional>

namespace fastlearn {

namespace {

// A Work another rank's thread may complete.
class ThreadsWork final : public c10d::Work {
 public:
  ThreadsWork(int rank, c10d::OpType type) : Work(rank, type) {}
  void complete(std::exception_ptr error) { finish(std::move(error)); }
};

struct Call {
  c10d::OpType type = c10d::OpType::UNKNOWN;
  c10d::ReduceOp::RedOpType op = c10d::ReduceOp::SUM;
  int root = -1;
  at::Tensor input;
  std::vector<at::Tensor> outputs;  // all_gather
  c10::intrusive_ptr<ThreadsWork> work;
};

std::string describe(const Call& c) {
  switch (c.type) {
    case c10d::OpType::ALLREDUCE:
      return fmt::format("all_reduce of {}", describe_tensor(c.input));
    case c10d::OpType::BROADCAST:
      return fmt::format("broadcast of {} from {}", describe_tensor(c.input), c.root);
    case c10d::OpType::ALLGATHER:
      return fmt::format("all_gather of {}", describe_tensor(c.input));
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      return fmt::format("reduce_scatter of {}", describe_tensor(c.input));
    case c10d::OpType::_ALLGATHER_BASE:
      return fmt::format("all_gather_into of {}", describe_tensor(c.input));
    case c10d::OpType::BARRIER:
      return "barrier";
    default:
      return "another call";
  }
}

class Hub {
 public:
  explicit Hub(int size) : size_(size), next_(static_cast<std::size_t>(size), 0) {}

  c10::intrusive_ptr<c10d::Work> call(int rank, Call call) {
    call.work = c10::make_intrusive<ThreadsWork>(rank, call.type);
    auto work = call.work;
    std::vector<Call> round;
    std::int64_t number = 0;
    {
      std::lock_guard lock(mutex_);
      if (aborted_) {
        work->complete(std::make_exception_ptr(DistributedError(*aborted_)));
        return work;
      }
      number = next_[static_cast<std::size_t>(rank)]++;
      auto& calls = rounds_[number];
      if (calls.empty()) calls.resize(static_cast<std::size_t>(size_));
      calls[static_cast<std::size_t>(rank)] = std::move(call);
      if (++arrived_[number] < size_) return work;
      round = std::move(calls);
      rounds_.erase(number);
      arrived_.erase(number);
    }
    std::exception_ptr error;
    try {
      run(round, number);
    } catch (...) {
      error = std::current_exception();
    }
    for (auto& c : round) c.work->complete(error);
    return work;
  }

  void abort(const std::string& reason) {
    std::map<std::int64_t, std::vector<Call>> waiting;
    {
      std::lock_guard lock(mutex_);
      if (!aborted_) aborted_ = reason;
      waiting.swap(rounds_);
      arrived_.clear();
    }
    const auto error = std::make_exception_ptr(DistributedError(reason));
    for (auto& [number, calls] : waiting) {
      for (auto& c : calls)
        if (c.work) c.work->complete(error);
    }
  }

 private:
  void run(std::vector<Call>& round, std::int64_t number) const {
    const auto& first = round.front();
    bool same = true;
    for (const auto& c : round) {
      same = same && c.type == first.type && c.op == first.op && c.root == first.root &&
             c.input.defined() == first.input.defined() &&
             (!c.input.defined() ||
              (c.input.sizes() == first.input.sizes() && c.input.scalar_type() == first.input.scalar_type() &&
               c.input.device() == first.input.device())) &&
             c.outputs.size() == first.outputs.size();
    }
    if (!same) {
      std::string calls;
      for (std::size_t r = 0; r < round.size(); ++r) calls += fmt::format("\n  rank {}: {}", r, describe(round[r]));
      throw DistributedError(
          fmt::format("call #{} of the threads backend does not match across its ranks:{}", number, calls));
    }
    torch::NoGradGuard no_grad;
    switch (first.type) {
      case c10d::OpType::ALLREDUCE:
        return all_reduce(round);
      case c10d::OpType::BROADCAST: {
        const auto& source = round[static_cast<std::size_t>(first.root)].input;
        for (auto& c : round) copy_unless_same(c.input, source);
        return;
      }
      case c10d::OpType::ALLGATHER:
        for (auto& c : round) {
          for (std::size_t r = 0; r < round.size(); ++r) copy_unless_same(c.outputs[r], round[r].input);
        }
        return;
      case c10d::OpType::_ALLGATHER_BASE: {
        const auto part = first.input.numel();
        for (auto& c : round) {
          auto whole = c.outputs.front().view({-1});
          for (std::size_t r = 0; r < round.size(); ++r)
            copy_unless_same(whole.narrow(0, static_cast<std::int64_t>(r) * part, part), round[r].input.view({-1}));
        }
        return;
      }
      case c10d::OpType::_REDUCE_SCATTER_BASE:
        return reduce_scatter(round);
      default:
        return;  // a barrier: every rank has arrived
    }
  }

  static void copy_unless_same(const at::Tensor& to, const at::Tensor& from) {
    if (to.data_ptr() != from.data_ptr()) to.copy_(from);  // replicas may share storage
  }

  // Part r of every rank's input, reduced in rank order into rank r's output (through a copy: an output may be a
  // view of its rank's own part, as ZeRO's gradient shards are).
  static void reduce_scatter(std::vector<Call>& round) {
    const auto op = round.front().op;
    const auto part = round.front().outputs.front().numel();
    for (std::size_t r = 0; r < round.size(); ++r) {
      const auto piece = [&](std::size_t k) {
        return round[k].input.view({-1}).narrow(0, static_cast<std::int64_t>(r) * part, part);
      };
      auto out = piece(0).clone();
      for (std::size_t k = 1; k < round.size(); ++k) fold_into(out, out, piece(k), op);
      if (op == c10d::ReduceOp::AVG) out.div_(static_cast<double>(round.size()));
      round[r].outputs.front().view({-1}).copy_(out);
    }
  }

  static void all_reduce(std::vector<Call>& round) {
    auto result = round.front().input;  // a handle: the data is every rank's first tensor
    const auto op = round.front().op;
    for (std::size_t r = 1; r < round.size(); ++r) fold_into(result, result, round[r].input, op);
    if (op == c10d::ReduceOp::AVG) result.div_(static_cast<double>(round.size()));
    for (std::size_t r = 1; r < round.size(); ++r) copy_unless_same(round[r].input, result);
  }

  const int size_;
  std::mutex mutex_;
  std::vector<std::int64_t> next_;                    // each rank's next call number
  std::map<std::int64_t, std::vector<Call>> rounds_;  // calls some rank has made and not every rank yet
  std::map<std::int64_t, int> arrived_;
  std::optional<std::string> aborted_;
};

class ThreadsBackend final : public c10d::Backend {
 public:
  ThreadsBackend(std::shared_ptr<Hub> hub, int rank, int size) : Backend(rank, size), hub_(std::move(hub)) {}

  const std::string getBackendName() const override { return std::string(threads_backend_name); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override {
    return hub_->call(rank_, {.type = c10d::OpType::ALLREDUCE, .op = options.reduceOp.op_, .input = one(tensors)});
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override {
    const auto root = static_cast<int>(options.rootRank);
    if (root < 0 || root >= size_) throw DistributedError(fmt::format("broadcast: root {} is not a rank", root));
    return hub_->call(rank_, {.type = c10d::OpType::BROADCAST, .root = root, .input = one(tensors)});
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) override {
    if (outputs.size() != 1 || static_cast<int>(outputs.front().size()) != size_) {
      throw DistributedError(fmt::format("all_gather on the threads backend takes one list of {} outputs", size_));
    }
    return hub_->call(rank_, {.type = c10d::OpType::ALLGATHER, .input = one(inputs), .outputs = outputs.front()});
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions&) override {
    whole_of(output, input, "all_gather_into");
    return hub_->call(rank_, {.type = c10d::OpType::_ALLGATHER_BASE, .input = one({input}), .outputs = {output}});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& options) override {
    whole_of(input, output, "reduce_scatter");
    return hub_->call(rank_, {.type = c10d::OpType::_REDUCE_SCATTER_BASE,
                              .op = options.reduceOp.op_,
                              .input = one({input}),
                              .outputs = {one({output})}});
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return hub_->call(rank_, {.type = c10d::OpType::BARRIER});
  }

  void abort() override { hub_->abort(fmt::format("rank {} of the threads backend was aborted", rank_)); }
  void shutdown() override {}

  Hub& hub() { return *hub_; }

 private:
  // `whole` holds one `part` per rank, contiguous (its elements are read and written as one flat run).
  void whole_of(const at::Tensor& whole, const at::Tensor& part, const char* what) const {
    if (!whole.defined() || !part.defined() || !whole.is_contiguous() || !part.is_contiguous() ||
        whole.numel() != part.numel() * size_ || whole.scalar_type() != part.scalar_type()) {
      throw DistributedError(
          fmt::format("{} on the threads backend: {} and {} for {} ranks; the whole holds one "
                      "contiguous part per rank",
                      what, describe_tensor(whole), describe_tensor(part), size_));
    }
  }

  static at::Tensor one(const std::vector<at::Tensor>& tensors) {
    if (tensors.size() != 1 || !tensors.front().defined()) {
      throw DistributedError(
          fmt::format("the threads backend takes one defined tensor per call, got {}", tensors.size()));
    }
    if (!tensors.front().is_contiguous() && !tensors.front().is_non_overlapping_and_dense()) {
      throw DistributedError("the threads backend takes dense tensors only");
    }
    return tensors.front();
  }

  std::shared_ptr<Hub> hub_;
};

}  // namespace

std::vector<c10::intrusive_ptr<c10d::Backend>> threads_backends(int size) {
  if (size < 1) throw DistributedError(fmt::format("threads_backends: {} ranks; need at least 1", size));
  auto hub = std::make_shared<Hub>(size);
  std::vector<c10::intrusive_ptr<c10d::Backend>> backends;
  for (int r = 0; r < size; ++r) backends.push_back(c10::make_intrusive<ThreadsBackend>(hub, r, size));
  return backends;
}

void abort_threads_backend(c10d::Backend& backend, const std::string& reason) {
  auto* threads = dynamic_cast<ThreadsBackend*>(&backend);
  if (!threads) throw Error("abort_threads_backend: not a backend of threads_backends()");
  threads->hub().abort(reason);
}

}  // namespace fastlearn
