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

// `num_bytes` (> 0) of zeroed memory aligned to 64 bytes. The memory lives while any copy of the
// pointer does; a chunk is unmapped when the last weight carved from it is released.
std::shared_ptr<std::byte> allocate_weight_memory(int64_t num_bytes);

struct WeightMemoryStats {
  int64_t chunks = 0;        // mapped chunks still alive
  int64_t mapped_bytes = 0;  // their total size
};
WeightMemoryStats weight_memory_stats();

}  // namespace crescent::kernels
