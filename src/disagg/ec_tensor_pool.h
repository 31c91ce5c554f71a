#pragma once
// EcTensorPool: the encoder worker's accounting of its tensor pool (EPD, DESIGN §2b). The
// encoder writes each image's embeddings into the pool, keyed by mm_hash; prefill workers pull
// them through the transfer engine. The memory is the caller's (shareable, registered with the
// transfer engine); the pool hands out offsets into it, so offset 0 is an allocation like any
// other. No I/O, no threads, no clock of its own: time comes in as arguments.
//
// Stamps (options.stamp_entries): each entry is then preceded by a header whose last 8 bytes,
// just before the tensor, hold the entry's stamp while it is ready or reserved and 0 otherwise.
// A stamp is never 0, below 2^53, unique per (stamp_salt, entry) and stored with release
// order when the entry becomes ready; it is set to 0 before the entry's memory can be handed
// out again (eviction, expiry, abandon), with a release fence after it. So a reader in another
// process that loads the stamp (acquire), copies the tensor, fences (acquire) and loads the
// stamp again, seeing the entry's stamp both times, copied bytes that were the entry's
// (seqlock reading; the EC consumer's shm fast path, ec_consumer.h). This is the only memory
// the pool writes.
//
// Lifecycle of an entry:
//   allocate() -> kAllocated (the encoder writes it; never evicted; dropped by expire() when
//                 not marked ready within options.write_timeout, or at once by abandon())
//   mark_ready() -> kReady (evictable, least recently used first)
//   reserve() -> kReserved while at least one consumer reservation holds it (never evicted);
//                each reservation has an id and a deadline, ends by release() or expire(),
//                and the entry goes back to kReady after its last one.
// An identical image (same mm_hash) is encoded once: allocate() answers with the existing
// entry and must_write = false, and any number of consumers reserve it (reference counted).
//
// Space: first fit over an address-ordered free list, coalescing neighbours on every free.
// Entries are few (one per image in flight or cached) and their sizes follow image resolution,
// not powers of two (a buddy allocator would waste up to half of each); first fit by address
// keeps the low end packed and large ranges at the top, and O(free ranges) per allocation is
// noise next to an encoder forward pass. When a request does not fit, the pool first computes,
// changing nothing, the largest range that evicting every kReady entry would free (the gaps
// between kAllocated/kReserved entries). If even that is too small it evicts nothing and
// answers ResourceExhausted. Otherwise it evicts kReady entries in LRU order, skipping those
// in gaps too small to ever hold the request, until the range freed around a victim holds it;
// this ends because evicting all of them frees a gap large enough.
//
// Thread-safety: every method may be called from any thread; one mutex, short critical
// sections. Ownership: the region must outlive the pool.

#include <chrono>
#include <cstdint>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/clock.h"
#include "core/ids.h"
#include "core/status.h"

namespace crescent::disagg {

// One allocation of one mm_hash. A later allocation of the same mm_hash (after this one was
// evicted, expired or abandoned) has a different id, so a stale writer cannot mark it ready.
using EcEntryId = StrongId<struct EcEntryTag>;
using EcReservationId = StrongId<struct EcReservationTag>;

enum class EcEntryState : uint8_t {
  kAllocated,  // being written by the encoder
  kReady,      // written, no reservation: evictable
  kReserved,   // written, held by at least one consumer reservation
};
std::string_view ec_entry_state_name(EcEntryState state);

struct EcTensorPoolOptions {
  uint64_t alignment_bytes = 64;  // a power of two; every offset and entry size is a multiple
  // A kAllocated entry not marked ready within this is dropped by expire(). Its writer must be
  // finished or gone by then (the range is reused): this is the backstop for a lost writer.
  std::chrono::milliseconds write_timeout{30'000};
  // Write a stamp before each entry (see the top); needs alignment_bytes >= 8.
  bool stamp_entries = false;
  uint64_t stamp_salt = 0;  // mixed into every stamp (the EC producer's instance id)
};

// The stamp's size; it lies in the bytes just before the tensor.
inline constexpr uint64_t kEcStampBytes = 8;

struct EcAllocation {
  EcEntryId entry_id;
  uint64_t offset = 0;     // into the region
  uint64_t num_bytes = 0;  // as requested (the entry occupies it rounded up to the alignment)
  // true: a new entry; the caller writes [offset, +num_bytes) then calls mark_ready().
  // false: the mm_hash was already present (state says whether it is written yet).
  bool must_write = false;
  EcEntryState state = EcEntryState::kAllocated;
  int num_evicted = 0;  // kReady entries evicted to make room
  uint64_t stamp = 0;   // written when the entry becomes ready; 0 without stamp_entries
};

struct EcReservation {
  EcReservationId id;
  EcEntryId entry_id;
  uint64_t offset = 0;
  uint64_t num_bytes = 0;
  uint64_t stamp = 0;
};

struct EcEntryInfo {
  EcEntryId entry_id;
  uint64_t offset = 0;
  uint64_t num_bytes = 0;
  EcEntryState state = EcEntryState::kAllocated;
  int num_reservations = 0;
  uint64_t stamp = 0;
};

struct EcExpiredReservation {
  EcReservationId id;
  std::string mm_hash;
  std::string consumer_id;
  TimePoint deadline;
};

struct EcExpiredWrite {
  EcEntryId entry_id;
  std::string mm_hash;
  uint64_t num_bytes = 0;
  TimePoint deadline;
};

// What one expire() call dropped, for metrics and logs.
struct EcExpired {
  std::vector<EcExpiredReservation> reservations;
  std::vector<EcExpiredWrite> writes;
  bool empty() const { return reservations.empty() && writes.empty(); }
};

struct EcTensorPoolStats {
  uint64_t num_bytes_total = 0;     // the region, rounded down to the alignment
  uint64_t num_bytes_used = 0;      // held by entries in any state (rounded up to the alignment)
  uint64_t num_bytes_free = 0;      // num_bytes_total - num_bytes_used
  uint64_t num_bytes_reserved = 0;  // held by kReserved entries
  uint64_t num_bytes_writing = 0;   // held by kAllocated entries
  uint64_t num_bytes_largest_free_range = 0;
  int num_entries_allocated = 0;
  int num_entries_ready = 0;
  int num_entries_reserved = 0;
  int num_reservations = 0;
  int64_t num_allocations = 0;         // new entries
  int64_t num_shared_allocations = 0;  // allocate() answered with an existing entry
  int64_t num_evictions = 0;
  int64_t num_expired_reservations = 0;
  int64_t num_expired_writes = 0;
  int64_t num_abandoned_writes = 0;
  int64_t num_allocation_failures = 0;  // ResourceExhausted answers
};

class EcTensorPool {
 public:
  // A pool over [base, +size_bytes). InvalidArgument when base is null or not aligned, the
  // alignment is not a power of two, or the region holds less than one aligned unit.
  static Result<std::unique_ptr<EcTensorPool>> create(uint8_t* base, uint64_t size_bytes,
                                                      EcTensorPoolOptions options = {});

  EcTensorPool(const EcTensorPool&) = delete;
  EcTensorPool& operator=(const EcTensorPool&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  uint64_t alignment_bytes() const { return options_.alignment_bytes; }
  // Bytes each entry holds before its tensor (0 without stamps).
  uint64_t header_bytes() const { return header_bytes_; }

  // Space for mm_hash's embeddings, evicting kReady entries if needed (see the top), or the
  // existing entry of mm_hash. InvalidArgument: num_bytes is 0 or more than the whole pool.
  // AlreadyExists: mm_hash is present with another size. ResourceExhausted: it cannot fit even
  // after evicting every kReady entry (nothing is evicted then); the message names the bytes
  // requested, free, reserved and being written.
  Result<EcAllocation> allocate(const std::string& mm_hash, uint64_t num_bytes, TimePoint now);
  // Whether allocate(num_bytes) of a new mm_hash would succeed now (evictions allowed).
  bool can_allocate(uint64_t num_bytes) const;

  // The writer of entry_id is done. NotFound: mm_hash no longer holds entry_id (it expired or
  // was abandoned). FailedPrecondition: already ready.
  Status mark_ready(const std::string& mm_hash, EcEntryId entry_id);
  // The writer of entry_id gives up (the encoder failed): the space is freed now. NotFound as
  // for mark_ready(); FailedPrecondition when already ready.
  Status abandon(const std::string& mm_hash, EcEntryId entry_id);

  // Holds mm_hash's entry for consumer_id (a name for logs) until release() or deadline.
  // NotFound: absent (never allocated here, evicted, or its write expired). FailedPrecondition:
  // still being written.
  Result<EcReservation> reserve(const std::string& mm_hash, std::string consumer_id,
                                TimePoint deadline);
  // Ends a reservation. Idempotent: false when id is unknown, already released or expired.
  bool release(EcReservationId id);
  // Moves a live reservation's deadline (TimePoint::max(): never expires; the EC producer pins
  // a reservation this way while a consumer's connection is pulling it, and releases it when
  // the connection ends). False when id is unknown, already released or expired.
  bool set_reservation_deadline(EcReservationId id, TimePoint deadline);

  // Drops the reservations whose deadline is <= now and the kAllocated entries whose write
  // deadline is <= now, and returns them.
  EcExpired expire(TimePoint now);

  std::optional<EcEntryInfo> lookup(const std::string& mm_hash) const;
  EcTensorPoolStats stats() const;

  // Checks that free ranges and entries tile the region exactly (aligned, no overlap, no gap,
  // no two adjacent free ranges), that reservation counts match the live reservations, that
  // the LRU list holds exactly the kReady entries, and the byte counters. Returns the first
  // violation found. For tests.
  Status check_invariants() const;

 private:
  struct Entry {
    EcEntryId id;
    std::string mm_hash;
    uint64_t offset = 0;      // of the header; the tensor starts header_bytes_ later
    uint64_t size_bytes = 0;  // header_bytes_ + num_bytes rounded up to the alignment
    uint64_t num_bytes = 0;
    uint64_t stamp = 0;
    bool is_ready = false;
    TimePoint write_deadline;  // while !is_ready
    int num_reservations = 0;
    bool in_lru = false;
    std::list<Entry*>::iterator lru_pos;
  };
  struct Reservation {
    Entry* entry = nullptr;  // an entry with reservations is never removed
    std::string consumer_id;
    TimePoint deadline;
  };

  EcTensorPool(uint8_t* base, uint64_t capacity_bytes, EcTensorPoolOptions options);

  static EcEntryState state_of(const Entry& entry);
  static bool is_evictable(const Entry& entry) {
    return entry.is_ready && entry.num_reservations == 0;
  }
  // Offset of the first free range holding size_bytes, carved out of it; nullopt if none.
  std::optional<uint64_t> take_first_fit_locked(uint64_t size_bytes);
  void carve_locked(std::map<uint64_t, uint64_t>::iterator range, uint64_t size_bytes);
  // Returns the start of the free range that now contains [offset, +size_bytes).
  uint64_t free_range_locked(uint64_t offset, uint64_t size_bytes);
  // The largest range that evicting every evictable entry would leave free; appends the gaps
  // of at least size_bytes to viable_gaps ([begin, end), by address) when it is not null.
  uint64_t largest_gap_after_eviction_locked(
      uint64_t size_bytes, std::vector<std::pair<uint64_t, uint64_t>>* viable_gaps) const;
  // Evicts LRU entries in viable gaps until a free range holds size_bytes; returns its offset.
  Result<uint64_t> make_room_locked(uint64_t size_bytes, uint64_t num_bytes, int* num_evicted);
  std::string describe_shortage_locked(uint64_t size_bytes, uint64_t num_bytes,
                                       uint64_t largest_gap) const;
  uint64_t largest_free_range_locked() const;
  void remove_entry_locked(Entry* entry);
  uint64_t tensor_offset(const Entry& entry) const { return entry.offset + header_bytes_; }
  // Stores the entry's stamp word (release order; 0 clears it).
  void store_stamp(const Entry& entry, uint64_t value) const;
  void drop_reservation_locked(int64_t id);

  uint8_t* const base_;
  const uint64_t capacity_bytes_;
  const EcTensorPoolOptions options_;
  const uint64_t header_bytes_;

  mutable std::mutex mu_;
  std::unordered_map<std::string, Entry> entries_;  // GUARDED_BY(mu_); by mm_hash
  std::map<uint64_t, Entry*> entries_by_offset_;    // GUARDED_BY(mu_)
  std::map<uint64_t, uint64_t> free_ranges_;        // GUARDED_BY(mu_); offset -> length
  std::list<Entry*> lru_;                           // GUARDED_BY(mu_); kReady, oldest first
  std::set<std::pair<TimePoint, std::string>> write_deadlines_;    // GUARDED_BY(mu_); kAllocated
  std::unordered_map<int64_t, Reservation> reservations_;          // GUARDED_BY(mu_)
  std::set<std::pair<TimePoint, int64_t>> reservation_deadlines_;  // GUARDED_BY(mu_)
  uint64_t num_bytes_free_ = 0;                                    // GUARDED_BY(mu_)
  int64_t next_entry_id_ = 0;                                      // GUARDED_BY(mu_)
  int64_t next_reservation_id_ = 0;                                // GUARDED_BY(mu_)
  int64_t num_allocations_ = 0;                                    // GUARDED_BY(mu_)
  int64_t num_shared_allocations_ = 0;                             // GUARDED_BY(mu_)
  int64_t num_evictions_ = 0;                                      // GUARDED_BY(mu_)
  int64_t num_expired_reservations_ = 0;                           // GUARDED_BY(mu_)
  int64_t num_expired_writes_ = 0;                                 // GUARDED_BY(mu_)
  int64_t num_abandoned_writes_ = 0;                               // GUARDED_BY(mu_)
  int64_t num_allocation_failures_ = 0;                            // GUARDED_BY(mu_)
};

}  // namespace crescent::disagg
