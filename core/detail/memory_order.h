#pragma once
// A dense tensor's elements as a flat vector in memory order (a view of the same memory): the order of its gradient
// in a reducer bucket, and of its share of the parameter when the optimizer is sharded. Contiguous and channels-last
// tensors alike; the caller checks that the tensor is dense (is_non_overlapping_and_dense).
#include <ATen/core/Tensor.h>

namespace fastlearn {

inline at::Tensor memory_order(const at::Tensor& t) { return t.as_strided({t.numel()}, {1}); }

}  // namespace fastlearn
