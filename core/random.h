#pragma once
// One seed for everything random in a run: torch's CPU (and CUDA) generators, which also seed the
// DataLoaders created afterwards without an explicit seed. With it, a CPU run is reproducible bit for bit.
#include <cstdint>

namespace fastlearn {

/// Seeds torch's default generators (CPU and every CUDA device).
void set_seed(std::uint64_t seed);

}  // namespace fastlearn
