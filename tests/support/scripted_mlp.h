#pragma once
// An MLP as a TorchScript module made with TorchScript's own compiler (no Python), saved and loaded back through
// models::torchscript as a script from Python is: for tests that train a script where they train C++ models.
#include <fastlearn/models/torchscript.h>

#include <fmt/format.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace fastlearn::testing {

/// Flatten, then a linear layer (aten::linear, as nn.Linear scripts to) between each pair of `widths` (weights drawn
/// from torch's generator, biases 0), with a ReLU between layers.
inline models::TorchScript scripted_mlp(const std::vector<std::int64_t>& widths) {
  torch::jit::Module script("ScriptedMlp");
  std::string code = "def forward(self, x):\n    h = torch.flatten(x, 1)\n";
  for (std::size_t i = 0; i + 1 < widths.size(); ++i) {
    const auto scale = 1.0 / std::sqrt(static_cast<double>(widths[i]));
    script.register_parameter(fmt::format("w{}", i),
                              (torch::randn({widths[i + 1], widths[i]}) * scale).requires_grad_(), false);
    script.register_parameter(fmt::format("b{}", i), torch::zeros({widths[i + 1]}).requires_grad_(), false);
    const bool last = i + 2 == widths.size();
    code += fmt::format("    h = {}torch.linear(h, self.w{}, self.b{}){}\n", last ? "" : "torch.relu(", i, i,
                        last ? "" : ")");
  }
  code += "    return h\n";
  script.define(code);
  static std::atomic<int> made{0};
  const auto file = std::filesystem::temp_directory_path() /
                    fmt::format("fastlearn_scripted_mlp_{}_{}.pt", getpid(), made.fetch_add(1));
  script.save(file.string());
  auto model = models::torchscript(file);
  std::filesystem::remove(file);
  return model;
}

}  // namespace fastlearn::testing
