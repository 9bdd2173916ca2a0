#include <fastlearn/models/torchscript.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fastlearn/models/detail/script_archive.h>
#include <fmt/format.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/runtime/graph_executor.h>
#include <torch/torch.h>

#include <functional>
#include <map>
#include <sstream>
#include <tuple>

namespace fastlearn::models {

namespace {

// `visit(owner, name, dotted path)` for every parameter and buffer of `script` and its children, recursively.
void for_each_tensor(torch::jit::Module& script, const std::string& prefix,
                     const std::function<void(torch::jit::Module&, const std::string&, const std::string&)>& visit) {
  std::vector<std::string> names;
  for (const auto& p : script.named_parameters(/*recurse=*/false)) names.push_back(p.name);
  for (const auto& b : script.named_buffers(/*recurse=*/false)) names.push_back(b.name);
  for (const auto& name : names) visit(script, name, prefix + name);
  for (auto child : script.named_children()) for_each_tensor(child.value, prefix + child.name + ".", visit);
}

// A module of the script's tree: named after the script's type (e.g.
// "__torch__.torch.nn.modules.normalization.LayerNorm"), holding the script's tensors of that module.
class ScriptPart : public torch::nn::Module {
 public:
  explicit ScriptPart(std::string type_name) : torch::nn::Module(std::move(type_name)) {}

 private:
  // Cloneable's clone() copies each child's tensors through this: the parts' tensors are already the cloned script's,
  // so only their values are copied, the whole subtree at once.
  void clone_(torch::nn::Module& other, const std::optional<c10::Device>& device) override {
    const auto copy = [&](const at::Tensor& from, at::Tensor& to) {
      to.set_data(device && from.device() != *device ? from.to(*device) : from.clone());
    };
    auto theirs = other.named_parameters(/*recurse=*/true);
    for (auto& p : named_parameters(/*recurse=*/true)) copy(theirs[p.key()], p.value());
    auto their_buffers = other.named_buffers(/*recurse=*/true);
    for (auto& b : named_buffers(/*recurse=*/true)) copy(their_buffers[b.key()], b.value());
  }
};

std::string type_name(const torch::jit::Module& m) {
  const auto name = m.type()->name();
  return name ? name->qualifiedName() : std::string("torchscript");
}

// Registers `script`'s own tensors in `into` and a part for each child, recursively.
void mirror(const torch::jit::Module& script, torch::nn::Module& into) {
  for (const auto& p : script.named_parameters(/*recurse=*/false))
    into.register_parameter(p.name, p.value, p.value.requires_grad());
  for (const auto& b : script.named_buffers(/*recurse=*/false)) into.register_buffer(b.name, b.value);
  for (const auto& child : script.named_children()) {
    auto part = std::make_shared<ScriptPart>(type_name(child.value));
    into.register_module(child.name, part);
    mirror(child.value, *part);
  }
}

}  // namespace

TorchScriptImpl::TorchScriptImpl(std::filesystem::path file)
    : TorchScriptImpl(detail::file_bytes(file), excerpt(file.string(), 256)) {}

TorchScriptImpl::TorchScriptImpl(const std::string& archive, std::string origin,
                                 const std::vector<std::pair<std::string, at::Tensor>>* tensors)
    : origin_(std::move(origin)) {
  if (tensors) detail::refuse_code_at_load(archive, origin_);  // an export's: untrusted until shown otherwise
  script_ = std::make_shared<torch::jit::Module>(detail::load_script(archive, origin_));
  inputs_ = detail::tensor_arguments(*script_, "forward", origin_).size();
  if (tensors) {
    std::map<std::string, at::Tensor> by_name(tensors->begin(), tensors->end());
    for_each_tensor(*script_, "", [&](torch::jit::Module& owner, const std::string& name, const std::string& path) {
      const auto it = by_name.find(path);
      if (it == by_name.end())
        throw CheckpointError(fmt::format("{}: the script's tensor '{}' is not in the file", origin_, excerpt(path)));
      const auto empty = owner.attr(name).toTensor();  // the archive's: its dtype and whether it is trained
      if (it->second.scalar_type() != empty.scalar_type())
        throw CheckpointError(fmt::format("{}: tensor '{}' is {} in the file and {} in the script", origin_,
                                          excerpt(path), c10::toString(it->second.scalar_type()),
                                          c10::toString(empty.scalar_type())));
      owner.setattr(name, it->second.detach().requires_grad_(empty.requires_grad() && empty.is_floating_point()));
    });
  }
  mirror(*script_, *this);
  script_->train(is_training());
}

std::string TorchScriptImpl::archive_without_tensors() {
  // The tensors are swapped for empty ones while the script is saved, and put back whatever happens.
  std::vector<std::tuple<torch::jit::Module, std::string, at::Tensor>> kept;
  struct PutBack {
    decltype(kept)& swapped;
    ~PutBack() {
      for (auto& [owner, name, tensor] : swapped) owner.setattr(name, tensor);
    }
  } put_back{kept};
  for_each_tensor(*script_, "", [&](torch::jit::Module& owner, const std::string& name, const std::string&) {
    auto tensor = owner.attr(name).toTensor();
    kept.emplace_back(owner, name, tensor);
    owner.setattr(name, at::empty({0}, tensor.options().device(at::kCPU)).requires_grad_(tensor.requires_grad()));
  });
  std::ostringstream out;
  script_->save(out);
  return out.str();
}

void TorchScriptImpl::reset() {
  script_ = std::make_shared<torch::jit::Module>(script_->clone());
  mirror(*script_, *this);
  script_->train(is_training());
}

std::vector<at::Tensor> TorchScriptImpl::forward(const std::vector<at::Tensor>& inputs) {
  if (inputs.size() != inputs_) {
    throw Error(fmt::format("{}: the script's forward takes {} tensor(s), the batch has {} input(s)", origin_, inputs_,
                            inputs.size()));
  }
  std::vector<c10::IValue> arguments(inputs.begin(), inputs.end());
  // The interpreter runs the ops one by one (autograd records them, as for a C++ model): the graph executor's
  // optimizations (profiled differentiable subgraphs) cost a training step more than they save on the CPU, where no
  // fuser runs (bench torchscript_step), and the executor keeps the first plan it makes, so eval passes go without
  // them too. The setting is this thread's only.
  const torch::jit::GraphOptimizerEnabledGuard optimize(false);
  return detail::tensors_returned(script_->forward(std::move(arguments)), origin_, "forward");
}

std::string TorchScriptImpl::uses(const std::string& module_type, const std::string& op) const {
  for (const auto& named : script_->named_modules()) {
    const auto where = named.name.empty() ? std::string("forward") : named.name;
    if (type_name(named.value).find(module_type) != std::string::npos) return where;
    const auto forward = named.value.find_method("forward");
    if (!forward) continue;
    for (const auto* node : forward->graph()->nodes()) {
      if (std::string(node->kind().toQualString()).find(op) != std::string::npos) return where;
    }
  }
  return "";
}

void TorchScriptImpl::train(bool on) {
  torch::nn::Module::train(on);
  if (script_) script_->train(on);
}

TorchScript torchscript(const std::filesystem::path& file) { return TorchScript(file); }

}  // namespace fastlearn::models
