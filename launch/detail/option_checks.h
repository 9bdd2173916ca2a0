#pragma once
// Internal to launch(): the checks of LaunchOptions made before anything starts, and finding the program to run.
#include <fastlearn/launch/launcher.h>

#include <filesystem>
#include <string>

namespace fastlearn::detail {

/// Throws ConfigError naming the first bad option (and what to pass instead).
void validate_options(const LaunchOptions& o);

/// The file execve() will run for `program`: as given when it has a '/', else the first match in PATH.
/// Throws ConfigError when it is empty, missing, or not an executable file.
std::filesystem::path resolve_program(const std::string& program);

}  // namespace fastlearn::detail
