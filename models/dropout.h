#pragma once
// models::Dropout: torch::nn::Dropout (same options, same result and the same draws on a thread that sets no
// generator) whose draws can come from a generator of the calling thread's own. Replicas of a model trained
// side by side in one process (distributed/parallel_trainer.h) each set one, so every replica draws from a
// seeded stream of its own instead of all of them racing for the device's default generator.
#include <ATen/core/Generator.h>
#include <torch/nn/modules/dropout.h>

#include <optional>

namespace fastlearn::models {

/// For its lifetime, models::Dropout layers running on the calling thread on `generator`'s device type draw
/// from it; the scope before is restored at the end. Scopes nest; each belongs to the thread that made it.
class [[nodiscard]] DropoutGeneratorScope {
 public:
  explicit DropoutGeneratorScope(at::Generator generator);
  ~DropoutGeneratorScope();
  DropoutGeneratorScope(const DropoutGeneratorScope&) = delete;
  DropoutGeneratorScope& operator=(const DropoutGeneratorScope&) = delete;

 private:
  std::optional<at::Generator> previous_;
};

class DropoutImpl : public torch::nn::DropoutImpl {
 public:
  explicit DropoutImpl(double p = 0.5) : torch::nn::DropoutImpl(torch::nn::DropoutOptions(p)) {}
  explicit DropoutImpl(const torch::nn::DropoutOptions& options) : torch::nn::DropoutImpl(options) {}
  /// torch::nn::Dropout's forward; in training, under a DropoutGeneratorScope for the input's device type, the
  /// mask is drawn from that scope's generator.
  at::Tensor forward(const at::Tensor& input);
  /// A copy that stays a models::Dropout (torch's clone would return its base class).
  std::shared_ptr<torch::nn::Module> clone(const std::optional<torch::Device>& device = std::nullopt) const override;
};
TORCH_MODULE(Dropout);

}  // namespace fastlearn::models
