#include "transfer/shm/shm_mover.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "core/errno_text.h"
#include "core/logging.h"
#include "core/thread_pool.h"

namespace crescent::transfer {

namespace {

using net::Fd;

class ShmMover final : public Mover {
 public:
  explicit ShmMover(int num_threads)
      : pool_(num_threads > 1 ? std::make_unique<ThreadPool>(num_threads) : nullptr) {}

  Status add_grant(const Grant& g, Fd fd) override {
    if (!fd.is_valid())
      return data_loss("shm grant without a file descriptor");
    uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
    uint64_t aligned = g.file_offset / page * page;
    uint64_t delta = g.file_offset - aligned;
    size_t bytes = g.length + delta;
    // MAP_POPULATE: fill the page tables now, at the grant, instead of one fault per 4 KiB
    // page during the first copies (the first KV transfer into a decode engine).
    void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd.get(),
                     static_cast<off_t>(aligned));
    if (p == MAP_FAILED)
      return internal_error("mmap peer region: " + errno_text(errno));
    auto map = std::make_shared<Map>(p, bytes, static_cast<uint8_t*>(p) + delta, g.length);
    std::lock_guard<std::mutex> lock(mu_);
    maps_[g.region.value()] = std::move(map);
    return Status::ok();
  }
  void drop(RegionId region) override {
    std::lock_guard<std::mutex> lock(mu_);
    maps_.erase(region.value());  // unmapped when the last view of it goes
  }
  bool has(RegionId region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return maps_.count(region.value()) != 0;
  }
  Result<RemoteRegionView> view(RegionId region) const override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = maps_.find(region.value());
    if (it == maps_.end())
      return not_found("region " + std::to_string(region.value()) + " is not mapped");
    return RemoteRegionView{it->second->region, it->second->length, it->second};
  }

  Status run(std::span<Piece* const> pieces, Deadline deadline) override {
    struct Copy {
      uint8_t* dst;
      const uint8_t* src;
      uint64_t bytes;
    };
    std::vector<Copy> copies;
    std::vector<std::shared_ptr<const Map>> held;  // a drop() during the copy unmaps nothing
    constexpr uint64_t kChunk = 1 << 20;
    for (Piece* p : pieces) {
      std::shared_ptr<const Map> m;
      {
        std::lock_guard<std::mutex> lock(mu_);
        m = maps_.at(p->region.value());
      }
      CRESCENT_CHECK(p->remote_offset <= m->length && p->length <= m->length - p->remote_offset)
          << "lease granted an op outside the mapping";
      uint8_t* remote = m->region + p->remote_offset;
      bool is_write = p->kind == OpKind::kWrite;
      for (uint64_t off = 0; off < p->length; off += kChunk) {
        uint64_t n = std::min(kChunk, p->length - off);
        copies.push_back(is_write ? Copy{remote + off, p->local + off, n}
                                  : Copy{p->local + off, remote + off, n});
      }
      held.push_back(std::move(m));
    }
    if (pool_ != nullptr && copies.size() > 1) {
      pool_->parallel_range(static_cast<int64_t>(copies.size()), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          std::memcpy(copies[i].dst, copies[i].src, copies[i].bytes);
        }
      });
    } else {
      for (const Copy& c : copies) {
        std::memcpy(c.dst, c.src, c.bytes);
      }
    }
    if (deadline.is_expired())
      return deadline_exceeded("batch deadline passed during the copy");
    return Status::ok();
  }

 private:
  struct Map {
    Map(void* base, size_t bytes, uint8_t* r, uint64_t len)
        : map_base(base), map_bytes(bytes), region(r), length(len) {}
    ~Map() { ::munmap(map_base, map_bytes); }
    Map(const Map&) = delete;
    Map& operator=(const Map&) = delete;
    void* map_base;
    size_t map_bytes;
    uint8_t* region;
    uint64_t length;
  };
  std::unique_ptr<ThreadPool> pool_;
  mutable std::mutex mu_;
  std::unordered_map<int64_t, std::shared_ptr<const Map>> maps_;  // GUARDED_BY(mu_)
};

}  // namespace

std::unique_ptr<Mover> make_shm_mover(int num_copy_threads) {
  return std::make_unique<ShmMover>(num_copy_threads);
}

}  // namespace crescent::transfer
