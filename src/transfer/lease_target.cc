#include "transfer/lease_target.h"

#include <string>

#include "core/logging.h"
#include "transfer/region_table.h"
#include "transfer/wire.h"

namespace crescent::transfer {

using net::ByteReader;
using net::ByteWriter;
using net::Fd;

Status serve_lease(const TargetContext& ctx, const Fd& fd, const net::FrameHeader& h,
                   std::map<uint64_t, std::vector<RegionId>>* leases,
                   std::set<int64_t>* described) {
  if (h.payload_bytes > wire::kMaxControlBytes)
    return resource_exhausted("LEASE too large");
  Deadline d = io_deadline(ctx.io_timeout);
  std::string payload(h.payload_bytes, '\0');
  RETURN_IF_ERROR(net::read_exact(fd, payload.data(), payload.size(), d));
  ByteReader r(payload);
  uint64_t lease_id = r.u64();
  uint32_t n = r.u32();
  if (n > wire::kMaxOpsPerLease)
    return resource_exhausted("too many ops in one LEASE");
  if (leases->count(lease_id) != 0)
    return data_loss("duplicate lease id");
  std::vector<RegionId>& pinned = (*leases)[lease_id];
  ByteWriter w;
  w.u64(lease_id);
  std::vector<RegionId> to_describe;
  for (uint32_t i = 0; i < n && r.ok(); ++i) {
    r.u8();
    RegionId region(r.i64());
    uint64_t offset = r.u64();
    uint64_t length = r.u64();
    auto pin = ctx.regions->pin(region, offset, length);
    write_status(w, pin.status());
    if (pin.is_ok()) {
      pinned.push_back(region);
      if (described->insert(region.value()).second)
        to_describe.push_back(region);
    }
  }
  RETURN_IF_ERROR(r.finish("LEASE"));
  std::vector<int> fds;
  w.u32(static_cast<uint32_t>(to_describe.size()));
  for (RegionId id : to_describe) {
    auto region = ctx.regions->describe(id);  // pinned above, so still live
    CRESCENT_CHECK(region.is_ok()) << "pinned region vanished";
    w.i64(id.value());
    w.u64(region->length);
    w.u64(region->file_offset);
    w.u64(reinterpret_cast<uint64_t>(region->addr));
    w.bytes(region->rkey);
    bool has_fd = region->memfd >= 0;
    w.u8(has_fd ? 1 : 0);
    if (has_fd)
      fds.push_back(region->memfd);
  }
  if (fds.size() > 64)
    return resource_exhausted("more than 64 new regions in one lease");
  uint8_t header[net::kFrameHeaderBytes];
  net::encode_frame_header({wire::kLeaseResp, w.str().size()}, header);
  std::string frame(reinterpret_cast<char*>(header), sizeof(header));
  frame += w.str();
  return net::write_with_fds(fd, frame.data(), frame.size(), fds, d);
}

Status serve_release(const TargetContext& ctx, const Fd& fd, const net::FrameHeader& h,
                     std::map<uint64_t, std::vector<RegionId>>* leases) {
  if (h.payload_bytes != 8)
    return data_loss("bad RELEASE");
  Deadline d = io_deadline(ctx.io_timeout);
  char buf[8];
  RETURN_IF_ERROR(net::read_exact(fd, buf, 8, d));
  ByteReader r(std::string_view(buf, 8));
  uint64_t lease_id = r.u64();
  auto it = leases->find(lease_id);
  if (it == leases->end())
    return data_loss("RELEASE of an unknown lease");
  for (RegionId region : it->second) {
    ctx.regions->unpin(region);
  }
  leases->erase(it);
  return net::write_frame(fd, wire::kReleaseOk, std::string_view(buf, 8), d);
}

}  // namespace crescent::transfer
