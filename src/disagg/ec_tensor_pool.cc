#include "disagg/ec_tensor_pool.h"

#include <algorithm>
#include <atomic>
#include <iterator>
#include <sstream>

#include "core/check.h"
#include "core/fence.h"

namespace crescent::disagg {
namespace {

bool is_power_of_two(uint64_t x) {
  return x != 0 && (x & (x - 1)) == 0;
}

// alignment is a power of two and n <= capacity, so this cannot overflow.
uint64_t round_up(uint64_t n, uint64_t alignment) {
  return (n + alignment - 1) & ~(alignment - 1);
}

// A stamp: never 0, below 2^53 (exact in the JSON of ec_transfer_params), distinct for
// distinct (salt, entry id) with overwhelming probability.
uint64_t make_stamp(uint64_t salt, int64_t entry_id) {
  uint64_t z = salt + (static_cast<uint64_t>(entry_id) + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z = (z ^ (z >> 31)) & ((uint64_t{1} << 53) - 1);
  return z == 0 ? 1 : z;
}

Status violation(const std::string& what) {
  return internal_error("ec tensor pool invariant: " + what);
}

}  // namespace

std::string_view ec_entry_state_name(EcEntryState state) {
  switch (state) {
    case EcEntryState::kAllocated:
      return "allocated";
    case EcEntryState::kReady:
      return "ready";
    case EcEntryState::kReserved:
      return "reserved";
  }
  return "unknown";
}

Result<std::unique_ptr<EcTensorPool>> EcTensorPool::create(uint8_t* base, uint64_t size_bytes,
                                                           EcTensorPoolOptions options) {
  if (base == nullptr) {
    return invalid_argument("ec tensor pool: null region");
  }
  if (!is_power_of_two(options.alignment_bytes)) {
    return invalid_argument("ec tensor pool: alignment " + std::to_string(options.alignment_bytes) +
                            " is not a power of two");
  }
  if (reinterpret_cast<uintptr_t>(base) % options.alignment_bytes != 0) {
    return invalid_argument("ec tensor pool: region base is not aligned to " +
                            std::to_string(options.alignment_bytes) + " bytes");
  }
  const uint64_t capacity_bytes = size_bytes & ~(options.alignment_bytes - 1);
  if (capacity_bytes == 0) {
    return invalid_argument("ec tensor pool: region of " + std::to_string(size_bytes) +
                            " bytes holds no aligned unit of " +
                            std::to_string(options.alignment_bytes));
  }
  if (options.write_timeout.count() <= 0) {
    return invalid_argument("ec tensor pool: write_timeout must be positive");
  }
  if (options.stamp_entries && options.alignment_bytes < kEcStampBytes) {
    return invalid_argument("ec tensor pool: stamps need an alignment of at least 8 bytes");
  }
  return std::unique_ptr<EcTensorPool>(new EcTensorPool(base, capacity_bytes, options));
}

EcTensorPool::EcTensorPool(uint8_t* base, uint64_t capacity_bytes, EcTensorPoolOptions options)
    : base_(base),
      capacity_bytes_(capacity_bytes),
      options_(options),
      header_bytes_(options.stamp_entries ? options.alignment_bytes : 0) {
  free_ranges_.emplace(0, capacity_bytes_);
  num_bytes_free_ = capacity_bytes_;
}

EcEntryState EcTensorPool::state_of(const Entry& entry) {
  if (!entry.is_ready) {
    return EcEntryState::kAllocated;
  }
  return entry.num_reservations > 0 ? EcEntryState::kReserved : EcEntryState::kReady;
}

Result<EcAllocation> EcTensorPool::allocate(const std::string& mm_hash, uint64_t num_bytes,
                                            TimePoint now) {
  if (num_bytes == 0 || num_bytes > capacity_bytes_ - std::min(capacity_bytes_, header_bytes_)) {
    return invalid_argument("ec tensor pool: cannot allocate " + std::to_string(num_bytes) +
                            " bytes for " + mm_hash + " in a pool of " +
                            std::to_string(capacity_bytes_));
  }
  const uint64_t size_bytes = header_bytes_ + round_up(num_bytes, options_.alignment_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  if (auto it = entries_.find(mm_hash); it != entries_.end()) {
    Entry& entry = it->second;
    if (entry.num_bytes != num_bytes) {
      return already_exists("ec tensor pool: " + mm_hash + " holds " +
                            std::to_string(entry.num_bytes) + " bytes, asked for " +
                            std::to_string(num_bytes));
    }
    ++num_shared_allocations_;
    if (entry.in_lru) {
      lru_.splice(lru_.end(), lru_, entry.lru_pos);
    }
    return EcAllocation{
        entry.id,        tensor_offset(entry), entry.num_bytes, /*must_write=*/false,
        state_of(entry), /*num_evicted=*/0,    entry.stamp};
  }

  int num_evicted = 0;
  std::optional<uint64_t> offset = take_first_fit_locked(size_bytes);
  if (!offset.has_value()) {
    ASSIGN_OR_RETURN(uint64_t range_offset, make_room_locked(size_bytes, num_bytes, &num_evicted));
    carve_locked(free_ranges_.find(range_offset), size_bytes);
    offset = range_offset;
  }

  auto [it, inserted] = entries_.try_emplace(mm_hash);
  CRESCENT_CHECK(inserted);
  Entry& entry = it->second;
  entry.id = EcEntryId(next_entry_id_++);
  entry.mm_hash = mm_hash;
  entry.offset = *offset;
  entry.size_bytes = size_bytes;
  entry.num_bytes = num_bytes;
  entry.stamp = options_.stamp_entries ? make_stamp(options_.stamp_salt, entry.id.value()) : 0;
  store_stamp(entry, 0);
  entry.write_deadline = now + options_.write_timeout;
  CRESCENT_CHECK(entries_by_offset_.emplace(entry.offset, &entry).second)
      << "two entries at offset " << entry.offset;
  write_deadlines_.emplace(entry.write_deadline, mm_hash);
  ++num_allocations_;
  return EcAllocation{entry.id,
                      tensor_offset(entry),
                      entry.num_bytes,
                      /*must_write=*/true,
                      EcEntryState::kAllocated,
                      num_evicted,
                      entry.stamp};
}

bool EcTensorPool::can_allocate(uint64_t num_bytes) const {
  if (num_bytes == 0 || num_bytes > capacity_bytes_ - std::min(capacity_bytes_, header_bytes_)) {
    return false;
  }
  const uint64_t size_bytes = header_bytes_ + round_up(num_bytes, options_.alignment_bytes);
  std::lock_guard<std::mutex> lock(mu_);
  return largest_free_range_locked() >= size_bytes ||
         largest_gap_after_eviction_locked(size_bytes, nullptr) >= size_bytes;
}

Status EcTensorPool::mark_ready(const std::string& mm_hash, EcEntryId entry_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(mm_hash);
  if (it == entries_.end() || it->second.id != entry_id) {
    return not_found("ec tensor pool: " + mm_hash + " no longer holds entry " +
                     std::to_string(entry_id.value()) + " (its write expired or was abandoned)");
  }
  Entry& entry = it->second;
  if (entry.is_ready) {
    return failed_precondition("ec tensor pool: " + mm_hash + " is already ready");
  }
  CRESCENT_CHECK(write_deadlines_.erase({entry.write_deadline, mm_hash}) == 1);
  entry.is_ready = true;
  store_stamp(entry, entry.stamp);
  entry.lru_pos = lru_.insert(lru_.end(), &entry);
  entry.in_lru = true;
  return Status::ok();
}

Status EcTensorPool::abandon(const std::string& mm_hash, EcEntryId entry_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(mm_hash);
  if (it == entries_.end() || it->second.id != entry_id) {
    return not_found("ec tensor pool: " + mm_hash + " no longer holds entry " +
                     std::to_string(entry_id.value()));
  }
  if (it->second.is_ready) {
    return failed_precondition("ec tensor pool: " + mm_hash + " is already ready");
  }
  ++num_abandoned_writes_;
  remove_entry_locked(&it->second);
  return Status::ok();
}

Result<EcReservation> EcTensorPool::reserve(const std::string& mm_hash, std::string consumer_id,
                                            TimePoint deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(mm_hash);
  if (it == entries_.end()) {
    return not_found("ec tensor pool: " + mm_hash + " is not in the pool");
  }
  Entry& entry = it->second;
  if (!entry.is_ready) {
    return failed_precondition("ec tensor pool: " + mm_hash + " is still being written");
  }
  if (entry.in_lru) {
    lru_.erase(entry.lru_pos);
    entry.in_lru = false;
  }
  ++entry.num_reservations;
  const int64_t id = next_reservation_id_++;
  reservations_.emplace(id, Reservation{&entry, std::move(consumer_id), deadline});
  reservation_deadlines_.emplace(deadline, id);
  return EcReservation{EcReservationId(id), entry.id, tensor_offset(entry), entry.num_bytes,
                       entry.stamp};
}

bool EcTensorPool::release(EcReservationId id) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!reservations_.contains(id.value())) {
    return false;
  }
  drop_reservation_locked(id.value());
  return true;
}

bool EcTensorPool::set_reservation_deadline(EcReservationId id, TimePoint deadline) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = reservations_.find(id.value());
  if (it == reservations_.end()) {
    return false;
  }
  CRESCENT_CHECK(reservation_deadlines_.erase({it->second.deadline, id.value()}) == 1);
  it->second.deadline = deadline;
  reservation_deadlines_.emplace(deadline, id.value());
  return true;
}

EcExpired EcTensorPool::expire(TimePoint now) {
  EcExpired expired;
  std::lock_guard<std::mutex> lock(mu_);
  while (!reservation_deadlines_.empty() && reservation_deadlines_.begin()->first <= now) {
    const int64_t id = reservation_deadlines_.begin()->second;
    const Reservation& reservation = reservations_.at(id);
    expired.reservations.push_back(
        EcExpiredReservation{EcReservationId(id), reservation.entry->mm_hash,
                             reservation.consumer_id, reservation.deadline});
    ++num_expired_reservations_;
    drop_reservation_locked(id);
  }
  while (!write_deadlines_.empty() && write_deadlines_.begin()->first <= now) {
    Entry& entry = entries_.at(write_deadlines_.begin()->second);
    expired.writes.push_back(
        EcExpiredWrite{entry.id, entry.mm_hash, entry.num_bytes, entry.write_deadline});
    ++num_expired_writes_;
    remove_entry_locked(&entry);
  }
  return expired;
}

std::optional<EcEntryInfo> EcTensorPool::lookup(const std::string& mm_hash) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(mm_hash);
  if (it == entries_.end()) {
    return std::nullopt;
  }
  const Entry& entry = it->second;
  return EcEntryInfo{entry.id,        tensor_offset(entry),   entry.num_bytes,
                     state_of(entry), entry.num_reservations, entry.stamp};
}

EcTensorPoolStats EcTensorPool::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  EcTensorPoolStats s;
  s.num_bytes_total = capacity_bytes_;
  s.num_bytes_free = num_bytes_free_;
  s.num_bytes_used = capacity_bytes_ - num_bytes_free_;
  s.num_bytes_largest_free_range = largest_free_range_locked();
  for (const auto& [hash, entry] : entries_) {
    switch (state_of(entry)) {
      case EcEntryState::kAllocated:
        ++s.num_entries_allocated;
        s.num_bytes_writing += entry.size_bytes;
        break;
      case EcEntryState::kReady:
        ++s.num_entries_ready;
        break;
      case EcEntryState::kReserved:
        ++s.num_entries_reserved;
        s.num_bytes_reserved += entry.size_bytes;
        break;
    }
  }
  s.num_reservations = static_cast<int>(reservations_.size());
  s.num_allocations = num_allocations_;
  s.num_shared_allocations = num_shared_allocations_;
  s.num_evictions = num_evictions_;
  s.num_expired_reservations = num_expired_reservations_;
  s.num_expired_writes = num_expired_writes_;
  s.num_abandoned_writes = num_abandoned_writes_;
  s.num_allocation_failures = num_allocation_failures_;
  return s;
}

std::optional<uint64_t> EcTensorPool::take_first_fit_locked(uint64_t size_bytes) {
  for (auto it = free_ranges_.begin(); it != free_ranges_.end(); ++it) {
    if (it->second >= size_bytes) {
      const uint64_t offset = it->first;
      carve_locked(it, size_bytes);
      return offset;
    }
  }
  return std::nullopt;
}

void EcTensorPool::carve_locked(std::map<uint64_t, uint64_t>::iterator range, uint64_t size_bytes) {
  CRESCENT_CHECK(range != free_ranges_.end());
  CRESCENT_CHECK_GE(range->second, size_bytes);
  const uint64_t offset = range->first;
  const uint64_t remainder = range->second - size_bytes;
  free_ranges_.erase(range);
  if (remainder > 0) {
    free_ranges_.emplace(offset + size_bytes, remainder);
  }
  num_bytes_free_ -= size_bytes;
}

uint64_t EcTensorPool::free_range_locked(uint64_t offset, uint64_t size_bytes) {
  uint64_t begin = offset;
  uint64_t end = offset + size_bytes;
  auto next = free_ranges_.lower_bound(offset);
  CRESCENT_CHECK(next == free_ranges_.end() || next->first >= end)
      << "freeing [" << offset << ", " << end << ") overlaps a free range at " << next->first;
  if (next != free_ranges_.end() && next->first == end) {
    end += next->second;
    next = free_ranges_.erase(next);
  }
  num_bytes_free_ += size_bytes;
  if (next != free_ranges_.begin()) {
    auto prev = std::prev(next);
    const uint64_t prev_end = prev->first + prev->second;
    CRESCENT_CHECK_LE(prev_end, begin) << "freeing overlaps a free range at " << prev->first;
    if (prev_end == begin) {
      prev->second = end - prev->first;
      return prev->first;
    }
  }
  free_ranges_.emplace(begin, end - begin);
  return begin;
}

uint64_t EcTensorPool::largest_gap_after_eviction_locked(
    uint64_t size_bytes, std::vector<std::pair<uint64_t, uint64_t>>* viable_gaps) const {
  uint64_t largest = 0;
  uint64_t gap_begin = 0;
  auto close_gap = [&](uint64_t gap_end) {
    largest = std::max(largest, gap_end - gap_begin);
    if (viable_gaps != nullptr && gap_end - gap_begin >= size_bytes) {
      viable_gaps->emplace_back(gap_begin, gap_end);
    }
  };
  for (const auto& [offset, entry] : entries_by_offset_) {
    if (is_evictable(*entry)) {
      continue;
    }
    close_gap(offset);
    gap_begin = offset + entry->size_bytes;
  }
  close_gap(capacity_bytes_);
  return largest;
}

Result<uint64_t> EcTensorPool::make_room_locked(uint64_t size_bytes, uint64_t num_bytes,
                                                int* num_evicted) {
  // Decide before touching anything: evicting entries that cannot make room would only throw
  // away cached embeddings (the reference pool looped here forever under fragmentation).
  std::vector<std::pair<uint64_t, uint64_t>> viable_gaps;
  const uint64_t largest_gap = largest_gap_after_eviction_locked(size_bytes, &viable_gaps);
  if (viable_gaps.empty()) {
    ++num_allocation_failures_;
    return resource_exhausted(describe_shortage_locked(size_bytes, num_bytes, largest_gap));
  }
  auto in_viable_gap = [&](uint64_t offset) {
    auto gap = std::upper_bound(
        viable_gaps.begin(), viable_gaps.end(), offset,
        [](uint64_t value, const std::pair<uint64_t, uint64_t>& g) { return value < g.first; });
    return gap != viable_gaps.begin() && offset < std::prev(gap)->second;
  };
  for (auto it = lru_.begin(); it != lru_.end();) {
    Entry* victim = *it;
    ++it;  // removing the victim erases its node
    if (!in_viable_gap(victim->offset)) {
      continue;
    }
    const uint64_t victim_offset = victim->offset;
    const uint64_t victim_size = victim->size_bytes;
    ++num_evictions_;
    ++*num_evicted;
    remove_entry_locked(victim);
    // A range grows only when a neighbour is freed, so the range around this victim is the
    // only one that can have become large enough.
    auto range = std::prev(free_ranges_.upper_bound(victim_offset));
    CRESCENT_CHECK(range->first <= victim_offset &&
                   range->first + range->second >= victim_offset + victim_size);
    if (range->second >= size_bytes) {
      return range->first;
    }
  }
  CRESCENT_CHECK(false) << "evicted every entry of the gaps that can hold " << size_bytes
                        << " bytes and none does";
  return internal_error("unreachable");
}

std::string EcTensorPool::describe_shortage_locked(uint64_t size_bytes, uint64_t num_bytes,
                                                   uint64_t largest_gap) const {
  uint64_t num_bytes_reserved = 0;
  uint64_t num_bytes_writing = 0;
  for (const auto& [hash, entry] : entries_) {
    if (!entry.is_ready) {
      num_bytes_writing += entry.size_bytes;
    } else if (entry.num_reservations > 0) {
      num_bytes_reserved += entry.size_bytes;
    }
  }
  std::ostringstream os;
  os << "ec tensor pool: no room for " << num_bytes << " bytes (" << size_bytes << " aligned) in "
     << capacity_bytes_ << ": " << num_bytes_free_ << " bytes free (largest range "
     << largest_free_range_locked() << "), " << num_bytes_reserved << " held by reserved entries, "
     << num_bytes_writing << " being written; evicting every unreserved entry would leave at most "
     << largest_gap << " contiguous";
  return os.str();
}

uint64_t EcTensorPool::largest_free_range_locked() const {
  uint64_t largest = 0;
  for (const auto& [offset, length] : free_ranges_) {
    largest = std::max(largest, length);
  }
  return largest;
}

void EcTensorPool::remove_entry_locked(Entry* entry) {
  CRESCENT_CHECK_EQ(entry->num_reservations, 0) << entry->mm_hash << " is reserved";
  if (entry->in_lru) {
    lru_.erase(entry->lru_pos);
  }
  if (!entry->is_ready) {
    CRESCENT_CHECK(write_deadlines_.erase({entry->write_deadline, entry->mm_hash}) == 1);
  }
  CRESCENT_CHECK(entries_by_offset_.erase(entry->offset) == 1);
  // Cleared before the range can be handed out again, and fenced so that no later write into
  // it becomes visible before the clear (a reader's second stamp load then fails).
  store_stamp(*entry, 0);
  memory_fence(std::memory_order_release);
  free_range_locked(entry->offset, entry->size_bytes);
  // Copy: the key is erased with the entry it names.
  const std::string mm_hash = entry->mm_hash;
  entries_.erase(mm_hash);
}

void EcTensorPool::store_stamp(const Entry& entry, uint64_t value) const {
  if (!options_.stamp_entries)
    return;
  auto* word = reinterpret_cast<uint64_t*>(base_ + tensor_offset(entry) - kEcStampBytes);
  std::atomic_ref<uint64_t>(*word).store(value, std::memory_order_release);
}

void EcTensorPool::drop_reservation_locked(int64_t id) {
  auto it = reservations_.find(id);
  CRESCENT_CHECK(it != reservations_.end());
  Entry* entry = it->second.entry;
  CRESCENT_CHECK(reservation_deadlines_.erase({it->second.deadline, id}) == 1);
  reservations_.erase(it);
  CRESCENT_CHECK_LT(0, entry->num_reservations);
  if (--entry->num_reservations == 0) {
    entry->lru_pos = lru_.insert(lru_.end(), entry);
    entry->in_lru = true;
  }
}

Status EcTensorPool::check_invariants() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream os;
  const uint64_t alignment = options_.alignment_bytes;

  // Entries and free ranges tile [0, capacity) in address order.
  uint64_t cursor = 0;
  uint64_t num_bytes_free = 0;
  bool previous_was_free = false;
  auto entry_it = entries_by_offset_.begin();
  auto free_it = free_ranges_.begin();
  while (entry_it != entries_by_offset_.end() || free_it != free_ranges_.end()) {
    const bool take_free = entry_it == entries_by_offset_.end() ||
                           (free_it != free_ranges_.end() && free_it->first < entry_it->first);
    const uint64_t offset = take_free ? free_it->first : entry_it->first;
    const uint64_t length = take_free ? free_it->second : entry_it->second->size_bytes;
    if (offset != cursor) {
      os << (offset < cursor ? "overlap" : "gap") << " at " << std::min(offset, cursor)
         << " (next range starts at " << offset << ", previous ends at " << cursor << ")";
      return violation(os.str());
    }
    if (length == 0 || offset % alignment != 0 || length % alignment != 0) {
      os << "range [" << offset << ", +" << length << ") is empty or unaligned";
      return violation(os.str());
    }
    if (take_free) {
      if (previous_was_free) {
        os << "free range at " << offset << " was not coalesced with its predecessor";
        return violation(os.str());
      }
      num_bytes_free += length;
      ++free_it;
    } else {
      const Entry* entry = entry_it->second;
      if (entry->offset != offset) {
        os << "entry " << entry->mm_hash << " at " << entry->offset << " is indexed at " << offset;
        return violation(os.str());
      }
      ++entry_it;
    }
    previous_was_free = take_free;
    cursor = offset + length;
  }
  if (cursor != capacity_bytes_) {
    os << "ranges end at " << cursor << ", the region at " << capacity_bytes_;
    return violation(os.str());
  }
  if (num_bytes_free != num_bytes_free_) {
    os << "free ranges hold " << num_bytes_free << " bytes, the counter says " << num_bytes_free_;
    return violation(os.str());
  }
  if (entries_by_offset_.size() != entries_.size()) {
    os << entries_.size() << " entries but " << entries_by_offset_.size() << " indexed by offset";
    return violation(os.str());
  }

  // Per entry: size, deadlines, LRU membership. Reservations counted from the live ones.
  std::unordered_map<const Entry*, int> num_reservations;
  for (const auto& [id, reservation] : reservations_) {
    ++num_reservations[reservation.entry];
    if (!reservation_deadlines_.contains({reservation.deadline, id})) {
      os << "reservation " << id << " has no deadline entry";
      return violation(os.str());
    }
  }
  if (reservation_deadlines_.size() != reservations_.size()) {
    os << reservation_deadlines_.size() << " reservation deadlines for " << reservations_.size()
       << " reservations";
    return violation(os.str());
  }
  size_t num_in_lru = 0;
  size_t num_writing = 0;
  for (const auto& [hash, entry] : entries_) {
    if (entry.mm_hash != hash) {
      os << "entry keyed " << hash << " names itself " << entry.mm_hash;
      return violation(os.str());
    }
    auto by_offset = entries_by_offset_.find(entry.offset);
    if (by_offset == entries_by_offset_.end() || by_offset->second != &entry) {
      os << "entry " << hash << " is not indexed at its offset " << entry.offset;
      return violation(os.str());
    }
    if (entry.size_bytes != header_bytes_ + round_up(entry.num_bytes, alignment) ||
        entry.num_bytes == 0) {
      os << "entry " << hash << " holds " << entry.size_bytes << " bytes for " << entry.num_bytes;
      return violation(os.str());
    }
    auto counted = num_reservations.find(&entry);
    const int expected = counted == num_reservations.end() ? 0 : counted->second;
    if (entry.num_reservations != expected) {
      os << "entry " << hash << " counts " << entry.num_reservations << " reservations, "
         << expected << " are live";
      return violation(os.str());
    }
    if (!entry.is_ready) {
      ++num_writing;
      if (entry.num_reservations != 0 ||
          !write_deadlines_.contains({entry.write_deadline, entry.mm_hash})) {
        os << "entry " << hash << " is being written but reserved or without a write deadline";
        return violation(os.str());
      }
    }
    if (entry.in_lru != is_evictable(entry) || (entry.in_lru && *entry.lru_pos != &entry)) {
      os << "entry " << hash << " is " << ec_entry_state_name(state_of(entry))
         << (entry.in_lru ? " but on" : " but not on") << " the LRU list";
      return violation(os.str());
    }
    num_in_lru += entry.in_lru ? 1 : 0;
  }
  if (num_in_lru != lru_.size()) {
    os << "LRU list holds " << lru_.size() << " entries, " << num_in_lru << " are evictable";
    return violation(os.str());
  }
  if (num_writing != write_deadlines_.size()) {
    os << write_deadlines_.size() << " write deadlines for " << num_writing
       << " entries being written";
    return violation(os.str());
  }
  return Status::ok();
}

}  // namespace crescent::disagg
