#pragma once
// TorchScript archives: read from a file or held in memory, loaded on the CPU, and what their methods return, for
// models::torchscript and torchscript_loss.
#include <ATen/core/ivalue.h>

#include <filesystem>
#include <string>
#include <vector>

namespace torch::jit {
struct Module;
}

namespace fastlearn::models::detail {

/// The bytes of `file`; CheckpointError naming it when it is missing or cannot be read.
std::string file_bytes(const std::filesystem::path& file);
/// The script module in `archive` on the CPU; CheckpointError naming `origin` when it is not a TorchScript archive.
torch::jit::Module load_script(const std::string& archive, const std::string& origin);
/// CheckpointError naming `origin` when the archive's code defines __setstate__, which torch::jit::load runs: an
/// archive from an export (untrusted input) must load without running any of its code.
void refuse_code_at_load(const std::string& archive, const std::string& origin);
/// The tensors of the arguments after self of `script`'s `method`, by name: ConfigError naming `origin` when the
/// method is missing or an argument is not a Tensor.
std::vector<std::string> tensor_arguments(const torch::jit::Module& script, const std::string& method,
                                          const std::string& origin);
/// A method's result as tensors: one for a Tensor, each of a tuple or list of tensors; ConfigError otherwise.
std::vector<at::Tensor> tensors_returned(const c10::IValue& output, const std::string& origin, const char* method);

}  // namespace fastlearn::models::detail
