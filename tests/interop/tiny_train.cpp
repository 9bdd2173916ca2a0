// The rank program of the launch and multi-node tests: a tiny deterministic data parallel training
// (an MLP on three blobs, 2 epochs of one-cycle, one DistribCtx line) under whatever launched it.
//   interop_tiny_train OUT_DIR
// Every rank writes OUT_DIR/rank<R>.json (how it resolved the job: source, rank, world size, local
// rank, master address); rank 0 also writes OUT_DIR/weights.safetensors (the final parameters) and
// OUT_DIR/history.json (train loss, valid loss and accuracy per epoch).
#include <fastlearn/fastlearn.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdio>
#include <fstream>

namespace fl = fastlearn;

namespace {

std::shared_ptr<fl::TensorDataset> blobs(std::int64_t n, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto x = at::randn({n, 4}, gen) + at::one_hot(y, 4).to(at::kFloat) * 3;
  return std::make_shared<fl::TensorDataset>(std::vector<at::Tensor>{x}, std::vector<at::Tensor>{y});
}

}  // namespace

int main(int argc, char** argv) try {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::filesystem::path out = argv[1];
  torch::set_num_threads(1);  // the same kernels whatever OMP_NUM_THREADS the launcher chose
  fl::set_seed(0);
  fl::DataLoaders dls(fl::DataLoader(blobs(96, 1), {.bs = 8, .shuffle = true, .seed = 5}),
                      fl::DataLoader(blobs(30, 2), {.bs = 8}), 3);
  fl::Learner learn(dls, fl::models::mlp(4, {16}, 3), fl::cross_entropy(),
                    {.metrics = {fl::accuracy()}, .path = out, .progress = false});
  {
    fl::DistribCtx ctx(learn);
    const auto env = fl::dist_env();
    std::ofstream(out / fmt::format("rank{}.json", fl::rank())) << nlohmann::json{
        {"source", env.source},
        {"rank", fl::rank()},
        {"world_size", fl::world_size()},
        {"local_rank", fl::local_rank()},
        {"master_addr", env.master_addr}}.dump();
    learn.fit_one_cycle(2, 0.05);
  }
  if (fl::rank() == 0) {
    fl::NamedTensors weights;
    for (const auto& p : learn.model().named_parameters()) weights.emplace_back(p.key(), p.value().detach());
    fl::save_safetensors(out / "weights.safetensors", weights);
    nlohmann::json history = nlohmann::json::array();
    for (const auto& r : learn.recorder().history()) {
      history.push_back({{"train_loss", r.train_loss}, {"valid_loss", r.valid_loss}, {"accuracy", r.metrics.at(0)}});
    }
    std::ofstream(out / "history.json") << history.dump();
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "interop_tiny_train: %s\n", e.what());
  return 1;
}
