#include <fastlearn/models/detail/kernel_isa.h>

namespace fastlearn::models {

namespace {

// The widest instruction set this CPU runs, asked once.
ResolvedIsa widest_isa() {
#if defined(__x86_64__)
  static const ResolvedIsa isa = [] {
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
      return ResolvedIsa::avx512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return ResolvedIsa::avx2;
    return ResolvedIsa::baseline;
  }();
  return isa;
#else
  return ResolvedIsa::baseline;
#endif
}

}  // namespace

ResolvedIsa resolve_isa(KernelIsa asked) {
  const ResolvedIsa widest = widest_isa();
  if (asked == KernelIsa::baseline || widest == ResolvedIsa::baseline) return ResolvedIsa::baseline;
  return asked == KernelIsa::avx2 ? ResolvedIsa::avx2 : widest;
}

}  // namespace fastlearn::models
