#include <fastlearn/comm/detail/shared_memory_backend.h>

#include <fastlearn/comm/detail/fold.h>
#include <fastlearn/comm/process_group.h>
#include <fastlearn/core/error.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <torch/torch.h>
#include <unistd.h>

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <new>
#include <random>
#include <string>
#include <vector>

namespace fastlearn {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::uint32_t segment_magic = 0x464c534d;       // "FLSM"
constexpr std::size_t slot_bytes = std::size_t{1} << 20;  // larger tensors go through in chunks
constexpr std::size_t page = 4096;
constexpr auto spin_time = std::chrono::microseconds(50);    // before sleeping: ranks in step arrive within this
constexpr auto sleep_slice = std::chrono::milliseconds(10);  // between checks for a dead or failed peer

struct alignas(64) Header {
  std::uint32_t magic;
  std::int32_t world_size;
  std::atomic<std::int32_t> gave_up;    ///< the first rank that failed or aborted, else -1
  std::atomic<std::uint32_t> sleepers;  ///< ranks asleep on some futex: arrivals must wake them
};

struct alignas(64) Control {
  std::atomic<std::uint32_t> arrived;  ///< the last phase this rank reached (the futex word)
  std::atomic<std::int32_t> pid;
};

std::size_t data_offset(int world_size) {
  const std::size_t end = sizeof(Header) + sizeof(Control) * static_cast<std::size_t>(world_size);
  return (end + page - 1) / page * page;
}

// Two sets of slots: a rank may start phase p+1 while a slower one still reads phase p.
std::size_t segment_bytes(int world_size) {
  return data_offset(world_size) + 2 * static_cast<std::size_t>(world_size) * slot_bytes;
}

// Whether phase `seen` is at or after `target` (phases count up and may wrap).
bool reached(std::uint32_t seen, std::uint32_t target) { return static_cast<std::int32_t>(seen - target) >= 0; }

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t seen, std::chrono::nanoseconds timeout) {
  timespec ts{static_cast<time_t>(timeout.count() / 1'000'000'000), static_cast<long>(timeout.count() % 1'000'000'000)};
  // Not FUTEX_PRIVATE_FLAG: the word is shared between processes.
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT, seen, &ts, nullptr, 0);
}

void futex_wake(std::atomic<std::uint32_t>& word) {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Whether process `pid` has ended (gone, or a zombie its parent has not reaped yet).
bool process_ended(std::int32_t pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return false;
  const auto close = line.rfind(')');
  return close != std::string::npos && close + 2 < line.size() && (line[close + 2] == 'Z' || line[close + 2] == 'X');
}

// A mapping of the segment; unmapped when destroyed.
class Mapping {
 public:
  Mapping(void* base, std::size_t bytes) : base_(static_cast<std::byte*>(base)), bytes_(bytes) {}
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() { ::munmap(base_, bytes_); }
  std::byte* base() const { return base_; }

 private:
  std::byte* base_;
  std::size_t bytes_;
};

std::unique_ptr<Mapping> map_segment(const std::string& name, int world_size, bool create) {
  const int fd =
      create ? ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600) : ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw DistributedError(fmt::format("shm_open({}) failed: {}", name, std::strerror(errno)));
  const auto bytes = segment_bytes(world_size);
  // Reserving the pages now turns a full /dev/shm into this error instead of a SIGBUS in some collective.
  if (create) {
    const int err =
        ::ftruncate(fd, static_cast<off_t>(bytes)) != 0 ? errno : ::posix_fallocate(fd, 0, static_cast<off_t>(bytes));
    if (err != 0) {
      ::close(fd);
      ::shm_unlink(name.c_str());
      throw DistributedError(
          fmt::format("could not reserve {} MiB in /dev/shm for {}: {}", bytes >> 20, name, std::strerror(err)));
    }
  }
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  const int map_error = errno;
  ::close(fd);
  if (base == MAP_FAILED) {
    if (create) ::shm_unlink(name.c_str());
    throw DistributedError(fmt::format("mmap of {} ({} bytes) failed: {}", name, bytes, std::strerror(map_error)));
  }
  return std::make_unique<Mapping>(base, bytes);
}

// A Work that is complete when returned: the shared memory operations finish before the call does.
class FinishedWork final : public c10d::Work {
 public:
  FinishedWork(int rank, c10d::OpType type, std::exception_ptr error) : Work(rank, type) { finish(std::move(error)); }
};

class SharedMemoryBackend final : public c10d::Backend {
 public:
  SharedMemoryBackend(c10::intrusive_ptr<c10d::Backend> gloo, std::unique_ptr<Mapping> mapping, int rank,
                      int world_size, std::chrono::milliseconds timeout)
      : Backend(rank, world_size), gloo_(std::move(gloo)), mapping_(std::move(mapping)), timeout_(timeout) {}

  const std::string getBackendName() const override { return std::string(shared_memory_backend_name); }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& options) override {
    if (!handles(tensors) || !reducible(options.reduceOp, tensors.front().scalar_type())) {
      return gloo_->allreduce(tensors, options);
    }
    return run(c10d::OpType::ALLREDUCE, [&] { all_reduce(tensors.front(), options.reduceOp); });
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& options) override {
    if (!handles(tensors)) return gloo_->broadcast(tensors, options);
    return run(c10d::OpType::BROADCAST, [&] { broadcast_from(tensors.front(), static_cast<int>(options.rootRank)); });
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return run(c10d::OpType::BARRIER, [&] {
      next_phase();
      arrive_and_wait("barrier");
    });
  }

  // The flat collectives of sharded training; what the slots do not handle (or Gloo's avg) goes to Gloo.
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& options) override {
    if (!handles({output}) || !handles({input}) || input.numel() != output.numel() * size_ ||
        input.scalar_type() != output.scalar_type() || !reducible(options.reduceOp, input.scalar_type())) {
      return gloo_->_reduce_scatter_base(output, input, options);
    }
    return run(c10d::OpType::_REDUCE_SCATTER_BASE, [&] { reduce_scatter_parts(output, input, options.reduceOp); });
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& options) override {
    if (!handles({output}) || !handles({input}) || output.numel() != input.numel() * size_ ||
        input.scalar_type() != output.scalar_type()) {
      auto separate = input.is_alias_of(output) ? input.clone() : input;  // Gloo may write before it reads
      return gloo_->_allgather_base(output, separate, options);
    }
    return run(c10d::OpType::_ALLGATHER_BASE, [&] { gather_parts(output, input); });
  }

  // The rest goes to Gloo, unchanged.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& options) override {
    return gloo_->reduce(tensors, options);
  }
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& options) override {
    return gloo_->allgather(outputs, inputs, options);
  }
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& options) override {
    return gloo_->gather(outputs, inputs, options);
  }
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& options) override {
    return gloo_->scatter(outputs, inputs, options);
  }
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    return gloo_->send(tensors, dst, tag);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return gloo_->recv(tensors, src, tag);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return gloo_->recvAnysource(tensors, tag);
  }

  // Peers waiting on this rank fail at once instead of at their timeout (Gloo itself needs no abort).
  void abort() override { give_up(); }

 private:
  Header& header() const { return *std::launder(reinterpret_cast<Header*>(mapping_->base())); }
  Control& control(int r) const {
    return std::launder(reinterpret_cast<Control*>(mapping_->base() + sizeof(Header)))[r];
  }
  std::byte* slot(int set, int r) const {
    return mapping_->base() + data_offset(size_) +
           (static_cast<std::size_t>(set) * static_cast<std::size_t>(size_) + static_cast<std::size_t>(r)) * slot_bytes;
  }

  static bool handles(const std::vector<at::Tensor>& tensors) {
    if (tensors.size() != 1) return false;
    const auto& t = tensors.front();
    return t.defined() && t.device().is_cpu() && t.layout() == at::kStrided && t.is_contiguous() && !t.is_complex() &&
           t.scalar_type() != at::kBool;
  }

  static bool reducible(const c10d::ReduceOp& op, at::ScalarType dtype) {
    switch (op.op_) {
      case c10d::ReduceOp::SUM:
      case c10d::ReduceOp::PRODUCT:
      case c10d::ReduceOp::MIN:
      case c10d::ReduceOp::MAX:
        return at::isFloatingType(dtype) || at::isIntegralType(dtype, /*includeBool=*/false);
      default:
        return false;
    }
  }

  template <typename Body>
  c10::intrusive_ptr<c10d::Work> run(c10d::OpType type, Body&& body) {
    std::exception_ptr error;
    try {
      body();
    } catch (...) {
      error = std::current_exception();
      give_up();
    }
    return c10::make_intrusive<FinishedWork>(rank_, type, error);
  }

  // Each phase uses the other set of slots than the one before.
  int next_phase() { return static_cast<int>(++phase_ & 1U); }

  void all_reduce(const at::Tensor& tensor, const c10d::ReduceOp& op) {
    auto flat = tensor.view({-1});
    const auto options = tensor.options();
    const auto item = static_cast<std::int64_t>(tensor.element_size());
    const auto per_chunk = static_cast<std::int64_t>(slot_bytes) / item;
    for (std::int64_t first = 0; first < flat.numel(); first += per_chunk) {
      const auto n = std::min(per_chunk, flat.numel() - first);
      const int set = next_phase();
      auto out = flat.narrow(0, first, n);
      std::memcpy(slot(set, rank_), out.data_ptr(), static_cast<std::size_t>(n * item));
      arrive_and_wait("all_reduce");
      // Every rank combines the slots in rank order: the same bits on every rank.
      auto from = [&](int r) { return at::from_blob(slot(set, r), {n}, options); };
      for (int r = 1; r < size_; ++r) fold_into(out, r == 1 ? from(0) : out, from(r), op.op_);
    }
  }

  // Chunk by chunk of each part: every rank copies its input's piece of every part into its slot, then sums piece
  // `rank_` of every slot, in rank order, into its output (written only after every slot was filled, so the output
  // may be a view of the input).
  void reduce_scatter_parts(const at::Tensor& output, const at::Tensor& input, const c10d::ReduceOp& op) {
    const auto part = output.numel();
    const auto item = static_cast<std::int64_t>(input.element_size());
    const auto per_chunk = std::max<std::int64_t>(1, static_cast<std::int64_t>(slot_bytes) / item / size_);
    auto in = input.view({-1});
    auto out = output.view({-1});
    const auto options = input.options();
    for (std::int64_t first = 0; first < part; first += per_chunk) {
      const auto n = std::min(per_chunk, part - first);
      const int set = next_phase();
      auto* mine = slot(set, rank_);
      for (int r = 0; r < size_; ++r) {
        std::memcpy(mine + static_cast<std::size_t>(r * n * item),
                    static_cast<const std::byte*>(in.data_ptr()) + static_cast<std::size_t>((r * part + first) * item),
                    static_cast<std::size_t>(n * item));
      }
      arrive_and_wait("reduce_scatter");
      auto from = [&](int r) {
        return at::from_blob(slot(set, r) + static_cast<std::size_t>(rank_ * n * item), {n}, options);
      };
      auto target = out.narrow(0, first, n);
      if (size_ == 1) target.copy_(from(0));
      for (int r = 1; r < size_; ++r) fold_into(target, r == 1 ? from(0) : target, from(r), op.op_);
    }
  }

  // Chunk by chunk: every rank copies a piece of its input into its slot, then every slot's piece into its place in
  // the output.
  void gather_parts(const at::Tensor& output, const at::Tensor& input) {
    const auto bytes = input.nbytes();
    const auto* in = static_cast<const std::byte*>(input.data_ptr());
    auto* out = static_cast<std::byte*>(output.data_ptr());
    for (std::size_t first = 0; first < bytes; first += slot_bytes) {
      const auto n = std::min(slot_bytes, bytes - first);
      const int set = next_phase();
      std::memcpy(slot(set, rank_), in + first, n);
      arrive_and_wait("all_gather_into");
      for (int r = 0; r < size_; ++r) {
        auto* to = out + static_cast<std::size_t>(r) * bytes + first;
        if (to != in + first) std::memcpy(to, slot(set, r), n);  // an input that is this part is there already
      }
    }
  }

  void broadcast_from(const at::Tensor& tensor, int root) {
    auto* data = static_cast<std::byte*>(tensor.data_ptr());
    const auto bytes = tensor.nbytes();
    for (std::size_t first = 0; first < bytes; first += slot_bytes) {
      const auto n = std::min(slot_bytes, bytes - first);
      const int set = next_phase();
      if (rank_ == root) std::memcpy(slot(set, root), data + first, n);
      arrive_and_wait("broadcast");
      if (rank_ != root) std::memcpy(data + first, slot(set, root), n);
    }
  }

  void arrive_and_wait(const char* what) {
    control(rank_).arrived.store(phase_);
    if (header().sleepers.load() != 0) futex_wake(control(rank_).arrived);
    // One timeout for the whole phase, however many peers it waits for.
    const auto deadline = Clock::now() + timeout_;
    for (int r = 0; r < size_; ++r) {
      if (r != rank_) wait_for(r, what, deadline);
    }
  }

  void wait_for(int peer, const char* what, Clock::time_point deadline) {
    auto& word = control(peer).arrived;
    const auto spin_end = Clock::now() + spin_time;
    for (int i = 1;; ++i) {
      if (reached(word.load(std::memory_order_acquire), phase_)) return;
      if (i % 64 == 0 && Clock::now() > spin_end) break;
      cpu_relax();
    }
    for (;;) {
      header().sleepers.fetch_add(1);
      const auto seen = word.load();
      // A peer that arrives after this load changes the word, so the futex returns at once.
      if (!reached(seen, phase_)) futex_wait(word, seen, sleep_slice);
      header().sleepers.fetch_sub(1);
      if (reached(word.load(std::memory_order_acquire), phase_)) return;
      check_peer(peer, what, deadline);
    }
  }

  void check_peer(int peer, const char* what, Clock::time_point deadline) const {
    if (const int failed = header().gave_up.load(); failed >= 0) {
      throw DistributedError(
          fmt::format("rank {} waited in a shared memory {} for rank {}, and rank {} gave up (it "
                      "failed or was aborted)",
                      rank_, what, peer, failed));
    }
    const auto pid = control(peer).pid.load();
    if (process_ended(pid)) {
      throw DistributedError(
          fmt::format("rank {} waited in a shared memory {} for rank {}, whose process (pid {}) has "
                      "ended",
                      rank_, what, peer, pid));
    }
    if (Clock::now() > deadline) {
      throw DistributedError(
          fmt::format("rank {} waited in a shared memory {} for rank {} for {} ms (the timeout); "
                      "rank {} is alive but never arrived (it hangs, or runs other collectives)",
                      rank_, what, peer, timeout_.count(), peer));
    }
  }

  void give_up() {
    std::int32_t none = -1;
    header().gave_up.compare_exchange_strong(none, rank_);
    for (int r = 0; r < size_; ++r) futex_wake(control(r).arrived);
  }

  c10::intrusive_ptr<c10d::Backend> gloo_;
  std::unique_ptr<Mapping> mapping_;
  std::chrono::milliseconds timeout_;
  std::uint32_t phase_ = 0;
};

std::string segment_name() {
  std::random_device random;
  return fmt::format("/fastlearn-{}-{:08x}{:08x}", ::getpid(), random(), random());
}

}  // namespace

c10::intrusive_ptr<c10d::Backend> with_shared_memory(c10::intrusive_ptr<c10d::Backend> gloo, c10d::Store& store,
                                                     int rank, int world_size, std::chrono::milliseconds timeout) {
  // Rank 0 creates the segment and publishes its name ("" when it could not); every rank then says whether it
  // mapped it, and all of them use it only when every rank did.
  std::unique_ptr<Mapping> mapping;
  std::string name;
  std::string failure;
  try {
    if (rank == 0) {
      name = segment_name();
      mapping = map_segment(name, world_size, /*create=*/true);
      new (mapping->base()) Header{segment_magic, world_size, {-1}, {0}};
      for (int r = 0; r < world_size; ++r)
        new (mapping->base() + sizeof(Header) + r * sizeof(Control)) Control{{0}, {0}};
      store.set("shared_memory/name", name);
    } else {
      const auto published = store.get("shared_memory/name");
      name.assign(published.begin(), published.end());
      if (name.empty()) throw DistributedError("rank 0 could not create the segment");
      mapping = map_segment(name, world_size, /*create=*/false);
      const auto& header = *std::launder(reinterpret_cast<Header*>(mapping->base()));
      if (header.magic != segment_magic || header.world_size != world_size) {
        throw DistributedError(fmt::format("{} is not this group's segment (magic {:x}, world size {})", name,
                                           header.magic, header.world_size));
      }
    }
    std::launder(reinterpret_cast<Control*>(mapping->base() + sizeof(Header)))[rank].pid.store(::getpid());
  } catch (const std::exception& e) {
    if (rank == 0 && !mapping) store.set("shared_memory/name", std::string());
    failure = error_text(e);
    mapping.reset();
  }
  store.set(fmt::format("shared_memory/mapped/{}", rank), std::string(failure.empty() ? "1" : "0"));
  bool everyone = true;
  for (int r = 0; r < world_size; ++r) {
    everyone = store.get(fmt::format("shared_memory/mapped/{}", r)) == std::vector<std::uint8_t>{'1'} && everyone;
  }
  if (rank == 0 && !name.empty()) ::shm_unlink(name.c_str());  // every rank has opened it or failed to
  if (!failure.empty()) {
    std::cerr << fmt::format(
        "fastlearn: rank {}: collectives between local ranks use Gloo over TCP: the shared "
        "memory segment failed: {}\n",
        rank, failure);
  }
  if (!everyone) return gloo;
  return c10::make_intrusive<SharedMemoryBackend>(std::move(gloo), std::move(mapping), rank, world_size, timeout);
}

}  // namespace fastlearn
