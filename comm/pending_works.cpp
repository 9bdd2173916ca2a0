#include <fastlearn/comm/pending_works.h>

#include <fastlearn/comm/process_group.h>

#include <fmt/format.h>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <exception>

namespace fastlearn {

WaitMode wait_mode(BackendKind kind, bool barrier) {
  return kind == BackendKind::nccl && !barrier ? WaitMode::stream : WaitMode::host;
}

void PendingWorks::add(c10::intrusive_ptr<c10d::Work> work, std::string what, std::int64_t call,
                       Clock::time_point started) {
  std::lock_guard lock(mutex_);
  entries_.push_back({.work = std::move(work), .what = std::move(what), .call = call, .started = started});
}

namespace {

std::string reason_of(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return error_text(e);
  } catch (...) {
    return "an unknown error";
  }
}

}  // namespace

void PendingWorks::clear() {
  std::lock_guard lock(mutex_);
  entries_.clear();
}

std::size_t PendingWorks::size() const {
  std::lock_guard lock(mutex_);
  return entries_.size();
}

std::optional<PendingWorks::Failure> PendingWorks::check(std::chrono::milliseconds timeout, Clock::time_point now,
                                                         const std::string& backend_error) {
  std::lock_guard lock(mutex_);
  // The backend's error first: after NCCL's watchdog aborted the communicator, the aborted works count as complete
  // and hold no exception (the watchdog marked its own copy of them), so only the backend still tells.
  if (!backend_error.empty()) {
    if (entries_.empty()) return Failure{.what = "a collective of this group", .call = -1, .reason = backend_error};
    return Failure{.what = entries_.front().what, .call = entries_.front().call, .reason = backend_error};
  }
  for (auto it = entries_.begin(); it != entries_.end();) {
    auto& e = *it;
    bool completed = false;
    std::exception_ptr failure;
    try {
      completed = e.work->isCompleted();  // a CUDA error on the device makes its event query throw
      failure = e.work->exception();
    } catch (...) {
      failure = std::current_exception();
    }
    if (failure) return Failure{.what = e.what, .call = e.call, .reason = reason_of(failure)};
    if (completed) {
      it = entries_.erase(it);
      continue;
    }
    const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(now - e.started);
    if (waited > timeout)
      return Failure{
          .what = e.what,
          .call = e.call,
          .reason = fmt::format("not done after {} ms (the timeout is {} ms)", waited.count(), timeout.count())};
    ++it;
  }
  return std::nullopt;
}

}  // namespace fastlearn
