#pragma once
// A test suite whose files a Python script makes once, in a temporary folder of its own: every test of the
// suite skips, with the script's output, when the script fails (no Python with the packages it needs).
//   class Images : public fastlearn::testing::PythonData<Images> {
//    protected:
//     static void SetUpTestSuite() { make("images", "'{python}' '{source}/scripts/make-image-folders' '{dir}'"); }
//   };
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

#include "support/build_paths.h"
#include "support/processes.h"

namespace fastlearn::testing {

template <class Suite>
class PythonData : public ::testing::Test {
 protected:
  /// Runs `command` through the shell, its {python}, {source} and {dir} replaced by the build's Python, the
  /// source tree and the suite's folder (<tmp>/fastlearn-<name>-<pid>).
  static void make(const std::string& name, const std::string& command) {
    dir_ = std::filesystem::temp_directory_path() / fmt::format("fastlearn-{}-{}", name, ::getpid());
    std::filesystem::create_directories(dir_);
    const auto [code, output] =
        run_shell(fmt::format(fmt::runtime(command + " 2>&1"), fmt::arg("python", FASTLEARN_PYTHON),
                              fmt::arg("source", FASTLEARN_SOURCE_DIR), fmt::arg("dir", dir_.string())));
    made_ = code == 0;
    why_ = fmt::format("`{}` failed: {}", command, output);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  void SetUp() override {
    if (!made_) GTEST_SKIP() << "the test data needs a Python with the packages the script imports: " << why_;
  }
  static inline std::filesystem::path dir_;
  static inline bool made_ = false;
  static inline std::string why_;
};

}  // namespace fastlearn::testing
