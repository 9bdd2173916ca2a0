// Fibers over glibc's ucontext: makecontext gives the body its stack, swapcontext switches (one system call each way,
// for the signal mask: well under a microsecond, against the two thread wake-ups a hand-off between threads costs).
#include <fastlearn/core/detail/fiber.h>

#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <thread>

namespace fastlearn {

struct Fiber::State {
  std::function<void()> body;
  ucontext_t outside{};  // where suspend() and the body's end go back to
  ucontext_t inside{};
  void* mapping = nullptr;
  std::size_t mapping_bytes = 0;
  bool started = false;
  std::atomic<std::thread::id> runner{};  // the thread running the body now (none: the body is not running)
  bool finished = false;
  std::exception_ptr error;

  // makecontext passes int arguments: the State's address in two halves.
  static void entry(unsigned int high, unsigned int low) {
    auto* self = reinterpret_cast<State*>((static_cast<std::uintptr_t>(high) << 32) | low);
    try {
      self->body();
    } catch (...) {
      self->error = std::current_exception();
    }
    self->finished = true;
    self->runner = std::thread::id{};
    swapcontext(&self->inside, &self->outside);  // never resumed again
    std::terminate();
  }
};

Fiber::Fiber(std::function<void()> body, std::size_t stack_bytes) : state_(std::make_unique<State>()) {
  state_->body = std::move(body);
  const auto page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
  stack_bytes = (stack_bytes + page - 1) / page * page;
  state_->mapping_bytes = stack_bytes + page;
  void* mapping =
      mmap(nullptr, state_->mapping_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
  if (mapping == MAP_FAILED)
    throw Error(fmt::format("Fiber: cannot map a stack of {} bytes: {}", stack_bytes, std::strerror(errno)));
  state_->mapping = mapping;
  if (mprotect(mapping, page, PROT_NONE) != 0) {  // the guard page: stacks grow down
    munmap(mapping, state_->mapping_bytes);
    throw Error(fmt::format("Fiber: cannot protect the stack's guard page: {}", std::strerror(errno)));
  }
  if (getcontext(&state_->inside) != 0) {
    munmap(mapping, state_->mapping_bytes);
    throw Error(fmt::format("Fiber: getcontext failed: {}", std::strerror(errno)));
  }
  state_->inside.uc_stack.ss_sp = static_cast<char*>(mapping) + page;
  state_->inside.uc_stack.ss_size = stack_bytes;
  state_->inside.uc_link = nullptr;
  const auto address = reinterpret_cast<std::uintptr_t>(state_.get());
  makecontext(&state_->inside, reinterpret_cast<void (*)()>(&State::entry), 2, static_cast<unsigned int>(address >> 32),
              static_cast<unsigned int>(address & 0xffffffffU));
}

Fiber::~Fiber() {
  // A body suspended mid-way keeps objects alive on its stack: unmapping it leaks them, which beats running their
  // destructors out of order. The owner ends the body first (StepRunner::finish).
  if (state_->mapping) munmap(state_->mapping, state_->mapping_bytes);
}

void Fiber::resume() {
  if (state_->runner.load() != std::thread::id{}) throw Error("Fiber::resume: called from inside the fiber");
  if (state_->finished) throw Error("Fiber::resume: the fiber's body has returned");
  state_->started = true;
  state_->runner = std::this_thread::get_id();
  if (swapcontext(&state_->outside, &state_->inside) != 0) {
    state_->runner = std::thread::id{};
    throw Error(fmt::format("Fiber::resume: swapcontext failed: {}", std::strerror(errno)));
  }
  if (state_->finished && state_->error) std::rethrow_exception(std::exchange(state_->error, nullptr));
}

void Fiber::suspend() {
  const auto runner = state_->runner.exchange(std::thread::id{});
  if (runner == std::thread::id{}) throw Error("Fiber::suspend: called outside the fiber");
  if (swapcontext(&state_->inside, &state_->outside) != 0) {
    state_->runner = runner;
    throw Error(fmt::format("Fiber::suspend: swapcontext failed: {}", std::strerror(errno)));
  }
}

bool Fiber::started() const { return state_->started; }
bool Fiber::finished() const { return state_->finished; }
bool Fiber::inside() const { return state_->runner.load() == std::this_thread::get_id(); }

}  // namespace fastlearn
