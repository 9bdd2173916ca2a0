#pragma once
// NamedTensors: tensors with their names, in a fixed order (state dicts, checkpoint files, optimizer state).
#include <ATen/core/Tensor.h>

#include <string>
#include <utility>
#include <vector>

namespace fastlearn {

using NamedTensors = std::vector<std::pair<std::string, at::Tensor>>;

}  // namespace fastlearn
