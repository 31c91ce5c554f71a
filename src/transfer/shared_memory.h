#pragma once
// Shareable memory: allocate_shared() returns memory backed by a memfd that the shm transport
// can hand to peers (SCM_RIGHTS) so that they map it and copy into it directly. Callers that
// want same-host single-copy transfers (the KV cache) allocate here and register the buffer.
// Thread-safety: allocation, freeing and find_shared() may run concurrently.

#include <cstddef>
#include <cstdint>

#include "core/status.h"

namespace crescent::transfer {

// Owns one shared mapping. Move-only; unmaps and closes on destruction.
class SharedBuffer {
 public:
  SharedBuffer() = default;
  SharedBuffer(SharedBuffer&& other) noexcept;
  SharedBuffer& operator=(SharedBuffer&& other) noexcept;
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;
  ~SharedBuffer();

  uint8_t* data() const { return data_; }
  size_t size() const { return size_bytes_; }
  bool is_valid() const { return data_ != nullptr; }

 private:
  friend Result<SharedBuffer> allocate_shared(size_t bytes, bool populate);
  void reset();
  uint8_t* data_ = nullptr;
  size_t size_bytes_ = 0;
  int memfd_ = -1;
};

// Zero-filled shareable memory of at least `bytes` (rounded up to the page size). populate:
// fault every page in now (MAP_POPULATE), so that the first transfers into it do not pay a
// page fault per 4 KiB (the KV cache: a fresh 24 MiB prompt cost ~9x a memcpy without it).
Result<SharedBuffer> allocate_shared(size_t bytes, bool populate = false);

// Where [addr, +bytes) lives inside a live SharedBuffer: a dup()ed memfd (the caller closes
// it) and the offset of addr in that file. NotFound when the range is not shared memory.
struct SharedRange {
  int memfd = -1;
  uint64_t file_offset = 0;
};
Result<SharedRange> find_shared(const void* addr, uint64_t bytes);

}  // namespace crescent::transfer
