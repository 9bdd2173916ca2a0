#pragma once
// The height and width of an image: the options that take a non-square size (a model's input, a loader's items).
#include <cstdint>

namespace fastlearn {

struct ImageSize {
  std::int64_t height = 0;
  std::int64_t width = 0;
  friend bool operator==(const ImageSize&, const ImageSize&) = default;
};

}  // namespace fastlearn
