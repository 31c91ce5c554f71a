#pragma once
// Memory from std::aligned_alloc owned by a std::unique_ptr (or shared_ptr), and the kernels'
// per-thread scratch built on it: a 64-byte-aligned buffer that grows to the largest size asked
// of it and keeps that memory until its thread ends (the next call of the same shape then
// allocates nothing).

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>

#include "core/check.h"

namespace crescent::kernels {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

class GrowOnlyBuffer {
 public:
  // At least `bytes` bytes, 64-byte aligned. Growing does not keep the contents; `what` names
  // the buffer in the out-of-memory CHECK.
  std::byte* reserve(int64_t bytes, const char* what) {
    const int64_t rounded = (bytes + 63) / 64 * 64;  // as aligned_alloc requires
    if (rounded > capacity_) {
      void* p = std::aligned_alloc(64, static_cast<size_t>(rounded));
      CRESCENT_CHECK(p != nullptr) << "out of memory for " << what;
      buffer_.reset(static_cast<std::byte*>(p));
      capacity_ = rounded;
    }
    return buffer_.get();
  }

 private:
  std::unique_ptr<std::byte, FreeDeleter> buffer_;
  int64_t capacity_ = 0;
};

}  // namespace crescent::kernels
