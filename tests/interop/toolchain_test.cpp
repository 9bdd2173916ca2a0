// How fastlearn's programs are linked. Some LibTorch wheels (2.11.0 among them) export std::filesystem
// functions of their own from libtorch.so, and those crash when called (remove_all jumped to address 0 on
// the GPU machine). cmake/FastlearnTorch.cmake names the shared libstdc++ first so that the standard
// library's names bind to it, also with a toolchain whose -lstdc++ finds only the static archive.
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

namespace fs = std::filesystem;

TEST(Toolchain, StdFilesystemIsTheStandardLibrarysNotACopyInsideLibTorch) {
  using RemoveAll = std::uintmax_t (*)(const fs::path&);
  const RemoveAll remove_all = &fs::remove_all;
  Dl_info info{};
  ASSERT_NE(dladdr(reinterpret_cast<void*>(remove_all), &info), 0) << "dladdr found no object for remove_all";
  ASSERT_NE(info.dli_fname, nullptr);
  const std::string object = info.dli_fname;
  EXPECT_EQ(object.find("libtorch"), std::string::npos) << "std::filesystem::remove_all binds to " << object;

  // And the calls work: a small tree is created, walked and removed.
  const fs::path dir = fs::temp_directory_path() / ("fastlearn-toolchain-" + std::to_string(::getpid()));
  fs::create_directories(dir / "a" / "b");
  std::ofstream(dir / "a" / "b" / "file") << "x";
  std::size_t entries = 0;
  for ([[maybe_unused]] const auto& entry : fs::recursive_directory_iterator(dir)) ++entries;
  EXPECT_EQ(entries, 3u);
  EXPECT_EQ(remove_all(dir), 4u);
  EXPECT_FALSE(fs::exists(dir));
}
