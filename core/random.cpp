#include <fastlearn/core/random.h>

#include <torch/torch.h>

namespace fastlearn {

void set_seed(std::uint64_t seed) { torch::manual_seed(seed); }  // also seeds every CUDA device's generator

}  // namespace fastlearn
