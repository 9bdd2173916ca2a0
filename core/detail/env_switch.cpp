#include <fastlearn/core/detail/env_switch.h>

#include <fastlearn/core/detail/text.h>
#include <fastlearn/core/error.h>
#include <fmt/format.h>

#include <cstdlib>
#include <string_view>

namespace fastlearn {

bool env_switch_on(const char* name, const char* off_means) {
  const char* value = std::getenv(name);
  if (value == nullptr || std::string_view(value).empty() || std::string_view(value) == "1") return true;
  if (std::string_view(value) == "0") return false;
  throw ConfigError(fmt::format("{} is '{}': it must be 0 ({}) or 1", name, excerpt(value), off_means));
}

}  // namespace fastlearn
