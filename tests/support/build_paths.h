#pragma once
// Where this checkout and its build are: for tests that run the project's programs and read its files.
// tests/CMakeLists.txt generates their definitions into one small file of the build directory instead of
// passing them as -D flags, so that no other test object depends on where the project is checked out and a
// second checkout hits the ccache entries of the first (the paths differ, the compile commands do not).
namespace fastlearn::testing::build_paths {

extern const char* const source_dir;    ///< the checkout
extern const char* const build_dir;     ///< its build directory
extern const char* const cli;           ///< the fastlearn CLI
extern const char* const cmake;         ///< the cmake that configured the build
extern const char* const ccache;        ///< ccache, or "" when the build found none
extern const char* const fault_probe;   ///< tests/fault_probe
extern const char* const fashion_app;   ///< the fashion_mnist example app
extern const char* const tiny_train;    ///< tests/interop_tiny_train
extern const char* const launch_probe;  ///< tests/launch_probe
extern const char* const bin_dir;       ///< where the build puts its programs
extern const char* const prefix_path;   ///< the build's CMAKE_PREFIX_PATH (a CMake list; often empty)

}  // namespace fastlearn::testing::build_paths

// The names the tests used when these were -D flags.
#define FASTLEARN_SOURCE_DIR (::fastlearn::testing::build_paths::source_dir)
#define FASTLEARN_BUILD_DIR (::fastlearn::testing::build_paths::build_dir)
#define FASTLEARN_CLI (::fastlearn::testing::build_paths::cli)
#define FASTLEARN_CMAKE (::fastlearn::testing::build_paths::cmake)
#define FASTLEARN_CCACHE (::fastlearn::testing::build_paths::ccache)
#define FASTLEARN_FAULT_PROBE (::fastlearn::testing::build_paths::fault_probe)
#define FASTLEARN_FASHION_APP (::fastlearn::testing::build_paths::fashion_app)
#define FASTLEARN_TINY_TRAIN (::fastlearn::testing::build_paths::tiny_train)
#define FASTLEARN_LAUNCH_PROBE (::fastlearn::testing::build_paths::launch_probe)
#define FASTLEARN_PREFIX_PATH (::fastlearn::testing::build_paths::prefix_path)
#define FASTLEARN_BIN_DIR (::fastlearn::testing::build_paths::bin_dir)
