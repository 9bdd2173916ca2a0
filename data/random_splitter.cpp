#include <fastlearn/data/random_splitter.h>

#include <ATen/CPUGeneratorImpl.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/torch.h>

#include <cmath>

namespace fastlearn {

std::vector<bool> random_valid_mask(std::int64_t n, double valid_pct, std::uint64_t seed, std::string_view origin) {
  if (!(valid_pct > 0 && valid_pct < 1)) {
    throw DataError(fmt::format("{}: valid_pct {} must lie in (0, 1)", excerpt(origin, 256), valid_pct));
  }
  auto gen = at::detail::createCPUGenerator(seed);
  const auto order = at::randperm(n, gen, at::TensorOptions().dtype(at::kLong));
  const auto* index = order.data_ptr<std::int64_t>();
  const auto n_valid = static_cast<std::int64_t>(std::floor(valid_pct * static_cast<double>(n)));
  std::vector<bool> is_valid(static_cast<std::size_t>(n), false);
  for (std::int64_t i = 0; i < n_valid; ++i) is_valid[static_cast<std::size_t>(index[i])] = true;
  return is_valid;
}

}  // namespace fastlearn
