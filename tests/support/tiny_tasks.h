#pragma once
// Small deterministic tasks for Learner tests: a linear regression and a 3-class classification, each
// with train and valid loaders over in-memory tensors.
#include <fastlearn/data/csv.h>
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/data/sampler.h>
#include <fastlearn/learner/learner.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <utility>
#include <vector>

namespace fastlearn::testing {

/// The same order every epoch: what a single process is given so that its batch k is every rank's batch k together
/// (rank r's share is the contiguous block [r * n/N, (r+1) * n/N) of the order).
class FixedSampler : public Sampler {
 public:
  explicit FixedSampler(std::vector<std::int64_t> order) : order_(std::move(order)) {}
  std::int64_t size() const override { return static_cast<std::int64_t>(order_.size()); }
  std::vector<std::int64_t> order(std::int64_t) const override { return order_; }

 private:
  std::vector<std::int64_t> order_;
};

struct TinyTaskOptions {
  std::int64_t n_train = 32;
  std::int64_t n_valid = 16;
  std::int64_t bs = 8;
  bool shuffle = true;
  std::uint64_t seed = 0;
};

/// y = x . w + b + small noise, x in R^4.
DataLoaders regression_data(const TinyTaskOptions& options = {});
/// Three Gaussian blobs in R^4, labels 0..2.
DataLoaders classification_data(const TinyTaskOptions& options = {});

/// A Learner for regression_data: Linear(4, 1) with seeded weights, MSE loss, no progress output.
std::unique_ptr<Learner> regression_learner(DataLoaders dls, LearnerOptions options = {});

/// Every parameter and buffer of `model`, cloned, in order.
std::vector<at::Tensor> snapshot(torch::nn::Module& model);
/// True when every tensor of `a` equals the one of `b` bit for bit.
bool same_tensors(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b);

/// A table of ratings "user,item,rating": users u1.. and items i1.. (text ids), each rating 3 + the dot product of
/// planted 3-factor vectors plus a little noise, rounded to a tenth; seeded.
CsvTable ratings_table(std::int64_t rows = 600, std::int64_t users = 30, std::int64_t items = 40,
                       std::uint64_t seed = 0);
/// ratings_table as a CSV file.
void write_ratings_csv(const std::filesystem::path& file, const CsvTable& table);

}  // namespace fastlearn::testing
