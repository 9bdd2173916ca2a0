#pragma once
// Where this checkout and its build are: for tests that run the project's programs and read its files.
// tests/CMakeLists.txt generates the build's values into one small file of the build directory instead of
// passing them as -D flags, so that no other test object depends on where the project is checked out and a
// second checkout hits the ccache entries of the first (the paths differ, the compile commands do not).
//
// Two environment variables move them at run time, for test binaries that run away from their build (the
// prebuilt GPU kit of scripts/device-kit): FASTLEARN_TEST_SOURCE_DIR replaces the checkout, and
// FASTLEARN_TEST_BUILD_DIR the build directory, under which every program path below is then taken (the same
// path relative to it). The build machine's tools (cmake, ccache, the prefix path) stay as they are.
namespace fastlearn::testing::build_paths {

const char* source_dir();    ///< the checkout
const char* build_dir();     ///< its build directory
const char* cli();           ///< the fastlearn CLI
const char* cmake();         ///< the cmake that configured the build
const char* ccache();        ///< ccache, or "" when the build found none
const char* fault_probe();   ///< tests/fault_probe
const char* fashion_app();   ///< the fashion_mnist example app
const char* tiny_train();    ///< tests/interop_tiny_train
const char* launch_probe();  ///< tests/launch_probe
const char* bin_dir();       ///< where the build puts its programs
const char* prefix_path();   ///< the build's CMAKE_PREFIX_PATH (a CMake list; often empty)

}  // namespace fastlearn::testing::build_paths

// The names the tests used when these were -D flags.
#define FASTLEARN_SOURCE_DIR (::fastlearn::testing::build_paths::source_dir())
#define FASTLEARN_BUILD_DIR (::fastlearn::testing::build_paths::build_dir())
#define FASTLEARN_CLI (::fastlearn::testing::build_paths::cli())
#define FASTLEARN_CMAKE (::fastlearn::testing::build_paths::cmake())
#define FASTLEARN_CCACHE (::fastlearn::testing::build_paths::ccache())
#define FASTLEARN_FAULT_PROBE (::fastlearn::testing::build_paths::fault_probe())
#define FASTLEARN_FASHION_APP (::fastlearn::testing::build_paths::fashion_app())
#define FASTLEARN_TINY_TRAIN (::fastlearn::testing::build_paths::tiny_train())
#define FASTLEARN_LAUNCH_PROBE (::fastlearn::testing::build_paths::launch_probe())
#define FASTLEARN_PREFIX_PATH (::fastlearn::testing::build_paths::prefix_path())
#define FASTLEARN_BIN_DIR (::fastlearn::testing::build_paths::bin_dir())
