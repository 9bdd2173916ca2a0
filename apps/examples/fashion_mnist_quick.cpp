// Fashion-MNIST in a few lines: a small CNN, one-cycle training, the test accuracy and a checkpoint.
// fashion_mnist_distributed.cpp is this app plus one line.
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>

namespace fl = fastlearn;

int main() {
  fl::set_seed(0);
  auto path = fl::untar_data(fl::urls::fashion_mnist());  // verified and cached (locked against other processes)
  auto dls = fl::ImageDataLoaders::from_idx(path, {.bs = 128, .num_workers = 1});
  fl::Learner learn(dls, fl::models::simple_cnn(dls.c()), fl::cross_entropy(), {.metrics = {fl::accuracy()}});
  learn.fit_one_cycle(3, 3e-3);
  fmt::print("test accuracy {:.2f}%\n", 100 * learn.validate().metric("accuracy"));
  learn.save("fashion_cnn");  // models/fashion_cnn.safetensors
}
