#pragma once
// fastai's RandomSplitter: a seeded permutation of the n items (torch.randperm after torch.manual_seed(seed),
// so the same split as fastai's for the same seed); its first floor(valid_pct * n) items are for validation.
#include <cstdint>
#include <string_view>
#include <vector>

namespace fastlearn {

/// Per item, whether it is for validation; DataError naming `origin` unless 0 < valid_pct < 1.
std::vector<bool> random_valid_mask(std::int64_t n, double valid_pct, std::uint64_t seed, std::string_view origin);

}  // namespace fastlearn
