#include <fastlearn/data/dataloader.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fastlearn/core/detail/parallel.h>
#include <fastlearn/core/error.h>
#include <fastlearn/data/detail/buffer_pool.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <condition_variable>
#include <exception>
#include <map>
#include <mutex>
#include <thread>
#include <typeinfo>
#include <variant>

namespace fastlearn {

// One epoch in flight: the order, the workers, and the batches they have made but not yet handed out.
class DataLoader::EpochRun {
 public:
  EpochRun(const DataLoader& loader, std::vector<std::int64_t> order)
      : dataset_(loader.dataset_),
        options_(loader.options_),
        buffers_(loader.buffers_),
        seed_(loader.seed_),
        epoch_(loader.epoch_),
        order_(std::move(order)),
        batches_(batch_count(static_cast<std::int64_t>(order_.size()), options_.bs, options_.drop_last)),
        on_cuda_(options_.device && options_.device->is_cuda()) {
    const int workers = batches_ > 1 ? options_.num_workers : 0;
    capacity_ = std::max(1, workers * std::max(1, options_.prefetch));
    for (int w = 0; w < workers; ++w) threads_.emplace_back([this] { work(); });
  }

  ~EpochRun() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    changed_.notify_all();
    for (auto& t : threads_) t.join();
  }

  static std::int64_t batch_count(std::int64_t n, std::int64_t bs, bool drop_last) {
    return drop_last ? n / bs : (n + bs - 1) / bs;
  }

  std::int64_t position() const { return position_; }
  const Batch& current() const { return current_; }

  // Moves to the next batch. Called once after construction (not inside it: a failing first batch must
  // unwind through the destructor, which stops and joins the workers).
  void advance() {
    const std::int64_t k = handed_out_;
    if (k >= batches_) {
      position_ = batches_;
      return;
    }
    Made made = threads_.empty() ? make(k) : take(k);
    ++handed_out_;
    if (options_.device) made.batch = made.batch.to(*options_.device, /*non_blocking=*/on_cuda_);
    if (on_cuda_)
      for (const auto& tfm : options_.batch_tfms) tfm(made.batch, made.rng);
    current_ = std::move(made.batch);
    position_ = k;
  }

 private:
  // A loaded batch and its generator, which the batch transforms go on drawing from.
  struct Made {
    Batch batch;
    at::Generator rng;
  };
  using Result = std::variant<Made, std::exception_ptr>;

  // On a CUDA device the batch transforms run there, after the copy: uint8 images cross the bus at a
  // quarter of float32's bytes and the GPU does the arithmetic. Elsewhere they run here, in the workers.
  Made make(std::int64_t k) const {
    const auto begin = k * options_.bs;
    const auto count = std::min<std::int64_t>(options_.bs, static_cast<std::int64_t>(order_.size()) - begin);
    // Seeded by (seed, epoch, batch): the same augmentation whichever worker makes the batch.
    auto rng = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed_, epoch_, k));
    UseBufferPool use(*buffers_);
    Batch batch = dataset_->load_batch(std::span(order_).subspan(begin, count), rng);
    if (on_cuda_) return {batch.pinned(), rng};
    for (const auto& tfm : options_.batch_tfms) tfm(batch, rng);
    return {std::move(batch), rng};
  }

  Made take(std::int64_t k) {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [&] { return ready_.count(k) > 0; });
    Result result = std::move(ready_.at(k));
    ready_.erase(k);
    consumed_ = k + 1;
    lock.unlock();
    changed_.notify_all();
    if (auto* error = std::get_if<std::exception_ptr>(&result)) std::rethrow_exception(*error);
    return std::move(std::get<Made>(result));
  }

  void work() {
    compute_alone();  // the training thread's team has the cores: a team here would fight it
    for (;;) {
      std::int64_t k = 0;
      {
        std::unique_lock lock(mutex_);
        changed_.wait(lock, [&] { return stop_ || claimed_ >= batches_ || claimed_ < consumed_ + capacity_; });
        if (stop_ || claimed_ >= batches_) return;
        k = claimed_++;
      }
      Result result;
      try {
        result = make(k);
      } catch (...) {
        result = std::current_exception();
      }
      {
        std::lock_guard lock(mutex_);
        ready_.emplace(k, std::move(result));
      }
      changed_.notify_all();
    }
  }

  std::shared_ptr<const Dataset> dataset_;
  const DataLoaderOptions options_;
  const std::shared_ptr<BufferPool> buffers_;
  const std::uint64_t seed_;
  const std::int64_t epoch_;
  const std::vector<std::int64_t> order_;
  const std::int64_t batches_;
  const bool on_cuda_;  // pinned memory, non-blocking copies, batch transforms after the copy
  int capacity_ = 1;

  std::mutex mutex_;
  std::condition_variable changed_;
  std::map<std::int64_t, Result> ready_;
  std::int64_t claimed_ = 0;   // next batch a worker will make
  std::int64_t consumed_ = 0;  // batches handed out
  bool stop_ = false;
  std::vector<std::thread> threads_;

  std::int64_t handed_out_ = 0;
  std::int64_t position_ = 0;
  Batch current_;
};

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : dataset_(std::move(dataset)), options_(std::move(options)) {
  if (!dataset_) throw DataError("DataLoader: no dataset given");
  if (options_.bs < 1) throw DataError(fmt::format("DataLoader: bs must be at least 1, got {}", options_.bs));
  if (options_.num_workers < 0)
    throw DataError(fmt::format("DataLoader: num_workers must be 0 or more, got {}", options_.num_workers));
  seed_ = options_.seed
              ? *options_.seed
              : static_cast<std::uint64_t>(
                    torch::randint(std::numeric_limits<std::int64_t>::max(), {1}, torch::kLong).item<std::int64_t>());
  const auto n = dataset_->size();
  sampler_ = options_.shuffle ? std::shared_ptr<const Sampler>(std::make_shared<RandomSampler>(n, seed_))
                              : std::make_shared<SequentialSampler>(n);
  // Enough for every batch in flight (prefetched, in the user's hands) and the transforms' steps between.
  buffers_ = std::make_shared<BufferPool>(4 * (std::max(1, options_.num_workers) * std::max(1, options_.prefetch) + 3));
}

std::int64_t DataLoader::n() const { return sampler_->size(); }

std::int64_t DataLoader::size() const { return EpochRun::batch_count(n(), options_.bs, options_.drop_last); }

void DataLoader::set_sampler(std::shared_ptr<const Sampler> sampler) {
  if (!sampler) throw DataError("DataLoader::set_sampler: no sampler given");
  sampler_ = std::move(sampler);
}

void DataLoader::set_seed(std::uint64_t seed) {
  seed_ = seed;
  // Only the plain RandomSampler is the seed's; any other sampler (a subclass too) keeps its own order.
  const Sampler& current = *sampler_;
  if (typeid(current) == typeid(RandomSampler)) sampler_ = std::make_shared<RandomSampler>(sampler_->size(), seed_);
}

DataLoader::Iterator DataLoader::begin() {
  auto run = std::make_shared<EpochRun>(*this, sampler_->order(epoch_));
  ++epoch_;
  run->advance();
  return Iterator(std::move(run));
}

DataLoader::Iterator DataLoader::end() const {
  Iterator it;
  it.end_ = size();
  return it;
}

Batch DataLoader::one_batch() {
  auto it = begin();
  --epoch_;
  if (it == end()) throw DataError("DataLoader::one_batch: the loader yields no batch (empty dataset, or drop_last)");
  return *it;
}

DataLoader::Iterator::Iterator(std::shared_ptr<EpochRun> run) : run_(std::move(run)) {}

std::int64_t DataLoader::Iterator::position() const { return run_ ? run_->position() : end_; }

const Batch& DataLoader::Iterator::operator*() const { return run_->current(); }

DataLoader::Iterator& DataLoader::Iterator::operator++() {
  run_->advance();
  return *this;
}

}  // namespace fastlearn
