#pragma once
// What flows from a Dataset through the DataLoader to the Learner: input tensors and target tensors
// (fastai's n_inp splits a tuple the same way). One item has no batch dimension; a batch has it first.
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <vector>

namespace fastlearn {

struct Batch {
  std::vector<at::Tensor> inputs;   ///< xb: what the model's forward receives
  std::vector<at::Tensor> targets;  ///< yb: what the loss compares against

  /// Number of items (first dimension of the first input); 0 for an empty batch.
  std::int64_t size() const;

  /// Copies every tensor to `device` (asynchronously from pinned memory when `non_blocking`).
  Batch to(const c10::Device& device, bool non_blocking = false) const;

  /// Pins every tensor in page-locked memory, for fast asynchronous copies to a GPU.
  Batch pinned() const;
};

/// One item of a dataset: the same shape as a batch, without the batch dimension.
using Item = Batch;

}  // namespace fastlearn
