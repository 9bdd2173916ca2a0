#pragma once
// The one reduction step of the in-process backends (shared memory, threads): out = left (op) right, elementwise.
// Folding the ranks' tensors in rank order with it gives every rank the same bits.
#include <fastlearn/core/error.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

namespace fastlearn {

/// out = left (op) right; sum and avg add (avg divides once at the end, by the caller). `out` may be `left`.
inline void fold_into(const at::Tensor& out, const at::Tensor& left, const at::Tensor& right,
                      c10d::ReduceOp::RedOpType op) {
  auto target = out;  // the _out functions take a non-const reference to the tensor handle
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      at::add_out(target, left, right);
      return;
    case c10d::ReduceOp::PRODUCT:
      at::mul_out(target, left, right);
      return;
    case c10d::ReduceOp::MIN:
      at::minimum_out(target, left, right);
      return;
    case c10d::ReduceOp::MAX:
      at::maximum_out(target, left, right);
      return;
    default:
      throw DistributedError("fastlearn's in-process backends reduce by sum, avg, product, min or max only");
  }
}

}  // namespace fastlearn
