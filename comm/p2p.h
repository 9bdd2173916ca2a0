#pragma once
// Point-to-point messages between ranks of a process group (the world group when `group` is null), blocking
// unless named i*. Ranks are global ranks. Every failure (a timeout, a dead peer) is a DistributedError naming
// the operation, the tensor, this rank and the timeout. NCCL sends CUDA tensors only. Gloo has no CUDA transport:
// a CUDA tensor goes through a pinned host copy (a send copies it when it starts; a receive copies into it when
// its wait() returns).
#include <fastlearn/comm/group.h>

#include <ATen/core/Tensor.h>
#include <c10/util/intrusive_ptr.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Work;
}

namespace fastlearn {

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
  // What the backend reads or writes: tensor_ itself, or its host copy when Gloo moves a CUDA tensor (a receive
  // then copies it into tensor_ once done).
  at::Tensor transfer_;
  bool copy_back_ = false;
  Group* group_ = nullptr;
  int tag_ = 0;
  int source_ = -1;  // global rank, once known
  void check_fingerprint();
  friend Request isend(const at::Tensor&, int, int, Group*);
  friend Request irecv(const at::Tensor&, std::optional<int>, int, Group*);
};

/// Sends `tensor` to rank `dst`.
void send(const at::Tensor& tensor, int dst, int tag = 0, Group* group = nullptr);
/// Receives into `tensor` from rank `src` (any rank when empty); returns the sender's rank.
int recv(const at::Tensor& tensor, std::optional<int> src = {}, int tag = 0, Group* group = nullptr);
Request isend(const at::Tensor& tensor, int dst, int tag = 0, Group* group = nullptr);
Request irecv(const at::Tensor& tensor, std::optional<int> src = {}, int tag = 0, Group* group = nullptr);

}  // namespace fastlearn
