#include <fastlearn/core/detail/mkl_dispatch.h>

#include <fastlearn/core/detail/env_switch.h>

#include <dlfcn.h>

namespace fastlearn {

bool mkl_chooses_by_features() {
  return env_switch_on("FASTLEARN_MKL_BY_FEATURES", "MKL's own choice: its generic kernels on non-Intel processors");
}

}  // namespace fastlearn

extern "C" int mkl_serv_intel_cpu_true();

// MKL's question "is this an Intel processor?". MKL calls it from C, so nothing may be thrown out of it: a bad
// switch value leaves MKL's own answer (the Learner reports the value).
extern "C" int mkl_serv_intel_cpu_true() {
  bool by_features = false;
  try {
    by_features = fastlearn::mkl_chooses_by_features();
  } catch (...) {}
  if (by_features) return 1;
  using Answer = int (*)();
  static const auto mkls_own = reinterpret_cast<Answer>(dlsym(RTLD_NEXT, "mkl_serv_intel_cpu_true"));
  return mkls_own != nullptr ? mkls_own() : 0;
}
