#pragma once
// Fiber: a function that runs on a stack of its own but on the thread that resumes it, in turns with that thread's
// code. resume() runs the body until it calls suspend() or returns; suspend() goes back to the resume() that ran it.
// Nothing runs concurrently, so the body's ATen work uses the resuming thread's OpenMP team instead of starting a
// second team beside it (what a thread of its own would do). The step API runs a whole fit this way.
//
// Thread-local state is the thread's, shared by both sides: the caller of resume() swaps what must differ (see
// learner/step_session.cpp). The body must not suspend while it handles an exception (the thread's record of caught
// exceptions is shared too). A fiber may be resumed on another thread than the last one, one at a time, when no frame
// on its stack keeps the address of a thread_local across a suspend (compilers may compute it once per function): the
// step API's frames reach thread-locals only through calls into other functions.
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>

namespace fastlearn {

class Fiber {
 public:
  /// Makes the fiber; `body` first runs at the first resume(). `stack_bytes`: the fiber's stack (reserved, its pages
  /// used as it grows; a guard page below it turns an overflow into a fault, not a corruption).
  explicit Fiber(std::function<void()> body, std::size_t stack_bytes = std::size_t{8} << 20);
  /// Requires the body to have returned (or never started); a suspended body's stack cannot be unwound from outside.
  ~Fiber();
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;

  /// Runs the body, on the calling thread, until it suspends or returns. When it returned by an exception, rethrows it
  /// (once). Error when called from inside the body or after the body returned.
  void resume();
  /// From inside the body: back to the resume() that runs it, until the next resume().
  void suspend();

  bool started() const;
  bool finished() const;
  /// Whether the calling code runs inside this fiber's body (on this thread: another thread may be inside meanwhile).
  bool inside() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace fastlearn
