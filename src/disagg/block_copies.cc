#include "disagg/block_copies.h"

#include "core/check.h"

namespace crescent::disagg {

std::vector<BlockCopy> coalesce_block_copies(std::span<const int32_t> src,
                                             std::span<const int32_t> dst) {
  CRESCENT_CHECK_EQ(src.size(), dst.size());
  std::vector<BlockCopy> out;
  for (size_t i = 0; i < src.size(); ++i) {
    if (!out.empty()) {
      BlockCopy& last = out.back();
      if (int64_t{last.src_block} + last.num_blocks == src[i] &&
          int64_t{last.dst_block} + last.num_blocks == dst[i]) {
        ++last.num_blocks;
        continue;
      }
    }
    out.push_back(BlockCopy{src[i], dst[i], 1});
  }
  return out;
}

}  // namespace crescent::disagg
