// core/mkl_dispatch: the app's answer to MKL's vendor question is the one LibTorch's MKL gets, it moves MKL off
// its generic kernels on a processor that is not Intel's, the products it then runs are right, and the switch
// FASTLEARN_MKL_BY_FEATURES turns it off.
#include <fastlearn/core/detail/mkl_dispatch.h>
#include <fastlearn/core/error.h>
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#endif
#include <dlfcn.h>
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <stdexcept>
#include <string>

extern "C" int mkl_serv_intel_cpu_true();

namespace {

using MklInt = int (*)();

MklInt mkl_function(const char* name) { return reinterpret_cast<MklInt>(dlsym(RTLD_DEFAULT, name)); }

#if defined(__x86_64__)
bool intel_processor() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __get_cpuid(0, &eax, &ebx, &ecx, &edx);
  char vendor[13] = {};
  std::memcpy(vendor, &ebx, 4);
  std::memcpy(vendor + 4, &edx, 4);
  std::memcpy(vendor + 8, &ecx, 4);
  return std::string(vendor) == "GenuineIntel";
}
#endif

struct EnvValue {
  EnvValue(const char* name, const char* value) : name_(name) { setenv(name, value, 1); }
  ~EnvValue() { unsetenv(name_); }
  const char* name_;
};

// Started again as a child with FASTLEARN_MKL_TEST_CHILD set, this binary prints MKL's branch for the processor
// (0: its generic kernels) and exits before any test runs: MKL decides once per process, at its first call, so
// the branch must come from a process that has made no product yet.
[[maybe_unused]] const bool mkl_test_child = [] {
  if (std::getenv("FASTLEARN_MKL_TEST_CHILD") == nullptr) return false;
  const auto detect = mkl_function("mkl_serv_cpu_detect");
  std::printf("%d\n", detect != nullptr ? detect() : -1);
  std::fflush(stdout);
  std::_Exit(0);
}();

// MKL's branch in a new process of this binary with the switch at `value`.
int mkl_branch_in_child(const char* value) {
  const auto command =
      fmt::format("FASTLEARN_MKL_TEST_CHILD=1 FASTLEARN_MKL_BY_FEATURES={} /proc/{}/exe", value, getpid());
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(::popen(command.c_str(), "r"), ::pclose);
  int branch = -1;
  if (!pipe || std::fscanf(pipe.get(), "%d", &branch) != 1) throw std::runtime_error("no branch from " + command);
  return branch;
}

TEST(MklDispatch, LibTorchsMklGetsTheAppsAnswerAndLeavesItsGenericKernels) {
#if !defined(__x86_64__)
  GTEST_SKIP() << "MKL's processor branches are x86's";
#else
  if (dlsym(RTLD_NEXT, "mkl_serv_intel_cpu_true") == nullptr || mkl_function("mkl_serv_cpu_detect") == nullptr)
    GTEST_SKIP() << "this LibTorch has no MKL";
  // The executable exports its definition, so LibTorch's calls bind to it rather than to MKL's own.
  EXPECT_EQ(dlsym(RTLD_DEFAULT, "mkl_serv_intel_cpu_true"), reinterpret_cast<void*>(&mkl_serv_intel_cpu_true));
  const int by_features = mkl_branch_in_child("1"), as_shipped = mkl_branch_in_child("0");
  if (intel_processor()) {
    EXPECT_EQ(by_features, as_shipped) << "on Intel's processors MKL's choice must not change";
  } else if (__builtin_cpu_supports("avx2")) {
    EXPECT_EQ(as_shipped, 0) << "MKL as shipped runs its generic kernels on this processor";
    EXPECT_GT(by_features, as_shipped) << "told to choose by instruction sets, MKL takes a branch of its own";
  }
#endif
}

TEST(MklDispatch, ProductsOnTheKernelsMklNowChoosesAreRight) {
  torch::manual_seed(0);
  for (const auto& [m, k, n] : {std::array<std::int64_t, 3>{512, 1152, 256}, {128, 784, 512}, {37, 300, 19}}) {
    const auto a = torch::randn({m, k}), b = torch::randn({k, n});
    const auto exact = at::mm(a.to(torch::kDouble), b.to(torch::kDouble));
    const auto error = (at::mm(a, b).to(torch::kDouble) - exact).abs().max().item<double>();
    EXPECT_LT(error, 1e-4 * std::sqrt(static_cast<double>(k)) * exact.abs().max().item<double>())
        << m << "x" << k << "x" << n;
    const auto transposed = at::mm(a.t().contiguous().t(), b.t().contiguous().t());  // the transposed kernels
    EXPECT_TRUE(torch::allclose(transposed, at::mm(a, b), 1e-4, 1e-3)) << m << "x" << k << "x" << n;
  }
}

TEST(MklDispatch, TheSwitchLeavesMklsOwnAnswerAndABadValueIsAnError) {
  const auto mkls_own = reinterpret_cast<MklInt>(dlsym(RTLD_NEXT, "mkl_serv_intel_cpu_true"));
  if (mkls_own == nullptr) GTEST_SKIP() << "this LibTorch has no MKL";
  EXPECT_TRUE(fastlearn::mkl_chooses_by_features());
  EXPECT_EQ(mkl_serv_intel_cpu_true(), 1);
  {
    const EnvValue off("FASTLEARN_MKL_BY_FEATURES", "0");
    EXPECT_FALSE(fastlearn::mkl_chooses_by_features());
    EXPECT_EQ(mkl_serv_intel_cpu_true(), mkls_own());
  }
  const EnvValue bad("FASTLEARN_MKL_BY_FEATURES", "yes");
  try {
    fastlearn::mkl_chooses_by_features();
    ADD_FAILURE() << "no error for FASTLEARN_MKL_BY_FEATURES=yes";
  } catch (const fastlearn::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("FASTLEARN_MKL_BY_FEATURES is 'yes'"), std::string::npos) << e.what();
  }
  EXPECT_EQ(mkl_serv_intel_cpu_true(), mkls_own()) << "a bad value leaves MKL's own answer, and nothing is thrown";
}

}  // namespace
