#include <fastlearn/distributed/distributed_dl.h>

#include <fastlearn/comm/collectives.h>
#include <fastlearn/comm/runtime.h>
#include <fastlearn/core/error.h>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <c10/util/accumulate.h>

#include <algorithm>
#include <string>
#include <utility>

namespace fastlearn {
namespace {

// Stream number of the per-rank augmentation seeds (any constant; "ddl").
constexpr std::uint64_t kAugmentationStream = 0x64646c;

std::int64_t batch_count(std::int64_t items, std::int64_t bs, bool drop_last) {
  return drop_last ? items / bs : (items + bs - 1) / bs;
}

// Items a rank yields per epoch from a block of `block` items.
std::int64_t items_yielded(std::int64_t block, std::int64_t bs, bool drop_last) {
  return drop_last ? block / bs * bs : block;
}

std::string describe_block(const DistributedSampler& sampler, std::int64_t bs, bool drop_last) {
  return fmt::format("a block of {} of the {} padded items, bs {}{}", sampler.size(), sampler.total(), bs,
                     drop_last ? ", drop_last" : "");
}

std::vector<std::int64_t> to_vector(const at::Tensor& t) {
  auto cpu = t.to(torch::kCPU, torch::kLong).contiguous();
  return {cpu.data_ptr<std::int64_t>(), cpu.data_ptr<std::int64_t>() + cpu.numel()};
}

// `expected`: the rows each rank must give; `what`: how they come about, for the error message.
at::Tensor gather(const at::Tensor& local, const DistributedSampler& sampler, std::int64_t expected,
                  const std::string& what, Group* group) {
  const int world = sampler.world_size();
  // First every rank's layout, so that a rank passing the wrong tensor makes every rank fail with the same
  // message instead of a hang or a garbled gather.
  const bool has_rows = local.defined() && local.dim() >= 1;
  const std::int64_t rows = has_rows ? local.size(0) : -1;
  const std::int64_t row_numel = has_rows ? c10::multiply_integers(local.sizes().slice(1)) : -1;
  std::uint64_t shape_code = has_rows ? static_cast<std::uint64_t>(local.dim()) : 0;
  for (std::int64_t d = 1; has_rows && d < local.dim(); ++d) {
    shape_code = shape_code * 1000003u + static_cast<std::uint64_t>(local.size(d));
  }
  const std::int64_t dtype = local.defined() ? static_cast<std::int64_t>(local.scalar_type()) : -1;
  const std::vector<std::int64_t> layout{rows, dtype, row_numel, static_cast<std::int64_t>(shape_code)};
  const auto device = group ? device_of(*group) : distrib_device();
  std::vector<std::vector<std::int64_t>> layouts(static_cast<std::size_t>(world), layout);
  if (world > 1) {
    std::vector<at::Tensor> all;
    for (int r = 0; r < world; ++r) all.push_back(torch::empty({4}, torch::dtype(torch::kLong).device(device)));
    all_gather(all, torch::tensor(layout, torch::kLong).to(device), group);
    for (int r = 0; r < world; ++r) layouts[static_cast<std::size_t>(r)] = to_vector(all[static_cast<std::size_t>(r)]);
  }
  const bool consistent = std::all_of(layouts.begin(), layouts.end(),
                                      [&](const auto& l) { return l[0] == expected && l[1] >= 0 && l == layouts[0]; });
  if (!consistent) {
    std::string detail;
    for (int r = 0; r < world; ++r) {
      const auto& l = layouts[static_cast<std::size_t>(r)];
      detail += l[0] < 0 ? fmt::format("\n  rank {}: {}", r, l[1] < 0 ? "no tensor" : "a 0-dim tensor")
                         : fmt::format("\n  rank {}: {} rows of {} elements, {}", r, l[0], l[2],
                                       c10::toString(static_cast<c10::ScalarType>(l[1])));
    }
    throw DistributedError(fmt::format(
        "gather_unpadded on rank {}: every rank must pass one row per item it yielded in the epoch ({} rows: {}), "
        "with the same dtype and trailing shape; got:{}\nPass the per-item outputs of one full epoch of the "
        "distributed loader, concatenated in batch order",
        sampler.rank(), expected, what, detail));
  }

  // Rank r's row j sits at padded position offset(r) + j; positions >= n are the padding.
  std::vector<std::int64_t> keep(static_cast<std::size_t>(world));
  for (int r = 0; r < world; ++r) {
    keep[static_cast<std::size_t>(r)] = std::clamp<std::int64_t>(sampler.n() - sampler.offset(r), 0, expected);
  }
  if (world == 1) return local.narrow(0, 0, keep[0]);

  // Gathered as bytes: any dtype (bool, complex, half...) goes through every backend the same way.
  auto flat = local.resolve_conj().resolve_neg().contiguous().reshape({-1});
  auto bytes = flat.view(torch::kByte).to(device);
  std::vector<at::Tensor> parts;
  if (bytes.numel() > 0) {
    std::vector<at::Tensor> all;
    for (int r = 0; r < world; ++r) all.push_back(torch::empty_like(bytes));
    all_gather(all, bytes, group);
    for (int r = 0; r < world; ++r) {
      auto whole = all[static_cast<std::size_t>(r)].view(local.scalar_type()).view(local.sizes());
      parts.push_back(whole.narrow(0, 0, keep[static_cast<std::size_t>(r)]));
    }
  } else {
    for (int r = 0; r < world; ++r) {
      auto shape = local.sizes().vec();
      shape[0] = keep[static_cast<std::size_t>(r)];
      parts.push_back(torch::empty(shape, local.options().device(device)));
    }
  }
  return torch::cat(parts).to(local.device());
}

}  // namespace

DistributedSampler::DistributedSampler(std::shared_ptr<const Sampler> base, int rank, int world_size)
    : base_(std::move(base)), rank_(rank), world_size_(world_size) {
  if (!base_) throw DistributedError("DistributedSampler: no base sampler given");
  if (world_size_ < 1 || rank_ < 0 || rank_ >= world_size_) {
    throw DistributedError(
        fmt::format("DistributedSampler: rank {} of world size {} is not a rank of the job; "
                    "give 0 <= rank < world_size",
                    rank_, world_size_));
  }
  n_ = base_->size();
  total_ = (n_ + world_size_ - 1) / world_size_ * world_size_;
}

std::vector<std::int64_t> DistributedSampler::order(std::int64_t epoch) const {
  const auto full = base_->order(epoch);
  if (static_cast<std::int64_t>(full.size()) != n_) {
    throw DataError(
        fmt::format("DistributedSampler: the base sampler gave {} items for epoch {} but its size is {}; "
                    "a sampler's order must have size() items",
                    full.size(), epoch, n_));
  }
  std::vector<std::int64_t> block(static_cast<std::size_t>(size()));
  for (std::int64_t j = 0; j < size(); ++j) {
    block[static_cast<std::size_t>(j)] = full[static_cast<std::size_t>((offset() + j) % n_)];
  }
  return block;
}

DistributedDL::DistributedDL(DataLoader& loader, std::shared_ptr<const DistributedSampler> sampler,
                             std::shared_ptr<const Sampler> old_sampler, std::uint64_t old_seed, Group* group)
    : loader_(&loader),
      sampler_(std::move(sampler)),
      old_sampler_(std::move(old_sampler)),
      old_seed_(old_seed),
      bs_(loader.options().bs),
      drop_last_(loader.options().drop_last),
      group_(group) {}

DistributedDL::DistributedDL(DistributedDL&& other) noexcept
    : loader_(std::exchange(other.loader_, nullptr)),
      sampler_(other.sampler_),
      old_sampler_(std::move(other.old_sampler_)),
      old_seed_(other.old_seed_),
      bs_(other.bs_),
      drop_last_(other.drop_last_),
      group_(other.group_) {}

DistributedDL& DistributedDL::operator=(DistributedDL&& other) noexcept {
  if (this != &other) {
    loader_ = std::exchange(other.loader_, nullptr);
    sampler_ = other.sampler_;
    old_sampler_ = std::move(other.old_sampler_);
    old_seed_ = other.old_seed_;
    bs_ = other.bs_;
    drop_last_ = other.drop_last_;
    group_ = other.group_;
  }
  return *this;
}

DistributedDL DistributedDL::wrap(DataLoader& loader, Group* group) {
  if (distributed_sampler(loader)) {
    throw DistributedError(
        "DistributedDL::wrap: the loader is already distributed; unwrap() it before wrapping "
        "it again");
  }
  if (group && !group->is_member()) {
    throw DistributedError(
        fmt::format("DistributedDL::wrap: rank {} is not a member of group '{}'", fastlearn::rank(), group->name()));
  }
  // Ranks within the group (the world's when none is given): the block and the seed stream are the group's.
  const int r = group ? group->rank() : fastlearn::rank(), world = group ? group->size() : fastlearn::world_size();
  const int root_rank = group ? group->ranks().front() : 0;
  // Rank 0's seed and epoch, with its dataset size, bs and drop_last, which every rank must share: a rank
  // with other sizes would run another number of batches and hang the collectives of a training step.
  const std::vector<std::int64_t> mine{static_cast<std::int64_t>(loader.seed()), loader.epoch(), loader.n(),
                                       loader.options().bs, loader.options().drop_last ? 1 : 0};
  const auto device = group ? device_of(*group) : distrib_device();
  auto shared = torch::tensor(mine, torch::kLong).to(device);
  broadcast(shared, root_rank, group);
  const auto root = to_vector(shared);
  const bool differs = !std::equal(root.begin() + 2, root.end(), mine.begin() + 2);
  std::vector<std::int64_t> mismatch(static_cast<std::size_t>(world), 0);
  mismatch[static_cast<std::size_t>(r)] = differs ? 1 : 0;
  auto differing = torch::tensor(mismatch, torch::kLong).to(device);
  all_reduce(differing, ReduceOp::sum, group);
  const auto flags = to_vector(differing);
  if (std::any_of(flags.begin(), flags.end(), [](std::int64_t f) { return f != 0; })) {
    std::vector<int> ranks;
    for (int k = 0; k < world; ++k) {
      if (flags[static_cast<std::size_t>(k)] != 0) ranks.push_back(k);
    }
    throw DistributedError(fmt::format(
        "DistributedDL::wrap on rank {}: rank(s) {} wrap a loader unlike rank 0's ({} items, bs {}, drop_last {}){}; "
        "every rank must wrap loaders of the same data with the same bs and drop_last, in the same order (if they "
        "do, the ranks are at different points of the fit: a callback cancelled a phase on some ranks only, as a "
        "rank0_only one that steers the loop does)",
        r, fmt::join(ranks, ", "), root[2], root[3], root[4] != 0,
        differs ? fmt::format(", this rank's has {} items, bs {}, drop_last {}", mine[2], mine[3], mine[4] != 0) : ""));
  }
  const auto old_seed = loader.seed();
  auto old_sampler = loader.sampler_ptr();
  const auto seed = static_cast<std::uint64_t>(root[0]);
  loader.set_seed(seed);  // the order: rank 0's on every rank
  loader.set_epoch(root[1]);
  auto sampler = std::make_shared<const DistributedSampler>(loader.sampler_ptr(), r, world);
  loader.set_sampler(sampler);
  // The batch transforms draw from the loader's seed: one stream per rank, as independent processes would
  // have, derived from rank 0's seed. Rank 0 keeps it, so one process is exactly the base loader. (set_seed
  // leaves the DistributedSampler, and so the order, alone.)
  if (r != 0) loader.set_seed(mix_seed(seed, kAugmentationStream, static_cast<std::uint64_t>(r)));
  return DistributedDL(loader, std::move(sampler), std::move(old_sampler), old_seed, group);
}

void DistributedDL::unwrap() {
  if (!loader_) return;
  loader_->set_seed(old_seed_);  // before set_sampler: a DistributedSampler in use is left alone by set_seed
  loader_->set_sampler(old_sampler_);
  loader_ = nullptr;
}

DataLoader& DistributedDL::loader() const {
  if (!loader_) throw DistributedError("DistributedDL::loader: unwrap() gave the loader back; wrap it again to use it");
  return *loader_;
}

std::int64_t DistributedDL::size() const { return batch_count(sampler_->size(), bs_, drop_last_); }

std::int64_t DistributedDL::items() const { return items_yielded(sampler_->size(), bs_, drop_last_); }

std::int64_t DistributedDL::own_items() const {
  return std::clamp<std::int64_t>(sampler_->n() - sampler_->offset(), 0, items());
}

const DistributedSampler* distributed_sampler(const DataLoader& loader) {
  return dynamic_cast<const DistributedSampler*>(&loader.sampler());
}

at::Tensor gather_unpadded(const at::Tensor& local, const DistributedDL& dl) {
  return gather(local, dl.sampler(), dl.items(), describe_block(dl.sampler(), dl.bs(), dl.drop_last()), dl.group());
}

at::Tensor gather_unpadded(const at::Tensor& local, const DataLoader& loader) {
  const auto* sampler = distributed_sampler(loader);
  if (!sampler) return local;
  const auto& o = loader.options();
  return gather(local, *sampler, items_yielded(sampler->size(), o.bs, o.drop_last),
                describe_block(*sampler, o.bs, o.drop_last), nullptr);
}

}  // namespace fastlearn
