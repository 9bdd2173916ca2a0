#pragma once
// Small deterministic tasks for Learner tests: a linear regression and a 3-class classification, each
// with train and valid loaders over in-memory tensors.
#include <fastlearn/data/dataloaders.h>
#include <fastlearn/learner/learner.h>

#include <memory>

namespace fastlearn::testing {

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

}  // namespace fastlearn::testing
