#pragma once
// "Did you mean ...?": the closest of some known names to a misspelled one (edit distance). Header-only and
// free of torch, for the config reader and the command line alike.
#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace fastlearn {

/// Levenshtein distance: insertions, deletions and substitutions of one character each cost 1.
inline std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = up;
    }
  }
  return row[b.size()];
}

/// The candidate closest to `word` (the first of equals); empty when there are no candidates.
inline std::string closest(std::string_view word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_distance = static_cast<std::size_t>(-1);
  for (const auto& c : candidates) {
    const auto d = edit_distance(word, c);
    if (d < best_distance) best = c, best_distance = d;
  }
  return best;
}

}  // namespace fastlearn
