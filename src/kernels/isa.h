#pragma once
// Which instruction-set implementation the kernels dispatch to. Detected once from cpuid; the
// environment variable CRESCENT_ISA=portable|avx2|avx512|avx512bf16 or set_active_isa() picks a
// lower one (tests compare every ISA path against the portable one this way).
//
// Thread-safety: all functions are safe to call concurrently; set_active_isa() takes effect for
// kernels started after it returns.

#include <string_view>

#include "core/status.h"

namespace crescent::kernels {

// Ordered: each level implies the ones before it on every CPU we dispatch for.
// kAvx2 = AVX2+FMA+F16C; kAvx512 = F+BW+VL+DQ; kAvx512Bf16 = kAvx512 + AVX512-BF16 + AVX512-VNNI.
enum class Isa { kPortable, kAvx2, kAvx512, kAvx512Bf16 };

Isa detected_isa();
Isa active_isa();
// Fails with kFailedPrecondition if the CPU lacks `isa`.
Status set_active_isa(Isa isa);
std::string_view isa_name(Isa isa);
// Parses "portable", "avx2", "avx512" or "avx512bf16".
Result<Isa> parse_isa(std::string_view name);

// Which prefill GEMM BF16 weights get where both exist (avx512bf16): true = vdpbf16ps (the
// activations rounded to BF16), false = f32 FMAs on the weights widened in registers (the
// activations exact). By default false on Intel CPUs, whose vdpbf16ps (Sapphire / Emerald
// Rapids) does its 32 multiply-adds at half the FMA's instruction rate, so FMAs do more work a
// cycle; true elsewhere (AMD's Zen 4 / 5 run it at the FMA's rate: twice its work). See
// docs/kernels.md. CRESCENT_BF16_GEMM=dot|fma or set_bf16_gemm_uses_dot() overrides.
bool bf16_gemm_uses_dot();
void set_bf16_gemm_uses_dot(bool use_dot);

}  // namespace crescent::kernels
