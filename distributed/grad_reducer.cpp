#include <fastlearn/distributed/grad_reducer.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/detail/memory_order.h>
#include <fastlearn/core/error.h>
#include <fastlearn/core/host_readback.h>

#include <fmt/format.h>
#include <torch/csrc/autograd/engine.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <utility>

namespace fastlearn {

namespace {

struct ParamSlot {
  std::string name;
  at::Tensor tensor;
  std::int64_t unit = -1;  ///< GradReducerOptions::unit_of
  std::size_t bucket = 0;
  std::int64_t offset = 0;
  bool ready = false;
  at::Tensor view;  ///< its part of the bucket, shaped like the parameter; .grad points here when possible
};

struct Bucket {
  std::vector<std::size_t> params;
  at::Tensor flat;          ///< packed gradients; undefined for a bucket reduced in place, and while scattering
                            ///< between backward passes
  std::int64_t numel = 0;   ///< its parameters' elements
  std::int64_t padded = 0;  ///< scattering: numel rounded up to a multiple of the group size
  at::Tensor scattered;     ///< scattering into shares that hold earlier micro-batches: this one's part
  bool in_place = false;    ///< one large parameter, all_reduced in its own .grad
  std::int64_t pending = 0;
  c10::intrusive_ptr<c10d::Work> work;
  std::int64_t call = -1;  ///< the group's call number of its all_reduce (Group::next_call)
};

// Copies rank `root`'s tensors to every rank, one broadcast per dtype and device.
void broadcast_coalesced(const std::vector<at::Tensor>& tensors, int root, Group& group) {
  std::map<std::pair<c10::ScalarType, std::string>, std::vector<at::Tensor>> by_kind;
  for (const auto& t : tensors) by_kind[{t.scalar_type(), t.device().str()}].push_back(t);
  torch::NoGradGuard no_grad;
  for (auto& [kind, list] : by_kind) {
    std::vector<at::Tensor> flat_parts;
    for (const auto& t : list) flat_parts.push_back(t.reshape(-1));
    auto flat = at::cat(flat_parts);
    broadcast(flat, root, &group);
    std::int64_t offset = 0;
    for (auto& t : list) {
      t.copy_(flat.narrow(0, offset, t.numel()).view_as(t));
      offset += t.numel();
    }
  }
}

}  // namespace

class GradReducer::Impl {
 public:
  Impl(std::vector<std::pair<std::string, at::Tensor>> params, std::vector<at::Tensor> buffers, Group& group,
       GradReducerOptions options)
      : group_(group), options_(options), buffers_(std::move(buffers)) {
    if (options_.scatter && options_.compression)
      throw ConfigError(
          "GradReducer: gradients cannot be both compressed and reduce-scattered into shares (scatter); "
          "drop the compression");
    options_.separate_verdicts = options_.separate_verdicts || options_.scatter;
    layout_final_ = !options_.rebuild_buckets;
    if (!options_.unit_of.empty() && options_.unit_of.size() != params.size())
      throw ConfigError(
          fmt::format("GradReducer: unit_of has {} entries for {} parameters", options_.unit_of.size(), params.size()));
    for (std::size_t i = 0; i < params.size(); ++i) {
      auto& [name, t] = params[i];
      const auto unit = options_.unit_of.empty() ? -1 : options_.unit_of[i];
      // A parameter of no elements (a BatchNorm over no features) has no gradient to reduce.
      if (t.requires_grad() && t.numel() > 0) params_.push_back({.name = name, .tensor = t, .unit = unit});
    }
    if (!group_.is_member())
      throw DistributedError("GradReducer: this rank is not a member of group '" + group_.name() + "'");
    std::vector<at::Tensor> to_sync;
    for (auto& [name, t] : params) to_sync.push_back(t);
    to_sync.insert(to_sync.end(), buffers_.begin(), buffers_.end());
    broadcast_coalesced(to_sync, group_.ranks().front(), group_);
    std::vector<std::size_t> reverse;
    for (std::size_t i = params_.size(); i-- > 0;) reverse.push_back(i);
    build_buckets(reverse);
    for (std::size_t i = 0; i < params_.size(); ++i) install_hook(i);
  }

  ~Impl() {
    for (auto& p : params_) torch::autograd::impl::set_post_acc_grad_hooks(p.tensor, nullptr);
  }

  void broadcast_buffers() {
    if (!buffers_.empty()) broadcast_coalesced(buffers_, group_.ranks().front(), group_);
  }

  void finalize_if_pending() {
    std::unique_lock lock(mutex_);
    if (in_backward_) finalize(lock);
  }

  void finish_backward(bool empty_share) {
    std::unique_lock lock(mutex_);
    if (!sync || params_.empty()) return;
    if (!in_backward_) start_iteration();  // no gradient arrived: take part with what .grad holds, or zeros
    quiet_unused_ = empty_share;
    finalize(lock);
  }

  void vote(bool yes) {
    std::unique_lock lock(mutex_);
    vote_ = yes;
    votes_wanted_ = true;
  }

  bool take_votes() {
    std::unique_lock lock(mutex_);
    bool any = false;
    for (double v : votes_.take_ready()) any = any || v > 0;
    return any;
  }

  bool sync = true;
  ReducerStats stats;
  std::int64_t iterations = 0;
  std::size_t bucket_count() const { return buckets_.size(); }
  std::int64_t layout_version = 0;
  bool layout_final() const { return layout_final_; }
  const std::vector<at::Tensor>& shares() const { return shares_; }
  void clear_shares() {
    std::unique_lock lock(mutex_);
    shares_fresh_ = true;
  }

  std::vector<std::vector<at::Tensor>> bucket_params() const {
    std::vector<std::vector<at::Tensor>> out;
    for (const auto& b : buckets_) {
      if (b.params.empty()) continue;
      auto& list = out.emplace_back();
      for (const auto i : b.params) list.push_back(params_[i].tensor);
    }
    return out;
  }

 private:
  struct Hook : torch::autograd::PostAccumulateGradHook {
    Hook(Impl* impl, std::size_t index) : impl_(impl), index_(index) {}
    void operator()(const torch::autograd::Variable&) override { impl_->on_grad(index_); }
    Impl* impl_;
    std::size_t index_;
  };

  void install_hook(std::size_t i) {
    torch::autograd::impl::set_post_acc_grad_hooks(params_[i].tensor, std::make_unique<Hook>(this, i));
  }

  // Reduce-scattering into shares: from the moment the buckets are final.
  bool scattering() const { return options_.scatter && layout_final_; }

  void build_buckets(const std::vector<std::size_t>& order) {
    buckets_.clear();
    shares_.clear();
    ++layout_version;
    if (params_.empty()) return;  // nothing to reduce: no backward reaches the hooks
    const double mb = 1024.0 * 1024.0;
    std::map<std::pair<c10::ScalarType, std::string>, std::size_t> open;  // kind -> bucket being filled
    std::map<std::size_t, std::int64_t> bytes;
    std::map<std::int64_t, std::size_t> unit_bucket;  // unit -> its bucket
    for (std::size_t i : order) {
      auto& p = params_[i];
      const auto dtype = options_.compression.value_or(p.tensor.scalar_type());
      const std::pair key{dtype, p.tensor.device().str()};
      const auto item_bytes = static_cast<std::int64_t>(c10::elementSize(dtype)) * p.tensor.numel();
      if (p.unit >= 0) {
        auto [it, made] = unit_bucket.try_emplace(p.unit, buckets_.size());
        if (made) buckets_.emplace_back();
        p.bucket = it->second;
        p.offset = bytes[p.bucket] / static_cast<std::int64_t>(c10::elementSize(dtype));
        bytes[p.bucket] += item_bytes;
        buckets_[p.bucket].params.push_back(i);
        continue;
      }
      if (reduce_in_place(p, item_bytes)) {
        buckets_.emplace_back();
        buckets_.back().in_place = true;
        buckets_.back().params.push_back(i);
        p.bucket = buckets_.size() - 1;
        p.offset = 0;
        bytes[p.bucket] = item_bytes;
        continue;
      }
      auto it = open.find(key);
      if (it != open.end()) {
        // The first bucket is small so that communication starts early in backward.
        const double cap = (it->second == 0 ? options_.first_bucket_mb : options_.bucket_cap_mb) * mb;
        if (bytes[it->second] > 0 && static_cast<double>(bytes[it->second] + item_bytes) > cap) {
          open.erase(it);
          it = open.end();
        }
      }
      if (it == open.end()) {
        buckets_.emplace_back();
        it = open.emplace(key, buckets_.size() - 1).first;
      }
      const auto b = it->second;
      p.bucket = b;
      p.offset = bytes[b] / static_cast<std::int64_t>(c10::elementSize(dtype));
      bytes[b] += item_bytes;
      buckets_[b].params.push_back(i);
    }
    for (auto& b : buckets_)
      for (const auto i : b.params) b.numel += params_[i].tensor.numel();
    stats.bucket_bytes.clear();
    if (scattering()) {
      // Each bucket's whole buffer is made when its first gradient arrives and freed once it is reduced; this rank
      // keeps its part.
      const auto n = static_cast<std::int64_t>(group_.size());
      for (auto& b : buckets_) {
        const auto& like = params_[b.params.front()].tensor;
        b.padded = (b.numel + n - 1) / n * n;
        shares_.push_back(at::zeros({b.padded / n}, like.options()));
        stats.bucket_bytes.push_back(b.padded * static_cast<std::int64_t>(like.element_size()));
      }
      shares_fresh_ = true;
      for (auto& p : params_) p.view = at::Tensor();
      return;
    }
    // The vote rides at the end of the last bucket to launch (it finishes last anyway); when every bucket
    // is reduced in place, a one-element bucket of its own carries it. With separate verdicts, nothing rides.
    vote_bucket_ = buckets_.size();
    for (std::size_t b = buckets_.size(); b-- > 0 && !options_.separate_verdicts;) {
      if (!buckets_[b].in_place) {
        vote_bucket_ = b;
        break;
      }
    }
    if (vote_bucket_ == buckets_.size() && !options_.separate_verdicts) buckets_.emplace_back();
    for (std::size_t b = 0; b < buckets_.size(); ++b) {
      if (buckets_[b].in_place) {
        stats.bucket_bytes.push_back(bytes[b]);
        continue;
      }
      const auto& like =
          buckets_[b].params.empty() ? params_.front().tensor : params_[buckets_[b].params.front()].tensor;
      const auto dtype =
          buckets_[b].params.empty() ? like.scalar_type() : options_.compression.value_or(like.scalar_type());
      const auto item = static_cast<std::int64_t>(c10::elementSize(dtype));
      const std::int64_t numel = bytes[b] / item + (b == vote_bucket_ ? 1 : 0);
      stats.bucket_bytes.push_back(numel * item);
      buckets_[b].flat = torch::zeros({numel}, torch::TensorOptions().dtype(dtype).device(like.device()));
    }
    if (!options_.separate_verdicts)
      vote_slot_ = buckets_[vote_bucket_].flat.narrow(0, buckets_[vote_bucket_].flat.numel() - 1, 1);
    torch::NoGradGuard no_grad;
    for (auto& p : params_) {
      if (buckets_[p.bucket].in_place) {
        p.view = at::Tensor();
        continue;
      }
      // The view has the parameter's strides (contiguous or channels-last), the layout autograd gives .grad.
      auto slice = buckets_[p.bucket].flat.narrow(0, p.offset, p.tensor.numel());
      p.view = dense(p.tensor) ? slice.as_strided(p.tensor.sizes(), p.tensor.strides()) : slice.view(p.tensor.sizes());
      // Gradients that live in the old buckets (after the first iteration's rebuild) move to the new ones.
      auto& grad = p.tensor.mutable_grad();
      if (grad.defined() && can_be_view(p)) {
        p.view.copy_(grad);
        grad = p.view;
      }
    }
  }

  void start_iteration() {
    in_backward_ = true;
    for (auto& p : params_) p.ready = false;
    for (auto& b : buckets_) {
      b.pending = static_cast<std::int64_t>(b.params.size());
      b.work.reset();
    }
    next_launch_ = 0;
    if (!options_.separate_verdicts) {
      torch::NoGradGuard no_grad;
      vote_slot_.fill_(vote_ ? 1 : 0);  // summed over ranks: > 0 when any rank voted yes
    }
    stats.hooks = 0;
    stats.launched_after.clear();
    arrival_.clear();
    // Runs once the whole backward pass is done, on the thread that ran its last node.
    if (!options_.finish_in_engine) return;
    torch::autograd::Engine::get_default_engine().queue_callback([this] {
      std::unique_lock lock(mutex_);
      if (in_backward_) finalize(lock);
    });
  }

  void on_grad(std::size_t i) {
    if (!sync) return;
    std::unique_lock lock(mutex_);
    if (!in_backward_) start_iteration();
    auto& p = params_[i];
    if (p.ready) return;
    p.ready = true;
    ++stats.hooks;
    arrival_.push_back(i);
    stage(p);
    if (--buckets_[p.bucket].pending == 0) launch_ready();
  }

  // Puts the parameter's local gradient, divided by the world size, into its bucket (Gloo has no average,
  // and the sum of the shares is the mean): one pass. Afterwards .grad is the bucket's view whenever the
  // types allow, so the averaged result needs no copy back.
  void stage(ParamSlot& p) {
    torch::NoGradGuard no_grad;
    auto& grad = p.tensor.mutable_grad();
    const double share = options_.divide_by_world_size ? 1.0 / group_.size() : 1.0;
    if (scattering()) return stage_for_scatter(p, grad, share);
    if (buckets_[p.bucket].in_place) {
      if (!grad.defined()) {
        grad = at::zeros_like(p.tensor, at::MemoryFormat::Preserve);
      } else if (grad.strides() != p.tensor.strides()) {
        grad = at::empty_like(p.tensor, at::MemoryFormat::Preserve).copy_(grad);
      }
      if (share != 1.0) grad.mul_(share);
      return;
    }
    if (!grad.defined()) {
      p.view.zero_();  // no gradient on this rank: it contributes zeros
    } else if (is_view_of_bucket(grad, p)) {
      if (share != 1.0) p.view.mul_(share);  // accumulated in place (in-place zero_grad, or no_sync micro-batches)
    } else if (grad.scalar_type() == p.view.scalar_type()) {
      at::mul_out(p.view, grad, share);
    } else {
      p.view.copy_(grad.mul(share));  // compression: divide before narrowing the type
      return;
    }
    if (can_be_view(p)) grad = p.view;
  }

  // The gradient, in its parameter's memory order, into the bucket's buffer (made by the bucket's first gradient,
  // its padding zero); .grad is then dropped: this rank keeps only its part of the reduced bucket.
  void stage_for_scatter(ParamSlot& p, at::Tensor& grad, double share) {
    auto& b = buckets_[p.bucket];
    if (!b.flat.defined()) {
      b.flat = at::empty({b.padded}, p.tensor.options());
      b.flat.narrow(0, b.numel, b.padded - b.numel).zero_();
    }
    auto slice = b.flat.narrow(0, p.offset, p.tensor.numel());
    if (!grad.defined()) {
      slice.zero_();
      return;
    }
    const auto in_order = dense(grad) && grad.strides() == p.tensor.strides()
                              ? grad
                              : at::empty_like(p.tensor, at::MemoryFormat::Preserve).copy_(grad);
    if (share == 1.0)
      slice.copy_(memory_order(in_order));
    else
      at::mul_out(slice, memory_order(in_order), share);
    grad.reset();
  }

  // Dense (contiguous or another permutation such as channels-last): its memory is one block of numel
  // elements, which a bucket slice can alias and a collective can treat as a flat vector.
  static bool dense(const at::Tensor& t) { return !t.is_sparse() && t.is_non_overlapping_and_dense(); }

  // Large, dense, float as it is communicated: reduced in its own .grad.
  bool reduce_in_place(const ParamSlot& p, std::int64_t bytes) const {
    return !options_.compression && !scattering() && dense(p.tensor) &&
           static_cast<double>(bytes) >= options_.in_place_mb * 1024.0 * 1024.0;
  }

  static bool is_view_of_bucket(const at::Tensor& grad, const ParamSlot& p) {
    return grad.is_alias_of(p.view) && grad.data_ptr() == p.view.data_ptr();
  }

  // A dense parameter can take its bucket view as .grad (it has the parameter's strides, the layout
  // autograd and the optimizer expect); with compression the bucket has another dtype.
  bool can_be_view(const ParamSlot& p) const {
    return options_.gradient_as_bucket_view && p.view.scalar_type() == p.tensor.scalar_type() && dense(p.tensor);
  }

  // Starts every complete bucket whose predecessors have started: the same order on every rank.
  void launch_ready() {
    while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) {
      auto& b = buckets_[next_launch_];
      if (scattering()) {
        launch_scatter(b);
        continue;
      }
      std::vector<at::Tensor> tensors{b.in_place ? memory_order(params_[b.params.front()].tensor.grad()) : b.flat};
      // FASTLEARN_DISTRIBUTED_DEBUG=1; not where ranks share the engine's thread (it is a blocking collective).
      if (debug_ && options_.finish_in_engine) debug_check_all_reduce(tensors.front(), group_);
      b.call = group_.next_call();
      try {
        b.work = group_.backend().allreduce(tensors);
      } catch (const std::exception& e) {  // e.g. a communicator NCCL's watchdog aborted since the last step
        throw DistributedError(fmt::format("gradient all_reduce of bucket {} of {} could not start on rank {}: {}",
                                           next_launch_, buckets_.size(), group_.ranks()[group_.rank()],
                                           error_text(e)));
      }
      stats.launched_after.push_back(stats.hooks);
      ++next_launch_;
    }
  }

  // Reduce-scatters a bucket: into this rank's share when it holds nothing yet, else into a part of its own that
  // finalize adds to the share (micro-batches under gradient accumulation).
  void launch_scatter(Bucket& b) {
    const auto k = next_launch_;
    b.call = group_.next_call();
    auto out = shares_fresh_ ? shares_[k] : (b.scattered = at::empty_like(shares_[k]));
    try {
      c10d::ReduceScatterOptions reduce;
      reduce.reduceOp = c10d::ReduceOp::SUM;
      b.work = group_.backend()._reduce_scatter_base(out, b.flat, reduce);
    } catch (const std::exception& e) {
      throw DistributedError(fmt::format("gradient reduce_scatter of bucket {} of {} could not start on rank {}: {}", k,
                                         buckets_.size(), group_.ranks()[group_.rank()], error_text(e)));
    }
    // The work holds its input while it needs it (a collective done when it returns, over shared memory, not at all):
    // one bucket's whole buffer at a time, not every bucket's until backward ends.
    b.flat = at::Tensor();
    stats.launched_after.push_back(stats.hooks);
    ++next_launch_;
  }

  // The separate verdicts of this backward: the stop vote and a bit per rank that left parameters without
  // gradient, summed over the ranks; read as the votes are (at once on CPU, a backward later on CUDA).
  void reduce_verdicts(bool left_out) {
    const auto rank = group_.rank();
    // A bit per rank up to 52 (a double holds them exactly); ranks beyond share the last one.
    const double bit = std::ldexp(1.0, std::min(rank, 52));
    const auto device = params_.empty() ? c10::Device(c10::kCPU) : params_.front().tensor.device();
    // Filled where they are reduced: no copy from host memory, which would make a GPU's host wait.
    auto verdicts = at::zeros({2}, at::TensorOptions().dtype(at::kDouble).device(device));
    if (vote_) verdicts.narrow(0, 0, 1).fill_(1.0);
    if (left_out) verdicts.narrow(0, 1, 1).fill_(bit);
    all_reduce(verdicts, ReduceOp::sum, &group_);
    if (votes_wanted_) votes_.push(verdicts.narrow(0, 0, 1));
    left_out_.push(verdicts.narrow(0, 1, 1));
  }

  // Ranks (by bit) that left parameters without gradient in a backward read back now, or 0.
  std::uint64_t ranks_that_left_out() {
    std::uint64_t mask = 0;
    for (double v : left_out_.take_ready()) mask |= static_cast<std::uint64_t>(v);
    return mask;
  }

  void finalize(std::unique_lock<std::mutex>& lock) {
    std::vector<std::string> unused;
    for (auto& p : params_) {
      if (p.ready) continue;
      // No gradient in this backward: contribute what it holds (earlier no_sync micro-batches) or zeros,
      // so that every rank's buckets still match.
      unused.push_back(p.name);
      p.ready = true;
      stage(p);
      --buckets_[p.bucket].pending;
    }
    launch_ready();
    // NCCL: the step's kernels wait for the buckets on the GPU, and this host goes on; a bucket of an earlier step
    // that failed since, or outlived the timeout, shows here (check_pending). Gloo: the host waits.
    const auto mode = wait_mode(group_.kind());
    try {
      if (mode == WaitMode::stream) check_pending(group_);
    } catch (...) {
      in_backward_ = false;
      throw;
    }
    const bool scattered = scattering();
    stats.scattered = scattered;
    for (std::size_t k = 0; k < buckets_.size(); ++k) {
      const auto what = fmt::format("gradient {} of bucket {} of {} ({} parameters, {} bytes)",
                                    scattered ? "reduce_scatter" : "all_reduce", k, buckets_.size(),
                                    buckets_[k].params.size(), stats.bucket_bytes[k]);
      try {
        if (mode == WaitMode::stream) {
          buckets_[k].work->wait();  // no timeout: only the current stream waits
          group_.pending().add(buckets_[k].work, what, buckets_[k].call);
        } else {
          buckets_[k].work->wait(group_.timeout());
        }
      } catch (const std::exception& e) {
        in_backward_ = false;
        throw DistributedError(fmt::format(
            "{} failed on rank {}: {}.{} A rank that died, hangs, or runs a different model or backward causes this; "
            "the timeout is {} ms",
            what, group_.ranks()[group_.rank()], error_text(e), silent_ranks(group_, buckets_[k].call),
            group_.timeout().count()));
      }
    }
    if (scattered) {
      torch::NoGradGuard no_grad;
      for (std::size_t k = 0; k < buckets_.size(); ++k) {
        auto& b = buckets_[k];
        if (b.scattered.defined()) shares_[k].add_(b.scattered);
        b.scattered = at::Tensor();
        b.flat = at::Tensor();  // the whole bucket lived only while it was reduced
      }
      shares_fresh_ = false;
    } else {
      torch::NoGradGuard no_grad;
      for (auto& p : params_) {
        auto& grad = p.tensor.mutable_grad();
        if (buckets_[p.bucket].in_place) continue;                   // reduced in .grad itself
        if (grad.defined() && is_view_of_bucket(grad, p)) continue;  // already the averaged result
        if (grad.defined()) {
          grad.copy_(p.view);
        } else {
          grad = p.view.to(p.tensor.scalar_type()).clone();
        }
      }
    }
    in_backward_ = false;
    const bool quiet = std::exchange(quiet_unused_, false);
    const bool report_unused = !unused.empty() && !options_.find_unused_parameters && !quiet;
    if (options_.separate_verdicts) {
      try {
        reduce_verdicts(report_unused);
      } catch (...) {
        in_backward_ = false;
        throw;
      }
    } else if (votes_wanted_) {
      votes_.push(vote_slot_);
    }
    const bool first = iterations++ == 0;
    // Every rank rebuilds after its first synchronized backward (the broadcast inside is a collective: the
    // decision must not depend on anything rank-local, such as which parameters went unused here).
    if (first && options_.rebuild_buckets) rebuild_in_arrival_order(lock);
    const auto me = group_.ranks()[group_.rank()];
    if (options_.separate_verdicts) {
      const auto mask = ranks_that_left_out();
      if (mask != 0 && !report_unused) {
        std::string ranks;
        for (int r = 0; r < 53 && r < group_.size(); ++r)
          if (mask & (std::uint64_t{1} << r))
            ranks += fmt::format("{}{}", ranks.empty() ? "" : ", ", group_.ranks()[r]);
        throw DistributedError(fmt::format(
            "rank {}: rank(s) {} left parameters without gradient in a backward (their errors name them); every rank "
            "stops here instead of waiting for the others in the next collective",
            me, ranks));
      }
    }
    if (report_unused) {
      std::string names;
      for (std::size_t k = 0; k < unused.size() && k < 10; ++k) names += (k ? ", " : "") + unused[k];
      throw DistributedError(fmt::format(
          "rank {}: {} parameter(s) got no gradient in this backward: {}{}. Their gradients were averaged as zeros "
          "so the ranks stay in step; if the model leaves parameters unused on purpose, construct the reducer with "
          "find_unused_parameters = true, otherwise check that every parameter takes part in the loss",
          me, unused.size(), names, unused.size() > 10 ? ", ..." : ""));
    }
  }

  // Rank 0's arrival order, shared, so that every rank builds the same buckets, which are then final.
  void rebuild_in_arrival_order(std::unique_lock<std::mutex>&) {
    layout_final_ = true;
    // Arrival order, then the parameters without a gradient (in reverse registration order): a full
    // permutation on every rank, of which rank 0's is shared.
    std::vector<std::int64_t> mine(arrival_.begin(), arrival_.end());
    std::vector<bool> arrived(params_.size(), false);
    for (auto i : arrival_) arrived[i] = true;
    for (std::size_t i = params_.size(); i-- > 0;) {
      if (!arrived[i]) mine.push_back(static_cast<std::int64_t>(i));
    }
    auto order = torch::tensor(mine, torch::kLong);
    if (group_.kind() == BackendKind::nccl) order = order.to(params_.front().tensor.device());
    broadcast(order, group_.ranks().front(), &group_);
    auto cpu = order.cpu();
    std::vector<std::size_t> arrival;
    for (std::int64_t k = 0; k < cpu.numel(); ++k)
      arrival.push_back(static_cast<std::size_t>(cpu[k].item<std::int64_t>()));
    build_buckets(arrival);
  }

  Group& group_;
  GradReducerOptions options_;
  std::vector<at::Tensor> buffers_;
  std::vector<ParamSlot> params_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> arrival_;
  std::size_t next_launch_ = 0;
  std::size_t vote_bucket_ = 0;
  at::Tensor vote_slot_;  ///< the last element of the vote bucket
  bool vote_ = false;
  bool votes_wanted_ = false;
  HostReadback votes_;
  HostReadback left_out_;           ///< separate verdicts: the ranks that left parameters without gradient
  std::vector<at::Tensor> shares_;  ///< scattering: this rank's part of each bucket
  bool shares_fresh_ = true;        ///< the next reduce-scatter writes the shares instead of adding to them
  bool layout_final_ = false;
  const bool debug_ = debug_checks_enabled();
  bool in_backward_ = false;
  bool quiet_unused_ = false;  // finish_backward of a rank whose share reached no parameter
  std::mutex mutex_;
};

GradReducer::GradReducer(std::vector<std::pair<std::string, at::Tensor>> params, std::vector<at::Tensor> buffers,
                         Group& group, GradReducerOptions options)
    : impl_(std::make_unique<Impl>(std::move(params), std::move(buffers), group, options)) {}

GradReducer::~GradReducer() = default;

void GradReducer::broadcast_buffers() { impl_->broadcast_buffers(); }
void GradReducer::set_sync(bool sync) { impl_->sync = sync; }
void GradReducer::vote(bool yes) { impl_->vote(yes); }
bool GradReducer::take_votes() { return impl_->take_votes(); }
bool GradReducer::sync() const { return impl_->sync; }
void GradReducer::finalize_if_pending() { impl_->finalize_if_pending(); }
void GradReducer::finish_backward(bool empty_share) { impl_->finish_backward(empty_share); }
std::size_t GradReducer::bucket_count() const { return impl_->bucket_count(); }
const ReducerStats& GradReducer::last_stats() const { return impl_->stats; }
std::int64_t GradReducer::iterations() const { return impl_->iterations; }
std::vector<std::vector<at::Tensor>> GradReducer::bucket_params() const { return impl_->bucket_params(); }
std::int64_t GradReducer::layout_version() const { return impl_->layout_version; }
bool GradReducer::layout_final() const { return impl_->layout_final(); }
const std::vector<at::Tensor>& GradReducer::shares() const { return impl_->shares(); }
void GradReducer::clear_shares() { impl_->clear_shares(); }

}  // namespace fastlearn
