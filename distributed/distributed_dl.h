#pragma once
// DistributedDL: a DataLoader that yields only this rank's share of every epoch (fastai's DistributedDL).
// Every rank computes rank 0's item order for the epoch (the loader's sampler with rank 0's seed, shared
// once when wrapping, and the loader's epoch counter), pads it by wrapping around (padded position i holds
// order[i % n]) to total = ceil(n / world) * world items, and takes the contiguous block of positions
// [rank * total / world, (rank + 1) * total / world). Every rank thus gets the same number of batches of
// the same sizes, which is what keeps the collectives of a training step from hanging. The padding
// (total - n items, all at the end of the padded order) is removed exactly by gather_unpadded.
// With one process the loader yields exactly what it yielded before.
#include <fastlearn/comm/group.h>
#include <fastlearn/data/dataloader.h>
#include <fastlearn/data/sampler.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace fastlearn {

/// Rank `rank`'s block of `base`'s order padded to a multiple of `world_size` (the index arithmetic of
/// DistributedDL, usable without processes).
class DistributedSampler : public Sampler {
 public:
  DistributedSampler(std::shared_ptr<const Sampler> base, int rank, int world_size);

  /// Items of this rank's block: total() / world_size(), the same on every rank.
  std::int64_t size() const override { return total_ / world_size_; }
  std::shared_ptr<const Sampler> undistributed() const override { return base_; }
  /// This rank's block of the padded order of `base` for `epoch`.
  std::vector<std::int64_t> order(std::int64_t epoch) const override;

  const Sampler& base() const { return *base_; }
  std::shared_ptr<const Sampler> base_ptr() const { return base_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  /// Items of the base order (n).
  std::int64_t n() const { return n_; }
  /// Items of the padded order over all ranks: ceil(n / world_size) * world_size.
  std::int64_t total() const { return total_; }
  /// Items added by the padding: total() - n().
  std::int64_t padding() const { return total_ - n_; }
  /// Padded position of the first item of rank `r`'s block.
  std::int64_t offset(int r) const { return r * size(); }
  std::int64_t offset() const { return offset(rank_); }

 private:
  std::shared_ptr<const Sampler> base_;
  int rank_;
  int world_size_;
  std::int64_t n_;
  std::int64_t total_;
};

/// A DataLoader made distributed in place (its sampler replaced by a DistributedSampler), and what
/// restores it. Non-copyable; destroying it leaves the loader as it is (call unwrap() to restore).
class DistributedDL {
 public:
  /// Makes `loader` yield this rank's share of each epoch. Collective: every rank wraps its loader of the
  /// same dataset size, bs and drop_last, in the same order. Rank 0's seed (broadcast) and epoch are set
  /// on every rank, so a shuffling loader's order is rank 0's; the batch transforms then draw from a seed
  /// of their own on every other rank (mix_seed of rank 0's seed and the rank), which is what loader.seed()
  /// reports there. A sampler other than the loader's RandomSampler must give the same order on every rank.
  /// `group`: the ranks that share the data (default: the world); ranks and sizes are the group's.
  static DistributedDL wrap(DataLoader& loader, Group* group = nullptr);

  DistributedDL(DistributedDL&& other) noexcept;
  DistributedDL& operator=(DistributedDL&& other) noexcept;
  DistributedDL(const DistributedDL&) = delete;
  DistributedDL& operator=(const DistributedDL&) = delete;
  ~DistributedDL() = default;

  /// Gives the loader back its sampler and seed (its epoch counter keeps counting); no-op when unwrapped.
  void unwrap();
  bool wrapped() const { return loader_ != nullptr; }

  /// The wrapped loader; DistributedError after unwrap().
  DataLoader& loader() const;
  const DistributedSampler& sampler() const { return *sampler_; }
  int rank() const { return sampler_->rank(); }
  int world_size() const { return sampler_->world_size(); }
  /// Items of the full (unpadded) order.
  std::int64_t n() const { return sampler_->n(); }
  /// Items the padding adds over all ranks (total - n).
  std::int64_t padding() const { return sampler_->padding(); }
  /// Batches per epoch, the same on every rank (the last one smaller unless drop_last).
  std::int64_t size() const;
  /// Items this rank yields per epoch: its block, less a dropped smaller last batch.
  std::int64_t items() const;
  /// Of the items() this rank yields, how many come first that are not padding (the rest are): per-item sums over
  /// these on every rank add up to the whole set's.
  std::int64_t own_items() const;
  std::int64_t bs() const { return bs_; }
  bool drop_last() const { return drop_last_; }
  /// The group the data is shared over (null: the world).
  Group* group() const { return group_; }

 private:
  DistributedDL(DataLoader& loader, std::shared_ptr<const DistributedSampler> sampler,
                std::shared_ptr<const Sampler> old_sampler, std::uint64_t old_seed, Group* group);

  DataLoader* loader_ = nullptr;
  std::shared_ptr<const DistributedSampler> sampler_;
  std::shared_ptr<const Sampler> old_sampler_;
  std::uint64_t old_seed_ = 0;
  std::int64_t bs_ = 1;
  bool drop_last_ = false;
  Group* group_ = nullptr;
};

/// The DistributedSampler `loader` uses, or null when it is not distributed.
const DistributedSampler* distributed_sampler(const DataLoader& loader);

/// Collective: all-gathers every rank's per-item tensor `local` (first dimension: the items the rank
/// yielded in one epoch of `dl`, in batch order; any dtype and trailing shape, the same on every rank) and
/// returns them in the order of the base loader with the padding removed: n items without drop_last (the
/// dataset order for an unshuffled loader). On `local`'s device. DistributedError when shapes differ.
at::Tensor gather_unpadded(const at::Tensor& local, const DistributedDL& dl);
/// The same for a loader that DistributedDL::wrap made distributed over the world group; `local` itself for
/// any other loader.
at::Tensor gather_unpadded(const at::Tensor& local, const DataLoader& loader);

}  // namespace fastlearn
