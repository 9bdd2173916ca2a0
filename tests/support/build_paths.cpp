#include "support/build_paths.h"

#include <cstdlib>
#include <string>
#include <string_view>

// The build's values, from the file tests/CMakeLists.txt generates.
namespace fastlearn::testing::build_paths::compiled {
extern const char* const source_dir;
extern const char* const build_dir;
extern const char* const cli;
extern const char* const cmake;
extern const char* const ccache;
extern const char* const fault_probe;
extern const char* const fashion_app;
extern const char* const tiny_train;
extern const char* const launch_probe;
extern const char* const bin_dir;
extern const char* const prefix_path;
}  // namespace fastlearn::testing::build_paths::compiled

namespace fastlearn::testing::build_paths {
namespace {

std::string overridden(const char* variable, const char* compiled_value) {
  const char* value = std::getenv(variable);
  return value && *value ? value : compiled_value;
}

// A path of the build directory, moved under FASTLEARN_TEST_BUILD_DIR when that is set.
std::string in_build(const char* path) {
  const char* moved = std::getenv("FASTLEARN_TEST_BUILD_DIR");
  const std::string_view build = compiled::build_dir, full = path;
  if (!moved || !*moved) return path;
  if (full == build) return moved;
  if (full.starts_with(build) && full.size() > build.size() && full[build.size()] == '/')
    return moved + std::string(full.substr(build.size()));
  return path;
}

}  // namespace

// Each value is worked out once, on first use: the environment is read before any test changes it.
const char* source_dir() {
  static const std::string value = overridden("FASTLEARN_TEST_SOURCE_DIR", compiled::source_dir);
  return value.c_str();
}
const char* build_dir() {
  static const std::string value = in_build(compiled::build_dir);
  return value.c_str();
}
const char* cli() {
  static const std::string value = in_build(compiled::cli);
  return value.c_str();
}
const char* fault_probe() {
  static const std::string value = in_build(compiled::fault_probe);
  return value.c_str();
}
const char* fashion_app() {
  static const std::string value = in_build(compiled::fashion_app);
  return value.c_str();
}
const char* tiny_train() {
  static const std::string value = in_build(compiled::tiny_train);
  return value.c_str();
}
const char* launch_probe() {
  static const std::string value = in_build(compiled::launch_probe);
  return value.c_str();
}
const char* bin_dir() {
  static const std::string value = in_build(compiled::bin_dir);
  return value.c_str();
}
const char* cmake() { return compiled::cmake; }
const char* ccache() { return compiled::ccache; }
const char* prefix_path() { return compiled::prefix_path; }

}  // namespace fastlearn::testing::build_paths
