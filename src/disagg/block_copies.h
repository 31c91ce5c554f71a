#pragma once
// Which byte ranges one KV transfer moves. Block b of an engine's KV memory is the contiguous
// range [b * block_bytes, +block_bytes), so a run of consecutive block ids on both sides is one
// contiguous copy; a prompt whose blocks were allocated together moves as a few large ops.

#include <cstdint>
#include <span>
#include <vector>

namespace crescent::disagg {

struct BlockCopy {
  int32_t src_block = 0;
  int32_t dst_block = 0;
  int32_t num_blocks = 0;
};

// Pairs src[i] -> dst[i] (same length), merging neighbours where both ids are consecutive.
std::vector<BlockCopy> coalesce_block_copies(std::span<const int32_t> src,
                                             std::span<const int32_t> dst);

}  // namespace crescent::disagg
