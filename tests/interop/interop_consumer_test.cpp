// fastlearn as a dependency of another CMake project (tests/interop/consumer): installed with
// `cmake --install` into a prefix, found there with find_package(fastlearn), built and run; and taken
// in with add_subdirectory (what FetchContent_MakeAvailable does), configured with only the library.
// The work happens under <build>/interop, at fixed paths, so ccache serves the second run.
#include <gtest/gtest.h>

#include <fmt/format.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>

#include "support/build_paths.h"
#include "support/processes.h"

namespace fs = std::filesystem;

namespace {

using fastlearn::testing::run_shell;

const fs::path kWork = fs::path(FASTLEARN_BUILD_DIR) / "interop";
const fs::path kConsumer = fs::path(FASTLEARN_SOURCE_DIR) / "tests" / "interop" / "consumer";

std::string launcher() {
  return std::string(FASTLEARN_CCACHE).empty() ? ""
                                               : fmt::format("-DCMAKE_CXX_COMPILER_LAUNCHER='{}'", FASTLEARN_CCACHE);
}

// -DCMAKE_PREFIX_PATH with `first` (when given), then the build's own prefix path: a consumer is configured
// where its parent found its dependencies (on the GPU machine, the unpacked kit's Gloo headers).
std::string prefix_path_flag(const std::string& first = "") {
  std::string list = first;
  const std::string parent = FASTLEARN_PREFIX_PATH;
  if (!parent.empty()) list += (list.empty() ? "" : ";") + parent;
  return list.empty() ? std::string() : fmt::format("-DCMAKE_PREFIX_PATH='{}'", list);
}

std::string slurp(const fs::path& file) {
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The one ```cmake block of a guide.
std::string cmake_block(const fs::path& guide) {
  const std::string text = slurp(guide), open = "```cmake\n";
  const auto begin = text.find(open);
  if (begin == std::string::npos) return "";
  const auto end = text.find("```", begin + open.size());
  return text.substr(begin + open.size(), end - begin - open.size());
}

void replace_once(std::string& text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  ASSERT_NE(at, std::string::npos) << from << " in " << text;
  text.replace(at, from.size(), to);
}

}  // namespace

TEST(InstalledPackage, AnOutOfTreeProjectFindsBuildsAndRunsAgainstIt) {
  const auto prefix = kWork / "prefix", build = kWork / "package-build";
  fs::remove_all(prefix);
  fs::remove_all(build);
  auto [status, out] = run_shell(
      fmt::format("'{}' --install '{}' --prefix '{}'", FASTLEARN_CMAKE, FASTLEARN_BUILD_DIR, prefix.string()));
  ASSERT_EQ(status, 0) << out;
  // The layout a user includes and links from.
  for (const char* file :
       {"include/fastlearn/fastlearn.h", "include/fastlearn/learner/learner.h",
        "include/fastlearn/callbacks/tensorboard.h", "include/fastlearn/comm/runtime.h", "lib/libfastlearn.a",
        "lib/cmake/fastlearn/fastlearnConfig.cmake", "lib/cmake/fastlearn/fastlearnConfigVersion.cmake",
        "lib/cmake/fastlearn/fastlearnTargets.cmake", "bin/fastlearn", "libexec/fastlearn/fastlearn-torch",
        "include/fastlearn/c/fastlearn.h", "include/fastlearn/c/fastlearn.f90",
        "include/fastlearn/fortran/fastlearn.mod", "lib/libfastlearn_fortran.a"}) {
    EXPECT_TRUE(fs::exists(prefix / file)) << file;
  }
  EXPECT_FALSE(fs::exists(prefix / "include/fastlearn/learner/learner.cpp")) << "sources are not headers";
  for (const auto& entry : fs::recursive_directory_iterator(prefix / "include"))
    EXPECT_NE(entry.path().filename(), "detail") << "internal headers are not installed: " << entry.path();
  // What a user downloads or installs: the library and the CLI without their debug info (420 MB as built).
  std::uintmax_t package_bytes = 0;
  for (const auto& entry : fs::recursive_directory_iterator(prefix)) {
    if (entry.is_regular_file()) package_bytes += entry.file_size();
  }
  fmt::print("installed package: {:.1f} MiB\n", static_cast<double>(package_bytes) / (1 << 20));
  EXPECT_LE(package_bytes, 60u << 20) << "the installed package holds " << package_bytes / (1 << 20) << " MiB";

  const auto examples = fs::path(FASTLEARN_SOURCE_DIR) / "apps" / "examples";
  std::tie(status, out) = run_shell(
      fmt::format("'{}' -S '{}' -B '{}' -G Ninja -DCMAKE_BUILD_TYPE=Release {} {} -DFASTLEARN_README_APP='{}'",
                  FASTLEARN_CMAKE, kConsumer.string(), build.string(), prefix_path_flag(prefix.string()), launcher(),
                  (fs::path(FASTLEARN_BUILD_DIR) / "tests/readme/src/quick_start.cpp").string()));
  ASSERT_EQ(status, 0) << out;
  // It was the installed package, not the build tree, that the consumer found.
  EXPECT_NE(slurp(build / "CMakeCache.txt").find("fastlearn_DIR:PATH=" + (prefix / "lib/cmake/fastlearn").string()),
            std::string::npos);
  std::tie(status, out) = run_shell(fmt::format("'{}' --build '{}'", FASTLEARN_CMAKE, build.string()));
  ASSERT_EQ(status, 0) << out;
  std::tie(status, out) = run_shell((build / "consumer").string());
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("consumer: accuracy"), std::string::npos) << out;
  EXPECT_TRUE(fs::exists(build / "readme_app")) << "the README's first program builds from the installed headers";
  // A C project and a Fortran project as docs/c_fortran.md shows them (project(solver C): C++ is not enabled),
  // the heat solver as their solver, train their surrogate through the installed C interface and module.
  const std::string c_project = cmake_block(fs::path(FASTLEARN_SOURCE_DIR) / "docs/c_fortran.md");
  ASSERT_NE(c_project.find("project(solver C)"), std::string::npos) << c_project;
  for (const auto& [language, source] : {std::pair{"C", "heat_surrogate.c"}, {"Fortran", "heat_surrogate.f90"}}) {
    std::string project = c_project;
    if (std::string(language) == "Fortran") {
      replace_once(project, "project(solver C)", "project(solver Fortran)");
      replace_once(project, "solver.c", "solver.f90");
      replace_once(project, "fastlearn::fastlearn", "fastlearn::fortran");
    }
    const auto solver_src = kWork / fmt::format("solver-{}-src", language);
    const auto solver_build = kWork / fmt::format("solver-{}-build", language);
    fs::remove_all(solver_src);
    fs::remove_all(solver_build);
    fs::create_directories(solver_src);
    std::ofstream(solver_src / "CMakeLists.txt") << project;
    fs::copy_file(examples / source, solver_src / (std::string(language) == "C" ? "solver.c" : "solver.f90"));
    std::tie(status, out) =
        run_shell(fmt::format("'{}' -S '{}' -B '{}' -G Ninja -DCMAKE_BUILD_TYPE=Release {} {} && '{}' --build '{}'",
                              FASTLEARN_CMAKE, solver_src.string(), solver_build.string(),
                              prefix_path_flag(prefix.string()), launcher(), FASTLEARN_CMAKE, solver_build.string()));
    ASSERT_EQ(status, 0) << language << ": " << out;
    EXPECT_NE(out.find("fastlearn: enabling CXX"), std::string::npos) << language << ": " << out;
    std::tie(status, out) =
        run_shell(fmt::format("cd '{}' && ./solver '{}'", solver_build.string(),
                              (fs::path(FASTLEARN_SOURCE_DIR) / "configs/heat_surrogate.toml").string()));
    EXPECT_EQ(status, 0) << language << ": " << out;
    EXPECT_NE(out.find(": 1000 steps on 1 rank(s)"), std::string::npos) << language << ": " << out;
    if (!HasFailure()) {
      fs::remove_all(solver_src);
      fs::remove_all(solver_build);
    }
  }

  // The installed CLI runs from the prefix (it finds LibTorch without the build tree).
  std::tie(status, out) = run_shell((prefix / "bin/fastlearn").string() + " --version");
  EXPECT_EQ(status, 0) << out;
  EXPECT_NE(out.find("fastlearn"), std::string::npos) << out;
  // ... and launches (rank 0 serving the rendezvous store).
  std::tie(status, out) = run_shell((prefix / "bin/fastlearn").string() + " launch --nproc-per-node 2 -- /bin/true");
  EXPECT_EQ(status, 0) << out;

  // find_package(fastlearn 9.0) does not accept this 0.x package.
  const auto src = kWork / "version-src", version_build = kWork / "version-build";
  fs::remove_all(version_build);
  fs::create_directories(src);
  std::ofstream(src / "CMakeLists.txt") << "cmake_minimum_required(VERSION 3.25)\nproject(v LANGUAGES NONE)\n"
                                           "find_package(fastlearn 9.0 REQUIRED CONFIG)\n";
  std::tie(status, out) = run_shell(fmt::format("'{}' -S '{}' -B '{}' -DCMAKE_PREFIX_PATH='{}'", FASTLEARN_CMAKE,
                                                src.string(), version_build.string(), prefix.string()));
  EXPECT_NE(status, 0) << out;
  EXPECT_NE(out.find("compatible with requested version \"9.0\""), std::string::npos) << out;
  if (!HasFailure()) {  // the consumer's build holds a copy of the library
    for (const auto& dir : {prefix, build, src, version_build}) fs::remove_all(dir);
  }
}

TEST(SourceTree, AddSubdirectoryConfiguresOnlyTheLibraryForTheParent) {
  const auto build = kWork / "subdirectory-build";
  fs::remove_all(build);
  auto [status, out] =
      run_shell(fmt::format("'{}' -S '{}' -B '{}' -G Ninja -DCMAKE_BUILD_TYPE=Release -DFASTLEARN_SOURCE='{}' "
                            "-DFASTLEARN_PYTHON='{}' {} {}",
                            FASTLEARN_CMAKE, kConsumer.string(), build.string(), FASTLEARN_SOURCE_DIR, FASTLEARN_PYTHON,
                            prefix_path_flag(), launcher()));
  ASSERT_EQ(status, 0) << out;
  const auto ninja = slurp(build / "build.ninja");
  EXPECT_NE(ninja.find("build consumer:"), std::string::npos) << "the parent's target links fastlearn::fastlearn";
  EXPECT_NE(ninja.find("libfastlearn.a"), std::string::npos);
  EXPECT_EQ(ninja.find("launcher_test"), std::string::npos) << "tests are the top-level project's only";
  EXPECT_EQ(ninja.find("fastlearn_cli"), std::string::npos) << "apps are the top-level project's only";
  fs::remove_all(build);
}

// CXX=clang++ without CC: fastlearn's own configure takes the clang beside it for C (a GNU cc would give the
// precompiled header GCC's settings); a C compiler of the other family chosen by hand gets a warning that says so.
TEST(TopLevelBuild, TheCCompilerFollowsTheCxxCompilersFamily) {
  const auto build = kWork / "compiler-mix-build";
  const auto configure = [&](const std::string& env) {
    fs::remove_all(build);
    return run_shell(fmt::format(
        "env -u CC -u CXX {} '{}' -S '{}' -B '{}' -G Ninja -DFASTLEARN_PYTHON='{}' -DFASTLEARN_BUILD_TESTS=OFF "
        "-DFASTLEARN_BUILD_APPS=OFF -DFASTLEARN_BUILD_BENCHMARKS=OFF {} 2>&1",
        env, FASTLEARN_CMAKE, FASTLEARN_SOURCE_DIR, build.string(), FASTLEARN_PYTHON, prefix_path_flag()));
  };
  if (run_shell("command -v clang++ && command -v clang && command -v gcc").first != 0)
    GTEST_SKIP() << "needs clang++, clang and gcc";
  auto [status, out] = configure("CXX=clang++");
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("The C compiler identification is Clang"), std::string::npos) << out;
  EXPECT_EQ(out.find("the C compiler is GNU"), std::string::npos) << out;
  std::tie(status, out) = configure("CXX=clang++ CC=gcc");
  ASSERT_EQ(status, 0) << out;
  EXPECT_NE(out.find("fastlearn: the C compiler is GNU"), std::string::npos) << out;
  EXPECT_NE(out.find("CC=clang with CXX=clang++"), std::string::npos) << out;
  fs::remove_all(build);
}
