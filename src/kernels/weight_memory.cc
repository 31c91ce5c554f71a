#include "kernels/weight_memory.h"

#include <sys/mman.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "core/check.h"
#include "core/errno_text.h"

#if defined(__SANITIZE_ADDRESS__)
#define CRESCENT_WEIGHT_MEMORY_PER_BLOCK 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define CRESCENT_WEIGHT_MEMORY_PER_BLOCK 1
#endif
#endif

namespace crescent::kernels {
namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Weights are carved out of chunks this large; a weight of kOwnChunkBytes or more (an lm_head,
// a 7B model's MLP) gets a chunk of its own, so a chunk's unused tail stays small.
constexpr size_t kChunkBytes = size_t{64} << 20;
constexpr size_t kOwnChunkBytes = size_t{16} << 20;

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

std::atomic<int64_t> g_chunks{0};
std::atomic<int64_t> g_mapped_bytes{0};

// A 2 MiB-aligned anonymous mapping marked for huge pages: the kernel backs each whole 2 MiB
// run inside it with one huge page when it can (its last partial run gets 4 KiB pages).
class Chunk {
 public:
  explicit Chunk(size_t size) : size_(round_up(size, 4096)) {
    const size_t span = size_ + kHugePage;
    void* p = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CRESCENT_CHECK(p != MAP_FAILED)
        << "out of memory mapping " << (size_ >> 20) << " MiB for weights: " << errno_text(errno);
    const size_t head = (kHugePage - reinterpret_cast<uintptr_t>(p) % kHugePage) % kHugePage;
    if (head > 0) {
      ::munmap(p, head);
    }
    base_ = static_cast<std::byte*>(p) + head;
    if (const size_t tail = span - head - size_; tail > 0) {
      ::munmap(base_ + size_, tail);
    }
    ::madvise(base_, size_, MADV_HUGEPAGE);  // advice only: without THP the pages are small
    g_chunks.fetch_add(1, std::memory_order_relaxed);
    g_mapped_bytes.fetch_add(static_cast<int64_t>(size_), std::memory_order_relaxed);
  }
  ~Chunk() {
    ::munmap(base_, size_);
    g_chunks.fetch_sub(1, std::memory_order_relaxed);
    g_mapped_bytes.fetch_sub(static_cast<int64_t>(size_), std::memory_order_relaxed);
  }
  Chunk(const Chunk&) = delete;
  Chunk& operator=(const Chunk&) = delete;

  [[nodiscard]] std::byte* base() const { return base_; }
  [[nodiscard]] size_t size() const { return size_; }

  int64_t live = 0;  // arena chunks: blocks handed out and not yet released (under Arena::mu)

 private:
  std::byte* base_ = nullptr;
  size_t size_ = 0;
};

#ifndef CRESCENT_WEIGHT_MEMORY_PER_BLOCK
// The chunk small weights are carved from, bump-allocated. Every block handed out counts in its
// chunk's `live`, and its release takes the mutex to count down, so the next allocation sees
// every access of a released block happen before it reuses the bytes. A chunk that is no longer
// current is unmapped with its last block; the current one, once empty, is carved again from
// its start.
struct Arena {
  std::mutex mu;
  Chunk* current = nullptr;
  size_t used = 0;
};

Arena& arena() {
  static auto* a = new Arena();  // never destroyed: weights may outlive static destructors
  return *a;
}

void release_block(Chunk* chunk) {
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  if (--chunk->live == 0 && chunk != a.current) {
    delete chunk;
  }
}

#endif  // CRESCENT_WEIGHT_MEMORY_PER_BLOCK

std::shared_ptr<std::byte> heap_block(size_t size) {
  void* p = std::aligned_alloc(64, size);
  CRESCENT_CHECK(p != nullptr) << "out of memory allocating " << size << " bytes for a weight";
  std::memset(p, 0, size);
  return {static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); }};
}

}  // namespace

std::shared_ptr<std::byte> allocate_weight_memory(int64_t num_bytes, WeightStorage storage) {
  CRESCENT_CHECK(num_bytes > 0) << "weight memory of " << num_bytes << " bytes";
  const size_t size = round_up(static_cast<size_t>(num_bytes), 64);
#ifdef CRESCENT_WEIGHT_MEMORY_PER_BLOCK
  (void)storage;
  return heap_block(size);
#else
  if (storage == WeightStorage::kTransient) {
    return heap_block(size);
  }
  if (size >= kOwnChunkBytes) {
    auto* chunk = new Chunk(size);  // a fresh mapping reads as zero
    return {chunk->base(), [chunk](std::byte*) { delete chunk; }};
  }
  Chunk* chunk = nullptr;
  std::byte* block = nullptr;
  {
    Arena& a = arena();
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.current != nullptr && a.current->live == 0) {
      a.used = 0;  // every block carved from it is gone: carve again from its start
    }
    if (a.current == nullptr || a.used + size > a.current->size()) {
      if (a.current != nullptr && a.current->live == 0) {
        delete a.current;
      }
      a.current = new Chunk(kChunkBytes);
      a.used = 0;
    }
    chunk = a.current;
    block = chunk->base() + a.used;
    a.used += size;
    ++chunk->live;
  }
  std::memset(block, 0, size);  // a reused chunk holds released blocks' bytes
  return {block, [chunk](std::byte*) { release_block(chunk); }};
#endif
}

WeightMemoryStats weight_memory_stats() {
  WeightMemoryStats stats{g_chunks.load(std::memory_order_relaxed),
                          g_mapped_bytes.load(std::memory_order_relaxed), 0};
#ifndef CRESCENT_WEIGHT_MEMORY_PER_BLOCK
  Arena& a = arena();
  std::lock_guard<std::mutex> lock(a.mu);
  stats.current_chunk_live = a.current != nullptr ? a.current->live : 0;
#endif
  return stats;
}

}  // namespace crescent::kernels
