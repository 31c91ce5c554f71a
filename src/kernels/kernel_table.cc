#include "kernels/kernel_table.h"

#include <array>

#include "kernels/kquant_x16.h"
#include "kernels/legacy_x16.h"

namespace crescent::kernels::internal {
namespace {

std::array<KernelTable, 4> build_tables() {
  std::array<KernelTable, 4> tables;
  KernelTable t;
  fill_portable(&t);
  fill_quant_portable(&t);
  fill_kv_portable(&t);
  tables[static_cast<int>(Isa::kPortable)] = t;
  Isa best = detected_isa();
  // Only run a fill function whose instructions the CPU has; an unsupported level keeps the
  // lower table (set_active_isa refuses to select it anyway).
  if (best >= Isa::kAvx2) {
    fill_avx2(&t);
    fill_attention_avx2(&t);
    fill_gemm_f32_avx2(&t);
    fill_quant_avx2(&t);
    fill_kv_avx2(&t);
  }
  tables[static_cast<int>(Isa::kAvx2)] = t;
  if (best >= Isa::kAvx512) {
    fill_avx512(&t);
    fill_attention_avx512(&t);
    fill_gemm_f32_avx512(&t);
    fill_kv_avx512(&t);
  }
  tables[static_cast<int>(Isa::kAvx512)] = t;
  if (best >= Isa::kAvx512Bf16) {
    fill_avx512bf16(&t);
    fill_gemm_ggml_avx512vnni(&t);
    fill_gemv_legacy_x16_avx512vnni(&t);
    fill_gemv_kquant_x16_avx512vnni(&t);
  }
  tables[static_cast<int>(Isa::kAvx512Bf16)] = t;
  return tables;
}

}  // namespace

MatmulPanelsFn x16_gemv(const KernelTable& table, DType dtype) {
  if (is_legacy_block_type(dtype))
    return table.gemv_legacy_x16;
  if (is_kquant_x16_type(dtype))
    return table.gemv_kquant_x16;
  return nullptr;
}

const KernelTable& kernel_table(Isa isa) {
  static const std::array<KernelTable, 4> tables = build_tables();
  return tables[static_cast<int>(isa)];
}

}  // namespace crescent::kernels::internal
