#pragma once
// Which instruction set fastlearn's own vector kernels (models/one_channel_conv, models/direct_conv) run.
#include <cstdint>

namespace fastlearn::models {

/// The instruction set the kernels run: the widest this CPU has (AVX-512, AVX2, or plain code), or a narrower
/// one where the CPU runs it (the tests compare the variants on one machine).
enum class KernelIsa { widest, avx2, baseline };

/// The variant that runs when `asked` is asked for on this CPU: `asked` where the CPU has it, else the next
/// narrower one (widest resolves to avx512 where the CPU has AVX-512F, AVX-512VL and FMA). Not x86: baseline.
enum class ResolvedIsa { avx512, avx2, baseline };
ResolvedIsa resolve_isa(KernelIsa asked);

}  // namespace fastlearn::models
