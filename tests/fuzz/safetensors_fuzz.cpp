// libFuzzer target: parse_safetensors on arbitrary bytes, and a round trip of whatever parses. Any input
// must give tensors or a fastlearn::CheckpointError; a crash, a sanitizer report, a leak or another
// exception type is a bug.
#include <fastlearn/core/error.h>
#include <fastlearn/core/safetensors.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fastlearn::SafetensorsContent content;
  try {
    content = fastlearn::parse_safetensors(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
  } catch (const fastlearn::CheckpointError&) {
    return 0;
  }
  // What parses must serialize and parse back to the same tensors.
  const auto bytes = fastlearn::serialize_safetensors(content.tensors, content.metadata);
  const auto again = fastlearn::parse_safetensors(bytes, "fuzz round trip");
  if (again.tensors.size() != content.tensors.size()) std::abort();
  for (std::size_t i = 0; i < again.tensors.size(); ++i) {
    if (again.tensors[i].first != content.tensors[i].first) std::abort();
    const auto& a = again.tensors[i].second;
    const auto& b = content.tensors[i].second;
    if (a.sizes() != b.sizes() || a.scalar_type() != b.scalar_type() || a.nbytes() != b.nbytes()) std::abort();
  }
  return 0;
}
