#include "kernels/x16.h"

#include "core/check.h"
#include "kernels/kquant_x16.h"
#include "kernels/legacy_x16.h"

namespace crescent::kernels {

namespace {

void check_args(DType type, int r) {
  CRESCENT_CHECK(has_x16_layout(type)) << dtype_name(type);
  CRESCENT_CHECK(r >= 0 && r < kX16Rows) << "row " << r << " of a " << kX16Rows << "-row group";
}

}  // namespace

bool has_x16_layout(DType type) {
  return is_legacy_block_type(type) || is_kquant_x16_type(type);
}

void store_x16_row(DType type, const std::byte* row, int64_t num_blocks, int r, std::byte* panel) {
  check_args(type, r);
  if (is_legacy_block_type(type)) {
    store_legacy_x16_row(type, row, num_blocks, r, panel);
  } else {
    store_kquant_x16_row(type, row, num_blocks, r, panel);
  }
}

void load_x16_row(DType type, const std::byte* panel, int64_t num_blocks, int r, std::byte* row) {
  check_args(type, r);
  if (is_legacy_block_type(type)) {
    load_legacy_x16_row(type, panel, num_blocks, r, row);
  } else {
    load_kquant_x16_row(type, panel, num_blocks, r, row);
  }
}

}  // namespace crescent::kernels
