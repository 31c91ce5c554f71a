#include "transfer/ucx/ucx_mover.h"

#include <unordered_map>
#include <vector>

#include "core/logging.h"
#include "transfer/region_table.h"

namespace crescent::transfer {

namespace {

using net::Fd;

class UcxMover final : public Mover {
 public:
  UcxMover(std::unique_ptr<UcxEndpoint> ep, const RegionTable* local_regions)
      : ep_(std::move(ep)), local_regions_(local_regions) {}
  ~UcxMover() override {
    for (auto& [id, r] : rkeys_) {
      ep_->destroy_rkey(r.rkey);
    }
  }
  Status add_grant(const Grant& g, Fd /*fd*/) override {
    ASSIGN_OR_RETURN(void* rkey, ep_->unpack_rkey(g.rkey));
    drop(g.region);
    rkeys_[g.region.value()] = {rkey, g.remote_addr, g.length};
    return Status::ok();
  }
  void drop(RegionId region) override {
    auto it = rkeys_.find(region.value());
    if (it == rkeys_.end())
      return;
    ep_->destroy_rkey(it->second.rkey);
    rkeys_.erase(it);
  }
  bool has(RegionId region) const override { return rkeys_.count(region.value()) != 0; }
  Status run(std::span<Piece* const> pieces, Deadline deadline) override {
    std::vector<UcxOp> ops;
    ops.reserve(pieces.size());
    for (Piece* p : pieces) {
      const Remote& r = rkeys_.at(p->region.value());
      CRESCENT_CHECK(p->remote_offset <= r.length && p->length <= r.length - p->remote_offset)
          << "lease granted an op outside the region";
      ops.push_back({p->kind == OpKind::kWrite, p->local, r.addr + p->remote_offset, p->length,
                     r.rkey, local_regions_->find_ucx_memh(p->local, p->length)});
    }
    return ep_->run(ops, deadline);
  }

 private:
  struct Remote {
    void* rkey;
    uint64_t addr;
    uint64_t length;
  };
  std::unique_ptr<UcxEndpoint> ep_;
  const RegionTable* local_regions_;
  std::unordered_map<int64_t, Remote> rkeys_;
};

}  // namespace

std::unique_ptr<Mover> make_ucx_mover(std::unique_ptr<UcxEndpoint> ep,
                                      const RegionTable* local_regions) {
  return std::make_unique<UcxMover>(std::move(ep), local_regions);
}

}  // namespace crescent::transfer
