// EcTensorPool with synthetic tensors: the reservation state machine, eviction that never
// touches reserved or unwritten entries and never loops, deadlines, and a randomized model
// check (every live entry keeps its bytes) plus a multithreaded smoke test for TSan.

#include "disagg/ec_tensor_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <thread>
#include <vector>

namespace crescent::disagg {
namespace {

using std::chrono::milliseconds;

constexpr uint64_t kAlign = 64;

// A zeroed region aligned to kAlign (the pool refuses an unaligned base).
class Region {
 public:
  explicit Region(uint64_t num_bytes) : storage_(num_bytes + kAlign, 0) {
    void* p = storage_.data();
    size_t space = storage_.size();
    data_ = static_cast<uint8_t*>(std::align(kAlign, num_bytes, p, space));
  }
  uint8_t* data() const { return data_; }

 private:
  std::vector<uint8_t> storage_;
  uint8_t* data_ = nullptr;
};

// prefix + i, built without `"literal" + std::string` (GCC 12 -Wrestrict false positive).
std::string name(const char* prefix, int64_t i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

TimePoint t0() {
  return TimePoint(std::chrono::hours(1000));
}

std::unique_ptr<EcTensorPool> make_pool(const Region& region, uint64_t num_bytes,
                                        milliseconds write_timeout = milliseconds(1000)) {
  EcTensorPoolOptions options;
  options.alignment_bytes = kAlign;
  options.write_timeout = write_timeout;
  auto pool = EcTensorPool::create(region.data(), num_bytes, options);
  CRESCENT_CHECK(pool.is_ok()) << pool.status().to_string();
  return std::move(pool).value();
}

uint8_t pattern_byte(EcEntryId id, uint64_t i) {
  return static_cast<uint8_t>(id.value() * 131 + i * 7 + 1);
}

void write_pattern(uint8_t* base, const EcAllocation& a) {
  for (uint64_t i = 0; i < a.num_bytes; ++i) {
    base[a.offset + i] = pattern_byte(a.entry_id, i);
  }
}

bool has_pattern(const uint8_t* base, EcEntryId id, uint64_t offset, uint64_t num_bytes) {
  for (uint64_t i = 0; i < num_bytes; ++i) {
    if (base[offset + i] != pattern_byte(id, i)) {
      return false;
    }
  }
  return true;
}

// Allocates, writes and marks ready; returns the allocation.
EcAllocation put(EcTensorPool& pool, const std::string& hash, uint64_t num_bytes,
                 TimePoint now = t0()) {
  auto a = pool.allocate(hash, num_bytes, now);
  CRESCENT_CHECK(a.is_ok()) << a.status().to_string();
  CRESCENT_CHECK(a->must_write);
  write_pattern(pool.base(), *a);
  CRESCENT_CHECK(pool.mark_ready(hash, a->entry_id).is_ok());
  return *a;
}

TEST(EcTensorPoolTest, AllocateReadyReserveReleaseRoundTrip) {
  Region region(4096);
  auto pool = make_pool(region, 4096);
  auto a = pool->allocate("img-a", 1000, t0());
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_TRUE(a->must_write);
  EXPECT_EQ(a->state, EcEntryState::kAllocated);
  EXPECT_EQ(a->num_bytes, 1000u);
  EXPECT_EQ(a->offset % kAlign, 0u);
  EXPECT_EQ(pool->reserve("img-a", "prefill-0", t0() + milliseconds(10)).status().code(),
            StatusCode::kFailedPrecondition);

  write_pattern(pool->base(), *a);
  ASSERT_TRUE(pool->mark_ready("img-a", a->entry_id).is_ok());
  EXPECT_EQ(pool->mark_ready("img-a", a->entry_id).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool->lookup("img-a")->state, EcEntryState::kReady);

  auto r = pool->reserve("img-a", "prefill-0", t0() + milliseconds(10));
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_EQ(r->offset, a->offset);
  EXPECT_EQ(r->num_bytes, 1000u);
  EXPECT_EQ(r->entry_id, a->entry_id);
  EXPECT_TRUE(has_pattern(pool->base(), r->entry_id, r->offset, r->num_bytes));
  EXPECT_EQ(pool->lookup("img-a")->state, EcEntryState::kReserved);
  EcTensorPoolStats s = pool->stats();
  EXPECT_EQ(s.num_bytes_total, 4096u);
  EXPECT_EQ(s.num_bytes_used, 1024u);
  EXPECT_EQ(s.num_bytes_reserved, 1024u);
  EXPECT_EQ(s.num_entries_reserved, 1);
  EXPECT_EQ(s.num_reservations, 1);

  EXPECT_TRUE(pool->release(r->id));
  EXPECT_FALSE(pool->release(r->id));                   // idempotent
  EXPECT_FALSE(pool->release(EcReservationId(12345)));  // unknown is fine
  EXPECT_EQ(pool->lookup("img-a")->state, EcEntryState::kReady);
  EXPECT_TRUE(pool->expire(t0() + milliseconds(100000)).empty());  // nothing left to expire
  s = pool->stats();
  EXPECT_EQ(s.num_entries_ready, 1);
  EXPECT_EQ(s.num_bytes_reserved, 0u);
  EXPECT_TRUE(pool->check_invariants().is_ok());
  EXPECT_EQ(pool->reserve("img-b", "prefill-0", t0()).status().code(), StatusCode::kNotFound);
}

TEST(EcTensorPoolTest, OffsetZeroIsAnAllocationLikeAnyOther) {
  Region region(1024);
  auto pool = make_pool(region, 1024);
  EcAllocation a = put(*pool, "first", 512);
  EXPECT_EQ(a.offset, 0u);
  auto r = pool->reserve("first", "p", t0() + milliseconds(10));
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->offset, 0u);
  EXPECT_TRUE(has_pattern(pool->base(), a.entry_id, 0, 512));
  EXPECT_TRUE(pool->release(r->id));
  // Evicted for a request that needs the whole pool, which lands at offset 0 again.
  auto b = pool->allocate("whole", 1024, t0());
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_EQ(b->offset, 0u);
  EXPECT_EQ(b->num_evicted, 1);
  EXPECT_FALSE(pool->lookup("first").has_value());
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, SameMmHashIsOneAllocationSharedByReservations) {
  Region region(1024);
  auto pool = make_pool(region, 1024);
  auto first = pool->allocate("cat", 512, t0());
  ASSERT_TRUE(first.is_ok());
  auto second = pool->allocate("cat", 512, t0());  // still being written by the first
  ASSERT_TRUE(second.is_ok());
  EXPECT_FALSE(second->must_write);
  EXPECT_EQ(second->state, EcEntryState::kAllocated);
  EXPECT_EQ(second->entry_id, first->entry_id);
  EXPECT_EQ(second->offset, first->offset);
  EXPECT_EQ(pool->allocate("cat", 100, t0()).status().code(), StatusCode::kAlreadyExists);
  write_pattern(pool->base(), *first);
  ASSERT_TRUE(pool->mark_ready("cat", first->entry_id).is_ok());
  auto third = pool->allocate("cat", 512, t0());
  ASSERT_TRUE(third.is_ok());
  EXPECT_FALSE(third->must_write);
  EXPECT_EQ(third->state, EcEntryState::kReady);
  EcTensorPoolStats s = pool->stats();
  EXPECT_EQ(s.num_bytes_used, 512u);
  EXPECT_EQ(s.num_allocations, 1);
  EXPECT_EQ(s.num_shared_allocations, 2);

  auto r1 = pool->reserve("cat", "prefill-0", t0() + milliseconds(10));
  auto r2 = pool->reserve("cat", "prefill-1", t0() + milliseconds(10));
  ASSERT_TRUE(r1.is_ok() && r2.is_ok());
  EXPECT_NE(r1->id, r2->id);
  EXPECT_EQ(pool->lookup("cat")->num_reservations, 2);
  put(*pool, "dog", 512);
  EXPECT_TRUE(pool->release(r1->id));
  EXPECT_EQ(pool->lookup("cat")->state, EcEntryState::kReserved);
  // "dog" is evictable but "cat" is not: a 1024-byte request cannot fit.
  EXPECT_EQ(pool->allocate("big", 1024, t0()).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool->lookup("dog").has_value());
  EXPECT_TRUE(pool->release(r2->id));
  auto big = pool->allocate("big", 1024, t0());
  ASSERT_TRUE(big.is_ok()) << big.status().to_string();
  EXPECT_EQ(big->num_evicted, 2);
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, FullPoolOfReservedEntriesIsExhaustedAndEvictsNothing) {
  Region region(1024);
  auto pool = make_pool(region, 1024);
  std::vector<EcReservationId> held;
  for (int i = 0; i < 4; ++i) {
    put(*pool, name("img-", i), 256);
    auto r = pool->reserve(name("img-", i), "p", t0() + milliseconds(10));
    ASSERT_TRUE(r.is_ok());
    held.push_back(r->id);
  }
  auto a = pool->allocate("late", 100, t0());
  ASSERT_EQ(a.status().code(), StatusCode::kResourceExhausted);
  const std::string& message = a.status().message();
  EXPECT_NE(message.find("no room for 100 bytes (128 aligned)"), std::string::npos) << message;
  EXPECT_NE(message.find("0 bytes free"), std::string::npos) << message;
  EXPECT_NE(message.find("1024 held by reserved entries"), std::string::npos) << message;
  EXPECT_FALSE(pool->can_allocate(100));
  EcTensorPoolStats s = pool->stats();
  EXPECT_EQ(s.num_evictions, 0);
  EXPECT_EQ(s.num_allocation_failures, 1);
  EXPECT_EQ(s.num_entries_reserved, 4);
  EXPECT_TRUE(pool->check_invariants().is_ok());

  EXPECT_TRUE(pool->release(held[2]));
  EXPECT_TRUE(pool->can_allocate(100));
  auto b = pool->allocate("late", 100, t0());
  ASSERT_TRUE(b.is_ok());
  EXPECT_EQ(b->offset, 512u);
  EXPECT_FALSE(pool->lookup("img-2").has_value());
}

TEST(EcTensorPoolTest, UnpulledReservationExpiresAndTheEntryBecomesEvictable) {
  Region region(512);
  auto pool = make_pool(region, 512);
  put(*pool, "img", 512);
  auto r = pool->reserve("img", "prefill-gone", t0() + milliseconds(50));
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(pool->expire(t0() + milliseconds(49)).empty());
  EXPECT_EQ(pool->allocate("other", 64, t0()).status().code(), StatusCode::kResourceExhausted);

  EcExpired expired = pool->expire(t0() + milliseconds(50));
  ASSERT_EQ(expired.reservations.size(), 1u);
  EXPECT_EQ(expired.reservations[0].id, r->id);
  EXPECT_EQ(expired.reservations[0].mm_hash, "img");
  EXPECT_EQ(expired.reservations[0].consumer_id, "prefill-gone");
  EXPECT_TRUE(expired.writes.empty());
  EXPECT_FALSE(pool->release(r->id));  // a late release of an expired reservation is harmless
  EXPECT_EQ(pool->lookup("img")->state, EcEntryState::kReady);
  EXPECT_EQ(pool->stats().num_expired_reservations, 1);

  auto other = pool->allocate("other", 64, t0());
  ASSERT_TRUE(other.is_ok());
  EXPECT_EQ(other->num_evicted, 1);
  EXPECT_EQ(pool->stats().num_evictions, 1);
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, APinnedReservationOutlivesItsDeadlineUntilReleased) {
  Region region(512);
  auto pool = make_pool(region, 512);
  put(*pool, "img", 512);
  auto r = pool->reserve("img", "prefill", t0() + milliseconds(50));
  ASSERT_TRUE(r.is_ok());
  ASSERT_TRUE(pool->set_reservation_deadline(r->id, TimePoint::max()));
  EXPECT_TRUE(pool->expire(t0() + milliseconds(100000)).empty());
  EXPECT_EQ(pool->lookup("img")->state, EcEntryState::kReserved);
  EXPECT_TRUE(pool->check_invariants().is_ok());
  EXPECT_TRUE(pool->release(r->id));
  EXPECT_FALSE(pool->set_reservation_deadline(r->id, t0()));  // gone
  EXPECT_EQ(pool->lookup("img")->state, EcEntryState::kReady);
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, NeverWrittenAllocationExpiresAndAStaleWriterCannotMarkItsSuccessor) {
  Region region(1024);
  auto pool = make_pool(region, 1024, milliseconds(100));
  auto a = pool->allocate("img", 1024, t0());
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(pool->allocate("other", 64, t0()).status().code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(pool->expire(t0() + milliseconds(99)).empty());
  EcExpired expired = pool->expire(t0() + milliseconds(100));
  ASSERT_EQ(expired.writes.size(), 1u);
  EXPECT_EQ(expired.writes[0].mm_hash, "img");
  EXPECT_EQ(expired.writes[0].entry_id, a->entry_id);
  EXPECT_EQ(expired.writes[0].num_bytes, 1024u);
  EXPECT_FALSE(pool->lookup("img").has_value());
  EXPECT_EQ(pool->stats().num_bytes_free, 1024u);
  EXPECT_EQ(pool->stats().num_expired_writes, 1);
  EXPECT_EQ(pool->mark_ready("img", a->entry_id).code(), StatusCode::kNotFound);

  // The same image allocated again is a new entry; the old writer's mark_ready cannot touch it.
  auto again = pool->allocate("img", 1024, t0() + milliseconds(200));
  ASSERT_TRUE(again.is_ok());
  EXPECT_TRUE(again->must_write);
  EXPECT_NE(again->entry_id, a->entry_id);
  EXPECT_EQ(pool->mark_ready("img", a->entry_id).code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->lookup("img")->state, EcEntryState::kAllocated);
  // An encoder that fails gives the space back at once.
  EXPECT_TRUE(pool->abandon("img", again->entry_id).is_ok());
  EXPECT_EQ(pool->abandon("img", again->entry_id).code(), StatusCode::kNotFound);
  EXPECT_EQ(pool->stats().num_bytes_free, 1024u);
  EXPECT_EQ(pool->stats().num_abandoned_writes, 1);
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, ReadyButNeverReservedIsEvictedLeastRecentlyUsedFirst) {
  Region region(1024);
  auto pool = make_pool(region, 1024);
  for (int i = 0; i < 4; ++i) {
    put(*pool, name("img-", i), 256);
  }
  // Touch img-0 (a second request for the same image) and use img-1 through a reservation.
  ASSERT_TRUE(pool->allocate("img-0", 256, t0()).is_ok());
  auto r = pool->reserve("img-1", "p", t0() + milliseconds(10));
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(pool->release(r->id));
  // LRU order is now img-2, img-3, img-0, img-1.
  auto a = pool->allocate("new", 200, t0());
  ASSERT_TRUE(a.is_ok());
  EXPECT_EQ(a->num_evicted, 1);
  EXPECT_FALSE(pool->lookup("img-2").has_value());
  EXPECT_EQ(a->offset, 512u);
  auto b = pool->allocate("new2", 256, t0());
  ASSERT_TRUE(b.is_ok());
  EXPECT_FALSE(pool->lookup("img-3").has_value());
  EXPECT_TRUE(pool->lookup("img-0").has_value());
  EXPECT_TRUE(pool->lookup("img-1").has_value());
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

// 16 slots of 64 bytes; even slots reserved, odd slots ready or free. Plenty of bytes are free
// or evictable but no two neighbouring slots ever are: a 128-byte request must fail cleanly.
TEST(EcTensorPoolTest, FragmentationBeyondWhatEvictionCanFixIsExhaustedWithoutEvicting) {
  Region region(1024);
  auto pool = make_pool(region, 1024);
  // Slots 1, 5, 9 and 13 are abandoned (free), the other odd ones ready: 256 bytes free, 256
  // evictable, 512 reserved, all in 64-byte holes.
  std::vector<EcAllocation> slots;
  for (int i = 0; i < 16; ++i) {
    auto a = pool->allocate(name("s", i), 64, t0());
    ASSERT_TRUE(a.is_ok());
    ASSERT_EQ(a->offset, static_cast<uint64_t>(i) * 64);
    slots.push_back(*a);
  }
  for (int i = 0; i < 16; ++i) {
    if (i % 4 == 1) {
      ASSERT_TRUE(pool->abandon(name("s", i), slots[i].entry_id).is_ok());
    } else {
      write_pattern(pool->base(), slots[i]);
      ASSERT_TRUE(pool->mark_ready(name("s", i), slots[i].entry_id).is_ok());
    }
  }
  std::vector<EcReservationId> held(16);
  for (int i = 0; i < 16; i += 2) {
    auto r = pool->reserve(name("s", i), "p", t0() + milliseconds(10));
    ASSERT_TRUE(r.is_ok());
    held[i] = r->id;
  }
  EcTensorPoolStats before = pool->stats();
  EXPECT_EQ(before.num_bytes_free, 256u);
  EXPECT_EQ(before.num_entries_ready, 4);
  EXPECT_EQ(before.num_bytes_reserved, 512u);

  auto a = pool->allocate("wide", 128, t0());
  ASSERT_EQ(a.status().code(), StatusCode::kResourceExhausted);
  const std::string& message = a.status().message();
  EXPECT_NE(message.find("no room for 128 bytes"), std::string::npos) << message;
  EXPECT_NE(message.find("256 bytes free (largest range 64)"), std::string::npos) << message;
  EXPECT_NE(message.find("512 held by reserved entries"), std::string::npos) << message;
  EXPECT_NE(message.find("would leave at most 64 contiguous"), std::string::npos) << message;
  EcTensorPoolStats after = pool->stats();
  EXPECT_EQ(after.num_evictions, before.num_evictions);
  EXPECT_EQ(after.num_entries_ready, 4);
  EXPECT_EQ(after.num_allocation_failures, 1);
  EXPECT_TRUE(pool->check_invariants().is_ok());

  // Releasing slot 8 joins slots 7..9 (one ready, one free) into a 192-byte gap: the request
  // now fits there, and only entries in that gap may be evicted.
  EXPECT_TRUE(pool->release(held[8]));
  auto b = pool->allocate("wide", 128, t0());
  ASSERT_TRUE(b.is_ok()) << b.status().to_string();
  EXPECT_GE(b->offset, 7u * 64);
  EXPECT_LE(b->offset + 128, 10u * 64);
  for (int i : {3, 11, 15}) {
    EXPECT_TRUE(pool->lookup(name("s", i)).has_value()) << i;
  }
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, EvictionSkipsEntriesInGapsTooSmallForTheRequest) {
  Region region(1024);
  auto pool = make_pool(region, 1024);
  // [old 256][pinned 256][newer 512]: "old" is least recently used but its gap is too small.
  put(*pool, "old", 256);
  put(*pool, "pinned", 256);
  put(*pool, "newer", 512);
  auto r = pool->reserve("pinned", "p", t0() + milliseconds(10));
  ASSERT_TRUE(r.is_ok());
  auto a = pool->allocate("want", 384, t0());
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->offset, 512u);
  EXPECT_EQ(a->num_evicted, 1);
  EXPECT_TRUE(pool->lookup("old").has_value());
  EXPECT_FALSE(pool->lookup("newer").has_value());
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

uint64_t stamp_word(const EcTensorPool& pool, uint64_t tensor_offset) {
  uint64_t v = 0;
  std::memcpy(&v, pool.base() + tensor_offset - kEcStampBytes, sizeof v);
  return v;
}

// The stamp before each tensor: 0 while written, the entry's stamp while ready or reserved,
// 0 again before the memory is handed out to another entry (what the EC consumer's mapped
// copies check).
TEST(EcTensorPoolTest, StampsMarkWrittenEntriesAndAreClearedBeforeReuse) {
  Region region(1024);
  EcTensorPoolOptions options;
  options.alignment_bytes = kAlign;
  options.stamp_entries = true;
  options.stamp_salt = 12345;
  auto pool = EcTensorPool::create(region.data(), 1024, options).value();
  EXPECT_EQ(pool->header_bytes(), kAlign);

  auto a = pool->allocate("a", 300, t0()).value();  // header 64 + 320
  EXPECT_EQ(a.offset, kAlign);                      // the tensor starts after its header
  EXPECT_NE(a.stamp, 0u);
  EXPECT_LT(a.stamp, uint64_t{1} << 53);
  std::memset(region.data() + a.offset - kEcStampBytes, 0xAB, kEcStampBytes);  // garbage
  auto again = pool->allocate("x", 8, t0()).value();
  EXPECT_EQ(stamp_word(*pool, again.offset), 0u) << "a new entry starts unstamped";
  ASSERT_TRUE(pool->abandon("x", again.entry_id).is_ok());
  write_pattern(pool->base(), a);
  ASSERT_TRUE(pool->mark_ready("a", a.entry_id).is_ok());
  EXPECT_EQ(stamp_word(*pool, a.offset), a.stamp);
  auto r = pool->reserve("a", "c", t0() + std::chrono::seconds(1)).value();
  EXPECT_EQ(r.stamp, a.stamp);
  EXPECT_EQ(r.offset, a.offset);
  EXPECT_EQ(pool->lookup("a")->stamp, a.stamp);
  EXPECT_TRUE(has_pattern(pool->base(), a.entry_id, a.offset, a.num_bytes));

  // Released, then evicted to make room: the stamp is cleared before the new entry's tensor
  // (which covers the old stamp's bytes) can be written.
  ASSERT_TRUE(pool->release(r.id));
  auto b = pool->allocate("b", 1024 - kAlign, t0()).value();
  EXPECT_EQ(b.num_evicted, 1);
  EXPECT_EQ(stamp_word(*pool, a.offset), 0u);
  EXPECT_NE(b.stamp, a.stamp);
  EXPECT_TRUE(pool->check_invariants().is_ok()) << pool->check_invariants().to_string();
  // Expiry of an unwritten entry also clears (it never had a stamp) and frees.
  pool->expire(t0() + std::chrono::hours(1));
  EXPECT_FALSE(pool->lookup("b").has_value());

  // The same entry sequence under another salt stamps differently (another encoder instance).
  Region region2(1024);
  options.stamp_salt = 54321;
  auto pool2 = EcTensorPool::create(region2.data(), 1024, options).value();
  EXPECT_NE(pool2->allocate("a", 300, t0())->stamp, a.stamp);
  // The header counts against the pool: the whole capacity no longer fits one tensor.
  EXPECT_EQ(pool2->allocate("whole", 1024, t0()).status().code(), StatusCode::kInvalidArgument);
  options.alignment_bytes = 4;
  EXPECT_EQ(EcTensorPool::create(region2.data(), 1024, options).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(EcTensorPoolTest, BadArgumentsAreRefused) {
  Region region(1024);
  auto pool = make_pool(region, 1000);  // rounded down to 960
  EXPECT_EQ(pool->capacity_bytes(), 960u);
  EXPECT_EQ(pool->allocate("a", 0, t0()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->allocate("a", 961, t0()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(pool->allocate("a", ~uint64_t{0}, t0()).status().code(), StatusCode::kInvalidArgument);
  EXPECT_FALSE(pool->can_allocate(961));
  EXPECT_TRUE(pool->can_allocate(960));
  EXPECT_TRUE(pool->allocate("a", 960, t0()).is_ok());
  EXPECT_EQ(pool->stats().num_allocation_failures, 0);

  EcTensorPoolOptions options;
  EXPECT_EQ(EcTensorPool::create(nullptr, 1024, options).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EcTensorPool::create(region.data() + 1, 1000, options).status().code(),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(EcTensorPool::create(region.data(), 63, options).status().code(),
            StatusCode::kInvalidArgument);
  options.alignment_bytes = 48;
  EXPECT_EQ(EcTensorPool::create(region.data(), 1024, options).status().code(),
            StatusCode::kInvalidArgument);
  options.alignment_bytes = 1;
  options.write_timeout = milliseconds(0);
  EXPECT_EQ(EcTensorPool::create(region.data(), 1024, options).status().code(),
            StatusCode::kInvalidArgument);
}

// A model of what the caller knows: entries it allocated and not yet seen dropped, and its
// reservations. Evictions are silent, so an entry the model holds may vanish only while it is
// evictable (ready, unreserved); anything else vanishing, or any live entry losing its bytes,
// is a bug.
struct ModelEntry {
  EcEntryId id;
  uint64_t offset = 0;
  uint64_t num_bytes = 0;
  bool is_ready = false;
  int num_reservations = 0;
  TimePoint write_deadline;
};
struct ModelReservation {
  std::string mm_hash;
  TimePoint deadline;
};

class PoolModel {
 public:
  explicit PoolModel(EcTensorPool* pool) : pool_(pool) {}

  // Drops silently evicted entries and checks every entry the pool must still hold.
  void sweep() {
    for (auto it = entries_.begin(); it != entries_.end();) {
      const ModelEntry& m = it->second;
      std::optional<EcEntryInfo> info = pool_->lookup(it->first);
      if (!info.has_value() || info->entry_id != m.id) {
        ASSERT_TRUE(m.is_ready && m.num_reservations == 0)
            << it->first << " vanished while not evictable";
        it = entries_.erase(it);
        continue;
      }
      ASSERT_EQ(info->offset, m.offset);
      ASSERT_EQ(info->num_reservations, m.num_reservations);
      ASSERT_EQ(info->state, !m.is_ready              ? EcEntryState::kAllocated
                             : m.num_reservations > 0 ? EcEntryState::kReserved
                                                      : EcEntryState::kReady);
      // Bytes are written at allocation in this test, so every live entry holds its pattern.
      ASSERT_TRUE(has_pattern(pool_->base(), m.id, m.offset, m.num_bytes)) << it->first;
      ++it;
    }
  }

  // The largest range that evicting every evictable entry could free, from the model alone.
  uint64_t largest_gap_after_eviction() const {
    std::vector<std::pair<uint64_t, uint64_t>> pinned;
    for (const auto& [hash, m] : entries_) {
      if (!m.is_ready || m.num_reservations > 0) {
        pinned.emplace_back(m.offset, (m.num_bytes + kAlign - 1) / kAlign * kAlign);
      }
    }
    std::sort(pinned.begin(), pinned.end());
    uint64_t largest = 0;
    uint64_t cursor = 0;
    for (const auto& [offset, size] : pinned) {
      largest = std::max(largest, offset - cursor);
      cursor = offset + size;
    }
    return std::max(largest, pool_->capacity_bytes() - cursor);
  }

  std::map<std::string, ModelEntry> entries_;
  std::map<int64_t, ModelReservation> reservations_;
  EcTensorPool* pool_;
};

TEST(EcTensorPoolTest, RandomizedOperationsKeepEveryInvariant) {
  constexpr uint64_t kCapacity = uint64_t{24} * 1024;
  constexpr int kNumHashes = 48;
  constexpr int kNumOps = 5000;
  Region region(kCapacity);
  auto pool = make_pool(region, kCapacity, milliseconds(1000));
  PoolModel model(pool.get());
  std::mt19937_64 rng(20240611);
  auto uniform = [&](uint64_t lo, uint64_t hi) {  // [lo, hi]
    return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
  };
  // Each image has one size: mostly small, some large, a few the size of half the pool.
  std::vector<uint64_t> sizes(kNumHashes);
  for (auto& size : sizes) {
    const uint64_t roll = uniform(0, 9);
    size = roll < 6 ? uniform(1, 1024) : roll < 9 ? uniform(1024, 4096) : uniform(4096, 8192);
  }
  TimePoint now = t0();
  int64_t num_exhausted = 0;
  int64_t num_reserved = 0;

  for (int op = 0; op < kNumOps; ++op) {
    const uint64_t roll = uniform(0, 99);
    const int h = static_cast<int>(uniform(0, kNumHashes - 1));
    const std::string hash = name("h", h);
    if (roll < 30) {
      const int64_t evictions_before = pool->stats().num_evictions;
      auto a = pool->allocate(hash, sizes[h], now);
      if (a.is_ok()) {
        auto it = model.entries_.find(hash);
        if (a->must_write) {
          ASSERT_TRUE(it == model.entries_.end() ||
                      (it->second.is_ready && it->second.num_reservations == 0))
              << hash << " allocated again while pinned";
          write_pattern(pool->base(), *a);
          model.entries_[hash] =
              ModelEntry{a->entry_id, a->offset, sizes[h], false, 0, now + milliseconds(1000)};
        } else {
          ASSERT_NE(it, model.entries_.end());
          ASSERT_EQ(a->entry_id, it->second.id);
        }
      } else {
        ASSERT_EQ(a.status().code(), StatusCode::kResourceExhausted) << a.status().to_string();
        ++num_exhausted;
        ASSERT_EQ(pool->stats().num_evictions, evictions_before) << "evicted, then failed";
        model.sweep();
        const uint64_t size_bytes = (sizes[h] + kAlign - 1) / kAlign * kAlign;
        ASSERT_LT(model.largest_gap_after_eviction(), size_bytes) << "refused a request that fits";
      }
    } else if (roll < 48) {
      std::vector<std::string> writing;
      for (const auto& [name, m] : model.entries_) {
        if (!m.is_ready) {
          writing.push_back(name);
        }
      }
      if (!writing.empty()) {
        const std::string& name = writing[uniform(0, writing.size() - 1)];
        ModelEntry& m = model.entries_[name];
        if (uniform(0, 9) == 0) {
          ASSERT_TRUE(pool->abandon(name, m.id).is_ok());
          model.entries_.erase(name);
        } else {
          ASSERT_TRUE(pool->mark_ready(name, m.id).is_ok());
          m.is_ready = true;
        }
      }
    } else if (roll < 70) {
      const TimePoint deadline = now + milliseconds(uniform(1, 2000));
      auto r = pool->reserve(hash, name("consumer-", op), deadline);
      auto it = model.entries_.find(hash);
      if (r.is_ok()) {
        ASSERT_NE(it, model.entries_.end());
        ASSERT_TRUE(it->second.is_ready);
        ASSERT_EQ(r->entry_id, it->second.id);
        ASSERT_TRUE(has_pattern(pool->base(), r->entry_id, r->offset, r->num_bytes));
        ++it->second.num_reservations;
        model.reservations_[r->id.value()] = ModelReservation{hash, deadline};
        ++num_reserved;
      } else if (r.status().code() == StatusCode::kFailedPrecondition) {
        ASSERT_NE(it, model.entries_.end());
        ASSERT_FALSE(it->second.is_ready);
      } else {
        ASSERT_EQ(r.status().code(), StatusCode::kNotFound);
        ASSERT_TRUE(it == model.entries_.end() ||
                    (it->second.is_ready && it->second.num_reservations == 0));
        if (it != model.entries_.end()) {
          model.entries_.erase(it);
        }
      }
    } else if (roll < 88) {
      if (model.reservations_.empty() || uniform(0, 9) == 0) {
        ASSERT_FALSE(pool->release(EcReservationId(1'000'000 + op)));
      } else {
        auto it = model.reservations_.begin();
        std::advance(it, uniform(0, model.reservations_.size() - 1));
        ASSERT_TRUE(pool->release(EcReservationId(it->first)));
        ASSERT_FALSE(pool->release(EcReservationId(it->first)));
        --model.entries_.at(it->second.mm_hash).num_reservations;
        model.reservations_.erase(it);
      }
    } else {
      now += milliseconds(uniform(0, 250));
      EcExpired expired = pool->expire(now);
      size_t num_expected_reservations = 0;
      for (const auto& [id, r] : model.reservations_) {
        num_expected_reservations += r.deadline <= now ? 1 : 0;
      }
      ASSERT_EQ(expired.reservations.size(), num_expected_reservations);
      for (const EcExpiredReservation& e : expired.reservations) {
        auto it = model.reservations_.find(e.id.value());
        ASSERT_NE(it, model.reservations_.end());
        ASSERT_LE(it->second.deadline, now);
        --model.entries_.at(it->second.mm_hash).num_reservations;
        model.reservations_.erase(it);
      }
      size_t num_expected_writes = 0;
      for (const auto& [name, m] : model.entries_) {
        num_expected_writes += !m.is_ready && m.write_deadline <= now ? 1 : 0;
      }
      ASSERT_EQ(expired.writes.size(), num_expected_writes);
      for (const EcExpiredWrite& w : expired.writes) {
        auto it = model.entries_.find(w.mm_hash);
        ASSERT_NE(it, model.entries_.end());
        ASSERT_EQ(it->second.id, w.entry_id);
        model.entries_.erase(it);
      }
    }
    Status invariants = pool->check_invariants();
    ASSERT_TRUE(invariants.is_ok()) << "after op " << op << ": " << invariants.to_string();
    model.sweep();
    if (::testing::Test::HasFatalFailure()) {
      FAIL() << "after op " << op;
    }
    ASSERT_EQ(pool->stats().num_reservations, static_cast<int>(model.reservations_.size()));
  }
  // The run must have exercised the interesting paths.
  EXPECT_GT(num_exhausted, 10);
  EXPECT_GT(num_reserved, 200);
  EcTensorPoolStats run = pool->stats();
  EXPECT_GT(run.num_evictions, 50);
  EXPECT_GT(run.num_expired_reservations, 5);
  EXPECT_GT(run.num_expired_writes, 20);
  EXPECT_GT(run.num_shared_allocations, 100);

  // Release everything and drop unwritten entries: the whole pool can be had again, which it
  // can only be if every range came back and coalesced.
  for (const auto& [id, r] : model.reservations_) {
    ASSERT_TRUE(pool->release(EcReservationId(id)));
  }
  pool->expire(now + std::chrono::hours(1));
  EXPECT_EQ(pool->stats().num_reservations, 0);
  EXPECT_EQ(pool->stats().num_entries_allocated, 0);
  EXPECT_TRUE(pool->can_allocate(kCapacity));
  auto all = pool->allocate("everything", kCapacity, now);
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->offset, 0u);
  ASSERT_TRUE(pool->abandon("everything", all->entry_id).is_ok());
  EcTensorPoolStats s = pool->stats();
  EXPECT_EQ(s.num_bytes_free, kCapacity);
  EXPECT_EQ(s.num_bytes_largest_free_range, kCapacity);
  EXPECT_EQ(s.num_entries_ready + s.num_entries_reserved + s.num_entries_allocated, 0);
  EXPECT_TRUE(pool->check_invariants().is_ok());
}

TEST(EcTensorPoolTest, ConcurrentRandomOperationsSmoke) {
  constexpr uint64_t kCapacity = uint64_t{16} * 1024;
  constexpr int kNumThreads = 4;
  constexpr int kNumOpsPerThread = 3000;
  constexpr int kNumHashes = 32;
  Region region(kCapacity);
  // Writers finish long before this; reservations expire for real.
  auto pool = make_pool(region, kCapacity, milliseconds(3'600'000));
  std::atomic<int> num_failures{0};
  std::atomic<int> num_pulled{0};

  auto worker = [&](int thread_index) {
    std::mt19937_64 rng(1000 + thread_index);
    auto uniform = [&](uint64_t lo, uint64_t hi) {
      return std::uniform_int_distribution<uint64_t>(lo, hi)(rng);
    };
    std::vector<EcReservationId> held;
    for (int op = 0; op < kNumOpsPerThread; ++op) {
      const int h = static_cast<int>(uniform(0, kNumHashes - 1));
      const std::string hash = name("h", h);
      const uint64_t num_bytes = 64 + static_cast<uint64_t>(h) * 97;  // same size per hash
      const uint64_t roll = uniform(0, 99);
      if (roll < 35) {
        auto a = pool->allocate(hash, num_bytes, Clock::now());
        if (a.is_ok() && a->must_write) {
          write_pattern(pool->base(), *a);  // outside the lock: the range is this thread's
          Status s = uniform(0, 9) == 0 ? pool->abandon(hash, a->entry_id)
                                        : pool->mark_ready(hash, a->entry_id);
          if (!s.is_ok()) {
            ++num_failures;
          }
        } else if (!a.is_ok() && a.status().code() != StatusCode::kResourceExhausted) {
          ++num_failures;
        }
      } else if (roll < 65) {
        // Half the reservations are read and held (a deadline far away: a reader never races
        // expiry here), half only exercise expiry.
        const bool is_pull = uniform(0, 1) == 0;
        const auto lifetime = is_pull ? std::chrono::microseconds(std::chrono::hours(1))
                                      : std::chrono::microseconds(uniform(0, 2000));
        auto r = pool->reserve(hash, name("t", thread_index), Clock::now() + lifetime);
        if (r.is_ok()) {
          if (is_pull) {
            if (!has_pattern(pool->base(), r->entry_id, r->offset, r->num_bytes)) {
              ++num_failures;
            }
            ++num_pulled;
          }
          held.push_back(r->id);
        }
      } else if (roll < 90) {
        if (!held.empty()) {
          const size_t i = uniform(0, held.size() - 1);
          pool->release(held[i]);  // false when it expired first: fine
          held.erase(held.begin() + static_cast<ptrdiff_t>(i));
        }
      } else if (roll < 97) {
        pool->expire(Clock::now());
      } else {
        if (!pool->check_invariants().is_ok()) {
          ++num_failures;
        }
        (void)pool->stats();
      }
    }
    for (EcReservationId id : held) {
      pool->release(id);
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(kNumThreads);
  for (int i = 0; i < kNumThreads; ++i) {
    threads.emplace_back(worker, i);
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(num_failures.load(), 0);
  EXPECT_GT(num_pulled.load(), 100);
  Status invariants = pool->check_invariants();
  EXPECT_TRUE(invariants.is_ok()) << invariants.to_string();
  EcTensorPoolStats s = pool->stats();
  EXPECT_EQ(s.num_reservations, 0);
  EXPECT_EQ(s.num_entries_allocated, 0);
  EXPECT_EQ(s.num_bytes_used + s.num_bytes_free, kCapacity);
  EXPECT_TRUE(pool->can_allocate(kCapacity));
}

}  // namespace
}  // namespace crescent::disagg
