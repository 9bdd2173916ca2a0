// Trains a linear classifier on three separable blobs with the Learner, through the umbrella header
// only; prints the last epoch's accuracy and exits 0 when it learned (>= 0.9).
#include <fastlearn/fastlearn.h>

#include <cstdio>

namespace fl = fastlearn;

int main() {
  fl::set_seed(0);
  const auto blobs = [](std::int64_t n, std::uint64_t seed) {
    auto gen = at::detail::createCPUGenerator(seed);
    auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
    auto x = at::randn({n, 4}, gen) * 0.3 + at::one_hot(y, 4).to(at::kFloat) * 2;
    return std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
  };
  fl::DataLoaders dls(fl::DataLoader(blobs(256, 1), {.bs = 32, .shuffle = true}),
                      fl::DataLoader(blobs(64, 2), {.bs = 64}), 3);
  fl::Learner learn(dls, fl::models::mlp(4, {}, 3), fl::cross_entropy(),
                    {.metrics = {fl::accuracy()}, .progress = false});
  learn.fit_one_cycle(3, 0.1);
  const double accuracy = learn.recorder().history().back().metrics.at(0);
  std::printf("fastlearn %s consumer: accuracy %.3f\n", fl::build_info().fastlearn_version.c_str(), accuracy);
  return accuracy >= 0.9 ? 0 : 1;
}
