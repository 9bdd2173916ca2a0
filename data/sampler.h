#pragma once
// Samplers decide which items an epoch visits, and in what order.
#include <cstdint>
#include <memory>
#include <vector>

namespace fastlearn {

class Sampler {
 public:
  virtual ~Sampler() = default;
  /// Items one epoch visits (the length of order()).
  virtual std::int64_t size() const = 0;
  /// The item indices of epoch `epoch`, in visiting order. The same epoch always gives the same order.
  virtual std::vector<std::int64_t> order(std::int64_t epoch) const = 0;
  /// The sampler this one takes a data parallel rank's share of (DistributedSampler: its base); null otherwise.
  virtual std::shared_ptr<const Sampler> undistributed() const { return nullptr; }
};

/// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(std::int64_t n) : n_(n) {}
  std::int64_t size() const override { return n_; }
  std::vector<std::int64_t> order(std::int64_t epoch) const override;

 private:
  std::int64_t n_;
};

/// A permutation of 0..n-1 drawn from (seed, epoch): reproducible, and new each epoch.
class RandomSampler : public Sampler {
 public:
  RandomSampler(std::int64_t n, std::uint64_t seed) : n_(n), seed_(seed) {}
  std::int64_t size() const override { return n_; }
  std::vector<std::int64_t> order(std::int64_t epoch) const override;

 private:
  std::int64_t n_;
  std::uint64_t seed_;
};

/// Mixes a seed with stream numbers (epoch, batch, ...) into an independent 64-bit seed (splitmix64).
std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b = 0);

}  // namespace fastlearn
