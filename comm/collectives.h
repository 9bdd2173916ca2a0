#pragma once
// Collectives over a process group (the world group when `group` is null); point-to-point messages are in
// comm/p2p.h. Ranks are global ranks. Tensors are changed in place. Every failure (a
// timeout, a dead peer) is a DistributedError naming the operation, the tensor, this rank and the timeout.
// On Gloo a call returns with its result; on NCCL it returns once the current CUDA stream waits for the result,
// without the host waiting for the GPU (comm/pending_works.h), and a failure shows at a later call.
// With one process and nothing set up, the collectives are no-ops (the tensor is already the result).
#include <fastlearn/comm/group.h>

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace fastlearn {

enum class ReduceOp { sum, product, min, max, avg };

std::string_view to_string(ReduceOp op);

/// The group a call given `group` runs on: `group`, else the world group; nullptr in a job of one process with
/// nothing set up (every call is then trivial); DistributedError in a job of several with nothing set up.
Group* group_or_world(Group* group);
/// A tensor as errors name it: "Float [4, 3]" ("no tensor" when undefined).
std::string describe_tensor(const at::Tensor& t);

/// After call `call` (Group::next_call) failed on this rank: tells the other members through the store, waits
/// briefly for theirs, and returns " Rank(s) R never reached this call (...)" naming the members that did not
/// fail in it too (they hang elsewhere or died), or "" when every member reached it.
std::string silent_ranks(Group& group, std::int64_t call);

/// DistributedError naming the first of `group`'s collectives that only the GPU waited for (NCCL: see
/// comm/pending_works.h) and that failed or outlived the timeout since; forgets those that finished. Never
/// blocks. Every collective calls it before it starts, the gradient reducer at the end of every backward.
void check_pending(Group& group);

/// Debug mode (debug_checks_enabled()): checks that every rank of `group` makes an all_reduce of a tensor like
/// `tensor` as its next collective, else a DistributedError naming each rank's call. For code that calls the
/// c10d backend itself (the GradReducer's bucket all-reduces). A no-op when debug checks are off.
void debug_check_all_reduce(const at::Tensor& tensor, Group& group);

/// Copies `tensor` of rank `src` into every rank's `tensor`.
void broadcast(const at::Tensor& tensor, int src, Group* group = nullptr);
/// Reduces every rank's `tensor` into the one of rank `dst` (others keep an unspecified value).
void reduce(const at::Tensor& tensor, int dst, ReduceOp op = ReduceOp::sum, Group* group = nullptr);
/// Every rank's `tensor` becomes the reduction of all of them. avg divides the sum by the group size
/// (exactly, also on Gloo, which has no average); integer tensors cannot be averaged.
void all_reduce(const at::Tensor& tensor, ReduceOp op = ReduceOp::sum, Group* group = nullptr);
/// Rank `src` sends inputs[i] to the rank of group rank i; `inputs` is ignored elsewhere.
void scatter(const at::Tensor& output, const std::vector<at::Tensor>& inputs, int src, Group* group = nullptr);
/// Rank `dst` receives every rank's `input` in `outputs` (group-rank order; one per rank, shaped like input).
void gather(const at::Tensor& input, const std::vector<at::Tensor>& outputs, int dst, Group* group = nullptr);
/// Every rank receives every rank's `input` in `outputs` (group-rank order).
void all_gather(const std::vector<at::Tensor>& outputs, const at::Tensor& input, Group* group = nullptr);
/// Every rank's `input`, split along its flattened elements into as many equal parts as the group has ranks, reduced
/// part by part: the rank of group rank r gets part r in `output` (input.numel() == output.numel() * group size,
/// the same dtype and device). avg divides the sum by the group size, as all_reduce's.
void reduce_scatter(const at::Tensor& output, const at::Tensor& input, ReduceOp op = ReduceOp::sum,
                    Group* group = nullptr);
/// Every rank's `input` laid end to end in group-rank order into every rank's `output` (output.numel() ==
/// input.numel() * group size, the same dtype and device): all_gather into one flat tensor. `input` may be this
/// rank's part of `output` (then nothing is copied for it over shared memory).
void all_gather_into(const at::Tensor& output, const at::Tensor& input, Group* group = nullptr);
/// Waits until every rank of the group arrives.
void barrier(Group* group = nullptr);

}  // namespace fastlearn
