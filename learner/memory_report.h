#pragma once
// What a Learner holds for training, in bytes: its parameters, their gradients and the optimizer's state, each
// counted by unique storage (a gradient that is a view of a reducer's bucket counts the bucket once; tied weights
// once). The figures a sharded run reports per rank (distributed.md), beside the CPU allocator's own count
// (core/cpu_memory_counter.h), which sees every tensor, activations included.
#include <cstdint>

namespace fastlearn {

class Learner;

struct MemoryReport {
  std::int64_t parameters = 0;
  /// The storages the defined .grad tensors live in, and with a sharded optimizer those its pieces' gradients live in
  /// (this process's shares of the reduced buckets, between backward and the optimizer's zero_grad).
  std::int64_t gradients = 0;
  /// The optimizer's per-parameter state (none before its first step); sharded, this process's pieces only.
  std::int64_t optimizer_state = 0;
  std::int64_t total() const { return parameters + gradients + optimizer_state; }
};

MemoryReport memory_report(Learner& learn);

}  // namespace fastlearn
