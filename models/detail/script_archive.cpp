#include <fastlearn/models/detail/script_archive.h>

#include <c10/core/Device.h>
#include <caffe2/serialize/inline_container.h>
#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>
#include <torch/csrc/jit/api/module.h>
#include <torch/csrc/jit/serialization/import.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <string_view>

namespace fastlearn::models::detail {

std::string file_bytes(const std::filesystem::path& file) {
  const auto origin = excerpt(file.string(), 256);
  if (!std::filesystem::is_regular_file(file))
    throw CheckpointError(fmt::format("{}: no such TorchScript file", origin));
  std::ifstream in(file, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw CheckpointError(fmt::format("{}: cannot be read", origin));
  return bytes;
}

torch::jit::Module load_script(const std::string& archive, const std::string& origin) {
  try {
    std::istringstream in(archive);
    return torch::jit::load(in, c10::Device(c10::kCPU));
  } catch (const c10::Error& e) {
    throw CheckpointError(
        fmt::format("{}: not a TorchScript archive that this LibTorch reads (torch.jit.save writes "
                    "one): {}",
                    origin, excerpt(e.what_without_backtrace(), 300)));
  }
}

void refuse_code_at_load(const std::string& archive, const std::string& origin) {
  try {
    std::istringstream in(archive);
    caffe2::serialize::PyTorchStreamReader reader(&in);
    for (const auto& name : reader.getAllRecords()) {
      if (!(name.starts_with("code/") || name.find("/code/") != std::string::npos) || !name.ends_with(".py")) continue;
      const auto [data, size] = reader.getRecord(name);
      const std::string_view code(static_cast<const char*>(data.get()), size);
      if (code.find("__setstate__") != std::string_view::npos)
        throw CheckpointError(
            fmt::format("{}: the script's code ({}) defines __setstate__, which runs as it is loaded; "
                        "fastlearn loads an export's script only when loading it runs none of its code",
                        origin, excerpt(name, 120)));
    }
  } catch (const c10::Error& e) {
    throw CheckpointError(fmt::format("{}: not a TorchScript archive that this LibTorch reads: {}", origin,
                                      excerpt(e.what_without_backtrace(), 300)));
  }
}

std::vector<std::string> tensor_arguments(const torch::jit::Module& script, const std::string& method,
                                          const std::string& origin) {
  const auto found = script.find_method(method);
  if (!found) throw ConfigError(fmt::format("{}: the script has no {} method", origin, method));
  const auto& arguments = found->function().getSchema().arguments();
  std::vector<std::string> names;
  for (std::size_t i = 1; i < arguments.size(); ++i) {
    if (arguments[i].type()->kind() != c10::TypeKind::TensorType) {
      throw ConfigError(fmt::format("{}: {}'s argument '{}' is a {}, not a Tensor: fastlearn passes tensors, in order",
                                    origin, method, arguments[i].name(), arguments[i].type()->str()));
    }
    names.push_back(arguments[i].name());
  }
  return names;
}

std::vector<at::Tensor> tensors_returned(const c10::IValue& output, const std::string& origin, const char* method) {
  std::vector<at::Tensor> out;
  if (output.isTensor()) {
    out.push_back(output.toTensor());
  } else if (output.isTuple() || output.isList()) {
    const auto elements = output.isTuple() ? output.toTupleRef().elements().vec() : output.toListRef().vec();
    for (const auto& e : elements) {
      if (!e.isTensor()) {
        throw ConfigError(fmt::format("{}: the script's {} returned a {} holding a {}: fastlearn takes tensors", origin,
                                      method, output.type()->str(), e.type()->str()));
      }
      out.push_back(e.toTensor());
    }
  }
  if (out.empty()) {
    throw ConfigError(fmt::format("{}: the script's {} returned a {}, not a Tensor or a tuple or list of them", origin,
                                  method, output.type()->str()));
  }
  return out;
}

}  // namespace fastlearn::models::detail
