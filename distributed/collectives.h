#pragma once
// Collectives and point-to-point messages over a process group (the world group when `group` is null),
// blocking unless named i*. Ranks are global ranks. Tensors are changed in place. Every failure (a
// timeout, a dead peer) is a DistributedError naming the operation, the tensor, this rank and the timeout.
// With one process and nothing set up, the collectives are no-ops (the tensor is already the result).
#include <fastlearn/distributed/group.h>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Work;
}

namespace fastlearn {

enum class ReduceOp { sum, product, min, max, avg };

std::string_view to_string(ReduceOp op);

/// A pending point-to-point operation. In debug mode a send first sends a fingerprint of its tensor
/// (dtype and shape, on tag + 2^30) and the receive checks it, so mismatched calls fail naming both ranks.
class Request {
 public:
  Request() = default;
  Request(c10::intrusive_ptr<c10d::Work> work, std::string what, std::chrono::milliseconds timeout);
  ~Request();
  Request(Request&&) noexcept;
  Request& operator=(Request&&) noexcept;
  /// Blocks until done; DistributedError naming the operation on failure or timeout.
  void wait();
  bool is_completed() const;
  /// For irecv from any source: the rank the message came from (after wait()).
  int source_rank() const;

 private:
  c10::intrusive_ptr<c10d::Work> work_;
  std::string what_;
  std::chrono::milliseconds timeout_{};
  std::optional<std::vector<int>> group_ranks_;
  // Debug mode: the fingerprint exchanged before the data; for a receive from any rank the data's receive is
  // posted once the fingerprint names the sender.
  c10::intrusive_ptr<c10d::Work> fingerprint_work_;
  at::Tensor fingerprint_, tensor_;
  Group* group_ = nullptr;
  int tag_ = 0;
  int source_ = -1;  // global rank, once known
  void check_fingerprint();
  friend Request isend(const at::Tensor&, int, int, Group*);
  friend Request irecv(const at::Tensor&, std::optional<int>, int, Group*);
};

/// After call `call` (Group::next_call) failed on this rank: tells the other members through the store, waits
/// briefly for theirs, and returns " Rank(s) R never reached this call (...)" naming the members that did not
/// fail in it too (they hang elsewhere or died), or "" when every member reached it.
std::string silent_ranks(Group& group, std::int64_t call);

/// Debug mode (debug_checks_enabled()): checks that every rank of `group` makes an all_reduce of a tensor like
/// `tensor` as its next collective, else a DistributedError naming each rank's call. For code that calls the
/// c10d backend itself (the GradReducer's bucket all-reduces). A no-op when debug checks are off.
void debug_check_all_reduce(const at::Tensor& tensor, Group& group);

/// Copies `tensor` of rank `src` into every rank's `tensor`.
void broadcast(const at::Tensor& tensor, int src, Group* group = nullptr);
/// Reduces every rank's `tensor` into the one of rank `dst` (others keep an unspecified value).
void reduce(const at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum, Group* group = nullptr);
/// Every rank's `tensor` becomes the reduction of all of them. avg divides the sum by the group size
/// (exactly, also on Gloo, which has no average); integer tensors cannot be averaged.
void all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::sum, Group* group = nullptr);
/// Rank `src` sends inputs[i] to the rank of group rank i; `inputs` is ignored elsewhere.
void scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src, Group* group = nullptr);
/// Rank `dst` receives every rank's `input` in `outputs` (group-rank order; one per rank, shaped like input).
void gather(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst, Group* group = nullptr);
/// Every rank receives every rank's `input` in `outputs` (group-rank order).
void all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, Group* group = nullptr);
/// Waits until every rank of the group arrives.
void barrier(Group* group = nullptr);

/// Sends `tensor` to rank `dst`.
void send(const at::Tensor& tensor, int dst, int tag = 0, Group* group = nullptr);
/// Receives into `tensor` from rank `src` (any rank when empty); returns the sender's rank.
int recv(const at::Tensor& tensor, std::optional<int> src = {}, int tag = 0, Group* group = nullptr);
Request isend(const at::Tensor& tensor, int dst, int tag = 0, Group* group = nullptr);
Request irecv(const at::Tensor& tensor, std::optional<int> src = {}, int tag = 0, Group* group = nullptr);

}  // namespace fastlearn
