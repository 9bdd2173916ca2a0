#include "support/tiny_tasks.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <fstream>

namespace fastlearn::testing {

namespace {

DataLoaders make_dls(at::Tensor x, at::Tensor y, const TinyTaskOptions& o) {
  auto train = std::make_shared<TensorDataset>(std::vector<at::Tensor>{x.slice(0, 0, o.n_train)},
                                               std::vector<at::Tensor>{y.slice(0, 0, o.n_train)});
  auto valid = std::make_shared<TensorDataset>(std::vector<at::Tensor>{x.slice(0, o.n_train)},
                                               std::vector<at::Tensor>{y.slice(0, o.n_train)});
  return DataLoaders(DataLoader(train, {.bs = o.bs, .shuffle = o.shuffle, .seed = o.seed}),
                     DataLoader(valid, {.bs = o.bs, .seed = o.seed}), 1);
}

}  // namespace

DataLoaders regression_data(const TinyTaskOptions& o) {
  auto gen = at::detail::createCPUGenerator(o.seed + 1);
  const auto n = o.n_train + o.n_valid;
  auto x = at::randn({n, 4}, gen);
  auto w = at::tensor({1.5, -2.0, 0.5, 3.0}, at::kFloat).unsqueeze(1);
  auto y = x.matmul(w).add(0.7) + 0.01 * at::randn({n, 1}, gen);
  return make_dls(x, y, o);
}

DataLoaders classification_data(const TinyTaskOptions& o) {
  auto gen = at::detail::createCPUGenerator(o.seed + 2);
  const auto n = o.n_train + o.n_valid;
  auto y = at::randint(0, 3, {n}, gen, at::TensorOptions().dtype(at::kLong));
  auto centers = at::tensor({2.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.0, 0.0, 2.0, 0.0}, at::kFloat).reshape({3, 4});
  auto x = centers.index_select(0, y) + 0.7 * at::randn({n, 4}, gen);
  auto dls = make_dls(x, y, o);
  return DataLoaders(std::move(dls.train()), std::move(dls.valid()), 3);
}

std::unique_ptr<Learner> regression_learner(DataLoaders dls, LearnerOptions options) {
  torch::manual_seed(42);
  torch::nn::Linear model(4, 1);
  options.progress = false;
  return std::make_unique<Learner>(std::move(dls), model, mse_loss(), std::move(options));
}

std::vector<at::Tensor> snapshot(torch::nn::Module& model) {
  std::vector<at::Tensor> out;
  for (auto& p : model.parameters()) out.push_back(p.detach().clone());
  for (auto& b : model.buffers()) out.push_back(b.detach().clone());
  return out;
}

bool same_tensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (!a[i].equal(b[i])) return false;
  }
  return true;
}

CsvTable ratings_table(std::int64_t rows, std::int64_t users, std::int64_t items, std::uint64_t seed) {
  auto gen = at::detail::createCPUGenerator(seed);
  const auto u = at::randn({users, 3}, gen), i = at::randn({items, 3}, gen);
  const auto who = at::randint(0, users, {rows}, gen, at::TensorOptions().dtype(at::kLong));
  const auto what = at::randint(0, items, {rows}, gen, at::TensorOptions().dtype(at::kLong));
  const auto rating = 3 + (u.index_select(0, who) * i.index_select(0, what)).sum(1) + 0.1 * at::randn({rows}, gen);
  CsvTable table{.columns = {"user", "item", "rating"}, .rows = {}};
  for (std::int64_t r = 0; r < rows; ++r)
    table.rows.push_back({fmt::format("u{}", who[r].item<std::int64_t>() + 1),
                          fmt::format("i{}", what[r].item<std::int64_t>() + 1),
                          fmt::format("{:.1f}", rating[r].item<double>())});
  return table;
}

void write_ratings_csv(const std::filesystem::path& file, const CsvTable& table) {
  std::ofstream out(file);
  out << fmt::format("{}\n", fmt::join(table.columns, ","));
  for (const auto& row : table.rows) out << fmt::format("{}\n", fmt::join(row, ","));
}

}  // namespace fastlearn::testing
