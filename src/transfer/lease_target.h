#pragma once
// The one-sided transports' target side (shm, ucx): LEASE checks and pins the ops' ranges and
// grants regions not yet described on this connection (shm: the memfd, sent with SCM_RIGHTS;
// ucx: the packed rkey); RELEASE unpins once the initiator's copies are done.
// Internal to the transfer module.

#include <cstdint>
#include <map>
#include <set>
#include <vector>

#include "core/status.h"
#include "net/frame.h"
#include "net/socket.h"
#include "transfer/protocol.h"

namespace crescent::transfer {

// `leases`: this connection's pinned regions by lease id (the server unpins what is left when
// the connection ends); `described`: regions already granted on this connection.
Status serve_lease(const TargetContext& ctx, const net::Fd& fd, const net::FrameHeader& h,
                   std::map<uint64_t, std::vector<RegionId>>* leases, std::set<int64_t>* described);
Status serve_release(const TargetContext& ctx, const net::Fd& fd, const net::FrameHeader& h,
                     std::map<uint64_t, std::vector<RegionId>>* leases);

}  // namespace crescent::transfer
