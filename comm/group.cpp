#include <fastlearn/comm/group.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include <algorithm>

namespace fastlearn {

Group::Group(std::string name, std::vector<int> ranks, int global_rank, c10::intrusive_ptr<c10d::Backend> backend,
             BackendKind kind, std::chrono::milliseconds timeout)
    : name_(std::move(name)), ranks_(std::move(ranks)), backend_(std::move(backend)), kind_(kind), timeout_(timeout) {
  auto it = std::find(ranks_.begin(), ranks_.end(), global_rank);
  group_rank_ = it == ranks_.end() ? -1 : static_cast<int>(it - ranks_.begin());
}

Group::~Group() {
  try {
    close();
  } catch (...) {  // a destructor must not throw; close_backend already falls back to abort
  }
}

void Group::close(bool abort) {
  if (closed_.exchange(true)) return;
  if (backend_) close_backend(*backend_, abort);
  pending_.clear();
}

int Group::group_rank_of(int global) const {
  auto it = std::find(ranks_.begin(), ranks_.end(), global);
  if (it == ranks_.end()) {
    throw DistributedError(
        fmt::format("rank {} is not a member of group '{}' (ranks [{}])", global, name_, fmt::join(ranks_, ", ")));
  }
  return static_cast<int>(it - ranks_.begin());
}

c10::intrusive_ptr<c10d::Backend> Group::backend_ptr() const { return backend_; }

c10d::Backend& Group::backend() const {
  if (!backend_) {
    throw DistributedError(
        fmt::format("this process is not a member of group '{}' (ranks [{}]); only members may "
                    "use it",
                    name_, fmt::join(ranks_, ", ")));
  }
  return *backend_;
}

}  // namespace fastlearn
