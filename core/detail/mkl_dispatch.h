#pragma once
// MKL, the matrix-product library inside LibTorch's CPU build, asks whether the processor is Intel's before it
// looks at its instruction sets: on AMD processors it runs its generic AVX2 kernels even where AVX-512 is there
// (Zen 4 and later). fastlearn answers that question (`mkl_serv_intel_cpu_true`, which LibTorch calls through
// its dynamic symbol table, so the definition in an app that links fastlearn comes first) with yes, and MKL then
// chooses by the instruction sets the processor reports, as it does on Intel's. On Intel processors nothing
// changes. Measured by bench `mkl_by_features`; FASTLEARN_MKL_BY_FEATURES=0 leaves MKL's own answer. MKL asks
// once per process, at its first product.

namespace fastlearn {

/// Whether MKL is told to choose its kernels by instruction sets (FASTLEARN_MKL_BY_FEATURES unset or 1).
/// Throws ConfigError on another value. The Learner calls it, which also links the answer into every app that
/// trains.
bool mkl_chooses_by_features();

}  // namespace fastlearn
