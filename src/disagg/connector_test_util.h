#pragma once
// Test harness for the connector: a "fake engine" around one KvTransferConnector over its own
// allocate_shared() KV memory, that collects events the way the engine would, and a fake
// bootstrap resolver. Prefill blocks are filled with a pattern unique to (block, byte); decode
// memory starts as kUntouched everywhere so stray writes show.

#include <gtest/gtest.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "disagg/kv_transfer_connector.h"
#include "transfer/shared_memory.h"

namespace crescent::disagg::testing {

inline constexpr int kBlockSize = 16;
inline constexpr uint8_t kUntouched = 0xEE;

inline KvCompatInfo test_compat() {
  KvCompatInfo c;
  c.model = "test-model";
  c.dtype = "f32";
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 16;
  c.block_size = kBlockSize;
  c.layout = "block:layer:kv:token:head:dim";
  c.weights = "ffffffffffffffff BF16";
  return c;
}

// engine_id -> worker address, or a forced failure.
class FakeBootstrap {
 public:
  void set(const std::string& engine_id, const std::string& addr) {
    std::lock_guard<std::mutex> lock(mu_);
    addrs_[engine_id] = addr;
  }
  void fail_with(Status s) {
    std::lock_guard<std::mutex> lock(mu_);
    failure_ = std::move(s);
  }
  int num_calls() const {
    std::lock_guard<std::mutex> lock(mu_);
    return num_calls_;
  }
  EngineResolveFn resolver() {
    return [this](const std::string& url, const std::string& engine_id,
                  Deadline) -> Result<std::string> {
      std::lock_guard<std::mutex> lock(mu_);
      ++num_calls_;
      if (!failure_.is_ok())
        return failure_;
      auto it = addrs_.find(engine_id);
      if (it == addrs_.end())
        return not_found("no engine " + engine_id);
      return it->second;
    };
  }

 private:
  mutable std::mutex mu_;
  std::map<std::string, std::string> addrs_;
  Status failure_;
  int num_calls_ = 0;
};

struct SideOptions {
  transfer::TransportKind transport = transfer::TransportKind::kShm;
  int num_blocks = 32;
  uint64_t block_bytes = 8192;
  std::chrono::milliseconds transfer_timeout{2000};
  std::chrono::milliseconds heartbeat_interval{1000};
  std::chrono::milliseconds cancel_grace{500};
  KvCompatInfo compat = test_compat();
  std::function<void(const std::string&)> on_write_submitted;
  std::shared_ptr<TransferMetrics> metrics;
  std::string auth_token;
};

// One engine rank: KV memory + connector + the events it reported.
class FakeEngine {
 public:
  static std::unique_ptr<FakeEngine> create(const std::string& engine_id, FakeBootstrap* bootstrap,
                                            const SideOptions& so) {
    auto e = std::unique_ptr<FakeEngine>(new FakeEngine());
    e->block_bytes_ = so.block_bytes;
    e->num_blocks_ = so.num_blocks;
    auto mem = transfer::allocate_shared(so.block_bytes * so.num_blocks);
    EXPECT_TRUE(mem.is_ok()) << mem.status().to_string();
    if (!mem.is_ok())
      return nullptr;
    e->mem_ = std::move(*mem);
    std::memset(e->mem_.data(), kUntouched, e->mem_.size());
    DisaggOptions o;
    o.engine_id = engine_id;
    o.transport = so.transport;
    o.transfer_timeout = so.transfer_timeout;
    o.heartbeat_interval = so.heartbeat_interval;
    o.cancel_grace = so.cancel_grace;
    o.compat = so.compat;
    o.memory = KvMemory{e->mem_.data(), e->mem_.size(), so.block_bytes, so.num_blocks};
    if (bootstrap != nullptr)
      o.resolve = bootstrap->resolver();
    o.on_write_submitted = so.on_write_submitted;
    o.metrics = so.metrics;
    o.auth_token = so.auth_token;
    auto c = KvTransferConnector::create(std::move(o));
    EXPECT_TRUE(c.is_ok()) << c.status().to_string();
    if (!c.is_ok())
      return nullptr;
    e->conn_ = std::move(*c);
    FakeEngine* raw = e.get();
    e->conn_->set_wakeup([raw] {
      std::lock_guard<std::mutex> lock(raw->mu_);
      ++raw->num_wakeups_;
      raw->cv_.notify_all();
    });
    return e;
  }

  // The connector goes first: its shutdown still queues events and calls the wakeup.
  ~FakeEngine() { conn_.reset(); }

  KvTransferConnector& conn() { return *conn_; }
  uint8_t* block(int b) { return mem_.data() + static_cast<uint64_t>(b) * block_bytes_; }
  uint64_t block_bytes() const { return block_bytes_; }
  int num_blocks() const { return num_blocks_; }

  void fill_pattern(int b, int seed) {
    uint8_t* p = block(b);
    for (uint64_t i = 0; i < block_bytes_; ++i) {
      p[i] = static_cast<uint8_t>((b * 131 + seed * 17 + i * 7 + (i >> 8)) & 0xff);
    }
  }
  bool block_is(int b, uint8_t v) {
    const uint8_t* p = block(b);
    for (uint64_t i = 0; i < block_bytes_; ++i) {
      if (p[i] != v)
        return false;
    }
    return true;
  }
  std::vector<uint8_t> copy_memory() { return {mem_.data(), mem_.data() + mem_.size()}; }

  // Polls take_events() (as the engine thread would after a wakeup) until one for request_id.
  std::optional<engine::KvConnectorEvent> wait_event(const std::string& request_id,
                                                     std::chrono::milliseconds timeout) {
    auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      for (auto& e : conn_->take_events()) {
        seen_.push_back(std::move(e));
      }
      for (size_t i = 0; i < seen_.size(); ++i) {
        if (seen_[i].request_id == request_id) {
          auto e = seen_[i];
          seen_.erase(seen_.begin() + static_cast<std::ptrdiff_t>(i));
          return e;
        }
      }
      if (std::chrono::steady_clock::now() >= deadline)
        return std::nullopt;
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait_for(lock, std::chrono::milliseconds(20));
    }
  }
  // True if no event for request_id arrives within `window`.
  bool no_event_within(const std::string& request_id, std::chrono::milliseconds window) {
    return !wait_event(request_id, window).has_value();
  }

  void shutdown() { conn_->shutdown(); }

 private:
  FakeEngine() = default;
  transfer::SharedBuffer mem_;
  uint64_t block_bytes_ = 0;
  int num_blocks_ = 0;
  std::unique_ptr<KvTransferConnector> conn_;
  std::mutex mu_;
  std::condition_variable cv_;
  int num_wakeups_ = 0;
  std::vector<engine::KvConnectorEvent> seen_;
};

inline std::vector<int32_t> make_prompt(int n, int seed = 1) {
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    p[static_cast<size_t>(i)] = 1000 + seed * 7919 + i * 31;
  }
  return p;
}

inline engine::KvTransferParams decode_params(const std::string& transfer_id,
                                              const std::string& engine_id) {
  engine::KvTransferParams p;
  p.do_remote_prefill = true;
  p.transfer_id = transfer_id;
  p.remote_engine_id = engine_id;
  p.remote_bootstrap_addr = "http://127.0.0.1:8998";
  return p;
}

inline engine::KvTransferParams prefill_params(const std::string& transfer_id) {
  engine::KvTransferParams p;
  p.do_remote_decode = true;
  p.transfer_id = transfer_id;
  return p;
}

// Waits until pred() holds or the timeout passes; returns pred().
template <typename Pred>
bool eventually(Pred pred, std::chrono::milliseconds timeout = std::chrono::milliseconds(5000)) {
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (pred())
      return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return pred();
}

}  // namespace crescent::disagg::testing
