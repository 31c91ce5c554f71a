#pragma once
// The initiator side's units of work and the interface every transport's link implements:
// a batch is cut into pieces (coalesced runs of ops, or chunks of one), a link moves pieces to
// one peer and finishes each through the engine's PieceSink. Internal to the transfer module.

#include <cstdint>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "core/clock.h"
#include "core/status.h"
#include "transfer/transfer_engine.h"

namespace crescent::transfer {

struct Batch {
  int64_t id = 0;
  int64_t peer = 0;
  Deadline deadline = Deadline::never();
  std::vector<Status> op_status;
  std::vector<uint64_t> op_bytes;
  int64_t num_pending_pieces = 0;
  uint64_t num_bytes = 0;
  bool is_done = false;
  bool is_released = false;
  Status status;
};

// A run of coalesced ops, or a chunk of one (tcp). `ops` are the submitted op indices it covers.
struct Piece {
  std::shared_ptr<Batch> batch;
  std::shared_ptr<const std::vector<uint32_t>> ops;
  OpKind kind = OpKind::kWrite;
  uint8_t* local = nullptr;
  RegionId region;
  uint64_t remote_offset = 0;
  uint64_t length = 0;
};

// Completes pieces; implemented by the engine.
class PieceSink {
 public:
  virtual void finish(Piece& piece, const Status& status) = 0;
  virtual void finish_all(std::vector<Piece>& pieces, const Status& status) {
    for (auto& p : pieces) {
      finish(p, status);
    }
    pieces.clear();
  }

 protected:
  ~PieceSink() = default;
};

class Link {
 public:
  virtual ~Link() = default;
  virtual void enqueue(std::vector<Piece> pieces) = 0;
  virtual Status notify(std::string_view message, Deadline deadline) = 0;
  // Breaks the link (idempotent; the first reason is what batches report).
  virtual void fail(const Status& why) = 0;
  virtual bool is_broken() const = 0;
  // Breaks the link and joins its threads; every piece has been finished afterwards.
  virtual void shutdown() = 0;
  // The mapping of a region this link was already granted (shm); NotFound when none yet.
  virtual Result<RemoteRegionView> view(RegionId /*region*/) {
    return unimplemented("region views need the shm transport");
  }
};

// Common state for "broken" and its reason.
class BrokenFlag {
 public:
  // Returns true the first time.
  bool set(const Status& why) {
    std::lock_guard<std::mutex> lock(mu_);
    if (is_broken_)
      return false;
    is_broken_ = true;
    why_ = why;
    return true;
  }
  bool is_set() const {
    std::lock_guard<std::mutex> lock(mu_);
    return is_broken_;
  }
  // The reason to report for a failure `seen` by an I/O thread.
  Status reason(const Status& seen) const {
    std::lock_guard<std::mutex> lock(mu_);
    return is_broken_ ? why_ : seen;
  }

 private:
  mutable std::mutex mu_;
  bool is_broken_ = false;
  Status why_;
};

}  // namespace crescent::transfer
