#include <fastlearn/comm/p2p.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <utility>

namespace fastlearn {

namespace {

constexpr int kFingerprintTag = 1 << 30;  // debug mode: a send's fingerprint goes on tag + this
constexpr int kFingerprintDims = 8;

// dtype, dimensions, then up to 8 sizes: what a receive must match; on `device`, where the backend moves it.
at::Tensor fingerprint_of(const at::Tensor& t, const c10::Device& device) {
  std::vector<std::int64_t> fp(2 + kFingerprintDims, -1);
  fp[0] = static_cast<std::int64_t>(t.scalar_type());
  fp[1] = t.dim();
  for (int d = 0; d < std::min<int>(kFingerprintDims, static_cast<int>(t.dim())); ++d) fp[2 + d] = t.size(d);
  return torch::tensor(fp, torch::kLong).to(device);
}

// Where `g`'s backend moves a tensor of `t`'s device: Gloo only from host memory, NCCL only from a GPU.
c10::Device transport_device(const Group& g, const at::Tensor& t, const std::string& what) {
  if (g.kind() == BackendKind::gloo) return c10::Device(c10::kCPU);
  if (!t.is_cuda()) {
    throw DistributedError(
        fmt::format("{}: the nccl backend moves CUDA tensors only, and this one is on the {}; put it "
                    "on this rank's GPU ({}), or use a gloo group",
                    what, t.device().str(), device_of(g).str()));
  }
  return t.device();
}

// A pinned host tensor like `t`, for Gloo to move a CUDA tensor through.
at::Tensor host_stage(const at::Tensor& t) {
  return at::empty(t.sizes(), t.options().device(c10::kCPU).pinned_memory(true));
}

std::string describe_fingerprint(const at::Tensor& fp) {
  auto cpu = fp.cpu();
  const auto* v = cpu.data_ptr<std::int64_t>();
  std::vector<std::int64_t> dims;
  for (int d = 0; d < std::min<std::int64_t>(kFingerprintDims, v[1]); ++d) dims.push_back(v[2 + d]);
  return fmt::format("{} [{}]", c10::toString(static_cast<c10::ScalarType>(v[0])), fmt::join(dims, ", "));
}

}  // namespace

Request::Request(c10::intrusive_ptr<c10d::Work> work, std::string what, std::chrono::milliseconds timeout)
    : work_(std::move(work)), what_(std::move(what)), timeout_(timeout) {}
Request::~Request() = default;
Request::Request(Request&&) noexcept = default;
Request& Request::operator=(Request&&) noexcept = default;

void Request::check_fingerprint() {
  if (!fingerprint_work_) return;
  auto work = std::exchange(fingerprint_work_, {});
  try {
    work->wait(timeout_);
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format("{} on rank {} failed in the debug check: {}", what_, rank(), error_text(e)));
  }
  if (!tensor_.defined()) return;  // a send: its fingerprint is on its way
  if (source_ < 0) source_ = group_->ranks()[static_cast<std::size_t>(work->sourceRank())];
  const auto mine = fingerprint_of(tensor_, fingerprint_.device());
  if (!torch::equal(mine, fingerprint_)) {
    throw DistributedError(fmt::format(
        "mismatched point-to-point calls (debug mode): rank {} sends {} (tag {}) but rank {} receives into {}", source_,
        describe_fingerprint(fingerprint_), tag_, rank(), describe_fingerprint(mine)));
  }
  if (!work_) {  // the fingerprint matched (and names the sender): now receive the data
    std::vector<at::Tensor> tensors{transfer_};
    work_ = group_->backend().recv(tensors, group_->group_rank_of(source_), tag_);
  }
}

void Request::wait() {
  check_fingerprint();
  if (!work_) throw DistributedError("Request::wait: an empty request");
  try {
    work_->wait(timeout_);
  } catch (const std::exception& e) {
    throw DistributedError(
        fmt::format("{} on rank {} failed: {}. A peer that died, hangs or never made the matching "
                    "call causes this; the timeout is {} ms",
                    what_, rank(), error_text(e), timeout_.count()));
  }
  if (copy_back_) {
    tensor_.copy_(transfer_);
    copy_back_ = false;
  }
}

bool Request::is_completed() const { return work_ && work_->isCompleted(); }

int Request::source_rank() const {
  if (source_ >= 0) return source_;
  if (!work_) throw DistributedError("Request::source_rank: an empty request");
  const int group_rank = work_->sourceRank();
  return group_ranks_ ? (*group_ranks_)[static_cast<std::size_t>(group_rank)] : group_rank;
}

namespace {

Group& p2p_group(Group* group, const char* what) {
  Group* g = group_or_world(group);
  if (!g) throw DistributedError(fmt::format("{}: a single process has no peer to talk to", what));
  return *g;
}
}  // namespace

Request isend(const at::Tensor& tensor, int dst, int tag, Group* group) {
  auto& g = p2p_group(group, "isend");
  const auto what = fmt::format("send of {} to rank {} (tag {})", describe_tensor(tensor), dst, tag);
  const auto device = transport_device(g, tensor, what);
  // A host copy for Gloo is made now (the copy waits for the tensor's stream): the tensor may change after isend.
  auto transfer = tensor.device() == device ? tensor.contiguous() : host_stage(tensor).copy_(tensor);
  std::vector<at::Tensor> tensors{transfer};
  try {
    c10::intrusive_ptr<c10d::Work> fingerprint;
    if (debug_checks_enabled()) {
      std::vector<at::Tensor> fp{fingerprint_of(tensor, device)};
      fingerprint = g.backend().send(fp, g.group_rank_of(dst), tag + kFingerprintTag);
    }
    Request request(g.backend().send(tensors, g.group_rank_of(dst), tag), what, g.timeout());
    request.fingerprint_work_ = std::move(fingerprint);
    request.transfer_ = std::move(transfer);  // alive until the send is done
    return request;
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format("{} on rank {} could not start: {}", what, rank(), error_text(e)));
  }
}

Request irecv(const at::Tensor& tensor, std::optional<int> src, int tag, Group* group) {
  auto& g = p2p_group(group, "irecv");
  if (!tensor.is_contiguous()) throw DistributedError("irecv: the receiving tensor must be contiguous");
  const auto what = src ? fmt::format("recv of {} from rank {} (tag {})", describe_tensor(tensor), *src, tag)
                        : fmt::format("recv of {} from any rank (tag {})", describe_tensor(tensor), tag);
  const auto device = transport_device(g, tensor, what);
  const bool staged = tensor.device() != device;
  const auto transfer = staged ? host_stage(tensor) : tensor;
  std::vector<at::Tensor> tensors{transfer};
  try {
    if (debug_checks_enabled()) {
      Request request({}, what, g.timeout());
      request.group_ranks_ = g.ranks();
      request.group_ = &g;
      request.tensor_ = tensor;
      request.transfer_ = transfer;
      request.copy_back_ = staged;
      request.tag_ = tag;
      request.fingerprint_ =
          torch::empty({2 + kFingerprintDims}, torch::TensorOptions().dtype(torch::kLong).device(device));
      std::vector<at::Tensor> fp{request.fingerprint_};
      // The data's receive is posted once the fingerprint matched (check_fingerprint), so that a mismatched
      // message is never received into the wrong tensor.
      if (src) {
        request.source_ = *src;
        request.fingerprint_work_ = g.backend().recv(fp, g.group_rank_of(*src), tag + kFingerprintTag);
      } else {
        request.fingerprint_work_ = g.backend().recvAnysource(fp, tag + kFingerprintTag);
      }
      return request;
    }
    auto work = src ? g.backend().recv(tensors, g.group_rank_of(*src), tag) : g.backend().recvAnysource(tensors, tag);
    Request request(std::move(work), what, g.timeout());
    request.group_ranks_ = g.ranks();
    request.tensor_ = tensor;
    request.transfer_ = transfer;
    request.copy_back_ = staged;
    return request;
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError(fmt::format("{} on rank {} could not start: {}", what, rank(), error_text(e)));
  }
}

void send(const at::Tensor& tensor, int dst, int tag, Group* group) { isend(tensor, dst, tag, group).wait(); }

int recv(const at::Tensor& tensor, std::optional<int> src, int tag, Group* group) {
  auto request = irecv(tensor, src, tag, group);
  request.wait();
  return src ? *src : request.source_rank();
}

}  // namespace fastlearn
