#pragma once
// The initiator side of the one-sided transports (shm, ucx): a link LEASEs the pieces' ranges
// from the target (which checks and pins them and grants access to regions new to this
// connection), a transport's Mover copies the bytes without the target's CPU, then RELEASE
// unpins. One worker thread per link; NOTIFY frames share the control connection.
// Internal to the transfer module.

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/clock.h"
#include "core/status.h"
#include "net/socket.h"
#include "transfer/link.h"

namespace crescent::transfer {

// Access to one target region, from a LEASE_RESP.
struct Grant {
  RegionId region;
  uint64_t length = 0;
  uint64_t file_offset = 0;
  uint64_t remote_addr = 0;
  std::string rkey;
  bool has_fd = false;
};

class Mover {
 public:
  virtual ~Mover() = default;
  virtual Status add_grant(const Grant& grant, net::Fd fd) = 0;
  virtual void drop(RegionId region) = 0;
  virtual bool has(RegionId region) const = 0;
  // Copies every piece (each already checked and pinned by the target).
  virtual Status run(std::span<Piece* const> pieces, Deadline deadline) = 0;
  // Thread-safe, unlike the rest (which only the link's worker calls).
  virtual Result<RemoteRegionView> view(RegionId /*region*/) const {
    return unimplemented("region views need the shm transport");
  }
};

// `fd` completed the HELLO exchange; `receives_fds`: grants carry file descriptors (shm).
std::shared_ptr<Link> make_one_sided_link(PieceSink* sink, net::Fd fd, std::unique_ptr<Mover> mover,
                                          std::chrono::milliseconds io_timeout, bool receives_fds);

}  // namespace crescent::transfer
