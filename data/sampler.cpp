#include <fastlearn/data/sampler.h>

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <numeric>

namespace fastlearn {
namespace {

std::uint64_t splitmix64(std::uint64_t x) {
  x += 0x9E3779B97F4A7C15ULL;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL;
  return x ^ (x >> 31);
}

}  // namespace

std::uint64_t mix_seed(std::uint64_t seed, std::uint64_t a, std::uint64_t b) {
  return splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b);
}

std::vector<std::int64_t> SequentialSampler::order(std::int64_t) const {
  std::vector<std::int64_t> out(n_);
  std::iota(out.begin(), out.end(), 0);
  return out;
}

std::vector<std::int64_t> RandomSampler::order(std::int64_t epoch) const {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed_, static_cast<std::uint64_t>(epoch)));
  auto perm = torch::randperm(n_, gen, torch::kLong);
  const auto* p = perm.data_ptr<std::int64_t>();
  return {p, p + n_};
}

}  // namespace fastlearn
