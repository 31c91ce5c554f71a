#pragma once
// std::atomic_thread_fence, except in ThreadSanitizer builds, for which GCC refuses it
// (-Wtsan: TSan does not model fences). There a compiler barrier stands in. The fences here
// order memory shared with another process (the seqlock read of an encoder's pool, see
// disagg/ec_tensor_pool.h), which TSan cannot follow across two mappings anyway; on x86, the
// only target, loads are not reordered with loads nor stores with stores, so the compiler
// barrier keeps the same order in those builds.

#include <atomic>

namespace crescent {

inline void memory_fence(std::memory_order order) {
#if defined(__SANITIZE_THREAD__)
  std::atomic_signal_fence(order);
#else
  std::atomic_thread_fence(order);
#endif
}

}  // namespace crescent
