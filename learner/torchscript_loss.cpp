#include <fastlearn/learner/torchscript_loss.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/models/detail/script_archive.h>
#include <fmt/format.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/torch.h>

#include <memory>
#include <mutex>
#include <optional>

namespace fastlearn {

void set_activation(Loss& loss, const std::string& activation, const std::string& what) {
  if (activation == "softmax") {
    loss.activation = [](const at::Tensor& pred) { return pred.softmax(pred.dim() > 1 ? 1 : 0); };
    loss.decodes = [](const at::Tensor& probs) { return probs.argmax(probs.dim() > 1 ? 1 : 0); };
  } else if (activation == "sigmoid") {
    loss.activation = [](const at::Tensor& pred) { return pred.sigmoid(); };
    loss.decodes = [](const at::Tensor& probs) { return probs.gt(0.5); };
  } else if (activation == "none") {
    loss.activation = nullptr;
    loss.decodes = nullptr;
  } else {
    throw ConfigError(fmt::format("{}: activation \"{}\" is not none, softmax or sigmoid", what, excerpt(activation)));
  }
  loss.activation_name = activation;
}

Loss torchscript_loss(const std::filesystem::path& file, TorchScriptLossOptions options) {
  const auto origin = excerpt(file.string(), 256);
  struct Script {
    torch::jit::Module module;
    std::size_t arguments = 0;
    std::optional<c10::Device> device;  // where its buffers are (a class weight, say): moved to the batches' device
    std::mutex moving;                  // copies of the Loss share the script
  };
  auto script = std::make_shared<Script>();
  script->module = models::detail::load_script(models::detail::file_bytes(file), origin);
  script->arguments = models::detail::tensor_arguments(script->module, "forward", origin).size();
  Loss loss{.name = "torchscript"};
  set_activation(loss, options.activation, fmt::format("torchscript_loss({})", origin));
  loss.fn_all = [script, origin](const std::vector<at::Tensor>& preds, const std::vector<at::Tensor>& targs) {
    if (preds.size() + targs.size() != script->arguments) {
      throw Error(fmt::format(
          "{}: the scripted loss's forward takes {} tensor(s), and the batch gives {} output(s) of the model and {} "
          "target(s)",
          origin, script->arguments, preds.size(), targs.size()));
    }
    if (preds.empty()) throw Error(fmt::format("{}: the scripted loss was given no output of the model", origin));
    const auto device = preds.front().device();
    {
      const std::lock_guard lock(script->moving);
      if (script->device != device) {
        script->module.to(device);
        script->device = device;
      }
    }
    std::vector<c10::IValue> arguments(preds.begin(), preds.end());
    arguments.insert(arguments.end(), targs.begin(), targs.end());
    const auto out = models::detail::tensors_returned(script->module.forward(std::move(arguments)), origin, "forward");
    if (out.size() != 1 || out[0].numel() != 1) {
      throw Error(fmt::format("{}: the scripted loss returned {}, not one scalar", origin,
                              out.size() != 1 ? fmt::format("{} tensors", out.size())
                                              : fmt::format("a tensor of {} elements", out[0].numel())));
    }
    return out[0].reshape({});
  };
  return loss;
}

}  // namespace fastlearn
