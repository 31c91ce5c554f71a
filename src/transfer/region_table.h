#pragma once
// The target side's registered regions and the pins that keep them alive while a peer moves
// bytes in them. Internal to the transfer module.
// Thread-safety: all methods are thread-safe.

#include <condition_variable>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {

struct Region {
  uint8_t* addr = nullptr;
  uint64_t length = 0;
  int memfd = -1;            // shm: the region's file (owned), else -1
  uint64_t file_offset = 0;  // shm: offset of addr in memfd
  std::string rkey;          // ucx: packed remote key
  void* ucx_memh = nullptr;  // ucx: the mapping handle
};

class RegionTable {
 public:
  ~RegionTable();
  RegionId add(Region region);
  // Marks the region dead (new pins fail), waits for pins to drop, then removes and returns it.
  Result<Region> remove(RegionId id, Deadline deadline);
  // Checks [offset, +length) against the live region and pins it. Returns the target address.
  Result<uint8_t*> pin(RegionId id, uint64_t offset, uint64_t length);
  void unpin(RegionId id);
  // A copy of a live region's description (no pin).
  Result<Region> describe(RegionId id) const;
  std::vector<RegionInfo> list() const;
  // The ucx memory handle of the live region that contains [addr, +length), or nullptr.
  void* find_ucx_memh(const void* addr, uint64_t length) const;
  std::vector<Region> take_all();

 private:
  struct Entry {
    Region region;
    bool is_live = true;
    int num_pins = 0;
  };
  Status check(RegionId id, const Entry* e, uint64_t offset, uint64_t length) const;

  mutable std::mutex mu_;
  std::condition_variable unpinned_;
  std::map<int64_t, Entry> regions_;
  int64_t next_id_ = 1;
};

}  // namespace crescent::transfer
