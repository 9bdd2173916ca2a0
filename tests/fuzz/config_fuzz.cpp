// libFuzzer target: the config loader (TOML parse + strict validation) on arbitrary bytes. Any input must
// give a config or a fastlearn::ConfigError; an accepted config must read back the same from its resolved
// form (what `fastlearn train` writes as config.toml). A crash, a sanitizer report, a leak, another
// exception type or a round trip that differs is a bug.
#include <fastlearn/config/train_config.h>

#include <fastlearn/core/error.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    const auto config = fastlearn::parse_config(text, "fuzz.toml");
    if (fastlearn::parse_config(fastlearn::to_toml(config), "resolved.toml") != config) std::abort();
  } catch (const fastlearn::ConfigError&) {}
  return 0;
}
