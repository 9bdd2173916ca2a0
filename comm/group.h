#pragma once
// A process group: some ranks of the job (all of them for the world group) and the c10d backend that
// connects them. Collectives name ranks by their global rank; the group maps them to its own.
#include <fastlearn/comm/pending_works.h>
#include <fastlearn/comm/process_group.h>

#include <c10/core/Device.h>
#include <c10/util/intrusive_ptr.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace c10d {
class Backend;
}

namespace fastlearn {

class Group {
 public:
  /// `backend` is null on ranks that are not members.
  Group(std::string name, std::vector<int> ranks, int global_rank, c10::intrusive_ptr<c10d::Backend> backend,
        BackendKind kind, std::chrono::milliseconds timeout);
  ~Group();

  const std::string& name() const { return name_; }
  /// Global ranks of the members, in group-rank order.
  const std::vector<int>& ranks() const { return ranks_; }
  int size() const { return static_cast<int>(ranks_.size()); }
  bool is_member() const { return group_rank_ >= 0; }
  /// This process's rank in the group (-1 when not a member).
  int rank() const { return group_rank_; }
  /// The group rank of global rank `global`; DistributedError when it is not a member.
  int group_rank_of(int global) const;
  BackendKind kind() const { return kind_; }
  /// The device of the tensors its collectives take, when the group says it itself (groups whose ranks are
  /// threads of one process, each on its own device); otherwise device_of(group) derives it from the job.
  const std::optional<c10::Device>& device() const { return device_; }
  void set_device(c10::Device device) { device_ = device; }
  std::chrono::milliseconds timeout() const { return timeout_; }
  /// The backend; DistributedError when this process is not a member.
  c10d::Backend& backend() const;
  c10::intrusive_ptr<c10d::Backend> backend_ptr() const;
  /// Shuts the backend down (abort: after a failure, without waiting for peers); later calls do nothing.
  /// The destructor shuts down a group not closed before.
  void close(bool abort = false);
  /// Number of collectives issued so far (for the debug checks).
  std::int64_t next_sequence() { return sequence_++; }
  /// Numbers every collective this process starts in the group (the same sequence on every member), so
  /// that after a failure the members can tell which of them never reached a call.
  std::int64_t next_call() { return calls_++; }
  /// The group's collectives that only the GPU waits for (NCCL), checked without blocking at the next collective
  /// (collectives.h: check_pending).
  PendingWorks& pending() { return pending_; }

 private:
  std::string name_;
  std::vector<int> ranks_;
  int group_rank_ = -1;
  c10::intrusive_ptr<c10d::Backend> backend_;
  BackendKind kind_;
  std::optional<c10::Device> device_;
  std::chrono::milliseconds timeout_;
  std::int64_t sequence_ = 0;
  std::atomic<std::int64_t> calls_{0};
  PendingWorks pending_;
  std::atomic<bool> closed_{false};  // close() may come from two threads (a failing one aborts)
};

using GroupPtr = std::shared_ptr<Group>;

}  // namespace fastlearn
