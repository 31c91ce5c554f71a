#pragma once
// Memory for packed weights, backed by transparent huge pages where the kernel gives them.
//
// Batch-1 decode reads every weight once per token, hundreds of MB, so each 4 KiB page of it
// costs a TLB miss, and in a virtual machine each miss is a two-level page walk. On the 2-vCPU
// EPYC VM this project is measured on, one thread reads 20-24 GB/s from 4 KiB pages and 30-35
// GB/s from 2 MiB pages. Weights are carved out of 2 MiB-aligned chunks marked
// MADV_HUGEPAGE (the Debian default `madvise` THP mode honours that), so even the small
// matrices (k_proj, 128x896) share huge pages with their neighbours; where THP is off they get
// ordinary pages and nothing else changes.
//
// Builds with AddressSanitizer give every weight its own heap block instead, so an overrun of
// one weight is still reported rather than landing in the next.

#include <cstddef>
#include <cstdint>
#include <memory>

namespace crescent::kernels {

// Where a weight's bytes come from. kModel: the huge-page chunks above, for weights that live as
// long as their model. kTransient: the heap, for packed temporaries made per request (a vision
// tower's K and V^T per image), which would otherwise take arena space that stays pinned while
// any model weight shares its chunk.
enum class WeightStorage { kModel, kTransient };

// `num_bytes` (> 0) of zeroed memory aligned to 64 bytes, alive while any copy of the pointer is.
// A chunk other than the one being carved is unmapped with its last block; the one being carved
// stays mapped (up to 64 MiB) and is carved again from its start once all of its blocks are gone.
std::shared_ptr<std::byte> allocate_weight_memory(int64_t num_bytes,
                                                  WeightStorage storage = WeightStorage::kModel);

struct WeightMemoryStats {
  int64_t chunks = 0;              // mapped chunks still alive
  int64_t mapped_bytes = 0;        // their total size
  int64_t current_chunk_live = 0;  // blocks of the chunk being carved not yet released
};
WeightMemoryStats weight_memory_stats();

}  // namespace crescent::kernels
