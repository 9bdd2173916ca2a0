#include <fastlearn/core/detail/warning.h>

#include <cstdlib>
#include <iostream>
#include <string>

namespace fastlearn {

void warn(std::string_view message) {
  const char* rank = std::getenv("RANK");
  if (rank != nullptr && *rank != '\0' && std::string(rank) != "0") return;
  std::cerr << "fastlearn: warning: " << message << '\n' << std::flush;
}

}  // namespace fastlearn
