#include "transfer/region_table.h"

#include <unistd.h>

namespace crescent::transfer {

RegionTable::~RegionTable() {
  for (auto& [id, e] : regions_) {
    if (e.region.memfd >= 0)
      ::close(e.region.memfd);
  }
}

RegionId RegionTable::add(Region region) {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t id = next_id_++;
  regions_[id].region = std::move(region);
  return RegionId(id);
}

Status RegionTable::check(RegionId id, const Entry* e, uint64_t offset, uint64_t length) const {
  if (e == nullptr || !e->is_live) {
    if (id.value() >= 1 && id.value() < next_id_) {
      return not_found("region " + std::to_string(id.value()) + " was unregistered");
    }
    return not_found("region " + std::to_string(id.value()) + " is not registered");
  }
  uint64_t size = e->region.length;
  // Written so that offset + length cannot overflow.
  if (offset > size || length > size - offset) {
    return out_of_range("op [" + std::to_string(offset) + ", +" + std::to_string(length) +
                        ") is outside region " + std::to_string(id.value()) + " of " +
                        std::to_string(size) + " bytes");
  }
  return Status::ok();
}

Result<Region> RegionTable::remove(RegionId id, Deadline deadline) {
  std::unique_lock<std::mutex> lock(mu_);
  auto it = regions_.find(id.value());
  if (it == regions_.end() || !it->second.is_live) {
    return not_found("region " + std::to_string(id.value()) + " is not registered");
  }
  it->second.is_live = false;
  bool drained =
      unpinned_.wait_until(lock, deadline.when(), [&] { return it->second.num_pins == 0; });
  if (!drained) {
    // It stays dead (no new ops) but is still referenced by a peer; the caller must not free it.
    return deadline_exceeded("region " + std::to_string(id.value()) +
                             " is still in use by a peer transfer");
  }
  Region r = std::move(it->second.region);
  regions_.erase(it);
  return r;
}

Result<uint8_t*> RegionTable::pin(RegionId id, uint64_t offset, uint64_t length) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(id.value());
  Entry* e = it == regions_.end() ? nullptr : &it->second;
  RETURN_IF_ERROR(check(id, e, offset, length));
  ++e->num_pins;
  return e->region.addr + offset;
}

void RegionTable::unpin(RegionId id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(id.value());
  CRESCENT_CHECK(it != regions_.end() && it->second.num_pins > 0) << "unpin without pin";
  if (--it->second.num_pins == 0)
    unpinned_.notify_all();
}

Result<Region> RegionTable::describe(RegionId id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(id.value());
  const Entry* e = it == regions_.end() ? nullptr : &it->second;
  RETURN_IF_ERROR(check(id, e, 0, 0));
  return e->region;
}

std::vector<RegionInfo> RegionTable::list() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<RegionInfo> out;
  for (const auto& [id, e] : regions_) {
    if (e.is_live)
      out.push_back({RegionId(id), e.region.length});
  }
  return out;
}

void* RegionTable::find_ucx_memh(const void* addr, uint64_t length) const {
  auto a = reinterpret_cast<uintptr_t>(addr);
  std::lock_guard<std::mutex> lock(mu_);
  for (const auto& [id, e] : regions_) {
    auto base = reinterpret_cast<uintptr_t>(e.region.addr);
    if (e.is_live && a >= base && a - base <= e.region.length &&
        length <= e.region.length - (a - base)) {
      return e.region.ucx_memh;
    }
  }
  return nullptr;
}

std::vector<Region> RegionTable::take_all() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Region> out;
  for (auto& [id, e] : regions_) {
    out.push_back(std::move(e.region));
  }
  regions_.clear();
  return out;
}

}  // namespace crescent::transfer
