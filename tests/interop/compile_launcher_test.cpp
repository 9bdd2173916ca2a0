// cmake/compile_launcher and cmake/pch_sum: what lets a second checkout of the project hit the ccache entries of
// the first with clang's precompiled header. A wrong .sum would hand out objects built against another header,
// so these check that the digest ignores only the build directory, and that a failed header leaves no .sum.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "support/build_paths.h"
#include "support/processes.h"

namespace fs = std::filesystem;
using fastlearn::testing::run_shell;

namespace {

const fs::path source_dir = FASTLEARN_SOURCE_DIR;

void write(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream(path) << text;
}

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class CompileLauncher : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("fastlearn-launcher-" + std::to_string(::getpid()) + "-" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A build directory `name` holding a header and the dependency file its compile would write (the header by
  // absolute path, as clang writes it); then the .sum pch_sum writes for it.
  std::string sum_for(const std::string& name, const std::string& header_text,
                      const std::string& extra_arg = "-DVALUE=1") {
    const auto build = root_ / name / "build";
    write(build / "CMakeFiles/t.dir/cmake_pch.hxx", header_text);
    write(build / "CMakeFiles/t.dir/cmake_pch.hxx.pch.d",
          "CMakeFiles/t.dir/cmake_pch.hxx.pch: \\\n  " + (build / "CMakeFiles/t.dir/cmake_pch.hxx").string() + "\n");
    const auto command = "cd '" + build.string() + "' && python3 '" + (source_dir / "cmake/pch_sum").string() +
                         "' CMakeFiles/t.dir/cmake_pch.hxx.pch /bin/true " + extra_arg + " -I'" + build.string() +
                         "/include' -Xclang -include -Xclang '" + build.string() +
                         "/CMakeFiles/t.dir/cmake_pch.hxx' -MF CMakeFiles/t.dir/cmake_pch.hxx.pch.d 2>&1";
    const auto [code, output] = run_shell(command);
    EXPECT_EQ(code, 0) << output;
    return read(build / "CMakeFiles/t.dir/cmake_pch.hxx.pch.sum");
  }

  fs::path root_;
};

TEST_F(CompileLauncher, PchSumIsTheSameInAnotherBuildDirectoryAndChangesWithTheInputs) {
  const auto first = sum_for("a", "#include <vector>\n");
  ASSERT_EQ(first.size(), 65u) << first;  // a sha256 in hex and a newline
  EXPECT_EQ(sum_for("a-checkout-with-a-longer-path", "#include <vector>\n"), first);
  EXPECT_NE(sum_for("b", "#include <map>\n"), first) << "the header's content is an input";
  EXPECT_NE(sum_for("c", "#include <vector>\n", "-DVALUE=2"), first) << "the arguments are inputs";
}

TEST_F(CompileLauncher, MakesThePrecompiledHeadersIncludePathRelativeToTheBuildDirectory) {
  // /bin/echo stands in for ccache: it prints the command it would have run.
  const auto command = "cd '" + root_.string() + "' && '" + (source_dir / "cmake/compile_launcher").string() +
                       "' /bin/echo clang++ -Xclang -include -Xclang '" + root_.string() +
                       "/CMakeFiles/t.dir/cmake_pch.hxx' -include /elsewhere/x.h -c '" + root_.string() + "/a.cpp'";
  const auto [code, output] = run_shell(command);
  ASSERT_EQ(code, 0) << output;
  EXPECT_EQ(output, "clang++ -Xclang -include -Xclang CMakeFiles/t.dir/cmake_pch.hxx -include /elsewhere/x.h -c " +
                        root_.string() + "/a.cpp\n");
}

TEST_F(CompileLauncher, AFailedPrecompiledHeaderLeavesNoSumBehind) {
  write(root_ / "h.pch.sum", "an old digest\n");
  // The header's compile fails (/bin/false): the old .sum must not describe whatever .pch is left.
  const auto command = "cd '" + root_.string() + "' && '" + (source_dir / "cmake/compile_launcher").string() +
                       "' /bin/echo /bin/false -Xclang -emit-pch -o h.pch -MF h.pch.d 2>&1";
  const auto [code, output] = run_shell(command);
  EXPECT_NE(code, 0) << output;
  EXPECT_FALSE(fs::exists(root_ / "h.pch.sum"));
}

TEST_F(CompileLauncher, ASuccessfulPrecompiledHeaderGetsItsSum) {
  write(root_ / "h.pch.d", "h.pch: " + (root_ / "h.hxx").string() + "\n");
  write(root_ / "h.hxx", "int x;\n");
  // /bin/true stands in for the compiler; the header compile never goes through ccache (/bin/false here).
  const auto command = "cd '" + root_.string() + "' && '" + (source_dir / "cmake/compile_launcher").string() +
                       "' /bin/false /bin/true -Xclang -emit-pch -o h.pch -MF h.pch.d 2>&1";
  const auto [code, output] = run_shell(command);
  ASSERT_EQ(code, 0) << output;
  EXPECT_EQ(read(root_ / "h.pch.sum").size(), 65u);
}

}  // namespace
