#include "kernels/x16.h"

#include "core/check.h"
#include "kernels/kquant_x16.h"
#include "kernels/legacy_x16.h"

namespace crescent::kernels {

bool has_x16_layout(DType type) {
  return is_legacy_block_type(type) || is_kquant_x16_type(type);
}

void store_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r, std::byte* panel) {
  CRESCENT_CHECK(has_x16_layout(type)) << dtype_name(type);
  if (is_legacy_block_type(type)) {
    store_legacy_x16_row(type, row, num_blocks, r, panel);
  } else {
    store_kquant_x16_row(type, row, num_blocks, r, panel);
  }
}

void load_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r, std::byte* row) {
  CRESCENT_CHECK(has_x16_layout(type)) << dtype_name(type);
  if (is_legacy_block_type(type)) {
    load_legacy_x16_row(type, panel, num_blocks, r, row);
  } else {
    load_kquant_x16_row(type, panel, num_blocks, r, row);
  }
}

}  // namespace crescent::kernels
