#include "bench/disagg/copy_baseline.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "core/clock.h"
#include "core/errno_text.h"
#include "transfer/shared_memory.h"

namespace crescent::bench {

const char* copy_kind_name(CopyKind kind) {
  switch (kind) {
    case CopyKind::kTouched:
      return "memcpy, touched buffers (baseline)";
    case CopyKind::kTouchedPieces:
      return "memcpy in 1 MiB pieces, touched";
    case CopyKind::kUntouchedShared:
      return "memcpy into untouched shared memory";
    case CopyKind::kSecondMapping:
      return "memcpy via a fresh mapping of touched shm";
  }
  return "?";
}

const char* copy_kind_key(CopyKind kind) {
  switch (kind) {
    case CopyKind::kTouched:
      return "touched";
    case CopyKind::kTouchedPieces:
      return "touched_1mib_pieces";
    case CopyKind::kUntouchedShared:
      return "untouched_shared_dst";
    case CopyKind::kSecondMapping:
      return "second_mapping_dst";
  }
  return "?";
}

std::string shm_target_verdict(const std::string& transport, double ratio, double target,
                               const std::string& what) {
  char buf[96];
  if (transport != "shm") {
    std::snprintf(buf, sizeof(buf), "(the target <= %.1f is for shm)", target);
  } else {
    std::snprintf(buf, sizeof(buf), "target %s<= %.1f: %s", what.c_str(), target,
                  ratio <= target ? "PASS" : "MISS");
  }
  return buf;
}

Result<double> time_one_copy(uint64_t num_bytes, CopyKind kind) {
  if (num_bytes == 0) {
    return invalid_argument("memcpy baseline: 0 bytes");
  }
  ASSIGN_OR_RETURN(transfer::SharedBuffer src, transfer::allocate_shared(num_bytes));
  std::memset(src.data(), 0x5a, num_bytes);
  ASSIGN_OR_RETURN(transfer::SharedBuffer dst, transfer::allocate_shared(num_bytes));
  uint8_t* target = dst.data();
  void* second_map = nullptr;
  size_t second_map_bytes = 0;
  if (kind != CopyKind::kUntouchedShared) {
    std::memset(dst.data(), 0, num_bytes);
  }
  if (kind == CopyKind::kSecondMapping) {
    ASSIGN_OR_RETURN(transfer::SharedRange range, transfer::find_shared(dst.data(), num_bytes));
    second_map_bytes = dst.size();
    second_map = ::mmap(nullptr, second_map_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, range.memfd,
                        static_cast<off_t>(range.file_offset));
    ::close(range.memfd);
    if (second_map == MAP_FAILED) {
      return internal_error("mmap of the second view: " + errno_text(errno));
    }
    target = static_cast<uint8_t*>(second_map);
  }
  TimePoint t0 = Clock::now();
  if (kind == CopyKind::kTouchedPieces) {
    constexpr uint64_t kPiece = 1 << 20;
    for (uint64_t off = 0; off < num_bytes; off += kPiece) {
      std::memcpy(target + off, src.data() + off, std::min(kPiece, num_bytes - off));
    }
  } else {
    std::memcpy(target, src.data(), num_bytes);
  }
  double s = seconds_since(t0);
  // Keeps the copy from being optimised away and checks it landed.
  bool is_ok = target[num_bytes - 1] == 0x5a && target[0] == 0x5a;
  if (second_map != nullptr) {
    ::munmap(second_map, second_map_bytes);
  }
  if (!is_ok) {
    return internal_error("memcpy baseline: the copy did not land");
  }
  return s;
}

}  // namespace crescent::bench
