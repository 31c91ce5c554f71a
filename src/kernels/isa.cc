#include "kernels/isa.h"

#include <atomic>
#include <cstdlib>
#include <string>

#include "core/logging.h"

namespace crescent::kernels {
namespace {

Isa detect() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
  // GCC 12's __builtin_cpu_supports knows avx512bf16 and avx512vnni.
  bool bf16 =
      avx512 && __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vnni");
  if (bf16)
    return Isa::kAvx512Bf16;
  if (avx512)
    return Isa::kAvx512;
  if (avx2)
    return Isa::kAvx2;
#endif
  return Isa::kPortable;
}

Isa initial_active() {
  Isa best = detected_isa();
  const char* env = std::getenv("CRESCENT_ISA");
  if (env == nullptr || *env == '\0')
    return best;
  Result<Isa> isa = parse_isa(env);
  if (!isa.is_ok()) {
    CRESCENT_LOG(kWarn) << "ignoring CRESCENT_ISA: " << isa.status().to_string();
    return best;
  }
  if (static_cast<int>(*isa) > static_cast<int>(best)) {
    CRESCENT_LOG(kWarn) << "CRESCENT_ISA=" << env << " is not supported by this CPU; using "
                        << isa_name(best);
    return best;
  }
  return *isa;
}

bool initial_bf16_gemm_uses_dot() {
  bool use_dot = true;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  use_dot = !__builtin_cpu_is("intel");
#endif
  // Read once, in bf16_gemm_storage()'s static initialiser.
  const char* env = std::getenv("CRESCENT_BF16_GEMM");  // NOLINT(concurrency-mt-unsafe)
  if (env == nullptr || *env == '\0') {
    return use_dot;
  }
  const std::string_view choice(env);
  if (choice == "dot" || choice == "fma") {
    return choice == "dot";
  }
  CRESCENT_LOG(kWarn) << "ignoring CRESCENT_BF16_GEMM=" << env << " (expected dot or fma)";
  return use_dot;
}

std::atomic<bool>& bf16_gemm_storage() {
  static std::atomic<bool> use_dot{initial_bf16_gemm_uses_dot()};
  return use_dot;
}

std::atomic<Isa>& active_storage() {
  static std::atomic<Isa> active{initial_active()};
  return active;
}

}  // namespace

Isa detected_isa() {
  static const Isa isa = detect();
  return isa;
}

Isa active_isa() {
  return active_storage().load(std::memory_order_relaxed);
}

Status set_active_isa(Isa isa) {
  if (static_cast<int>(isa) > static_cast<int>(detected_isa())) {
    return failed_precondition("this CPU does not support " + std::string(isa_name(isa)) +
                               " (best: " + std::string(isa_name(detected_isa())) + ")");
  }
  active_storage().store(isa, std::memory_order_relaxed);
  return Status::ok();
}

bool bf16_gemm_uses_dot() {
  return bf16_gemm_storage().load(std::memory_order_relaxed);
}

void set_bf16_gemm_uses_dot(bool use_dot) {
  bf16_gemm_storage().store(use_dot, std::memory_order_relaxed);
}

std::string_view isa_name(Isa isa) {
  switch (isa) {
    case Isa::kPortable:
      return "portable";
    case Isa::kAvx2:
      return "avx2";
    case Isa::kAvx512:
      return "avx512";
    case Isa::kAvx512Bf16:
      return "avx512bf16";
  }
  return "unknown";
}

Result<Isa> parse_isa(std::string_view name) {
  for (Isa isa : {Isa::kPortable, Isa::kAvx2, Isa::kAvx512, Isa::kAvx512Bf16}) {
    if (name == isa_name(isa))
      return isa;
  }
  return invalid_argument("unknown ISA '" + std::string(name) +
                          "' (expected portable, avx2, avx512 or avx512bf16)");
}

}  // namespace crescent::kernels
