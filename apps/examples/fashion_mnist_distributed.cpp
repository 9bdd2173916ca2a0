// fashion_mnist_quick.cpp made data parallel by one line, the DistribCtx. On 2 processes:
//   build/bin/fastlearn launch --nproc-per-node 2 build/bin/fashion_mnist_distributed
// Alone (no launcher) it trains on one process, exactly like the quick app; under the launcher every rank
// prints the same test accuracy (validation gathers the whole test set).
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>

namespace fl = fastlearn;

int main() {
  fl::set_seed(0);
  auto path = fl::untar_data(fl::urls::fashion_mnist());  // verified and cached (locked against other processes)
  auto dls = fl::ImageDataLoaders::from_idx(path, {.bs = 128, .num_workers = 1});
  fl::Learner learn(dls, fl::models::simple_cnn(dls.c()), fl::cross_entropy(), {.metrics = {fl::accuracy()}});
  fl::DistribCtx ctx(learn);  // data parallel over the launcher's ranks; progress, logs and files on rank 0 only
  learn.fit_one_cycle(3, 3e-3);
  fmt::print("test accuracy {:.2f}%\n", 100 * learn.validate().metric("accuracy"));
  learn.save("fashion_cnn");  // models/fashion_cnn.safetensors
}
