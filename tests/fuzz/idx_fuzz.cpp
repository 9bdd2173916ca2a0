// libFuzzer target: parse_idx on arbitrary bytes (raw or gzip). Any input must give a tensor or a
// fastlearn::DataError; a crash, a sanitizer report, a leak or another exception type is a bug.
#include <fastlearn/core/error.h>
#include <fastlearn/data/idx.h>

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    const auto tensor = fastlearn::parse_idx(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)tensor.numel();
  } catch (const fastlearn::DataError&) {}
  return 0;
}
